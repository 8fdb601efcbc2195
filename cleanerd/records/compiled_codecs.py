"""LZ4, snappy, zstd and gzip decoded in compiled code: every such batch of a segment in one
call.

Decompressing a quiet topic's 1-record batches through a Python codec call per batch
costs about 10 us a batch, where the decoding itself is a fraction of a microsecond: so
the kernel takes the whole list (`decompress_areas`), batch by batch in file order. It
checks everything the data carries (checksums, sizes, bounds, offsets); anything it
does not take as valid, and every other codec's batch, it leaves to the caller, which
goes through the codec library (`compression.py`): that decodes it or names the error,
so a corrupt batch is reported exactly as before. The decoders, called once a batch,
read and write at the buffers' addresses (`address.py`), which the kernel takes once.

LZ4 (codec 3). A batch holds one LZ4 frame (format 1.6, the one Kafka's
`KafkaLZ4BlockOutputStream` writes and librdkafka and the Java client read):

    magic 04 22 4D 18 | FLG | BD | [content size, 8 B LE] | HC |
    blocks: size (4 B LE; high bit set = stored uncompressed) | data | [xxh32, 4 B]
    end mark 00 00 00 00 | [xxh32 of the content, 4 B]

FLG: version 01 (bits 7-6), independent blocks (5), block checksums (4), content size
(3), content checksum (2), a reserved 0 (1), a dictionary id (0; left to the library).
BD: the block maximum size id (bits 6-4, 4..7 for 64 KiB..4 MiB), all other bits 0. HC
is the second byte of the xxh32 of the descriptor (FLG up to HC); Kafka's clients before
0.10 hashed the magic number too, and that legacy value is accepted as `compression.py`
accepts it. A block is LZ4's sequence format: a token (literal count high nibble, match
length low nibble, 15 meaning more length bytes follow, each adding up to 255), the
literals, then a 2-byte little-endian match offset (1..65535) and the match, copied byte
by byte since it may overlap its own output. The last sequence of a block is literals
only. A match reaches back at most to the start of its block when blocks are
independent, else to the start of the frame.

Snappy (codec 2). A batch holds snappy-java's xerial stream (magic `82 'SNAPPY' 00`,
version and compat int32 BE, then blocks of an int32 BE length and a raw block) or, from
some non-Java clients, one raw block. A raw block is a varint of the uncompressed length,
then elements: a literal (tag low bits 00: length - 1 in the tag's high six bits, or in
the 1 to 4 little-endian bytes after it when those bits are 60 to 63) or a copy (01: length
4..11 and an 11-bit offset; 10: length 1..64 and a 2-byte offset; 11: a 4-byte offset),
whose offset reaches back at most to the start of its block; the output must be exactly
the stated length.

Zstd (codec 4) is decoded by libzstd itself (the system's shared library, `libzstd1` on
Debian), which the kernel calls directly as it calls the CRC-32C routine (`crc.py`): each
function's address is registered with LLVM under a fixed symbol name when numba is first
imported, so compiled code names the symbol, not an address, and numba's on-disk cache
stays valid across processes. The kernel takes one standard frame with no dictionary id
(the magic 28 B5 2F FD; a skippable or legacy-format frame is left to the library): it
reads the frame header for the window the frame needs, which must be at most 128 MiB
(`ZSTD_WINDOW_LIMIT`: what the streaming decoders of the codec layer and of Kafka's Java
client accept; libzstd's one-shot call does not check it), checks with
`ZSTD_findFrameCompressedSize` that the frame is the whole area (several frames, or bytes
after one, are left to the library) and that no block declares more than the block
maximum, min(window, 128 KiB) (the streaming decoders refuse such a block; the one-shot
call decodes an RLE one), and decodes it with `ZSTD_decompressDCtx` into the
room left, which checks the content size and checksum when the frame has them; too little
room (`dstSize_tooSmall`) asks for more up to what the frame can decode to (the content size
it states; a block of at most min(window, 128 KiB) per 3 bytes of frame; 128 MiB at most:
damaged blocks get the same error from libzstd however big the room, so growing it for
them must end), and past that, as on any other error, the area is left to the library.
A frame of unknown content size (what Kafka's Java producer writes, streaming) is decoded
the same way, its room bounded by its blocks; a false stated size cannot make the caller
grow its buffer past that bound either.
The decompression context (`ZSTD_DCtx`) is one per thread (`zstd_context`), passed to the
kernel as an address: a context must not be used by two threads at once, and the kernel
runs without the GIL. The functions are bound as `native.bind` binds liblz4's and
zlib's. When libzstd cannot be loaded, their symbols are bound to its stand-ins, never
called: `zstd_context` returns 0, and the kernel leaves every zstd area to the library.

The same binding and a compression context per thread (`zstd_compression_context`)
serve the encoder (`compiled_encoders.py`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
import threading
from typing import Any, Final

import numpy as np

from cleanerd._jit import jit, on_numba_load
from cleanerd.records import zlib_streams
from cleanerd.records.address import Int, be_u32, copy_bytes, load_u8, load_u64, store_u8
from cleanerd.records.compression import LZ4_MAGIC, XERIAL_MAGIC, XXH32_PRIMES
from cleanerd.records.native import load_library, provide, symbol

OK: Final = 0
NEEDS_ROOM: Final = 1
"""The output buffer is too small for the frame: grow it and call again from that row."""
UNDECODED: Final = 2
"""Not a frame this kernel takes as valid: the codec library decides."""

GZIP: Final = 1
SNAPPY: Final = 2
LZ4: Final = 3
ZSTD: Final = 4
"""The codecs decoded here (attribute values); zstd and gzip only when libzstd and zlib
are loaded."""
GZIP_MIN_MEMBER: Final = 18  # a 10-byte header, an empty deflate block, an 8-byte trailer
GZIP_MAX_RATIO: Final = 1032  # deflate's most: 258 bytes from each 2 bits
NO_STREAM: Final = np.empty(0, np.uint64)
"""`decompress_areas`'s inflating stream when zlib is not loaded."""
_LZ4_WORD: Final = int.from_bytes(LZ4_MAGIC, "little")
"""The magic number as the little-endian word that opens a frame (`_le32`)."""
_XERIAL_WORD: Final = int.from_bytes(XERIAL_MAGIC, sys.byteorder)
"""The magic that opens a xerial stream as the machine's word (`load_u64`)."""

