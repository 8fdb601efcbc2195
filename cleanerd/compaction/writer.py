"""Writing a group's cleaned output into `.cleaned` segments, continued in a new segment
when the next batch would overflow the current one (Kafka trunk, KAFKA-20036).

Files of one output segment with base offset B, all created here, fsynced by `finish`
and removed by `abandon`:

    B.log.cleaned        the batches back to back, written a chunk (many batches) at a time
    B.index.cleaned      offset index entries (last offset - B: int32, position: int32)
    B.timeindex.cleaned  time index entries (timestamp: int64, offset - B: int32)
    B.txnindex.cleaned   the aborted transactions whose ABORT marker went to this segment
                         (absent when there are none)

all big-endian. The entries are those Kafka's per-batch interval rule gives, exactly as
`cleanerd.log.index.IndexBuilder` adds them on append (the running max timestamp and
its offset; an entry for a batch when more than `index.interval.bytes` bytes were
written since the last one, the batch's own bytes not counted; a time entry only for a
new max; the final time entry at the end). Here the rule runs in a kernel over a whole
chunk's batch table, because a Python call per batch is most of the cost of writing a
cleaned segment of small batches; `tests/compaction/test_writer.py` checks the files
against `IndexBuilder` batch by batch.

Overflow. The grouping (`grouping.py`) sizes a group to fit one segment, but a group can
still overflow one: re-encoded batches can grow (a delete horizon recomputes the
timestamp deltas), and a source segment written with offset overflow (an old broker bug)
holds offsets more than 2^31-1 above its base. So, before appending a batch to an output
segment that already holds one, the segment is finished and the batch starts a new
segment, based at the batch's base offset, when the batch would end past
`max_segment_bytes` (index positions are int32), when its last offset would be more than
`max_offset_range` above the segment's base (relative offsets are int32), or when the
offset or time index is full (Kafka's roll rule). The group is then replaced by several
segments (`swap.replace_segments`), covering the same offsets. Kafka 3.x split the
source segment and aborted the round instead; a partition with such a segment could
never be cleaned.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import numpy as np
from numpy.typing import NDArray

from cleanerd._jit import jit
from cleanerd.compaction.swap import FileOps, remove_cleaned
from cleanerd.errors import file_step
from cleanerd.log.files import (
    CLEANED_FILE_SUFFIX,
    INDEX_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    log_file,
    segment_file,
    txn_index_file,
)
from cleanerd.log.index import OFFSET_ENTRY, TIME_ENTRY
from cleanerd.log.txnindex import AbortedTxn
from cleanerd.records.header import INT32_MAX, NO_TIMESTAMP

_OFFSET_ROW: Final = np.dtype([("offset", ">i4"), ("position", ">i4")])
_TIME_ROW: Final = np.dtype([("timestamp", ">i8"), ("offset", ">i4")])
assert _OFFSET_ROW.itemsize == OFFSET_ENTRY.size
assert _TIME_ROW.itemsize == TIME_ENTRY.size

# Index state carried from chunk to chunk: IndexBuilder's fields, the last time entry.
_BYTES_SINCE, _MAX_TS, _OFFSET_OF_MAX_TS, _LAST_TIME_TS, _OFFSET_ENTRIES, _TIME_ENTRIES = range(6)


@dataclass(frozen=True, slots=True)
class OutputLimits:
    """What one output segment may hold (see the module docstring)."""

    max_segment_bytes: int = INT32_MAX
    max_offset_range: int = INT32_MAX
    max_index_size: int = 10 * 1024 * 1024
    index_interval_bytes: int = 4096


@dataclass(frozen=True, slots=True)
class OutputChunk:
    """Batches to append: their bytes back to back in `data`, and per batch where it ends
    in `data`, its base and last offsets and its max timestamp."""

    data: NDArray[np.uint8]
    end: NDArray[np.int64]
    base_offset: NDArray[np.int64]
    last_offset: NDArray[np.int64]
    max_timestamp: NDArray[np.int64]

    @property
    def batches(self) -> int:
        return int(self.end.shape[0])

    def start(self, i: int) -> int:
        """Where batch `i` starts in `data`."""
        return int(self.end[i - 1]) if i else 0


@jit
def _append_batches(
    end: NDArray[np.int64],
    last_offset: NDArray[np.int64],
    max_timestamp: NDArray[np.int64],
    first: int,
    base: int,
    position: int,
    limits: NDArray[np.int64],
    state: NDArray[np.int64],
    offset_rows: NDArray[np.int64],
    time_rows: NDArray[np.int64],
) -> int:
    """Account for batches `first`, `first + 1`, ... of a chunk appended at `position` of
    the segment based at `base`, until one would overflow the segment (see the module
    docstring; never the first batch of a segment); returns the index of that batch, or
    the batch count. Index entries go to `offset_rows` (relative offset, position) and
    `time_rows` (timestamp, relative offset) at the counts in `state`.

    `limits` = (max segment bytes, max offset range, max offset entries, max time
    entries, index interval bytes)."""
    max_bytes, max_range, max_offsets, max_times, interval = (
        limits[0],
        limits[1],
        limits[2],
        limits[3],
        limits[4],
    )
    chunk_start = end[first - 1] if first else 0
    for i in range(first, end.shape[0]):
        start = end[i - 1] if i else 0
        size = end[i] - start
        at = position + start - chunk_start
        if at > 0 and (
            at + size > max_bytes
            or last_offset[i] - base > max_range
            or state[_OFFSET_ENTRIES] >= max_offsets
            or state[_TIME_ENTRIES] >= max_times - 1
        ):
            return i
        if max_timestamp[i] > state[_MAX_TS]:
            state[_MAX_TS] = max_timestamp[i]
            state[_OFFSET_OF_MAX_TS] = last_offset[i]
        if state[_BYTES_SINCE] > interval:
            n = state[_OFFSET_ENTRIES]
            offset_rows[n, 0] = last_offset[i] - base
            offset_rows[n, 1] = at
            state[_OFFSET_ENTRIES] = n + 1
            if state[_MAX_TS] > state[_LAST_TIME_TS]:
                m = state[_TIME_ENTRIES]
                time_rows[m, 0] = state[_MAX_TS]
                time_rows[m, 1] = state[_OFFSET_OF_MAX_TS] - base
                state[_TIME_ENTRIES] = m + 1
                state[_LAST_TIME_TS] = state[_MAX_TS]
            state[_BYTES_SINCE] = 0
        state[_BYTES_SINCE] += size
    return int(end.shape[0])


@dataclass(slots=True)
class _Segment:
    """One output segment being written."""

    base: int
    log_path: Path
    fd: int
    position: int = 0
    next_offset: int = 0
    state: NDArray[np.int64] = field(default_factory=lambda: np.zeros(6, np.int64))
    offset_rows: NDArray[np.int64] = field(default_factory=lambda: np.zeros((0, 2), np.int64))
    time_rows: NDArray[np.int64] = field(default_factory=lambda: np.zeros((0, 2), np.int64))

    def __post_init__(self) -> None:
        self.next_offset = self.base
        self.state[_MAX_TS] = NO_TIMESTAMP
        self.state[_OFFSET_OF_MAX_TS] = self.base
        self.state[_LAST_TIME_TS] = NO_TIMESTAMP

    def reserve(self, batches: int) -> None:
        """Room for the index entries of `batches` more batches."""
        for name in ("offset_rows", "time_rows"):
            rows: NDArray[np.int64] = getattr(self, name)
            used = int(self.state[_OFFSET_ENTRIES if name == "offset_rows" else _TIME_ENTRIES])
            if rows.shape[0] < used + batches + 1:
                grown = np.zeros((max(2 * rows.shape[0], used + batches + 1), 2), np.int64)
                grown[:used] = rows[:used]
                setattr(self, name, grown)

    def index_bytes(self, dir_path: Path) -> list[tuple[Path, bytes]]:
        """The finished offset and time index files: the final time entry added."""
        st = self.state
        if st[_MAX_TS] > st[_LAST_TIME_TS]:
            self.reserve(0)
            m = int(st[_TIME_ENTRIES])
            self.time_rows[m] = (st[_MAX_TS], st[_OFFSET_OF_MAX_TS] - self.base)
            st[_TIME_ENTRIES] = m + 1
            st[_LAST_TIME_TS] = st[_MAX_TS]
        offsets = np.empty(int(st[_OFFSET_ENTRIES]), _OFFSET_ROW)
        offsets["offset"] = self.offset_rows[: len(offsets), 0]
        offsets["position"] = self.offset_rows[: len(offsets), 1]
        times = np.empty(int(st[_TIME_ENTRIES]), _TIME_ROW)
        times["timestamp"] = self.time_rows[: len(times), 0]
        times["offset"] = self.time_rows[: len(times), 1]
        suffix = CLEANED_FILE_SUFFIX
        return [
            (segment_file(dir_path, self.base, INDEX_FILE_SUFFIX, suffix), offsets.tobytes()),
            (segment_file(dir_path, self.base, TIME_INDEX_FILE_SUFFIX, suffix), times.tobytes()),
        ]


class CleanedOutput:
    """The output of one group: `.cleaned` segments starting at `base`, more of them
    after an overflow, each file with the bits and group of `like` (the group's first
    `.log`, which it replaces). Every file operation goes through `ops`."""

    def __init__(
        self,
        ops: FileOps,
        dir_path: Path,
        base: int,
        limits: OutputLimits,
        like: Path | None = None,
    ) -> None:
        self.ops = ops
        self.dir_path = dir_path
        self.like = like
        self._limit_row = np.array(
            [
                limits.max_segment_bytes,
                limits.max_offset_range,
                limits.max_index_size // OFFSET_ENTRY.size,
                limits.max_index_size // TIME_ENTRY.size,
                limits.index_interval_bytes,
            ],
            np.int64,
        )
        self.segments: list[_Segment] = []
        self._start(base)

    @property
    def bases(self) -> tuple[int, ...]:
        """Base offsets of the output segments, ascending."""
        return tuple(s.base for s in self.segments)

    @property
    def next_offset(self) -> int:
        """The offset after the last batch written (the first base if none was)."""
        return self.segments[-1].next_offset

    @property
    def size_bytes(self) -> int:
        """Bytes of batches written, over all output segments."""
        return sum(s.position for s in self.segments)

    def _start(self, base: int) -> None:
        path = log_file(self.dir_path, base, CLEANED_FILE_SUFFIX)
        with file_step("creating the cleaned segment", path):
            remove_cleaned(self.dir_path, base, self.ops)
            self.segments.append(_Segment(base, path, self.ops.create(path, self.like)))

    def append(self, chunk: OutputChunk) -> int:
        """Append the chunk's batches, starting a new segment at each overflow; returns
        the bytes written (for the throttle)."""
        first = 0
        while first < chunk.batches:
            seg = self.segments[-1]
            seg.reserve(chunk.batches - first)
            stop = int(
                _append_batches(
                    chunk.end,
                    chunk.last_offset,
                    chunk.max_timestamp,
                    first,
                    seg.base,
                    seg.position,
                    self._limit_row,
                    seg.state,
                    seg.offset_rows,
                    seg.time_rows,
                )
            )
            if stop > first:
                begin, end = chunk.start(first), chunk.start(stop)
                with file_step("writing the cleaned segment", seg.log_path):
                    self.ops.write(seg.fd, chunk.data[begin:end].data)
                seg.position += end - begin
                seg.next_offset = int(chunk.last_offset[stop - 1]) + 1
            if stop < chunk.batches:
                self._start(int(chunk.base_offset[stop]))
            first = stop
        return chunk.start(chunk.batches)

    def finish(self, *, mtime_ns: int, aborted: list[AbortedTxn]) -> None:
        """Make every output segment complete and durable: the log fsynced and closed,
        the indexes, each segment's share of `aborted` (by its ABORT marker's offset) as
        its `.txnindex`; every file takes `mtime_ns` (the last source segment's)."""
        for seg in self.segments:
            with file_step("syncing the cleaned segment", seg.log_path):
                self.ops.fsync(seg.fd)
                self.ops.close(seg.fd)
            seg.fd = -1
            files = seg.index_bytes(self.dir_path)
            mine = [t for t in aborted if seg.base <= t.last_offset < seg.next_offset]
            if mine:
                txn = txn_index_file(self.dir_path, seg.base, CLEANED_FILE_SUFFIX)
                files.append((txn, b"".join(t.to_bytes() for t in mine)))
            for path, data in files:
                with file_step("writing the cleaned index", path):
                    self.ops.write_file(path, data, self.like)
            for path in (seg.log_path, files[0][0], files[1][0]):
                with file_step("setting the cleaned file's mtime", path):
                    self.ops.set_mtime(path, mtime_ns)

    def abandon(self) -> None:
        """Close and remove everything written (the pass failed or was aborted)."""
        for seg in self.segments:
            if seg.fd >= 0:
                self.ops.close(seg.fd)
                seg.fd = -1
            remove_cleaned(self.dir_path, seg.base, self.ops)
