"""System C libraries that compiled kernels call directly (libzstd, liblz4, zlib).

A library is loaded with ctypes (`load_library`), and each function a kernel calls is
registered with LLVM under a fixed symbol name, `cleanerd_<function>` (`bind`), when
numba is first imported: compiled code names the symbol, not an address, so numba's
on-disk cache stays valid across processes (as `crc.py` does for the CRC-32C routine of
the crc32c extension). Without the library, the symbol is bound to a stand-in that
returns 0, so kernels still compile; their callers check the library (or the context
made with it) first and take the codec layer instead, so the stand-in is never called.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

_STAND_INS: list[Any] = []
"""The callbacks a missing library's symbols are bound to (kept alive here)."""


def load_library(names: list[str], short: str, needed: tuple[str, ...]) -> ctypes.CDLL | None:
    """The first of `names`, then of what `find_library(short)` finds (asked only then:
    it runs `ldconfig`), that loads and has every function of `needed`, or None."""
    for name in names:
        library = _loaded(name, needed)
        if library is not None:
            return library
    found = ctypes.util.find_library(short)
    return None if found is None else _loaded(found, needed)


def _loaded(name: str, needed: tuple[str, ...]) -> ctypes.CDLL | None:
    try:
        library = ctypes.CDLL(name)
    except OSError:
        return None
    return library if all(hasattr(library, f) for f in needed) else None


def bind(library: ctypes.CDLL | None, name: str, restype: Any, argtypes: list[Any]) -> str:
    """Register `library`'s function `name` with LLVM as `cleanerd_<name>` (the stand-in
    when `library` is None); returns the symbol."""
    import llvmlite.binding as llvm

    if library is None:
        callback = ctypes.CFUNCTYPE(restype, *argtypes)(lambda *_: 0)
        _STAND_INS.append(callback)
        address = int(ctypes.cast(callback, ctypes.c_void_p).value or 0)
    else:
        address = int(ctypes.cast(getattr(library, name), ctypes.c_void_p).value or 0)
    symbol = f"cleanerd_{name}"
    llvm.add_symbol(symbol, address)
    return symbol
