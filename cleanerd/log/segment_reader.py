"""How a clean pass reads the segments of its snapshot, in either engine.

A pass is planned on a snapshot of the partition (`meta.SegmentMeta`: each `.log`'s
inode and size) and reads only those segments: the local pass (`compaction.cleaner`) and
the Spark clean job (`engine.spark.clean_job`, in its executors and in its copy phase)
read them through this module, and the audit job reads its segments here too.

The consistency argument. A segment file is never modified in place: once inactive it is
only replaced by a rename (a `.cleaned` output swapped in, a recovered segment) or
deleted, and the active segment is only appended to. So a `.log` that still has the
snapshot's inode and size (the active one: at least that size) holds exactly the bytes
the pass was planned on, and a read-only mapping of it keeps showing those bytes for as
long as the pass holds it, even after a rename has replaced the name: the mapping holds
the inode, not the name. `map_segment` therefore checks the file once, when it maps it,
and raises `SegmentsChanged` (the pass is stale, nothing is changed) otherwise; the swap
proves the same again under the partition lock before its first rename
(`compaction.swap.SwapProof`). `map_file` maps without a snapshot to check against: an
audit reads whatever a live dir holds at the moment.

The rest is what both engines derive from a snapshot the same way: a segment's offset
bound (`segment_upper`), the offsets its batches may have (`segment_offsets`, which the
decode checks: no CRC covers a base offset), the aborted transactions of its segments
(`load_aborted`, `aborted_between`: Kafka's collectAbortedTransactions), and one buffer
holding every record of a decoded segment (`join_buffers`), which the numba kernels
that hash keys and read headers need.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from numpy.typing import NDArray

from cleanerd.log.files import txn_index_file
from cleanerd.log.meta import SegmentMeta
from cleanerd.log.ownership import SegmentsChanged, check_same_file
from cleanerd.log.txnindex import AbortedTxn, TransactionIndex
from cleanerd.records.columns import SIDE, SegmentColumns
from cleanerd.records.header import COMPRESSION_MASK, Buffer
from cleanerd.records.walker import OffsetRange


def _map(f: BinaryIO, size: int) -> Buffer:
    # The mapping outlives the file object: it holds its own reference to the file.
    return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else b""


def map_file(path: Path) -> Buffer:
    """The whole `.log` at `path`, memory-mapped read-only (b"" when empty); the mapping
    lives as long as an array made from it."""
    with open(path, "rb") as f:
        return _map(f, os.fstat(f.fileno()).st_size)


def map_segment(path: Path, seg: SegmentMeta, *, active: bool) -> Buffer:
    """The `.log` of `seg` at `path`, memory-mapped read-only (no copy: the pages come
    from the page cache; b"" when empty). Raises SegmentsChanged unless the file is the
    one of the snapshot `seg` (its inode, its size; the `active` segment may have grown,
    and its new bytes are mapped too)."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below; the mapping outlives it
    except FileNotFoundError:
        raise SegmentsChanged(f"{path} was removed since the pass was planned") from None
    with f:
        st = os.fstat(f.fileno())
        check_same_file(path, st, seg, active=active)
        return _map(f, st.st_size)


def segment_upper(segments: Sequence[SegmentMeta], i: int, first_uncleanable: int) -> int:
    """The offset bound of segment `i` of a pass's snapshot: the next segment's base, or
    for the last one, its next offset or the pass's first uncleanable offset if higher."""
    if i + 1 < len(segments):
        return segments[i + 1].base_offset
    return max(first_uncleanable, segments[i].next_offset)


def segment_offsets(segments: Sequence[SegmentMeta], i: int) -> OffsetRange:
    """What segment `i` of a snapshot may hold: its base offset up to the next segment's
    (the active one: no bound above)."""
    upper = segments[i + 1].base_offset if i + 1 < len(segments) else None
    return OffsetRange.of_segment(segments[i].base_offset, upper)


def load_aborted(dir_path: Path, segments: Sequence[SegmentMeta]) -> list[AbortedTxn]:
    """Every aborted transaction in the `.txnindex` files of `segments`, in order."""
    entries: list[AbortedTxn] = []
    for seg in segments:
        path = txn_index_file(dir_path, seg.base_offset)
        if path.exists():
            entries += TransactionIndex.load(path, seg.base_offset).entries
    return sorted(set(entries))


def aborted_between(entries: Sequence[AbortedTxn], start: int, end: int) -> list[AbortedTxn]:
    """The aborted transactions of `entries` overlapping [start, end) (Kafka's
    collectAbortedTransactions)."""
    return [t for t in entries if t.last_offset >= start and t.first_offset < end]


I64 = NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class JoinedBuffer:
    """Every record of a decoded segment (or byte range of one) in one buffer `buf`, with
    the record, key and headers positions of the record table made relative to it
    (headers -1 where a record has none). A position in the segment moved by
    `segment_shift`, one in the side buffer by `side_shift` (both 0 unless the range
    mixes compressed and uncompressed batches: then `buf` is a copy)."""

    buf: NDArray[np.uint8]
    record_pos: I64
    key_pos: I64
    headers_pos: I64
    side_shift: int = 0
    segment_shift: int = 0

    def shift(self, buffer_id: int) -> int:
        """How far positions in the buffer `buffer_id` (the record table's) moved."""
        return self.side_shift if buffer_id == SIDE else self.segment_shift

    @property
    def copied(self) -> bool:
        """Whether `buf` is a copy (memory of its own) rather than one of the buffers."""
        return self.side_shift != 0 or self.segment_shift != 0


def join_buffers(sc: SegmentColumns) -> JoinedBuffer:
    """`sc`'s records in one buffer: the segment bytes (no batch compressed), the side
    buffer of decompressed records areas (every record decompressed), or the bytes of
    `sc`'s batches followed by the side buffer (a mixed range: the only case that
    copies, and only the range's own bytes)."""
    record_pos, key_pos, headers_pos = sc.record_pos, sc.key_pos, sc.headers_pos
    if not sc.side.size:
        return JoinedBuffer(sc.segment, record_pos, key_pos, headers_pos)
    if not sc.records_count[(sc.attributes & COMPRESSION_MASK) == 0].any():
        return JoinedBuffer(sc.side, record_pos, key_pos, headers_pos)
    start = int(sc.batch_position[0])
    end = int(sc.batch_position[-1] + sc.batch_size[-1])
    side_shift = end - start
    shift = np.where(sc.buffer_id == SIDE, side_shift, -start).astype(np.int64)
    return JoinedBuffer(
        np.concatenate([sc.segment[start:end], sc.side]),
        record_pos + shift,
        key_pos + shift,
        np.where(headers_pos >= 0, headers_pos + shift, -1),
        side_shift,
        -start,
    )
