"""A SIGHUP before the daemon's loop takes the signal: remembered, not fatal.

`cleanerd run` spends its first fraction of a second importing and opening. A SIGHUP
then (a reload right after a restart: a logrotate hook, `systemctl reload`, `docker kill
--signal HUP`) met the default action, which ends the process with status 129 and no
word logged. `hold` catches the signal from the command's first instant; the daemon's
own handler replaces it once its loop runs, and `take` then says whether one came in
between, which the daemon answers with a reload (the file may have changed after the
start read it).
"""

from __future__ import annotations

import signal
from types import FrameType

_seen = False


def _remember(signum: int, frame: FrameType | None) -> None:
    global _seen
    _seen = True


def hold() -> None:
    """Remember SIGHUP instead of dying of it, until the daemon's handler replaces this."""
    signal.signal(signal.SIGHUP, _remember)


def take() -> bool:
    """Whether a SIGHUP came since `hold`; forgets it."""
    global _seen
    seen, _seen = _seen, False
    return seen