_M32: Final = 0xFFFFFFFF
_P1, _P2, _P3, _P4, _P5 = XXH32_PRIMES

ZSTD_MAGIC: Final = 0xFD2FB528
ZSTD_WINDOW_LIMIT: Final = 1 << 27
ZSTD_BLOCK_LIMIT: Final = 1 << 17  # a block decodes to at most 128 KiB
"""The largest window a zstd frame may need: libzstd's limit for streaming decoders that
set none (`ZSTD_WINDOWLOG_LIMIT_DEFAULT`), as the codec layer's (zstandard's) and Kafka's
Java client's (zstd-jni's) do not."""
ZSTD_DST_SIZE_TOO_SMALL: Final = 70
"""libzstd's `ZSTD_error_dstSize_tooSmall` (a stable error code)."""

LIBRARY_NAMES: Final = ["libzstd.so.1"]
"""The names libzstd is loaded by, tried in turn before `ctypes.util.find_library`."""

_POINTER, _SIZE = ctypes.c_void_p, ctypes.c_ssize_t
_SIGNATURES: Final[dict[str, tuple[type[Any], list[type[Any]]]]] = {
    "ZSTD_decompressDCtx": (_SIZE, [_POINTER, _POINTER, _SIZE, _POINTER, _SIZE]),
    "ZSTD_findFrameCompressedSize": (_SIZE, [_POINTER, _SIZE]),
    "ZSTD_isError": (ctypes.c_uint, [_SIZE]),
    "ZSTD_getErrorCode": (ctypes.c_int, [_SIZE]),
    "ZSTD_compressCCtx": (_SIZE, [_POINTER, _POINTER, _SIZE, _POINTER, _SIZE, ctypes.c_int]),
}
"""The libzstd functions the kernel calls: (result, arguments). A size_t is declared
signed, the same register, so that compiled code compares it with signed sizes (an error
code reads as a small negative number)."""


