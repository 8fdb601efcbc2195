"""Byte reads and writes at an address, for the helpers that kernels call per record or
per batch.

A numba function that takes an array takes a reference to it: a count incremented on
entry and decremented at every return, both atomic. numba's pruning pass removes the
pair only when no loop lies between them, so a helper with a loop (a varint, a record's
headers) paid two atomic operations per call, and a record parse calls several: they
were 43% of the time of decoding 100-record batches. Helpers called in a kernel's loop
therefore take the address of the bytes (``array.ctypes.data``, an integer, read once
by the kernel) and read through `load_u8`, which is a plain load: no reference, no
bounds check (numba does not check bounds of an array index either). The kernel keeps
the array, and so the memory, alive for as long as it runs. Helpers that write (a
decoder's output, an assembled batch) write through `store_u8` and `copy_bytes` (LLVM's
memcpy, which a loop over bytes in numba does not become) the same way. The big-endian
field readers (`be_i64`, `be_i32`, `be_u32`, `be_i16`: a batch header's fields, a
xerial block's length, a header-version value) live here too, for every module that
reads Kafka's byte order at an address.

The intrinsics are declared when numba is first imported (`_jit.on_numba_load`), as
`prefetch.py`'s is, so a command that runs no kernel does not import numba for it.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np
from numpy.typing import NDArray

from cleanerd._jit import jit, jit_inline, on_numba_load

Int: TypeAlias = int | np.signedinteger[Any]
"""What a kernel takes and returns, seen from Python (numba's integers are numpy's)."""


def _load(bits: int, address: Any) -> tuple[Any, Any] | None:
    """The signature and code of a load of an unsigned `bits`-bit integer at an
    integer `address`, in the machine's byte order, at any alignment."""
    from llvmlite import ir
    from numba import types

    if not isinstance(address, types.Integer):
        return None
    sig = types.uint8(address) if bits == 8 else types.uint64(address)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        pointer = builder.inttoptr(args[0], ir.IntType(bits).as_pointer())
        return builder.load(pointer, align=1)

    return sig, codegen


def _store_u8_typer(typingctx: Any, address: Any, value: Any) -> tuple[Any, Any] | None:
    from llvmlite import ir
    from numba import types

    if not (isinstance(address, types.Integer) and isinstance(value, types.Integer)):
        return None
    sig = types.void(address, value)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        byte = ir.IntType(8)
        pointer = builder.inttoptr(args[0], byte.as_pointer())
        builder.store(builder.trunc(args[1], byte), pointer, align=1)
        return context.get_dummy_value()

    return sig, codegen


def _copy_typer(typingctx: Any, to: Any, at: Any, n: Any) -> tuple[Any, Any] | None:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils

    if not all(isinstance(x, types.Integer) for x in (to, at, n)):
        return None
    sig = types.void(to, at, n)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        byte_ptr = ir.IntType(8).as_pointer()
        to_v, at_v = (builder.inttoptr(x, byte_ptr) for x in args[:2])
        cgutils.raw_memcpy(builder, to_v, at_v, args[2], 1)  # type: ignore[no-untyped-call]
        return context.get_dummy_value()

    return sig, codegen


def _load_u8_typer(typingctx: Any, address: Any) -> tuple[Any, Any] | None:
    return _load(8, address)


def _load_u64_typer(typingctx: Any, address: Any) -> tuple[Any, Any] | None:
    return _load(64, address)


_load_u8: Any = None
"""The byte at an address (jit code only)."""
_load_u64: Any = None
"""The 8 bytes at an address as a native-endian uint64 (jit code only)."""
_store_u8: Any = None
"""Store the low byte of an integer at an address (jit code only)."""
_copy: Any = None
"""memcpy(to, at, n) (jit code only)."""


def _declare() -> None:
    global _load_u8, _load_u64, _store_u8, _copy
    from numba.extending import intrinsic

    _load_u8 = intrinsic(_load_u8_typer)
    _load_u64 = intrinsic(_load_u64_typer)
    _store_u8 = intrinsic(_store_u8_typer)
    _copy = intrinsic(_copy_typer)


on_numba_load(_declare)


@jit_inline
def load_u8(address: Int) -> np.int64:
    """The byte at `address`, as an int64: a byte shifted unsigned is a uint64, which numba
    unifies with an int64 (another branch's value, say) as a float."""
    return np.int64(_load_u8(address))


@jit_inline
def load_u64(address: Int) -> np.uint64:
    """The 8 bytes at `address` as a native-endian (little-endian on x86-64 and arm64)
    uint64."""
    return np.uint64(_load_u64(address))


@jit_inline
def store_u8(address: Int, value: Int) -> None:
    """Write the low byte of `value` at `address`."""
    _store_u8(address, value)


@jit_inline
def copy_bytes(to: Int, at: Int, n: Int) -> None:
    """Copy the `n` bytes at address `at` to address `to` (the two ranges do not overlap;
    nothing is copied when `n` is 0 or less)."""
    if n > 0:
        _copy(to, at, n)


@jit_inline
def bytes_address(buf: NDArray[Any]) -> int:
    """The address of the 1-D byte array `buf` (``buf.ctypes.data``), taken once by a
    kernel whose helpers read or write it at addresses: its bytes must be adjacent (one
    byte an element, stride 1), or the helpers would read and write the bytes between
    its elements. Checked here, once a kernel call: an array of another layout is
    refused (ValueError), not misread."""
    if buf.itemsize != 1 or (buf.shape[0] > 1 and buf.strides[0] != 1):
        raise ValueError(
            "a kernel reads and writes this array at addresses: its bytes must be adjacent"
        )
    return buf.ctypes.data


# Big-endian fields (Kafka's byte order) at byte `p` of the bytes at address `at`.


@jit
def be_i64(at: Int, p: Int) -> Int:
    u = np.uint64(0)
    for i in range(8):
        u = (u << np.uint64(8)) | np.uint64(load_u8(at + p + i))
    return np.int64(u)


@jit
def be_i32(at: Int, p: Int) -> Int:
    u = (load_u8(at + p) << 24) | (load_u8(at + p + 1) << 16)
    u |= (load_u8(at + p + 2) << 8) | load_u8(at + p + 3)
    return u - (np.int64(1) << 32) if u >= (np.int64(1) << 31) else u


@jit
def be_u32(at: Int, p: Int) -> Int:
    u = (load_u8(at + p) << 24) | (load_u8(at + p + 1) << 16)
    return u | (load_u8(at + p + 2) << 8) | load_u8(at + p + 3)


@jit
def be_i16(at: Int, p: Int) -> Int:
    u = (load_u8(at + p) << 8) | load_u8(at + p + 1)
    return u - 65536 if u >= 32768 else u
