"""`vitdeploy serve`: start (or join) Ray, run the Serve application, drain and stop on a signal.

    run_server(cfg, "artifacts/", backend="ort", progress=print)   # blocks until SIGTERM / Ctrl-C

Without ``address`` a local Ray is started for this process (dashboard off, Prometheus metrics on
``serve.metrics_port``) and stopped on exit, with every process it started. With ``address``
(``ray://head:10001`` or ``auto``) the application is deployed on that cluster and only the
application is deleted on exit: the cluster, and Serve on it, are the cluster owner's.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..base import ray_loopback
from ..base._deps import require
from ..base.errors import BackendError, remote_reason
from ..base.ray_join import init_ray
from ..base.ray_private import WORKER_NICENESS_ENV, local_ray_options
from ..runtime.backends import first_line
from . import exposure, tls, tracing
from .rollout.routes import version_of_app

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ServeSettings:
    """Everything `vitdeploy serve` was asked for, after the command line overrode the config."""

    artifacts: Path
    backend: str
    host: str
    port: int
    replicas: int
    address: str | None = None
    access_log: bool = False
    name: str | None = None  # --name, else serve.name, else the manifest's name
    #: the serve token's SHA-256 (serve/auth.py): None = every route open; never in a repr
    token_digest: str | None = field(default=None, repr=False)


def app_name(cfg: Any, settings: ServeSettings, manifest_name: str) -> str:
    """The model's name on the wire: the Serve application's name and its route /v2/models/<name>."""
    from . import protocol

    return protocol.model_name(settings.name or cfg.serve.name or manifest_name)


def route_prefix(name: str) -> str:
    return f"/v2/models/{name}"


def _check_artifacts(settings: ServeSettings, public_key: Path | None = None) -> Any:
    """Open the artifacts here first: a bad directory or manifest is one clear error before Ray starts; with
    ``public_key`` (runtime.verify) an export that key did not sign, or changed since, is refused here too."""
    from ..runtime.artifacts import Artifacts

    if "://" in str(settings.artifacts):  # a URI: downloaded once into this node's cache, verified
        from ..runtime.artifact_transfer import fetch_uri

        if public_key is not None:
            from ..runtime.signature import verify_uri

            verify_uri(str(settings.artifacts), public_key)
        return fetch_uri(str(settings.artifacts))
    return Artifacts.open(settings.artifacts, public_key=public_key)


def replica_spec(cfg: Any, settings: ServeSettings, options: Any, source: Any = None, name: str = "") -> Any:
    """What each replica gets; ``source``: where it reads the artifacts (default: the local path)."""
    from .replica_spec import ReplicaSpec

    sv = cfg.serve
    source = str(Path(settings.artifacts).resolve()) if source is None else source
    return ReplicaSpec(
        artifacts=source,
        backend=settings.backend,
        options=options,
        name=name,
        num_cpus=sv.num_cpus_per_replica,
        max_pixels=cfg.runtime.max_image_pixels,
        top_k=sv.top_k,
        max_batch_size=sv.max_batch_size,
        batch_wait_timeout_s=sv.batch_wait_timeout_s,
        decode_threads=sv.decode_threads,
        concurrent_batches=sv.concurrent_batches,
        max_images_per_request=sv.max_images_per_request,
        max_request_bytes=int(sv.max_request_mb * 1024 * 1024),
        token_digest=settings.token_digest,
        stage_timing=sv.stage_timing,
    )


WORKER_NICENESS = WORKER_NICENESS_ENV.variable
DRAIN_GRACE_S = 0.5  # read by the raylet when ray.init starts it


def curl_example(url: str, token: bool = False) -> str:
    header = ' -H "Authorization: Bearer $VITDEPLOY_SERVE_TOKEN"' if token else ""
    return f"curl{header} -H 'Content-Type: image/jpeg' --data-binary @cat.jpg {url}/predict"


def ready_lines(cfg: Any, settings: ServeSettings, name: str) -> list[str]:
    """What `vitdeploy serve` prints once the model answers: each port at the address it really binds (the gRPC
    proxy on every interface, whatever --host says), who may reach it, how to call the model."""
    asked = exposure.Exposure(settings.host, port=settings.port, address=settings.address)
    found = exposure.listeners(cfg, asked, bool(settings.token_digest))
    http, others = found[0], {listener.what: listener for listener in found[1:]}
    url = f"{tls.scheme(cfg)}://{http.address}"
    lines = [f"ready: {url}  (model {name!r}: POST {url}/predict, KServe v2 at {url}{route_prefix(name)}/infer)"]
    lines.append(f"HTTP{'S' if cfg.serve.tls else ''}: {http.shown()}")
    if "gRPC" in others:
        lines.append(f"gRPC:  {others['gRPC'].shown()} (KServe v2, tritonclient.grpc; {exposure.GRPC_WHY})")
    lines.append(f"try:   {curl_example(url, bool(settings.token_digest))}")
    if settings.token_digest:
        lines.append("auth:  every model route needs Authorization: Bearer <token>; /v2/health/* stays open")
    if "the local Ray" in others:
        ray = others["the local Ray"]
        lines.append(f"metrics: http://{ray.address}/metrics (Prometheus, ray_serve_*); Ray's ports: {ray.shown()}")
    if exposure.REPLICAS in others:  # its token is Ray's own (RAY_AUTH_MODE), not the serve token
        replicas = others[exposure.REPLICAS].shown().replace("a token", "Ray's token")
        lines.append(f"replicas: {replicas} (Ray Serve's inter-deployment gRPC, called over loopback here)")
    lines.append("Ctrl-C or SIGTERM drains in-flight requests and stops")
    return lines


def run_server(
    cfg: Any, settings: ServeSettings, options: Any, progress: Progress, stop: threading.Event | None = None
) -> None:
    """Serve until SIGTERM/SIGINT (or ``stop`` is set); then drain in-flight requests and exit."""
    artifacts = _check_artifacts(settings, cfg.verify_key)  # a bad (or unsigned) export first, before Ray
    ray = require("ray", "vitdeploy serve")
    require("ray.serve", "vitdeploy serve (pip install 'vitdeploy[serve]')")
    name = app_name(cfg, settings, artifacts.name)
    stop = stop or threading.Event()
    previous = _catch_signals(stop)
    owns_cluster = settings.address is None
    started = False
    try:
        if owns_cluster:
            start_local_ray(ray, cfg, settings, progress)
        else:
            progress(f"connecting to the Ray cluster at {settings.address} ...")
            try:
                init_ray(ray, settings.address, logging_level=logging.WARNING)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise BackendError(
                    f"cannot join the Ray cluster at {settings.address}: {first_line(exc)}; "
                    f"check --address (ray://head:10001, host:port of its GCS, or auto)"
                ) from None
        started = True
        _catch_signals(stop)  # ray.init installs its own SIGTERM handler (sys.exit) and a crash reporter: replace them
        if stop.is_set():
            return
        _deploy(ray, cfg, settings, options, name, artifacts, progress)
        for line in ready_lines(cfg, settings, name):
            progress(line)
        while not stop.wait(0.5):
            pass
        progress("stopping: draining in-flight requests ...")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if started:
            _stop(ray, name, owns_cluster, progress)


def start_local_ray(ray: Any, cfg: Any, settings: ServeSettings, progress: Progress) -> Any:
    """A Ray of this process's own for `vitdeploy serve` (and `vitdeploy tune`): its workers at normal
    priority, the proxy's guard configured, loopback unless serve.metrics_host says otherwise."""
    sv = cfg.serve
    cpus = max(os.cpu_count() or 1, int(-(-settings.replicas * sv.num_cpus_per_replica // 1)))
    progress(f"starting Ray (local, {cpus} CPUs, metrics on port {sv.metrics_port}) ...")
    # Ray starts its worker processes (the replicas, the HTTP proxy) at nice 15, below everything
    # else on the machine: right for batch jobs, wrong for a server, whose requests then wait
    # behind any other busy process (ViT-S/16 on 2 cores beside busy processes: 0.60-0.70x the
    # in-process Predictor at nice 15, see benchmarks/bench_serve.py). Serve at normal priority
    # unless the user set RAY_worker_niceness; a cluster given by --address keeps its own setting.
    os.environ.setdefault(WORKER_NICENESS, "0")
    # Traces (OTEL_EXPORTER_OTLP_ENDPOINT and the [otel] extra): Ray's proxy reads its tracing from the environment.
    os.environ.update(tracing.ray_env(tracing.config(sv.tracing.sampling_ratio)))
    # The proxy's guard (bodies read with a deadline and a byte limit, health answered in the
    # proxy, JSON errors): Ray's proxy actor inherits these from the raylet started here.
    from .proxy_guard import env_for

    os.environ.update(env_for(int(sv.max_request_mb * 1024 * 1024), sv.body_timeout_s))
    # The guard checks the serve token against its digest (the token itself stays in this process).
    from .auth import DIGEST_ENV

    if settings.token_digest:
        os.environ[DIGEST_ENV] = settings.token_digest
    else:
        os.environ.pop(DIGEST_ENV, None)
    # Every port of Ray (its Prometheus endpoint too) on loopback, unless serve.metrics_host says otherwise.
    loopback = exposure.ray_node_host(settings.host, sv.metrics_host) in ray_loopback.LOOPBACK
    ctx = init_ray_retrying(
        ray,
        progress,
        address="local",  # a Ray of its own: without it Ray joins any Ray already running on this machine
        num_cpus=cpus,
        include_dashboard=False,
        logging_level=logging.WARNING,
        configure_logging=True,
        # on loopback: kept there (base/ray_join.init_ray); else Ray's node address, all interfaces
        **local_ray_options(sv.metrics_port, loopback),
    )
    gcs = ctx.address_info["gcs_address"]
    joins = f" (Ray's own tools: {ray_loopback.RAY_CLUSTER_ENV}=0 in their environment)" if loopback else ""
    progress(f"Ray at {gcs}: more models join it with `vitdeploy serve --address {gcs}`{joins}")
    url = f"http://{settings.host}:{settings.port}"
    progress(f"new exports of a model go live with `vitdeploy rollout {url} -a NEW_EXPORT --address {gcs}`")
    return ctx


#: what Ray 2.60 raises when its raylet has not registered within a hard-coded 30 s (ray/_private/node.py): a
#: machine busy for that long, not a fault of this start
RAY_START_TIMEOUT = "timed out during startup"


def init_ray_retrying(ray: Any, progress: Progress, **options: Any) -> Any:
    """``ray.init(**options)`` (through base/ray_join.init_ray), once more after a ``ray.shutdown()`` when Ray's
    own start timed out (the raylet slow to register on a busy machine); any other failure, or a second timeout, is
    raised."""
    try:
        return init_ray(ray, **options)
    except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for it
        if RAY_START_TIMEOUT not in str(exc):
            raise
        progress(f"Ray's start timed out ({first_line(exc)}); starting it once more ...")
        ray.shutdown()
        return init_ray(ray, **options)


def _catch_signals(stop: threading.Event) -> dict[int, Any]:
    return {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}


def _grpc_options(port: int | None) -> dict[str, Any]:
    """``serve.start``'s gRPC proxy options: Triton's GRPCInferenceService (tritonclient's stubs) on ``port``."""
    if port is None:
        return {}
    from .kserve_grpc import SERVICER_FUNCTION

    require("tritonclient.grpc", "serve.grpc_port")  # the proxy imports SERVICER_FUNCTION
    return {"grpc_options": {"port": int(port), "grpc_servicer_functions": [SERVICER_FUNCTION]}}


def _deploy(
    ray: Any, cfg: Any, settings: ServeSettings, options: Any, name: str, artifacts: Any, progress: Progress
) -> None:
    from ray import serve

    from ..runtime.artifact_transfer import pack
    from ..runtime.backends import shipped_roles
    from .ray_app import build_app

    sv = cfg.serve
    if not log.isEnabledFor(logging.INFO):  # Ray Serve's own INFO lines repeat what progress() says
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
    traces = tracing.config(sv.tracing.sampling_ratio)  # None unless OTEL_EXPORTER_OTLP_ENDPOINT (and [otel])
    serve.start(
        http_options={
            "host": settings.host,
            "port": settings.port,
            "request_timeout_s": sv.request_timeout_s,
            **tls.http_options(cfg),
        },
        **_grpc_options(sv.grpc_port),
        logging_config={"log_level": "WARNING", "enable_access_log": settings.access_log},
        **tracing.start_options(serve.start, traces),
    )
    if traces or tracing.unavailable():
        progress(tracing.progress_line(traces) if traces else f"traces: off: {tracing.unavailable()}")
    taken = serve.status().applications.get(name)
    if taken is not None and settings.address is not None:
        raise BackendError(
            f"a Serve application named {name!r} already runs on this cluster; give this one "
            f"another name with --name (or serve.name)"
        )
    # The artifacts travel with the deployment: packed once here, put in Ray's object store, unpacked
    # once per node and verified (sha256) by each replica, whichever node it lands on.
    bundle = pack(artifacts, shipped_roles(settings.backend, artifacts))
    progress(
        f"deploying {name} ({_scale(sv, settings.replicas)}, backend {settings.backend}, "
        f"batch <= {sv.max_batch_size} within {sv.batch_wait_timeout_s * 1000:g} ms, artifacts "
        f"{bundle.nbytes / 1e6:.1f} MB shipped through Ray) ..."
    )
    spec = replica_spec(cfg, settings, options, source=ray.put(bundle), name=name)
    app = build_app(spec, sv, settings.replicas)
    try:
        serve.run(
            app,
            name=name,
            route_prefix=route_prefix(name),
            logging_config={"log_level": "WARNING", "enable_access_log": settings.access_log},
            # a fixed replica count may be changed in place: a rollout on a full cluster lowers it step by step
            external_scaler_enabled=sv.autoscaling is None,
        )
    except Exception as exc:  # noqa: BLE001 - Ray wraps the replica's error in its own types
        raise BackendError(f"the Serve application did not start: {remote_reason(exc)}") from exc


def _scale(sv: Any, replicas: int) -> str:
    a = sv.autoscaling
    if a is None:
        return f"{replicas} replica(s)"
    return f"{a.min_replicas}-{a.max_replicas} replicas, autoscaling at {a.target_ongoing_requests:g} ongoing requests"


def _forget_versions(name: str) -> None:
    """The rollout registry (if a rollout ever ran on this cluster) forgets the model's versions."""
    import ray

    from .rollout.registry import registry_actor

    registry = registry_actor()
    if registry is not None:
        ray.get(registry.forget.remote(name), timeout=10)


def _stop(ray: Any, name: str, owns_cluster: bool, progress: Progress) -> None:
    from ray import serve

    try:
        # Requests the proxy has accepted but not yet routed (their bodies still arriving) are routed
        # before the route goes away; afterwards the proxy's guard answers 503 (retry) for this model.
        time.sleep(DRAIN_GRACE_S)
        # every version of the model (`vitdeploy rollout` adds <name>@vN): replicas finish their in-flight
        # requests first (graceful_shutdown_timeout_s)
        for app in [a for a in serve.status().applications if version_of_app(name, a) is not None]:
            serve.delete(app)
        if not owns_cluster:
            _forget_versions(name)
        if owns_cluster:
            serve.shutdown()
    except Exception as exc:  # noqa: BLE001 - shutting down: report, still stop Ray below
        log.warning("serve shutdown: %s", exc)
    finally:
        ray.shutdown()
    progress("stopped")