@functools.cache
def zstd_library() -> ctypes.CDLL | None:
    """libzstd, loaded once (None when no name of `LIBRARY_NAMES`, nor the name
    `find_library` gives, loads as a libzstd with every function the kernel calls)."""
    contexts = ("ZSTD_createDCtx", "ZSTD_freeDCtx", "ZSTD_createCCtx", "ZSTD_freeCCtx")
    library = load_library(LIBRARY_NAMES, "zstd", (*_SIGNATURES, *contexts))
    if library is None:
        return None
    for kind in "DC":
        create, free = (
            getattr(library, f"ZSTD_create{kind}Ctx"),
            getattr(library, f"ZSTD_free{kind}Ctx"),
        )
        create.restype, create.argtypes = ctypes.c_void_p, []
        free.restype, free.argtypes = ctypes.c_size_t, [ctypes.c_void_p]
    return library


class _Context:
    """A `ZSTD_DCtx` or `ZSTD_CCtx` (`kind` "D" or "C"; its address, 0 if libzstd could
    not make one), freed with its owner: the thread-local storage of the thread using
    it."""

    def __init__(self, library: ctypes.CDLL, kind: str) -> None:
        self.address = int(getattr(library, f"ZSTD_create{kind}Ctx")() or 0)
        self._free = getattr(library, f"ZSTD_free{kind}Ctx")

    def __del__(self) -> None:
        if self.address:
            self._free(self.address)
            self.address = 0


_local = threading.local()


def _thread_context(kind: str) -> int:
    context: _Context | None = getattr(_local, kind, None)
    if context is None:
        library = zstd_library()
        if library is None:
            return 0
        context = _Context(library, kind)
        setattr(_local, kind, context)
    return context.address


def zstd_context() -> int:
    """This thread's libzstd decompression context, as an address for `decompress_areas`;
    0 when libzstd is not loaded (zstd areas are then left to the codec library)."""
    return _thread_context("D")


def zstd_compression_context() -> int:
    """This thread's libzstd compression context, as an address for
    `zstd_compress_areas`; 0 when libzstd is not loaded (the codec library compresses)."""
    return _thread_context("C")


_decompress_dctx: Any = None
_find_frame_compressed_size: Any = None
_is_error: Any = None
_get_error_code: Any = None
zstd_compress_cctx: Any = None
"""numba's declarations of the libzstd functions, made when numba is imported
(`zstd_compress_cctx` for the encoder, `compiled_encoders.py`)."""


def _declare() -> None:
    global _decompress_dctx, _find_frame_compressed_size, _is_error, _get_error_code
    global zstd_compress_cctx
    from numba import types

    size, i32 = types.intp, types.int32
    declare = types.ExternalFunction
    _decompress_dctx = declare(symbol("ZSTD_decompressDCtx"), size(size, size, size, size, size))
    _find_frame_compressed_size = declare(symbol("ZSTD_findFrameCompressedSize"), size(size, size))
    _is_error = declare(symbol("ZSTD_isError"), i32(size))
    _get_error_code = declare(symbol("ZSTD_getErrorCode"), i32(size))
    zstd_compress_cctx = declare(
        symbol("ZSTD_compressCCtx"), size(size, size, size, size, size, i32)
    )


provide(zstd_library, _SIGNATURES)
on_numba_load(_declare)

lz4_decompress_safe: Any = None
lz4_compress_default: Any = None
"""numba's declarations of liblz4's block functions (the decoder's and the encoder's,
`compiled_encoders.py`), made when numba is imported."""


@functools.cache
def lz4_library() -> ctypes.CDLL | None:
    """liblz4 (`liblz4.so.1`, `liblz4-1` on Debian), loaded once; None when it cannot be
    (LZ4 blocks are then decoded here and encoded by the codec library)."""
    return load_library(["liblz4.so.1"], "lz4", ("LZ4_decompress_safe", "LZ4_compress_default"))


