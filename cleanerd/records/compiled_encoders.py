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
  liblz4 (the system's shared library, `liblz4-1` on Debian) is bound as libzstd is:
  its address under a fixed LLVM symbol, registered when numba is first imported, so
  numba's on-disk cache stays valid; without it the symbol is bound to a stand-in that
  is never called, and LZ4 areas go through the codec layer.

- gzip: zlib's gzip stream (`deflateInit2` with the codec layer's level, window bits 31,
  memory level 8, the default strategy: what Python's `zlib.compressobj` makes, with the
  same library) through a `z_stream` per thread, reset for each area, then `deflate` with
  `Z_FINISH` into room for `deflateBound`. zlib is the system's (`libz.so.1`, which
  Python's own `zlib` module uses), bound as the others.

A list whose areas are not all of one of these codecs (snappy, a mix), or whose library
is not loaded, goes through the codec layer, one call per area.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import threading
from typing import Any, Final

import numpy as np

from cleanerd._jit import jit, on_numba_load
from cleanerd.records import compiled_codecs
from cleanerd.records.compiled_codecs import OK, UNDECODED, ZSTD
from cleanerd.records.compression import (
    GZIP_LEVEL,
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
from cleanerd.records.walker import Int

LZ4: Final = int(Compression.LZ4)
LZ4_HEADER: Final = np.frombuffer(
    LZ4_MAGIC + bytes((LZ4_FLG, LZ4_BD, lz4_header_checksum(bytes((LZ4_FLG, LZ4_BD))))),
    np.uint8,
)
"""The 7 bytes that open every LZ4 frame the codec layer writes."""

_STAND_INS: list[Any] = []
"""The callbacks a missing library's symbols are bound to (kept alive here)."""


def _load(names: list[str], short: str, needed: tuple[str, ...]) -> ctypes.CDLL | None:
    """The first of `names` (then what `find_library(short)` finds) that loads and has
    every function of `needed`, or None."""
    found = ctypes.util.find_library(short)
    for name in [*names, *([found] if found else [])]:
        try:
            library = ctypes.CDLL(name)
        except OSError:
            continue
        if all(hasattr(library, f) for f in needed):
            return library
    return None


def _bind(library: ctypes.CDLL | None, name: str, restype: Any, argtypes: list[Any]) -> str:
    """Register `library`'s function `name` with LLVM as `cleanerd_<name>`; returns the
    symbol. When the library is missing the symbol is bound to a stand-in that returns
    0, so that kernels still compile: `compress_areas` never calls them then."""
    if library is None:
        callback = ctypes.CFUNCTYPE(restype, *argtypes)(lambda *_: 0)
        _STAND_INS.append(callback)
        address = int(ctypes.cast(callback, ctypes.c_void_p).value or 0)
    else:
        address = int(ctypes.cast(getattr(library, name), ctypes.c_void_p).value or 0)
    import llvmlite.binding as llvm

    symbol = f"cleanerd_{name}"
    llvm.add_symbol(symbol, address)
    return symbol


_lz4_compress: Any = None
"""numba's declaration of liblz4's `LZ4_compress_default`, made when numba is imported."""


@functools.cache
def lz4_library() -> ctypes.CDLL | None:
    """liblz4 (`liblz4.so.1`), loaded once; None when it cannot be."""
    return _load(["liblz4.so.1"], "lz4", ("LZ4_compress_default",))


GZIP: Final = int(Compression.GZIP)
Z_FINISH: Final = 4
Z_STREAM_END: Final = 1
_deflate: Any = None
_deflate_reset: Any = None
_deflate_bound: Any = None
"""numba's declarations of zlib's `deflate`, `deflateReset` and `deflateBound`."""


class _ZStream(ctypes.Structure):
    """zlib's `z_stream` (zlib.h), of which the kernel sets the four in/out fields."""

    _fields_ = [
        ("next_in", ctypes.c_void_p),
        ("avail_in", ctypes.c_uint),
        ("total_in", ctypes.c_ulong),
        ("next_out", ctypes.c_void_p),
        ("avail_out", ctypes.c_uint),
        ("total_out", ctypes.c_ulong),
        ("msg", ctypes.c_char_p),
        ("state", ctypes.c_void_p),
        ("zalloc", ctypes.c_void_p),
        ("zfree", ctypes.c_void_p),
        ("opaque", ctypes.c_void_p),
        ("data_type", ctypes.c_int),
        ("adler", ctypes.c_ulong),
        ("reserved", ctypes.c_ulong),
    ]


_WORD: Final = {field[0]: getattr(_ZStream, field[0]).offset // 8 for field in _ZStream._fields_}
"""Each field's index in the stream seen as 64-bit words (every one starts a word)."""
NEXT_IN, AVAIL_IN, NEXT_OUT, AVAIL_OUT, TOTAL_OUT = (
    _WORD[n] for n in ("next_in", "avail_in", "next_out", "avail_out", "total_out")
)


@functools.cache
def zlib_library() -> ctypes.CDLL | None:
    """zlib (`libz.so.1`), loaded once; None when it cannot be."""
    needed = ("deflateInit2_", "deflate", "deflateReset", "deflateBound", "deflateEnd")
    library = _load(["libz.so.1"], "z", needed)
    if library is not None:
        library.zlibVersion.restype = ctypes.c_char_p
    return library


class _GzipStream:
    """A `z_stream` set up for the gzip codec (`deflateInit2`), its words as a numpy
    view for the kernel; ended with its owner, the thread-local storage of its thread."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self.ready = False
        self._stream = _ZStream()
        self._end = library.deflateEnd
        status = library.deflateInit2_(
            ctypes.byref(self._stream), GZIP_LEVEL, 8, 31, 8, 0,
            library.zlibVersion(), ctypes.sizeof(_ZStream),
        )  # fmt: skip
        self.ready = status == 0
        self.words = np.ctypeslib.as_array(
            (ctypes.c_uint64 * (ctypes.sizeof(_ZStream) // 8)).from_buffer(self._stream)
        )

    def __del__(self) -> None:
        if self.ready:
            self._end(ctypes.byref(self._stream))
            self.ready = False


_local = threading.local()


def gzip_stream() -> Any:
    """This thread's gzip `z_stream` words, or None when zlib is not loaded."""
    stream: _GzipStream | None = getattr(_local, "gzip", None)
    if stream is None:
        library = zlib_library()
        if library is None:
            return None
        stream = _local.gzip = _GzipStream(library)
    return stream.words if stream.ready else None


def _declare() -> None:
    global _lz4_compress, _deflate, _deflate_reset, _deflate_bound
    from numba import types

    size, i32 = types.intp, types.int32
    pointer, c_int, c_ulong = ctypes.c_void_p, ctypes.c_int, ctypes.c_ulong
    lz4 = _bind(lz4_library(), "LZ4_compress_default", c_int, [pointer, pointer, c_int, c_int])
    _lz4_compress = types.ExternalFunction(lz4, i32(size, size, i32, i32))
    zlib = zlib_library()
    deflate = _bind(zlib, "deflate", c_int, [pointer, c_int])
    _deflate = types.ExternalFunction(deflate, i32(size, i32))
    reset = _bind(zlib, "deflateReset", c_int, [pointer])
    _deflate_reset = types.ExternalFunction(reset, i32(size))
    bound = _bind(zlib, "deflateBound", c_ulong, [pointer, c_ulong])
    _deflate_bound = types.ExternalFunction(bound, size(size, size))


on_numba_load(_declare)


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
    base_in, base_out = src.ctypes.data, dst.ctypes.data
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
    base_in, base_out = src.ctypes.data, dst.ctypes.data
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
                written = _lz4_compress(base_in + at, base_out + used + 4, n, room)
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
    """Each area `src[starts[j]:ends[j]]` as one gzip stream through the `z_stream`
    whose words are `stream` (`gzip_stream()`), back to back in `dst`, each one's size in
    `sizes[j]`: (OK, bytes of `dst` used), or (UNDECODED, the area) when zlib fails one
    or `dst` lacks the room `deflateBound` asks."""
    used = 0
    at = stream.ctypes.data
    base_in, base_out = src.ctypes.data, dst.ctypes.data
    for j in range(len(starts)):
        n = ends[j] - starts[j]
        if _deflate_reset(at) != 0:
            return UNDECODED, j
        room = len(dst) - used
        if _deflate_bound(at, n) > room:
            return UNDECODED, j
        stream[NEXT_IN] = base_in + starts[j]
        stream[AVAIL_IN] = n
        stream[NEXT_OUT] = base_out + used
        stream[AVAIL_OUT] = room
        if _deflate(at, Z_FINISH) != Z_STREAM_END:
            return UNDECODED, j
        sizes[j] = stream[TOTAL_OUT]
        used += stream[TOTAL_OUT]
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
    elif n and bool((codecs == LZ4).all()) and lz4_library() is not None:
        dst = np.empty(int(lz4_frame_bound(lengths).sum()), np.uint8)
        _, used = (int(x) for x in lz4_compress_areas(src, starts, ends, dst, sizes, LZ4_HEADER))
        return dst[:used], sizes
    elif n and bool((codecs == GZIP).all()) and (stream := gzip_stream()) is not None:
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
