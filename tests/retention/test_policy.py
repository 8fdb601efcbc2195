from __future__ import annotations

import dataclasses

from cleanerd.log.meta import PartitionMeta, SegmentMeta
from cleanerd.retention.policy import (
    DeletionReason,
    RetentionPlan,
    deletable_segments,
    retention_due_ms,
)

NOW = 1_700_000_000_000
HOUR = 3_600_000
DAY = 24 * HOUR


def seg(base: int, next_offset: int, *, ts: int, size: int = 100) -> SegmentMeta:
    return SegmentMeta(
        base_offset=base,
        next_offset=next_offset,
        size_bytes=size if next_offset > base else 0,
        largest_timestamp_ms=ts,
        first_batch_timestamp_ms=ts if next_offset > base else None,
        offset_index_bytes=0,
        time_index_bytes=0,
        last_modified_ms=ts,
    )


def partition(
    ages_h: list[int],
    *,
    active_records: int = 1,
    log_start: int = 0,
    hw: int | None = None,
    topic: str = "events",
) -> PartitionMeta:
    """Inactive segments of 10 offsets aged `ages_h` hours, then the active segment."""
    segments = [seg(10 * i, 10 * i + 10, ts=NOW - age * HOUR) for i, age in enumerate(ages_h)]
    base = 10 * len(ages_h)
    segments.append(seg(base, base + active_records, ts=NOW))
    return PartitionMeta(
        topic=topic,
        partition=0,
        log_dir="/data",
        segments=tuple(segments),
        log_start_offset=log_start,
        log_end_offset=base + active_records,
        high_watermark=hw,
        first_unstable_offset=None,
    )


def plan(
    meta: PartitionMeta,
    *,
    retention_ms: int = -1,
    retention_bytes: int = -1,
    policy_delete: bool = True,
    high_watermark: int | None = None,
) -> RetentionPlan:
    return deletable_segments(
        meta,
        now_ms=NOW,
        retention_ms=retention_ms,
        retention_bytes=retention_bytes,
        policy_delete=policy_delete,
        high_watermark=high_watermark,
    )


def bases(p: RetentionPlan) -> list[int]:
    return [d.base_offset for d in p.deletions]


def test_time_retention_deletes_expired_prefix():
    """Segments older than retention.ms go, oldest first; the walk stops at a young one."""
    p = plan(partition([50, 40, 10, 30]), retention_ms=DAY)
    assert bases(p) == [0, 10]
    assert {d.reason for d in p.deletions} == {DeletionReason.RETENTION_MS}
    assert p.log_start_offset == 20
    assert not p.roll_needed


def test_time_retention_is_strictly_greater():
    """A segment exactly retention.ms old stays."""
    assert bases(plan(partition([24]), retention_ms=DAY)) == []
    assert bases(plan(partition([24]), retention_ms=DAY - 1)) == [0]


def test_size_retention_keeps_log_within_retention_bytes():
    """Oldest segments go while the log would still be at least retention.bytes."""
    meta = partition([5, 4, 3, 2])  # 4 x 100 bytes + a 100-byte active segment
    p = plan(meta, retention_bytes=250)
    assert bases(p) == [0, 10]
    assert {d.reason for d in p.deletions} == {DeletionReason.RETENTION_BYTES}
    assert plan(meta, retention_bytes=500).deletions == ()


def test_start_offset_breach_deletes_segments_below_log_start():
    """A segment goes when the next segment's base is at or below the log start offset."""
    p = plan(partition([1, 1, 1], log_start=20), policy_delete=False)
    assert bases(p) == [0, 10]
    assert {d.reason for d in p.deletions} == {DeletionReason.LOG_START_OFFSET}
    assert p.log_start_offset == 20
    assert bases(plan(partition([1, 1, 1], log_start=19), policy_delete=False)) == [0]


def test_compact_only_policy_ignores_time_and_size():
    """Without `delete` in the policy only the start-offset rule applies."""
    p = plan(partition([500, 400]), retention_ms=1, retention_bytes=0, policy_delete=False)
    assert p.deletions == ()


def test_passes_run_in_kafka_order():
    """Start offset, then size, then time; each pass works on what the previous left."""
    meta = partition([90, 80, 70, 2], log_start=10)
    p = plan(meta, retention_bytes=300, retention_ms=60 * HOUR)
    assert [(d.base_offset, d.reason) for d in p.deletions] == [
        (0, DeletionReason.LOG_START_OFFSET),
        (10, DeletionReason.RETENTION_BYTES),
        (20, DeletionReason.RETENTION_MS),
    ]
    assert p.log_start_offset == 30


