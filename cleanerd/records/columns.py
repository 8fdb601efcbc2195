"""Columnar decoding of record batches: numpy columns for every record, no Python per record.

Two entry points:

- `record_columns(area)` decodes an uncompressed records area (the bytes after a v2 batch
  header, or several such areas back to back) into one row per record: where the record,
  its key, value and headers are, its timestamp and offset deltas. The record layout is
  documented in `record.py`.
- `segment_columns(buf)` decodes a whole segment (a numpy uint8 view of the file, e.g. of
  an mmap) into a batch table (`walker.py`'s, CRC checked there) and a record table with
  absolute offsets and timestamps.

Both run compiled kernels (`cleanerd._jit.jit`) that read zig-zag varints byte by byte
and check every length against its bounds. Python runs once per batch only where a C
library does the work: decompression (`cramjam`, compressed batches only), and, for
legacy magic 0/1 entries, the reader in `legacy.py` (old data is rare, so per-message
Python is fine there).

Positions in the record table point into one of two buffers, named by `buffer_id`:
0 = the segment buffer itself (uncompressed v2 batches, uncompressed legacy messages),
1 = `side`, the concatenated decompressed records areas of compressed batches (and inner
message sets of legacy wrappers). A consumer that needs one buffer per call handles the
two ids separately, e.g. ``for bid, b in enumerate(cols.buffers): m = cols.buffer_id ==
bid; out[m] = kernel(b, cols.key_pos[m], cols.key_len[m])``.

The record table's columns are views into one array of rows (field by field they are
strided, not contiguous): a kernel fills a record's fields side by side, which is much
faster than a dozen separate column streams. Code that needs a contiguous column calls
``np.ascontiguousarray``.

`headers_pos` is where the first header starts (just after the header-count varint), so a
header walker reads ``header_count`` times: key length varint, key, value length varint
(-1 = null), value. Legacy records have no headers (`header_count` 0, `headers_pos` -1).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Final

import numpy as np

from cleanerd._jit import jit
from cleanerd.errors import CorruptRecordError
from cleanerd.records import compiled_codecs, legacy, zlib_streams
from cleanerd.records.address import Int, be_i32, bytes_address, load_u8
from cleanerd.records.compression import decompress, decompress_frames, decompress_into
from cleanerd.records.header import (
    COMPRESSION_MASK,
    RECORD_BATCH_OVERHEAD,
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
    Buffer,
    Compression,
)
from cleanerd.records.prefetch import prefetch
from cleanerd.records.record import RecordHeader
from cleanerd.records.scan import naming_offset
from cleanerd.records.varint import decode_varint
from cleanerd.records.walker import (
    ANY_OFFSETS,
    I8,
    I16,
    I32,
    I64,
    U8,
    Array,
    BatchTable,
    OffsetRange,
    as_uint8,
    walk_strict,
)

MIN_RECORD_SIZE: Final = 7  # length, attributes, ts, offset, key len, value len, count
SEGMENT: Final = 0
SIDE: Final = 1

# Kernel status codes. 0 is success; the rest name what is wrong at the reported byte.
_MESSAGES: Final = {
    1: "varint is longer than 5 bytes or does not fit in an int32",
    2: "varlong is longer than 10 bytes or does not fit in an int64",
    3: "varint runs past the end of its record",
    4: "record length runs past the end of the batch",
    5: "record has no attributes byte",
    6: "key length is invalid or runs past the end of the record",
    7: "value length is invalid or runs past the end of the record",
    8: "negative header count",
    9: "header key length is invalid or runs past the end of the record",
    10: "header value length is invalid or runs past the end of the record",
    11: "record length disagrees with its fields",
    12: "batch declares more records than it holds",
    13: "bytes follow the last record of the batch",
}

# ---------------------------------------------------------------------------------------
# Kernels. Everything is int64 arithmetic: numba turns mixed int64/uint64 into floats.


@jit
def _varint(at: Int, p: Int, end: Int) -> tuple[Int, Int, Int]:
    """(value, next position, status) of the zig-zag varint at p of the bytes at
    address `at` (`cleanerd.records.address`)."""
    if p < end and load_u8(at + p) < 0x80:  # most varints in a record are one byte
        first = load_u8(at + p)
        return (first >> 1) ^ -(first & 1), p + 1, 0
    u = np.int64(0)
    for i in range(5):
        if p + i >= end:
            return 0, p, 3
        b = load_u8(at + p + i)
        u |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            if u > 0xFFFFFFFF:
                return 0, p, 1
            return (u >> 1) ^ -(u & 1), p + i + 1, 0
    return 0, p, 1


@jit
def _varlong(at: Int, p: Int, end: Int) -> tuple[Int, Int, Int]:
    """(value, next position, status) of the zig-zag varlong at p of the bytes at `at`."""
    if p < end and load_u8(at + p) < 0x80:
        first = load_u8(at + p)
        return (first >> 1) ^ -(first & 1), p + 1, 0
    u = np.uint64(0)
    for i in range(10):
        if p + i >= end:
            return 0, p, 3
        b = np.uint64(load_u8(at + p + i))
        if i == 9 and b > 1:
            return 0, p, 2
        u |= (b & np.uint64(0x7F)) << np.uint64(7 * i)
        if b < 0x80:
            value = (u >> np.uint64(1)) ^ (np.uint64(0) - (u & np.uint64(1)))
            return np.int64(value), p + i + 1, 0
    return 0, p, 2


@jit
def parse_record(
    at: Int, p: Int, area_end: Int
) -> tuple[Int, Int, Int, Int, Int, Int, Int, Int, Int, Int, Int]:
    """Decode the record at p of the bytes at address `at` (`cleanerd.records.address`).
    Returns (status, error position, next position, timestamp delta, offset delta, key
    pos, key len, value pos, value len, headers pos, header count); lengths are -1 for
    null."""
    length, q, st = _varint(at, p, area_end)
    if st != 0:
        return st, p, 0, 0, 0, 0, 0, 0, 0, 0, 0
    stop = q + length
    if length < 0 or stop > area_end:
        return 4, p, 0, 0, 0, 0, 0, 0, 0, 0, 0
    if q >= stop:
        return 5, p, 0, 0, 0, 0, 0, 0, 0, 0, 0
    q += 1  # attributes
    ts_delta, q, st = _varlong(at, q, stop)
    if st != 0:
        return st, q, 0, 0, 0, 0, 0, 0, 0, 0, 0
    off_delta, q, st = _varint(at, q, stop)
    if st != 0:
        return st, q, 0, 0, 0, 0, 0, 0, 0, 0, 0
    key_len, q, st = _varint(at, q, stop)
    if st != 0:
        return st, q, 0, 0, 0, 0, 0, 0, 0, 0, 0
    key_pos = q
    if key_len < -1 or q + max(key_len, 0) > stop:
        return 6, p, 0, 0, 0, 0, 0, 0, 0, 0, 0
    q += max(key_len, 0)
    value_len, q, st = _varint(at, q, stop)
    if st != 0:
        return st, q, 0, 0, 0, 0, 0, 0, 0, 0, 0
    value_pos = q
    if value_len < -1 or q + max(value_len, 0) > stop:
        return 7, p, 0, 0, 0, 0, 0, 0, 0, 0, 0
    q += max(value_len, 0)
    count, q, st = _varint(at, q, stop)
    if st != 0:
        return st, q, 0, 0, 0, 0, 0, 0, 0, 0, 0
    if count < 0:
        return 8, p, 0, 0, 0, 0, 0, 0, 0, 0, 0
    headers_pos = q
    for _ in range(count):
        n, q, st = _varint(at, q, stop)
        if st != 0:
            return st, q, 0, 0, 0, 0, 0, 0, 0, 0, 0
        if n < 0 or q + n > stop:
            return 9, p, 0, 0, 0, 0, 0, 0, 0, 0, 0
        q += n
        n, q, st = _varint(at, q, stop)
        if st != 0:
            return st, q, 0, 0, 0, 0, 0, 0, 0, 0, 0
        if n < -1 or q + max(n, 0) > stop:
            return 10, p, 0, 0, 0, 0, 0, 0, 0, 0, 0
        q += max(n, 0)
    if q != stop:
        return 11, p, 0, 0, 0, 0, 0, 0, 0, 0, 0
    return (
        0,
        p,
        stop,
        ts_delta,
        off_delta,
        key_pos,
        key_len,
        value_pos,
        value_len,
        headers_pos,
        count,
    )


@jit
def _area_kernel(
    buf: U8,
    start: Int,
    end: Int,
    fill: bool,
    record_pos: I64,
    record_size: I32,
    timestamp_delta: I64,
    offset_delta: I32,
    key_pos: I64,
    key_len: I32,
    value_pos: I64,
    value_len: I32,
    headers_pos: I64,
    header_count: I32,
) -> tuple[Int, Int, Int]:
    """Decode records back to back in buf[start:end]; (count, status, error position)."""
    at = bytes_address(buf)
    p = start
    n = 0
    while p < end:
        st, err, nxt, tsd, ofd, kp, kl, vp, vl, hp, hc = parse_record(at, p, end)
        if st != 0:
            return n, st, err
        if fill:
            record_pos[n] = p
            record_size[n] = nxt - p
            timestamp_delta[n] = tsd
            offset_delta[n] = ofd
            key_pos[n] = kp
            key_len[n] = kl
            value_pos[n] = vp
            value_len[n] = vl
            headers_pos[n] = hp
            header_count[n] = hc
        n += 1
        p = nxt
    return n, 0, p


@jit
def _batches_kernel(
    buf: U8,
    rows: I64,
    area_start: I64,
    area_end: I64,
    records_count: I32,
    first_record: I64,
    base_offset: I64,
    base_timestamp: I64,
    max_timestamp: I64,
    attributes: I16,
    buffer_id: Int,
    out: Array,
) -> tuple[Int, Int, Int]:
    """Decode the records areas buf[area_start[i]:area_end[i]] of batch rows `rows[i]`
    into the record table `out` (rows of `SEGMENT_ROW`) at first_record[row]; (status,
    error position, failing i). Fields are stored through the row, at fixed offsets from
    its start, which is cheaper than a dozen strided column views."""
    at = bytes_address(buf)
    for i in range(rows.shape[0]):
        row = rows[i]
        p = area_start[i]
        end = area_end[i]
        log_append = (attributes[row] & TIMESTAMP_TYPE_MASK) != 0
        j = first_record[row]
        for _ in range(records_count[row]):
            if p >= end:
                return 12, p, i
            prefetch(at, p, buf.shape[0])
            st, err, nxt, tsd, ofd, kp, kl, vp, vl, hp, hc = parse_record(at, p, end)
            if st != 0:
                return st, err, i
            r = out[j]
            r.batch_index = row
            r.offset = base_offset[row] + ofd
            r.timestamp = max_timestamp[row] if log_append else base_timestamp[row] + tsd
            r.record_pos = p
            r.record_size = nxt - p
            r.key_pos = kp
            r.key_len = kl
            r.value_pos = vp
            r.value_len = vl
            r.headers_pos = hp
            r.header_count = hc
            r.buffer_id = buffer_id
            j += 1
            p = nxt
        if p != end:
            return 13, p, i
    return 0, 0, 0


# ---------------------------------------------------------------------------------------
# Python side: one call per segment, loops per batch only.


@dataclass(frozen=True, slots=True)
class RecordColumns:
    """One row per record of an uncompressed records area; positions index the area's
    buffer, lengths are -1 for null."""

    record_pos: I64
    record_size: I32
    timestamp_delta: I64
    offset_delta: I32
    key_pos: I64
    key_len: I32
    value_pos: I64
    value_len: I32
    headers_pos: I64
    header_count: I32

    def __len__(self) -> int:
        return len(self.record_pos)


AREA_ROW: Final = np.dtype(
    [
        ("record_pos", np.int64),
        ("timestamp_delta", np.int64),
        ("key_pos", np.int64),
        ("value_pos", np.int64),
        ("headers_pos", np.int64),
        ("record_size", np.int32),
        ("offset_delta", np.int32),
        ("key_len", np.int32),
        ("value_len", np.int32),
        ("header_count", np.int32),
    ],
    align=True,
)


def _row_views(dtype: np.dtype[np.void], names: list[str], n: int) -> list[Array]:
    """Column views into one table of `n` rows of `dtype`. The kernels write a record's
    fields next to each other: a dozen separate column streams are several times slower
    to fill (each write touches its own cache line)."""
    table = np.empty(n, dtype)
    return [table[name] for name in names]


def _empty_record_columns(n: int) -> RecordColumns:
    return RecordColumns(*_row_views(AREA_ROW, [f.name for f in fields(RecordColumns)], n))


def record_columns(
    area: Buffer | U8, *, start: int = 0, end: int | None = None, count: int | None = None
) -> RecordColumns:
    """Decode the uncompressed records in `area[start:end]` (one batch's records area or
    several back to back). With `count`, the area must hold exactly that many records.

    Raise CorruptRecordError with the byte position of the first malformed record."""
    buf = as_uint8(area)
    stop = len(buf) if end is None else min(end, len(buf))
    probe = _empty_record_columns(0)
    n, status, err = (int(x) for x in _area_kernel(buf, start, stop, False, *_record_arrays(probe)))
    if status != 0:
        raise CorruptRecordError(_MESSAGES[status], position=err)
    if count is not None and count != n:
        raise CorruptRecordError(
            f"records area holds {n} records, {count} declared", position=start
        )
    cols = _empty_record_columns(n)
    _area_kernel(buf, start, stop, True, *_record_arrays(cols))
    return cols


def _record_arrays(cols: RecordColumns) -> list[Array]:
    return [getattr(cols, f.name) for f in fields(cols)]


@dataclass(frozen=True, slots=True)
class SegmentColumns:
    """A segment as columns: a batch table (one row per v2 batch or shallow legacy entry,
    in file order) and a record table (one row per record, in file order).

    Batch rows of batch b are records ``batch_first_record[b] : batch_first_record[b] +
    records_count[b]``. For legacy rows: attributes is the message attribute byte (codec
    bits 0-2, v1 timestamp type bit 3, as in v2), base_offset/last_offset_delta span the
    inner offsets, producer fields and base_timestamp are -1, records_area_pos is -1.
    """

    segment: U8
    side: U8
    # batch table
    batch_position: I64
    batch_size: I64
    batch_magic: I8
    base_offset: I64
    partition_leader_epoch: I32
    batch_crc: I64
    attributes: I16
    last_offset_delta: I32
    base_timestamp: I64
    max_timestamp: I64
    producer_id: I64
    producer_epoch: I16
    base_sequence: I32
    records_count: I32
    records_area_pos: I64
    batch_first_record: I64
    # record table
    batch_index: I32
    offset: I64
    timestamp: I64
    record_pos: I64
    record_size: I32
    key_pos: I64
    key_len: I32
    value_pos: I64
    value_len: I32
    headers_pos: I64
    header_count: I32
    buffer_id: U8

    @property
    def num_batches(self) -> int:
        return len(self.batch_position)

    @property
    def num_records(self) -> int:
        return len(self.offset)

    @property
    def table_bytes(self) -> int:
        """The memory of the batch and record tables (the buffers not counted)."""
        held: dict[int, int] = {}
        for f in fields(self)[2:]:
            column = getattr(self, f.name)
            owner = column if column.base is None else column.base
            held[id(owner)] = owner.nbytes
        return sum(held.values())

    @property
    def buffers(self) -> tuple[U8, U8]:
        """(segment, side), indexed by `buffer_id`."""
        return self.segment, self.side

    @property
    def valid_bytes(self) -> int:
        """Bytes from the first batch to the end of the last (0 if there are none)."""
        if not self.num_batches:
            return 0
        return int(self.batch_position[-1] + self.batch_size[-1] - self.batch_position[0])

    def _slice(self, i: int, pos: I64, length: I32) -> bytes | None:
        n = int(length[i])
        if n < 0:
            return None
        p = int(pos[i])
        return self.buffers[int(self.buffer_id[i])][p : p + n].tobytes()

    def key(self, i: int) -> bytes | None:
        """The key of record row `i` (None if null)."""
        return self._slice(i, self.key_pos, self.key_len)

    def value(self, i: int) -> bytes | None:
        """The value of record row `i` (None for a tombstone)."""
        return self._slice(i, self.value_pos, self.value_len)

    def headers(self, i: int) -> tuple[RecordHeader, ...]:
        """The headers of record row `i`, decoded (for tests and tools, not hot loops)."""
        buf = self.buffers[int(self.buffer_id[i])].data
        p = int(self.headers_pos[i])
        out = []
        for _ in range(int(self.header_count[i])):
            n, p = decode_varint(buf, p)
            key = bytes(buf[p : p + n]).decode("utf-8", "surrogateescape")
            p += n
            n, p = decode_varint(buf, p)
            value = None if n < 0 else bytes(buf[p : p + n])
            p += max(n, 0)
            out.append(RecordHeader(key, value))
        return tuple(out)

    def batch_table(self) -> BatchTable:
        """The batch table as `walker.py` has it (views of these columns)."""
        return BatchTable(
            self.batch_position,
            self.batch_size,
            self.batch_magic,
            self.base_offset,
            self.partition_leader_epoch,
            self.batch_crc,
            self.attributes,
            self.last_offset_delta,
            self.base_timestamp,
            self.max_timestamp,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            self.records_count,
        )

    def batch_header(self, b: int) -> BatchHeader | None:
        """The v2 header of batch row `b` as stored (None for a legacy entry)."""
        return self.batch_table().header(b)


@dataclass(slots=True)
class _Legacy:
    """Records of legacy rows, gathered in Python."""

    rows: list[int]
    offset: list[int]
    timestamp: list[int]
    record_pos: list[int]
    record_size: list[int]
    key_pos: list[int]
    key_len: list[int]
    value_pos: list[int]
    value_len: list[int]
    buffer_id: list[int]


class _SideBuffer:
    """The decompressed bytes of a segment's compressed batches, back to back. Batches
    decompress straight into it; it starts at a few times the compressed size (numpy does
    not touch pages it is not asked to write) and doubles when a batch does not fit."""

    RATIO_GUESS: Final = 4
    MIN_BYTES: Final = 1 << 16
    MAX_INITIAL_BYTES: Final = 1 << 28

    def __init__(self, compressed_bytes: int) -> None:
        guess = min(compressed_bytes * self.RATIO_GUESS, self.MAX_INITIAL_BYTES)
        self.buf = np.empty(max(guess, self.MIN_BYTES), np.uint8)
        self.used = 0

    def _reserve(self, n: int) -> None:
        if self.used + n > len(self.buf):
            grown = np.empty(max(2 * len(self.buf), self.used + n), np.uint8)
            grown[: self.used] = self.buf[: self.used]
            self.buf = grown

    def grow(self) -> None:
        """Double the room (for output whose size is not known before it is written)."""
        self._reserve(len(self.buf) - self.used + 1)

    def append(self, data: bytes) -> int:
        """Copy `data` in; return where it starts."""
        self._reserve(len(data))
        start = self.used
        self.buf[start : start + len(data)] = np.frombuffer(data, np.uint8)
        self.used += len(data)
        return start

    def extend(self, chunks: list[bytes]) -> tuple[I64, I64]:
        """Copy `chunks` in, one after another; return where each starts and ends."""
        ends = self.used + np.cumsum([len(c) for c in chunks], dtype=np.int64)
        self.append(b"".join(chunks))
        return np.concatenate([[ends[0] - len(chunks[0])], ends[:-1]]), ends

    def decompress(self, codec: int, area: memoryview) -> tuple[int, int]:
        """Decompress `area` in; return its (start, end). CorruptRecordError if bad."""
        start = self.used
        written = decompress_into(codec, area, self.buf[start:])
        if written is None:
            self.append(decompress(codec, area))
        else:
            self.used += written
        return start, self.used

    def array(self) -> U8:
        if not self.used:  # a view would keep the initial reservation alive
            return np.empty(0, np.uint8)
        return self.buf[: self.used]


def _read_legacy(
    view: memoryview, table: BatchTable, side: _SideBuffer, verify_crc: bool
) -> _Legacy:
    out = _Legacy([], [], [], [], [], [], [], [], [], [])
    for row in np.flatnonzero(table.magic != 2).tolist():
        p = int(table.position[row])
        entry = legacy.read_legacy_entry(view, p, p + int(table.size[row]), verify_crc=verify_crc)
        if entry.compression is Compression.NONE:
            entries, base, bid = [entry], 0, SEGMENT
            offsets, timestamps = [entry.offset], [entry.timestamp]
        else:
            inner, entries = legacy.decompress_wrapper(entry, verify_crc=verify_crc)
            offsets = legacy.inner_offsets(entry, entries)
            timestamps = legacy.inner_timestamps(entry, entries)
            base, bid = side.append(inner), SIDE
        for e, offset, ts in zip(entries, offsets, timestamps, strict=True):
            out.rows.append(row)
            out.offset.append(offset)
            out.timestamp.append(ts)
            out.record_pos.append(base + e.position)
            out.record_size.append(e.size)
            out.key_pos.append(base + e.key_pos)
            out.key_len.append(-1 if e.key is None else len(e.key))
            out.value_pos.append(base + e.value_pos)
            out.value_len.append(-1 if e.value is None else len(e.value))
            out.buffer_id.append(bid)
    return out


def _check_counts(table: BatchTable, rows: I64, area_len: I64) -> None:
    """Refuse record counts the areas cannot hold, before allocating the record table."""
    if not len(rows):
        return
    bad = np.flatnonzero(table.records_count[rows].astype(np.int64) * MIN_RECORD_SIZE > area_len)
    if len(bad):
        row = int(rows[bad[0]])
        raise CorruptRecordError(
            f"recordsCount {int(table.records_count[row])} cannot fit in "
            f"{int(area_len[bad[0]])} bytes of records",
            position=int(table.position[row]),
        )


def _run_ends(values: Array) -> list[int]:
    """For each position of `values`, where its run of equal values ends."""
    changes = np.flatnonzero(values[1:] != values[:-1]) + 1
    ends = np.append(changes, len(values))
    return np.repeat(ends, np.diff(np.concatenate([[0], ends]))).tolist()


def _decompress_areas(
    seg: U8, view: memoryview, table: BatchTable, rows: I64, side: _SideBuffer
) -> tuple[I64, I64]:
    """Decompress the records areas of the compressed batches `rows` into `side`, in
    file order; return where each went. LZ4, snappy and (with libzstd and zlib) zstd and
    gzip in compiled code (`compiled_codecs.py`), gzip and zstd without them a run of
    batches per call (`compression.decompress_frames`); whatever those leave (damage, an
    unusual framing) through `compression.decompress`, one call each, which reads it or
    names the error."""
    if not len(rows):  # most segments: their dozen array steps cost more than the walk
        return np.empty(0, np.int64), np.empty(0, np.int64)
    starts = table.position[rows] + RECORD_BATCH_OVERHEAD
    ends = table.position[rows] + table.size[rows]
    codecs = table.attributes[rows] & COMPRESSION_MASK
    out_start = np.empty(len(rows), np.int64)
    out_end = np.empty(len(rows), np.int64)
    compiled = (codecs == Compression.LZ4) | (codecs == Compression.SNAPPY)
    zstd = codecs == Compression.ZSTD
    dctx = compiled_codecs.zstd_context() if zstd.any() else 0
    if dctx:
        compiled |= zstd
    lz4_native = bool((codecs == Compression.LZ4).any()) and (
        compiled_codecs.lz4_library() is not None
    )
    gzip = codecs == Compression.GZIP
    inflating = zlib_streams.inflating() if gzip.any() else None
    if inflating is not None:
        compiled |= gzip
    else:
        inflating = compiled_codecs.NO_STREAM
    run_end = _run_ends(codecs)
    i = 0
    while i < len(rows):
        if compiled[i]:
            status, i, side.used = (
                int(x)
                for x in compiled_codecs.decompress_areas(
                    seg,
                    starts,
                    ends,
                    codecs,
                    side.buf,
                    side.used,
                    out_start,
                    out_end,
                    i,
                    dctx,
                    inflating,
                    lz4_native,
                )
            )
            if status == compiled_codecs.NEEDS_ROOM:
                side.grow()
                continue
            if status == compiled_codecs.OK:
                break
        else:  # a run of gzip or zstd batches: many per call
            run = slice(i, run_end[i])
            frames = decompress_frames(
                int(codecs[i]), view, starts[run].tolist(), ends[run].tolist()
            )
            if frames:
                out_start[i : i + len(frames)], out_end[i : i + len(frames)] = side.extend(frames)
                i += len(frames)
                continue
        p, end = int(starts[i]), int(ends[i])
        try:
            out_start[i], out_end[i] = side.decompress(int(codecs[i]), view[p:end])
        except CorruptRecordError as exc:
            raise CorruptRecordError(exc.reason, position=p - RECORD_BATCH_OVERHEAD) from exc
        i += 1
    return out_start, out_end


def segment_columns(
    buf: Buffer | U8,
    *,
    start: int = 0,
    end: int | None = None,
    verify_crc: bool = True,
    offsets: OffsetRange = ANY_OFFSETS,
) -> SegmentColumns:
    """Decode every batch in `buf[start:end]` (a segment's bytes) into columns.

    Raise CorruptRecordError at the first bad batch or record, naming its byte position in
    `buf` (for a record inside compressed data: the batch's position and the byte within
    the decompressed records)."""
    seg = as_uint8(buf)
    stop = len(seg) if end is None else min(end, len(seg))
    table = walk_strict(seg, start=start, end=stop, verify_crc=verify_crc, offsets=offsets)
    try:
        return _columns_of(seg, table, verify_crc=verify_crc)
    except CorruptRecordError as exc:
        raise _naming_its_batch(exc, seg, table) from None


def _naming_its_batch(error: CorruptRecordError, seg: U8, table: BatchTable) -> CorruptRecordError:
    """`error`, met inside a batch the walk passed (its records, their decompression),
    naming the offset that batch's header holds, as the walk names a batch it refuses
    (`scan.naming_offset`, which reads the batch's own header)."""
    if error.position is None or not len(table):
        return error
    row = int(np.searchsorted(table.position, error.position, side="right")) - 1
    if row < 0:
        return error
    return naming_offset(error, seg.data, int(table.position[row]), len(seg))


def _columns_of(seg: U8, table: BatchTable, *, verify_crc: bool) -> SegmentColumns:
    """The columns of the batches of `table`, walked in `seg`."""
    view = seg.data
    v2 = table.magic == 2
    compressed = v2 & ((table.attributes & COMPRESSION_MASK) != 0)
    plain_rows = np.flatnonzero(v2 & ~compressed)
    packed_rows = np.flatnonzero(compressed)

    plain_start = table.position[plain_rows] + RECORD_BATCH_OVERHEAD
    plain_end = table.position[plain_rows] + table.size[plain_rows]
    _check_counts(table, plain_rows, plain_end - plain_start)

    side = _SideBuffer(int(table.size[packed_rows].sum()))
    packed_start, packed_end = _decompress_areas(seg, view, table, packed_rows, side)
    _check_counts(table, packed_rows, packed_end - packed_start)

    old = _read_legacy(view, table, side, verify_crc)
    side_bytes = side.array()

    counts = table.records_count.astype(np.int64)
    first = np.zeros(len(counts), np.int64)
    np.cumsum(counts[:-1], out=first[1:])
    total = int(counts.sum())
    rows_table = np.empty(total, SEGMENT_ROW)
    rec = [rows_table[name] for name in RECORD_TABLE]  # SegmentColumns' column views
    for bid, rows, a_start, a_end in (
        (SEGMENT, plain_rows, plain_start, plain_end),
        (SIDE, packed_rows, packed_start, packed_end),
    ):
        if not rows.size:
            continue  # no call: each buffer kind is a signature of its own to load
        result = _batches_kernel(
            side_bytes if bid == SIDE else seg,
            rows.astype(np.int64),
            a_start,
            a_end,
            table.records_count,
            first,
            table.base_offset,
            table.base_timestamp,
            table.max_timestamp,
            table.attributes,
            bid,
            rows_table,
        )
        status, err, i = (int(x) for x in result)
        if status != 0:
            row = int(rows[i])
            if bid == SEGMENT:
                raise CorruptRecordError(_MESSAGES[status], position=err)
            raise CorruptRecordError(
                f"{_MESSAGES[status]} (byte {err - int(a_start[i])} of the decompressed records)",
                position=int(table.position[row]),
            )
    _fill_legacy(rec, old, first)

    records_area_pos = np.where(v2, table.position + RECORD_BATCH_OVERHEAD, -1)
    return SegmentColumns(
        seg,
        side_bytes,
        table.position,
        table.size,
        table.magic,
        table.base_offset,
        table.partition_leader_epoch,
        table.crc,
        table.attributes,
        table.last_offset_delta,
        table.base_timestamp,
        table.max_timestamp,
        table.producer_id,
        table.producer_epoch,
        table.base_sequence,
        table.records_count,
        records_area_pos,
        first,
        *rec,
    )


SEGMENT_ROW: Final = np.dtype(
    [
        ("offset", np.int64),
        ("timestamp", np.int64),
        ("record_pos", np.int64),
        ("key_pos", np.int64),
        ("value_pos", np.int64),
        ("headers_pos", np.int64),
        ("batch_index", np.int32),
        ("record_size", np.int32),
        ("key_len", np.int32),
        ("value_len", np.int32),
        ("header_count", np.int32),
        ("buffer_id", np.uint8),
    ],
    align=True,
)
RECORD_TABLE: Final = [  # the record table's columns, in SegmentColumns order
    "batch_index",
    "offset",
    "timestamp",
    "record_pos",
    "record_size",
    "key_pos",
    "key_len",
    "value_pos",
    "value_len",
    "headers_pos",
    "header_count",
    "buffer_id",
]


def _fill_legacy(rec: list[Array], old: _Legacy, first: I64) -> None:
    if not old.rows:
        return
    rows = np.asarray(old.rows, np.int64)
    # rows repeat once per inner record; its rank within its row gives the slot
    starts = np.r_[0, np.flatnonzero(np.diff(rows)) + 1]
    rank = np.arange(len(rows)) - np.repeat(starts, np.diff(np.r_[starts, len(rows)]))
    slots = first[rows] + rank
    columns = [
        old.rows,
        old.offset,
        old.timestamp,
        old.record_pos,
        old.record_size,
        old.key_pos,
        old.key_len,
        old.value_pos,
        old.value_len,
        [-1] * len(rows),
        [0] * len(rows),
        old.buffer_id,
    ]
    for target, values in zip(rec, columns, strict=True):
        target[slots] = values


@jit
def _coordinator_epochs(buf: U8, position: I64, size: I64, out: I32) -> tuple[Int, Int]:
    """For each uncompressed control batch at position[i], the coordinator epoch in the
    value of its first record (an EndTxnMarker: version int16 | coordinatorEpoch int32),
    or -1 when the value is shorter; (status, failing i)."""
    at = bytes_address(buf)
    for i in range(position.shape[0]):
        p = position[i] + RECORD_BATCH_OVERHEAD
        st, _, _, _, _, _, _, vp, vl, _, _ = parse_record(at, p, position[i] + size[i])
        if st != 0:
            return st, i
        out[i] = be_i32(at, vp + 2) if vl >= 6 else -1
    return 0, 0


def marker_coordinator_epochs(buf: Buffer | U8, position: I64, size: I64) -> I32:
    """The coordinator epochs of the transaction markers at `position` (batch starts in
    `buf`, markers are never compressed), in one compiled call; CorruptRecordError names
    the position of a marker whose record does not parse."""
    out = np.empty(len(position), np.int32)
    status, i = (int(x) for x in _coordinator_epochs(as_uint8(buf), position, size, out))
    if status != 0:
        raise CorruptRecordError(_MESSAGES[status], position=int(position[i]))
    return out
