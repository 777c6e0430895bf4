"""Export into a staging folder, then swap it in: the output folder always holds one complete
export, the previous one or the new one, even when the export is killed (``kill -9``) midway.

* The staging folder is a sibling of the output folder (same filesystem), named
  ``.<out>.vitdeploy-staging-<pid>-<random>``; every stage writes there.
* On success the two folders are exchanged in one atomic ``renameat2(RENAME_EXCHANGE)`` (Linux);
  files in the output folder that vitdeploy did not write (notes, a README, sub-folders) are
  carried over first as hard links (copies where linking fails), so nothing of the user's is lost.
  Where the exchange is not available (another OS, a filesystem without it) or the output
  folder's parent is not writable (staging then goes inside the output folder), the new files
  are moved in one by one with the manifest last: the old manifest then refuses the mix (sha256)
  for the sub-second that takes, and nothing incomplete is ever loaded.
* On failure the staging folder is removed; the report (``export-report.json``) and rejected
  artifacts (``*.rejected``) are moved into the output folder for inspection, beside the previous
  good export, which is untouched.
* :func:`clean_stale` removes what a killed export leaves behind (staging folders whose process
  is gone, ``.<name>.XXXXXXXX.tmp`` files and ``.<name>.XXXXXXXX`` folders of the atomic writers),
  only for names vitdeploy writes.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from ..base._files import folder_mode
from ..base.errors import ExportError
from ..base.vocab import TIMING_CACHE_NAME
from ..runtime.artifacts import MANIFEST_NAME

log = logging.getLogger(__name__)

STAGING_TAG = "vitdeploy-staging"
_RANDOM = r"[a-z0-9_]{8}"  # tempfile's random part
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def is_ours(name: str, names: set[str]) -> bool:
    return name in names or (name.endswith(".rejected") and name[: -len(".rejected")] in names)


# ------------------------------------------------------------------------------------------ cleaning


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(final: Path, names: set[str]) -> list[Path]:
    """Remove leftovers of killed exports into ``final``; returns what was removed."""
    removed: list[Path] = []
    temp = re.compile(rf"^\.(?P<name>.+)\.{_RANDOM}(\.tmp)?$")
    probe = re.compile(rf"^\.fp16-probe-{_RANDOM}(\.data)?$")  # a probe graph and its weights
    inside = re.compile(rf"^\.{STAGING_TAG}-(?P<pid>\d+)-{_RANDOM}$")
    beside = re.compile(rf"^\.{re.escape(final.name)}\.{STAGING_TAG}-(?P<pid>\d+)-{_RANDOM}$")

    def remove(path: Path) -> None:
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(path)
            log.info("removed stale %s", path)
        except OSError as exc:  # pragma: no cover - best effort: an export must not fail on this
            log.warning("could not remove stale %s: %s", path, exc)

    if final.is_dir():
        for entry in final.iterdir():
            m = temp.match(entry.name)
            if (m and m.group("name") in names) or probe.match(entry.name):
                remove(entry)
            elif (s := inside.match(entry.name)) and not _pid_alive(int(s.group("pid"))):
                remove(entry)
    parent = final.parent
    if parent.is_dir():
        with contextlib.suppress(OSError):
            for entry in parent.iterdir():
                m = beside.match(entry.name)
                if m and entry.is_dir() and not entry.is_symlink() and not _pid_alive(int(m.group("pid"))):
                    remove(entry)
    return removed


# ------------------------------------------------------------------------------------------ staging


def make_staging(final: Path) -> tuple[Path, bool]:
    """(staging folder, beside): beside the output folder when its parent is writable, else inside it."""
    parent = final.parent
    beside = os.access(parent, os.W_OK | os.X_OK)
    if beside and final.is_dir() and final.stat().st_dev != parent.stat().st_dev:
        beside = False  # a mount point: renames cannot cross into it, stage inside it instead
    where = parent if beside else final
    prefix = f".{final.name}.{STAGING_TAG}-{os.getpid()}-" if beside else f".{STAGING_TAG}-{os.getpid()}-"
    try:
        stage = Path(tempfile.mkdtemp(prefix=prefix, dir=where))
    except OSError as exc:
        raise ExportError(f"cannot create a staging folder in {where}: {exc.strerror or exc}") from None
    mode = (final.stat().st_mode & 0o7777) if final.is_dir() else folder_mode()
    os.chmod(stage, mode)  # mkdtemp makes 0700; the export folder keeps its (or the usual) mode
    timing = final / TIMING_CACHE_NAME
    if timing.is_file():  # the TensorRT timing cache of earlier builds speeds up this one
        _link_or_copy(timing, stage / TIMING_CACHE_NAME)
    return stage, beside


def _link_or_copy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dst, follow_symlinks=False)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EBUSY):
        log.info("atomic folder exchange unavailable here (%s); moving files in one by one", os.strerror(err))
        return False
    raise ExportError(f"cannot swap the new export into {b}: {os.strerror(err)}")


def _carry_foreign(final: Path, stage: Path, names: set[str]) -> None:
    """Hard-link (or copy) into ``stage`` every entry of ``final`` that vitdeploy did not write."""
    for entry in final.iterdir():
        if is_ours(entry.name, names) or (stage / entry.name).exists():
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, stage / entry.name, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(entry, stage / entry.name)


def _move_in(stage: Path, final: Path, names: set[str]) -> None:
    """Fallback commit: each new file replaces its old one, the manifest last; our old files that
    the new export does not have are removed after."""
    final.mkdir(parents=True, exist_ok=True)
    new = [e for e in stage.iterdir() if e.name != MANIFEST_NAME]
    for entry in new:
        target = final / entry.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(entry, target)
    if (stage / MANIFEST_NAME).exists():
        os.replace(stage / MANIFEST_NAME, final / MANIFEST_NAME)
    kept = {e.name for e in new} | {MANIFEST_NAME}
    for entry in final.iterdir():
        if is_ours(entry.name, names) and entry.name not in kept and entry.name != TIMING_CACHE_NAME:
            with contextlib.suppress(OSError):
                entry.unlink()


def commit(stage: Path, final: Path, beside: bool, names: set[str]) -> None:
    """Make ``stage`` the content of ``final`` (see the module docstring)."""
    if beside and not os.path.lexists(final):
        os.rename(stage, final)
        return
    if beside:
        _carry_foreign(final, stage, names)
        if _exchange(stage, final):
            shutil.rmtree(stage, ignore_errors=True)  # now the previous export
            return
    _move_in(stage, final, names)
    shutil.rmtree(stage, ignore_errors=True)


def publish_failure(stage: Path, final: Path, report: str) -> None:
    """After a failed export: the report and rejected artifacts go into ``final``; staging goes."""
    try:
        final.mkdir(parents=True, exist_ok=True)
        for entry in stage.iterdir():
            if entry.name == report or entry.name.endswith(".rejected"):
                os.replace(entry, final / entry.name)
    except OSError as exc:  # pragma: no cover - reporting must never mask the real error
        log.warning("could not move the failure report into %s: %s", final, exc)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


@contextlib.contextmanager
def staged(final: Path, names: set[str], report: str) -> Iterator[tuple[Path, bool]]:
    """Yield (staging folder, beside). On an exception: publish the report, drop the staging."""
    stage, beside = make_staging(final)
    try:
        yield stage, beside
    except BaseException:
        publish_failure(stage, final, report)
        raise
