"""Log dirs a test holds as their owner: a pass proves that the process that planned it
still holds the log dir's `.lock` (`cleanerd.log.ownership`), so the test process takes
it, as the daemon or `cleanerd clean` would. `tests/engine/conftest.py` lets go after
each test."""

from __future__ import annotations

from pathlib import Path

from cleanerd.log.lock import LogDirLock

_held: list[LogDirLock] = []


def own(log_dir: Path) -> LogDirLock:
    """Take `log_dir`'s `.lock` for this test (once; the same lock again after that)."""
    for lock in _held:
        if lock.log_dir == log_dir:
            return lock
    log_dir.mkdir(parents=True, exist_ok=True)
    lock = LogDirLock(log_dir)
    lock.acquire()
    _held.append(lock)
    return lock


def release_all() -> None:
    """Let go of every log dir `own` took."""
    while _held:
        _held.pop().release()
