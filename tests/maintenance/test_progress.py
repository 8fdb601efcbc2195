"""Tests of cleanerd.maintenance.progress: throttled `cycle.progress` lines."""

from __future__ import annotations

from structlog.testing import capture_logs

from cleanerd.maintenance.progress import CycleProgress


def test_a_line_only_once_the_interval_has_passed() -> None:
    """No line before `interval_s` into the cycle, then at most one per interval, each
    with the phase, where it stands and the time since the cycle started."""
    now = [100.0]
    progress = CycleProgress(5.0, clock_s=lambda: now[0])
    with capture_logs() as logs:
        for t, done in [(101.0, 1), (104.9, 2), (105.0, 3), (106.0, 4), (110.5, 5)]:
            now[0] = t
            progress.tick("open", done, 10)
    assert [(e["phase"], e["done"], e["total"], e["elapsed_s"]) for e in logs] == [
        ("open", 3, 10, 5.0),
        ("open", 5, 10, 10.5),
    ]
    assert all(e["event"] == "cycle.progress" for e in logs)


def test_extra_fields_are_carried() -> None:
    """The clean phase names the partitions its running passes hold."""
    now = [0.0]
    progress = CycleProgress(1.0, clock_s=lambda: now[0])
    now[0] = 2.0
    with capture_logs() as logs:
        progress.tick("clean", 3, None, running=["orders-4"])
    assert logs[0]["running"] == ["orders-4"]
    assert logs[0]["total"] is None