def test_future_timestamp_blocks_later_segments():
    """A segment stamped in the future never expires and shields the ones after it."""
    meta = partition([50, -5, 50])
    p = plan(meta, retention_ms=DAY)
    assert bases(p) == [0]
    assert p.future_timestamp_base == 10
    assert plan(partition([50, 49]), retention_ms=DAY).future_timestamp_base is None


def test_high_watermark_bounds_deletion():
    """A segment is deleted only when the HW has reached the next segment's base."""
    meta = partition([50, 50, 50], hw=19)
    assert bases(plan(meta, retention_ms=DAY)) == [0]
    meta = partition([50, 50, 50], hw=5)
    assert bases(plan(meta, retention_ms=DAY)) == []
    assert bases(plan(partition([50, 50, 50], hw=19), retention_ms=DAY, high_watermark=30)) == [
        0,
        10,
        20,
    ]


def test_a_high_watermark_below_the_log_start_offset_counts_as_the_log_start_offset():
    """A replication checkpoint left behind by a DeleteRecords (high watermark 1, log
    start offset 25) holds back no segment wholly below the log start offset: Kafka's
    log never holds its high watermark below the log start offset. Before, the stale
    value kept those segments, and a pass rewrote them above the high watermark."""
    meta = partition([50, 50, 50], log_start=25, hw=1)
    assert meta.high_watermark_or_end == 25
    assert meta.last_stable_offset == 25
    p = plan(meta, policy_delete=False)
    assert [(d.base_offset, d.reason.value) for d in p.deletions] == [
        (0, "log.start.offset"),
        (10, "log.start.offset"),
    ]


def test_a_high_watermark_past_the_log_end_counts_as_the_log_end():
    meta = partition([50, 50], hw=99)
    assert (meta.high_watermark_or_end, meta.last_stable_offset) == (21, 21)


def test_active_segment_is_never_deleted_but_roll_is_requested():
    """When every segment has expired, the active one stays and the plan asks for a roll."""
    meta = partition([50, 50])
    old_active = dataclasses.replace(
        meta, segments=(*meta.inactive, seg(20, 21, ts=NOW - 50 * HOUR))
    )
    p = plan(old_active, retention_ms=DAY)
    assert bases(p) == [0, 10]
    assert p.roll_needed
    assert p.log_start_offset == 20


def test_empty_last_segment_is_kept_without_roll():
    """An empty active segment ends the walk even when old; no roll is needed."""
    meta = partition([50, 50], active_records=0)
    stale_empty = dataclasses.replace(meta, segments=(*meta.inactive, seg(20, 20, ts=NOW - DAY)))
    for p in (plan(stale_empty, retention_ms=1), plan(stale_empty, retention_bytes=0)):
        assert bases(p) == [0, 10]
        assert not p.roll_needed


def test_size_retention_never_takes_the_active_segment():
    """retention.bytes 0 empties every inactive segment and asks for a roll for the rest."""
    p = plan(partition([3, 2, 1]), retention_bytes=0)
    assert bases(p) == [0, 10, 20]
    assert p.roll_needed


def test_metadata_log_is_never_touched():
    """`__cluster_metadata` keeps every segment whatever the retention."""
    meta = partition([500, 400], topic="__cluster_metadata", log_start=20)
    p = plan(meta, retention_ms=1, retention_bytes=0)
    assert p.deletions == ()
    assert p.log_start_offset == 20


def test_an_empty_active_segment_stamped_a_moment_ahead_is_no_future_timestamp():
    """A freshly rolled empty segment's largest timestamp is its file's mtime, which may
    be a millisecond past the cycle's clock: no record is in the future, so no warning."""
    meta = partition([50, 49], active_records=0)
    empty = dataclasses.replace(meta.segments[-1], largest_timestamp_ms=NOW + 1)
    meta = dataclasses.replace(meta, segments=(*meta.segments[:-1], empty))
    p = plan(meta, retention_ms=DAY)
    assert bases(p) == [0, 10]
    assert p.future_timestamp_base is None


