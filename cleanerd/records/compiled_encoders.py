"""The records areas a pass rewrites, compressed in compiled code: every area in one call.

A pass rewrites each compressed batch that keeps some of its records, and on small
batches that is one area per batch: through the codec layer (`compression.compress`),
one Python call per batch, a new zstd context in each (about 19 us for a 10-record
batch; LZ4 about 2 us). Here one kernel call takes every area of a list, in the framing
the codec layer writes, so the output is the one the codec layer's would be:

- zstd: one frame per area from libzstd's one-shot `ZSTD_compressCCtx` at the codec
  layer's level (content size stated, no checksum), through this thread's compression
  context (`compiled_codecs.zstd_compression_context`: the libzstd binding that the
  decoder uses, one place for both);
- LZ4: Kafka's LZ4 frame (`KafkaLZ4BlockOutputStream`'s: magic, FLG 0x60, BD 0x40, the
  header checksum, then 64 KiB blocks, each a little-endian size word and LZ4's block
  format from liblz4's `LZ4_compress_default`, or the block stored whole with the size
  word's high bit set when compressing does not make it smaller, then the end mark).
  liblz4 is the system's shared library, bound in `compiled_codecs.py` (whose decoder
  uses it too); without it LZ4 areas go through the codec layer;
- gzip: one gzip stream per area through this thread's deflating stream
  (`zlib_streams.py`), the codec layer's byte for byte.

A list whose areas are not all of one of these codecs (snappy, a mix), or whose library
is not loaded, goes through the codec layer, one call per area.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from cleanerd._jit import jit
from cleanerd.records import compiled_codecs, zlib_streams
from cleanerd.records.address import Int, bytes_address
from cleanerd.records.compiled_codecs import GZIP, LZ4, OK, UNDECODED, ZSTD
from cleanerd.records.compression import (
    LZ4_BD,
    LZ4_BLOCK_SIZE,
    LZ4_FLG,
    LZ4_MAGIC,
    LZ4_UNCOMPRESSED_BIT,
    ZSTD_LEVEL,
    compress,
    lz4_header_checksum,
)
from cleanerd.records.header import Compression

LZ4_HEADER: Final = np.frombuffer(
    LZ4_MAGIC + bytes((LZ4_FLG, LZ4_BD, lz4_header_checksum(bytes((LZ4_FLG, LZ4_BD))))),
    np.uint8,
)
"""The 7 bytes that open every LZ4 frame the codec layer writes."""


def zstd_compress_bound(sizes: Any) -> Any:
    """libzstd's `ZSTD_COMPRESSBOUND` of each of `sizes` (a numpy array): the most a
    one-shot frame of that many bytes takes."""
    small = np.maximum((128 << 10) - sizes, 0) >> 11
    return sizes + (sizes >> 8) + small


def lz4_frame_bound(sizes: Any) -> Any:
    """The most an LZ4 frame of each of `sizes` takes: the header and the end mark, and
    per 64 KiB block a size word and liblz4's `LZ4_COMPRESSBOUND` of the block."""
    blocks = (sizes + LZ4_BLOCK_SIZE - 1) // LZ4_BLOCK_SIZE
    return len(LZ4_HEADER) + 4 + sizes + sizes // 255 + 20 * blocks


@jit
def zstd_compress_areas(
    src: Any, starts: Any, ends: Any, dst: Any, sizes: Any, cctx: Int, level: Int
) -> tuple[Int, Int]:
    """Compress each area `src[starts[j]:ends[j]]` into one zstd frame with the context
    at `cctx`, the frames back to back in `dst` (room for the sum of
    `zstd_compress_bound`), each frame's size in `sizes[j]`: (OK, bytes of `dst` used),
    or (UNDECODED, the area) when libzstd fails one."""
    used = 0
    base_in, base_out = bytes_address(src), bytes_address(dst)
    for j in range(len(starts)):
        room = len(dst) - used
        written = compiled_codecs.zstd_compress_cctx(
            cctx, base_out + used, room, base_in + starts[j], ends[j] - starts[j], level
        )
        if written < 0:  # an error code (a size_t near its maximum), read as signed
            return UNDECODED, j
        sizes[j] = written
        used += written
    return OK, used


@jit
def _put_le32(dst: Any, at: Int, value: Int) -> None:
    for k in range(4):
        dst[at + k] = (value >> (8 * k)) & 0xFF


