"""`vitdeploy serve` as a subprocess, for the tests that talk to a real Ray Serve over sockets.

``ServeProcess(artifacts, config, port=...)`` starts ``python -m vitdeploy.cli serve -a ARTIFACTS -b ort
--port PORT -c CONFIG [more arguments]``, reads its stderr on a thread (``lines``) and returns once it
printed its "Ctrl-C to stop" line, or fails the test with the last lines it printed; ``stop()`` sends
SIGTERM and returns the exit status (killed after ``timeout_s``). Its environment is the test process's
at start (so a fixture's RAY_TMPDIR reaches it), one OpenMP thread, no usage stats (Ray's authentication as
Ray's defaults make it: token auth, the user's token, so Ray Serve's replicas need no
``--allow-unauthenticated``; a test that sets ``RAY_AUTH_MODE=disabled`` passes it itself, serve/exposure.py),
and ``env`` on top.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from vitdeploy.serve.triton.local import free_port

START_TIMEOUT_S = 180
STOP_TIMEOUT_S = 120
#: What a test server with serve.grpc_port passes: Ray's gRPC proxy listens on every interface without TLS
#: (serve/exposure.py), which `vitdeploy serve` allows only when told (and without a serve token, only with
#: --allow-unauthenticated)
GRPC_WITHOUT_TOKEN = ("--allow-unauthenticated", "--allow-insecure")


def serve_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}


class ServeProcess:
    """One running `vitdeploy serve` (backend ort) on 127.0.0.1."""

    def __init__(
        self,
        artifacts: Path,
        config: Path,
        *more: str,
        port: int | None = None,
        metrics_port: int | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = port or free_port()
        self.metrics_port = metrics_port  # the serve.metrics_port ``config`` names, for the tests that read it
        self.url = f"http://127.0.0.1:{self.port}"
        self.lines: list[str] = []
        self._ready = threading.Event()
        args = ["serve", "-a", str(artifacts), "-b", "ort", "--port", str(self.port), "-c", str(config), *more]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vitdeploy.cli", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**serve_env(), **(env or {})},
        )
        threading.Thread(target=self._pump, daemon=True).start()
        started = self._ready.wait(start_timeout_s) and self.proc.poll() is None
        if not started or not any(line.startswith("Ctrl-C") for line in self.lines):
            self.proc.kill()
            pytest.fail("vitdeploy serve did not start:\n" + "\n".join(self.lines[-30:]))

    def _pump(self) -> None:
        for line in self.proc.stderr:  # type: ignore[union-attr]
            self.lines.append(line.rstrip("\n"))
            if line.startswith("Ctrl-C"):
                self._ready.set()
        self._ready.set()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM (if still running), then its exit status; killed when it outlives ``timeout_s``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def leave_ray() -> None:
    """Disconnect this test process from the Ray it joined, and forget Ray Serve's cached controller client:
    that client survives ``ray.shutdown()`` and is taken as current on the next cluster joined when that
    cluster's first job id equals the old one (both 01000000), so a later test module's ``serve.status()``
    would call a controller of a cluster that is gone."""
    import ray
    from ray.serve import context

    context._disconnect()  # private in Ray 2.60: only drops the local handle, never stops Serve
    ray.shutdown()
