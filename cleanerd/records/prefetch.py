"""A cache-line prefetch for kernels that hop from batch to batch (or record to record).

A walk over a segment's batches is a chain of dependent loads: where the next batch
starts is read from the one before. On small batches the CPU's own prefetchers do not
keep up with hops of varying length, so each hop waited for memory: 50 ns a batch for
the lengths alone of 1,000,000 1-record batches (174 bytes each), page-cached or not.
Asking for the line `AHEAD` bytes on, at each hop, overlaps those waits: 20 ns a batch.
The hint is LLVM's `llvm.prefetch` (a read, kept in every cache level), which never
faults, so a kernel passes any position inside its buffer (`prefetch` clamps it there).
It takes the buffer's address (``array.ctypes.data``), not the array: see `address.py`.

The intrinsic is declared when numba is first imported (`_jit.on_numba_load`), as
`address.py`'s are, so a command that runs no kernel does not import numba.
"""

from __future__ import annotations

from typing import Any, Final

from cleanerd._jit import jit_inline, on_numba_load
from cleanerd.records.address import Int

AHEAD: Final = 4096
"""Bytes ahead of the current position to prefetch (measured best of 512 to 4096 on
1-record batches; the same on 100-record ones)."""


def _prefetch_typer(typingctx: Any, address: Any) -> tuple[Any, Any] | None:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils

    if not isinstance(address, types.Integer):
        return None
    sig = types.void(address)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        byte_ptr = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32])
        fn = cgutils.get_or_insert_function(  # type: ignore[no-untyped-call]
            builder.module, fnty, "llvm.prefetch.p0i8"
        )
        # rw = 0 (read), locality = 3 (keep in all levels), cache type = 1 (data)
        builder.call(fn, [builder.inttoptr(args[0], byte_ptr), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


_prefetch_at: Any = None
"""llvm.prefetch(address) (jit code only)."""


def _declare() -> None:
    global _prefetch_at
    from numba.extending import intrinsic

    _prefetch_at = intrinsic(_prefetch_typer)


on_numba_load(_declare)


@jit_inline
def prefetch(at: Int, p: Int, end: Int) -> None:
    """Hint that byte `p + AHEAD` (or byte `end - 1`, if that is nearer) of the bytes at
    address `at` is read soon."""
    ahead = p + AHEAD
    if ahead >= end:
        ahead = end - 1
    if ahead >= 0:
        _prefetch_at(at + ahead)


@jit_inline
def prefetch_line(address: Int) -> None:
    """Hint that the byte at `address` is read soon (for a lookup whose place is known
    ahead of it, as an offset map's home slot is from the key's hash)."""
    _prefetch_at(address)
