"""The record batch v2 header (magic 2), and a shallow scan of batches in a buffer.

On-disk layout of one batch, all integers big-endian (Kafka's DefaultRecordBatch)::

    0  baseOffset            int64   offset of the first record slot
    8  batchLength           int32   bytes after this field (= batch size - 12)
    12 partitionLeaderEpoch  int32   not covered by the CRC
    16 magic                 int8    2 (0/1 for legacy message sets)
    17 crc                   uint32  CRC-32C of bytes [21, end of batch)
    21 attributes            int16   bits 0-2 codec, 3 timestamp type, 4 transactional,
                                     5 control, 6 delete horizon set (KIP-534)
    23 lastOffsetDelta       int32
    27 baseTimestamp         int64   the delete horizon when attribute bit 6 is set
    35 maxTimestamp          int64
    43 producerId            int64
    51 producerEpoch         int16
    53 baseSequence          int32
    57 recordsCount          int32
    61 records...

Legacy message sets share the first 17 bytes' meaning for scanning purposes: an int64
offset at 0, an int32 size at 8 (bytes after it) and the magic byte at 16, which is how a
scan tells the formats apart; their smallest entries are 26 bytes (v0) and 34 (v1).

This module owns every position, mask and size limit above as a named module-level
`Final` int: the numba kernels that read headers byte by byte (`columns.py`,
`compaction/assemble.py`, ...) use the same names as the Python codec's `HEADER` struct,
which is built from them.
"""

from __future__ import annotations

import enum
import mmap
import struct
from dataclasses import dataclass
from typing import Final, TypeAlias

from cleanerd.errors import CorruptRecordError
from cleanerd.records.crc32c_library import crc32c

BASE_OFFSET_OFFSET: Final = 0
LENGTH_OFFSET: Final = 8  # batchLength; a legacy entry's size too
PARTITION_LEADER_EPOCH_OFFSET: Final = 12
MAGIC_OFFSET: Final = 16  # the same in legacy entries: it tells the formats apart
CRC_OFFSET: Final = 17
ATTRIBUTES_OFFSET: Final = 21  # the CRC covers [ATTRIBUTES_OFFSET, end)
LAST_OFFSET_DELTA_OFFSET: Final = 23
BASE_TIMESTAMP_OFFSET: Final = 27
MAX_TIMESTAMP_OFFSET: Final = 35
PRODUCER_ID_OFFSET: Final = 43
PRODUCER_EPOCH_OFFSET: Final = 51
BASE_SEQUENCE_OFFSET: Final = 53
RECORDS_COUNT_OFFSET: Final = 57
RECORD_BATCH_OVERHEAD: Final = 61  # an empty batch is exactly this long

_LAYOUT: Final = (  # (position, struct code) of each header field, in order
    (BASE_OFFSET_OFFSET, "q"),
    (LENGTH_OFFSET, "i"),
    (PARTITION_LEADER_EPOCH_OFFSET, "i"),
    (MAGIC_OFFSET, "b"),
    (CRC_OFFSET, "I"),
    (ATTRIBUTES_OFFSET, "h"),
    (LAST_OFFSET_DELTA_OFFSET, "i"),
    (BASE_TIMESTAMP_OFFSET, "q"),
    (MAX_TIMESTAMP_OFFSET, "q"),
    (PRODUCER_ID_OFFSET, "q"),
    (PRODUCER_EPOCH_OFFSET, "h"),
    (BASE_SEQUENCE_OFFSET, "i"),
    (RECORDS_COUNT_OFFSET, "i"),
)
HEADER: Final = struct.Struct(">" + "".join(code for _, code in _LAYOUT))
# The named positions are what the numba kernels read; the struct is what Python reads.
# They cannot disagree: every position is the size of the fields before it.
assert all(
    position == struct.calcsize(">" + "".join(code for _, code in _LAYOUT[:i]))
    for i, (position, _) in enumerate(_LAYOUT)
)
assert HEADER.size == RECORD_BATCH_OVERHEAD

LOG_OVERHEAD: Final = LENGTH_OFFSET + 4  # baseOffset + batchLength: before the counted part
PREFIX_SIZE: Final = MAGIC_OFFSET + 1
"""Bytes a scan reads to learn a batch's size and format (v2 or legacy)."""
# The smallest legacy entries: after the log overhead, v0 has a crc, magic, attributes
# and the key and value lengths; v1 adds a timestamp.
LEGACY_V0_MIN_SIZE: Final = LOG_OVERHEAD + 4 + 1 + 1 + 4 + 4
LEGACY_V1_MIN_SIZE: Final = LEGACY_V0_MIN_SIZE + 8

COMPRESSION_MASK: Final = 0x07
TIMESTAMP_TYPE_MASK: Final = 0x08
TRANSACTIONAL_MASK: Final = 0x10
CONTROL_MASK: Final = 0x20
DELETE_HORIZON_MASK: Final = 0x40

Buffer: TypeAlias = bytes | bytearray | memoryview | mmap.mmap
"""What the codec reads from: file bytes in memory, or a mapped segment file."""

NO_PRODUCER_ID: Final = -1
NO_PRODUCER_EPOCH: Final = -1
NO_SEQUENCE: Final = -1
NO_PARTITION_LEADER_EPOCH: Final = -1
NO_TIMESTAMP: Final = -1
INT32_MAX: Final = 2**31 - 1
"""Kafka's Int.MaxValue: the bound of every int32 of the format (offset deltas, sequence
numbers, lengths, and the relative offsets and positions of the indexes)."""