def _declare_lz4() -> None:
    global lz4_decompress_safe, lz4_compress_default
    from numba import types

    size, i32 = types.intp, types.int32
    lz4_decompress_safe = types.ExternalFunction(
        symbol("LZ4_decompress_safe"), i32(size, size, i32, i32)
    )
    lz4_compress_default = types.ExternalFunction(
        symbol("LZ4_compress_default"), i32(size, size, i32, i32)
    )


_LZ4_BLOCK: Final = (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int])
provide(lz4_library, {"LZ4_decompress_safe": _LZ4_BLOCK, "LZ4_compress_default": _LZ4_BLOCK})
on_numba_load(_declare_lz4)


@jit
def _rotl(x: Int, r: Int) -> Int:
    return ((x << r) | (x >> (32 - r))) & _M32


@jit
def _le32(at: Int, p: Int) -> Int:
    """The little-endian uint32 at byte `p` of the bytes at address `at`."""
    return (
        load_u8(at + p)
        | (load_u8(at + p + 1) << 8)
        | (load_u8(at + p + 2) << 16)
        | (load_u8(at + p + 3) << 24)
    )


@jit
def xxh32(at: Int, start: Int, n: Int) -> Int:
    """XXH32 (seed 0) of the `n` bytes from `start` of the bytes at address `at`. Products
    are taken in int64, which wraps; only their low 32 bits are kept.
    `compression.xxhash32` is the same function for the codec layer, which hashes a few
    descriptor bytes and so does not load numba for them; the tests hold the two equal."""
    i, end = start, start + n
    if n >= 16:
        v1: Int = (_P1 + _P2) & _M32
        v2: Int = _P2
        v3: Int = 0
        v4: Int = (-_P1) & _M32
        while i + 16 <= end:
            v1 = (_rotl((v1 + _le32(at, i) * _P2) & _M32, 13) * _P1) & _M32
            v2 = (_rotl((v2 + _le32(at, i + 4) * _P2) & _M32, 13) * _P1) & _M32
            v3 = (_rotl((v3 + _le32(at, i + 8) * _P2) & _M32, 13) * _P1) & _M32
            v4 = (_rotl((v4 + _le32(at, i + 12) * _P2) & _M32, 13) * _P1) & _M32
            i += 16
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _M32
    else:
        h = _P5
    h = (h + n) & _M32
    while i + 4 <= end:
        h = (_rotl((h + _le32(at, i) * _P3) & _M32, 17) * _P4) & _M32
        i += 4
    while i < end:
        h = (_rotl((h + load_u8(at + i) * _P5) & _M32, 11) * _P1) & _M32
        i += 1
    h ^= h >> 15
    h = (h * _P2) & _M32
    h ^= h >> 13
    h = (h * _P3) & _M32
    h ^= h >> 16
    return h


@jit
def _length(at: Int, p: Int, end: Int, n: Int) -> tuple[Int, Int]:
    """A token's length nibble `n`; at 15 it goes on in the bytes from `p`, each adding
    up to 255 until one below 255: (the length, the position after it), or (-1, p) when
    the bytes end first."""
    if n != 15:
        return n, p
    while p < end:
        more = load_u8(at + p)
        p += 1
        n += more
        if more != 255:
            return n, p
    return -1, p


@jit
def _block(
    at: Int, p: Int, end: Int, to: Int, o: Int, cap: Int, floor: Int, room: Int
) -> tuple[Int, Int]:
    """Decode one compressed block (bytes `p` to `end` at address `at`) to the output at
    address `to` from `o` (at most `room` bytes, none past `cap`, matches reaching back
    to `floor` at most): (status, output end)."""
    limit = o + room
    while True:
        if p >= end:
            return UNDECODED, o  # an empty block, or one ending after a match
        token = load_u8(at + p)
        n, p = _length(at, p + 1, end, token >> 4)
        if n < 0 or p + n > end or o + n > limit:
            return UNDECODED, o
        if o + n > cap:
            return NEEDS_ROOM, o
        copy_bytes(to + o, at + p, n)
        p += n
        o += n
        if p == end:
            return OK, o  # the last sequence: literals only
        if p + 2 > end:
            return UNDECODED, o
        offset = load_u8(at + p) | (load_u8(at + p + 1) << 8)
        p += 2
        if offset == 0 or offset > o - floor:
            return UNDECODED, o
        n, p = _length(at, p, end, token & 15)
        n += 4
        if n < 4 or o + n > limit:
            return UNDECODED, o
        if o + n > cap:
            return NEEDS_ROOM, o
        for k in range(n):  # byte by byte: the match may overlap what it writes
            store_u8(to + o + k, load_u8(to + o - offset + k))
        o += n