def damaged(meta: PartitionMeta, index: int) -> PartitionMeta:
    """`meta` with segment `index` standing as damaged (`PartitionLog.readable_meta`)."""
    s = meta.segments[index]
    stand_in = SegmentMeta.damaged(
        s.base_offset,
        f"corrupt record batch in {s.base_offset:020d}.log at position 0",
        size_bytes=s.size_bytes,
        index_bytes=(0, 0),
        last_modified_ms=s.last_modified_ms,
        inode=None,
    )
    segments = (*meta.segments[:index], stand_in, *meta.segments[index + 1 :])
    return dataclasses.replace(meta, segments=segments)


def test_every_pass_stops_before_a_damaged_segment_and_names_it():
    """The expired segments older than a damaged one go; it and all after it stay,
    whichever rule would take them, and the plan names it. Its `.log` mtime (the stand-in
    for its unknown timestamps) says whether retention.ms would have taken it."""
    meta = damaged(partition([50, 40, 30, 20]), 2)
    by_time = plan(meta, retention_ms=DAY)
    assert (bases(by_time), by_time.damaged_base, by_time.log_start_offset) == ([0, 10], 20, 20)
    by_size = plan(meta, retention_bytes=100)
    assert (bases(by_size), by_size.damaged_base) == ([0, 10], 20)
    by_start = plan(dataclasses.replace(meta, log_start_offset=35), policy_delete=False)
    assert (bases(by_start), by_start.damaged_base) == ([0, 10], 20)
    young = plan(damaged(partition([50, 40, 1, 20]), 2), retention_ms=DAY)
    assert (bases(young), young.damaged_base) == ([0, 10], None)
    assert young.future_timestamp_base is None


def test_a_damaged_segment_is_never_deleted_nor_rolled_for():
    """Every segment due: without damage retention rolls and takes them all; with the
    oldest segment damaged nothing goes, with the active one damaged the others go, and
    nothing is rolled."""
    assert plan(partition([50, 40]), retention_bytes=0).roll_needed
    oldest = plan(damaged(partition([50, 40]), 0), retention_bytes=0)
    assert (bases(oldest), oldest.roll_needed, oldest.damaged_base) == ([], False, 0)
    active = plan(damaged(partition([50, 40]), 2), retention_bytes=0)
    assert (bases(active), active.roll_needed, active.damaged_base) == ([0, 10], False, 20)


def test_a_damaged_segment_in_the_future_is_not_named_a_future_timestamp():
    """A damaged segment's largest timestamp is its mtime, not a record's: a fresh mtime
    past the clock is no future record timestamp to warn about."""
    p = plan(damaged(partition([50, -2, 20]), 1), retention_ms=DAY)
    assert (bases(p), p.future_timestamp_base, p.damaged_base) == ([0], None, None)


def test_retention_is_due_from_the_oldest_data_whatever_keeps_it() -> None:
    """Data outlives `retention.ms` at its segment's largest timestamp plus
    `retention.ms`: the oldest non-empty, readable segment's, even behind a segment with
    a future timestamp (which keeps it from the rule); nothing without time retention."""
    meta = partition([30, 50, 20])  # out of order: the 50-hour-old segment is the oldest
    assert retention_due_ms(meta, retention_ms=DAY, policy_delete=True) == NOW - 50 * HOUR + DAY
    future = dataclasses.replace(meta, segments=(seg(0, 10, ts=NOW + HOUR), *meta.segments[1:]))
    assert not plan(future, retention_ms=DAY).deletions  # the rule deletes nothing...
    assert retention_due_ms(future, retention_ms=DAY, policy_delete=True) == NOW - 26 * HOUR
    damaged = dataclasses.replace(
        meta,
        segments=(
            meta.segments[0],
            dataclasses.replace(meta.segments[1], damage="bad CRC"),
            *meta.segments[2:],
        ),
    )
    assert retention_due_ms(damaged, retention_ms=DAY, policy_delete=True) == NOW - 30 * HOUR + DAY
    assert (
        retention_due_ms(partition([], active_records=0), retention_ms=DAY, policy_delete=True)
        is None
    )
    assert retention_due_ms(meta, retention_ms=-1, policy_delete=True) is None
    assert retention_due_ms(meta, retention_ms=DAY, policy_delete=False) is None
    metadata = dataclasses.replace(meta, topic="__cluster_metadata")
    assert retention_due_ms(metadata, retention_ms=DAY, policy_delete=True) is None
