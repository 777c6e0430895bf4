"""pipeline.yaml parsed into typed, frozen objects, validated before any heavy work.

Every key has a default, so ``model: {checkpoint: path/to/vit}`` is a complete pipeline, and an
empty file runs the embedded demo model. Unknown keys are rejected; every error names the key,
the value and what is allowed. Relative paths resolve against the YAML file's folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, Field, ValidationError, model_validator

from ._schema import FiniteFloat, StrictSection, format_validation_error
from .errors import ConfigError
from .hub_name import HUB_PREFIX, HubName, checkpoint_ref
from .limits import MAX_BATCH, clip
from .preprocess_spec import overrides_model
from .vit_schema import MAX_SIDE as MAX_IMAGE_SIDE
from .vocab import Activation, BackendChoice, EmbeddingDtype, OutputKind, Pool

DEFAULT_CONFIG_NAME = "pipeline.yaml"
PositiveFloat = Annotated[FiniteFloat, Field(gt=0)]
BatchSize = Annotated[int, Field(ge=1, le=MAX_BATCH, description=f"1..{MAX_BATCH}")]


_Section = StrictSection  # the one strict base (_schema.StrictSection); this name kept for existing imports


class ModelSection(_Section):
    checkpoint: Optional[str] = Field(
        None,
        description="a checkpoint file or folder (relative to this file; a path that exists always wins), or a "
        "Hugging Face Hub name: org/name, org/name@revision (a branch, tag or commit), hf-hub:timm/<model>.<tag>; "
        "absent = the embedded demo model",
    )
    revision: Optional[str] = Field(
        None,
        description="the Hub revision of model.checkpoint (a branch, tag or commit; same as org/name@revision); "
        "absent = the repo's default branch, resolved once to a commit that the manifest records",
    )
    variant: Optional[str] = Field(
        None, description="named variant (e.g. vit_base_patch16_224) when shapes are ambiguous"
    )
    image_size: Optional[int] = Field(None, gt=0, description="resample position embeddings to this size")
    name: Optional[str] = Field(None, description="model name in the manifest (default: the checkpoint's)")
    # What a bare state dict (timm / torchvision .safetensors or .pth) cannot say; checked against
    # checkpoints that store it (Hugging Face config.json, timm hub config.json, vitdeploy model.json).
    num_heads: Optional[int] = Field(None, gt=0, description="attention heads (bare state dicts do not store them)")
    activation: Optional[Activation] = Field(
        None, description="MLP activation: gelu (exact, erf) or gelu_tanh (timm gelu_tanh / HF gelu_pytorch_tanh)"
    )
    layer_norm_eps: Optional[PositiveFloat] = Field(None, description="LayerNorm epsilon (timm/torchvision: 1e-6)")
    pool: Optional[Pool] = Field(
        None,
        description="pooling: token (class token), avg (mean patch token; timm global_pool='avg' without fc_norm "
        "cannot be told from the weights) or token_avg (both side by side: transformers' DINOv2 "
        "classifiers, whose config states it)",
    )
    output: Union[Literal["auto"], OutputKind] = Field(
        "auto",
        description="what the export returns: logits (a classifier: labels, top-k), embedding (the pooled feature "
        "vector as the checkpoint's library pools it: no labels, judged by cosine and neighbour agreement); auto = "
        "embedding for a checkpoint without a classification head, logits otherwise",
    )
    normalize: bool = Field(
        False, description="embedding only: L2-normalise each vector inside the graph (recorded in the manifest)"
    )
    patch_tokens: bool = Field(
        False,
        description="embedding only: a second output PATCH_TOKENS [batch, patches, width], the image patches' "
        "tokens after the final norm as the library gives them (no class token, no registers, not L2-normalised); "
        "served and written only when a client or job asks",
    )

    @model_validator(mode="after")
    def _normalize_embeddings_only(self) -> "ModelSection":
        for key in ("normalize", "patch_tokens"):
            if getattr(self, key) and self.output == "logits":
                raise ValueError(f"model.{key} applies to embeddings; it cannot be set with model.output: logits")
        return self


PreprocessSection = overrides_model(
    _Section,
    doc="Overrides of the preprocessing the checkpoint carries; None keeps the checkpoint's (or, when it "
    "carries none, its library's convention). The fields are PreprocessSpec's (preprocess_spec.py).",
)


class BatchProfile(_Section):
    """Batch sizes of the dynamic-batch profile, 1..MAX_BATCH (4096): past that a ViT's input alone
    is gigabytes, and TensorRT profiles stop well before."""

    min: BatchSize = 1
    opt: BatchSize = 8
    max: BatchSize = 32

    @model_validator(mode="after")
    def _ordered(self) -> "BatchProfile":
        if not self.min <= self.opt <= self.max:
            raise ValueError(
                f"batch sizes must satisfy min <= opt <= max, got min={self.min}, opt={self.opt}, max={self.max}"
            )
        return self


class Fp16Section(_Section):
    enabled: bool = Field(True, description="write and validate model.fp16.onnx (the graph TensorRT compiles)")
    keep_fp32_ops: tuple[str, ...] = Field(
        ("LayerNormalization",), description="op types kept float32 in the FP16 graph"
    )
    max_abs_activation: FiniteFloat = Field(
        4096.0,
        gt=0,
        description="nodes whose outputs exceed this on calibration images stay float32 (FP16 max is 65504)",
    )
    autopilot: bool = Field(
        True,
        description="when validation.fp16 fails with only keep_fp32_ops and the hot nodes in "
        "float32, return Softmax-like ops, the head, then block by block to float32 "
        "until it passes (every step recorded in the manifest)",
    )


class Int8Section(_Section):
    """``model.int8.onnx``: INT8 quantization of the fused graph (export/quantize.py)."""

    enabled: Union[Literal["auto"], bool] = Field(
        "auto",
        description="auto = build it and go on without it when it cannot be built or fails validation.int8; "
        "true = required (a failure is refused: the export is written without it and exits non-zero); false = skip",
    )
    mode: Literal["static", "dynamic"] = Field(
        "static",
        description="static: calibrated QDQ, an image's answer does not depend on its batch; dynamic: "
        "activation ranges per batch (no calibration, but batch-dependent answers)",
    )
    calibration_method: Literal["minmax", "entropy", "percentile"] = Field(
        "minmax", description="ONNX Runtime's calibrator for the static INT8 graph"
    )
    calibration_images: int = Field(64, ge=1, description="real validation images used to calibrate (at most)")
    min_calibration_images: int = Field(16, ge=1, description="fewer real validation images than this: no static INT8")
    autopilot: bool = Field(
        True,
        description="when validation.int8 fails, return Gemm, then block by block MatMuls to float, within "
        "what min_speedup allows: refused at once when the largest such step fails on the inputs the fully "
        "quantized graph failed on, else the fewest in float that pass (every step judged in the manifest)",
    )
    min_speedup: float = Field(
        1.3,
        ge=0,
        description="model.int8.onnx is shipped only when it runs at least this many "
        "times as fast as model.ort.onnx here (the fully quantized graph is timed on the calibration "
        "batch before any accuracy work, the graph that passed validation again after); 0 = always ship",
    )
    tensorrt: Union[Literal["auto"], bool] = Field(
        "auto",
        description="model.int8.trt.onnx (S8 symmetric Q/DQ from model.onnx) and the INT8 TensorRT engine "
        "model.int8.engine built from it: auto = when the engine stage runs (TensorRT and a CUDA GPU "
        "here), going on without them on failure; true = always write and validate the graph (a "
        "failure is refused: written without it, exit non-zero), and build the engine where TensorRT "
        "exists; false = never",
    )


class ExportSection(_Section):
    output_dir: Path = Field(Path("artifacts"), description="where the artifacts go (`export -o` overrides)")
    opset: int = Field(18, ge=17, le=23, description="ONNX opset (17-23; 18 keeps LayerNorm one node)")
    batch: BatchProfile = BatchProfile()
    fp16: Fp16Section = Fp16Section()
    int8: Int8Section = Int8Section()
    external_data_threshold_mb: int = Field(
        1536, ge=0, description="write weights as external data above this size (protobuf limit: 2 GB; 0 = always)"
    )
    optimize: bool = Field(True, description="save ONNX Runtime's transformer-fused graph when the drift checks pass")
    image_sizes: Optional[list[Annotated[int, Field(gt=0, le=MAX_IMAGE_SIDE)]]] = Field(
        None,
        min_length=1,
        max_length=32,
        description="square image sizes one export answers at (e.g. [224, 336, 448, 518]), each a multiple of the "
        "patch, each validated against eager PyTorch at that size: for checkpoints whose library runs them at any "
        "size (DINOv2, transformers ViT / DeiT, timm); absent = one fixed size",
    )

    @model_validator(mode="after")
    def _sorted_sizes(self) -> "ExportSection":
        if self.image_sizes is not None:
            object.__setattr__(self, "image_sizes", sorted(set(self.image_sizes)))
        return self


class Tolerance(_Section):
    max_abs_diff: FiniteFloat = Field(..., ge=0, description="largest |logit difference| against eager FP32 PyTorch")
    mean_abs_diff: FiniteFloat = Field(..., ge=0, description="mean |logit difference| against eager FP32 PyTorch")
    min_cosine: FiniteFloat = Field(..., ge=-1, le=1, description="lowest cosine similarity of a row of logits")
    min_top1_agreement: FiniteFloat = Field(
        ..., ge=0, le=1, description="share of inputs whose top-1 class is eager's"
    )
    min_top5_overlap: FiniteFloat = Field(..., ge=0, le=1, description="mean share of eager's top-5 in the top-5")
    min_recall_at_k: FiniteFloat = Field(
        1.0,
        ge=0,
        le=1,
        description="embedding models: mean share of each input's k nearest neighbours (cosine, among the "
        "validation inputs) under eager PyTorch that are among its k nearest under the artifact (recall@k)",
    )
    neighbours: int = Field(10, ge=1, le=1000, description="embedding models: k of min_recall_at_k")
    min_patch_cosine: Optional[FiniteFloat] = Field(
        None,
        ge=-1,
        le=1,
        description="embedding models with model.patch_tokens: lowest cosine of a patch token to eager's, over "
        "every token of every input; absent = min_cosine",
    )

    @model_validator(mode="before")
    @classmethod
    def _patch_cosine_defaults_to_min_cosine(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("min_patch_cosine") is None and "min_cosine" in data:
            return {**data, "min_patch_cosine": data["min_cosine"]}
        return data


class ValidationSection(_Section):
    images: Optional[Path] = Field(None, description="folder of real images; absent = the demo images")
    max_images: int = Field(64, ge=1, description="validation images used (at most)")
    noise_samples: int = Field(8, ge=0, description="seeded noise inputs added to the real images")
    seed: int = Field(0, description="seed of the noise inputs")
    fp32: Tolerance = Tolerance(
        max_abs_diff=1e-3, mean_abs_diff=1e-4, min_cosine=0.99999, min_top1_agreement=1.0, min_top5_overlap=1.0
    )
    fp16: Tolerance = Tolerance(
        max_abs_diff=0.1,
        mean_abs_diff=0.02,
        min_cosine=0.999,
        min_top1_agreement=0.98,
        min_top5_overlap=0.9,
        min_recall_at_k=0.95,
    )
    int8: Tolerance = Tolerance(
        max_abs_diff=1.0,
        mean_abs_diff=0.1,
        min_cosine=0.99,
        min_top1_agreement=0.98,
        min_top5_overlap=0.9,
        min_recall_at_k=0.9,
    )
    bf16: Tolerance = Tolerance(  # openvino-bf16: model.onnx in BF16 (8 bits of mantissa, FP16 has 11)
        max_abs_diff=0.5,
        mean_abs_diff=0.05,
        min_cosine=0.999,
        min_top1_agreement=0.98,
        min_top5_overlap=0.9,
        min_recall_at_k=0.95,
    )


class TensorRTSection(_Section):
    workspace_mb: int = Field(4096, ge=16, description="TensorRT builder workspace limit (MiB)")
    optimization_level: int = Field(3, ge=0, le=5, description="TensorRT builder optimisation level (0-5)")
    timing_cache: Optional[Path] = Field(None, description="absent = <output_dir>/timing.cache")


class TritonSection(_Section):
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


class RuntimeSection(_Section):
    backend: BackendChoice = Field(
        "auto",
        description="auto = trt if usable, else ort-fp16 on CUDA, else the fastest CPU backend here that passed "
        "its gate (measured at the first load, kept per CPU in auto-backend.json), else torch; "
        "auto skips a backend that cannot run here, never a refused artifact",
    )
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:\d+)?)$", description="cpu, cuda or cuda:N")
    providers: tuple[Union[str, tuple[str, dict[str, Union[str, int, float, bool]]]], ...] = Field(
        ("CPUExecutionProvider",), description="ONNX Runtime providers: a name, or [name, {option: value}]"
    )
    allow_cpu_fallback: bool = Field(False, description="accept an ONNX Runtime session that fell back to the CPU")
    threads: Optional[int] = Field(None, ge=1, description="intra-op threads (default: the library's)")
    ort_allow_spinning: Union[Literal["auto"], bool] = Field(
        "auto", description="ONNX Runtime idle threads busy-wait; auto = only when they leave a core free"
    )
    batch_size: BatchSize = 32
    trt_contexts: int = Field(
        2, ge=1, description="trt backend: execution contexts (GPU memory each) shared by all threads"
    )
    top_k: int = Field(5, ge=1, description="K of predict's top-k")
    max_image_pixels: int = Field(
        89_478_485, ge=1, description="images whose header claims more pixels are refused before decoding"
    )


class AutoscalingSection(_Section):
    """Ray Serve's autoscaling_config: replicas follow the requests each one is working on."""

    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(4, ge=1)
    target_ongoing_requests: float = Field(16.0, gt=0, description="requests per replica the autoscaler aims for")

    @model_validator(mode="after")
    def _order(self) -> "AutoscalingSection":
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) must be <= max_replicas ({self.max_replicas})")
        return self