@jit
def _frame(at: Int, s: Int, e: Int, to: Int, cap: Int, o: Int, lz4_native: bool) -> tuple[Int, Int]:
    """Decode the frame (bytes `s` to `e` at address `at`) to the `cap` bytes at address
    `to` from `o`: (status, output end); independent blocks through liblz4 when
    `lz4_native` (it is loaded), else here."""
    if e - s < 7 or _le32(at, s) != _LZ4_WORD:
        return UNDECODED, o
    flg, bd = load_u8(at + s + 4), load_u8(at + s + 5)
    if flg >> 6 != 1 or flg & 0x03 or bd & 0x8F or (bd >> 4) & 7 < 4:
        return UNDECODED, o
    block_max = np.int64(1) << (8 + 2 * ((bd >> 4) & 7))
    p = s + 6
    content_size: Int = -1
    if flg & 0x08:
        if p + 8 > e or load_u8(at + p + 7) & 0x80:
            return UNDECODED, o
        content_size = _le32(at, p) | (_le32(at, p + 4) << 32)
        p += 8
    if p >= e:
        return UNDECODED, o
    hc = load_u8(at + p)
    standard = (xxh32(at, s + 4, p - s - 4) >> 8) & 0xFF
    legacy = (xxh32(at, s, p - s) >> 8) & 0xFF  # Kafka's clients before 0.10
    if hc != standard and hc != legacy:
        return UNDECODED, o
    p += 1
    independent = flg & 0x20
    checksummed = 4 if flg & 0x10 else 0
    start = o
    while True:
        if p + 4 > e:
            return UNDECODED, o
        size = _le32(at, p)
        p += 4
        if size == 0:
            break
        n = size & 0x7FFFFFFF
        if n > block_max or p + n + checksummed > e:
            return UNDECODED, o
        if checksummed and xxh32(at, p, n) != _le32(at, p + n):
            return UNDECODED, o
        if size & 0x80000000:
            if o + n > cap:
                return NEEDS_ROOM, o
            copy_bytes(to + o, at + p, n)
            o += n
        elif independent and lz4_native:
            # liblz4's decoder (what the codec library runs), several times faster than
            # `_block`, which copies each match byte by byte; it needs room for a whole
            # block first.
            if cap - o < block_max:
                return NEEDS_ROOM, o
            written = lz4_decompress_safe(at + p, to + o, np.int32(n), np.int32(block_max))
            if written <= 0:  # an error, or an empty block (which `_block` refuses too)
                return UNDECODED, o
            o += written
        else:
            status, o = _block(at, p, p + n, to, o, cap, o if independent else start, block_max)
            if status != OK:
                return status, o
        p += n + checksummed
    if flg & 0x04:
        if p + 4 > e or xxh32(to, start, o - start) != _le32(at, p):
            return UNDECODED, o
        p += 4
    if p != e or (content_size >= 0 and o - start != content_size):
        return UNDECODED, o
    return OK, o


@jit
def _varint32(at: Int, p: Int, end: Int) -> tuple[Int, Int]:
    """A little-endian base-128 varint of at most 32 bits: (value, next position), or
    (-1, p) if it is cut short or too long."""
    value = np.int64(0)
    for k in range(5):
        if p + k >= end:
            return -1, p
        b = load_u8(at + p + k)
        value |= (b & 0x7F) << (7 * k)
        if b < 0x80:
            return (value, p + k + 1) if value <= _M32 else (-1, p)
    return -1, p


