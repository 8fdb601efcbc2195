"""Grouping the segments of a cleaning round into output segments (Kafka's
groupSegmentsBySize).

Every group becomes one cleaned segment whose base offset is its first segment's base, so
a group must fit Kafka's limits for a single segment: its `.log` bytes within
`segment.bytes`, its offset-index and time-index bytes each within `segment.index.bytes`,
and every offset in it expressible as a signed 32-bit delta from the group's base. The
last offset of a segment is estimated from what follows it (the next segment's base - 1,
or the round's first uncleanable offset - 1 for the last segment), not from its index,
which may be stale after earlier compactions. An empty segment skips the offset check, so
sparse logs do not leave an empty segment behind every 2^31 offsets forever.
"""

from __future__ import annotations

from collections.abc import Sequence

from cleanerd.log.meta import SegmentMeta
from cleanerd.records.header import INT32_MAX


def _estimated_last_offset(
    segments: Sequence[SegmentMeta], i: int, first_uncleanable_offset: int
) -> int:
    if i + 1 < len(segments):
        return segments[i + 1].base_offset - 1
    return first_uncleanable_offset - 1


def group_segments_by_size(
    segments: Sequence[SegmentMeta],
    *,
    max_size: int,
    max_index_size: int,
    first_uncleanable_offset: int,
) -> list[list[SegmentMeta]]:
    """Split `segments` (ascending) into consecutive groups within Kafka's limits."""
    groups: list[list[SegmentMeta]] = []
    i = 0
    while i < len(segments):
        first = segments[i]
        group = [first]
        log_size = first.size_bytes
        index_size = first.offset_index_bytes
        time_index_size = first.time_index_bytes
        i += 1
        while i < len(segments):
            nxt = segments[i]
            fits = (
                log_size + nxt.size_bytes <= max_size
                and index_size + nxt.offset_index_bytes <= max_index_size
                and time_index_size + nxt.time_index_bytes <= max_index_size
                and (
                    nxt.size_bytes == 0
                    or _estimated_last_offset(segments, i, first_uncleanable_offset)
                    - first.base_offset
                    <= INT32_MAX
                )
            )
            if not fits:
                break
            group.append(nxt)
            log_size += nxt.size_bytes
            index_size += nxt.offset_index_bytes
            time_index_size += nxt.time_index_bytes
            i += 1
        groups.append(group)
    return groups
