"""pipeline.yaml's sections for serving an export: ``serve`` (Ray Serve: batching, limits, scale, TLS,
traces) and ``triton`` (the generated Triton repository).

Part of the config (``config.PipelineConfig`` holds them); typed, frozen, unknown keys refused like every section.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, model_validator

from ._schema import StrictSection
from .errors import ConfigError


class TritonSection(StrictSection):
    """`vitdeploy triton-repo`: how the generated Triton repository serves the model (CLI flags override)."""

    inference: Literal["auto", "onnx", "trt", "ort_python", "openvino"] = Field(
        "auto",
        description="model the ensemble calls; auto = trt when an engine was built, else onnx; openvino = model.onnx "
        "on Triton's OpenVINO backend (CPU; BF16 where the CPU has BF16 math)",
    )
    instances: int = Field(1, ge=1, description="instances of the inference model (per GPU with KIND_GPU)")
    kind: Literal["auto", "gpu", "cpu"] = Field("auto", description="auto = Triton's default: every GPU, else the CPU")
    gpus: tuple[int, ...] = Field((), description="GPU ids for the inference model; empty = all visible")
    preprocess_instances: int = Field(1, ge=1, description="python-backend instances decoding images")
    decode_threads: int = Field(4, ge=1, le=256, description="threads per preprocess instance")
    max_queue_delay_us: int = Field(2000, ge=0, description="dynamic batching: how long a batch waits to fill")
    max_queue_size: int = Field(128, ge=0, description="queued requests beyond this get 503 at once (0 = unbounded)")
    onnx_precision: Literal["auto", "fp32", "fp16"] = Field(
        "auto",
        description="graph of the _onnx model: fp32 = model.onnx (CUDA EP), fp16 = model.fp16.onnx with its "
        "validated keep-float list (TensorRT EP, no re-cast); auto = fp16 when the export validated it, else fp32",
    )
    repository_mount: str = Field(
        "/models",
        pattern=r"^/",
        description="where the repository is mounted inside the "
        "container; the TensorRT EP caches its engines in <mount>/<name>_onnx/trt_cache",
    )
    ort_threads: Optional[int] = Field(None, ge=1, description="_ort_python: ONNX Runtime intra-op threads")


class AutoscalingSection(StrictSection):
    """Ray Serve's autoscaling_config: replicas follow the requests each one is working on."""

    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(4, ge=1)
    target_ongoing_requests: float = Field(16.0, gt=0, description="requests per replica the autoscaler aims for")

    @model_validator(mode="after")
    def _order(self) -> "AutoscalingSection":
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) must be <= max_replicas ({self.max_replicas})")
        return self


class TlsSection(StrictSection):
    """HTTPS through Ray Serve's own HTTP options (the proxy's ssl_certfile, ssl_keyfile)."""

    certfile: str = Field(..., min_length=1, description="PEM certificate (chain) the server presents")
    keyfile: str = Field(
        ..., min_length=1, description="PEM private key of certfile, unencrypted; only its path is ever written"
    )

    @model_validator(mode="before")
    @classmethod
    def _no_client_certificates(cls, data: Any) -> Any:
        if isinstance(data, dict) and "ca_certs" in data:
            raise ConfigError(CA_CERTS_REFUSED)  # not a ValueError: pydantic passes it on as it is
        return data


#: Why serve.tls.ca_certs is refused rather than accepted and ignored (serve/tls.py).
CA_CERTS_REFUSED = (
    "serve.tls.ca_certs: Ray Serve's proxy cannot require client certificates (it hands uvicorn the CA bundle but "
    "never ssl_cert_reqs, so a client without a certificate is let in): remove the key; for mutual TLS put an "
    "ingress or a service mesh that requires client certificates in front, and the serve token on the server"
)


class TracingSection(StrictSection):
    """Traces (OpenTelemetry, OTLP through Ray Serve's tracing): on when OTEL_EXPORTER_OTLP_ENDPOINT is set and the
    [otel] extra is installed."""

    sampling_ratio: float = Field(
        0.01,
        ge=0,
        le=1,
        description="share of the requests without a client's traceparent that are traced (Ray Serve's default, "
        "1%); a client's sampled traceparent is always followed; 1 traces every request",
    )


