"""Decoding and encoding whole v2 record batches (Kafka's DefaultRecordBatch and
MemoryRecordsBuilder), and deep iteration over any batch, legacy included.

Layout: the 61-byte header documented in `header.py`, then ``recordsCount`` records in the
layout documented in `record.py`. For a compressed batch the whole records area (everything
after the header) is one compressed stream.

Encoding follows MemoryRecordsBuilder: baseTimestamp is the first record's timestamp, or the
delete horizon when one is given (attribute bit 6; record timestamp deltas are then relative
to the horizon and may be negative); offset deltas are relative to baseOffset; a null key,
value or header value has length -1. The CRC-32C covers [attributes, end) and is computed
last. Decoding an uncompressed batch and encoding the result with the same header fields
reproduces the original bytes (except a LogAppendTime batch whose producer-written
timestamp deltas are not zero: readers see only its maxTimestamp, as in Kafka).

This module is the pure reference decoder: it builds one Python object per record. Code
that touches every record of a segment uses `columns.py` instead.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from cleanerd.errors import CorruptRecordError
from cleanerd.records import legacy
from cleanerd.records.compression import compress, decompress
from cleanerd.records.crc32c_library import crc32c
from cleanerd.records.header import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_MASK,
    CONTROL_MASK,
    CRC_OFFSET,
    DELETE_HORIZON_MASK,
    HEADER,
    INT32_MAX,
    LOG_OVERHEAD,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    NO_TIMESTAMP,
    RECORD_BATCH_OVERHEAD,
    TRANSACTIONAL_MASK,
    BatchHeader,
    Buffer,
    Compression,
    TimestampType,
    unpack_header,
    validate_v2_header,
)
from cleanerd.records.record import Record, RecordHeader
from cleanerd.records.scan import BatchInfo
from cleanerd.records.varint import decode_varint, decode_varlong, encode_varint, encode_varlong

MAGIC_V2: Final = 2


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """A decoded v2 batch: its header as stored and its records (absolute offsets)."""

    header: BatchHeader
    records: tuple[Record, ...]


class _RecordReader:
    """Reads the records of one batch from `data[pos:end]`. Errors name the byte itself
    for uncompressed data (`in_batch`), else the batch and the byte in the decompressed
    data."""

    __slots__ = (
        "base_offset",
        "base_timestamp",
        "batch_position",
        "data",
        "end",
        "fixed_timestamp",
        "in_batch",
        "pos",
    )

    def __init__(self, data: Buffer, pos: int, end: int, h: BatchHeader, in_batch: bool) -> None:
        self.data = data
        self.pos = pos
        self.end = end
        self.in_batch = in_batch
        self.batch_position = h.position
        self.base_offset = h.base_offset
        self.base_timestamp = h.base_timestamp
        log_append = h.timestamp_type is TimestampType.LOG_APPEND_TIME
        self.fixed_timestamp = h.max_timestamp if log_append else None

    def fail(self, reason: str, at: int) -> CorruptRecordError:
        if self.in_batch:
            return CorruptRecordError(reason, position=at)
        return CorruptRecordError(
            f"{reason} (byte {at} of the decompressed records)", position=self.batch_position
        )

    def read(self) -> Record:
        data = self.data
        start = self.pos
        try:
            length, p = decode_varint(data, start, self.end)
            if length < 0 or p + length > self.end:
                raise CorruptRecordError(
                    f"record length {length} runs past the end of the batch "
                    f"({self.end - p} bytes left)",
                    position=start,
                )
            stop = p + length
            if p >= stop:
                raise CorruptRecordError("record has no attributes byte", position=start)
            attributes = data[p]
            ts_delta, p = decode_varlong(data, p + 1, stop)
            offset_delta, p = decode_varint(data, p, stop)
            key, p = self._bytes(p, stop, "key", start)
            value, p = self._bytes(p, stop, "value", start)
            headers, p = self._headers(p, stop, start)
            if p != stop:
                raise CorruptRecordError(
                    f"record length {length} disagrees with its fields ({stop - p} bytes left)",
                    position=start,
                )
        except CorruptRecordError as exc:
            raise self.fail(exc.reason, start if exc.position is None else exc.position) from exc
        self.pos = stop
        timestamp = self.fixed_timestamp
        if timestamp is None:
            timestamp = self.base_timestamp + ts_delta
        return Record(self.base_offset + offset_delta, timestamp, key, value, headers, attributes)

    def _bytes(self, p: int, stop: int, what: str, start: int) -> tuple[bytes | None, int]:
        n, p = decode_varint(self.data, p, stop)
        if n == -1:
            return None, p
        if n < 0 or p + n > stop:
            raise CorruptRecordError(
                f"{what} length {n} runs past the end of the record ({stop - p} bytes left)",
                position=start,
            )
        return bytes(self.data[p : p + n]), p + n

    def _headers(self, p: int, stop: int, start: int) -> tuple[tuple[RecordHeader, ...], int]:
        count, p = decode_varint(self.data, p, stop)
        if count == 0:
            return (), p
        if count < 0:
            raise CorruptRecordError(f"negative header count {count}", position=start)
        headers = []
        for _ in range(count):
            key, p = self._bytes(p, stop, "header key", start)
            if key is None:
                raise CorruptRecordError("null header key", position=start)
            value, p = self._bytes(p, stop, "header value", start)
            headers.append(RecordHeader(key.decode("utf-8", "surrogateescape"), value))
        return tuple(headers), p


def read_records(buf: Buffer, h: BatchHeader) -> tuple[Record, ...]:
    """Decode the records of the (already validated) v2 batch `h` read from `buf`."""
    area_start = h.position + RECORD_BATCH_OVERHEAD
    area_end = h.position + h.size_in_bytes
    if h.compression is Compression.NONE:
        reader = _RecordReader(buf, area_start, area_end, h, in_batch=True)
    else:
        try:
            data = decompress(h.attributes & COMPRESSION_MASK, memoryview(buf)[area_start:area_end])
        except CorruptRecordError as exc:
            raise CorruptRecordError(exc.reason, position=h.position) from exc
        reader = _RecordReader(data, 0, len(data), h, in_batch=False)
    records = []
    for i in range(h.records_count):
        if reader.pos >= reader.end:
            raise reader.fail(
                f"batch declares {h.records_count} records but holds only {i}", reader.pos
            )
        records.append(reader.read())
    if reader.pos != reader.end:
        raise reader.fail(
            f"{reader.end - reader.pos} bytes follow the last of {h.records_count} records",
            reader.pos,
        )
    return tuple(records)


def decode_batch(buf: Buffer, position: int = 0, *, verify_crc: bool = True) -> RecordBatch:
    """Decode the v2 batch at `position` of `buf`, records included.

    Raise CorruptRecordError naming the byte position on any inconsistency."""
    if len(buf) - position < RECORD_BATCH_OVERHEAD:
        raise CorruptRecordError(
            f"incomplete batch header: only {len(buf) - position} bytes left", position=position
        )
    h = unpack_header(buf, position)
    validate_v2_header(buf, h, check=verify_crc)
    return RecordBatch(h, read_records(buf, h))


def iter_records(buf: Buffer, info: BatchInfo) -> Iterator[Record]:
    """Yield the records of the batch `info` found by a scan of `buf`: v2 or legacy (a
    compressed legacy wrapper yields its inner records)."""
    if info.magic == MAGIC_V2:
        h = info.header if info.header is not None else unpack_header(buf, info.position)
        yield from read_records(buf, h)
    else:
        yield from legacy.iter_legacy_records(buf, info.position)


def _encode_record(r: Record, base_offset: int, base_timestamp: int) -> bytes:
    body = bytearray((r.attributes,))
    body += encode_varlong(r.timestamp - base_timestamp)
    body += encode_varint(r.offset - base_offset)
    _append_bytes(body, r.key)
    _append_bytes(body, r.value)
    body += encode_varint(len(r.headers))
    for header in r.headers:
        _append_bytes(body, header.key.encode("utf-8", "surrogateescape"))
        _append_bytes(body, header.value)
    return encode_varint(len(body)) + body


def _append_bytes(out: bytearray, value: bytes | None) -> None:
    if value is None:
        out += encode_varint(-1)
    else:
        out += encode_varint(len(value))
        out += value


def _check_offsets(records: Sequence[Record], base_offset: int) -> None:
    previous = base_offset - 1
    for r in records:
        if r.offset <= previous:
            raise ValueError(
                f"record offsets must increase from base offset {base_offset}: "
                f"{r.offset} follows {previous}"
            )
        previous = r.offset
    if previous - base_offset > INT32_MAX:
        raise ValueError(f"offset {previous} is too far from base offset {base_offset}")


def attributes_of(
    compression: Compression,
    timestamp_type: TimestampType,
    *,
    is_transactional: bool,
    is_control: bool,
    has_delete_horizon: bool,
) -> int:
    """The v2 batch attributes int16 for these properties."""
    attributes = int(compression) | (int(timestamp_type) << 3)
    if is_transactional:
        attributes |= TRANSACTIONAL_MASK
    if is_control:
        attributes |= CONTROL_MASK
    if has_delete_horizon:
        attributes |= DELETE_HORIZON_MASK
    return attributes


def _assemble(h: BatchHeader, area: bytes) -> bytes:
    """Header + records area with the CRC filled in; `h.crc` and `h.batch_length` ignored."""
    batch_length = RECORD_BATCH_OVERHEAD - LOG_OVERHEAD + len(area)
    head = bytearray(
        HEADER.pack(
            h.base_offset,
            batch_length,
            h.partition_leader_epoch,
            MAGIC_V2,
            0,
            h.attributes,
            h.last_offset_delta,
            h.base_timestamp,
            h.max_timestamp,
            h.producer_id,
            h.producer_epoch,
            h.base_sequence,
            h.records_count,
        )
    )
    crc = crc32c(area, crc32c(memoryview(head)[ATTRIBUTES_OFFSET:]))
    head[CRC_OFFSET : CRC_OFFSET + 4] = crc.to_bytes(4, "big")
    return bytes(head) + area


def encode_batch(
    records: Sequence[Record],
    *,
    base_offset: int,
    last_offset_delta: int | None = None,
    compression: Compression = Compression.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    max_timestamp: int | None = None,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    is_transactional: bool = False,
    is_control: bool = False,
    delete_horizon_ms: int | None = None,
    base_timestamp: int | None = None,
) -> bytes:
    """Return one v2 batch holding `records` (at least one, offsets increasing from
    `base_offset`). Defaults: lastOffsetDelta = last record offset - base_offset,
    maxTimestamp = the largest record timestamp, baseTimestamp = the delete horizon if
    given, else the first record's timestamp (`base_timestamp` overrides that, to
    reproduce batches from writers that chose another base)."""
    if not records:
        raise ValueError("a batch needs at least one record; use encode_empty_batch")
    _check_offsets(records, base_offset)
    natural_delta = records[-1].offset - base_offset
    if last_offset_delta is None:
        last_offset_delta = natural_delta
    elif not natural_delta <= last_offset_delta <= INT32_MAX:
        raise ValueError(
            f"last_offset_delta {last_offset_delta} is out of range "
            f"(the last record's delta is {natural_delta})"
        )
    if delete_horizon_ms is not None:
        if base_timestamp is not None and base_timestamp != delete_horizon_ms:
            raise ValueError("with a delete horizon, the base timestamp is the horizon")
        base_timestamp = delete_horizon_ms
    elif base_timestamp is None:
        base_timestamp = records[0].timestamp
    if max_timestamp is None:
        max_timestamp = max(r.timestamp for r in records)
    area = b"".join(_encode_record(r, base_offset, base_timestamp) for r in records)
    if compression is not Compression.NONE:
        area = compress(compression, area)
    attributes = attributes_of(
        compression,
        timestamp_type,
        is_transactional=is_transactional,
        is_control=is_control,
        has_delete_horizon=delete_horizon_ms is not None,
    )
    h = BatchHeader(
        base_offset,
        0,
        partition_leader_epoch,
        MAGIC_V2,
        0,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        len(records),
    )
    return _assemble(h, area)


def encode_batch_like(
    original: BatchHeader, records: Sequence[Record], *, delete_horizon_ms: int | None
) -> bytes:
    """Re-encode the kept `records` of the batch `original` the way Kafka's cleaner does
    (MemoryRecords.filterTo): same base offset, lastOffsetDelta, codec, timestamp type,
    producer fields, leader epoch and flags; maxTimestamp = the largest kept timestamp
    (CreateTime) or the original (LogAppendTime); `delete_horizon_ms` or none."""
    log_append = original.timestamp_type is TimestampType.LOG_APPEND_TIME
    return encode_batch(
        records,
        base_offset=original.base_offset,
        last_offset_delta=original.last_offset_delta,
        compression=original.compression,
        timestamp_type=original.timestamp_type,
        max_timestamp=original.max_timestamp if log_append else None,
        producer_id=original.producer_id,
        producer_epoch=original.producer_epoch,
        base_sequence=original.base_sequence,
        partition_leader_epoch=original.partition_leader_epoch,
        is_transactional=original.is_transactional,
        is_control=original.is_control,
        delete_horizon_ms=delete_horizon_ms,
    )


def encode_empty_batch(
    *,
    base_offset: int,
    last_offset_delta: int,
    max_timestamp: int,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    is_transactional: bool = False,
    is_control: bool = False,
) -> bytes:
    """Return the 61-byte empty batch Kafka's cleaner keeps for a producer's last batch
    (DefaultRecordBatch.writeEmptyHeader): no records, compression none, baseTimestamp -1,
    no delete horizon."""
    if not 0 <= last_offset_delta <= INT32_MAX:
        raise ValueError(f"last_offset_delta {last_offset_delta} is out of range")
    attributes = attributes_of(
        Compression.NONE,
        timestamp_type,
        is_transactional=is_transactional,
        is_control=is_control,
        has_delete_horizon=False,
    )
    h = BatchHeader(
        base_offset,
        0,
        partition_leader_epoch,
        MAGIC_V2,
        0,
        attributes,
        last_offset_delta,
        NO_TIMESTAMP,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        0,
    )
    return _assemble(h, b"")


def empty_batch_of(original: BatchHeader) -> bytes:
    """The empty header that retains `original`'s offsets and producer state (ref 4.10)."""
    return encode_empty_batch(
        base_offset=original.base_offset,
        last_offset_delta=original.last_offset_delta,
        max_timestamp=original.max_timestamp,
        producer_id=original.producer_id,
        producer_epoch=original.producer_epoch,
        base_sequence=original.base_sequence,
        partition_leader_epoch=original.partition_leader_epoch,
        timestamp_type=original.timestamp_type,
        is_transactional=original.is_transactional,
        is_control=original.is_control,
    )
