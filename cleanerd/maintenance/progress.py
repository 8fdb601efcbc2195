"""Progress of a long maintenance cycle, as `cycle.progress` log lines.

A cycle on a big host (or the daemon's first, which opens and recovers every partition
and may compile the cleaner's kernels) can run for minutes; without a line in between, a
log shows nothing after `startup.done` and the operator cannot tell work from a hang.
Each phase of the cycle calls `tick` as it goes; a line is written only when
`interval_s` has passed since the cycle started or since the previous line, so a short
cycle writes none and a long one one every `interval_s`::

    cycle.progress phase=open done=812 total=10000 elapsed_s=5.0
    cycle.progress phase=clean done=3 total=null running=["orders-4", "users-0"] elapsed_s=10.0

`done` / `total` count partitions (`open`, `roll`, `retention`) or, for `clean`, passes
finished (its total is not known up front: a pass that fills its offset map queues the
partition again). The clock is injected (monotonic seconds), so tests need no sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cleanerd.logger import get_logger

log = get_logger("cleanerd.maintenance")


class CycleProgress:
    """Throttled `cycle.progress` lines for one cycle (see the module docstring)."""

    def __init__(self, interval_s: float, clock_s: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock_s = clock_s
        self.started_s = clock_s()
        self._next_s = self.started_s + interval_s

    def tick(self, phase: str, done: int, total: int | None, **extra: object) -> None:
        """Where `phase` stands; logged if a line is due."""
        now = self.clock_s()
        if now < self._next_s:
            return
        self._next_s = now + self.interval_s
        log.info(
            "cycle.progress",
            phase=phase,
            done=done,
            total=total,
            **extra,
            elapsed_s=round(now - self.started_s, 1),
        )
