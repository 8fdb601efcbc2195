"""One compaction pass over a partition (Kafka's Cleaner.doClean), crash-safe.

A pass over the dirty range [first_dirty, first_uncleanable):

1. Producer state: every batch header of the log (all segments, the active one too) is
   walked to find each active producer's last batch (`producers.py`).
2. Map build: the records of the dirty range go into the `OffsetMap` in offset order
   (aborted transactional batches and control batches skipped, keyless records never
   put). When the map fills, the round ends at the last record put: `end_offset =
   latest_offset + 1`, and the rest waits for the next pass; a segment too big for the
   map is thereby cleaned in parts and never blocks the partition. For the timestamp and
   header strategies, the clean section's records then update the entries they beat.
3. Copy: every segment from the log start up to `end_offset` is grouped
   (`grouping.py`) and each group rewritten into one `<base>.*.cleaned` segment, batch by
   batch: the batch rules of `batch_retention.py` decide, the record rules are applied
   over whole segments at once (numba), kept batches are copied byte for byte, partial
   ones re-encoded from their kept records' bytes (only each record's length and
   timestamp-delta varints are rewritten) with the same codec, base offset, last offset
   delta, producer fields and leader epoch. Indexes are rebuilt with Kafka's interval
   rule and the `.txnindex` from the transaction tracker. The output is fsynced and
   takes the last source segment's mtime.
4. Swap (`swap.py`), group by group, then the `cleaner-offset-checkpoint` entry becomes
   `end_offset` (tmp file, fsync, rename, dir fsync).

Failure: any error before a group's swap starts removes that group's `.cleaned` files and
leaves its source segments as they were; the error propagates (the caller marks the
partition uncleanable). Every file operation goes through the injected `FileOps`, so a
test can stop the pass at any single one and check recovery.

Segments are memory-mapped and decoded into columns (`cleanerd.records.columns`, numba),
once per pass where the cache budget allows (the dirty segments decoded for the map are
reused by the copy). Keys are hashed once per segment; keep decisions, index arithmetic
and the rewriting of kept records run over whole segments in numpy/numba. Python runs per
batch only for batches with a producer id, transaction or control flag, and to append
each written batch, never per record.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import crc32c
import numpy as np
from numpy.typing import NDArray

from cleanerd._jit import jit
from cleanerd.compaction.batch_retention import (
    NO_HORIZON,
    BatchDecisions,
    WriteAction,
    check_batch_retention,
    keep_records,
    plan_batch_writes,
)
from cleanerd.compaction.grouping import INT32_MAX, group_segments_by_size
from cleanerd.compaction.keyhash import hash_keys
from cleanerd.compaction.offset_map import OffsetMap
from cleanerd.compaction.producers import (
    LastRecord,
    ProducerBatch,
    is_last_batch_of_producer,
    last_records_of_active_producers,
)
from cleanerd.compaction.stats import CleanerStats, StatsAccumulator
from cleanerd.compaction.strategy import CompactionStrategy, ResolvedStrategy, record_versions
from cleanerd.compaction.swap import FileOps, remove_cleaned, replace_segments
from cleanerd.compaction.throttle import Throttler
from cleanerd.compaction.transactions import TransactionTracker
from cleanerd.errors import CleanerdError, CorruptRecordError
from cleanerd.log.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
    format_checkpoint,
)
from cleanerd.log.files import (
    CLEANED_FILE_SUFFIX,
    INDEX_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    TopicPartition,
    log_file,
    segment_file,
    txn_index_file,
)
from cleanerd.log.index import IndexBuilder, OffsetIndex, TimeIndex
from cleanerd.log.meta import SegmentMeta
from cleanerd.log.txnindex import AbortedTxn, TransactionIndex
from cleanerd.records.batch import decode_batch, empty_batch_of, encode_batch, encode_empty_batch
from cleanerd.records.columns import SIDE, SegmentColumns, segment_columns
from cleanerd.records.compression import compress
from cleanerd.records.control import control_type
from cleanerd.records.header import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_MASK,
    CONTROL_MASK,
    DELETE_HORIZON_MASK,
    HEADER,
    LOG_OVERHEAD,
    RECORD_BATCH_OVERHEAD,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    BatchHeader,
    Buffer,
    Compression,
    TimestampType,
)
from cleanerd.records.record import Record

WRITE_BUFFER_BYTES: Final = 8 * 1024 * 1024
CACHE_BYTES: Final = 512 * 1024 * 1024  # decoded segments kept from map build to copy
DAY_MS: Final = 86_400_000


class CleaningAborted(CleanerdError):
    """The pass was asked to stop (shutdown, pause); nothing was changed."""

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        super().__init__(f"cleaning of {tp} aborted")


@dataclass(frozen=True, slots=True)
class CleanerConfig:
    """The per-topic settings a pass reads (Kafka's LogConfig and broker defaults)."""

    segment_bytes: int = 1024 * 1024 * 1024
    max_index_size: int = 10 * 1024 * 1024
    index_interval_bytes: int = 4096
    delete_retention_ms: int = DAY_MS
    producer_id_expiration_ms: int = DAY_MS
    strategy: ResolvedStrategy = field(
        default_factory=lambda: ResolvedStrategy(CompactionStrategy.OFFSET)
    )


@dataclass(frozen=True, slots=True)
class CleanResult:
    """What a pass did: the new first dirty offset, its stats, the files to unlink later."""

    first_dirty: int
    end_offset: int
    stats: CleanerStats
    deleted_files: tuple[Path, ...]


# ---------------------------------------------------------------------------------------
# Re-encoding kept records without decoding them.


@jit
def _skip_varint(buf: NDArray[np.uint8], p: int) -> int:
    while buf[p] >= 0x80:
        p += 1
    return p + 1


@jit
def _put_varint(out: NDArray[np.uint8], p: int, value: int) -> int:
    u = (value << 1) ^ (value >> 63)
    while True:
        b = u & 0x7F
        u = (u >> 7) & ((1 << 57) - 1)
        if u:
            out[p] = b | 0x80
            p += 1
        else:
            out[p] = b
            return p + 1


@jit
def _rewrite_records(
    buf: NDArray[np.uint8],
    rec_start: NDArray[np.int64],
    rec_end: NDArray[np.int64],
    new_ts_delta: NDArray[np.int64],
    out: NDArray[np.uint8],
    written: NDArray[np.int64],
) -> None:
    """Write the v2 records [rec_start, rec_end) of `buf` back to back into `out` with new
    timestamp deltas, `written[i]` receiving the end of record i in `out`. Only the
    length and timestamp-delta varints change: the offset delta stays valid because the
    batch keeps its base offset."""
    o = 0
    tmp = np.empty(16, dtype=np.uint8)
    for i in range(rec_start.shape[0]):
        attr = _skip_varint(buf, rec_start[i])
        ts_end = _skip_varint(buf, attr + 1)
        ts_len = _put_varint(tmp, 0, new_ts_delta[i])
        tail = rec_end[i] - ts_end
        o = _put_varint(out, o, 1 + ts_len + tail)
        out[o] = buf[attr]
        o += 1
        out[o : o + ts_len] = tmp[:ts_len]
        o += ts_len
        out[o : o + tail] = buf[ts_end : rec_end[i]]
        o += tail
        written[i] = o


# ---------------------------------------------------------------------------------------
# A segment read for a pass.


@dataclass(slots=True)
class _Columns:
    """A segment's columns (`cleanerd.records.columns`) with every record position made
    relative to one buffer: the segment bytes followed by the side buffer of decompressed
    records areas, so a kernel needs a single buffer."""

    raw: Buffer
    sc: SegmentColumns
    buf: NDArray[np.uint8]
    batch_of: NDArray[np.int64]
    record_pos: NDArray[np.int64]
    record_end: NDArray[np.int64]
    key_pos: NDArray[np.int64]
    headers_pos: NDArray[np.int64]
    _hashes: NDArray[np.uint64] | None = None
    _hash_row: NDArray[np.int64] | None = None

    def hashes(self, rows: NDArray[np.int64]) -> NDArray[np.uint64]:
        """Key hashes of the keyed records `rows` (ascending); every key of the segment
        is hashed once per pass, on first use."""
        if self._hashes is None or self._hash_row is None:
            keyed = np.flatnonzero(self.sc.key_len >= 0)
            self._hashes = hash_keys(self.buf, self.key_pos[keyed], self.sc.key_len[keyed])
            self._hash_row = np.full(self.records, -1, dtype=np.int64)
            self._hash_row[keyed] = np.arange(keyed.size)
        if rows.size == self._hashes.shape[0]:  # all keyed records, in order
            return self._hashes
        return self._hashes[self._hash_row[rows]]

    @property
    def batches(self) -> int:
        return self.sc.num_batches

    @property
    def records(self) -> int:
        return self.sc.num_records

    @property
    def offsets(self) -> NDArray[np.int64]:
        return self.sc.offset

    @property
    def timestamps(self) -> NDArray[np.int64]:
        return self.sc.timestamp

    def last_offset(self, i: int) -> int:
        return int(self.sc.base_offset[i]) + int(self.sc.last_offset_delta[i])

    def last_offsets(self) -> NDArray[np.int64]:
        return self.sc.base_offset + self.sc.last_offset_delta

    def attributes(self, i: int) -> int:
        return int(self.sc.attributes[i])

    def is_v2(self, i: int) -> bool:
        return int(self.sc.batch_magic[i]) == 2

    def header(self, i: int) -> BatchHeader:
        h = self.sc.batch_header(i)
        assert h is not None, "legacy entries have no v2 header"
        return h


def _read_columns(raw: Buffer, path: Path, *, verify_crc: bool) -> _Columns:
    """Decode a segment; a CorruptRecordError names `path` and the byte position."""
    try:
        sc = segment_columns(raw, verify_crc=verify_crc)
    except CorruptRecordError as exc:
        raise exc.located(path) from exc
    record_pos, key_pos, headers_pos = sc.record_pos, sc.key_pos, sc.headers_pos
    buf = sc.segment
    if sc.side.size:  # one buffer for the kernels: the side areas after the segment
        buf = np.concatenate([sc.segment, sc.side])
        shift = np.where(sc.buffer_id == SIDE, len(raw), 0).astype(np.int64)
        record_pos, key_pos = record_pos + shift, key_pos + shift
        headers_pos = np.where(headers_pos >= 0, headers_pos + shift, -1)
    return _Columns(
        raw=raw,
        sc=sc,
        buf=buf,
        batch_of=sc.batch_index.astype(np.int64),
        record_pos=record_pos,
        record_end=record_pos + sc.record_size,
        key_pos=key_pos,
        headers_pos=headers_pos,
    )


def _map_file(path: Path) -> Buffer:
    """The file's bytes, memory-mapped read-only (no copy; the pages come from the page
    cache). A segment is never modified in place, only replaced by rename, so the mapping
    stays valid for the pass."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return b""
        return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)


@jit
def _batch_positions(buf: NDArray[np.uint8], out: NDArray[np.int64]) -> int:
    """Positions of the v2 batches in `buf` (legacy entries are stepped over; the walk
    stops at the first incomplete entry); returns how many."""
    n = 0
    p = 0
    end = buf.shape[0]
    while end - p >= 17:
        size = 12 + (
            (int(buf[p + 8]) << 24)
            | (int(buf[p + 9]) << 16)
            | (int(buf[p + 10]) << 8)
            | int(buf[p + 11])
        )
        if size < 26 or size > end - p:
            break
        if buf[p + 16] == 2 and size >= 61:
            out[n] = p
            n += 1
        p += size
    return n


def _field(
    buf: NDArray[np.uint8], pos: NDArray[np.int64], at: int, dtype: str
) -> NDArray[np.int64]:
    """The big-endian header field at byte `at` of each batch at `pos`, as int64."""
    width = np.dtype(dtype).itemsize
    raw = buf[pos[:, None] + np.arange(at, at + width)]
    return np.ascontiguousarray(raw).view(dtype).reshape(-1).astype(np.int64)


def _control_types(c: _Columns) -> dict[int, int | None]:
    """Batch row -> the type in its control record's key (None for an emptied marker)."""
    out: dict[int, int | None] = {}
    for i in np.flatnonzero(c.sc.attributes & CONTROL_MASK).tolist():
        if not c.is_v2(i) or c.sc.records_count[i] == 0:
            out[i] = None
            continue
        j = int(c.sc.batch_first_record[i])
        key_pos, key_len = int(c.key_pos[j]), int(c.sc.key_len[j])
        if key_len < 4:
            raise CorruptRecordError(
                f"control record key of {key_len} bytes", position=int(c.sc.batch_position[i])
            )
        out[i] = int.from_bytes(c.buf[key_pos + 2 : key_pos + 4].tobytes(), "big", signed=True)
    return out


# ---------------------------------------------------------------------------------------
# Writing a cleaned segment.


class _SegmentWriter:
    """Appends batches to `<base>.log.cleaned` with large writes, building its indexes."""

    def __init__(self, ops: FileOps, dir_path: Path, base: int, config: CleanerConfig) -> None:
        self.ops = ops
        self.dir_path = dir_path
        self.base = base
        self.path = log_file(dir_path, base, CLEANED_FILE_SUFFIX)
        self.offset_index = OffsetIndex(
            segment_file(dir_path, base, INDEX_FILE_SUFFIX, CLEANED_FILE_SUFFIX),
            base,
            max_index_size=config.max_index_size,
        )
        self.time_index = TimeIndex(
            segment_file(dir_path, base, TIME_INDEX_FILE_SUFFIX, CLEANED_FILE_SUFFIX),
            base,
            max_index_size=config.max_index_size,
        )
        self.indexes = IndexBuilder(self.offset_index, self.time_index, config.index_interval_bytes)
        self.txn_entries: list[AbortedTxn] = []
        self.buffer = bytearray()
        self.position = 0
        self.next_offset = base
        self.fd = ops.create(self.path)

    def append(self, batch: bytes | memoryview, last_offset: int, max_timestamp: int) -> None:
        if last_offset - self.base > INT32_MAX:
            raise CorruptRecordError(
                f"offset {last_offset} does not fit a 32-bit delta from the cleaned segment's "
                f"base {self.base} (a source segment with offset overflow)",
                path=self.path,
            )
        self.indexes.add_batch(self.position, len(batch), last_offset, max_timestamp)
        self.buffer += batch
        self.position += len(batch)
        self.next_offset = last_offset + 1

    def flush(self) -> int:
        """Write the buffered batches; returns the bytes written (for the throttle)."""
        n = len(self.buffer)
        if n:
            self.ops.write(self.fd, self.buffer)
            self.buffer = bytearray()
        return n

    def finish(self, mtime_ns: int) -> int:
        """Write the rest, the indexes and the txnindex, fsync all, set mtimes; returns
        the bytes written by this call."""
        written = self.flush()
        self.ops.fsync(self.fd)
        self.ops.close(self.fd)
        self.fd = -1
        self.indexes.finish()
        self.ops.write_file(self.offset_index.path, self.offset_index.to_bytes())
        self.ops.write_file(self.time_index.path, self.time_index.to_bytes())
        if self.txn_entries:
            txn = txn_index_file(self.dir_path, self.base, CLEANED_FILE_SUFFIX)
            self.ops.write_file(txn, b"".join(t.to_bytes() for t in self.txn_entries))
        for path in (self.path, self.offset_index.path, self.time_index.path):
            self.ops.set_mtime(path, mtime_ns)
        return written

    def abandon(self) -> None:
        if self.fd >= 0:
            self.ops.close(self.fd)
            self.fd = -1
        remove_cleaned(self.dir_path, self.base, self.ops)


_HeaderFields = tuple[int, int, int, int, int, int, int, int, int, int]
"""base offset, leader epoch, attributes, last offset delta, base ts, max ts, producer id,
producer epoch, base sequence, records count."""


def _assemble(head: _HeaderFields, area: bytes | bytearray) -> bytes:
    """Header fields + records area, with batch length and CRC computed."""
    (base, epoch, attributes, lod, base_ts, max_ts, pid, pepoch, seq, count) = head
    packed = bytearray(
        HEADER.pack(
            base,
            RECORD_BATCH_OVERHEAD - LOG_OVERHEAD + len(area),
            epoch,
            2,
            0,
            attributes,
            lod,
            base_ts,
            max_ts,
            pid,
            pepoch,
            seq,
            count,
        )
    )
    crc = crc32c.crc32c(area, crc32c.crc32c(memoryview(packed)[ATTRIBUTES_OFFSET:]))
    packed[17:21] = crc.to_bytes(4, "big")
    return bytes(packed) + bytes(area)


def _reencode(
    c: _Columns, batches: NDArray[np.int64], keep: NDArray[np.bool_], horizons: NDArray[np.int64]
) -> list[tuple[bytes, int]]:
    """The batches `batches` of `c` (ascending) holding only their kept records, each
    with its delete horizon from `horizons` (or none); returns (bytes, max timestamp) per
    batch. The records of all v2 batches are rewritten by one kernel call."""
    sc = c.sc
    out: list[tuple[bytes, int]] = []
    v2 = batches[sc.batch_magic[batches] == 2]
    wanted = np.zeros(c.batches, dtype=np.bool_)
    wanted[v2] = True
    records = np.flatnonzero(keep & wanted[c.batch_of])
    owner = c.batch_of[records]
    starts = np.searchsorted(owner, v2)
    ends = np.searchsorted(owner, v2, side="right")
    ts = c.timestamps[records]
    horizon = horizons[v2]
    base_ts = np.where(horizon != NO_HORIZON, horizon, ts[starts] if ts.size else 0)
    max_ts = np.maximum.reduceat(ts, starts) if ts.size else ts
    positions, record_end = c.record_pos[records], c.record_end[records]
    area = np.empty(int((record_end - positions).sum()) + 16 * records.size, np.uint8)
    written = np.empty(records.size, dtype=np.int64)
    _rewrite_records(
        c.buf, positions, record_end, ts - np.repeat(base_ts, ends - starts), area, written
    )
    index_of = {b: k for k, b in enumerate(v2.tolist())}
    for i in batches.tolist():
        k = index_of.get(i)
        if k is None:
            out.append(_legacy_as_v2(c, i, np.flatnonzero(keep & (c.batch_of == i))))
            continue
        first, stop = int(starts[k]), int(ends[k])
        attributes = int(sc.attributes[i])
        if horizon[k] != NO_HORIZON:
            attributes |= DELETE_HORIZON_MASK
        else:
            attributes &= ~DELETE_HORIZON_MASK
        batch_max = int(sc.max_timestamp[i]) if attributes & TIMESTAMP_TYPE_MASK else int(max_ts[k])
        begin = int(written[first - 1]) if first else 0
        body: bytes = area[begin : int(written[stop - 1])].tobytes()
        codec = attributes & COMPRESSION_MASK
        if codec != Compression.NONE:
            body = compress(Compression(codec), body)
        head = (
            int(sc.base_offset[i]),
            int(sc.partition_leader_epoch[i]),
            attributes,
            int(sc.last_offset_delta[i]),
            int(base_ts[k]),
            batch_max,
            int(sc.producer_id[i]),
            int(sc.producer_epoch[i]),
            int(sc.base_sequence[i]),
            stop - first,
        )
        out.append((_assemble(head, body), batch_max))
    return out


def _legacy_as_v2(c: _Columns, i: int, kept: NDArray[np.int64]) -> tuple[bytes, int]:
    """Kept records of a legacy (magic 0/1) entry, written as one v2 batch with the same
    codec and offsets: cleanerd reads legacy message sets but never writes them."""
    sc = c.sc

    def part(pos: int, length: int) -> bytes | None:
        return None if length < 0 else c.buf[pos : pos + length].tobytes()

    records = [
        Record(
            int(sc.offset[j]),
            int(sc.timestamp[j]),
            part(int(c.key_pos[j]), int(sc.key_len[j])),
            part(
                int(sc.value_pos[j]) + (len(c.raw) if sc.buffer_id[j] == SIDE else 0),
                int(sc.value_len[j]),
            ),
        )
        for j in kept.tolist()
    ]
    attributes = int(sc.attributes[i])
    batch = encode_batch(
        records,
        base_offset=int(sc.base_offset[i]),
        last_offset_delta=int(sc.last_offset_delta[i]),
        compression=Compression(attributes & COMPRESSION_MASK),
        timestamp_type=TimestampType((attributes & TIMESTAMP_TYPE_MASK) >> 3),
    )
    return batch, max(r.timestamp for r in records)


# ---------------------------------------------------------------------------------------
# The pass.


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _aborted_between(entries: list[AbortedTxn], start: int, end: int) -> list[AbortedTxn]:
    """Aborted transactions overlapping [start, end) (Kafka's collectAbortedTransactions)."""
    return [t for t in entries if t.last_offset >= start and t.first_offset < end]


def _empty_header(c: _Columns, i: int) -> bytes:
    """The 61-byte empty batch keeping batch `i`'s offsets and producer fields."""
    if c.is_v2(i):
        return empty_batch_of(c.header(i))
    return encode_empty_batch(
        base_offset=int(c.sc.base_offset[i]),
        last_offset_delta=int(c.sc.last_offset_delta[i]),
        max_timestamp=int(c.sc.max_timestamp[i]),
    )


def _horizon(attributes: int, base_timestamp: int) -> int:
    return base_timestamp if attributes & DELETE_HORIZON_MASK else NO_HORIZON


@dataclass(slots=True)
class _Pass:
    """The state of one pass over one partition."""

    tp: TopicPartition
    dir_path: Path
    segments: Sequence[SegmentMeta]
    first_dirty: int
    first_uncleanable: int
    now_ms: int
    config: CleanerConfig
    stats: StatsAccumulator
    swap_lock: AbstractContextManager[object]
    aborted: list[AbortedTxn] = field(default_factory=list)
    legacy_delete_horizon_ms: int = 0
    cache: dict[int, _Columns] = field(default_factory=dict)
    cached_bytes: int = 0
    last_records: dict[int, LastRecord] = field(default_factory=dict)

    def upper(self, i: int) -> int:
        """Segment i's offset bound: the next segment's base, or the uncleanable offset."""
        if i + 1 < len(self.segments):
            return self.segments[i + 1].base_offset
        return max(self.first_uncleanable, self.segments[i].next_offset)


class Cleaner:
    """Runs compaction passes with one offset map (Kafka gives each cleaner thread one).

    Args:
        offset_map: the map, cleared at the start of every pass.
        throttler: the shared I/O throttle; None for no limit.
        ops: the file operations (tests inject failures and crashes here).
        clock_ms: a monotonic millisecond clock for the statistics.
        should_abort: polled before each segment is mapped or copied; when it returns
            True the pass stops with CleaningAborted, its output removed (Kafka's
            checkDone), before any swap of the group in progress.
    """

    def __init__(
        self,
        offset_map: OffsetMap,
        *,
        throttler: Throttler | None = None,
        ops: FileOps | None = None,
        clock_ms: Callable[[], int] = _monotonic_ms,
        should_abort: Callable[[], bool] | None = None,
    ) -> None:
        self.should_abort = should_abort
        self.offset_map = offset_map
        self.throttler = throttler
        self.ops = ops if ops is not None else FileOps()
        self.clock_ms = clock_ms

    def clean(
        self,
        *,
        log_dir: Path,
        tp: TopicPartition,
        segments: Sequence[SegmentMeta],
        first_dirty: int,
        first_uncleanable: int,
        now_ms: int,
        config: CleanerConfig,
        swap_lock: AbstractContextManager[object] | None = None,
    ) -> CleanResult:
        """Clean [first_dirty, first_uncleanable) of the partition `tp` under `log_dir`,
        whose segments (ascending, the active one last) are `segments`; swap the result
        in (holding `swap_lock`, the partition lock, for the renames only) and move the
        cleaner checkpoint to the returned end offset."""
        p = _Pass(
            tp=tp,
            dir_path=log_dir / str(tp),
            segments=segments,
            first_dirty=first_dirty,
            first_uncleanable=first_uncleanable,
            now_ms=now_ms,
            config=config,
            stats=StatsAccumulator(start_ms=self.clock_ms()),
            swap_lock=swap_lock if swap_lock is not None else nullcontext(),
        )
        p.aborted = self._load_aborted(p)
        clean_section = [s for s in segments if s.base_offset < first_dirty]
        if clean_section:
            p.legacy_delete_horizon_ms = (
                clean_section[-1].last_modified_ms - config.delete_retention_ms
            )
        p.last_records = self._producer_state(p)
        end_offset = self._build_offset_map(p)
        if self.offset_map.versioned:
            self._update_from_clean_section(p)
        p.stats.map_complete_ms = self.clock_ms()
        p.stats.buffer_utilization = self.offset_map.utilization
        to_clean = [s for s in segments if s.base_offset < end_offset]
        groups = group_segments_by_size(
            to_clean,
            max_size=config.segment_bytes,
            max_index_size=config.max_index_size,
            first_uncleanable_offset=first_uncleanable,
        )
        tracker = TransactionTracker()
        deleted: list[Path] = []
        for group in groups:
            deleted += self._clean_group(p, group, tracker)
        self._write_checkpoint(log_dir, tp, end_offset)
        return CleanResult(first_dirty, end_offset, p.stats.freeze(self.clock_ms()), tuple(deleted))

    # -- reading ------------------------------------------------------------------------

    def _columns(self, p: _Pass, seg: SegmentMeta, *, keep: bool) -> _Columns:
        """The decoded segment (CRC-checked); decoded once per pass while the cache
        budget allows, `keep` leaving it cached for a later phase."""
        if self.should_abort is not None and self.should_abort():
            raise CleaningAborted(p.tp)
        c = p.cache.pop(seg.base_offset, None)
        if c is None:
            path = log_file(p.dir_path, seg.base_offset)
            raw = _map_file(path)
            self._throttle(len(raw))
            c = _read_columns(raw, path, verify_crc=True)
        else:
            p.cached_bytes -= len(c.raw)
        if keep and p.cached_bytes + len(c.raw) <= CACHE_BYTES:
            p.cache[seg.base_offset] = c
            p.cached_bytes += len(c.raw)
        return c

    def _load_aborted(self, p: _Pass) -> list[AbortedTxn]:
        entries: list[AbortedTxn] = []
        for seg in p.segments:
            path = txn_index_file(p.dir_path, seg.base_offset)
            if path.exists():
                entries += TransactionIndex.load(path, seg.base_offset).entries
        return sorted(set(entries))

    def _producer_state(self, p: _Pass) -> dict[int, LastRecord]:
        batches: list[ProducerBatch] = []
        for seg in p.segments:
            raw = _map_file(log_file(p.dir_path, seg.base_offset))
            buf = np.frombuffer(raw, dtype=np.uint8)
            pos = np.empty(len(buf) // RECORD_BATCH_OVERHEAD + 1, dtype=np.int64)
            pos = pos[: _batch_positions(buf, pos)]
            pos = pos[_field(buf, pos, 43, ">i8") >= 0]
            if not pos.size:
                continue
            fields = zip(
                pos.tolist(),
                _field(buf, pos, 43, ">i8").tolist(),
                _field(buf, pos, 51, ">i2").tolist(),
                (_field(buf, pos, 0, ">i8") + _field(buf, pos, 23, ">i4")).tolist(),
                _field(buf, pos, 35, ">i8").tolist(),
                _field(buf, pos, 21, ">i2").tolist(),
                _field(buf, pos, 57, ">i4").tolist(),
                strict=True,
            )
            for position, pid, epoch, last, max_ts, attributes, count in fields:
                is_control = bool(attributes & CONTROL_MASK)
                kind = None
                if is_control and count:
                    kind = int(
                        control_type(decode_batch(raw, position, verify_crc=False).records[0])
                    )
                batches.append(
                    ProducerBatch(
                        producer_id=pid,
                        producer_epoch=epoch,
                        last_offset=last,
                        max_timestamp=max_ts,
                        is_transactional=bool(attributes & TRANSACTIONAL_MASK),
                        is_control=is_control,
                        control_type=kind,
                    )
                )
        return last_records_of_active_producers(
            batches, now_ms=p.now_ms, expiration_ms=p.config.producer_id_expiration_ms
        )

    def _versions(
        self, p: _Pass, c: _Columns, rows: NDArray[np.int64]
    ) -> tuple[NDArray[np.int64], NDArray[np.bool_]] | None:
        bi = c.batch_of[rows]
        return record_versions(
            p.config.strategy,
            timestamps=c.timestamps[rows],
            batch_max_timestamps=c.sc.max_timestamp[bi],
            log_append_time=(c.sc.attributes[bi] & TIMESTAMP_TYPE_MASK) != 0,
            buf=c.buf,
            headers_pos=c.headers_pos[rows],
            header_count=c.sc.header_count[rows],
            headers_end=c.record_end[rows],
        )

    # -- map build ----------------------------------------------------------------------

    def _build_offset_map(self, p: _Pass) -> int:
        """Fill the map from the dirty range; returns the round's end offset: the
        first uncleanable offset, or the offset after the last record put if the map
        filled first."""
        m = self.offset_map
        m.clear()
        tracker = TransactionTracker()
        start, end = p.first_dirty, p.first_uncleanable
        for idx, seg in enumerate(p.segments):
            if seg.base_offset >= end:
                break
            if p.upper(idx) <= start:
                continue
            c = self._columns(p, seg, keep=True)
            p.stats.map_bytes_read += len(c.raw)
            tracker.add_aborted(_aborted_between(p.aborted, seg.base_offset, p.upper(idx)))
            mappable = self._mappable_batches(c, tracker)
            bi = c.batch_of
            rows = np.flatnonzero(mappable[bi] & (c.sc.key_len >= 0) & (c.offsets >= start))
            rows = rows[c.offsets[rows] < end]
            versions = self._versions(p, c, rows) if m.versioned else None
            put = m.put_many(
                c.hashes(rows),
                c.offsets[rows],
                None if versions is None else versions[0],
                None if versions is None else versions[1],
            )
            if put == rows.size:
                p.stats.map_messages_read += c.records
                m.update_latest_offset(min(p.upper(idx), end) - 1)
                continue
            stop_batch = int(bi[rows[put]])
            p.stats.map_messages_read += int(np.searchsorted(bi, stop_batch)) + int(
                np.count_nonzero(bi[: rows[put]] == stop_batch)
            )
            if stop_batch > 0:
                before = c.last_offset(stop_batch - 1)
                if before >= start:
                    m.update_latest_offset(max(m.latest_offset, before))
            return m.latest_offset + 1
        # Every dirty segment was mapped whole (or the range is empty: a pass that only
        # re-copies the log, to drop tombstones and markers whose horizon has passed).
        m.update_latest_offset(max(m.latest_offset, end - 1))
        return end

    def _update_from_clean_section(self, p: _Pass) -> None:
        """Let records below the dirty range beat the dirty winners of their keys (the
        timestamp and header strategies can prefer an older record)."""
        for seg in p.segments:
            if seg.base_offset >= p.first_dirty:
                break
            c = self._columns(p, seg, keep=True)
            data = (c.sc.attributes[c.batch_of] & CONTROL_MASK) == 0
            rows = np.flatnonzero(data & (c.sc.key_len >= 0) & (c.offsets < p.first_dirty))
            versions = self._versions(p, c, rows)
            self.offset_map.update_existing_many(
                c.hashes(rows),
                c.offsets[rows],
                None if versions is None else versions[0],
                None if versions is None else versions[1],
            )

    @staticmethod
    def _mappable_batches(c: _Columns, tracker: TransactionTracker) -> NDArray[np.bool_]:
        """Per batch: data that is not aborted (control batches only feed the tracker).
        Only transactional and control batches need the tracker; the tracker consumes
        aborted-transaction entries by offset, so skipping the others changes nothing."""
        mappable: NDArray[np.bool_] = np.asarray((c.sc.attributes & CONTROL_MASK) == 0)
        flagged = np.flatnonzero(c.sc.attributes & (CONTROL_MASK | TRANSACTIONAL_MASK))
        if not flagged.size:
            return mappable
        types = _control_types(c)
        lasts = c.last_offsets()
        for i in flagged.tolist():
            pid, last = int(c.sc.producer_id[i]), int(lasts[i])
            if c.attributes(i) & CONTROL_MASK:
                tracker.on_control_batch(pid, types[i], last)
            else:
                mappable[i] = not tracker.on_data_batch(pid, True, last)
        return mappable

    # -- copy ---------------------------------------------------------------------------

    def _clean_group(
        self, p: _Pass, group: list[SegmentMeta], tracker: TransactionTracker
    ) -> list[Path]:
        base = group[0].base_offset
        remove_cleaned(p.dir_path, base, self.ops)
        writer = _SegmentWriter(self.ops, p.dir_path, base, p.config)
        try:
            for seg in group:
                idx = next(i for i, s in enumerate(p.segments) if s is seg)
                self._clean_segment(p, seg, idx, writer, tracker)
            writer.txn_entries = tracker.drain_cleaned_index()
            last_source = log_file(p.dir_path, group[-1].base_offset)
            written = writer.finish(last_source.stat().st_mtime_ns)
            self._throttle(written)
        except Exception:
            writer.abandon()
            raise
        p.stats.bytes_written += writer.position
        with p.swap_lock:
            return replace_segments(
                p.dir_path,
                new_base=base,
                new_next_offset=writer.next_offset,
                old_bases=[s.base_offset for s in group],
                ops=self.ops,
            )

    def _throttle(self, n: int) -> None:
        if self.throttler is not None and n:
            self.throttler.maybe_throttle(n)

    def _clean_segment(
        self,
        p: _Pass,
        seg: SegmentMeta,
        idx: int,
        writer: _SegmentWriter,
        tracker: TransactionTracker,
    ) -> None:
        c = self._columns(p, seg, keep=False)
        raw = memoryview(c.raw)
        p.stats.bytes_read += len(raw)
        p.stats.messages_read += c.records
        tracker.add_aborted(_aborted_between(p.aborted, seg.base_offset, p.upper(idx)))
        decisions = self._batch_decisions(p, c, tracker)
        keep = self._keep_mask(p, c, seg, decisions)
        bi = c.batch_of
        kept = np.bincount(bi[keep], minlength=c.batches)
        horizons = np.where(
            (c.sc.attributes & DELETE_HORIZON_MASK) != 0, c.sc.base_timestamp, NO_HORIZON
        )
        actions, new_horizons = plan_batch_writes(
            decisions,
            kept=kept,
            total=c.sc.records_count.astype(np.int64),
            kept_tombstone=np.bincount(bi[keep & (c.sc.value_len < 0)], minlength=c.batches) > 0,
            delete_horizon_ms=horizons,
            now_ms=p.now_ms,
            delete_retention_ms=p.config.delete_retention_ms,
        )
        reencoded = iter(
            _reencode(c, np.flatnonzero(actions == WriteAction.REENCODE), keep, new_horizons)
        )
        lasts = c.last_offsets().tolist()
        max_timestamps = c.sc.max_timestamp.tolist()
        action_codes = actions.tolist()
        copy, empty = int(WriteAction.COPY), int(WriteAction.EMPTY_HEADER)
        for i in np.flatnonzero(actions != WriteAction.SKIP).tolist():
            action, last, max_ts = action_codes[i], lasts[i], max_timestamps[i]
            if action == copy:
                pos = int(c.sc.batch_position[i])
                writer.append(raw[pos : pos + int(c.sc.batch_size[i])], last, max_ts)
            elif action == empty:
                writer.append(_empty_header(c, i), last, max_ts)
            else:
                batch, max_ts = next(reencoded)
                writer.append(batch, last, max_ts)
            if len(writer.buffer) >= WRITE_BUFFER_BYTES:
                self._throttle(writer.flush())
        p.stats.messages_written += int(kept[actions != WriteAction.SKIP].sum())

    def _batch_decisions(
        self, p: _Pass, c: _Columns, tracker: TransactionTracker
    ) -> BatchDecisions:
        """Batch-level outcomes. Batches without producer id, transaction or control flag
        get rule 2 or DELETE_EMPTY at once; the others go through the tracker and the
        producer state in order (see `_mappable_batches` on skipping the tracker)."""
        lasts = c.last_offsets()
        decisions = BatchDecisions.plain(lasts + 1, p.first_uncleanable)
        flagged = (c.sc.attributes & (CONTROL_MASK | TRANSACTIONAL_MASK)) != 0
        special = np.flatnonzero(flagged | (c.sc.producer_id >= 0))
        if not special.size:
            return decisions
        types = _control_types(c)
        for i in special.tolist():
            pid, last, attributes = int(c.sc.producer_id[i]), int(lasts[i]), c.attributes(i)
            is_control = bool(attributes & CONTROL_MASK)
            if is_control:
                discardable = tracker.on_control_batch(pid, types[i], last)
            else:
                txn = bool(attributes & TRANSACTIONAL_MASK)
                discardable = tracker.on_data_batch(pid, txn, last)
            is_last = pid >= 0 and is_last_batch_of_producer(
                p.last_records,
                producer_id=pid,
                producer_epoch=int(c.sc.producer_epoch[i]),
                last_offset=last,
                is_control=is_control,
            )
            decision = check_batch_retention(
                is_control=is_control,
                is_last_of_producer=is_last,
                next_offset=last + 1,
                upper_bound_offset=p.first_uncleanable,
                discardable=discardable,
                delete_horizon_ms=_horizon(attributes, int(c.sc.base_timestamp[i])),
                now_ms=p.now_ms,
            )
            decisions.set(i, decision)
        return decisions

    def _keep_mask(
        self, p: _Pass, c: _Columns, seg: SegmentMeta, decisions: BatchDecisions
    ) -> NDArray[np.bool_]:
        keyed = np.flatnonzero(c.sc.key_len >= 0)
        found = np.full(c.records, -1, dtype=np.int64)
        if keyed.size:
            found[keyed] = self.offset_map.get_many(c.hashes(keyed))[0]
        horizons = np.where(
            (c.sc.attributes & DELETE_HORIZON_MASK) != 0, c.sc.base_timestamp, NO_HORIZON
        )
        retain_deletes = (horizons == NO_HORIZON) | (p.now_ms < horizons)
        # Legacy (magic 0/1) tombstones have no horizon: Kafka keeps them while their
        # segment is newer than the legacy delete horizon.
        legacy = c.sc.batch_magic < 2
        retain_deletes[legacy] = seg.last_modified_ms > p.legacy_delete_horizon_ms
        keep, invalid = keep_records(
            rec_batch=c.batch_of,
            rec_offset=c.offsets,
            rec_has_key=c.sc.key_len >= 0,
            rec_has_value=c.sc.value_len >= 0,
            rec_found=found,
            batch_discard=decisions.discard_records,
            batch_is_control=(c.sc.attributes & CONTROL_MASK) != 0,
            batch_retain_deletes=retain_deletes,
            map_latest_offset=self.offset_map.latest_offset,
            exact_winner=self.offset_map.versioned,
        )
        p.stats.invalid_messages_read += invalid
        return keep

    # -- checkpoint ---------------------------------------------------------------------

    def _write_checkpoint(self, log_dir: Path, tp: TopicPartition, end_offset: int) -> None:
        path = log_dir / CLEANER_OFFSET_CHECKPOINT
        with _CHECKPOINT_LOCK:
            offsets = OffsetCheckpointFile(path).read() if path.exists() else {}
            offsets = {t: o for t, o in offsets.items() if (log_dir / str(t)).is_dir()}
            offsets[tp] = end_offset
            lines = [f"{t.topic} {t.partition} {offsets[t]}" for t in sorted(offsets)]
            self.ops.atomic_write(path, format_checkpoint(lines))


_CHECKPOINT_LOCK: Final = threading.Lock()