class TlsSection(_Section):
    """HTTPS through Ray Serve's own HTTP options (the proxy's ssl_certfile, ssl_keyfile, ssl_ca_certs)."""

    certfile: str = Field(..., min_length=1, description="PEM certificate (chain) the server presents")
    keyfile: str = Field(
        ..., min_length=1, description="PEM private key of certfile, unencrypted; only its path is ever written"
    )
    ca_certs: Optional[str] = Field(
        None,
        min_length=1,
        description="PEM CA bundle for client certificates (Ray Serve's ssl_ca_certs; Ray's proxy does not "
        "require a client certificate)",
    )


class TracingSection(_Section):
    """Traces (OpenTelemetry, OTLP through Ray Serve's tracing): on when OTEL_EXPORTER_OTLP_ENDPOINT is set and the
    [otel] extra is installed."""

    sampling_ratio: float = Field(
        0.01,
        ge=0,
        le=1,
        description="share of the requests without a client's traceparent that are traced (Ray Serve's default, "
        "1%); a client's sampled traceparent is always followed; 1 traces every request",
    )


class ServeSection(_Section):
    """`vitdeploy serve` (Ray Serve) and the Triton repository: batching, limits, scale."""

    host: str = Field(
        "127.0.0.1", min_length=1, description="address to listen on (0.0.0.0 exposes it to the network)"
    )
    port: int = Field(8000, ge=1, le=65535, description="HTTP port")
    metrics_port: int = Field(8080, ge=1, le=65535, description="Prometheus metrics of the local Ray node (/metrics)")
    metrics_host: str = Field(
        "127.0.0.1",
        description=(
            "where the local Ray's metrics (and the node itself) listen: loopback unless set to the machine's "
            "address (then other machines can also join that Ray with --address)"
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
        description="HTTPS: {certfile: cert.pem, keyfile: key.pem, ca_certs: optional CA bundle for client "
        "certificates} (PEM paths, through Ray Serve's ssl_* HTTP options; a RayService mounts them from a Secret)",
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
        description="KServe v2 gRPC (tritonclient.grpc) through "
        "Ray Serve's gRPC proxy on this port; null = off (needs tritonclient[grpc])",
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


class BatchSection(_Section):
    """`vitdeploy batch-predict` (Ray Data): the worker pool and the output (CLI flags override)."""

    workers: Union[Literal["auto"], Annotated[int, Field(ge=1)]] = Field(
        "auto",
        description="inference actors (one Predictor each); auto: on a Ray this job starts, one per cpus_per_worker "
        "of the machine's cores (decoding gets its own logical CPUs), else 1",
    )
    cpus_per_worker: float = Field(
        1.0,
        ge=0,
        description="Ray CPUs per inference actor; also its intra-op threads (whole CPUs; runtime.threads is a "
        "predictor's, used only for a fraction)",
    )
    gpus_per_worker: float = Field(0.0, ge=0, description="Ray GPUs per inference actor (e.g. 1, or 0.5 to share one)")
    decode_cpus: float = Field(
        1.0, gt=0, description="Ray CPUs per reading or decoding task (Ray runs as many as fit)"
    )
    batch_size: Optional[BatchSize] = Field(
        None, description="images per model call; absent = the export's batch profile opt (export.batch.opt)"
    )
    rows_per_file: int = Field(10_000, ge=1, description="output rows per Parquet part file (and per flush)")
    embedding_dtype: EmbeddingDtype = Field(
        "float32",
        description="an embedding export's vectors in the output: float32 (as the model returns them) or float16 "
        "(half the bytes); a classifier's rows have no vectors",
    )
    patch_tokens: bool = Field(
        False,
        description="an export with model.patch_tokens: a patch_tokens column beside each vector (fixed-size list of "
        "P fixed-size lists of D, in embedding_dtype; P times the vector's size); `batch-predict --patch-tokens`",
    )
    flush_seconds: float = Field(
        30.0,
        gt=0,
        description="rows are written at least this often, so a killed job loses at most this much work (--resume)",
    )
    cache_dir: Optional[Path] = Field(
        None,
        description="per-node cache of the artifacts shipped to workers; absent = "
        "$VITDEPLOY_ARTIFACT_CACHE, else ~/.cache/vitdeploy/artifacts",
    )


class PipelineConfig(_Section):
    model: ModelSection = ModelSection()
    preprocess: PreprocessSection = PreprocessSection()
    export: ExportSection = ExportSection()
    validation: ValidationSection = ValidationSection()
    tensorrt: TensorRTSection = TensorRTSection()
    triton: TritonSection = TritonSection()
    runtime: RuntimeSection = RuntimeSection()
    serve: ServeSection = ServeSection()
    batch: BatchSection = BatchSection()
    source: Optional[Path] = Field(None, exclude=True, description="the YAML this came from")

    @property
    def base_dir(self) -> Path:
        return self.source.parent if self.source else Path.cwd()

    def resolve(self, path: Optional[Path]) -> Optional[Path]:
        if path is None:
            return None
        path = Path(path).expanduser()
        return path if path.is_absolute() else (self.base_dir / path).resolve()

    @property
    def checkpoint_ref(self) -> "Path | HubName | None":
        """What model.checkpoint names: an existing path, a Hub name (base/hub_name.py), or None (the demo)."""
        return checkpoint_ref(self.model.checkpoint, self.base_dir, self.model.revision)

    def with_checkpoint(self, model: Optional[str], revision: Optional[str]) -> "PipelineConfig":
        """This config with ``model`` (``vitdeploy export MODEL``, relative to the current directory) in place
        of model.checkpoint and ``revision`` (``--revision``) in place of model.revision; checked as the file's."""
        if model is None and revision is None:
            return self
        if model is None:  # --revision alone: the config's checkpoint at that revision
            value, base = self.model.checkpoint, self.base_dir
        else:  # the command line's MODEL: a path is the shell's (the current directory), else a Hub name
            path, base = Path(model).expanduser(), Path.cwd()
            value = str(path.resolve()) if not model.startswith(HUB_PREFIX) and path.exists() else model
        key = "MODEL" if model is not None else "model.checkpoint"
        ref = checkpoint_ref(value, base, revision if model is not None else revision or self.model.revision, key=key)
        if isinstance(ref, HubName):
            value, revision = HUB_PREFIX + ref.repo_id, ref.revision
        section = self.model.model_copy(update={"checkpoint": value, "revision": revision})
        cfg = self.model_copy(update={"model": section})
        return cfg

    @property
    def output_dir(self) -> Path:
        return self.resolve(self.export.output_dir)  # type: ignore[return-value]


# The top-level sections, derived from the model (never typed twice): model, preprocess, export, ...
SECTIONS: tuple[str, ...] = tuple(name for name, f in PipelineConfig.model_fields.items() if not f.exclude)


def _format_error(exc: ValidationError, source: str) -> str:
    def allowed(loc: tuple) -> str:
        parent = _section_for(loc)
        return ", ".join(sorted(parent.model_fields)) if parent else "see the README"

    return format_validation_error(exc, source, allowed)


def _section_for(loc: tuple) -> Optional[type[BaseModel]]:
    model: type[BaseModel] = PipelineConfig
    for part in loc:
        field = model.model_fields.get(str(part))
        ann = getattr(field, "annotation", None) if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        model = ann
    return model


def parse_config(data: Any, source: Optional[Path] = None) -> PipelineConfig:
    label = str(source) if source else "pipeline config"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{label}: the top level must be a mapping of sections ({', '.join(SECTIONS)}), got {type(data).__name__}"
        )
    if "source" in data:
        raise ConfigError(f"{label}: unknown key 'source' (allowed: {', '.join(SECTIONS)})")
    try:
        cfg = PipelineConfig.model_validate({**data, "source": source.resolve() if source else None})
    except ValidationError as exc:
        raise ConfigError(_format_error(exc, label)) from None
    _check_paths(cfg, label)
    return cfg


def _check_paths(cfg: PipelineConfig, label: str) -> None:
    try:
        cfg.checkpoint_ref  # an existing path or a Hub name, said before any work
    except ConfigError as exc:
        raise ConfigError(f"{label}: {exc}") from None
    for key, path in (("validation.images", cfg.validation.images),):
        resolved = cfg.resolve(path)
        if resolved is not None and not resolved.exists():
            raise ConfigError(
                f"{label}: '{key}' = {clip(str(path))}: no such file or directory ({clip(str(resolved))})"
            )


def load_config(path: Optional[Path | str] = None) -> PipelineConfig:
    """Read a pipeline YAML. ``None`` reads ./pipeline.yaml if present, else all defaults.

    The file is read with bounds (size, nesting, alias expansion: see yaml_load.py)."""
    from .yaml_load import load_yaml_file

    if path is None:
        candidate = Path.cwd() / DEFAULT_CONFIG_NAME
        if not candidate.exists():
            return parse_config({}, None)
        path = candidate
    path = Path(path)
    if path.is_dir():
        raise ConfigError(
            f"{path} is a directory; -c/--config takes a pipeline YAML file (e.g. {path / DEFAULT_CONFIG_NAME})"
        )
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    return parse_config(load_yaml_file(path), path)
