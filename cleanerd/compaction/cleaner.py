"""One compaction pass over a partition (Kafka's Cleaner.doClean), crash-safe.

A pass over the dirty range [first_dirty, first_uncleanable):

1. Producer state: every batch header of the log (all segments, the active one too) is
   walked by a kernel to find each active producer's last batch (`producers.py`), folded
   as it is read, so the state costs a row per producer, not per batch.
2. Map build: the records of the dirty range go into the `OffsetMap` in offset order
   (aborted transactional batches and control batches skipped, keyless records never
   put). When the map fills, the round ends at the last record put: `end_offset =
   latest_offset + 1`, and the rest waits for the next pass; a segment too big for the
   map is thereby cleaned in parts and never blocks the partition. For the timestamp and
   header strategies, the clean section's records then update the entries they beat.
3. Copy: every segment from the log start up to `end_offset` is grouped
   (`grouping.py`) and each group rewritten into `<base>.*.cleaned` output, batch by
   batch: the batch rules of `batch_retention.py` decide, the record rules are applied
   over whole segments at once (numba; which keyed records are superseded is the one
   question asked of the `RetentionOracle`, the offset map here), kept batches are
   copied byte for byte, partial ones re-encoded from their kept records' bytes (only
   each record's length and timestamp-delta varints are rewritten, `assemble.py`) with
   the same codec, base offset, last offset delta, producer fields and leader epoch.
   `writer.py` writes the output with Kafka's index rule and the `.txnindex` from the
   transaction tracker, continuing in a new segment where one would overflow (size or
   2^31-1 offsets: KAFKA-20036); it is fsynced and takes the last source segment's
   mtime.
4. Swap (`swap.py`), group by group (a group's output segments at once), then the
   `cleaner-offset-checkpoint` entry becomes `end_offset` (tmp file, fsync, rename, dir
   fsync).

Failure: any error before a group's swap starts removes that group's `.cleaned` files and
leaves its source segments as they were; the error propagates (the caller marks the
partition uncleanable). Every file operation goes through the injected `FileOps`, so a
test can stop the pass at any single one and check recovery.

Segments are read through `cleanerd.log.segment_reader` (mapped once per pass, each
checked to be the file of the pass's snapshot, with its aborted transactions and offset
bound, its records joined into one buffer) and decoded into columns
(`cleanerd.records.columns`, numba) in windows of at most `DECODE_WINDOW_BYTES` of whole
batches (`walker.BatchWindows`; a smaller segment is one window), so the memory of a
pass is bounded whatever the segment size. A window is decoded once per pass where the
cache budget allows (the dirty windows decoded for the map are reused by the copy; a
window decoded again is not CRC-checked again). Keys are hashed once per window, and
the copy reads a dirty window's keep decisions from the map slots its records were put
in; keep decisions, the producer state, the transaction tracker, the batch rules, the
assembly of the output and its index arithmetic run over whole windows in numba, so
1-record batches cost about what the same bytes in big batches cost. Python runs per
batch only to call a codec or CRC-32C (C libraries) on a batch decoded or re-encoded,
and for the rare batches written whole (empty headers, legacy entries); never per
record.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Final, Protocol

import numpy as np
from numpy.typing import NDArray

from cleanerd._jit import jit
from cleanerd.compaction.assemble import (
    PREBUILT_BATCH,
    PREBUILT_BODY,
    BatchHeads,
    assemble_chunk,
    rewrite_records,
)
from cleanerd.compaction.batch_retention import (
    NO_HORIZON,
    BatchDecisions,
    WriteAction,
    decide_batches,
    keep_records,
    plan_batch_writes,
)
from cleanerd.compaction.grouping import group_segments_by_size
from cleanerd.compaction.keyhash import hash_record_keys
from cleanerd.compaction.offset_map import OffsetMap
from cleanerd.compaction.producers import (
    ActiveProducers,
    ProducerColumns,
    ProducerStateBuilder,
)
from cleanerd.compaction.stats import CleanerStats, StatsAccumulator
from cleanerd.compaction.strategy import CompactionStrategy, ResolvedStrategy, segment_versions
from cleanerd.compaction.swap import (
    FileOps,
    SwapProof,
    cleaner_offset,
    remove_cleaned,
    remove_stale_cleaned,
    replace_segments,
)
from cleanerd.compaction.throttle import Throttler
from cleanerd.compaction.transactions import TransactionTracker
from cleanerd.compaction.writer import CleanedOutput, OutputChunk, OutputLimits
from cleanerd.errors import CleanerdError, CorruptRecordError, FileStepError, file_step
from cleanerd.log.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
)
from cleanerd.log.files import (
    TopicPartition,
    log_file,
)
from cleanerd.log.meta import SegmentMeta
from cleanerd.log.ownership import OwnerProof
from cleanerd.log.producer_state import latest_snapshot, snapshot_offsets
from cleanerd.log.segment_reader import (
    JoinedBuffer,
    aborted_between,
    join_buffers,
    load_aborted,
    map_segment,
    segment_offsets,
    segment_upper,
)
from cleanerd.log.txnindex import AbortedTxn
from cleanerd.records.address import Int, be_i16, be_i32, be_i64, bytes_address
from cleanerd.records.batch import empty_batch_of, encode_batch, encode_empty_batch
from cleanerd.records.columns import (
    SegmentColumns,
    segment_columns,
)
from cleanerd.records.compiled_encoders import compress_areas
from cleanerd.records.control import control_type_column, control_types_at
from cleanerd.records.crc import crc32c_at
from cleanerd.records.header import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_MASK,
    CONTROL_MASK,
    CRC_OFFSET,
    DELETE_HORIZON_MASK,
    INT32_MAX,
    LEGACY_V0_MIN_SIZE,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    MAX_TIMESTAMP_OFFSET,
    PREFIX_SIZE,
    PRODUCER_EPOCH_OFFSET,
    PRODUCER_ID_OFFSET,
    RECORD_BATCH_OVERHEAD,
    RECORDS_COUNT_OFFSET,
    TRANSACTIONAL_MASK,
    BatchHeader,
    Buffer,
    Compression,
    TimestampType,
)
from cleanerd.records.prefetch import prefetch
from cleanerd.records.record import Record
from cleanerd.records.walker import (
    DECODE_WINDOW_BYTES,
    BatchWindows,
    OffsetRange,
    Window,
    in_range,
    next_range,
    offset_error,
    offsets_at,
)

WRITE_BUFFER_BYTES: Final = 8 * 1024 * 1024
CACHE_BYTES: Final = 128 * 1024 * 1024
"""Decoded windows kept from the map build for the copy. Past this, decoding a window
again costs less than the memory: a 1 GiB segment of 1-record batches (64 MiB windows)
cleaned in 6.8 s with 128 MiB (peak 486 MB), 7.4 s with 512 MiB (880 MB), 7.3 s with
none (425 MB)."""
_PASS_RECORD_BYTES: Final = 4 * 8 + 16 + 16  # _Columns' columns, key hash, put slots
DECODE_AHEAD: Final = 2
"""Windows of a segment decoded ahead of their use, each in a thread of its own (the
pass's caller, with them, keeps both cores of a 2-core host busy); at most that many
windows' memory beyond `CACHE_BYTES`."""
DAY_MS: Final = 86_400_000


class CleaningAborted(CleanerdError):
    """The pass was asked to stop (shutdown, pause); nothing was changed."""

    requested: bool = True
    """Asked for (a stop), rather than the engine failing the pass with nothing changed
    (a subclass): only the latter is a failure to report."""

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
    max_cleaned_segment_bytes: int = INT32_MAX
    """An output segment is continued in a new one before it would grow past this
    (Kafka trunk's maxCleanedSegmentSize; positions in an index are int32)."""
    max_cleaned_offset_range: int = INT32_MAX
    """... or before a batch's last offset would lie more than this above its base
    (maxCleanedOffsetRange; offsets in an index are int32, relative to the base)."""

    def output_limits(self) -> OutputLimits:
        """What one output segment may hold."""
        return OutputLimits(
            max_segment_bytes=self.max_cleaned_segment_bytes,
            max_offset_range=self.max_cleaned_offset_range,
            max_index_size=self.max_index_size,
            index_interval_bytes=self.index_interval_bytes,
        )


@dataclass(frozen=True, slots=True)
class CleanResult:
    """What a pass did: the new first dirty offset, its stats, the files to unlink later."""

    first_dirty: int
    end_offset: int
    stats: CleanerStats
    deleted_files: tuple[Path, ...]
    cleaned: tuple[CleanedGroup, ...] = ()
    """The `.cleaned` output awaiting `Cleaner.install` (a pass run with install=False)."""
    ran_out_of_space: bool = False
    """The disk ran full during the pass, which went on once the files its earlier
    groups had replaced were unlinked at once (`_clean_group_or_free_space`)."""


@dataclass(frozen=True, slots=True)
class CleanedGroup:
    """One group's `<base>.*.cleaned` output: what replaces `old_bases`, and what a
    verifier checks it against (records and bytes written). An output that overflowed
    one segment continued in further segments, based at `split_bases`."""

    base: int
    next_offset: int
    old_bases: tuple[int, ...]
    records: int
    size_bytes: int
    split_bases: tuple[int, ...] = ()

    @property
    def bases(self) -> tuple[int, ...]:
        """Base offsets of every output segment, ascending."""
        return (self.base, *self.split_bases)


class RetentionOracle(Protocol):
    """Whether each keyed record survives deduplication: the copy phase's only input that
    depends on how the winners were found (the local `OffsetMap`, or the Spark engine's
    precomputed per-segment keep bitmaps)."""

    @property
    def latest_offset(self) -> int:
        """The last offset decided; records past it are kept (the pass ends after it)."""
        ...

    def keep_keyed(
        self,
        base_offset: int,
        first_keyed: int,
        offsets: NDArray[np.int64],
        hashes: Callable[[], NDArray[np.uint64]],
        *,
        final: bool,
    ) -> NDArray[np.bool_]:
        """For keyed records of segment `base_offset` (its keyed records from the
        `first_keyed`-th on, in row order: their `offsets`, their key hashes on demand;
        `final` when they are its last ones): whether each one is not superseded. Only
        the answers for data records at or below `latest_offset` are used."""
        ...


@dataclass(frozen=True, slots=True)
class _MapOracle:
    """The local pass's oracle: the offset map just built."""

    offset_map: OffsetMap
    put_slots: dict[tuple[int, int], tuple[NDArray[np.int64], NDArray[np.int64], int]]
    """(Segment base, first keyed record) -> (offsets, map slots, the map's generation)
    of the records the map build put from that window of it. When those are exactly the
    keyed records asked about (a window wholly in the dirty range) and the map has not
    grown since, the answer is read from their slots: no hashing, no probing."""

    @property
    def latest_offset(self) -> int:
        return self.offset_map.latest_offset

    def keep_keyed(
        self,
        base_offset: int,
        first_keyed: int,
        offsets: NDArray[np.int64],
        hashes: Callable[[], NDArray[np.uint64]],
        *,
        final: bool,
    ) -> NDArray[np.bool_]:
        if not offsets.size:
            return np.ones(0, np.bool_)
        put = self.put_slots.pop((base_offset, first_keyed), None)
        if (
            put is not None
            and put[2] == self.offset_map.generation
            and np.array_equal(put[0], offsets)
        ):
            return self.offset_map.keep_slots(put[1], offsets)
        return self.offset_map.keep_mask(hashes(), offsets)


# ---------------------------------------------------------------------------------------
# A segment read for a pass.


@dataclass(slots=True)
class _Columns:
    """A window of a segment (`raw[start:end]`, whole batches) as columns
    (`cleanerd.records.columns`) with every record in one buffer
    (`segment_reader.join_buffers`), so a kernel needs a single buffer."""

    raw: Buffer
    path: Path
    """The segment file, which errors found in the columns name."""
    start: int
    end: int
    sc: SegmentColumns
    joined: JoinedBuffer
    batch_of: NDArray[np.int64]
    record_end: NDArray[np.int64]
    """Where each record ends in the joined buffer."""
    offsets: NDArray[np.int64]
    """Record offsets, contiguous (the record table's columns are strided)."""
    keyed: NDArray[np.int64]
    """Rows of the records with a key."""
    memory_bytes: int
    """What the decoded window holds in memory besides the mapped file: the side buffer
    (and the joined buffer), the batch and record tables, the pass's own per-record
    columns, the key hashes and map slots (counted for the cache budget; reckoned once,
    the hashes and slots ahead of their making, as the cache reads it several times)."""
    _hashes: NDArray[np.uint64] | None = None

    def hashes(self, rows: NDArray[np.int64]) -> NDArray[np.uint64]:
        """Key hashes of the keyed records `rows` (ascending); every key of the segment
        is hashed once per pass, on first use."""
        if self._hashes is None:
            self._hashes = hash_record_keys(self.joined.buf, self.joined.key_pos, self.sc.key_len)
        if rows.size == self.records:  # every record, in order
            return self._hashes
        return self._hashes[rows]

    @property
    def nbytes(self) -> int:
        """The window's bytes in the segment."""
        return self.end - self.start

    def select(self, rows: NDArray[np.int64], column: NDArray[np.int64]) -> NDArray[np.int64]:
        """`column[rows]`, without a copy when `rows` is every record."""
        return column if rows.size == self.records else column[rows]

    @property
    def batches(self) -> int:
        return self.sc.num_batches

    @property
    def records(self) -> int:
        return self.sc.num_records

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


def _decode_ahead(raw: Buffer, window: Window, path: Path, *, verify_crc: bool) -> _Columns:
    """`_read_columns`, its keys hashed too: the work `Cleaner._windows` gives its
    decode threads."""
    c = _read_columns(raw, window, path, verify_crc=verify_crc)
    c.hashes(c.keyed)
    return c


def _read_columns(raw: Buffer, window: Window, path: Path, *, verify_crc: bool) -> _Columns:
    """Decode `window` of a segment; a CorruptRecordError names `path` and the byte
    position in it."""
    start, end, ranges = window
    try:
        sc = segment_columns(raw, start=start, end=end, verify_crc=verify_crc, offsets=ranges)
    except CorruptRecordError as exc:
        raise exc.located(path) from exc
    joined = join_buffers(sc)
    n = sc.num_records
    batch_of, record_end, offsets, keyed = (
        np.empty(n, np.int64),
        np.empty(n, np.int64),
        np.empty(n, np.int64),
        np.empty(n, np.int64),
    )
    keyed_count = _record_columns(
        sc.batch_index, joined.record_pos, sc.record_size, sc.offset, sc.key_len,
        batch_of, record_end, offsets, keyed,
    )  # fmt: skip
    joined_bytes = joined.buf.nbytes if joined.copied else 0
    return _Columns(
        raw=raw,
        path=path,
        start=start,
        end=end,
        sc=sc,
        joined=joined,
        batch_of=batch_of,
        record_end=record_end,
        offsets=offsets,
        keyed=keyed[:keyed_count],
        memory_bytes=sc.side.nbytes + joined_bytes + sc.table_bytes + n * _PASS_RECORD_BYTES,
    )


@jit
def _record_columns(
    batch_index: NDArray[np.int32],
    record_pos: NDArray[np.int64],
    record_size: NDArray[np.int32],
    offset: NDArray[np.int64],
    key_len: NDArray[np.int32],
    batch_of: NDArray[np.int64],
    record_end: NDArray[np.int64],
    offsets: NDArray[np.int64],
    keyed: NDArray[np.int64],
) -> int:
    """The per-record columns the pass reads, contiguous, in one walk over the record
    table (whose columns are strided); returns how many records have a key."""
    k = 0
    for i in range(batch_index.shape[0]):
        batch_of[i] = batch_index[i]
        record_end[i] = record_pos[i] + record_size[i]
        offsets[i] = offset[i]
        if key_len[i] >= 0:
            keyed[k] = i
            k += 1
    return k


_HEAD_COLUMNS: Final = 8  # position, size, pid, epoch, last offset, max ts, attrs, count


@jit
def _producer_headers(
    buf: NDArray[np.uint8], start: int, end: int, low: Int, base: Int, high: Int, span: Int
) -> tuple[NDArray[np.int64], int, bool, Int, Int]:
    """One column per field, one entry per v2 batch of `buf[start:end]` with a producer
    id (legacy entries are stepped over; the walk stops at the first incomplete entry):
    position, size, producer id and epoch, last offset, max timestamp, attributes,
    record count. Every batch's offsets are checked against the range (`low`, `base`,
    `high`, `span`: see `OffsetRange`), as every walk of a segment checks them: the
    producer state is read from batches no decode of the pass reaches (the uncleanable
    end of the log). Returns the columns, the position the walk stopped at, whether it
    stopped at a batch outside the range, and the range's `low` and `high` there. The
    columns are sized for the most batches the span can hold, which costs address space
    only: pages past the last batch found are never touched."""
    cols = np.empty((_HEAD_COLUMNS, (end - start) // RECORD_BATCH_OVERHEAD + 1), np.int64)
    at = bytes_address(buf)
    n = 0
    p = start
    while end - p >= PREFIX_SIZE:
        prefetch(at, p, end)
        size = LOG_OVERHEAD + int(be_i32(at, p + LENGTH_OFFSET))
        if size < LEGACY_V0_MIN_SIZE or size > end - p:  # below every format's minimum
            break
        m = buf[p + MAGIC_OFFSET]
        if m == 2 and size < RECORD_BATCH_OVERHEAD:  # not a batch: the decode says so
            p += size
            continue
        first, delta = offsets_at(at, p, m)
        if not in_range(m, first, delta, low, base, high, span):
            return cols[:, :n], p, True, low, high
        low, high = next_range(first + delta, low, high)
        if m == 2:
            pid = be_i64(at, p + PRODUCER_ID_OFFSET)
            if pid >= 0:
                cols[0, n] = p
                cols[1, n] = size
                cols[2, n] = pid
                cols[3, n] = be_i16(at, p + PRODUCER_EPOCH_OFFSET)
                cols[4, n] = first + delta
                cols[5, n] = be_i64(at, p + MAX_TIMESTAMP_OFFSET)
                cols[6, n] = be_i16(at, p + ATTRIBUTES_OFFSET)
                cols[7, n] = be_i32(at, p + RECORDS_COUNT_OFFSET)
                n += 1
        p += size
    return cols[:, :n], p, False, low, high


def _producer_columns(raw: Buffer, window: Window, path: Path) -> ProducerColumns:
    """The producer columns of the batches with a producer id of `window` of the segment
    `path`; a CorruptRecordError names the file and the position of a batch whose
    offsets are outside the window's range."""
    data = np.frombuffer(raw, dtype=np.uint8)
    heads, stop, bad, low, high = _producer_headers(
        data, window.start, window.end, *window.offsets.bounds
    )
    if bad:
        walked = stop > window.start
        after = window.offsets.after(int(low), int(high), walked)
        raise offset_error(data, stop, after).located(path)
    attributes = heads[6]
    is_control = (attributes & CONTROL_MASK) != 0
    types = np.zeros(heads.shape[1], np.int64)
    if is_control.any():
        rows = np.flatnonzero(is_control)
        types[rows] = control_types_at(raw, *(heads[k, rows] for k in (0, 1, 6, 7)))
    # Copies: views would keep the columns' whole address space for as long as the
    # producer state builder keeps this window's batches.
    return ProducerColumns(
        producer_id=heads[2].copy(),
        producer_epoch=heads[3].copy(),
        last_offset=heads[4].copy(),
        max_timestamp=heads[5].copy(),
        is_transactional=(attributes & TRANSACTIONAL_MASK) != 0,
        is_control=is_control,
        control_type=types,
    )


# ---------------------------------------------------------------------------------------
# Writing a cleaned segment.


def _output_chunks(
    c: _Columns,
    actions: NDArray[np.int64],
    keep: NDArray[np.bool_],
    kept: NDArray[np.int64],
    kept_bytes: NDArray[np.int64],
    horizons: NDArray[np.int64],
) -> Iterator[OutputChunk]:
    """The cleaned batches of segment `c`, in chunks of about `WRITE_BUFFER_BYTES`,
    written by `assemble_chunk`. Python prepares only what needs a library: the
    compressed records areas of compressed batches to re-encode (one codec call per
    batch), and the rare whole batches (empty headers, legacy entries); afterwards the
    CRCs of the batches the kernel headed (one C call per batch)."""
    sc = c.sc
    reencode = actions == WriteAction.REENCODE
    compressed = (sc.attributes & COMPRESSION_MASK) != 0
    plain = reencode & (sc.batch_magic == 2) & ~compressed
    packed = np.flatnonzero(reencode & (sc.batch_magic == 2) & compressed)
    legacy = reencode & (sc.batch_magic < 2)
    whole = np.flatnonzero((actions == WriteAction.EMPTY_HEADER) | legacy)
    prebuilt = np.full((c.batches, 4), -1, dtype=np.int64)
    bodies, body_lengths = _compressed_bodies(c, packed, keep, horizons)
    prebuilt[packed, 3] = PREBUILT_BODY
    pieces = []
    for i in whole.tolist():
        batch, prebuilt[i, 2] = _whole_batch(c, i, keep, actions)
        pieces.append(batch)
    prebuilt[whole, 3] = PREBUILT_BATCH
    rows = np.concatenate([packed, whole])
    lengths = np.concatenate([body_lengths, np.array([len(b) for b in pieces], np.int64)])
    prebuilt[rows, 1] = np.cumsum(lengths)
    prebuilt[rows, 0] = prebuilt[rows, 1] - lengths
    blob = (
        bodies
        if not pieces
        else np.concatenate([bodies, np.frombuffer(b"".join(pieces), np.uint8)])
    )
    bound = np.where(actions == WriteAction.COPY, sc.batch_size, 0)
    bound[plain] = RECORD_BATCH_OVERHEAD + kept_bytes[plain] + 16 * kept[plain]
    bound[rows] = lengths
    bound[packed] += RECORD_BATCH_OVERHEAD
    heads: BatchHeads = (
        sc.base_offset,
        sc.partition_leader_epoch,
        sc.attributes,
        sc.last_offset_delta,
        sc.max_timestamp,
        sc.producer_id,
        sc.producer_epoch,
        sc.base_sequence,
        sc.batch_position,
        sc.batch_size,
        sc.batch_first_record,
        sc.records_count,
    )
    ends = np.cumsum(bound)
    b0 = 0
    while b0 < c.batches:
        before = int(ends[b0 - 1]) if b0 else 0
        b1 = max(int(np.searchsorted(ends, before + WRITE_BUFFER_BYTES, side="right")), b0 + 1)
        out = np.empty(int(ends[b1 - 1]) - before, dtype=np.uint8)
        table = np.empty((b1 - b0, 4), dtype=np.int64)
        crc_rows = np.empty(b1 - b0, dtype=np.int64)
        size, n, n_crc = (
            int(x)
            for x in assemble_chunk(
                sc.segment,
                c.joined.buf,
                b0,
                b1,
                actions,
                heads,
                horizons,
                keep,
                c.joined.record_pos,
                c.record_end,
                c.timestamps,
                prebuilt,
                blob,
                out,
                table,
                crc_rows,
            )
        )
        b0 = b1
        if not n:
            continue
        _fill_crcs(out, table[:n, 0], crc_rows[:n_crc])
        yield OutputChunk(
            data=out[:size],
            end=table[:n, 0],
            base_offset=table[:n, 1],
            last_offset=table[:n, 2],
            max_timestamp=table[:n, 3],
        )


def _kept_per_batch(
    batch_of: NDArray[np.int64],
    keep: NDArray[np.bool_],
    value_len: NDArray[np.int32],
    record_size: NDArray[np.int32],
    batches: int,
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Per batch: kept records, kept tombstones and the kept records' bytes (one walk)."""
    # Allocated here: a kernel that allocates makes numba import its array module.
    counts = np.zeros((3, batches), dtype=np.int64)
    _count_kept(batch_of, keep, value_len, record_size, counts)
    return counts[0], counts[1], counts[2]


@jit
def _count_kept(
    batch_of: NDArray[np.int64],
    keep: NDArray[np.bool_],
    value_len: NDArray[np.int32],
    record_size: NDArray[np.int32],
    counts: NDArray[np.int64],
) -> None:
    for i in range(keep.shape[0]):
        if keep[i]:
            b = batch_of[i]
            counts[0, b] += 1
            counts[2, b] += record_size[i]
            if value_len[i] < 0:
                counts[1, b] += 1


def _fill_crcs(out: NDArray[np.uint8], ends: NDArray[np.int64], rows: NDArray[np.int64]) -> None:
    """Compute the CRC of the output batches `rows` (ending at `ends`) in place."""
    if not rows.size:
        return
    starts = np.concatenate([[0], ends[:-1]])[rows]
    _crc_fill(out, starts, ends[rows])


@jit
def _crc_fill(out: NDArray[np.uint8], starts: NDArray[np.int64], ends: NDArray[np.int64]) -> None:
    """Write each batch's CRC-32C (of [attributes, end)) into its CRC field, big-endian."""
    base = bytes_address(out)
    for i in range(starts.shape[0]):
        covered = starts[i] + ATTRIBUTES_OFFSET
        crc = crc32c_at(base + covered, ends[i] - covered)
        p = starts[i] + CRC_OFFSET
        out[p] = (crc >> 24) & 0xFF
        out[p + 1] = (crc >> 16) & 0xFF
        out[p + 2] = (crc >> 8) & 0xFF
        out[p + 3] = crc & 0xFF


def _compressed_bodies(
    c: _Columns, batches: NDArray[np.int64], keep: NDArray[np.bool_], horizons: NDArray[np.int64]
) -> tuple[NDArray[np.uint8], NDArray[np.int64]]:
    """The records areas of the compressed v2 batches `batches` (ascending) holding only
    their kept records, timestamp deltas taken against the batch's new base timestamp
    (its delete horizon, else its first kept record's timestamp, as `assemble_chunk`
    heads it), compressed with the batch's codec, back to back, and each one's size. One
    kernel call rewrites the records of all of them, one compresses them
    (`compress_areas`)."""
    if not batches.size:
        return np.empty(0, np.uint8), np.empty(0, np.int64)
    wanted = np.zeros(c.batches, dtype=np.bool_)
    wanted[batches] = True
    records = np.flatnonzero(keep & wanted[c.batch_of])
    owner = c.batch_of[records]
    starts = np.searchsorted(owner, batches)
    ends = np.searchsorted(owner, batches, side="right")
    ts = c.timestamps[records]
    horizon = horizons[batches]
    base_ts = np.where(horizon != NO_HORIZON, horizon, ts[starts])
    positions, record_end = c.joined.record_pos[records], c.record_end[records]
    area = np.empty(int((record_end - positions).sum()) + 16 * records.size, np.uint8)
    written = np.empty(records.size, dtype=np.int64)
    rewrite_records(
        c.joined.buf, positions, record_end, ts - np.repeat(base_ts, ends - starts), area, written
    )
    stops = written[ends - 1]
    begins = np.concatenate([np.zeros(1, np.int64), stops[:-1]])
    codecs = (c.sc.attributes[batches] & COMPRESSION_MASK).astype(np.int64)
    return compress_areas(area, begins, stops, codecs)


def _whole_batch(
    c: _Columns, i: int, keep: NDArray[np.bool_], actions: NDArray[np.int64]
) -> tuple[bytes, int]:
    """(bytes, max timestamp) of batch `i` written whole in Python: its empty header, or
    a legacy entry re-encoded with its kept records."""
    if actions[i] == WriteAction.EMPTY_HEADER:
        return _empty_header(c, i), int(c.sc.max_timestamp[i])
    first = int(c.sc.batch_first_record[i])
    rows = first + np.flatnonzero(keep[first : first + int(c.sc.records_count[i])])
    return _legacy_as_v2(c, i, rows)


def _legacy_as_v2(c: _Columns, i: int, kept: NDArray[np.int64]) -> tuple[bytes, int]:
    """Kept records of a legacy (magic 0/1) entry, written as one v2 batch with the same
    codec and offsets: cleanerd reads legacy message sets but never writes them."""
    sc = c.sc

    def part(pos: int, length: int) -> bytes | None:
        return None if length < 0 else c.joined.buf[pos : pos + length].tobytes()

    records = [
        Record(
            int(sc.offset[j]),
            int(sc.timestamp[j]),
            part(int(c.joined.key_pos[j]), int(sc.key_len[j])),
            part(
                int(sc.value_pos[j]) + c.joined.shift(int(sc.buffer_id[j])),
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
        timestamp_type=TimestampType.of(attributes),
    )
    return batch, max(r.timestamp for r in records)


# ---------------------------------------------------------------------------------------
# The pass.


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _empty_header(c: _Columns, i: int) -> bytes:
    """The 61-byte empty batch keeping batch `i`'s offsets and producer fields."""
    if c.is_v2(i):
        return empty_batch_of(c.header(i))
    return encode_empty_batch(
        base_offset=int(c.sc.base_offset[i]),
        last_offset_delta=int(c.sc.last_offset_delta[i]),
        max_timestamp=int(c.sc.max_timestamp[i]),
    )


def _track_flagged(
    c: _Columns, tracker: TransactionTracker
) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
    """The transactional and control batches of `c`, and the tracker's verdict on each
    (whether it may be discarded), in one tracker call."""
    attributes = c.sc.attributes
    flagged = np.flatnonzero(attributes & (CONTROL_MASK | TRANSACTIONAL_MASK))
    if not flagged.size:
        return flagged, np.zeros(0, np.bool_)
    is_control = (attributes[flagged] & CONTROL_MASK) != 0
    try:
        types = control_type_column(c.sc)
    except CorruptRecordError as exc:
        raise exc.located(c.path) from exc
    verdicts = tracker.on_batches(
        producer_id=c.sc.producer_id[flagged],
        is_control=is_control,
        is_transactional=np.ones(flagged.size, np.bool_),
        control_type=types[flagged],
        last_offset=c.last_offsets()[flagged],
    )
    return flagged, verdicts


def _horizons(c: _Columns) -> NDArray[np.int64]:
    """Per batch: its delete horizon (its base timestamp when it has one) or NO_HORIZON."""
    flag = (c.sc.attributes & DELETE_HORIZON_MASK) != 0
    horizons: NDArray[np.int64] = np.where(flag, c.sc.base_timestamp, NO_HORIZON)
    return horizons


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
    proof: SwapProof
    aborted: list[AbortedTxn] = field(default_factory=list)
    legacy_delete_horizon_ms: int = 0
    cache: dict[tuple[int, int], _Columns] = field(default_factory=dict)
    """Decoded windows kept from the map build for the copy, by (segment base, start)."""
    cached_bytes: int = 0
    verified: set[tuple[int, int]] = field(default_factory=set)
    """The windows (segment base, start) whose CRCs this pass has checked."""
    producers: ActiveProducers = field(default_factory=lambda: ActiveProducers.of({}))
    oracle: RetentionOracle | None = None
    put_slots: dict[tuple[int, int], tuple[NDArray[np.int64], NDArray[np.int64], int]] = field(
        default_factory=dict
    )
    """For `_MapOracle`: the map slots of the records put from each cached window."""
    mapped: dict[int, tuple[Buffer, BatchWindows]] = field(default_factory=dict)
    """Segment base -> its mapping and windows (`BatchWindows`), from the producer-state
    walk until the segment is copied: faulting a mapping's pages in costs about as much
    as the walk, so each is faulted in once."""
    deleted: list[Path] = field(default_factory=list)
    """The `.deleted` files of the groups swapped so far."""
    no_space: bool = False
    """The disk ran full during this pass: from then on each group's `.deleted` files
    are unlinked right after its swap instead of after `file.delete.delay.ms`."""
    decoders: ThreadPoolExecutor | None = None
    """The threads that decode windows ahead (`Cleaner._windows`), started on first use
    and stopped when the pass ends."""

    def decode_ahead(
        self, raw: Buffer, window: Window, path: Path, *, verify_crc: bool
    ) -> Future[_Columns]:
        if self.decoders is None:
            self.decoders = ThreadPoolExecutor(DECODE_AHEAD, thread_name_prefix="cleaner-decode")
        return self.decoders.submit(_decode_ahead, raw, window, path, verify_crc=verify_crc)

    def offsets(self, seg: SegmentMeta) -> OffsetRange:
        """The offsets `seg`'s batches may have (`segment_offsets`)."""
        i = bisect_left(self.segments, seg.base_offset, key=attrgetter("base_offset"))
        return segment_offsets(self.segments, i)


class Cleaner:
    """Runs compaction passes with one offset map (Kafka gives each cleaner thread one).

    Args:
        offset_map: the map, cleared at the start of every pass; None for a cleaner
            that is always given the pass's `RetentionOracle`.
        throttler: the shared I/O throttle; None for no limit.
        ops: the file operations (tests inject failures and crashes here).
        clock_ms: a monotonic millisecond clock for the statistics.
        should_abort: polled before each segment is mapped or copied; when it returns
            True the pass stops with CleaningAborted, its output removed (Kafka's
            checkDone), before any swap of the group in progress.
    """

    def __init__(
        self,
        offset_map: OffsetMap | None,
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
        oracle: RetentionOracle | None = None,
        install: bool = True,
        owner: OwnerProof | None = None,
    ) -> CleanResult:
        """Clean [first_dirty, first_uncleanable) of the partition `tp` under `log_dir`,
        whose segments (ascending, the active one last) are `segments`; swap the result
        in (holding `swap_lock`, the partition lock, for the renames only) and move the
        cleaner checkpoint to the returned end offset.

        Before every swap and the checkpoint move the pass proves under the lock that it
        may (`SwapProof`: `owner` still holds the log dir, the segments are the files it
        read, the checkpoint entry has not moved); otherwise it raises a StaleWork error
        and changes nothing more. A failure after some groups were swapped carries their
        `.deleted` files (`swapped_files`).

        With an `oracle` the map is not built: the oracle decides the keyed records and
        the pass ends after its `latest_offset`. With `install=False` the `.cleaned`
        output is only written and listed in `CleanResult.cleaned`, for `install`.
        """
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
            proof=SwapProof(log_dir, tp, tuple(segments), cleaner_offset(log_dir, tp), owner),
        )
        # Proven once before anything is written, so a pass planned on a state that is
        # already gone (or for an owner that is) does no work and removes nothing.
        p.proof.verify()
        remove_stale_cleaned(p.dir_path, self.ops)
        try:
            return self._clean(p, oracle, install=install)
        except BaseException as exc:
            if p.deleted:
                exc.cleanerd_deleted_files = tuple(p.deleted)  # type: ignore[attr-defined]
            raise
        finally:
            if p.decoders is not None:
                p.decoders.shutdown(cancel_futures=True)

    def _clean(self, p: _Pass, oracle: RetentionOracle | None, *, install: bool) -> CleanResult:
        p.aborted = load_aborted(p.dir_path, p.segments)
        clean_section = [s for s in p.segments if s.base_offset < p.first_dirty]
        if clean_section:
            p.legacy_delete_horizon_ms = (
                clean_section[-1].last_modified_ms - p.config.delete_retention_ms
            )
        p.producers = self._producer_state(p)
        if oracle is None:
            if self.offset_map is None:
                raise ValueError("a cleaner without an offset map needs a retention oracle")
            end_offset = self._build_offset_map(p, self.offset_map)
            if self.offset_map.versioned:
                self._update_from_clean_section(p, self.offset_map)
            p.stats.buffer_utilization = self.offset_map.utilization
            oracle = _MapOracle(self.offset_map, p.put_slots)
        else:
            end_offset = oracle.latest_offset + 1
        p.oracle = oracle
        p.stats.map_complete_ms = self.clock_ms()
        to_clean = [s for s in p.segments if s.base_offset < end_offset]
        groups = group_segments_by_size(
            to_clean,
            max_size=p.config.segment_bytes,
            max_index_size=p.config.max_index_size,
            first_uncleanable_offset=p.first_uncleanable,
        )
        tracker = TransactionTracker()
        cleaned: list[CleanedGroup] = []
        for group in groups:
            output, tracker = self._clean_group_or_free_space(p, group, tracker)
            if install:
                self._swap(p.dir_path, output, p.swap_lock, p.proof, p.deleted)
                if p.no_space:
                    self._unlink_now(p.deleted)
            else:
                cleaned.append(output)
        if install:
            self._write_checkpoint(p.proof.log_dir, p.tp, end_offset, p.proof)
        stats = p.stats.freeze(self.clock_ms())
        return CleanResult(
            p.first_dirty, end_offset, stats, tuple(p.deleted), tuple(cleaned), p.no_space
        )

    def _clean_group_or_free_space(
        self, p: _Pass, group: list[SegmentMeta], tracker: TransactionTracker
    ) -> tuple[CleanedGroup, TransactionTracker]:
        """`_clean_group`, and the tracker to go on with. When the disk runs full, the
        `.deleted` files of this pass's earlier groups (which only wait for readers) are
        unlinked at once and the group is written once more, from the tracker and
        statistics it started with; a second full disk fails the pass."""
        before, stats_before = copy.deepcopy(tracker), dataclasses.replace(p.stats)
        try:
            return self._clean_group(p, group, tracker), tracker
        except FileStepError as exc:
            if not exc.no_space or not any(path.exists() for path in p.deleted):
                raise
        p.no_space = True
        self._unlink_now(p.deleted)
        p.stats = stats_before
        return self._clean_group(p, group, before), before

    def _unlink_now(self, deleted: list[Path]) -> None:
        for path in deleted:
            if path.exists():
                with file_step("unlinking a replaced segment under disk pressure", path):
                    self.ops.unlink(path)

    def install(
        self,
        *,
        log_dir: Path,
        tp: TopicPartition,
        cleaned: Sequence[CleanedGroup],
        end_offset: int,
        proof: SwapProof,
        swap_lock: AbstractContextManager[object] | None = None,
    ) -> tuple[Path, ...]:
        """Swap in the verified output of a pass run with install=False, group by group,
        each after `proof` (the snapshot the pass was planned on), then move the cleaner
        checkpoint to `end_offset`; returns the `.deleted` files."""
        deleted: list[Path] = []
        try:
            for output in cleaned:
                self._swap(log_dir / str(tp), output, swap_lock or nullcontext(), proof, deleted)
            self._write_checkpoint(log_dir, tp, end_offset, proof)
        except BaseException as exc:
            if deleted:
                exc.cleanerd_deleted_files = tuple(deleted)  # type: ignore[attr-defined]
            raise
        return tuple(deleted)

    # -- reading ------------------------------------------------------------------------

    def _segment(self, p: _Pass, seg: SegmentMeta) -> tuple[Buffer, BatchWindows]:
        """The mapped `.log` of `seg` and its windows, mapped and cut once per pass."""
        found = p.mapped.get(seg.base_offset)
        if found is None:
            path = log_file(p.dir_path, seg.base_offset)
            raw = map_segment(path, seg, active=seg is p.segments[-1])
            windows = BatchWindows(raw, DECODE_WINDOW_BYTES, p.offsets(seg))
            found = p.mapped[seg.base_offset] = (raw, windows)
        return found

    def _windows(self, p: _Pass, seg: SegmentMeta, *, keep: bool) -> Iterator[_Columns]:
        """`seg` decoded a window at a time (see `_columns`). The next `DECODE_AHEAD`
        windows not cached are decoded ahead, in the pass's decode threads, while the
        caller works on this one: decoding (CRCs, the record table, key hashes) is most
        of a map build, and its kernels release the GIL. Each is still used, checked and
        counted in order, here: what a window raises is raised when its turn comes."""
        raw, windows = self._segment(p, seg)
        path = log_file(p.dir_path, seg.base_offset)
        ahead: dict[int, Future[_Columns]] = {}
        try:
            for i, window in enumerate(windows):
                for j in range(i + 1, i + 1 + DECODE_AHEAD):
                    later = windows.get(j)
                    if later is None:
                        break
                    key = (seg.base_offset, later[0])
                    if j not in ahead and key not in p.cache:
                        verify = key not in p.verified
                        ahead[j] = p.decode_ahead(raw, later, path, verify_crc=verify)
                decoded = ahead.pop(i, None)
                yield self._columns(p, seg, raw, window, keep=keep, decoded=decoded)
        finally:
            for future in ahead.values():
                future.cancel()

    def _columns(
        self,
        p: _Pass,
        seg: SegmentMeta,
        raw: Buffer,
        window: Window,
        *,
        keep: bool,
        decoded: Future[_Columns] | None = None,
    ) -> _Columns:
        """A decoded window of `seg` (`decoded`: decoding ahead); decoded once per pass
        while the cache budget allows, `keep` leaving it cached for a later phase. CRCs
        are checked the first time a window is read in the pass (a segment file is never
        modified, only replaced)."""
        if self.should_abort is not None and self.should_abort():
            raise CleaningAborted(p.tp)
        key = (seg.base_offset, window[0])
        c = p.cache.pop(key, None)
        if c is None:
            self._throttle(p, window[1] - window[0])
            if decoded is not None:
                c = decoded.result()
            else:
                path = log_file(p.dir_path, seg.base_offset)
                c = _read_columns(raw, window, path, verify_crc=key not in p.verified)
            p.verified.add(key)
        else:
            p.cached_bytes -= c.memory_bytes
        if keep and p.cached_bytes + c.memory_bytes <= CACHE_BYTES:
            p.cache[key] = c
            p.cached_bytes += c.memory_bytes
        return c

    def _producer_state(self, p: _Pass) -> ActiveProducers:
        """The active producers at the end of the log: from the partition's latest
        producer snapshot (as a broker's state comes from one after a restart), then the
        batches after it; from every batch when there is no usable snapshot."""
        builder = ProducerStateBuilder()
        snapshot = latest_snapshot(
            p.dir_path,
            snapshot_offsets(p.dir_path),
            log_start=p.segments[0].base_offset,
            log_end=p.segments[-1].next_offset,
        )
        floor = 0
        if snapshot is not None:
            builder.add(ProducerColumns.of_snapshot(snapshot))
            floor = snapshot.offset
        for seg in p.segments:
            if seg.next_offset <= floor:
                continue  # every batch of it is in the snapshot
            raw, windows = self._segment(p, seg)
            for window in windows:
                columns = _producer_columns(raw, window, log_file(p.dir_path, seg.base_offset))
                builder.add(columns if seg.base_offset >= floor else columns.from_offset(floor))
            if seg.base_offset >= p.first_uncleanable:  # never decoded in this pass
                del p.mapped[seg.base_offset]
        return builder.result(now_ms=p.now_ms, expiration_ms=p.config.producer_id_expiration_ms)

    # -- map build ----------------------------------------------------------------------

    def _build_offset_map(self, p: _Pass, m: OffsetMap) -> int:
        """Fill the map from the dirty range; returns the round's end offset: the
        first uncleanable offset, or the offset after the last record put if the map
        filled first."""
        start, end = p.first_dirty, p.first_uncleanable
        m.clear(keys_at_most=max(0, end - start))
        tracker = TransactionTracker()
        for idx, seg in enumerate(p.segments):
            if seg.base_offset >= end:
                break
            upper = segment_upper(p.segments, idx, end)
            if upper <= start:
                continue
            tracker.add_aborted(aborted_between(p.aborted, seg.base_offset, upper))
            first_keyed = 0
            done = -1  # the last offset of the segment's batches wholly put so far
            for c in self._windows(p, seg, keep=True):
                put, rows = self._put_window(p, m, c, seg, upper, tracker, first_keyed)
                first_keyed += c.keyed.size
                p.stats.map_bytes_read += c.nbytes
                if put == rows.size:
                    p.stats.map_messages_read += c.records
                    if c.batches:
                        done = c.last_offset(c.batches - 1)
                    continue
                bi = c.batch_of
                stop_batch = int(bi[rows[put]])
                p.stats.map_messages_read += int(np.searchsorted(bi, stop_batch)) + int(
                    np.count_nonzero(bi[: rows[put]] == stop_batch)
                )
                if stop_batch > 0:
                    done = c.last_offset(stop_batch - 1)
                if done >= start:
                    m.update_latest_offset(max(m.latest_offset, done))
                return m.latest_offset + 1
            m.update_latest_offset(min(upper, end) - 1)
        # Every dirty segment was mapped whole (or the range is empty: a pass that only
        # re-copies the log, to drop tombstones and markers whose horizon has passed).
        m.update_latest_offset(max(m.latest_offset, end - 1))
        return end

    def _put_window(
        self,
        p: _Pass,
        m: OffsetMap,
        c: _Columns,
        seg: SegmentMeta,
        upper: int,
        tracker: TransactionTracker,
        first_keyed: int,
    ) -> tuple[int, NDArray[np.int64]]:
        """Put the keyed data records of window `c` in the dirty range into the map, in
        order, until it is full: (how many were put, the rows of those to put)."""
        start, end = p.first_dirty, p.first_uncleanable
        mappable = self._mappable_batches(c, tracker)
        rows = c.keyed
        if not mappable.all():
            rows = rows[mappable[c.batch_of[rows]]]
        if seg.base_offset < start or upper > end:
            offsets = c.offsets[rows]
            rows = rows[(offsets >= start) & (offsets < end)]
        versions, has = (
            segment_versions(p.config.strategy, c.sc, c.joined, rows)
            if m.versioned
            else (None, None)
        )
        offsets = c.select(rows, c.offsets)
        slots = np.empty(rows.size, np.int64)
        generation = m.generation
        put = int(m.put_many(c.hashes(rows), offsets, versions, has, slots=slots))
        # Budgeted with the window's columns; the slots of a put the map grew in are not
        # all where their keys now are.
        if (seg.base_offset, c.start) in p.cache and m.generation == generation:
            p.put_slots[(seg.base_offset, first_keyed)] = (offsets[:put], slots[:put], generation)
        return put, rows

    def _update_from_clean_section(self, p: _Pass, m: OffsetMap) -> None:
        """Let records below the dirty range beat the dirty winners of their keys (the
        timestamp and header strategies can prefer an older record). As in the map build,
        aborted data is no contender: it is discarded whatever its version, so a winner
        it beat would have been deleted with it."""
        tracker = TransactionTracker()
        for idx, seg in enumerate(p.segments):
            if seg.base_offset >= p.first_dirty:
                break
            upper = segment_upper(p.segments, idx, p.first_dirty)
            tracker.add_aborted(aborted_between(p.aborted, seg.base_offset, upper))
            for c in self._windows(p, seg, keep=True):
                data = self._mappable_batches(c, tracker)[c.batch_of]
                rows = np.flatnonzero(data & (c.sc.key_len >= 0) & (c.offsets < p.first_dirty))
                versions, has = segment_versions(p.config.strategy, c.sc, c.joined, rows)
                m.update_existing_many(c.hashes(rows), c.offsets[rows], versions, has)

    @staticmethod
    def _mappable_batches(c: _Columns, tracker: TransactionTracker) -> NDArray[np.bool_]:
        """Per batch: data that is not aborted (control batches only feed the tracker).
        Only transactional and control batches need the tracker; the tracker consumes
        aborted-transaction entries by offset, so skipping the others changes nothing."""
        mappable: NDArray[np.bool_] = np.asarray((c.sc.attributes & CONTROL_MASK) == 0)
        flagged, discardable = _track_flagged(c, tracker)
        mappable[flagged] &= ~discardable
        return mappable

    # -- copy ---------------------------------------------------------------------------

    def _clean_group(
        self, p: _Pass, group: list[SegmentMeta], tracker: TransactionTracker
    ) -> CleanedGroup:
        output = CleanedOutput(
            self.ops,
            p.dir_path,
            group[0].base_offset,
            p.config.output_limits(),
            like=log_file(p.dir_path, group[0].base_offset),
        )
        records_before = p.stats.messages_written
        try:
            # A group is consecutive segments of the pass (`group_segments_by_size`).
            first = next(i for i, s in enumerate(p.segments) if s is group[0])
            for idx, seg in enumerate(group, first):
                self._clean_segment(p, seg, idx, output, tracker)
            last_source = log_file(p.dir_path, group[-1].base_offset)
            output.finish(
                mtime_ns=last_source.stat().st_mtime_ns, aborted=tracker.drain_cleaned_index()
            )
        except BaseException:
            output.abandon()
            raise
        p.stats.bytes_written += output.size_bytes
        return CleanedGroup(
            base=output.bases[0],
            next_offset=output.next_offset,
            old_bases=tuple(s.base_offset for s in group),
            records=p.stats.messages_written - records_before,
            size_bytes=output.size_bytes,
            split_bases=output.bases[1:],
        )

    def _swap(
        self,
        dir_path: Path,
        output: CleanedGroup,
        swap_lock: AbstractContextManager[object],
        proof: SwapProof,
        deleted: list[Path],
    ) -> None:
        """Prove, then swap one group's output in; its `.deleted` files go to `deleted`.
        A failed proof removes the group's output first."""
        with swap_lock:
            try:
                proof.verify(from_base=output.old_bases[0])
            except BaseException:
                for base in output.bases:
                    remove_cleaned(dir_path, base, self.ops)
                raise
            deleted += replace_segments(
                dir_path,
                new_bases=output.bases,
                new_next_offset=output.next_offset,
                old_bases=list(output.old_bases),
                ops=self.ops,
            )

    def _throttle(self, p: _Pass, n: int) -> None:
        """Account `n` bytes read or written by pass `p` to the shared throttle, and stop
        the pass when it was to stop while its throttle slept."""
        if self.throttler is not None and n:
            self.throttler.maybe_throttle(n, self.should_abort)
            if self.should_abort is not None and self.should_abort():
                raise CleaningAborted(p.tp)

    def _clean_segment(
        self,
        p: _Pass,
        seg: SegmentMeta,
        idx: int,
        output: CleanedOutput,
        tracker: TransactionTracker,
    ) -> None:
        upper = segment_upper(p.segments, idx, p.first_uncleanable)
        tracker.add_aborted(aborted_between(p.aborted, seg.base_offset, upper))
        _, windows = self._segment(p, seg)
        first_keyed = 0
        for i, c in enumerate(self._windows(p, seg, keep=False)):
            final = windows.get(i + 1) is None  # found as the copy goes, not all first
            self._clean_window(p, seg, c, first_keyed, output, tracker, final=final)
            first_keyed += c.keyed.size
        del p.mapped[seg.base_offset]

    def _clean_window(
        self,
        p: _Pass,
        seg: SegmentMeta,
        c: _Columns,
        first_keyed: int,
        output: CleanedOutput,
        tracker: TransactionTracker,
        *,
        final: bool,
    ) -> None:
        p.stats.bytes_read += c.nbytes
        p.stats.messages_read += c.records
        decisions = self._batch_decisions(p, c, tracker)
        keep = self._keep_mask(p, c, seg, first_keyed, decisions, final=final)
        kept, kept_tombstone, kept_bytes = _kept_per_batch(
            c.batch_of, keep, c.sc.value_len, c.sc.record_size, c.batches
        )
        horizons = _horizons(c)
        actions, new_horizons = plan_batch_writes(
            decisions,
            kept=kept,
            total=c.sc.records_count.astype(np.int64),
            # A legacy entry has no delete horizon: its tombstones go by the segment's
            # mtime (Kafka's rule below magic 2), and one kept whole is copied as it is.
            kept_tombstone=(kept_tombstone > 0) & (c.sc.batch_magic == 2),
            delete_horizon_ms=horizons,
            now_ms=p.now_ms,
            delete_retention_ms=p.config.delete_retention_ms,
        )
        codes = np.asarray(actions, dtype=np.int64)
        for chunk in _output_chunks(c, codes, keep, kept, kept_bytes, new_horizons):
            self._throttle(p, output.append(chunk))
        p.stats.messages_written += int(kept[actions != WriteAction.SKIP].sum())

    def _batch_decisions(
        self, p: _Pass, c: _Columns, tracker: TransactionTracker
    ) -> BatchDecisions:
        """Batch-level outcomes, over the whole segment at once; only transactional and
        control batches go through the tracker (see `_mappable_batches` on skipping it
        for the others)."""
        sc = c.sc
        lasts = c.last_offsets()
        is_control = (sc.attributes & CONTROL_MASK) != 0
        discardable = np.zeros(c.batches, np.bool_)
        flagged, verdicts = _track_flagged(c, tracker)
        discardable[flagged] = verdicts
        is_last = p.producers.last_batch_mask(
            sc.producer_id, sc.producer_epoch.astype(np.int64), lasts, is_control
        )
        return decide_batches(
            is_control=is_control,
            is_last_of_producer=is_last & (sc.producer_id >= 0),
            next_offset=lasts + 1,
            upper_bound_offset=p.first_uncleanable,
            discardable=discardable,
            delete_horizon_ms=_horizons(c),
            now_ms=p.now_ms,
        )

    def _keep_mask(
        self,
        p: _Pass,
        c: _Columns,
        seg: SegmentMeta,
        first_keyed: int,
        decisions: BatchDecisions,
        *,
        final: bool,
    ) -> NDArray[np.bool_]:
        assert p.oracle is not None, "the oracle is set before the copy phase"
        keyed = c.keyed
        survives = np.ones(c.records, dtype=np.bool_)  # read for keyed records only
        if keyed.size or final:
            verdict = p.oracle.keep_keyed(
                seg.base_offset,
                first_keyed,
                c.select(keyed, c.offsets),
                lambda: c.hashes(keyed),
                final=final,
            )
            if keyed.size == c.records:
                survives = verdict
            else:
                survives[keyed] = verdict
        horizons = _horizons(c)
        retain_deletes = (horizons == NO_HORIZON) | (p.now_ms < horizons)
        # Legacy (magic 0/1) tombstones have no horizon: Kafka keeps them while their
        # segment is newer than the legacy delete horizon.
        legacy = c.sc.batch_magic < 2
        retain_deletes[legacy] = seg.last_modified_ms > p.legacy_delete_horizon_ms
        keep, invalid = keep_records(
            rec_batch=c.batch_of,
            rec_offset=c.offsets,
            rec_key_len=c.sc.key_len,
            rec_value_len=c.sc.value_len,
            rec_survives=survives,
            batch_discard=decisions.discard_records,
            batch_is_control=(c.sc.attributes & CONTROL_MASK) != 0,
            batch_retain_deletes=retain_deletes,
            latest_offset=p.oracle.latest_offset,
        )
        p.stats.invalid_messages_read += invalid
        return keep

    # -- checkpoint ---------------------------------------------------------------------

    def _write_checkpoint(
        self, log_dir: Path, tp: TopicPartition, end_offset: int, proof: SwapProof
    ) -> None:
        path = log_dir / CLEANER_OFFSET_CHECKPOINT
        with _CHECKPOINT_LOCK, file_step("writing the cleaner checkpoint", path):
            if proof.owner is not None:
                proof.owner.verify()
            proof.verify_checkpoint()
            # Entries of partitions whose dirs are gone are dropped, as Kafka does.
            OffsetCheckpointFile(path).rewrite(tp, end_offset, write=self.ops.atomic_write)


def swapped_files(exc: BaseException) -> tuple[Path, ...]:
    """The `.deleted` files of the groups that a failed pass (or install) had swapped in
    before it failed: to be unlinked like those of a finished pass."""
    files: tuple[Path, ...] = getattr(exc, "cleanerd_deleted_files", ())
    return files


_CHECKPOINT_LOCK: Final = threading.Lock()
