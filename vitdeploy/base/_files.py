"""Atomic writes: a file appears under its final name only when it is complete; a file's state, unread."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator


@contextlib.contextmanager
def atomic_path(final: Path | str, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path beside ``final``; rename it over ``final`` if the block succeeds.

    On any exception (or KeyboardInterrupt) the temporary file is removed and ``final`` is left
    as it was, so a failed stage never leaves a half-written artifact under a final name.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=suffix, dir=final.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    mode = artifact_mode()
    os.chmod(tmp_path, mode)  # mkstemp makes 0600; artifacts get the usual mode
    try:
        yield tmp_path
        # Again after writing: a writer that replaces the file (safetensors does) brings its own mode.
        os.chmod(tmp_path, mode)
        os.replace(tmp_path, final)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def artifact_mode() -> int:
    """The one mode of every artifact file: 0666 less the umask (0644 under the usual 022), so a
    serving user other than the exporter can read them."""
    return 0o666 & ~_umask()


def folder_mode() -> int:
    """The mode of a folder vitdeploy creates: 0777 less the umask (0755 under 022)."""
    return 0o777 & ~_umask()


def _umask() -> int:
    try:  # Linux: read it without changing it (os.umask(0) briefly affects every thread)
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes_atomic(final: Path | str, data: bytes) -> Path:
    with atomic_path(final) as tmp:
        tmp.write_bytes(data)
    return Path(final)


def write_json_atomic(final: Path | str, obj: Any) -> Path:
    return write_bytes_atomic(final, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode("utf-8"))


def file_state(path: str | os.PathLike[str]) -> tuple[int, ...] | None:
    """What changes when a file's bytes do (device, inode, size, modification and change times), without reading
    it; None when it cannot be stat'ed. A file whose state is the same as when it was hashed holds the same bytes."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
