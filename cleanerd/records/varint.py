"""Kafka's zig-zag varints (record fields of batch format v2).

A signed value n is zig-zag mapped to an unsigned one, ``(n << 1) ^ (n >> 31)`` for a
varint (int32) and ``(n << 1) ^ (n >> 63)`` for a varlong (int64), so small magnitudes of
either sign stay short. The unsigned value is then written as LEB128: 7 bits per byte,
least significant group first, high bit set on every byte but the last. A varint takes at
most 5 bytes, a varlong at most 10; longer encodings are corrupt.

These are the Python versions, used by the writer and by the pure (reference) decoder.
The columnar decoder in `columns.py` has its own compiled copy of the reading side.
"""

from __future__ import annotations

from typing import Final

from cleanerd.errors import CorruptRecordError
from cleanerd.records.header import INT32_MAX, Buffer

INT32_MIN: Final = -(2**31)
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
MAX_VARINT_BYTES: Final = 5
MAX_VARLONG_BYTES: Final = 10


def _encode_unsigned(u: int) -> bytes:
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def encode_varint(value: int) -> bytes:
    """Return the zig-zag varint bytes of the int32 `value`."""
    if not INT32_MIN <= value <= INT32_MAX:
        raise ValueError(f"varint value {value} does not fit in an int32")
    return _encode_unsigned(((value << 1) ^ (value >> 31)) & 0xFFFFFFFF)


def encode_varlong(value: int) -> bytes:
    """Return the zig-zag varlong bytes of the int64 `value`."""
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"varlong value {value} does not fit in an int64")
    return _encode_unsigned(((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF)


def size_of_varint(value: int) -> int:
    """Return how many bytes `encode_varint(value)` takes."""
    return len(encode_varint(value))


def _decode_unsigned(buf: Buffer, pos: int, end: int, max_bytes: int, what: str) -> tuple[int, int]:
    u = 0
    shift = 0
    for p in range(pos, min(end, pos + max_bytes)):
        b = buf[p]
        u |= (b & 0x7F) << shift
        if b < 0x80:
            return u, p + 1
        shift += 7
    if end - pos < max_bytes:
        raise CorruptRecordError(f"{what} runs past the end of its record", position=pos)
    raise CorruptRecordError(f"{what} is longer than {max_bytes} bytes", position=pos)


def decode_varint(buf: Buffer, pos: int, end: int | None = None) -> tuple[int, int]:
    """Read the varint at `pos`; return (value, position after it).

    Raise CorruptRecordError (position = where the varint starts) if it is longer than 5
    bytes, does not fit an int32, or runs past `end` (default: end of `buf`)."""
    if pos < (len(buf) if end is None else end) and (b := buf[pos]) < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    u, after = _decode_unsigned(
        buf, pos, len(buf) if end is None else end, MAX_VARINT_BYTES, "varint"
    )
    if u > 0xFFFFFFFF:
        raise CorruptRecordError("varint does not fit in an int32", position=pos)
    return (u >> 1) ^ -(u & 1), after


def decode_varlong(buf: Buffer, pos: int, end: int | None = None) -> tuple[int, int]:
    """Read the varlong at `pos`; return (value, position after it). Errors as decode_varint."""
    if pos < (len(buf) if end is None else end) and (b := buf[pos]) < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    u, after = _decode_unsigned(
        buf, pos, len(buf) if end is None else end, MAX_VARLONG_BYTES, "varlong"
    )
    if u > 0xFFFFFFFFFFFFFFFF:
        raise CorruptRecordError("varlong does not fit in an int64", position=pos)
    return (u >> 1) ^ -(u & 1), after
