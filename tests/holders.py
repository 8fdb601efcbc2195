"""Other processes that hold a log dir's locks, for the tests of what cleanerd does
beside them: a stand-in broker's `.lock` (`fcntl.lockf`, as Kafka takes it), a tool's
`flock` on it (as `flock(1)` takes it), another cleanerd owner's, and a state dir's
owner marker alone (args: the log dir, the state dir)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.paths import REPO

HOLD_BROKER_LOCK = """
import sys
from pathlib import Path
from tests.holders import lock_like_kafka
lock_like_kafka(Path(sys.argv[1]))
print("ready", flush=True)
sys.stdin.read()
"""
HOLD_FLOCK = """
import fcntl, os, sys
fd = os.open(os.path.join(sys.argv[1], ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("ready", flush=True)
sys.stdin.read()
"""
HOLD_OWNER_LOCK = """
import sys
from pathlib import Path
from cleanerd.log.log_dir import LogDir
with LogDir.open(Path(sys.argv[1]), state_dir=Path(sys.argv[2])):
    print("ready", flush=True)
    sys.stdin.read()
"""
HOLD_OWNER_MARKER = """
import fcntl, os, sys
from pathlib import Path
from cleanerd.log.lock import OwnerLock
fd = os.open(OwnerLock(Path(sys.argv[2]), Path(sys.argv[1])).path, os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("ready", flush=True)
sys.stdin.read()
"""


def lock_like_kafka(log_dir: Path) -> int:
    """Take `<log_dir>/.lock` as a Kafka broker does (created if missing, an exclusive
    `fcntl.lockf`); held until the returned descriptor is closed or the process ends."""
    fd = os.open(log_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.lockf(fd, fcntl.LOCK_EX)
    return fd


@contextmanager
def held_by_other_process(script: str, *args: Path) -> Iterator[None]:
    """Run `script` in another process until the block ends (it prints `ready` once it
    holds its locks, then waits for stdin to close)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-c", script, *map(str, args)]
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env) as proc:
        assert proc.stdout is not None
        assert proc.stdin is not None
        try:
            assert proc.stdout.readline() == b"ready\n"
            yield
        finally:
            proc.stdin.close()
            proc.wait(timeout=30)