class ServeSection(StrictSection):
    """`vitdeploy serve` (Ray Serve) and the Triton repository: batching, limits, scale."""

    host: str = Field(
        "127.0.0.1", min_length=1, description="address to listen on (0.0.0.0 exposes it to the network)"
    )
    port: int = Field(8000, ge=1, le=65535, description="HTTP port")
    metrics_port: int = Field(8080, ge=1, le=65535, description="Prometheus metrics of the local Ray node (/metrics)")
    metrics_host: str = Field(
        "127.0.0.1",
        description=(
            "where the local Ray's metrics (and the node itself) listen: loopback unless this and --host are "
            "network addresses (then other machines can also join that Ray with --address; its metrics port has no "
            "token and no TLS: serve needs --allow-unauthenticated and --allow-insecure)"
        ),
    )
    token_file: Optional[str] = Field(
        None,
        description=(
            "a file holding the bearer token every model route requires (or set VITDEPLOY_SERVE_TOKEN); the "
            "token itself never goes in this config"
        ),
    )
    tls: Optional[TlsSection] = Field(
        None,
        description="HTTPS: {certfile: cert.pem, keyfile: key.pem} (PEM paths, through Ray Serve's ssl_* HTTP "
        "options; a RayService mounts them from a Secret); needed on every port beyond loopback unless "
        "--allow-insecure",
    )
    stage_timing: bool = Field(
        True,
        description="a Server-Timing header (gRPC: trailing metadata) on every answer and the per-stage "
        "histograms on /metrics; false for a benchmark's baseline",
    )
    tracing: TracingSection = Field(
        TracingSection(), description="traces, each request's stages as spans (docs/serving.md, Traces)"
    )
    grpc_port: Optional[int] = Field(
        None,
        ge=1,
        le=65535,
        description="KServe v2 gRPC (tritonclient.grpc) through Ray Serve's gRPC proxy on this port; null = off "
        "(needs tritonclient[grpc]). Ray's gRPC proxy listens on every interface whatever --host says, without "
        "TLS: serve needs --allow-insecure, and a serve token or --allow-unauthenticated",
    )
    top_k: int = Field(
        5, ge=1, description="K of TOPK_LABELS/TOPK_SCORES and of POST /predict (clipped to the classes)"
    )
    max_batch_size: int = Field(16, ge=1, description="images per model call (@serve.batch max_batch_size)")
    batch_wait_timeout_s: float = Field(0.01, ge=0, le=10, description="how long a batch waits to fill (@serve.batch)")
    decode_threads: int = Field(4, ge=1, le=256, description="threads per replica decoding images before batching")
    concurrent_batches: int = Field(
        2,
        ge=1,
        le=64,
        description=(
            "model calls a replica runs at once (@serve.batch max_concurrent_batches): the next batch runs while "
            "the last one's answers go out, so the cores or the GPU never wait on Ray"
        ),
    )
    max_images_per_request: int = Field(
        32, ge=1, description="more images in one request -> 413 (POST /predict), 400 (v2, as Triton)"
    )
    max_request_mb: float = Field(64.0, gt=0, description="larger request bodies -> 413")
    replicas: int = Field(1, ge=1, description="replicas when serve.autoscaling is not set (--replicas overrides)")
    num_cpus_per_replica: float = Field(
        1.0,
        ge=0,
        description="Ray CPUs per replica; ONNX Runtime and decode threads follow it unless runtime.threads is set",
    )
    num_gpus_per_replica: float = Field(0.0, ge=0, description="Ray GPUs per replica (e.g. 1, or 0.5 to share one)")
    max_ongoing_requests: int = Field(
        64, ge=1, description="requests a replica works on at once (>= max_batch_size x concurrent_batches)"
    )
    max_queued_requests: int = Field(256, ge=1, description="requests waiting for a replica; beyond -> 503")
    graceful_shutdown_timeout_s: float = Field(20.0, gt=0, description="how long SIGTERM waits for in-flight requests")
    request_timeout_s: float = Field(
        60.0, gt=0, description="end-to-end limit of one request (Ray Serve's request_timeout_s)"
    )
    body_timeout_s: float = Field(
        10.0, gt=0, description="deadline for reading a request body: a slow or stalled upload gets 408"
    )
    name: Optional[str] = Field(
        None,
        min_length=1,
        description=(
            "the model's name on the wire, its Serve application and its route /v2/models/<name> (default: the "
            "manifest's)"
        ),
    )
    autoscaling: Optional[AutoscalingSection] = Field(None, description="replaces the fixed replica count when set")
    resources_per_replica: dict[str, float] = Field(
        default_factory=dict,
        description=(
            "Ray custom resources each replica needs, e.g. {model_node: 1} to place replicas on the nodes that have "
            "them"
        ),
    )

    @model_validator(mode="after")
    def _batch_fits(self) -> "ServeSection":
        if self.max_ongoing_requests < self.max_batch_size * self.concurrent_batches:
            raise ValueError(
                f"max_ongoing_requests ({self.max_ongoing_requests}) must be >= max_batch_size x "
                f"concurrent_batches ({self.max_batch_size} x {self.concurrent_batches}), or a replica "
                f"can never fill its batches"
            )
        return self
