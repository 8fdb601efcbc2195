"""zlib's gzip streams for compiled kernels: one deflating and one inflating `z_stream`
per thread, and zlib's functions bound for kernels to call (`native.py`).

The gzip codec's stream is zlib's with window bits 31 (a gzip header and trailer: the
CRC-32 and the length of the data, which `inflate` checks). A kernel resets the stream
(`deflateReset` / `inflateReset`: cheap, where an init per batch is most of a small
batch's cost), sets its four in/out fields (`feed`: the stream seen as 64-bit words,
every field starting one) and calls `deflate` / `inflate` with `Z_FINISH`: one call per
area, with the room it needs. A deflating stream is set up with the codec layer's level,
memory level 8 and the default strategy: what Python's `zlib.compressobj` makes with the
same library, byte for byte. zlib is the system's (`libz.so.1`, the one Python's own
`zlib` module uses); without it `deflating`/`inflating` return None and callers take
the codec layer.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any, Final

import numpy as np

from cleanerd._jit import jit, on_numba_load
from cleanerd.records.address import Int
from cleanerd.records.compression import GZIP_LEVEL
from cleanerd.records.native import load_library, provide, symbol

Z_FINISH: Final = 4
Z_STREAM_END: Final = 1
GZIP_WINDOW_BITS: Final = 31

deflate: Any = None
deflate_reset: Any = None
deflate_bound: Any = None
inflate: Any = None
inflate_reset: Any = None
"""numba's declarations of zlib's functions, made when numba is imported."""


class _ZStream(ctypes.Structure):
    """zlib's `z_stream` (zlib.h)."""

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
NEXT_IN, AVAIL_IN, NEXT_OUT, AVAIL_OUT, TOTAL_OUT = (
    _WORD[n] for n in ("next_in", "avail_in", "next_out", "avail_out", "total_out")
)
"""The fields' indexes in the stream seen as 64-bit words."""


@functools.cache
def zlib_library() -> ctypes.CDLL | None:
    """zlib (`libz.so.1`), loaded once; None when it cannot be."""
    needed = (
        "deflateInit2_", "deflate", "deflateReset", "deflateBound", "deflateEnd",
        "inflateInit2_", "inflate", "inflateReset", "inflateEnd",
    )  # fmt: skip
    library = load_library(["libz.so.1"], "z", needed)
    if library is not None:
        library.zlibVersion.restype = ctypes.c_char_p
    return library


class _Stream:
    """A `z_stream` set up for the gzip codec, deflating or inflating, its words as a
    numpy view for kernels; ended with its owner, the thread-local storage of its
    thread."""

    def __init__(self, library: ctypes.CDLL, *, deflating: bool) -> None:
        self.ready = False
        self._stream = _ZStream()
        stream, version = ctypes.byref(self._stream), library.zlibVersion()
        size = ctypes.sizeof(_ZStream)
        if deflating:
            self._end = library.deflateEnd
            status = library.deflateInit2_(
                stream, GZIP_LEVEL, 8, GZIP_WINDOW_BITS, 8, 0, version, size
            )
        else:
            self._end = library.inflateEnd
            status = library.inflateInit2_(stream, GZIP_WINDOW_BITS, version, size)
        self.ready = status == 0
        self.words = np.ctypeslib.as_array(
            (ctypes.c_uint64 * (size // 8)).from_buffer(self._stream)
        )

    def __del__(self) -> None:
        if self.ready:
            self._end(ctypes.byref(self._stream))
            self.ready = False


_local = threading.local()


def _thread_stream(*, deflating: bool) -> Any:
    name = "deflating" if deflating else "inflating"
    stream: _Stream | None = getattr(_local, name, None)
    if stream is None:
        library = zlib_library()
        if library is None:
            return None
        stream = _Stream(library, deflating=deflating)
        setattr(_local, name, stream)
    return stream.words if stream.ready else None


def deflating() -> Any:
    """This thread's deflating gzip stream (its words), or None without zlib."""
    return _thread_stream(deflating=True)


def inflating() -> Any:
    """This thread's inflating gzip stream (its words), or None without zlib."""
    return _thread_stream(deflating=False)


@jit
def feed(stream: Any, source: Int, length: Int, target: Int, room: Int) -> None:
    """Point the stream at `length` bytes at address `source`, and `room` bytes of output
    at address `target`."""
    stream[NEXT_IN] = source
    stream[AVAIL_IN] = length
    stream[NEXT_OUT] = target
    stream[AVAIL_OUT] = room


_POINTER, _INT, _ULONG = ctypes.c_void_p, ctypes.c_int, ctypes.c_ulong
provide(
    zlib_library,
    {
        "deflate": (_INT, [_POINTER, _INT]),
        "inflate": (_INT, [_POINTER, _INT]),
        "deflateReset": (_INT, [_POINTER]),
        "inflateReset": (_INT, [_POINTER]),
        "deflateBound": (_ULONG, [_POINTER, _ULONG]),
    },
)


def _declare() -> None:
    global deflate, deflate_reset, deflate_bound, inflate, inflate_reset
    from numba import types

    size, i32 = types.intp, types.int32
    deflate = types.ExternalFunction(symbol("deflate"), i32(size, i32))
    inflate = types.ExternalFunction(symbol("inflate"), i32(size, i32))
    deflate_reset = types.ExternalFunction(symbol("deflateReset"), i32(size))
    inflate_reset = types.ExternalFunction(symbol("inflateReset"), i32(size))
    deflate_bound = types.ExternalFunction(symbol("deflateBound"), size(size, size))


on_numba_load(_declare)
