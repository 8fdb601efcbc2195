"""Tests of groupSegmentsBySize (ref 4.8, scenarios 31-34)."""

from __future__ import annotations

from cleanerd.compaction.grouping import group_segments_by_size
from cleanerd.log.meta import SegmentMeta
from cleanerd.records.header import INT32_MAX


def seg(base: int, size: int = 100, nxt: int | None = None, idx: int = 8) -> SegmentMeta:
    return SegmentMeta(
        base_offset=base,
        next_offset=base + 1 if nxt is None else nxt,
        size_bytes=size,
        largest_timestamp_ms=0,
        first_batch_timestamp_ms=0,
        offset_index_bytes=idx,
        time_index_bytes=idx * 3 // 2,
        last_modified_ms=0,
    )


def bases(groups: list[list[SegmentMeta]]) -> list[list[int]]:
    return [[s.base_offset for s in g] for g in groups]


def test_huge_limits_one_group_and_tiny_limits_singletons() -> None:
    """Scenario 31: huge limits give one group, size or index limit 1 singletons."""
    segs = [seg(i * 10) for i in range(10)]
    assert bases(
        group_segments_by_size(
            segs, max_size=10**9, max_index_size=10**9, first_uncleanable_offset=100
        )
    ) == [[i * 10 for i in range(10)]]
    assert (
        len(
            group_segments_by_size(
                segs, max_size=1, max_index_size=10**9, first_uncleanable_offset=100
            )
        )
        == 10
    )
    assert (
        len(
            group_segments_by_size(
                segs, max_size=10**9, max_index_size=1, first_uncleanable_offset=100
            )
        )
        == 10
    )


def test_size_limit_groups_of_three_in_order() -> None:
    """Scenario 31: limit = size of three + 1 gives groups of three, ascending."""
    segs = [seg(i * 10) for i in range(10)]
    groups = group_segments_by_size(
        segs, max_size=301, max_index_size=10**9, first_uncleanable_offset=100
    )
    assert [len(g) for g in groups] == [3, 3, 3, 1]
    flat = [s.base_offset for g in groups for s in g]
    assert flat == sorted(flat)
    groups = group_segments_by_size(
        segs, max_size=10**9, max_index_size=3 * 12 + 1, first_uncleanable_offset=100
    )
    assert [len(g) for g in groups] == [3, 3, 3, 1]


def test_offset_span_forbids_merging_but_empty_segments_merge() -> None:
    """Scenario 32: segments spanning 2^31 offsets each stay apart; empty ones merge."""
    span = INT32_MAX + 1
    segs = [seg(i * span, nxt=(i + 1) * span) for i in range(3)]
    assert (
        len(
            group_segments_by_size(
                segs, max_size=10**9, max_index_size=10**9, first_uncleanable_offset=3 * span
            )
        )
        == 3
    )
    segs = [seg(0, size=0, nxt=0), seg(span, size=0, nxt=span), seg(2 * span, nxt=3 * span)]
    groups = group_segments_by_size(
        segs, max_size=10**9, max_index_size=10**9, first_uncleanable_offset=3 * span
    )
    assert bases(groups) == [[0, span], [2 * span]]


def test_estimate_uses_next_base_not_index() -> None:
    """Scenario 34: the last offset estimate uses the next base / uncleanable offset."""
    half = INT32_MAX // 2
    segs = [seg(0, nxt=2), seg(half, nxt=INT32_MAX + 2)]
    groups = group_segments_by_size(
        segs, max_size=10**9, max_index_size=10**9, first_uncleanable_offset=INT32_MAX + 2
    )
    assert len(groups) == 2
    groups = group_segments_by_size(
        segs, max_size=10**9, max_index_size=10**9, first_uncleanable_offset=INT32_MAX + 1
    )
    assert len(groups) == 1
