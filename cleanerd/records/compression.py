"""The five record-batch codecs, with the stream framings Kafka's Java clients use.

- gzip (1): an RFC 1952 gzip stream, default level 6. We write mtime 0 so the same records
  always compress to the same bytes. Reading accepts concatenated members, as Java's
  GZIPInputStream does.
- snappy (2): snappy-java's (xerial) stream framing, not Google's framing format::

      0  magic    8 bytes  0x82 'S' 'N' 'A' 'P' 'P' 'Y' 0x00
      8  version  int32 BE  1
      12 compat   int32 BE  1
      16 blocks   [int32 BE compressed length][raw snappy block], each block <= 32 KiB raw

  Reading also accepts one plain raw snappy block (what some non-Java clients write).
- lz4 (3): the LZ4 frame format as Kafka's KafkaLZ4BlockOutputStream writes it: FLG
  version 1 with independent blocks and no checksums, BD 64 KiB blocks, the header checksum
  byte, blocks of ``[int32 LE size][data]`` (high bit of size set for a stored block), an
  int32 0 end mark. Kafka's magic-0 writer computed the header checksum over the frame
  magic as well; reading accepts either checksum.
- zstd (4): a standard zstd frame, level 3 (Kafka's default).

A segment's batches are decompressed many at a time: LZ4, snappy and zstd in compiled
code (`compiled_codecs.py`; zstd through libzstd, when it loads), gzip (and zstd without
libzstd) through `decompress_frames`, each with its fastest path for small inputs. Every
area neither takes whole goes through `decompress`, one call per batch, which reads it
or names what is wrong.

Every decompression failure becomes CorruptRecordError (without a position: the caller
knows which batch it was decoding and adds it).
"""

from __future__ import annotations

import functools
import struct
import threading
import zlib
from typing import Any, Final

import cramjam
import numpy as np

from cleanerd.errors import CorruptRecordError
from cleanerd.records.header import Buffer, Compression

GZIP_LEVEL: Final = 6
ZSTD_LEVEL: Final = 3

XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
XERIAL_HEADER: Final = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
XERIAL_BLOCK_SIZE: Final = 32 * 1024

LZ4_MAGIC: Final = b"\x04\x22\x4d\x18"
LZ4_BLOCK_SIZE: Final = 64 * 1024
LZ4_FLG: Final = 0x60  # version 01, independent blocks, no block/content checksum or size
LZ4_BD: Final = 0x40  # block max size id 4 = 64 KiB
LZ4_FLG_CONTENT_SIZE: Final = 0x08
LZ4_UNCOMPRESSED_BIT: Final = 0x80000000

_M32: Final = 0xFFFFFFFF
XXH32_PRIMES: Final = (2654435761, 2246822519, 3266489917, 668265263, 374761393)
"""XXH32's five primes (`compiled_codecs.xxh32` takes them from here too)."""
_P1, _P2, _P3, _P4, _P5 = XXH32_PRIMES


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def xxhash32(data: bytes, seed: int = 0) -> int:
    """XXH32 of `data`; only used on LZ4 frame descriptors (a few bytes), so plain Python."""
    n = len(data)
    i = 0
    if n >= 16:
        v = [(seed + _P1 + _P2) & _M32, (seed + _P2) & _M32, seed & _M32, (seed - _P1) & _M32]
        while i + 16 <= n:
            for k in range(4):
                w = int.from_bytes(data[i : i + 4], "little")
                v[k] = (_rotl((v[k] + w * _P2) & _M32, 13) * _P1) & _M32
                i += 4
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M32
    else:
        h = (seed + _P5) & _M32
    h = (h + n) & _M32
    while i + 4 <= n:
        w = int.from_bytes(data[i : i + 4], "little")
        h = (_rotl((h + w * _P3) & _M32, 17) * _P4) & _M32
        i += 4
    while i < n:
        h = (_rotl((h + data[i] * _P5) & _M32, 11) * _P1) & _M32
        i += 1
    h ^= h >> 15
    h = (h * _P2) & _M32
    h ^= h >> 13
    h = (h * _P3) & _M32
    h ^= h >> 16
    return h


def compress(codec: Compression, data: Buffer) -> bytes:
    """Return `data` compressed with `codec` in the framing Kafka writes."""
    if codec is Compression.NONE:
        return bytes(data)
    if codec is Compression.GZIP:
        return _gzip_compress(data)
    if codec is Compression.SNAPPY:
        return _xerial_compress(data)
    if codec is Compression.LZ4:
        return _lz4_frame_compress(data)
    if codec is Compression.ZSTD:
        return bytes(cramjam.zstd.compress(data, level=ZSTD_LEVEL))
    raise ValueError(f"unknown compression codec {codec!r}")


