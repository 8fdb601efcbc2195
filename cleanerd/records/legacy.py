"""Reading legacy message sets (magic 0 and 1). cleanerd never writes them.

A legacy log entry, all integers big-endian (Kafka's LegacyRecord)::

    0  offset      int64
    8  size        int32   bytes after this field
    12 crc         uint32  CRC-32 (zlib's) of bytes [16, end of entry)
    16 magic       int8    0 or 1
    17 attributes  int8    bits 0-2 codec (none, gzip, snappy, lz4), bit 3 timestamp type (v1)
    18 timestamp   int64   v1 only
    .. keyLength   int32   -1 = null
       key
       valueLength int32   -1 = null
       value

A compressed entry is a *wrapper*: its value is a compressed message set of uncompressed
inner entries with the wrapper's magic. Inner offsets of a v1 wrapper are relative and the
wrapper's own offset is the absolute offset of the last inner record; a v0 wrapper's inner
offsets are absolute. In a v1 wrapper with LogAppendTime every inner record takes the
wrapper's timestamp; v0 has no timestamps (-1).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from cleanerd.errors import CorruptRecordError
from cleanerd.records.compression import decompress
from cleanerd.records.header import (
    COMPRESSION_MASK,
    LEGACY_V0_MIN_SIZE,
    LEGACY_V1_MIN_SIZE,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    NO_TIMESTAMP,
    Buffer,
    Compression,
    TimestampType,
)
from cleanerd.records.record import Record

ENTRY_HEAD: Final = struct.Struct(">qiIbb")  # offset, size, crc, magic, attributes
TIMESTAMP: Final = struct.Struct(">q")
LENGTH: Final = struct.Struct(">i")
CRC_START: Final = MAGIC_OFFSET  # the CRC covers [magic, end)


@dataclass(frozen=True, slots=True)
class LegacyEntry:
    """One shallow legacy entry as stored: a plain message or a compressed wrapper."""

    position: int
    offset: int
    size: int  # including the 12-byte log overhead
    crc: int
    magic: int
    attributes: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    key_pos: int  # where the key bytes start in the parsed buffer
    value_pos: int

    @property
    def compression(self) -> Compression:
        return Compression(self.attributes & COMPRESSION_MASK)

    @property
    def timestamp_type(self) -> TimestampType | None:
        """None for magic 0, which has no timestamps."""
        if self.magic == 0:
            return None
        return TimestampType.of(self.attributes)


def min_entry_size(magic: int) -> int:
    """The smallest legal entry (log overhead included) for `magic` 0 or 1."""
    return LEGACY_V0_MIN_SIZE if magic == 0 else LEGACY_V1_MIN_SIZE


def _bytes_field(
    buf: Buffer, pos: int, end: int, entry_pos: int, what: str
) -> tuple[bytes | None, int]:
    if pos + 4 > end:
        raise CorruptRecordError(
            f"{what} length runs past the end of the message", position=entry_pos
        )
    (n,) = LENGTH.unpack_from(buf, pos)
    pos += 4
    if n == -1:
        return None, pos
    if n < 0 or pos + n > end:
        raise CorruptRecordError(
            f"{what} length {n} runs past the end of the message ({end - pos} bytes left)",
            position=entry_pos,
        )
    return bytes(buf[pos : pos + n]), pos + n


def read_legacy_entry(buf: Buffer, position: int, end: int, *, verify_crc: bool) -> LegacyEntry:
    """Parse the legacy entry at `position`, which must end by `end`.

    Raise CorruptRecordError (position = the entry's start) on a bad magic, size, CRC or
    key/value length."""
    if end - position < CRC_START + 2:
        raise CorruptRecordError(
            f"incomplete legacy message header ({end - position} bytes left)", position=position
        )
    offset, length, crc, magic, attributes = ENTRY_HEAD.unpack_from(buf, position)
    if magic not in (0, 1):
        raise CorruptRecordError(f"unexpected magic {magic}", position=position)
    size = length + LOG_OVERHEAD
    if size < min_entry_size(magic):
        raise CorruptRecordError(
            f"message size {size} is below the magic {magic} minimum {min_entry_size(magic)}",
            position=position,
        )
    if position + size > end:
        raise CorruptRecordError(
            f"batch size {size} runs past the end of the data ({end - position} bytes left)",
            position=position,
        )
    stop = position + size
    if verify_crc:
        with memoryview(buf) as view:
            covered = view[position + CRC_START : stop]
            computed = zlib.crc32(covered)
            covered.release()
        if computed != crc:
            raise CorruptRecordError(
                f"CRC mismatch: stored {crc}, computed {computed}", position=position
            )
    pos = position + CRC_START + 2
    timestamp = NO_TIMESTAMP
    if magic == 1:
        (timestamp,) = TIMESTAMP.unpack_from(buf, pos)
        pos += 8
    key_pos = pos + 4
    key, pos = _bytes_field(buf, pos, stop, position, "key")
    value_pos = pos + 4
    value, pos = _bytes_field(buf, pos, stop, position, "value")
    if pos != stop:
        raise CorruptRecordError(
            f"message has {stop - pos} bytes after its value", position=position
        )
    return LegacyEntry(
        position, offset, size, crc, magic, attributes, timestamp, key, value, key_pos, value_pos
    )


def decompress_wrapper(
    wrapper: LegacyEntry, *, verify_crc: bool
) -> tuple[bytes, list[LegacyEntry]]:
    """The decompressed inner message set of a compressed wrapper and its entries
    (positions are into those bytes). Errors name the wrapper's position."""
    if wrapper.value is None:
        raise CorruptRecordError(
            "compressed wrapper message has a null value", position=wrapper.position
        )
    try:
        inner = decompress(wrapper.compression, wrapper.value)
        entries = []
        pos = 0
        while pos < len(inner):
            entry = read_legacy_entry(inner, pos, len(inner), verify_crc=verify_crc)
            if entry.magic != wrapper.magic:
                raise CorruptRecordError(
                    f"inner magic {entry.magic} differs from wrapper magic {wrapper.magic}",
                    position=pos,
                )
            if entry.compression is not Compression.NONE:
                raise CorruptRecordError(
                    "compressed message inside a compressed wrapper", position=pos
                )
            entries.append(entry)
            pos += entry.size
    except CorruptRecordError as exc:
        where = "" if exc.position is None else f" (inner byte {exc.position})"
        raise CorruptRecordError(
            f"in compressed wrapper: {exc.reason}{where}", position=wrapper.position
        ) from exc
    if not entries:
        raise CorruptRecordError(
            "compressed wrapper message holds no records", position=wrapper.position
        )
    return inner, entries


def inner_offsets(wrapper: LegacyEntry, entries: list[LegacyEntry]) -> list[int]:
    """Absolute offsets of a wrapper's inner entries (v1: relative to the wrapper's)."""
    shift = wrapper.offset - entries[-1].offset if wrapper.magic == 1 else 0
    return [e.offset + shift for e in entries]


def inner_timestamps(wrapper: LegacyEntry, entries: list[LegacyEntry]) -> list[int]:
    """Effective timestamps of a wrapper's inner entries (LogAppendTime: the wrapper's)."""
    if wrapper.timestamp_type is TimestampType.LOG_APPEND_TIME:
        return [wrapper.timestamp] * len(entries)
    return [e.timestamp for e in entries]


def entry_records(wrapper: LegacyEntry, *, verify_crc: bool = False) -> list[Record]:
    """The records of one shallow entry: itself, or a wrapper's inner records with absolute
    offsets and effective timestamps."""
    if wrapper.compression is Compression.NONE:
        return [Record(wrapper.offset, wrapper.timestamp, wrapper.key, wrapper.value)]
    _inner, entries = decompress_wrapper(wrapper, verify_crc=verify_crc)
    offsets = inner_offsets(wrapper, entries)
    timestamps = inner_timestamps(wrapper, entries)
    return [
        Record(offset, ts, e.key, e.value)
        for e, offset, ts in zip(entries, offsets, timestamps, strict=True)
    ]


def iter_legacy_records(
    buf: Buffer, position: int, *, verify_crc: bool = False
) -> Iterator[Record]:
    """Yield the records of the legacy entry at `position` (deep iteration)."""
    entry = read_legacy_entry(buf, position, len(buf), verify_crc=verify_crc)
    yield from entry_records(entry, verify_crc=verify_crc)
