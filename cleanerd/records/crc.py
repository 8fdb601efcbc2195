"""CRC-32C (Castagnoli) for compiled kernels, with no Python call per batch.

A v2 batch's CRC covers its bytes from the attributes field to its end. Checking it
through the `crc32c` package costs a Python call per batch, which is the whole cost on
1-record batches, and even the package's C routine, called from a kernel, spends about
300 ns setting up on a 150-byte batch (it is built for long buffers). So on x86-64 with
SSE 4.2 (every x86-64 CPU since 2008) `crc32c_at` is compiled inline from the CPU's
`crc32` instruction, eight bytes per instruction with unaligned loads: about 30 ns for
a 150-byte batch, 5 to 7 GB/s on long ones (`bench/walker.py` measures all three).

Elsewhere (ARM, or a numba told to compile for a generic CPU), kernels call the
package's C routine (its slicing-by-8 software one, or its hardware one where it has
one) by a fixed LLVM symbol name registered at import; the symbol, not an address, is
what compiled code refers to, so numba's on-disk cache stays valid across processes.

Both follow the usual convention: start from ~0, invert the result.
"""

from __future__ import annotations

import ctypes
import os
import platform
from typing import Any, Final, TypeAlias

import crc32c as _crc32c_package
import llvmlite.binding as llvm  # type: ignore[import-untyped]
import llvmlite.ir as ir  # type: ignore[import-untyped]
import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from cleanerd._jit import jit

Int: TypeAlias = int | np.signedinteger[Any]  # what a kernel takes and returns

SYMBOL: Final = "cleanerd_crc32c_extend"
"""The LLVM symbol of the fallback: ``uint32 (uint32 crc, intp address, uintp length)``."""


def _has_sse42() -> bool:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    if os.environ.get("NUMBA_CPU_NAME", "host") != "host":
        return False  # compiled for another CPU: the instruction may not be there
    return bool(llvm.get_host_cpu_features().get("sse4.2", False))


def _library_routine() -> tuple[int, str]:
    """The package's C routine: its address and name."""
    names = ["_crc32c_hw_adler", "_crc32c_hw_arm64", "_crc32c_sw_slicing_by_8"]
    if not getattr(_crc32c_package, "hardware_based", False):
        names = names[-1:]
    path = _crc32c_package._crc32c.__file__
    library = ctypes.CDLL(path)
    for name in names:
        fn = getattr(library, name, None)
        if fn is not None:
            return int(ctypes.cast(fn, ctypes.c_void_p).value or 0), name
    raise ImportError(f"{path} exports none of the CRC-32C routines {names}")


def _intrinsic(typer: Any) -> Any:
    """numba's `intrinsic`, typed loosely: the result is only called from kernels."""
    return intrinsic(typer)


@_intrinsic
def _crc32_u64(typingctx: Any, crc: Any, word: Any) -> Any:
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        fnty = ir.FunctionType(ir.IntType(64), [ir.IntType(64), ir.IntType(64)])
        fn = cgutils.get_or_insert_function(  # type: ignore[no-untyped-call]
            builder.module, fnty, "llvm.x86.sse42.crc32.64.64"
        )
        return builder.call(fn, args)

    return types.uint64(types.uint64, types.uint64), codegen


@_intrinsic
def _crc32_u8(typingctx: Any, crc: Any, byte: Any) -> Any:
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(32), ir.IntType(8)])
        fn = cgutils.get_or_insert_function(  # type: ignore[no-untyped-call]
            builder.module, fnty, "llvm.x86.sse42.crc32.32.8"
        )
        return builder.call(fn, args)

    return types.uint32(types.uint32, types.uint8), codegen


@_intrinsic
def _load_u64(typingctx: Any, address: Any) -> Any:
    """Eight bytes at `address`, unaligned, in the CPU's (little-endian) order."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        ptr = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        return builder.load(ptr, align=1)

    return types.uint64(types.intp), codegen


@_intrinsic
def _load_u8(typingctx: Any, address: Any) -> Any:
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.load(builder.inttoptr(args[0], ir.IntType(8).as_pointer()))

    return types.uint8(types.intp), codegen


LIBRARY_ADDRESS, LIBRARY_ROUTINE = _library_routine()
llvm.add_symbol(SYMBOL, LIBRARY_ADDRESS)
_extend: Any = types.ExternalFunction(SYMBOL, types.uint32(types.uint32, types.intp, types.uintp))


@jit
def crc32c_library_at(address: Int, length: Int) -> Int:
    """CRC-32C through the package's C routine (the fallback; `bench/walker.py` compares)."""
    return np.int64(_extend(np.uint32(0xFFFFFFFF), address, length) ^ np.uint32(0xFFFFFFFF))


@jit
def crc32c_inline_at(address: Int, length: Int) -> Int:
    """CRC-32C from the SSE 4.2 `crc32` instruction (only where `SSE42`)."""
    c = np.uint64(0xFFFFFFFF)
    p = address
    end = address + length
    while p + 8 <= end:
        c = _crc32_u64(c, _load_u64(p))
        p += 8
    c32 = np.uint32(c)
    while p < end:
        c32 = _crc32_u8(c32, _load_u8(p))
        p += 1
    return np.int64(c32 ^ np.uint32(0xFFFFFFFF))


SSE42: Final = _has_sse42()
ROUTINE: Final = "inline sse4.2 crc32" if SSE42 else LIBRARY_ROUTINE
crc32c_at = crc32c_inline_at if SSE42 else crc32c_library_at
"""CRC-32C of `length` bytes at `address` (e.g. ``array.ctypes.data + start``): what the
kernels call. Chosen at import, so each process compiles (or loads) only what it runs."""


@jit
def _crc_of(buf: Any, start: Int, end: Int) -> Int:
    return crc32c_at(buf.ctypes.data + start, end - start)


def crc32c_of(buf: Any, start: int = 0, end: int | None = None) -> int:
    """CRC-32C of ``buf[start:end]`` (a 1-D uint8 array) through the kernels' routine."""
    stop = len(buf) if end is None else end
    if not 0 <= start <= stop <= len(buf):
        raise ValueError(f"range [{start}, {stop}) is outside a buffer of {len(buf)} bytes")
    return int(_crc_of(buf, start, stop))
