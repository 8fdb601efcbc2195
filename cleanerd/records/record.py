"""One record as a reader sees it: absolute offset and timestamp, key, value, headers.

Inside a v2 batch a record is stored relative to its batch (Kafka's DefaultRecord)::

    length          varint   bytes of the rest of the record
    attributes      int8     unused, 0
    timestampDelta  varlong  timestamp - batch baseTimestamp
    offsetDelta     varint   offset - batch baseOffset
    keyLength       varint   -1 = null key
    key             bytes
    valueLength     varint   -1 = null value (a tombstone)
    value           bytes
    headerCount     varint
    headers         [keyLength varint, UTF-8 key, valueLength varint (-1 = null), value]

The dataclasses here hold the absolute values; `batch.py` converts. Header keys are
decoded with `surrogateescape`, so a key that is not valid UTF-8 still re-encodes to its
original bytes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RecordHeader:
    """A record header: a string key (not unique, order kept) and a nullable value."""

    key: str
    value: bytes | None


@dataclass(frozen=True, slots=True)
class Record:
    """A record with its absolute offset and effective timestamp (for a LogAppendTime
    batch, the batch's maxTimestamp). `attributes` is the record attribute byte (0)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[RecordHeader, ...] = ()
    attributes: int = 0

    @property
    def is_tombstone(self) -> bool:
        """Whether the value is null (a delete marker for its key in a compacted log)."""
        return self.value is None
