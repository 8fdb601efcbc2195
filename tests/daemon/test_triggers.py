"""Tests of cleanerd.daemon.triggers: when a cycle starts and why."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from cleanerd.compaction.stats import CleanerStats
from cleanerd.config import load_config
from cleanerd.daemon.triggers import (
    CycleClock,
    CycleTrigger,
    Deadlines,
    cycle_due,
    deadlines,
    retry_wait_ms,
)
from cleanerd.log.files import TopicPartition
from cleanerd.maintenance.report import CleanedLog, CycleReport, PartitionState, made_progress
from tests.builders import cycle_report
from tests.daemon.test_service import USERS, _settings, _state, _write


def _clock(**changes: Any) -> CycleClock:
    base: dict[str, Any] = {
        "now_ms": 10_000,
        "last_end_ms": 9_000,
        "last_cleaned": False,
        "changed": False,
        "next_deadline_ms": None,
        "next_due_ms": None,
        "overdue": False,
        "disk_pressure": False,
        "requested": False,
    }
    base.update(changes)
    return CycleClock(**base)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"last_end_ms": None}, CycleTrigger.STARTUP),
        ({"requested": True}, CycleTrigger.REQUESTED),
        ({"last_cleaned": True}, CycleTrigger.MORE_WORK),
        ({"changed": True}, None),  # within the backoff
        ({"changed": True, "now_ms": 9_500}, None),
        ({"changed": True, "now_ms": 11_000}, CycleTrigger.CHANGED),
        ({"next_deadline_ms": 10_000}, CycleTrigger.DEADLINE),
        ({"next_deadline_ms": 10_001}, None),
        ({"next_due_ms": 10_000}, CycleTrigger.DUE),
        ({"next_due_ms": 10_001}, None),
        ({"overdue": True}, None),  # within the backoff
        ({"overdue": True, "now_ms": 11_000}, CycleTrigger.OVERDUE),
        ({"disk_pressure": True, "now_ms": 11_000}, CycleTrigger.DISK_PRESSURE),
        ({"now_ms": 9_000 + 60_000}, CycleTrigger.REVISIT),
        ({}, None),
    ],
)
def test_cycle_due(changes: dict[str, Any], expected: CycleTrigger | None) -> None:
    """A cycle starts for a request, more work, a max-lag or time-rule deadline, and,
    after the backoff, a
    change, disk pressure or an overdue partition waiting for its roll; otherwise at the
    revisit interval."""
    assert cycle_due(_clock(**changes), backoff_ms=2_000, revisit_ms=60_000) == expected


@pytest.mark.parametrize("kind", ["next_due_ms", "next_deadline_ms"])
def test_rules_falling_due_one_after_another_wait_nine_times_the_last_cycle(
    kind: str,
) -> None:
    """Thousands of partitions each expire and roll at their own instant, and every one
    started a full cycle at once: a core kept busy (2,000 partitions, a segment expiring
    every 15 ms: 98% of a core). A due rule now waits nine times the previous cycle's
    length after it, at most the backoff; a quick cycle's does not wait."""
    due = {kind: 9_000}
    expected = CycleTrigger.DUE if kind == "next_due_ms" else CycleTrigger.DEADLINE
    assert cycle_due(_clock(**due, last_length_ms=5), backoff_ms=2_000, revisit_ms=60_000) == (
        expected
    )
    slow = {**due, "last_length_ms": 100}  # waits 900 ms after the end at 9,000
    assert cycle_due(_clock(**slow, now_ms=9_899), backoff_ms=2_000, revisit_ms=60_000) is None
    assert cycle_due(_clock(**slow, now_ms=9_900), backoff_ms=2_000, revisit_ms=60_000) == (
        expected
    )
    longest = {**due, "last_length_ms": 60_000, "now_ms": 10_999}  # the backoff bounds it
    assert cycle_due(_clock(**longest), backoff_ms=2_000, revisit_ms=60_000) is None
    longest["now_ms"] = 11_000
    assert cycle_due(_clock(**longest), backoff_ms=2_000, revisit_ms=60_000) == expected


_DUE_AT_ONCE: dict[str, Any] = {
    "last_cleaned": True,
    "next_deadline_ms": 9_000,
    "next_due_ms": 9_000,
    "overdue": True,
    "changed": True,
    "disk_pressure": True,
}


