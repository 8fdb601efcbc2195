"""CRC-32C (Castagnoli) for compiled kernels, with no Python call per batch.

A v2 batch's CRC covers its bytes from the attributes field to its end. Checking it
through the `crc32c` package costs a Python call per batch (about 400 ns), which is the
whole cost on 1-record batches. Kernels instead call the package's own C routine
directly: its address is registered under a fixed symbol name (`_jit.on_symbols`: with
LLVM for the JIT, in the compiled kernels' trampolines), and kernels declare that symbol
as an external function. Because compiled code refers to the
symbol by name, not by address, numba's on-disk cache stays valid across processes. The
symbol is declared to numba when numba is first imported (`_jit.on_numba_load`), so a
command that runs no kernel does not import numba for it.

The routine is the package's hardware one (SSE 4.2 on x86-64, chosen by the package's
own CPU probe) when the package reports `hardware_based`, else its slicing-by-8 software
one; both take ``(crc, pointer, length)``, with the usual conventions applied by
`crc32c_at` (start from ~0, invert the result). Measured on this project's machines
(`bench/walker.py`): about 16 ns for a 180-byte batch and 10-11 GB/s on long ones; an
inline single-stream loop over the CPU's `crc32` instruction, tried first, reached
6 GB/s and lost at every batch size, so it is not kept.
"""

from __future__ import annotations

import ctypes
from typing import Any, Final

import numpy as np

from cleanerd._jit import jit, on_numba_load, on_symbols
from cleanerd.records.address import Int, bytes_address
from cleanerd.records.crc32c_library import EXTENSION, HARDWARE_BASED

SYMBOL: Final = "cleanerd_crc32c_extend"
"""The LLVM symbol kernels call: ``uint32 (uint32 crc, intp address, uintp length)``."""


def _library_routine() -> tuple[int, str]:
    """The package's C routine: its address and name."""
    names = ["_crc32c_hw_adler", "_crc32c_hw_arm64", "_crc32c_sw_slicing_by_8"]
    if not HARDWARE_BASED:
        names = names[-1:]
    path = EXTENSION.__file__
    library = ctypes.CDLL(path)
    for name in names:
        fn = getattr(library, name, None)
        if fn is not None:
            return int(ctypes.cast(fn, ctypes.c_void_p).value or 0), name
    raise ImportError(f"{path} exports none of the CRC-32C routines {names}")


ADDRESS, ROUTINE = _library_routine()
_extend: Any = None
"""numba's declaration of SYMBOL, made when numba is imported (kernels are compiled, or
loaded from the cache, only after that)."""


def _declare() -> None:
    global _extend
    from numba import types

    _extend = types.ExternalFunction(SYMBOL, types.uint32(types.uint32, types.intp, types.uintp))


on_symbols(lambda: {SYMBOL: ADDRESS})
on_numba_load(_declare)


@jit
def crc32c_at(address: Int, length: Int) -> Int:
    """CRC-32C of `length` bytes at `address` (e.g. ``array.ctypes.data + start``)."""
    return np.int64(_extend(np.uint32(0xFFFFFFFF), address, length) ^ np.uint32(0xFFFFFFFF))


@jit
def _crc_of(buf: Any, start: Int, end: Int) -> Int:
    return crc32c_at(bytes_address(buf) + start, end - start)


def crc32c_of(buf: Any, start: int = 0, end: int | None = None) -> int:
    """CRC-32C of ``buf[start:end]`` (a 1-D uint8 array) through the kernels' routine."""
    stop = len(buf) if end is None else end
    if not 0 <= start <= stop <= len(buf):
        raise ValueError(f"range [{start}, {stop}) is outside a buffer of {len(buf)} bytes")
    return int(_crc_of(buf, start, stop))
