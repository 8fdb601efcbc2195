"""The earliest KIP-534 delete horizon of each segment, read from batch headers and cached.

A cleaning pass stamps a delete horizon on every batch that keeps a tombstone or a
transaction marker it may later remove: attribute bit 6 (`DELETE_HORIZON_MASK`) set
and `baseTimestamp` = the horizon (now + `delete.retention.ms`). A later pass at or
after the horizon removes them. Kafka only looks again when the log is dirty enough;
cleanerd also makes a log eligible when a horizon in it has passed
(`cleanable.eligibility(..., horizon_due=...)`), so deletes complete without new writes.

Per segment the answer is the minimum `baseTimestamp` over v2 batches with bit 6 set
(header layout: magic at byte 16, attributes int16 at byte 21, baseTimestamp int64 at
byte 27 of each batch; legacy entries, magic 0/1, carry no horizon and are stepped over
by their size field). A compiled kernel walks the headers of a memory-mapped `.log`
without decoding records and stops at the first incomplete entry (a torn tail is the
log layer's business, not this scan's).

Caching: a non-active segment's bytes never change in place, only by a swap, which
gives the file a new inode and the log layer a new `LogSegment`. The result is kept on
the segment (`LogSegment.delete_horizon`, dropped whenever the log layer sees the file
change), so each non-active segment is scanned once, and a swapped or truncated segment
is rescanned. The active segment is never scanned: it cannot be cleaned until it rolls.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from cleanerd._jit import jit
from cleanerd.log.partition_log import PartitionLog
from cleanerd.log.segment import LogSegment
from cleanerd.records.address import Int, be_i16, be_i64, be_u32, bytes_address
from cleanerd.records.header import (
    ATTRIBUTES_OFFSET,
    BASE_TIMESTAMP_OFFSET,
    DELETE_HORIZON_MASK,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    RECORD_BATCH_OVERHEAD,
    Buffer,
)
from cleanerd.records.prefetch import prefetch
from cleanerd.records.walker import NO_DELETE_HORIZON, as_uint8


@jit
def _horizon_kernel(buf: NDArray[np.uint8], mask: int) -> tuple[Int, int]:
    """(earliest horizon or NO_DELETE_HORIZON, batches with a horizon) over `buf`'s batches."""
    at = bytes_address(buf)
    end = buf.shape[0]
    p: Int = 0
    best: Int = np.int64(NO_DELETE_HORIZON)
    found = 0
    while end - p >= LOG_OVERHEAD:
        prefetch(at, p, end)
        length = be_u32(at, p + LENGTH_OFFSET)
        if length >= (1 << 31):
            break  # a negative batch length: not a batch
        size = LOG_OVERHEAD + length
        if size > end - p:
            break
        v2 = size >= RECORD_BATCH_OVERHEAD and buf[p + MAGIC_OFFSET] == 2
        if v2 and be_i16(at, p + ATTRIBUTES_OFFSET) & mask:
            found += 1
            best = min(best, be_i64(at, p + BASE_TIMESTAMP_OFFSET))
        p += size
    return best, found


@dataclass(frozen=True, slots=True)
class SegmentHorizon:
    """The delete horizons found in one segment."""

    base_offset: int
    earliest_ms: int | None
    """Earliest horizon of a batch in the segment; None when no batch has one."""
    batches: int
    """Batches carrying a horizon."""

    def due(self, now_ms: int) -> bool:
        """Whether a horizon in the segment has passed (the next pass removes its
        tombstones or markers)."""
        return self.earliest_ms is not None and self.earliest_ms <= now_ms


def scan_horizons(base_offset: int, buf: Buffer | NDArray[np.uint8]) -> SegmentHorizon:
    """The horizons of the segment whose `.log` bytes are `buf`."""
    data = as_uint8(buf)
    if data.size == 0:
        return SegmentHorizon(base_offset, None, 0)
    earliest, found = _horizon_kernel(data, DELETE_HORIZON_MASK)
    return SegmentHorizon(base_offset, None if found == 0 else int(earliest), int(found))


def horizon_due(
    horizons: Iterable[SegmentHorizon], *, now_ms: int, end_offset: int | None = None
) -> bool:
    """Whether any segment with base below `end_offset` (all when None) has a passed
    horizon. Pass `end_offset` = the first uncleanable offset: a pass rewrites only the
    segments below it."""
    return any(h.due(now_ms) for h in horizons if end_offset is None or h.base_offset < end_offset)


class HorizonCache:
    """Per-segment horizons of many partitions, scanned once per segment file: each
    `LogSegment` keeps its own (`delete_horizon`), which the log layer drops when the
    file changes and a swap replaces with a new segment object."""

    def __init__(self) -> None:
        self.scans = 0
        """Segments scanned so far (the cache's misses)."""

    def segment(self, segment: LogSegment) -> SegmentHorizon:
        """The horizons of one segment, scanned only if not yet known (read before,
        found by its metadata walk, or kept from a clean stop)."""
        if segment.delete_horizon is None:
            with segment.open_buffer() as buf:
                found = scan_horizons(segment.base_offset, buf)
            self.scans += 1
            earliest = NO_DELETE_HORIZON if found.earliest_ms is None else found.earliest_ms
            segment.delete_horizon = (earliest, found.batches)
            return found
        earliest, batches = segment.delete_horizon
        return SegmentHorizon(segment.base_offset, earliest if batches else None, batches)

    def partition(self, plog: PartitionLog) -> tuple[SegmentHorizon, ...]:
        """The horizons of every non-active segment of `plog`, as last refreshed."""
        inactive: Sequence[LogSegment] = plog.segments[:-1]
        return tuple(self.segment(s) for s in inactive)

    def horizon_due(
        self, plog: PartitionLog, *, now_ms: int, end_offset: int | None = None
    ) -> bool:
        """Whether a non-active segment of `plog` below `end_offset` has a passed horizon."""
        return horizon_due(self.partition(plog), now_ms=now_ms, end_offset=end_offset)