def decompress(codec: Compression | int, data: Buffer) -> bytes:
    """Return the decompressed `data`; raise CorruptRecordError if it is not valid `codec`."""
    try:
        codec = Compression(codec)
    except ValueError:
        raise CorruptRecordError(f"unknown compression codec id {codec}") from None
    try:
        if codec is Compression.NONE:
            return bytes(data)
        if codec is Compression.GZIP:
            return _gzip_decompress(data)
        if codec is Compression.SNAPPY:
            return _snappy_decompress(data)
        if codec is Compression.LZ4:
            return _lz4_frame_decompress(data)
        return bytes(cramjam.zstd.decompress(data))
    except CorruptRecordError:
        raise
    except (zlib.error, cramjam.DecompressionError, ValueError, struct.error) as exc:
        raise CorruptRecordError(f"cannot decompress {codec.name.lower()} data: {exc}") from exc


def _gzip_compress(data: Buffer) -> bytes:
    c = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


def _gzip_decompress(data: Buffer) -> bytes:
    out = []
    rest = bytes(data)
    while True:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out.append(d.decompress(rest))
        if not d.eof:
            raise CorruptRecordError("cannot decompress gzip data: truncated stream")
        rest = d.unused_data
        # Java's GZIPInputStream reads further members and ignores anything else after.
        if not rest.startswith(b"\x1f\x8b"):
            return b"".join(out)


def _xerial_compress(data: Buffer) -> bytes:
    view = memoryview(data)
    parts = [XERIAL_HEADER]
    for i in range(0, len(view), XERIAL_BLOCK_SIZE):
        block = bytes(cramjam.snappy.compress_raw(view[i : i + XERIAL_BLOCK_SIZE]))
        parts.append(struct.pack(">i", len(block)))
        parts.append(block)
    view.release()
    return b"".join(parts)


def _snappy_decompress(data: Buffer) -> bytes:
    raw = bytes(data)
    if not raw.startswith(XERIAL_MAGIC):
        return bytes(cramjam.snappy.decompress_raw(raw))
    if len(raw) < len(XERIAL_HEADER):
        raise CorruptRecordError("cannot decompress snappy data: truncated xerial header")
    out = []
    pos = len(XERIAL_HEADER)
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise CorruptRecordError("cannot decompress snappy data: truncated block length")
        (n,) = struct.unpack_from(">i", raw, pos)
        pos += 4
        if n < 0 or pos + n > len(raw):
            raise CorruptRecordError(
                f"cannot decompress snappy data: block of {n} bytes at {pos - 4} "
                f"runs past the end ({len(raw) - pos} bytes left)"
            )
        out.append(bytes(cramjam.snappy.decompress_raw(raw[pos : pos + n])))
        pos += n
    return b"".join(out)


@functools.lru_cache(maxsize=64)
def lz4_header_checksum(descriptor: bytes) -> int:
    return (xxhash32(descriptor) >> 8) & 0xFF


def _lz4_frame_compress(data: Buffer) -> bytes:
    view = memoryview(data)
    descriptor = bytes((LZ4_FLG, LZ4_BD))
    parts = [LZ4_MAGIC, descriptor, bytes((lz4_header_checksum(descriptor),))]
    for i in range(0, len(view), LZ4_BLOCK_SIZE):
        chunk = view[i : i + LZ4_BLOCK_SIZE]
        block = bytes(cramjam.lz4.compress_block(chunk, store_size=False))
        if len(block) >= len(chunk):
            parts.append(struct.pack("<I", len(chunk) | LZ4_UNCOMPRESSED_BIT))
            parts.append(bytes(chunk))
        else:
            parts.append(struct.pack("<I", len(block)))
            parts.append(block)
        chunk.release()
    view.release()
    parts.append(b"\x00\x00\x00\x00")
    return b"".join(parts)


def _lz4_standard_frame(data: Buffer) -> Buffer:
    """`data`, or a copy whose header checksum is the standard one if it carries Kafka's
    legacy value, so the frame decoder (which knows only the standard one) reads it."""
    head = bytes(data[:22])
    if head[:4] != LZ4_MAGIC or len(head) < 7:
        raise CorruptRecordError("cannot decompress lz4 data: not an LZ4 frame")
    hc_pos = 6 + (8 if head[4] & LZ4_FLG_CONTENT_SIZE else 0)
    if len(head) <= hc_pos:
        raise CorruptRecordError("cannot decompress lz4 data: truncated frame descriptor")
    stored = head[hc_pos]
    correct = lz4_header_checksum(head[4:hc_pos])
    if stored == correct:
        return data
    if stored != lz4_header_checksum(head[:hc_pos]):
        raise CorruptRecordError(
            f"cannot decompress lz4 data: header checksum {stored} is neither {correct} "
            "nor Kafka's legacy value"
        )
    fixed = bytearray(data)
    fixed[hc_pos] = correct
    return fixed