@jit
def _snappy_block(at: Int, p: Int, end: Int, to: Int, cap: Int, o: Int) -> tuple[Int, Int]:
    """Decode one raw snappy block (bytes `p` to `end` at address `at`) to the `cap` bytes
    at address `to` from `o`: (status, output end)."""
    n, p = _varint32(at, p, end)
    # No element expands more than 64 bytes from 3 (a 2-byte-offset copy): a larger
    # stated length is damage, which must not size an allocation.
    if n < 0 or n > 22 * (end - p):
        return UNDECODED, o
    if o + n > cap:
        return NEEDS_ROOM, o
    start, limit = o, o + n
    while p < end:
        tag: Int = load_u8(at + p)
        p += 1
        kind = tag & 3
        length: Int = 0
        offset: Int = 0
        if kind == 0:
            length = tag >> 2
            if length >= 60:
                extra = length - 59
                if p + extra > end:
                    return UNDECODED, o
                length = 0
                for k in range(extra):
                    length |= load_u8(at + p + k) << (8 * k)
                p += extra
            length += 1
            if p + length > end or o + length > limit:
                return UNDECODED, o
            copy_bytes(to + o, at + p, length)
            p += length
            o += length
            continue
        if kind == 1:
            if p >= end:
                return UNDECODED, o
            length = ((tag >> 2) & 7) + 4
            offset = ((tag >> 5) << 8) | load_u8(at + p)
            p += 1
        elif kind == 2:
            if p + 2 > end:
                return UNDECODED, o
            length = (tag >> 2) + 1
            offset = load_u8(at + p) | (load_u8(at + p + 1) << 8)
            p += 2
        else:
            if p + 4 > end:
                return UNDECODED, o
            length = (tag >> 2) + 1
            offset = _le32(at, p)
            p += 4
        if offset == 0 or offset > o - start or o + length > limit:
            return UNDECODED, o
        for k in range(length):  # byte by byte: the copy may overlap what it writes
            store_u8(to + o + k, load_u8(to + o - offset + k))
        o += length
    if o != limit:
        return UNDECODED, o
    return OK, o


@jit
def _snappy(at: Int, s: Int, e: Int, to: Int, cap: Int, o: Int) -> tuple[Int, Int]:
    """Decode the snappy area (bytes `s` to `e` at address `at`: a xerial stream or one raw
    block) to the `cap` bytes at address `to` from `o`."""
    if e - s < 8 or load_u64(at + s) != np.uint64(_XERIAL_WORD):
        return _snappy_block(at, s, e, to, cap, o)
    p = s + 16
    if p > e:
        return UNDECODED, o
    while p < e:
        if p + 4 > e:
            return UNDECODED, o
        n = be_u32(at, p)
        p += 4
        if n < 0 or n >= 0x80000000 or p + n > e:
            return UNDECODED, o
        status, o = _snappy_block(at, p, p + n, to, cap, o)
        if status != OK:
            return status, o
        p += n
    return OK, o


@jit
def _zstd_window(at: Int, s: Int, e: Int) -> Int:
    """The window the zstd frame (bytes `s` to `e` at address `at`) needs, from its
    header (the frame is at least 6 bytes): at most ZSTD_WINDOW_LIMIT + 1 when it is
    larger than that, -1 when the frame is not one the kernel takes (a dictionary id, a
    header cut short)."""
    descriptor = load_u8(at + s + 4)
    fcs_flag, single = descriptor >> 6, descriptor & 0x20
    if descriptor & 0x03:
        return -1  # a dictionary id: Kafka's clients write none
    if not single:
        exponent, mantissa = load_u8(at + s + 5) >> 3, load_u8(at + s + 5) & 7
        if exponent > 17:  # past 2^27 (and the shift would overflow)
            return ZSTD_WINDOW_LIMIT + 1
        base = np.int64(1) << (10 + exponent)
        return base + (base >> 3) * mantissa
    # A single segment: the window is the content size, stored in 1, 2, 4 or 8 bytes.
    p, n = s + 5, np.int64(1) << fcs_flag
    if p + n > e:
        return -1
    size = np.int64(0)
    for k in range(n):
        if k >= 4 and load_u8(at + p + k):
            return ZSTD_WINDOW_LIMIT + 1
        size |= load_u8(at + p + k) << (8 * k)
    return size + 256 if n == 2 else size


