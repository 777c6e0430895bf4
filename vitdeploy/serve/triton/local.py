"""Run a model repository on the ``tritonserver`` bundled in the ``nvidia-pytriton`` wheel, no Docker.

The wheel ships ``pytriton/tritonserver/`` (the server binary, the python backend, and one python
backend stub per Python version) and its shared libraries in ``nvidia_pytriton.libs``. That
server has the python backend only (no onnxruntime or TensorRT backend), so it serves repositories
generated with ``--inference ort_python``. It needs numpy < 2 in the environment its python stub
runs in, which is why it lives in its own virtual environment (``make .venv-triton``).

    with BundledTriton(".venv-triton", "repo/", load=["vit-demo-digits"]) as server:
        print(server.http_url, server.grpc_url)

``python_env`` runs the python models in another environment than the server's own (the test of
a repository's self-containedness: an environment built only from its wheel and requirements.txt);
it needs a Python for which the wheel ships a stub.

Used by the test suite and ``benchmarks/bench_triton.py``; binds to 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Sequence

from ...base.errors import MissingDependencyError, VitDeployError


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _venv_facts(venv: Path) -> tuple[str, Path, Path]:
    """(python version "3.11", site-packages, the interpreter's lib dir holding libpython) of ``venv``."""
    python = _venv_python(venv)
    if not python.exists():
        raise MissingDependencyError(
            f"{venv} is not a virtual environment (no {python}); create it with `make .venv-triton`"
        )
    code = (
        "import sys, sysconfig; print(f'{sys.version_info[0]}.{sys.version_info[1]}'); "
        "print(sysconfig.get_paths()['purelib']); print(sysconfig.get_config_var('LIBDIR'))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    return out[0].strip(), Path(out[1].strip()), Path(out[2].strip())


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BundledTriton:
    """A ``tritonserver`` process on 127.0.0.1 serving ``repository`` (one path or several); a context manager."""

    def __init__(
        self,
        venv: str | os.PathLike[str],
        repository: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        load: Sequence[str] | None = None,
        startup_timeout_s: float = 120.0,
        log_verbose: int = 0,
        exit_timeout_s: int = 5,
        python_env: str | os.PathLike[str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.venv = Path(venv).absolute()
        self.python_env = Path(python_env).absolute() if python_env is not None else self.venv
        repos = [repository] if isinstance(repository, (str, os.PathLike)) else list(repository)
        self.repositories = [Path(r).absolute() for r in repos]
        self.load = list(load or [])
        self.startup_timeout_s = startup_timeout_s
        self.log_verbose = log_verbose
        self.exit_timeout_s = int(exit_timeout_s)  # how long SIGTERM waits for in-flight requests
        self.http_port = self.grpc_port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._workdir: Path | None = None
        self.log_path: Path | None = None
        self.version: str | None = None
        self.extra_args = list(extra_args)  # more tritonserver options (e.g. --http-restricted-api=...)

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def _prepare(self) -> tuple[list[str], dict[str, str]]:
        _, server_site, _ = _venv_facts(self.venv)
        version, _, libdir = _venv_facts(self.python_env)
        dist = server_site / "pytriton" / "tritonserver"
        stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
        if not (dist / "bin" / "tritonserver").exists():
            raise MissingDependencyError(
                f"{self.venv} has no nvidia-pytriton tritonserver ({dist}); create it with `make .venv-triton`"
            )
        if not stub.exists():
            raise MissingDependencyError(f"nvidia-pytriton has no python backend stub for Python {version} ({stub})")
        self._workdir = Path(tempfile.mkdtemp(prefix="vitdeploy-triton-"))
        backends = self._workdir / "backends"
        shutil.copytree(dist / "backends", backends)  # the stub must sit beside libtriton_python.so
        shutil.copy2(stub, backends / "python" / "triton_python_backend_stub")
        cmd = [str(dist / "bin" / "tritonserver"), f"--backend-directory={backends}", *self._flags()]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        libs = [str(server_site / "nvidia_pytriton.libs"), str(libdir)]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            libs + ([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else [])
        )
        # The python stub embeds the interpreter and finds its prefix (the venv) through PATH.
        env["PATH"] = os.pathsep.join([str(self.python_env / "bin"), env.get("PATH", "")])
        return cmd, env

    def _flags(self) -> list[str]:
        """The server's options but its binary and backend directory (ports chosen here)."""
        self.http_port, self.grpc_port = free_port(), free_port()
        cmd = [
            *[f"--model-repository={r}" for r in self.repositories],
            "--http-address=127.0.0.1",
            f"--http-port={self.http_port}",
            "--grpc-address=127.0.0.1",
            f"--grpc-port={self.grpc_port}",
            "--allow-metrics=false",
            "--exit-on-error=true",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            f"--log-verbose={self.log_verbose}",
            # Servers on one machine must not share the python backend's shared-memory names (Triton's python
            # backend README): two starting at once aborted with boost::interprocess::lock_exception.
            f"--backend-config=python,shm-region-prefix-name=vitdeploy_{os.getpid()}_{self.http_port}_",
        ]
        if self.load:
            cmd += ["--model-control-mode=explicit", *[f"--load-model={m}" for m in self.load]]
        return cmd + self.extra_args

    def start(self) -> "BundledTriton":
        cmd, env = self._prepare()
        assert self._workdir is not None
        self.log_path = self._workdir / "tritonserver.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self._workdir, start_new_session=True
            )
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                message = f"tritonserver exited with code {self.process.returncode} while starting:\n{self.log_tail()}"
                self.stop()
                raise VitDeployError(message)
            if self._ready():
                return self
            time.sleep(0.25)
        message = f"tritonserver not ready after {self.startup_timeout_s:.0f} s:\n{self.log_tail()}"
        self.stop()
        raise VitDeployError(message)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as resp:
                ok = resp.status == 200
        except OSError:
            return False
        try:  # the server's metadata (its version) may be restricted (--http-restricted-api): then unknown
            with urllib.request.urlopen(f"http://{self.http_url}/v2", timeout=2) as resp:
                self.version = json.loads(resp.read()).get("version")
        except urllib.error.HTTPError:
            pass
        except OSError:
            return False
        return ok

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        text = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(line for line in text if not line.startswith(("+", "|")))[-8000:] if text else ""

    def stop(self, timeout_s: float | None = None) -> None:
        """SIGTERM (Triton drains in-flight requests for ``exit_timeout_s`` and stops its python stubs),
        SIGKILL of its process group if it is still there ``timeout_s`` later (default: that + 20 s)."""
        timeout_s = self.exit_timeout_s + 20.0 if timeout_s is None else timeout_s
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def __enter__(self) -> "BundledTriton":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class PathTriton(BundledTriton):
    """A ``tritonserver`` of your own (``binary``, default: the one on PATH, e.g. an NGC container's) with its own
    backends. Generated repositories' python models need a Python with vitdeploy's wheel where its python backend
    runs them (the repository's requirements.txt and wheels/, as its Dockerfile installs them)."""

    def __init__(
        self,
        repository: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        load: Sequence[str] | None = None,
        binary: str | os.PathLike[str] | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(".", repository, load, **kwargs)  # type: ignore[arg-type]
        self.binary = str(binary) if binary else shutil.which("tritonserver")

    def _prepare(self) -> tuple[list[str], dict[str, str]]:
        if not self.binary:
            raise MissingDependencyError(
                "no tritonserver on PATH: install Triton, or `make .venv-triton` for the bundled one"
            )
        self._workdir = Path(tempfile.mkdtemp(prefix="vitdeploy-triton-"))
        return [self.binary, *self._flags()], dict(os.environ)


def local_triton(
    repository: str | os.PathLike[str], load: Sequence[str], venv: str | os.PathLike[str] | None = None
) -> BundledTriton:
    """The server to run ``repository`` on here: the one $VITDEPLOY_TRITON_SERVER names, else the bundled one of
    ``venv`` (default :func:`default_venv`) where it is installed, else a ``tritonserver`` on PATH."""
    named = os.environ.get("VITDEPLOY_TRITON_SERVER")
    bundled = Path(venv) if venv else default_venv()
    if not named and _venv_python(bundled).exists():
        return BundledTriton(bundled, repository, load)
    if named or shutil.which("tritonserver"):
        return PathTriton(repository, load, binary=named)
    raise MissingDependencyError(
        f"no tritonserver here: `make .venv-triton` (the one bundled in nvidia-pytriton, {bundled}), or put one "
        "on PATH (or name it in VITDEPLOY_TRITON_SERVER)"
    )


def bundled_backends(venv: str | os.PathLike[str] | None = None) -> tuple[str, ...]:
    """The backends the bundled tritonserver of ``venv`` (default :func:`default_venv`) carries (the folders of its
    backend directory: ``python`` for nvidia-pytriton's); () where it is not installed."""
    venv = Path(venv) if venv else default_venv()
    if not _venv_python(venv).exists():
        return ()
    folder = _venv_facts(venv)[1] / "pytriton" / "tritonserver" / "backends"
    return tuple(sorted(p.name for p in folder.iterdir() if p.is_dir())) if folder.is_dir() else ()


def default_venv() -> Path:
    """``.venv-triton`` beside this checkout (the Makefile's), or $VITDEPLOY_TRITON_VENV."""
    env = os.environ.get("VITDEPLOY_TRITON_VENV")
    return Path(env) if env else Path(__file__).resolve().parents[3] / ".venv-triton"


__all__ = ["BundledTriton", "PathTriton", "bundled_backends", "default_venv", "free_port", "local_triton"]
