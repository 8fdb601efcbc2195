"""The worker processes' multiprocessing context (`engine/processes.py`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.paths import REPO

_KILLED_WITH_A_SEMAPHORE = """
import os, signal
from cleanerd.engine.processes import worker_context
semaphore = worker_context().Semaphore()  # as a pool's, which starts the tracker
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_daemons_semaphores_are_reclaimed_without_a_line_on_its_stderr() -> None:
    """A process killed with a pool's semaphore: the resource tracker reclaims it and
    writes nothing to the stderr it shares with the daemon (it wrote a Python warning
    there, the one line of a daemon's log that is not JSON)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_WITH_A_SEMAPHORE],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )  # run() reads until the tracker, which holds the stderr pipe too, has exited
    assert done.returncode == -signal.SIGKILL
    assert done.stderr == ""