@jit
def lz4_compress_areas(
    src: Any, starts: Any, ends: Any, dst: Any, sizes: Any, header: Any
) -> tuple[Int, Int]:
    """Each area `src[starts[j]:ends[j]]` as one LZ4 frame in Kafka's framing (`header`,
    then its 64 KiB blocks, then the end mark), the frames back to back in `dst` (room
    for the sum of `lz4_frame_bound`), each frame's size in `sizes[j]`: (OK, bytes of
    `dst` used)."""
    used = 0
    base_in, base_out = bytes_address(src), bytes_address(dst)
    for j in range(len(starts)):
        begin = used
        for k in range(len(header)):
            dst[used + k] = header[k]
        used += len(header)
        at = starts[j]
        while at < ends[j]:
            n = min(ends[j] - at, LZ4_BLOCK_SIZE)
            room = min(len(dst) - used - 4, n - 1)  # a block only pays if it is smaller
            written = 0
            if room > 0:
                written = compiled_codecs.lz4_compress_default(
                    base_in + at, base_out + used + 4, n, room
                )
            if written > 0:
                _put_le32(dst, used, written)
                used += 4 + written
            else:
                _put_le32(dst, used, n | LZ4_UNCOMPRESSED_BIT)
                dst[used + 4 : used + 4 + n] = src[at : at + n]
                used += 4 + n
            at += n
        _put_le32(dst, used, 0)
        used += 4
        sizes[j] = used - begin
    return OK, used


@jit
def gzip_compress_areas(
    src: Any, starts: Any, ends: Any, dst: Any, sizes: Any, stream: Any
) -> tuple[Int, Int]:
    """Each area `src[starts[j]:ends[j]]` as one gzip stream through this thread's
    deflating stream (`zlib_streams.deflating()`), back to back in `dst`, each one's size
    in `sizes[j]`: (OK, bytes of `dst` used), or (UNDECODED, the area) when zlib fails
    one or `dst` lacks the room `deflateBound` asks."""
    used = 0
    at = stream.ctypes.data
    base_in, base_out = bytes_address(src), bytes_address(dst)
    for j in range(len(starts)):
        n = ends[j] - starts[j]
        if zlib_streams.deflate_reset(at) != 0:
            return UNDECODED, j
        room = len(dst) - used
        if zlib_streams.deflate_bound(at, n) > room:
            return UNDECODED, j
        zlib_streams.feed(stream, base_in + starts[j], n, base_out + used, room)
        if zlib_streams.deflate(at, zlib_streams.Z_FINISH) != zlib_streams.Z_STREAM_END:
            return UNDECODED, j
        sizes[j] = stream[zlib_streams.TOTAL_OUT]
        used += stream[zlib_streams.TOTAL_OUT]
    return OK, used


def gzip_bound(sizes: Any) -> Any:
    """At least zlib's `deflateBound` for a gzip stream of each of `sizes` (its stored
    blocks' bound plus the gzip header and trailer, generously rounded)."""
    return sizes + (sizes >> 12) + (sizes >> 14) + (sizes >> 25) + 64


def compress_areas(src: Any, starts: Any, ends: Any, codecs: Any) -> tuple[Any, Any]:
    """Each area `src[starts[j]:ends[j]]` compressed with `codecs[j]` in Kafka's framing,
    the results back to back, and each one's size (see the module docstring)."""
    n = len(starts)
    sizes = np.empty(n, np.int64)
    lengths = ends - starts
    if n and bool((codecs == ZSTD).all()):
        cctx = compiled_codecs.zstd_compression_context()
        if cctx:
            dst = np.empty(int(zstd_compress_bound(lengths).sum()), np.uint8)
            status, used = (
                int(x) for x in zstd_compress_areas(src, starts, ends, dst, sizes, cctx, ZSTD_LEVEL)
            )
            if status == OK:
                return dst[:used], sizes
    elif n and bool((codecs == LZ4).all()) and compiled_codecs.lz4_library() is not None:
        dst = np.empty(int(lz4_frame_bound(lengths).sum()), np.uint8)
        _, used = (int(x) for x in lz4_compress_areas(src, starts, ends, dst, sizes, LZ4_HEADER))
        return dst[:used], sizes
    elif n and bool((codecs == GZIP).all()) and (stream := zlib_streams.deflating()) is not None:
        dst = np.empty(int(gzip_bound(lengths).sum()), np.uint8)
        status, used = (int(x) for x in gzip_compress_areas(src, starts, ends, dst, sizes, stream))
        if status == OK:
            return dst[:used], sizes
    pieces = [
        compress(Compression(codec), src[begin:end].data)
        for codec, begin, end in zip(codecs.tolist(), starts.tolist(), ends.tolist(), strict=True)
    ]
    sizes[:] = [len(piece) for piece in pieces]
    return np.frombuffer(b"".join(pieces), dtype=np.uint8), sizes
