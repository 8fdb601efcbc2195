"""The checks a batch in a buffer (a segment file's bytes) must pass, one batch at a time:
the reference `walker.py`'s compiled walk agrees with, and the source of its error
messages.

Every batch, v2 or legacy, starts with ``offset int64 | length int32`` (the 12-byte log
overhead; length counts the bytes after it) and has its magic byte at position 16, so a
scan reads 17 bytes, learns the format and the size, checks the batch and steps over it.
Checks, in order (Kafka's FileLogInputStream and RecordBatch.ensureValid):

1. at least 17 bytes left, else the tail is an incomplete batch;
2. magic 0, 1 or 2;
3. size at least the format's minimum (61 for v2, 26/34 for legacy v0/v1);
4. size within the data, else the tail is an incomplete batch;
5. the CRC (v2: CRC-32C of [21, end); legacy: CRC-32 of [16, end));
6. offsets consistent (v2: lastOffsetDelta >= 0, 0 <= recordsCount <= lastOffsetDelta + 1).

The first failure raises CorruptRecordError whose position is the batch's position in the
buffer; `IncompleteBatchError` when the batch is merely cut short (a crash mid-append).
`walker.walk` stops there instead, and says why.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from cleanerd.errors import CorruptRecordError
from cleanerd.records import legacy
from cleanerd.records.header import (
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    NO_TIMESTAMP,
    PREFIX_SIZE,
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    Buffer,
    Compression,
    base_offset_at,
    unpack_header,
    validate_v2_header,
)

_SIZE_AND_MAGIC: Final = struct.Struct(">i4xb")  # from LENGTH_OFFSET: length, epoch, magic


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """Where one batch (v2) or shallow legacy entry sits in the buffer, and its offsets."""

    position: int
    size: int
    magic: int
    base_offset: int
    last_offset: int
    max_timestamp: int
    header: BatchHeader | None

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1


class IncompleteBatchError(CorruptRecordError):
    """A batch cut short by the end of the data (a crash mid-append), as opposed to a
    batch with bad bytes."""


def _min_size(magic: int) -> int:
    return RECORD_BATCH_OVERHEAD if magic == 2 else legacy.min_entry_size(magic)


def _scan_v2(buf: Buffer, position: int, verify_crc: bool) -> BatchInfo:
    h = unpack_header(buf, position)
    validate_v2_header(buf, h, check=verify_crc)
    if h.records_count > h.last_offset_delta + 1:
        raise CorruptRecordError(
            f"recordsCount {h.records_count} exceeds lastOffsetDelta {h.last_offset_delta} + 1",
            position=position,
        )
    return BatchInfo(position, h.size_in_bytes, 2, h.base_offset, h.last_offset, h.max_timestamp, h)


def _scan_legacy(buf: Buffer, position: int, end: int, verify_crc: bool) -> BatchInfo:
    entry = legacy.read_legacy_entry(buf, position, end, verify_crc=verify_crc)
    base = entry.offset
    if entry.compression is not Compression.NONE:
        base = legacy.entry_records(entry, verify_crc=verify_crc)[0].offset
    ts = entry.timestamp if entry.magic == 1 else NO_TIMESTAMP
    return BatchInfo(position, entry.size, entry.magic, base, entry.offset, ts, None)


def check_batch_at(buf: Buffer, position: int, end: int, *, verify_crc: bool) -> BatchInfo:
    """Check the batch at `position` (which must end by `end`) and describe it; raise
    CorruptRecordError (position = `position`) if it is incomplete or invalid, naming the
    offset its header holds (`naming_offset`)."""
    try:
        return _check_batch_at(buf, position, end, verify_crc=verify_crc)
    except CorruptRecordError as exc:
        error = naming_offset(exc, buf, position, end)
    # Raised here, not in the handler: the error would hold the first one as its context,
    # whose frames hold views of `buf` (a mapping its reader then cannot close).
    raise error


def naming_offset(
    error: CorruptRecordError, buf: Buffer, position: int, end: int
) -> CorruptRecordError:
    """`error`, of the batch at `position`, naming the offset the batch's first 8 bytes
    hold (when it has them): no CRC covers that field, so it is told as what the header
    says, which is what an operator looks the batch up by."""
    if end - position < 8:
        return error
    return type(error)(
        f"{error.reason} (its header names offset {base_offset_at(buf, position)})",
        path=error.path,
        position=error.position,
    )


def _check_batch_at(buf: Buffer, position: int, end: int, *, verify_crc: bool) -> BatchInfo:
    left = end - position
    if left < PREFIX_SIZE:
        raise IncompleteBatchError(
            f"incomplete batch header: only {left} bytes left, {PREFIX_SIZE} needed",
            position=position,
        )
    length, magic = _SIZE_AND_MAGIC.unpack_from(buf, position + LENGTH_OFFSET)
    if magic not in (0, 1, 2):
        raise CorruptRecordError(f"unexpected magic {magic}", position=position)
    size = length + LOG_OVERHEAD
    if size < _min_size(magic):
        raise CorruptRecordError(
            f"batch size {size} is below the magic {magic} minimum {_min_size(magic)}",
            position=position,
        )
    if size > left:
        raise IncompleteBatchError(
            f"batch size {size} runs past the end of the data ({left} bytes left)",
            position=position,
        )
    if magic == 2:
        return _scan_v2(buf, position, verify_crc)
    return _scan_legacy(buf, position, position + size, verify_crc)