@jit
def _zstd_content_size(at: Int, s: Int, e: Int) -> Int:
    """The content size the header of the zstd frame (bytes `s` to `e` at address `at`)
    states (the frame is at least 6 bytes, with no dictionary id), or -1 when it states
    none (or one past 2^63)."""
    descriptor = load_u8(at + s + 4)
    fcs_flag, single = descriptor >> 6, descriptor & 0x20
    if fcs_flag == 0 and not single:
        return -1
    n = np.int64(1) << fcs_flag
    p = s + 5 if single else s + 6  # after the window descriptor, if any
    if p + n > e or (n == 8 and load_u8(at + p + 7) >= 0x80):
        return -1
    size = np.int64(0)
    for k in range(n):
        size |= load_u8(at + p + k) << (8 * k)
    return size + 256 if n == 2 else size


@jit
def _zstd_blocks_fit(at: Int, s: Int, e: Int, window: Int) -> bool:
    """Whether every block of the zstd frame (bytes `s` to `e` at address `at`; its size
    already checked by libzstd, no dictionary id) declares at most the frame's block
    maximum, min(window, 128 KiB): a raw or RLE block its content, a compressed block its
    bytes, as the streaming decoders check and libzstd's one-shot call does not for an
    RLE block."""
    descriptor = load_u8(at + s + 4)
    fcs_flag, single = descriptor >> 6, (descriptor & 0x20) != 0
    fcs_bytes = (1 if single else 0) if fcs_flag == 0 else np.int64(1) << fcs_flag
    p = s + 5 + (0 if single else 1) + fcs_bytes
    limit = min(window, ZSTD_BLOCK_LIMIT)
    while p + 3 <= e:
        header = load_u8(at + p) | (load_u8(at + p + 1) << 8) | (load_u8(at + p + 2) << 16)
        kind, size = (header >> 1) & 3, header >> 3
        if kind == 3 or size > limit:
            return False
        p += 3 + (1 if kind == 1 else size)
        if header & 1:
            return True
    return False


