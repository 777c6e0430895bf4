"""`vitdeploy serve` of one model in this process's own Ray, whose settings the search changes.

The export is packed and put in Ray's object store once: a candidate that changes only the batch settings
(``user_config``, applied by the replicas' ``reconfigure``) or the replica count is deployed with the same
replica arguments, so Ray Serve updates the running replicas in place; a new layout, number of concurrent
calls or decode threads replaces them (a new ``ReplicaSpec``). Ray itself starts once and stops in ``close``,
whatever happened (Ctrl-C included).
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Any, Optional

from ..base._deps import require
from ..base.errors import BackendError, first_line
from ..evaluate.reliability import usable_cores
from ..serve.triton.local import free_port
from .space import TUNING_MAX_ONGOING, ServeCandidate

log = logging.getLogger(__name__)

IN_PLACE, REPLACED, STARTED, RELOADED = "in place", "replicas replaced", "started", "models reloaded"


class ServeTarget:
    def __init__(self, cfg: Any, artifacts: Path, options: Any) -> None:
        self.cfg, self.artifacts_dir, self.options = cfg, Path(artifacts), options
        self.port, self.metrics_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.name = ""
        self._ray: Any = None
        self._bundles: dict[str, Any] = {}  # backend -> the export packed for it, in Ray's object store
        self._artifacts: Any = None
        self._specs: dict[tuple, Any] = {}
        self._current: Optional[ServeCandidate] = None

    def _cfg_for(self, cand: ServeCandidate) -> Any:
        sv = self.cfg.serve.model_copy(
            update={
                "num_cpus_per_replica": float(cand.cpus_per_replica),
                "concurrent_batches": cand.concurrent_batches,
                "decode_threads": cand.decode_threads,
                "max_ongoing_requests": TUNING_MAX_ONGOING,
                "max_queued_requests": max(self.cfg.serve.max_queued_requests, 4 * TUNING_MAX_ONGOING),
                "grpc_port": None,
                "metrics_port": self.metrics_port,  # its own: never another server's 8080
                "token_file": None,
            }
        )
        return self.cfg.model_copy(update={"serve": sv})

    def _start(self, cand: ServeCandidate) -> None:
        from ray import serve

        from ..runtime.artifacts import Artifacts
        from ..serve.runner import ServeSettings, app_name, start_local_ray

        self._ray = require("ray", "vitdeploy tune --target serve")
        artifacts = Artifacts.open(self.artifacts_dir)
        cfg = self._cfg_for(cand)
        # Ray gets every usable core (num_cpus = replicas x CPUs per replica): any layout of the search fits.
        settings = ServeSettings(self.artifacts_dir, cand.backend, "127.0.0.1", self.port, usable_cores())
        cfg = cfg.model_copy(update={"serve": cfg.serve.model_copy(update={"num_cpus_per_replica": 1.0})})
        self.name = app_name(cfg, settings, artifacts.name)
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        start_local_ray(self._ray, cfg, settings, lambda line: log.info("%s", line))
        for sig, handler in handlers.items():  # ray.init installs its own (SIGTERM: sys.exit): ours stop cleanly
            signal.signal(sig, handler)
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
        serve.start(
            http_options={"host": "127.0.0.1", "port": self.port, "request_timeout_s": cfg.serve.request_timeout_s},
            logging_config={"log_level": "WARNING", "enable_access_log": False},
        )
        self._artifacts = artifacts

    def _bundle(self, backend: str) -> Any:
        from ..runtime.artifact_transfer import pack
        from ..runtime.backends import shipped_roles

        if backend not in self._bundles:
            self._bundles[backend] = self._ray.put(pack(self._artifacts, shipped_roles(backend, self._artifacts)))
        return self._bundles[backend]

    def apply(self, cand: ServeCandidate) -> str:
        """Run ``cand``; how: :data:`STARTED`, :data:`IN_PLACE` or :data:`REPLACED`."""
        require("ray.serve", "vitdeploy tune --target serve (pip install 'vitdeploy[serve]')")
        from ray import serve

        from ..serve.ray_app import build_app
        from ..serve.runner import ServeSettings, replica_spec, route_prefix

        cpus = usable_cores()
        if cand.replicas * cand.cpus_per_replica > cpus:  # Ray would wait forever for the CPUs to place them
            raise BackendError(f"{cand.describe()}: needs {cand.replicas * cand.cpus_per_replica} CPUs, {cpus} here")
        how = STARTED if self._ray is None else IN_PLACE
        if self._ray is None:
            self._start(cand)
        elif self._current is not None and self._current.restart_key != cand.restart_key:
            # Deleted first: a rolling replacement starts the new replicas before the old ones stop, and waits
            # for CPUs the old ones hold when the machine is fully used.
            serve.delete(self.name)
            how = REPLACED
        cfg = self._cfg_for(cand)
        key = cand.restart_key
        if key not in self._specs:  # one spec per replica kind: the same arguments let Ray update in place
            settings = ServeSettings(self.artifacts_dir, cand.backend, "127.0.0.1", self.port, cand.replicas)
            source = self._bundle(cand.backend)
            self._specs[key] = replica_spec(cfg, settings, self.options, source=source, name=self.name)
        version = "tune-" + "-".join(map(str, key))  # the same replicas: updated in place
        app = build_app(self._specs[key], cfg.serve, cand.replicas, cand.user_config, version)
        try:
            serve.run(
                app, name=self.name, route_prefix=route_prefix(self.name), logging_config={"log_level": "WARNING"}
            )
        except Exception as exc:  # noqa: BLE001 - Ray wraps the replica's error in its own types
            raise BackendError(f"{cand.describe()}: the Serve application did not start: {first_line(exc)}") from exc
        self._current = cand
        return how

    def close(self) -> None:
        """Stop Serve and Ray (every process they started)."""
        if self._ray is None:
            return
        try:
            from ray import serve

            serve.shutdown()
        except Exception as exc:  # noqa: BLE001 - stopping: report, still stop Ray
            log.warning("serve shutdown: %s", exc)
        finally:
            self._ray.shutdown()
            self._ray = None

    def __enter__(self) -> "ServeTarget":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["ServeTarget", "IN_PLACE", "REPLACED", "STARTED", "RELOADED"]
