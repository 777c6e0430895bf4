"""Overload made deterministic: the process that runs the model is held (SIGSTOP) while the test sends
its requests, so what refuses a request is the server's queue bound, never the clock.

``processes(fragment)`` finds a server's worker processes by their command line (a Ray Serve replica
is titled ``ray::ServeReplica:<app>:<deployment>``; a Triton python-backend model runs in a
``triton_python_backend_stub`` process whose arguments name the model's folder). ``held(pids)``
stops them for the length of a ``with`` block and continues them after, whatever happens inside.

``answered_while_held(pids, calls, accepted_at_most)`` runs every call at once while the model is
held and waits (no timing assumption: it waits for a count, with a generous deadline that only
guards against a hang) until all but ``accepted_at_most`` have answered: those are the refusals a
bounded queue must give at once. Then it releases the model and returns every result, with the
indices that answered while it was held.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

HANG_GUARD_S = 120.0  # only a hang reaches it: the refusals of a held server need no model call


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state; the name may hold spaces


def descends_from(pid: int, root: int) -> bool:
    while pid > 1:
        if pid == root:
            return True
        pid = _parent(pid)
    return False


def processes(*fragments: str, root: int | None = None) -> list[int]:
    """Every live process whose command line contains every one of ``fragments`` and that descends from
    ``root`` (default: this test process; a server it started, and that server's Ray, descend from it): a
    server another test session (or a user) runs on the same machine is never taken for this test's."""
    root = os.getpid() if root is None else root
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if all(f in cmdline for f in fragments) and descends_from(int(entry), root):
            found.append(int(entry))
    return found


def ray_replica_pids(app: str) -> list[int]:
    """The worker processes of Ray Serve application ``app``'s replicas (at least one, or the test fails)."""
    pids = processes(f"ServeReplica:{app}:")
    assert pids, f"no Ray Serve replica process of application {app!r} found"
    return pids


#: how Ray Data titles the process of a batch-predict inference actor
INFER_ACTOR = "ray::MapWorker(MapBatches(Infer))"


def busy_actor_pid(title: str = INFER_ACTOR, cpu_s: float = 1.0, timeout_s: float = 120.0) -> int:
    """The first process titled ``title`` once it has used ``cpu_s`` of CPU (it is working, not just
    started): polled, so a job that runs it is in progress, whatever the machine's speed."""
    from vitdeploy.evaluate.reliability import process_seconds

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for pid in processes(title):
            if (process_seconds(pid) or 0.0) >= cpu_s:
                return pid
        time.sleep(0.05)
    raise AssertionError(f"no {title} process used {cpu_s} s of CPU within {timeout_s} s")


def kill_held(pid: int, hold_s: float = 1.0) -> None:
    """SIGSTOP ``pid`` (the work it took stays inside it), then SIGKILL it: a crash mid-work."""
    os.kill(pid, signal.SIGSTOP)
    time.sleep(hold_s)
    os.kill(pid, signal.SIGKILL)


def run_killing_an_actor(work: Callable[[], Any], timeout_s: float = 300.0) -> Any:
    """Run ``work`` (a batch job) on a thread; once an inference actor is busy, SIGSTOP then SIGKILL it
    (:func:`kill_held`); return what ``work`` returned (its exception is raised here)."""
    import threading

    done: dict[str, Any] = {}

    def run() -> None:
        try:
            done["result"] = work()
        except BaseException as exc:  # noqa: BLE001 - re-raised below, in the test's thread
            done["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    kill_held(busy_actor_pid())
    thread.join(timeout_s)
    assert not thread.is_alive(), f"the job did not end within {timeout_s} s of the kill"
    if "error" in done:
        raise done["error"]
    return done["result"]


def triton_stub_pids(model_folder: str) -> list[int]:
    """The python-backend stub processes that run the Triton model in ``model_folder``."""
    pids = processes("triton_python_backend_stub", model_folder)
    assert pids, f"no triton_python_backend_stub process of {model_folder} found"
    return pids


@contextlib.contextmanager
def held(pids: Sequence[int]) -> Iterator[None]:
    """SIGSTOP ``pids`` for the block, SIGCONT after (also when the block fails)."""
    stopped = []
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        yield
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def answered_while_held(
    pids: Sequence[int], calls: Sequence[Callable[[], Any]], accepted_at_most: int
) -> tuple[list[Any], set[int]]:
    """Run ``calls`` at once with ``pids`` held; wait for all but ``accepted_at_most`` to answer; release.

    Returns (every call's result in order, the indices that answered while the model was held).
    A call that raises returns its exception as its result."""

    def guarded(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            return exc

    with ThreadPoolExecutor(len(calls)) as pool:
        with held(pids):
            futures = [pool.submit(guarded, c) for c in calls]
            deadline = time.monotonic() + HANG_GUARD_S
            while sum(f.done() for f in futures) < len(calls) - accepted_at_most:
                if time.monotonic() > deadline:
                    done = [f.result() for f in futures if f.done()]
                    raise AssertionError(
                        f"only {len(done)} of {len(calls)} requests answered while the model was held "
                        f"(at most {accepted_at_most} may wait for it): {done[:3]}"
                    )
                time.sleep(0.02)
            early = {i for i, f in enumerate(futures) if f.done()}
        return [f.result() for f in futures], early
