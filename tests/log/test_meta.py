from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from cleanerd.log.files import TopicPartition
from cleanerd.log.meta import PartitionMeta, SegmentMeta


def seg(base: int, next_offset: int, size: int = 100, ts: int = 1_000) -> SegmentMeta:
    return SegmentMeta(
        base_offset=base,
        next_offset=next_offset,
        size_bytes=size,
        largest_timestamp_ms=ts,
        first_batch_timestamp_ms=ts if next_offset > base else None,
        offset_index_bytes=8,
        time_index_bytes=12,
        last_modified_ms=ts,
    )


def part(*segments: SegmentMeta, **changes: Any) -> PartitionMeta:
    meta = PartitionMeta(
        topic="orders.v1-eu",
        partition=3,
        log_dir="/data/kafka",
        segments=segments,
        log_start_offset=segments[0].base_offset,
        log_end_offset=segments[-1].next_offset,
        high_watermark=None,
        first_unstable_offset=None,
    )
    return dataclasses.replace(meta, **changes)


def test_topic_partition_prints_as_partition_dir_name():
    """The identity prints as Kafka's `<topic>-<partition>` and orders numerically."""
    meta = part(seg(0, 5))
    assert str(meta.topic_partition) == "orders.v1-eu-3"
    assert TopicPartition("t", 2) < TopicPartition("t", 10)


def test_active_and_inactive_segments():
    """The last segment is active; the rest are inactive, oldest first."""
    a, b, c = seg(0, 5), seg(5, 9), seg(9, 9, size=0)
    meta = part(a, b, c)
    assert meta.active is c
    assert meta.inactive == (a, b)


def test_size_sums_log_bytes_only():
    """Partition size is the sum of `.log` sizes, as retention.bytes compares it."""
    meta = part(seg(0, 5, size=100), seg(5, 9, size=40))
    assert meta.size_bytes == 140
    assert meta.segments[0].total_bytes == 120


def test_last_stable_offset_is_min_of_hw_and_first_unstable():
    """LSO = min(HW, first unstable offset), with HW defaulting to the log end."""
    segments = (seg(0, 5), seg(5, 10))
    assert part(*segments).last_stable_offset == 10
    assert part(*segments, high_watermark=7).last_stable_offset == 7
    assert part(*segments, high_watermark=7, first_unstable_offset=3).last_stable_offset == 3
    assert part(*segments, first_unstable_offset=8).last_stable_offset == 8


def test_upper_bound_uses_next_base_then_log_end():
    """A segment's bound is its successor's base (gaps included), the last one's the LEO."""
    meta = part(seg(0, 4), seg(6, 9), log_end_offset=9)
    assert meta.upper_bound(0) == 6
    assert meta.upper_bound(1) == 9


def test_segment_index_for_floors_by_base():
    """An offset maps to the segment with the greatest base at or below it."""
    meta = part(seg(10, 15), seg(15, 20), seg(20, 20, size=0))
    assert meta.segment_index_for(10) == 0
    assert meta.segment_index_for(17) == 1
    assert meta.segment_index_for(99) == 2
    assert meta.segment_index_for(3) == 0


def test_rejects_unordered_or_missing_segments():
    """A snapshot needs at least one segment, in strictly ascending base order."""
    with pytest.raises(ValueError, match=r"orders\.v1-eu-3"):
        part(seg(5, 9), seg(0, 5))
    with pytest.raises(ValueError, match="at least one segment"):
        PartitionMeta("t", 0, "/d", (), 0, 0, None, None)


def test_rejects_segment_ending_before_its_base():
    """next_offset below base_offset is a broken snapshot."""
    with pytest.raises(ValueError, match="segment 5"):
        seg(5, 4)


def test_metadata_log_is_never_touched():
    """`__cluster_metadata` is recognised by name or by flag."""
    assert part(seg(0, 1), topic="__cluster_metadata", partition=0).never_touched
    assert part(seg(0, 1), is_metadata=True).never_touched
    assert not part(seg(0, 1)).never_touched