@pytest.mark.parametrize(
    ("failures", "waited_ms", "expected"),
    [
        (1, 1_999, None),
        (1, 2_000, CycleTrigger.RETRY),
        (2, 3_999, None),
        (2, 4_000, CycleTrigger.RETRY),
        (5, 31_999, None),
        (5, 32_000, CycleTrigger.RETRY),
        (6, 59_999, None),  # 64 s, but never longer than the revisit
        (6, 60_000, CycleTrigger.RETRY),
        (10_000, 60_000, CycleTrigger.RETRY),
    ],
)
def test_a_cycle_that_failed_whole_waits_longer_after_each_failure(
    failures: int, waited_ms: int, expected: CycleTrigger | None
) -> None:
    """After a cycle that failed whole (an ambiguous topic, a bug), whatever would start
    the next one at once (its due time rule, its deadline, a progress, a change, the disk)
    waits the backoff, doubled for each failure in a row, up to the revisit interval: the
    daemon ran some thousand failing cycles a second, a traceback each."""
    clock = _clock(**_DUE_AT_ONCE, failures_in_a_row=failures, now_ms=9_000 + waited_ms)
    assert cycle_due(clock, backoff_ms=2_000, revisit_ms=60_000) == expected


@pytest.mark.parametrize(("failures", "wait_ms"), [(1, 1_000), (2, 2_000), (7, 60_000)])
def test_a_retry_waits_at_least_a_second_with_no_backoff(failures: int, wait_ms: int) -> None:
    """`log.cleaner.backoff.ms: 0` (allowed) still spaces the retries of a failing cycle:
    doubling 0 kept it at 0, a thousand failing cycles a second."""
    assert retry_wait_ms(failures, backoff_ms=0, revisit_ms=60_000) == wait_ms


def test_a_request_does_not_wait_for_the_retry() -> None:
    """A command or a reload (the operator's fix) starts a cycle at once, failures or
    not."""
    clock = _clock(failures_in_a_row=3, requested=True)
    assert cycle_due(clock, backoff_ms=2_000, revisit_ms=60_000) == CycleTrigger.REQUESTED


def _cleaned(first_dirty: int, end_offset: int, read: int, written: int) -> CleanedLog:
    stats = CleanerStats(0, 0, 0, 0, read, written, 0, 0.0, 0, 0, 0)
    return CleanedLog("/d", USERS, "r", None, 0, first_dirty, end_offset, stats, 0, 0)


def test_made_progress() -> None:
    """A pass made progress when it moved the checkpoint or removed records; a pass that
    rewrote the same records over an empty dirty range did not."""
    assert made_progress(_cleaned(0, 10, read=10, written=10))
    assert made_progress(_cleaned(10, 10, read=10, written=9))
    assert not made_progress(_cleaned(10, 10, read=10, written=10))


def test_deadlines_summarise_upcoming_and_overdue_partitions(tmp_path: Path) -> None:
    """The next deadline is the earliest still to come; a partition past its deadline
    makes the daemon retry, unless it is marked uncleanable."""
    data = _settings(tmp_path)
    data["topics"]["users"]["max.compaction.lag.ms"] = 1_000
    config = load_config(_write(tmp_path / "c.yaml", data))
    state = _state(tmp_path, config, first_ts=100_000, now_ms=100_500)
    none: frozenset[TopicPartition] = frozenset()
    assert deadlines(_report(state, 100_500), uncleanable=none) == Deadlines(101_000, False)
    assert deadlines(_report(state, 101_000), uncleanable=none) == Deadlines(None, True)
    marked = frozenset({USERS})
    assert deadlines(_report(state, 101_000), uncleanable=marked) == Deadlines(None, False)
    due = deadlines(_report(state, 100_500, next_due_ms=100_700), uncleanable=none)
    assert due == Deadlines(101_000, False, 100_700)


def test_an_observed_dir_has_no_deadline_to_meet(tmp_path: Path) -> None:
    """A partition past its deadline in a log dir only observed (a live broker's, whose
    cleaner lags) starts no cycle, nor does its deadline to come: nothing can be done
    there, and a daemon observing a lagging broker ran a full cycle every backoff (5%
    of a core beside an idle broker). The delay gauges age at each scrape."""
    data = _settings(tmp_path)
    data["topics"]["users"]["max.compaction.lag.ms"] = 1_000
    config = load_config(_write(tmp_path / "c.yaml", data))
    state = _state(tmp_path, config, first_ts=100_000, now_ms=100_500)
    none: frozenset[TopicPartition] = frozenset()
    for now_ms in (100_500, 101_000):
        report = dataclasses.replace(_report(state, now_ms), observed=(state.meta.log_dir,))
        assert deadlines(report, uncleanable=none) == Deadlines(None, False)
    other = dataclasses.replace(_report(state, 101_000), observed=(str(tmp_path / "other"),))
    assert deadlines(other, uncleanable=none).overdue


def _report(state: PartitionState, now_ms: int, next_due_ms: int | None = None) -> CycleReport:
    return cycle_report(now_ms, states=(state,), next_due_ms=next_due_ms)