def _lz4_frame_decompress(data: Buffer) -> bytes:
    return bytes(cramjam.lz4.decompress(_lz4_standard_frame(data)))


def decompress_into(codec: Compression | int, data: Buffer, out: Any) -> int | None:
    """Decompress `data` straight into the writable buffer `out` (e.g. a slice of a numpy
    uint8 array); return the bytes written, or None if that failed because `out` is too
    small or `data` is not valid: the caller then uses `decompress`, which tells them apart
    (it raises CorruptRecordError for bad data)."""
    try:
        if codec == Compression.GZIP:
            return int(cramjam.gzip.decompress_into(data, out))
        if codec == Compression.SNAPPY:
            return _snappy_decompress_into(data, out)
        if codec == Compression.LZ4:
            return int(cramjam.lz4.decompress_into(_lz4_standard_frame(data), out))
        if codec == Compression.ZSTD:
            return _zstd_decompress_into(data, out)
    except (CorruptRecordError, cramjam.DecompressionError, ValueError, struct.error):
        return None
    return None


_zstd_local = threading.local()


def _zstd_context() -> tuple[Any, type[Exception]]:
    """This thread's zstd decompression context, and the library's error type."""
    context = getattr(_zstd_local, "context", None)
    if context is None:
        import zstandard  # here: only commands that read zstd batches pay its import

        context = _zstd_local.context = zstandard.ZstdDecompressor()
        _zstd_local.error = zstandard.ZstdError
    return context, _zstd_local.error


def decompress_frames(
    codec: Compression | int, data: Buffer, starts: list[int], ends: list[int]
) -> list[bytes]:
    """The areas `data[starts[k]:ends[k]]`, all compressed with `codec` (gzip or zstd;
    none for any other), decompressed in order, up to the first this cannot take whole:
    that one, and anything unusual (a gzip stream of several members, a zstd area of
    several frames, trailing bytes, damage), `decompress` reads or reports. One call for
    a segment's batches saves the layers a call per batch goes through, and each codec's
    fastest small-input path is used: zlib for gzip (a 20-byte stream of 108 bytes took
    8.8 us through cramjam, 1.1 us through zlib), a zstd context kept per thread (making
    one is most of a small frame's cost: 13.4 us through cramjam, which makes one per
    call, against 1.1 us)."""
    view = memoryview(data)
    found: list[bytes] = []
    try:
        if codec == Compression.GZIP:
            for start, end in zip(starts, ends, strict=True):
                stream = zlib.decompressobj(16 + zlib.MAX_WBITS)
                result = stream.decompress(view[start:end])
                if not stream.eof or stream.unused_data:
                    break
                found.append(result)
        elif codec == Compression.ZSTD:
            context, error = _zstd_context()
            for start, end in zip(starts, ends, strict=True):
                reader = context.decompressobj()
                try:
                    result = reader.decompress(view[start:end])
                except error:
                    break
                if not reader.eof or reader.unused_data:
                    break
                found.append(result)
    except (zlib.error, CorruptRecordError, cramjam.DecompressionError, ValueError, struct.error):
        pass  # `found` ends before the area that failed
    return found


def _zstd_decompress_into(data: Buffer, out: Any) -> int | None:
    found = decompress_frames(Compression.ZSTD, data, [0], [len(data)])
    if not found or len(found[0]) > len(out):
        return None
    out[: len(found[0])] = np.frombuffer(found[0], np.uint8)
    return len(found[0])


def _snappy_decompress_into(data: Buffer, out: Any) -> int:
    view = memoryview(data)
    if bytes(view[:8]) != XERIAL_MAGIC:
        return int(cramjam.snappy.decompress_raw_into(view, out))
    target = memoryview(out)
    pos = len(XERIAL_HEADER)
    written = 0
    while pos < len(view):
        (n,) = struct.unpack_from(">i", view, pos)
        if n < 0 or pos + 4 + n > len(view):
            raise CorruptRecordError("cannot decompress snappy data: truncated block")
        block = view[pos + 4 : pos + 4 + n]
        written += int(cramjam.snappy.decompress_raw_into(block, target[written:]))
        pos += 4 + n
    return written
