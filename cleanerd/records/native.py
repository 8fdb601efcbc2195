"""System C libraries that compiled kernels call directly (libzstd, liblz4, zlib).

A library is loaded with ctypes (`load_library`), and each function a kernel calls has a
fixed symbol name, `cleanerd_<function>` (`symbol`): compiled code names the symbol, not
an address, so numba's on-disk cache stays valid across processes (as `crc.py` does for
the CRC-32C routine of the crc32c extension). `provide` registers the functions'
addresses (`_jit.on_symbols`), asked for when numba or the compiled kernels are first
loaded. Without the library, a symbol is bound to a stand-in that returns 0, so kernels
still compile; their callers check the library (or the context made with it) first and
take the codec layer instead, so the stand-in is never called.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable, Mapping
from typing import Any

from cleanerd._jit import on_symbols

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


def symbol(name: str) -> str:
    """The symbol kernels call the library function `name` by."""
    return f"cleanerd_{name}"


def provide(
    library: Callable[[], ctypes.CDLL | None], functions: Mapping[str, tuple[Any, list[Any]]]
) -> None:
    """Register the addresses of `functions` ({name: (result type, argument types)}) of
    `library()` under their symbols, the stand-ins' when it is None (loaded when first
    asked for, then the same addresses every time)."""

    @functools.cache
    def addresses() -> dict[str, int]:
        loaded = library()
        return {symbol(name): _address(loaded, name, *sig) for name, sig in functions.items()}

    on_symbols(addresses)


def _address(library: ctypes.CDLL | None, name: str, restype: Any, argtypes: list[Any]) -> int:
    if library is None:
        callback = ctypes.CFUNCTYPE(restype, *argtypes)(lambda *_: 0)
        _STAND_INS.append(callback)
        return int(ctypes.cast(callback, ctypes.c_void_p).value or 0)
    return int(ctypes.cast(getattr(library, name), ctypes.c_void_p).value or 0)