class Compression(enum.IntEnum):
    """The codec id in attribute bits 0-2."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @property
    def kafka_name(self) -> str:
        """The name Kafka's tools print (`compresscodec: SNAPPY`)."""
        return self.name


class TimestampType(enum.IntEnum):
    """Attribute bit 3."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1

    @classmethod
    def of(cls, attributes: int) -> TimestampType:
        """The timestamp type that batch (or legacy message) `attributes` name."""
        return cls((attributes & TIMESTAMP_TYPE_MASK) >> 3)

    @property
    def kafka_name(self) -> str:
        return "CreateTime" if self is TimestampType.CREATE_TIME else "LogAppendTime"


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The 61-byte header of a v2 batch, as stored. `position` is where it starts in the
    buffer (or file) it was read from; it is not part of the format."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int
    position: int = 0

    @property
    def size_in_bytes(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression(self) -> Compression:
        return Compression(self.attributes & COMPRESSION_MASK)

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType.of(self.attributes)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & DELETE_HORIZON_MASK)

    @property
    def delete_horizon_ms(self) -> int:
        """The KIP-534 delete horizon, or -1 (Kafka's RecordBatch.NO_TIMESTAMP) if unset."""
        return self.base_timestamp if self.has_delete_horizon else NO_TIMESTAMP

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id > NO_PRODUCER_ID

    @property
    def last_sequence(self) -> int:
        """baseSequence + lastOffsetDelta, wrapping at Int.MAX as Kafka does; -1 if none."""
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) % (INT32_MAX + 1)


def unpack_header(buf: Buffer, position: int = 0) -> BatchHeader:
    """Read the v2 header at `position` (no validation beyond the struct size)."""
    (bo, bl, ple, magic, crc, attrs, lod, bts, mts, pid, pep, bseq, count) = HEADER.unpack_from(
        buf, position
    )
    return BatchHeader(
        bo, bl, ple, magic, crc, attrs, lod, bts, mts, pid, pep, bseq, count, position
    )


def pack_header(h: BatchHeader) -> bytes:
    """The 61 header bytes of `h`, CRC field as stored in `h`."""
    return HEADER.pack(
        h.base_offset,
        h.batch_length,
        h.partition_leader_epoch,
        h.magic,
        h.crc,
        h.attributes,
        h.last_offset_delta,
        h.base_timestamp,
        h.max_timestamp,
        h.producer_id,
        h.producer_epoch,
        h.base_sequence,
        h.records_count,
    )


def compute_crc(batch: Buffer) -> int:
    """CRC-32C of a whole v2 batch's covered span [21, end)."""
    return int(crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:]))


def check_crc(buf: Buffer, h: BatchHeader) -> bool:
    """Whether the stored CRC of the v2 batch `h` (read from `buf`) matches its bytes."""
    start = h.position + ATTRIBUTES_OFFSET
    end = h.position + h.size_in_bytes
    return int(crc32c(memoryview(buf)[start:end])) == h.crc


def base_offset_at(buf: Buffer, position: int) -> int:
    """The offset field (first 8 bytes) of the batch, or legacy message, at `position`:
    a v2 batch's base offset. No CRC covers it."""
    (offset,) = struct.unpack_from(">q", buf, position + BASE_OFFSET_OFFSET)
    return int(offset)


def batch_size_at(buf: Buffer, position: int) -> int | None:
    """The total size of the batch (or legacy message) starting at `position`, or None if
    fewer than 17 bytes remain (a partial header: an incomplete tail)."""
    if len(buf) - position < PREFIX_SIZE:
        return None
    (length,) = struct.unpack_from(">i", buf, position + LENGTH_OFFSET)
    return int(length) + LOG_OVERHEAD


def validate_v2_header(buf: Buffer, h: BatchHeader, *, check: bool) -> None:
    """Raise CorruptRecordError (position = batch start) unless `h` is a sane v2 header whose
    bytes are all present in `buf` and, if `check`, whose CRC matches."""
    if h.magic != 2:
        raise CorruptRecordError(f"unexpected magic {h.magic}", position=h.position)
    if h.batch_length + LOG_OVERHEAD < RECORD_BATCH_OVERHEAD:
        raise CorruptRecordError(
            f"batch length {h.batch_length} is below the v2 header size", position=h.position
        )
    if h.position + h.size_in_bytes > len(buf):
        raise CorruptRecordError(
            f"batch size {h.size_in_bytes} runs past the end of the data "
            f"({len(buf) - h.position} bytes left)",
            position=h.position,
        )
    if h.last_offset_delta < 0 or h.records_count < 0:
        raise CorruptRecordError(
            f"negative lastOffsetDelta {h.last_offset_delta} or recordsCount {h.records_count}",
            position=h.position,
        )
    if check and not check_crc(buf, h):
        with memoryview(buf) as view:
            covered = view[h.position + ATTRIBUTES_OFFSET : h.position + h.size_in_bytes]
            computed = crc32c(covered)
            covered.release()
        raise CorruptRecordError(
            f"CRC mismatch: stored {h.crc}, computed {computed}", position=h.position
        )
