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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .._deps import require
from ..errors import BackendError

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


def _check_artifacts(settings: ServeSettings) -> Any:
    """Open the artifacts here first: a bad directory or manifest is one clear error before Ray starts."""
    from ..runtime.artifacts import Artifacts

    return Artifacts.open(settings.artifacts)


def replica_spec(cfg: Any, settings: ServeSettings, options: Any) -> Any:
    from .ray_app import ReplicaSpec

    sv = cfg.serve
    return ReplicaSpec(artifacts=str(Path(settings.artifacts).resolve()), backend=settings.backend, options=options,
                       max_pixels=cfg.runtime.max_image_pixels, top_k=sv.top_k, max_batch_size=sv.max_batch_size,
                       batch_wait_timeout_s=sv.batch_wait_timeout_s, decode_threads=sv.decode_threads,
                       concurrent_batches=sv.concurrent_batches,
                       max_images_per_request=sv.max_images_per_request,
                       max_request_bytes=int(sv.max_request_mb * 1024 * 1024))


WORKER_NICENESS = "RAY_worker_niceness"  # read by the raylet when ray.init starts it


def curl_example(url: str) -> str:
    return f"curl -H 'Content-Type: image/jpeg' --data-binary @cat.jpg {url}/predict"


def run_server(cfg: Any, settings: ServeSettings, options: Any, progress: Progress,
               stop: threading.Event | None = None) -> None:
    """Serve until SIGTERM/SIGINT (or ``stop`` is set); then drain in-flight requests and exit."""
    ray = require("ray", "vitdeploy serve")
    require("ray.serve", "vitdeploy serve (pip install 'vitdeploy[serve]')")
    artifacts = _check_artifacts(settings)
    sv = cfg.serve
    from . import protocol

    name = protocol.model_name(artifacts.name)
    stop = stop or threading.Event()
    previous = _catch_signals(stop)
    owns_cluster = settings.address is None
    started = False
    try:
        if owns_cluster:
            cpus = max(os.cpu_count() or 1, int(-(-settings.replicas * sv.num_cpus_per_replica // 1)))
            progress(f"starting Ray (local, {cpus} CPUs, metrics on port {sv.metrics_port}) ...")
            # Ray starts its worker processes (the replicas, the HTTP proxy) at nice 15, below everything
            # else on the machine: right for batch jobs, wrong for a server, whose requests then wait
            # behind any other busy process (ViT-S/16 on 2 cores beside busy processes: 0.60-0.70x the
            # in-process Predictor at nice 15, see benchmarks/bench_serve.py). Serve at normal priority
            # unless the user set RAY_worker_niceness; a cluster given by --address keeps its own setting.
            os.environ.setdefault(WORKER_NICENESS, "0")
            ray.init(num_cpus=cpus, include_dashboard=False, _metrics_export_port=sv.metrics_port,
                     logging_level=logging.WARNING, configure_logging=True)
        else:
            progress(f"connecting to the Ray cluster at {settings.address} ...")
            ray.init(address=settings.address, logging_level=logging.WARNING)
        started = True
        _catch_signals(stop)  # ray.init installs its own SIGTERM handler (sys.exit) and a crash reporter: replace them
        if stop.is_set():
            return
        _deploy(cfg, settings, options, name, progress)
        url = f"http://{settings.host}:{settings.port}"
        progress(f"ready: {url}  (model {name!r}: POST {url}/predict, KServe v2 at {url}/v2/models/{name}/infer)")
        if sv.grpc_port is not None:
            progress(f"gRPC:  {settings.host}:{sv.grpc_port} (KServe v2, tritonclient.grpc)")
        progress(f"try:   {curl_example(url)}")
        if owns_cluster:
            progress(f"metrics: http://{settings.host if settings.host != '0.0.0.0' else '127.0.0.1'}:"
                     f"{sv.metrics_port}/metrics (Prometheus, ray_serve_*)")
        progress("Ctrl-C or SIGTERM drains in-flight requests and stops")
        while not stop.wait(0.5):
            pass
        progress("stopping: draining in-flight requests ...")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if started:
            _stop(ray, owns_cluster, progress)


def _catch_signals(stop: threading.Event) -> dict[int, Any]:
    return {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}


def _grpc_options(port: int | None) -> dict[str, Any]:
    """``serve.start``'s gRPC proxy options: Triton's GRPCInferenceService (tritonclient's stubs) on ``port``."""
    if port is None:
        return {}
    from .kserve_grpc import SERVICER_FUNCTION

    require("tritonclient.grpc", "serve.grpc_port")  # the proxy imports SERVICER_FUNCTION
    return {"grpc_options": {"port": int(port), "grpc_servicer_functions": [SERVICER_FUNCTION]}}


def _deploy(cfg: Any, settings: ServeSettings, options: Any, name: str, progress: Progress) -> None:
    from ray import serve

    from .ray_app import APP_NAME, build_app

    sv = cfg.serve
    if not log.isEnabledFor(logging.INFO):  # Ray Serve's own INFO lines repeat what progress() says
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
    serve.start(http_options={"host": settings.host, "port": settings.port}, **_grpc_options(sv.grpc_port),
                logging_config={"log_level": "WARNING", "enable_access_log": settings.access_log})
    progress(f"deploying {name} ({settings.replicas} replica(s), backend {settings.backend}, "
             f"batch <= {sv.max_batch_size} within {sv.batch_wait_timeout_s * 1000:g} ms) ...")
    app = build_app(replica_spec(cfg, settings, options), replicas=settings.replicas,
                    num_cpus=sv.num_cpus_per_replica, num_gpus=sv.num_gpus_per_replica,
                    max_ongoing_requests=sv.max_ongoing_requests, max_queued_requests=sv.max_queued_requests,
                    graceful_shutdown_timeout_s=sv.graceful_shutdown_timeout_s)
    try:
        serve.run(app, name=APP_NAME, route_prefix="/",
                  logging_config={"log_level": "WARNING", "enable_access_log": settings.access_log})
    except Exception as exc:  # noqa: BLE001 - Ray wraps the replica's error in its own types
        raise BackendError(f"the Serve application did not start: {_replica_reason(exc)}") from exc


def _replica_reason(exc: BaseException) -> str:
    """The one line that says why a replica failed (Ray's message carries the remote traceback)."""
    text = str(exc)
    for marker in ("vitdeploy.errors.", "Error: "):
        for line in text.splitlines():
            if marker in line:
                return line.strip()
    return text.strip().splitlines()[-1] if text.strip() else type(exc).__name__


def _stop(ray: Any, owns_cluster: bool, progress: Progress) -> None:
    from ray import serve

    from .ray_app import APP_NAME

    try:
        serve.delete(APP_NAME)  # replicas finish their in-flight requests first (graceful_shutdown_timeout_s)
        if owns_cluster:
            serve.shutdown()
    except Exception as exc:  # noqa: BLE001 - shutting down: report, still stop Ray below
        log.warning("serve shutdown: %s", exc)
    finally:
        ray.shutdown()
    progress("stopped")
