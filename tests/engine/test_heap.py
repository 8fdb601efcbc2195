"""Tests of cleanerd.engine.heap: a pass's freed memory is kept for the next pass, and
given back once the process is idle."""

from __future__ import annotations

import threading

import pytest

from cleanerd.engine.heap import IdleRelease, _glibc
from tests.tools import run_python

_ROUNDS = """
import resource, sys
import numpy as np
from cleanerd.engine import heap
if sys.argv[1] == "keep":
    assert heap.keep_freed_memory()

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def round_():
    # A pass's windows: arrays of a few MiB, written, then all freed at its end.
    before = faults()
    arrays = [np.ones(3 << 20, np.uint8) for _ in range(16)]
    del arrays
    return faults() - before

rounds = [round_() for _ in range(3)]
print(rounds[-1])
if sys.argv[2] == "release":
    import psutil
    before = psutil.Process().memory_info().rss
    heap.release_freed_memory()
    print((before - psutil.Process().memory_info().rss) >> 20)
"""

glibc = pytest.mark.skipif(_glibc() is None, reason="the allocator is not glibc's")


@glibc
def test_freed_pass_memory_is_reused_by_the_next_pass() -> None:
    """16 arrays of 3 MiB, freed, then made again: by default glibc gives their pages
    back and takes them again (a fault each); kept, the third round faults a tenth as
    much."""
    default = int(run_python(_ROUNDS, "default", "keep-all").split()[0])
    kept = int(run_python(_ROUNDS, "keep", "keep-all").split()[0])
    pages = 16 * (3 << 20) // 4096
    assert default > pages // 2
    assert kept < default // 10


@glibc
def test_kept_memory_is_given_back_on_release() -> None:
    _, released_mb = run_python(_ROUNDS, "keep", "release").split()
    assert int(released_mb) >= 32


def test_release_comes_after_the_last_job_ends_and_a_new_job_cancels_it() -> None:
    released = threading.Event()
    idle = IdleRelease(delay=0.0, release=released.set)
    idle.busy()
    idle.busy()
    idle.idle()
    assert not released.wait(0.2)  # one job is still running
    idle.idle()
    assert released.wait(30)


def test_a_job_starting_before_the_delay_keeps_the_memory() -> None:
    """A job that starts cancels the pending release; a timer that fired just before the
    job took the lock (its call made here by hand) releases nothing either."""
    calls: list[None] = []
    idle = IdleRelease(delay=3600.0, release=lambda: calls.append(None))
    idle.busy()
    idle.idle()
    timer = idle._timer
    assert timer is not None
    idle.busy()
    timer.join(30)  # cancelled: it ends without calling
    assert not timer.is_alive()
    timer.function()  # the late firing
    assert calls == []
    idle.idle()
    pending = idle._timer
    assert pending is not None
    pending.cancel()


def test_without_a_thread_for_the_timer_the_memory_is_given_back_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A task limit that refuses the timer's thread fails neither the job nor the
    release: it is made at once."""
    calls: list[None] = []
    idle = IdleRelease(delay=3600.0, release=lambda: calls.append(None))

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Timer, "start", refuse)
    idle.busy()
    idle.idle()
    assert calls == [None]
