"""Run a test in a Python of its own: for tests that send a real SIGINT to their own main thread.

CPython raises a pending signal at the main thread's next check only while no other thread takes the interpreter in
between: in a pytest-xdist worker that has run other tests (HTTP servers' threads, thread pools, tqdm's monitor) the
KeyboardInterrupt can land a few bytecodes later, outside the test's ``pytest.raises``, and pytest then ends the
worker's whole session ("node down: Not properly terminated", and xdist waits for its file forever). In a fresh
``python -m pytest`` running that one test, the main thread is the only one, as the test's premise needs.

    @in_fresh_python
    def test_real_sigint_...(plan): ...

runs the test's own body in the child (same fixtures, same assertions) and passes when the child's run of it passed.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

CHILD = "VITDEPLOY_TEST_IN_FRESH_PYTHON"
ROOT = Path(__file__).resolve().parents[2]


def in_fresh_python(test: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> Any:
        if os.environ.get(CHILD) == "1":
            return test(*args, **kwargs)
        nodeid = os.environ["PYTEST_CURRENT_TEST"].rsplit(" ", 1)[0]
        env = {**os.environ, CHILD: "1"}
        env.pop("PYTEST_XDIST_WORKER", None)
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", nodeid]
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]

    return run