@jit
def _zstd_room_bound(at: Int, s: Int, e: Int, window: Int) -> Int:
    """The most room the kernel gives the zstd frame (bytes `s` to `e` at address `at`;
    its header read, its `window` known): what the frame can decode to (the content size
    it states, and at most one block of min(window, 128 KiB) per 3 bytes of the frame, a
    block header's size), and never past ZSTD_WINDOW_LIMIT; a bigger frame is left to
    the library."""
    bound = min(((e - s) // 3) * min(window, ZSTD_BLOCK_LIMIT), ZSTD_WINDOW_LIMIT)
    stated = _zstd_content_size(at, s, e)
    return bound if stated < 0 else min(bound, stated)


@jit
def _zstd(at: Int, s: Int, e: Int, to: Int, cap: Int, o: Int, dctx: Int) -> tuple[Int, Int]:
    """Decode the zstd area (bytes `s` to `e` at address `at`: one frame) to the `cap`
    bytes at address `to` from `o` through libzstd, with the decompression context at
    `dctx`: (status, output end)."""
    if dctx == 0:
        return UNDECODED, o  # no libzstd
    if e - s < 6 or _le32(at, s) != ZSTD_MAGIC:
        return UNDECODED, o
    window = _zstd_window(at, s, e)
    if window < 0 or window > ZSTD_WINDOW_LIMIT:
        return UNDECODED, o
    if _find_frame_compressed_size(at + s, e - s) != e - s:
        return UNDECODED, o  # several frames, bytes after the frame, or an error
    if not _zstd_blocks_fit(at, s, e, window):
        return UNDECODED, o
    written = _decompress_dctx(dctx, to + o, cap - o, at + s, e - s)
    if _is_error(written):
        # libzstd also says the room is too small when damaged blocks overflow what
        # the frame may hold, however big the room: so more is asked for only up to
        # what the frame could hold, and past that the library decides.
        too_small = _get_error_code(written) == ZSTD_DST_SIZE_TOO_SMALL
        if too_small and cap - o < _zstd_room_bound(at, s, e, window):
            return NEEDS_ROOM, o
        return UNDECODED, o
    return OK, o + written


@jit
def _gzip(at: Int, s: Int, e: Int, to: Int, cap: Int, o: Int, stream: Any) -> tuple[Int, Int]:
    """Decode the gzip area (bytes `s` to `e` at address `at`: one member) to the `cap`
    bytes at address `to` from `o` through zlib, with this thread's inflating stream
    (`stream`, its words; empty without zlib): (status, output end). The member's trailer
    states its length: less room than that asks for more (up to what its bytes could
    hold); anything zlib does not end cleanly on the area's last byte (several members,
    bytes after one, damage: its CRC-32 and length are checked) is left to the library."""
    if len(stream) == 0:
        return UNDECODED, o
    if e - s < GZIP_MIN_MEMBER or load_u8(at + s) != 0x1F or load_u8(at + s + 1) != 0x8B:
        return UNDECODED, o
    stated = _le32(at, e - 4)
    if stated > cap - o:
        if stated <= min(GZIP_MAX_RATIO * (e - s), ZSTD_WINDOW_LIMIT):
            return NEEDS_ROOM, o
        return UNDECODED, o
    words = stream.ctypes.data
    if zlib_streams.inflate_reset(words) != 0:
        return UNDECODED, o
    zlib_streams.feed(stream, at + s, e - s, to + o, cap - o)
    if zlib_streams.inflate(words, zlib_streams.Z_FINISH) != zlib_streams.Z_STREAM_END:
        return UNDECODED, o
    if stream[zlib_streams.AVAIL_IN] != 0:
        return UNDECODED, o
    return OK, o + stream[zlib_streams.TOTAL_OUT]


@jit
def decompress_areas(
    src: Any,
    starts: Any,
    ends: Any,
    codecs: Any,
    dst: Any,
    used: Int,
    out_start: Any,
    out_end: Any,
    i: Int,
    dctx: Int,
    inflating: Any,
    lz4_native: bool,
) -> tuple[Int, Int, Int]:
    """Decode the areas `src[starts[j]:ends[j]]` (compressed with `codecs[j]`) for j = i,
    i + 1, ... in order into `dst` from `used`, recording where each went (`out_start[j]`,
    `out_end[j]`); zstd areas with the libzstd context at `dctx` (`zstd_context()`, this
    thread's; 0 leaves them to the codec library), gzip ones with the inflating stream
    `inflating` (`zlib_streams.inflating()`; empty leaves them to the library), LZ4
    blocks through liblz4 when `lz4_native` (`native.lz4_library()` is loaded). Stops at
    the first that does not fit (NEEDS_ROOM) or that is left to the codec library
    (UNDECODED: also every area of another codec, and every area when `src` or `dst` is
    not one run of adjacent bytes): (status, that j, bytes of `dst` used before it);
    (OK, len, used) when all were decoded. Going in order keeps the first bad batch the
    one reported. The decoders read and write at addresses (`address.py`): the arrays
    are held here, for the whole call."""
    if src.strides[0] != 1 or dst.strides[0] != 1:
        return UNDECODED, i, used
    at, to, cap = src.ctypes.data, dst.ctypes.data, len(dst)
    for j in range(i, len(starts)):
        codec = codecs[j]
        if codec == LZ4:
            status, end = _frame(at, starts[j], ends[j], to, cap, used, lz4_native)
        elif codec == SNAPPY:
            status, end = _snappy(at, starts[j], ends[j], to, cap, used)
        elif codec == ZSTD:
            status, end = _zstd(at, starts[j], ends[j], to, cap, used, dctx)
        elif codec == GZIP:
            status, end = _gzip(at, starts[j], ends[j], to, cap, used, inflating)
        else:
            return UNDECODED, j, used
        if status != OK:
            return status, j, used
        out_start[j] = used
        out_end[j] = end
        used = end
    return OK, len(starts), used
