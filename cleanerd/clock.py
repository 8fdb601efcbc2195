"""The wall clock every layer defaults to when no time is given: decisions take the time
as a parameter (tests and `--now-ms` pass their own), and only the edges read this."""

from __future__ import annotations

import time


def wall_clock_ms() -> int:
    """Milliseconds since the epoch (the default clock)."""
    return time.time_ns() // 1_000_000
