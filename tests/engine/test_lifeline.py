"""Helpers die with their owner (`cleanerd.engine.lifeline`), SIGKILL included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from cleanerd.engine.lifeline import OWNER_ENV, owner_env
from cleanerd.log.ownership import ProcessId, start_ticks
from tests.tools import session_processes, wait_for_session_end

WAIT_S = 10.0
"""A generous bound on the kernel and the helper's thread reacting (not a timing test)."""

_HELPER = """
import subprocess, sys, time
from cleanerd.engine.lifeline import die_with_owner_from_env
if "--child" in sys.argv:
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
die_with_owner_from_env(whole_session="--session" in sys.argv)
print("watching", flush=True)
time.sleep(60)
"""


@contextmanager
def process(args: list[str], **kw: object) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, **kw)  # type: ignore[call-overload]
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def helper(owner: dict[str, str], *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _HELPER, *flags],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **owner},
        start_new_session=True,
    )


def test_process_id_tells_a_reused_pid_apart() -> None:
    """A process is its pid and start time: the same pid with another start time (a
    later process that reuses it) is not alive."""
    me = ProcessId.current()
    assert me.alive()
    assert me.start_ticks is not None
    assert not ProcessId(me.pid, me.start_ticks + 1).alive()
    assert owner_env() == {OWNER_ENV: f"{me.pid}:{me.start_ticks}"}


def test_helper_is_killed_when_its_owner_is_killed() -> None:
    """SIGKILL of the owner ends the helper at once (its pidfd fires)."""
    with process([sys.executable, "-c", "import time; print(1, flush=True); time.sleep(60)"]) as o:
        assert o.stdout is not None
        o.stdout.readline()
        owner = ProcessId(o.pid, start_ticks(o.pid))
        env = {OWNER_ENV: f"{owner.pid}:{owner.start_ticks}"}
        with helper(env) as h:
            assert h.stdout is not None
            assert h.stdout.readline().strip() == "watching"
            os.kill(o.pid, signal.SIGKILL)
            assert h.wait(WAIT_S) == -signal.SIGKILL
            h.stdout.close()


def test_helper_of_an_owner_already_gone_dies_at_once() -> None:
    """An owner that died before the helper started (its pid possibly reused: here the
    pid is ours but the start time is not) is found dead: the helper never runs."""
    me = ProcessId.current()
    assert me.start_ticks is not None
    with helper({OWNER_ENV: f"{me.pid}:{me.start_ticks - 1}"}) as h:
        assert h.stdout is not None
        assert h.wait(WAIT_S) == -signal.SIGKILL
        assert h.stdout.read() == ""
        h.stdout.close()


def test_whole_session_goes_with_the_owner() -> None:
    """A helper that runs a session of its own (a Spark job and its JVM) takes every
    process of that session along."""
    with process([sys.executable, "-c", "import time; print(1, flush=True); time.sleep(60)"]) as o:
        assert o.stdout is not None
        o.stdout.readline()
        env = {OWNER_ENV: f"{o.pid}:{start_ticks(o.pid)}"}
        with helper(env, "--session", "--child") as h:
            assert h.stdout is not None
            assert h.stdout.readline().strip() == "watching"
            assert len(session_processes(h.pid)) == 2  # the helper and its child
            os.kill(o.pid, signal.SIGKILL)
            assert h.wait(WAIT_S) == -signal.SIGKILL
            wait_for_session_end(h.pid, WAIT_S)
            h.stdout.close()
