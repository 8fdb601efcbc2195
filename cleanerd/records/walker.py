"""The batch walker: every batch of a segment (or a byte range of one) as columns, in one
compiled call, CRC included.

Every batch, v2 or legacy, starts with ``offset int64 | length int32`` and has its magic
byte at position 16 (see `header.py` for the v2 layout, `legacy.py` for magic 0/1). The
kernel hops from batch to batch, applies the structural checks of `scan.py` (which
documents them and produces the error message for the batch that fails), checks each v2
batch's CRC-32C through `crc.py` (no Python per batch), checks its offsets against the
walk's `OffsetRange` (no CRC covers a base offset: offsets must not be negative, must
ascend, and must lie in the segment's range when the walk knows it), and writes the
header fields of every batch into a `BatchTable`. It stops at the first batch that
fails a check; `walk` returns what came before it, where it stopped and why, so log
recovery can keep the valid prefix, while `walk_strict` raises.

Legacy entries (magic 0/1, written before Kafka 0.11) get their CRC-32 and, for a
compressed wrapper, their first inner offset from `legacy.py` in Python, one entry at a
time: such data is rare and read-only here.

The table is the one representation the log layer, the commands and both engines read
batch metadata from: segment metadata (first and largest timestamps, last offset),
the tail of a segment, transaction state, index rebuilds, `dump`, `audit`, the record
decoder in `columns.py`. It costs 72 bytes per batch while it lives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any, Final, NamedTuple, TypeAlias

import numpy as np
import numpy.typing as npt

from cleanerd._jit import jit, jit_inline
from cleanerd.errors import CorruptRecordError
from cleanerd.records import legacy
from cleanerd.records.address import Int, be_i16, be_i32, be_i64, be_u32, bytes_address, load_u8
from cleanerd.records.crc import crc32c_at
from cleanerd.records.header import (
    ATTRIBUTES_OFFSET,
    BASE_OFFSET_OFFSET,
    BASE_SEQUENCE_OFFSET,
    BASE_TIMESTAMP_OFFSET,
    CONTROL_MASK,
    CRC_OFFSET,
    DELETE_HORIZON_MASK,
    INT32_MAX,
    LAST_OFFSET_DELTA_OFFSET,
    LEGACY_V0_MIN_SIZE,
    LEGACY_V1_MIN_SIZE,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    MAX_TIMESTAMP_OFFSET,
    NO_TIMESTAMP,
    PARTITION_LEADER_EPOCH_OFFSET,
    PREFIX_SIZE,
    PRODUCER_EPOCH_OFFSET,
    PRODUCER_ID_OFFSET,
    RECORD_BATCH_OVERHEAD,
    RECORDS_COUNT_OFFSET,
    TRANSACTIONAL_MASK,
    BatchHeader,
    Buffer,
    Compression,
)
from cleanerd.records.prefetch import prefetch
from cleanerd.records.scan import BatchInfo, IncompleteBatchError, check_batch_at, naming_offset
from cleanerd.records.varint import INT64_MAX

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
I16 = npt.NDArray[np.int16]
I8 = npt.NDArray[np.int8]
U8 = npt.NDArray[np.uint8]
Array: TypeAlias = npt.NDArray[Any]

# Kernel stop reasons. Incomplete ones (a batch cut short by the end of the data) are
# what a crash mid-append leaves; the others are bad bytes.
DONE: Final = 0
INCOMPLETE_PREFIX: Final = 1
BAD_MAGIC: Final = 2
TOO_SMALL: Final = 3
INCOMPLETE_BATCH: Final = 4
BAD_COUNTS: Final = 5
BAD_CRC: Final = 6
FULL: Final = 7  # the table is full: hand it over and go on
LEGACY: Final = 8  # `summarize` only: a legacy entry, which the table walk reads
BAD_OFFSET: Final = 9  # offsets outside the walk's `OffsetRange` (see `offsets_at`)
NO_DELETE_HORIZON: Final = 2**63 - 1
"""The earliest delete horizon of batches that carry none (later than any time)."""

_SMALL_BATCH_GUESS: Final = 128  # bytes per batch, to size the scratch table of a short walk


@jit_inline
def _check_batch(at: Int, p: Int, end: Int, verify_crc: bool) -> tuple[Int, Int, Int]:
    """(size, magic, DONE) of the batch at `p` if it passes the structural checks and
    (v2, `verify_crc`) its CRC-32C; else (0, magic, the stop reason)."""
    left = end - p
    if left < PREFIX_SIZE:
        return 0, 0, INCOMPLETE_PREFIX
    length = be_i32(at, p + LENGTH_OFFSET)
    m = load_u8(at + p + MAGIC_OFFSET)
    if m > 2:
        return 0, m, BAD_MAGIC
    total = length + LOG_OVERHEAD
    if m == 2:
        minimum = RECORD_BATCH_OVERHEAD
    else:
        minimum = LEGACY_V0_MIN_SIZE if m == 0 else LEGACY_V1_MIN_SIZE
    if total < minimum:
        return 0, m, TOO_SMALL
    if total > left:
        return 0, m, INCOMPLETE_BATCH
    if m == 2:
        lod = be_i32(at, p + LAST_OFFSET_DELTA_OFFSET)
        count = be_i32(at, p + RECORDS_COUNT_OFFSET)
        if lod < 0 or count < 0 or count > lod + 1:
            return 0, m, BAD_COUNTS
        if verify_crc and crc32c_at(
            at + p + ATTRIBUTES_OFFSET, total - ATTRIBUTES_OFFSET
        ) != be_u32(at, p + CRC_OFFSET):
            return 0, m, BAD_CRC
    return total, m, DONE


@jit_inline
def offsets_at(at: Int, p: Int, m: Int) -> tuple[Int, Int]:
    """(first offset, last offset delta) of the batch at `p`, which passed `_check_batch`
    (a legacy entry: its own offset, its last inner one, and 0)."""
    first = be_i64(at, p + BASE_OFFSET_OFFSET)
    return first, be_i32(at, p + LAST_OFFSET_DELTA_OFFSET) if m == 2 else 0


@jit_inline
def in_range(m: Int, first: Int, delta: Int, low: Int, base: Int, high: Int, span: Int) -> bool:
    """Whether a batch's first offset is at least `low` and its last offset in [base,
    high], and for a v2 batch at most `span` past `base` (see `OffsetRange`; `delta`
    >= 0 and `base` >= 0, so no bound here can overflow)."""
    if not (low <= first and base - delta <= first <= high - delta):
        return False
    return bool(m != 2 or first - base <= span - delta)


@jit_inline
def next_range(last: Int, low: Int, high: Int) -> tuple[Int, Int]:
    """(low, high) after a batch ending at `last`: above it; nothing at all after one
    ending at the largest offset (high -1: no batch passes)."""
    if last == INT64_MAX:
        return low, -1
    return last + 1, high


@jit
def _walk_kernel(
    buf: U8,
    start: Int,
    end: Int,
    n: Int,
    verify_crc: bool,
    low: Int,
    base: Int,
    high: Int,
    span: Int,
    position: I64,
    size: I64,
    magic: I8,
    base_offset: I64,
    partition_leader_epoch: I32,
    crc: I64,
    attributes: I16,
    last_offset_delta: I32,
    base_timestamp: I64,
    max_timestamp: I64,
    producer_id: I64,
    producer_epoch: I16,
    base_sequence: I32,
    records_count: I32,
) -> tuple[Int, Int, Int, Int, Int]:
    """Walk buf[start:end], filling rows from `n`, each batch's offsets in the range
    (`low`, `base`, `high`: see `OffsetRange`); (rows filled, stop position, reason, the
    `low` and `high` of what follows)."""
    at = bytes_address(buf)
    p = start
    capacity = position.shape[0]
    while p < end:
        if n == capacity:
            return n, p, FULL, low, high
        prefetch(at, p, end)
        total, m, reason = _check_batch(at, p, end, verify_crc)
        if reason != DONE:
            return n, p, reason, low, high
        # Offsets as `offsets_at` reads them, checked once the row is written (and
        # counted only if they pass): read and checked before the stores, they cost a
        # 1-record batch 70 ns instead of 52 (`bench.walker`).
        first = be_i64(at, p + BASE_OFFSET_OFFSET)
        position[n] = p
        size[n] = total
        magic[n] = m
        base_offset[n] = first
        delta: Int = 0
        if m == 2:
            delta = be_i32(at, p + LAST_OFFSET_DELTA_OFFSET)
            partition_leader_epoch[n] = be_i32(at, p + PARTITION_LEADER_EPOCH_OFFSET)
            crc[n] = be_u32(at, p + CRC_OFFSET)
            attributes[n] = be_i16(at, p + ATTRIBUTES_OFFSET)
            last_offset_delta[n] = delta
            base_timestamp[n] = be_i64(at, p + BASE_TIMESTAMP_OFFSET)
            max_timestamp[n] = be_i64(at, p + MAX_TIMESTAMP_OFFSET)
            producer_id[n] = be_i64(at, p + PRODUCER_ID_OFFSET)
            producer_epoch[n] = be_i16(at, p + PRODUCER_EPOCH_OFFSET)
            base_sequence[n] = be_i32(at, p + BASE_SEQUENCE_OFFSET)
            records_count[n] = be_i32(at, p + RECORDS_COUNT_OFFSET)
        else:  # legacy: `walk` fills in the rest from legacy.py
            partition_leader_epoch[n] = -1
            base_timestamp[n] = -1
            producer_id[n] = -1
            producer_epoch[n] = -1
            base_sequence[n] = -1
        if not in_range(m, first, delta, low, base, high, span):
            return n, p, BAD_OFFSET, low, high
        low, high = next_range(first + delta, low, high)
        n += 1
        p += total
    return n, p, DONE, low, high


@jit
def _summary_kernel(
    buf: U8,
    start: Int,
    end: Int,
    limit: Int,
    verify_crc: bool,
    low: Int,
    base: Int,
    high: Int,
    span: Int,
) -> tuple[Int, Int, Int, Int, Int, Int, Int, Int, Int, Int]:
    """Walk buf[start:end] as `_walk_kernel` does, up to `limit` batches, keeping only
    totals: (batches, stop, reason, first batch's max timestamp, first batch's base
    offset, last offset, max timestamp, last offset of the earliest batch holding it,
    earliest KIP-534 delete horizon, batches carrying one). A legacy entry stops it with
    LEGACY (its CRC and offsets need `legacy.py`)."""
    at = bytes_address(buf)
    p = start
    n = 0
    horizon: Int = NO_DELETE_HORIZON
    horizons = 0
    first_ts: Int = -1
    first_base: Int = -1
    last: Int = -1
    max_ts: Int = -1
    offset_of_max: Int = -1
    reason: Int = DONE
    while p < end:
        if n == limit:
            reason = FULL
            break
        prefetch(at, p, end)
        total, m, reason = _check_batch(at, p, end, verify_crc)
        if reason == DONE and m != 2:
            reason = LEGACY
        if reason != DONE:
            break
        first, delta = offsets_at(at, p, m)
        if not in_range(m, first, delta, low, base, high, span):
            reason = BAD_OFFSET
            break
        last = first + delta
        low, high = next_range(last, low, high)
        ts = be_i64(at, p + MAX_TIMESTAMP_OFFSET)
        if n == 0:
            first_ts, first_base = ts, first
            max_ts, offset_of_max = ts, last
        elif ts > max_ts:
            max_ts, offset_of_max = ts, last
        if be_i16(at, p + ATTRIBUTES_OFFSET) & DELETE_HORIZON_MASK:
            horizon = min(horizon, be_i64(at, p + BASE_TIMESTAMP_OFFSET))
            horizons += 1
        n += 1
        p += total
    else:
        reason = DONE
    return (
        n,
        p,
        reason,
        first_ts,
        first_base,
        last,
        max_ts,
        offset_of_max,
        horizon,
        horizons,
    )


class OffsetRange(NamedTuple):
    """The offsets a walk accepts: each batch's first offset at least `low` (never
    negative, and above the last offset of the batch before it), its last offset in
    [`base`, `high`]. A segment's range has its base offset as `base` and the next
    segment's base offset less one as `high` (`of_segment`): Kafka's loader judges a
    batch by its last offset (`ensureOffsetInRange`), since a segment rolled at a legacy
    compressed wrapper's offset (its last inner one) holds inner offsets below its base,
    and a cleaned one holds them as a v2 batch. A walk that knows no segment still
    refuses a negative offset and offsets that do not ascend. No CRC covers a batch's
    base offset, so these are the checks that catch its damage. (A named tuple: one is
    made for every segment opened, 100,000 at a large start.)"""

    low: int = 0
    base: int = 0
    high: int = INT64_MAX
    """-1 after a batch ending at the largest offset: nothing may follow it."""
    after_batch: bool = False
    """`low` is one past the last offset of the batch just before the range (a segment's
    window after its first): said in the error."""
    span: int = INT64_MAX
    """How far past `base` a v2 batch's last offset may be. The active segment, which no
    next segment bounds, has 2^31 - 1: its index holds offsets relative to its base as
    32-bit ints, and a broker rolls before a v2 batch that would not fit, so a larger
    offset there is damage (a base offset gone wild would otherwise pass as the log's
    end). A closed segment is bounded by the next one's base instead: old brokers wrote
    some past 2^31 - 1 (an offset overflow, KAFKA-6264), which the cleaner splits."""

    @classmethod
    def of_segment(cls, base_offset: int, next_base_offset: int | None = None) -> OffsetRange:
        if next_base_offset is None:
            return cls(0, max(0, base_offset), span=INT32_MAX)
        return cls(0, max(0, base_offset), next_base_offset - 1)

    @property
    def bounds(self) -> tuple[int, int, int, int]:
        """(`low`, `base`, `high`, `span`): the arguments a kernel checks a batch with
        (`in_range`)."""
        return self.low, self.base, self.high, self.span

    def refusal(self, first: int, delta: int, *, v2: bool) -> str | None:
        """Why a batch from offset `first` to `first + delta` (a v2 batch, or a legacy
        entry) is outside this range, or None when it is inside: the rule `in_range`
        applies in a kernel, in Python, for the error and for what metadata shows."""
        name = "base offset" if v2 else "offset"
        last = first + delta
        if first < 0:
            return f"negative {name} {first}"
        if self.high < 0:
            return f"{name} {first} follows a batch that ends at the largest offset"
        if first < self.low:
            return f"{name} {first} is not above the previous batch's last offset {self.low - 1}"
        if last < self.base:
            return f"last offset {last} is below the segment's base offset {self.base}"
        if last > self.high and self.high == INT64_MAX:
            return f"base offset {first} + lastOffsetDelta {delta} is past the largest offset"
        if last > self.high:
            return f"last offset {last} is not below the next segment's base offset {self.high + 1}"
        if v2 and last - self.base > self.span:
            return (
                f"last offset {last} is more than {self.span} past the segment's base offset "
                f"{self.base}"
            )
        return None

    def after(self, low: int, high: int, walked: bool) -> OffsetRange:
        """The range left once a walk of this one has reached `low` and `high`
        (`walked`: it passed a batch)."""
        return self._replace(low=low, high=high, after_batch=self.after_batch or walked)


ANY_OFFSETS: Final = OffsetRange()


def _offsets_of(data: U8, p: int) -> tuple[int, int, bool]:
    """(first offset, last offset delta, is v2) of the batch at `p`, as `offsets_at`
    reads them in a kernel."""
    view = data.data
    first = int.from_bytes(view[p : p + 8], "big", signed=True)
    v2 = view[p + MAGIC_OFFSET] == 2
    at = p + LAST_OFFSET_DELTA_OFFSET
    return first, int.from_bytes(view[at : at + 4], "big", signed=True) if v2 else 0, v2


class BadOffsetError(CorruptRecordError):
    """A batch whose offsets are outside its walk's `OffsetRange`: damage no CRC covers,
    and never what a crash mid-append leaves (a torn batch fails its structure or CRC)."""


def offset_error(data: U8, p: int, offsets: OffsetRange) -> BadOffsetError:
    """Why the batch at `p` (which passed the structural checks) is outside `offsets`."""
    first, delta, v2 = _offsets_of(data, p)
    reason = offsets.refusal(first, delta, v2=v2)
    return BadOffsetError(
        reason or f"offsets {first}..{first + delta} are out of range", position=p
    )


@dataclass(slots=True)
class BatchTable:
    """One row per batch (v2) or shallow legacy entry, in file order; positions are in the
    walked buffer. Legacy rows: attributes is the message attribute byte, base_offset and
    last_offset_delta span the inner offsets, records_count counts inner messages,
    max_timestamp is the v1 timestamp (-1 for v0), producer fields and base_timestamp -1.
    """

    position: I64
    size: I64
    magic: I8
    base_offset: I64
    partition_leader_epoch: I32
    crc: I64
    attributes: I16
    last_offset_delta: I32
    base_timestamp: I64
    max_timestamp: I64
    producer_id: I64
    producer_epoch: I16
    base_sequence: I32
    records_count: I32

    @classmethod
    def empty(cls, n: int) -> BatchTable:
        dtypes = [np.int64, np.int64, np.int8, np.int64, np.int32, np.int64, np.int16]
        dtypes += [np.int32, np.int64, np.int64, np.int64, np.int16, np.int32, np.int32]
        return cls(*(np.empty(n, dtype=d) for d in dtypes))

    def arrays(self) -> list[Array]:
        return [getattr(self, name) for name in _COLUMNS]

    def __len__(self) -> int:
        return len(self.position)

    def head(self, n: int) -> BatchTable:
        """The first `n` rows (views)."""
        return BatchTable(*(a[:n] for a in self.arrays()))

    def take(self, rows: Array | slice) -> BatchTable:
        """The rows selected by an index array, mask or slice (copies)."""
        return BatchTable(*(a[rows].copy() for a in self.arrays()))

    @classmethod
    def concat(cls, tables: list[BatchTable]) -> BatchTable:
        if not tables:
            return cls.empty(0)
        return cls(
            *(np.concatenate(cols) for cols in zip(*(t.arrays() for t in tables), strict=True))
        )

    @property
    def last_offset(self) -> I64:
        return self.base_offset + self.last_offset_delta.astype(np.int64)

    @property
    def final_offset(self) -> int:
        """The last offset of the last row (-1 when there is none): `last_offset[-1]`
        without the whole column."""
        if not len(self):
            return -1
        return int(self.base_offset[-1]) + int(self.last_offset_delta[-1])

    @property
    def end(self) -> I64:
        """Where each batch ends (the next one's position)."""
        return self.position + self.size

    @property
    def is_transactional(self) -> npt.NDArray[np.bool_]:
        flags: npt.NDArray[np.bool_] = (self.magic == 2) & (
            self.attributes & TRANSACTIONAL_MASK != 0
        )
        return flags

    @property
    def is_control(self) -> npt.NDArray[np.bool_]:
        flags: npt.NDArray[np.bool_] = (self.magic == 2) & (self.attributes & CONTROL_MASK != 0)
        return flags

    def header(self, i: int) -> BatchHeader | None:
        """The v2 header of row `i` (None for a legacy entry)."""
        if int(self.magic[i]) != 2:
            return None
        return BatchHeader(
            int(self.base_offset[i]),
            int(self.size[i]) - LOG_OVERHEAD,
            int(self.partition_leader_epoch[i]),
            2,
            int(self.crc[i]),
            int(self.attributes[i]),
            int(self.last_offset_delta[i]),
            int(self.base_timestamp[i]),
            int(self.max_timestamp[i]),
            int(self.producer_id[i]),
            int(self.producer_epoch[i]),
            int(self.base_sequence[i]),
            int(self.records_count[i]),
            int(self.position[i]),
        )

    def info(self, i: int) -> BatchInfo:
        """Row `i` as a `BatchInfo` (for code that handles a few batches as objects)."""
        return BatchInfo(
            int(self.position[i]),
            int(self.size[i]),
            int(self.magic[i]),
            int(self.base_offset[i]),
            int(self.base_offset[i]) + int(self.last_offset_delta[i]),
            int(self.max_timestamp[i]),
            self.header(i),
        )

    def infos(self) -> list[BatchInfo]:
        """Every row as a `BatchInfo`: Python per batch, so only for short tables."""
        return [self.info(i) for i in range(len(self))]


_COLUMNS: Final = tuple(f.name for f in fields(BatchTable))
"""BatchTable's columns, in order (`fields` costs more than a tiny walk)."""


@dataclass(frozen=True, slots=True)
class Walk:
    """The valid prefix of a byte range: its batches, where the walk stopped (the range's
    end when `error` is None), and, if it stopped early, why and whether what follows is
    merely an incomplete batch (a crash mid-append) rather than bad bytes."""

    table: BatchTable
    start: int
    stop: int
    error: CorruptRecordError | None
    last_offset: int = -1
    """The last offset of the valid prefix (-1 when it holds no batch)."""
    offsets: OffsetRange = ANY_OFFSETS
    """The range the walk was given (the batch after the valid prefix must also be above
    `last_offset`)."""

    @property
    def valid_bytes(self) -> int:
        return self.stop - self.start

    @property
    def incomplete_tail(self) -> bool:
        return isinstance(self.error, IncompleteBatchError)


def as_uint8(buf: Buffer | U8) -> U8:
    """A zero-copy 1-D uint8 numpy view of `buf` (bytes, bytearray, memoryview, mmap)."""
    if isinstance(buf, np.ndarray):
        if buf.dtype != np.uint8 or buf.ndim != 1:
            raise TypeError(f"expected a 1-D uint8 array, got {buf.dtype} with {buf.ndim} dims")
        return np.ascontiguousarray(buf)
    return np.frombuffer(buf, dtype=np.uint8)


def walk(
    buf: Buffer | U8,
    *,
    start: int = 0,
    end: int | None = None,
    verify_crc: bool = True,
    offsets: OffsetRange = ANY_OFFSETS,
) -> Walk:
    """Walk the batches of `buf[start:end]`, stopping at the first bad one instead of
    raising (what log recovery needs: everything before it is kept)."""
    walker = Walker(
        buf, start=start, end=end, verify_crc=verify_crc, offsets=offsets, rows=None, own=True
    )
    chunks = list(walker)
    # A table sized for small batches holds big ones in a fraction of its rows: it is
    # copied down, so that a kept table (a pass's cached window) holds only its rows.
    fits = len(chunks) == 1 and 2 * len(chunks[0]) > walker.rows
    table = chunks[0] if fits else BatchTable.concat(chunks)
    return Walk(table, start, walker.stop, walker.error, table.final_offset, offsets)


def walk_prefix(
    buf: Buffer | U8,
    *,
    start: int = 0,
    end: int | None = None,
    verify_crc: bool = True,
    offsets: OffsetRange = ANY_OFFSETS,
    each: Callable[[BatchTable], None] | None = None,
) -> Walk:
    """Like `walk`, keeping no table (`table` is empty): where the valid prefix ends, and
    why. A whole segment costs no more memory than one scratch table. `each` is given
    every table of the valid prefix in turn (valid until it returns)."""
    walker = Walker(buf, start=start, end=end, verify_crc=verify_crc, offsets=offsets)
    last = -1
    for table in walker:
        if len(table):
            last = table.final_offset
        if each is not None:
            each(table)
    return Walk(BatchTable.empty(0), start, walker.stop, walker.error, last, offsets)


@dataclass(frozen=True, slots=True)
class Summary:
    """The totals of a walk that needs no table (segment metadata): how many batches,
    where it ended, the first batch's max timestamp and base offset, the last offset, the
    max timestamp and the last offset of the earliest batch holding it (-1 each when
    there is no batch)."""

    batches: int
    stop: int
    first_max_timestamp: int
    first_base_offset: int
    last_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int
    delete_horizon: tuple[int, int]
    """(earliest KIP-534 delete horizon, v2 batches carrying one); the horizon is
    `NO_DELETE_HORIZON` when none does."""

    @classmethod
    def of_table(cls, table: BatchTable, stop: int) -> Summary:
        """The same totals from a walked table."""
        if not len(table):
            return cls(0, stop, -1, -1, -1, -1, -1, (NO_DELETE_HORIZON, 0))
        last = table.last_offset
        top = int(np.argmax(table.max_timestamp))  # the earliest batch holding it
        return cls(
            len(table),
            stop,
            int(table.max_timestamp[0]),
            int(table.base_offset[0]),
            int(last[-1]),
            int(table.max_timestamp[top]),
            int(last[top]),
            delete_horizon(table),
        )


def delete_horizon(table: BatchTable) -> tuple[int, int]:
    """(earliest KIP-534 delete horizon, v2 batches carrying one) of the walked batches
    `table`; the horizon is `NO_DELETE_HORIZON` when none does. Two tables' totals fold
    as (min, sum)."""
    stamped = (table.magic == 2) & (table.attributes & DELETE_HORIZON_MASK != 0)
    horizons = table.base_timestamp[stamped]
    return (int(horizons.min()) if len(horizons) else NO_DELETE_HORIZON, len(horizons))


def _check_start(start: int, size: int) -> None:
    """The kernels read `buf[start]` without bounds checks: a start before the buffer
    (a damaged index entry's position, say) must never reach them."""
    if start < 0:
        raise ValueError(f"walk start {start} is before the buffer ({size} bytes)")


def summarize(
    buf: Buffer | U8,
    *,
    start: int = 0,
    limit: int | None = None,
    verify_crc: bool = True,
    offsets: OffsetRange = ANY_OFFSETS,
) -> Summary | None:
    """The totals of `buf[start:]`'s batches (the first `limit` of them) in one kernel
    call and no table; None when the walk meets a bad or incomplete batch or a legacy
    entry before its end (or its limit): `walk` then says what and where, or reads it."""
    data = as_uint8(buf)
    _check_start(start, len(data))
    found = _summary_kernel(
        data,
        start,
        len(data),
        -1 if limit is None else limit,
        verify_crc,
        *offsets.bounds,
    )
    batches, stop, reason, first_ts, first_base, last, max_ts, at_max, horizon, stamped = (
        int(x) for x in found
    )
    if reason not in (DONE, FULL):
        return None
    return Summary(batches, stop, first_ts, first_base, last, max_ts, at_max, (horizon, stamped))


class Walker:
    """The batches of `buf[start:end]` as a sequence of tables of at most `rows` rows,
    each a view of one scratch table that the next step overwrites: a consumer that only
    needs totals (a summary, open transactions, index entries) never allocates a table
    for the whole segment, whose first-touch page faults would cost more than the walk.
    After iteration, `stop` and `error` tell where and why the walk ended (as in `Walk`).

    Each step fills the whole scratch table, so a walk to the end costs one kernel call
    per `rows` batches. With `ramp`, the first step takes 16 batches and each next one
    twice as many: for a consumer that may stop after the first batches (`scan_batches`),
    which would otherwise pay for a walk of a whole table it never reads.

    With `own`, each step fills a new table instead, which the consumer may keep: for a
    consumer that keeps every batch (`walk`), which would otherwise copy each one out.
    `rows=None` sizes the tables for the span at `_SMALL_BATCH_GUESS` bytes a batch, so
    that such a walk usually takes one step.
    """

    ROWS: Final = 1 << 16

    def __init__(
        self,
        buf: Buffer | U8,
        *,
        start: int = 0,
        end: int | None = None,
        verify_crc: bool = True,
        offsets: OffsetRange = ANY_OFFSETS,
        rows: int | None = ROWS,
        ramp: bool = False,
        own: bool = False,
    ) -> None:
        self.data = as_uint8(buf)
        self.offsets = offsets
        """What the rest of the walk accepts (a walk goes on from `stop` in the range
        left)."""
        _check_start(start, len(self.data))
        self.ramp = ramp
        self.own = own
        self.start = self.stop = start
        self.end = len(self.data) if end is None else min(end, len(self.data))
        self.verify_crc = verify_crc
        self.error: CorruptRecordError | None = None
        guess = (self.end - start) // _SMALL_BATCH_GUESS + 1
        self.rows = max(1, guess if rows is None else min(rows, guess))
        """The rows of each table (after a ramp's first steps)."""
        self._scratch = BatchTable.empty(0 if own else self.rows)

    def _legacy_damage(self, p: int) -> CorruptRecordError | None:
        """What is wrong with the entry at `p`, whose offsets are out of range, before
        its offsets, when it is a legacy one: the kernel leaves a legacy entry's CRC to
        `legacy.py`, and an entry's CRC is judged before its offsets, as a v2 batch's is
        (a torn last entry fails its CRC, and is cut as torn, whatever its offset says)."""
        if not self.verify_crc or self.data[p + MAGIC_OFFSET] == 2:
            return None
        try:
            legacy.read_legacy_entry(self.data.data, p, self.end, verify_crc=True)
        except CorruptRecordError as exc:
            return naming_offset(exc, self.data.data, p, self.end)
        return None

    def __iter__(self) -> Iterator[BatchTable]:
        reason = FULL
        rows = min(16, self.rows) if self.ramp else self.rows
        while reason == FULL and self.error is None:
            scratch = BatchTable.empty(rows) if self.own else self._scratch.head(rows)
            offsets = self.offsets
            found = _walk_kernel(
                self.data,
                self.stop,
                self.end,
                0,
                self.verify_crc,
                *offsets.bounds,
                *scratch.arrays(),
            )
            rows = min(2 * rows, self.rows)
            n, stop, reason, low, high = (int(x) for x in found)
            self.offsets = offsets.after(low, high, n > 0)
            chunk = scratch.head(n)
            if reason == BAD_OFFSET:
                self.error = self._legacy_damage(stop) or offset_error(
                    self.data, stop, self.offsets
                )
            elif reason not in (DONE, FULL):
                self.error = _stop_error(self.data, stop, self.end, self.verify_crc, reason)
            legacy_rows = np.flatnonzero(chunk.magic != 2)
            if len(legacy_rows):
                n_ok, legacy_error = _read_legacy_rows(
                    self.data, chunk, legacy_rows, self.verify_crc
                )
                if legacy_error is not None:
                    stop, self.error = int(chunk.position[n_ok]), legacy_error
                    chunk = chunk.head(n_ok)
            self.stop = stop
            if len(chunk):
                yield chunk


@jit
def _next_cut(buf: U8, run: Int, max_bytes: Int) -> tuple[Int, Int]:
    """The start of the run of whole batches after the one starting at `run` (runs of at
    most `max_bytes`, a bigger batch a run of its own), or -1 when that run is the last;
    and where the run's last batch starts. Only the length fields are read; the hop stops
    at the first entry whose length is impossible or runs past the end, which stays in
    the last run."""
    at = bytes_address(buf)
    p = run
    last = run
    end = buf.shape[0]
    while end - p >= PREFIX_SIZE:
        prefetch(at, p, end)
        size = LOG_OVERHEAD + int(be_i32(at, p + LENGTH_OFFSET))
        if size < LEGACY_V0_MIN_SIZE or size > end - p:
            break
        if p > run and p + size - run > max_bytes:
            return p, last
        last = p
        p += size
    return -1, last


DECODE_WINDOW_BYTES: Final = 8 * 1024 * 1024
"""The most bytes of a segment a pass or an audit decodes at once (`batch_windows`):
decoded, a 1-record batch takes about twice its bytes, so a 1 GiB segment decoded whole
would need gigabytes. Small windows are also faster, their columns staying in the CPU's
caches: a first clean of a 1 GiB segment of 1-record batches took 7.0 s with 64 MiB
windows (peak 485 MB), 6.2 s with 8 MiB (365 MB), 6.4 s with 2 MiB."""


class Window(NamedTuple):
    """A range of whole batches of a segment, and the offsets its batches may have: the
    segment's range, from one past the last offset of the window before."""

    start: int
    end: int
    offsets: OffsetRange


class BatchWindows:
    """`buf` as consecutive [start, end) byte ranges of whole batches, each at most
    `max_bytes` unless one batch is bigger: so a segment of any size can be decoded a
    range at a time, in bounded memory. One range when `buf` fits. `offsets`: the
    segment's (`OffsetRange.of_segment`), which each window narrows to what follows the
    window before, so that windows walked apart check what one walk would.

    Each range's end is found when the range is first asked for, by hopping over its
    batches' length fields: a 182 MB segment of 1-record batches takes about 20 ms to hop
    whole, which a pass decoding its first ranges in threads meanwhile need not wait for.
    """

    def __init__(
        self, buf: Buffer | U8, max_bytes: int, offsets: OffsetRange = ANY_OFFSETS
    ) -> None:
        self._data = as_uint8(buf)
        self._max_bytes = max_bytes
        self._starts = [0]
        self._offsets = [offsets]
        self._complete = self._data.shape[0] <= max_bytes

    def get(self, i: int) -> Window | None:
        """Range `i` (from 0), or None past the last."""
        while len(self._starts) <= i + 1 and not self._complete:
            cut, last = (int(x) for x in _next_cut(self._data, self._starts[-1], self._max_bytes))
            if cut < 0:
                self._complete = True
            else:
                self._starts.append(cut)
                self._offsets.append(self._after(self._offsets[-1], last))
        if i >= len(self._starts):
            return None
        end = self._starts[i + 1] if i + 1 < len(self._starts) else self._data.shape[0]
        return Window(self._starts[i], end, self._offsets[i])

    def _after(self, offsets: OffsetRange, p: int) -> OffsetRange:
        """What follows the batch at `p` (not yet checked: if its offsets are bad, the
        walk of its own window says so first)."""
        first, delta, _ = _offsets_of(self._data, p)
        if first + delta >= INT64_MAX:
            return offsets.after(offsets.low, -1, True)
        return offsets.after(max(offsets.low, first + delta + 1), offsets.high, True)

    def __iter__(self) -> Iterator[Window]:
        i = 0
        while (window := self.get(i)) is not None:
            yield window
            i += 1


def batch_windows(
    buf: Buffer | U8, max_bytes: int, offsets: OffsetRange = ANY_OFFSETS
) -> list[Window]:
    """Every range of `BatchWindows(buf, max_bytes, offsets)`, in order."""
    return list(BatchWindows(buf, max_bytes, offsets))


def walk_strict(
    buf: Buffer | U8,
    *,
    start: int = 0,
    end: int | None = None,
    verify_crc: bool = True,
    offsets: OffsetRange = ANY_OFFSETS,
) -> BatchTable:
    """Every batch of `buf[start:end]`; raise CorruptRecordError (position = offset in
    `buf`) at the first batch that is incomplete or invalid."""
    result = walk(buf, start=start, end=end, verify_crc=verify_crc, offsets=offsets)
    if result.error is not None:
        raise result.error
    return result.table


def _stop_error(data: U8, p: int, end: int, verify_crc: bool, reason: int) -> CorruptRecordError:
    """The error `scan.check_batch_at` gives for the batch the kernel stopped at."""
    try:
        check_batch_at(data.data, p, end, verify_crc=verify_crc)
    except CorruptRecordError as exc:
        return exc.with_traceback(None)  # its frames hold views of a buffer about to close
    return CorruptRecordError(f"batch fails the walker's check {reason}", position=p)


def _read_legacy_rows(
    data: U8, table: BatchTable, rows: Array, verify_crc: bool
) -> tuple[int, CorruptRecordError | None]:
    """Fill in legacy rows from `legacy.py` (CRC-32, inner offsets); on a bad entry, the
    number of rows before it and the error."""
    view = data.data
    for row in rows.tolist():
        p = int(table.position[row])
        try:
            entry = legacy.read_legacy_entry(
                view, p, p + int(table.size[row]), verify_crc=verify_crc
            )
            first = entry.offset
            count = 1
            if entry.compression is not Compression.NONE:
                inner = legacy.entry_records(entry, verify_crc=verify_crc)
                first, count = inner[0].offset, len(inner)
        except CorruptRecordError as exc:
            return row, naming_offset(exc, view, p, len(data))
        table.attributes[row] = entry.attributes
        table.crc[row] = entry.crc
        table.base_offset[row] = first
        table.last_offset_delta[row] = entry.offset - first
        table.max_timestamp[row] = entry.timestamp if entry.magic == 1 else NO_TIMESTAMP
        table.records_count[row] = count
    return len(table), None


def scan_batches(
    buf: Buffer | U8,
    *,
    start: int = 0,
    end: int | None = None,
    verify_crc: bool = True,
    offsets: OffsetRange = ANY_OFFSETS,
) -> Iterator[BatchInfo]:
    """Every batch in `buf[start:end]` as a `BatchInfo`, in order; raise
    CorruptRecordError (position = offset in `buf`) at the first incomplete or invalid
    one. The walk is compiled; the objects cost Python per batch, so hot paths iterate
    `Walker` tables instead."""
    walker = Walker(buf, start=start, end=end, verify_crc=verify_crc, offsets=offsets, ramp=True)
    for chunk in walker:
        yield from chunk.infos()
    error = walker.error
    del walker  # its view of `buf` must not outlive this frame (an mmap closes after it)
    if error is not None:
        raise error
