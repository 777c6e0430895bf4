"""Where the runtime keeps what it learns about an export on this machine, when the export's folder cannot hold
it: a folder per export under the user's cache (``$XDG_CACHE_HOME`` or ~/.cache ``/vitdeploy/<kind>/<hash of the
export's path>``). The TensorRT EP's engines (``ort-trt``) and auto's measurements (``auto``) use it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def user_cache_dir(artifacts_dir: str | os.PathLike[str], kind: str) -> Path:
    """The user-cache folder of ``kind`` for the export in ``artifacts_dir`` (not created here)."""
    artifacts_dir = Path(artifacts_dir).resolve()
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    tag = hashlib.sha256(str(artifacts_dir).encode("utf-8")).hexdigest()[:16]
    return root / "vitdeploy" / kind / tag


def writable_dir(path: str | os.PathLike[str]) -> bool:
    """Whether files can be created in the folder ``path`` (which exists)."""
    return os.access(path, os.W_OK | os.X_OK)


__all__ = ["user_cache_dir", "writable_dir"]
