"""The generated Triton repository on a ``tritonserver`` here (serve/triton/local.py ``local_triton``: the one
bundled in the nvidia-pytriton wheel, ``.venv-triton`` or $VITDEPLOY_TRITON_VENV, else one on PATH or named by
$VITDEPLOY_TRITON_SERVER), whose settings the search changes without restarting the server.

The repository is written once (`vitdeploy triton-repo`'s builder); each candidate rewrites the models'
config.pbtxt (instances, ONNX Runtime threads, preprocessing instances, the batcher's wait: repo.model_configs)
and asks the running server to load them again (Triton's model repository API, explicit model control), so
Triton replaces the instances in place. Inference runs on vitdeploy's ONNX Runtime in the python backend
(``ort_python``): the bundled server has no other backend, and every server has that one. The server stops in
``close``, whatever happened.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

from ..base.errors import BackendError, first_line
from ..client.connection import open_http, transport_errors
from ..serve.triton.local import BundledTriton, local_triton
from .serve_target import RELOADED, STARTED
from .space import TritonCandidate


def _load(address: str, model: str) -> None:
    """Triton's model repository API: load ``model`` again (``POST /v2/repository/models/<m>/load``)."""
    with open_http(f"http://{address}", timeout_s=300) as http:
        try:
            response = http.post(
                f"/v2/repository/models/{model}/load", content=b"{}", headers={"Content-Type": "application/json"}
            )
        except transport_errors() as exc:
            raise OSError(first_line(exc)) from None
    if response.status_code >= 400:
        raise OSError(f"HTTP {response.status_code}: {response.content[:300].decode('utf-8', 'replace')}")


class TritonTarget:
    def __init__(self, cfg: Any, artifacts: Path, venv: Optional[Path] = None) -> None:
        self.cfg, self.artifacts = cfg, Path(artifacts)
        self.venv = venv
        self._root = Path(tempfile.mkdtemp(prefix="vitdeploy-tune-triton-"))
        self._server: Optional[BundledTriton] = None
        self.url, self.name = "", ""

    def _settings(self, cand: TritonCandidate) -> Any:
        from ..serve.triton.repo import settings_from_config

        overrides = {"inference": "ort_python", "kind": "cpu", **cand.triton_keys()}
        return settings_from_config(self.cfg, overrides)

    def apply(self, cand: TritonCandidate) -> str:
        from ..serve.triton.repo import build_triton_repo, model_configs

        settings = self._settings(cand)
        if self._server is None:
            repo = build_triton_repo(self.artifacts, self._root / "repo", settings)
            self.name = repo.name
            self._server = local_triton(repo.path, [repo.name], self.venv).start()
            self.url = f"http://{self._server.http_url}"
            return STARTED
        try:
            for model, text in model_configs(self.artifacts, settings).items():
                path = self._root / "repo" / model / "config.pbtxt"
                if path.is_file() and path.read_text() != text:
                    path.write_text(text)
            _load(self._server.http_url, self.name)  # the ensemble and the models it calls, with their new configs
        except OSError as exc:
            raise BackendError(
                f"{cand.describe()}: tritonserver did not reload the models: {first_line(exc)}"
            ) from exc
        return RELOADED

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        shutil.rmtree(self._root, ignore_errors=True)

    def __enter__(self) -> "TritonTarget":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["TritonTarget"]
