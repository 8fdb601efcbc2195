"""Helper processes that die with the process that owns the log dirs.

A helper process (a local engine's pool worker, a Spark job with its JVM) acts on log
dirs in the name of the process that holds their `.lock`: the owner. When the owner
dies, however it dies (SIGKILL included), the kernel drops its locks at once and a new
owner may start; a helper still running the old owner's pass would then swap stale
output into a log the new owner is changing. So no helper outlives its owner.

How. The owner names itself as a `ProcessId` (`cleanerd.log.ownership`: its pid and
start time, which name one process for the life of the machine, a pid alone being
reused). `die_with(owner)`, run in the
helper, opens a pidfd on the owner (`pidfd_open`, Linux 5.3), checks that the process
behind it has the owner's start time (an owner that died before the helper got there
is found dead, even if its pid was reused), and starts a daemon thread that waits for
the pidfd to become readable (the owner exited) and then SIGKILLs this process, or
with `whole_session` every process of this process's session (a Spark job runs in a
session of its own, so its JVM and Python workers go with it). Where `pidfd_open` is
missing, the thread polls the owner's start time every `POLL_S` instead.

Besides, `set_parent_death_signal` asks the kernel to SIGKILL a process when its parent
exits: a pool worker's parent is multiprocessing's fork server, which itself exits when
the last process holding its pipe (the owner and every worker) is gone, as does the
resource tracker.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import threading
import time
from pathlib import Path
from typing import Final

from cleanerd.log.ownership import ProcessId, start_ticks

POLL_S: Final = 0.2
"""The fallback's polling interval where pidfd_open is missing."""
OWNER_ENV: Final = "CLEANERD_OWNER_PROCESS"
"""How a helper started as a program (a Spark job) learns its owner: `<pid>:<ticks>`."""

_PR_SET_PDEATHSIG: Final = 1


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send `sig` to this process when its parent exits (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)


def kill_self(*, whole_session: bool = False) -> None:
    """SIGKILL this process; with `whole_session`, every other process of its session
    first."""
    if whole_session:
        sid, me = os.getsid(0), os.getpid()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != me:
                with contextlib.suppress(OSError):
                    if os.getsid(int(entry.name)) == sid:
                        os.kill(int(entry.name), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _open_pidfd(owner: ProcessId) -> int | None:
    """A pidfd on `owner`, None where the system has none; kills this process when the
    owner is already gone."""
    try:
        fd = os.pidfd_open(owner.pid)
    except ProcessLookupError:
        return -1
    except (AttributeError, OSError):
        return None
    return fd if owner.alive() else -1


def die_with(owner: ProcessId, *, whole_session: bool = False) -> None:
    """SIGKILL this process (with `whole_session`, its whole session) as soon as
    `owner` exits; at once if it already has."""
    fd = _open_pidfd(owner)
    if fd == -1:
        kill_self(whole_session=whole_session)

    def watch() -> None:
        if fd is not None:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            while not poller.poll():
                pass
        else:
            while owner.alive():
                time.sleep(POLL_S)
        kill_self(whole_session=whole_session)

    threading.Thread(target=watch, name=f"lifeline-{owner.pid}", daemon=True).start()


def owner_env() -> dict[str, str]:
    """The environment entry that names this process as the owner of a helper program."""
    me = ProcessId.current()
    return {OWNER_ENV: f"{me.pid}:{me.start_ticks if me.start_ticks is not None else ''}"}


def die_with_owner_from_env(*, whole_session: bool = False) -> None:
    """`die_with` the owner named in `$CLEANERD_OWNER_PROCESS` (`owner_env`), or else
    this process's parent as it is now."""
    pid, _, ticks = os.environ.get(OWNER_ENV, "").partition(":")
    if pid.isdigit():
        owner = ProcessId(int(pid), int(ticks) if ticks.isdigit() else None)
    else:
        owner = ProcessId(os.getppid(), start_ticks(os.getppid()))
    die_with(owner, whole_session=whole_session)
