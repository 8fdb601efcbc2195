"""Tests of `steps.next_due_ms`: when a time rule may next act on a partition (pure)."""

from __future__ import annotations

import dataclasses
from typing import Any

from cleanerd.compaction.horizon import SegmentHorizon
from cleanerd.config import load_config
from cleanerd.log.roll import SegmentAge
from cleanerd.log.topic_config import TopicConfig
from cleanerd.maintenance.steps import due_wait_ms, next_due_ms
from tests.retention.test_policy import DAY, HOUR, NOW, damaged, partition

AGE = SegmentAge(first_seen_ms=NOW, last_roll_ms=NOW - HOUR)


def _topic(**changes: Any) -> TopicConfig:
    base = load_config(None).topic_config("any")
    return dataclasses.replace(base, **changes)


def test_retention_ms_is_due_when_the_oldest_segment_passes_it() -> None:
    """Kafka deletes once now - largest timestamp > retention.ms: one millisecond after
    the oldest segment's timestamp plus retention.ms (deletion takes a prefix)."""
    meta = partition([5, 20])  # oldest first: 5 h old, then a segment 20 h old
    topic = _topic(cleanup_policy=("delete",), retention_ms=DAY, segment_ms=7 * DAY)
    assert next_due_ms(meta, topic, now_ms=NOW, age=AGE) == NOW - 5 * HOUR + DAY + 1


def test_rolls_horizons_and_min_lag_are_deadlines_of_a_compacted_partition() -> None:
    """A compacted partition is next due at the earliest of its time roll, a delete
    horizon and a segment leaving the min-lag bound; passed instants are not deadlines."""
    meta = partition([1, 2])
    topic = _topic(
        cleanup_policy=("compact",),
        segment_ms=7 * DAY,
        max_compaction_lag_ms=3 * HOUR,
        min_compaction_lag_ms=2 * HOUR,
        segment_jitter_ms=0,
    )
    due = next_due_ms(meta, topic, now_ms=NOW, age=AGE)
    assert due == NOW + HOUR  # the 1 h old segment leaves the 2 h min lag
    horizon = SegmentHorizon(0, NOW + 60_000, 1)
    assert next_due_ms(meta, topic, now_ms=NOW, age=AGE, horizons=[horizon]) == NOW + 60_000
    passed = SegmentHorizon(0, NOW - 1, 1)
    assert next_due_ms(meta, topic, now_ms=NOW, age=AGE, horizons=[passed]) == due
    # With the cleaner off only the roll is left: max.compaction.lag.ms after the active
    # segment's first batch.
    off = next_due_ms(meta, topic, now_ms=NOW, age=AGE, horizons=[horizon], cleaner_enabled=False)
    assert off == NOW + 3 * HOUR


def test_nothing_is_due_for_a_partition_without_time_rules() -> None:
    """No retention by time, an empty active segment, no horizon: no deadline."""
    meta = partition([1], active_records=0)
    topic = _topic(cleanup_policy=("delete",), retention_ms=-1)
    assert next_due_ms(meta, topic, now_ms=NOW, age=AGE) is None


def test_the_roll_floor_a_plan_names_is_the_one_in_force() -> None:
    """A max lag shorter than `rolls.min_interval_ms` caps the minimum roll interval: the
    plan names the floor that holds the roll (one minute), not the setting (15 min)."""
    from cleanerd.commands.plan import _roll_text
    from cleanerd.log.files import TopicPartition
    from cleanerd.maintenance.steps import roll_plan
    from tests.maintenance.test_plan import seg

    topic = _topic(cleanup_policy=("compact",), max_compaction_lag_ms=60_000, segment_jitter_ms=0)
    last_roll = NOW - 30_000
    plan = roll_plan(
        TopicPartition("t", 0),
        seg(100, NOW - 10 * 60_000),
        topic,
        now_ms=NOW,
        age=SegmentAge(first_seen_ms=NOW - HOUR, last_roll_ms=last_roll),
        min_roll_interval_ms=900_000,
    )
    assert plan.held_by_min_interval
    assert plan.due_at_ms == last_roll + 60_000
    assert plan.min_interval_ms == 60_000
    assert "minimum roll interval (60000 ms after the last roll" in _roll_text(plan, NOW)


def test_a_damaged_partition_is_due_only_for_the_retention_of_its_healthy_oldest_segment() -> None:
    """A damaged partition is neither rolled nor cleaned, so neither sets a due time;
    its oldest segment's retention.ms does while it is healthy, and a damaged oldest
    segment (known only by its mtime) sets none."""
    topic = _topic(
        cleanup_policy=("compact", "delete"),
        retention_ms=DAY,
        segment_ms=HOUR,
        min_compaction_lag_ms=2 * HOUR,
        segment_jitter_ms=0,
    )
    meta = partition([5, 1])
    assert next_due_ms(meta, topic, now_ms=NOW, age=AGE) == NOW + HOUR
    for index, due in ((1, NOW - 5 * HOUR + DAY + 1), (0, None)):
        assert next_due_ms(damaged(meta, index), topic, now_ms=NOW, age=AGE) == due


def test_due_wait_is_nine_times_the_last_run_up_to_the_backoff() -> None:
    """Steps started by rules falling due take at most a tenth of the time."""
    assert due_wait_ms(0, backoff_ms=15_000) == 0
    assert due_wait_ms(300, backoff_ms=15_000) == 2_700
    assert due_wait_ms(2_000, backoff_ms=15_000) == 15_000
    assert due_wait_ms(300, backoff_ms=0) == 0
