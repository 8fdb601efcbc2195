"""A cache-line prefetch for kernels that hop from batch to batch (or record to record).

A walk over a segment's batches is a chain of dependent loads: where the next batch
starts is read from the one before. On small batches the CPU's own prefetchers do not
keep up with hops of varying length, so each hop waited for memory: 50 ns a batch for
the lengths alone of 1,000,000 1-record batches (174 bytes each), page-cached or not.
Asking for the line `AHEAD` bytes on, at each hop, overlaps those waits: 20 ns a batch.
The hint is LLVM's `llvm.prefetch` (a read, kept in every cache level), which never
faults, so a kernel passes any position inside its buffer (`prefetch` clamps it there).

The intrinsic is declared when numba is first imported (`_jit.on_numba_load`), as
`assemble.py`'s memcpy is, so a command that runs no kernel does not import numba.
"""

from __future__ import annotations

from typing import Any, Final, TypeAlias

import numpy as np
from numpy.typing import NDArray

from cleanerd._jit import jit_inline, on_numba_load

Int: TypeAlias = int | np.signedinteger[Any]

AHEAD: Final = 4096
"""Bytes ahead of the current position to prefetch (measured best of 512 to 4096 on
1-record batches; the same on 100-record ones)."""


def _prefetch_typer(typingctx: Any, buf: Any, at: Any) -> tuple[Any, Any] | None:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils

    # Any 1-D array: the address assumes adjacent elements, which a strided view does
    # not have, but a hint to the wrong line costs nothing more than no hint.
    if not (isinstance(buf, types.Array) and buf.ndim == 1):
        return None
    sig = types.void(buf, at)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        buf_v, at_v = args
        data = context.make_array(signature.args[0])(context, builder, buf_v).data
        byte_ptr = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32])
        fn = cgutils.get_or_insert_function(  # type: ignore[no-untyped-call]
            builder.module, fnty, "llvm.prefetch.p0i8"
        )
        address = builder.bitcast(builder.gep(data, [at_v]), byte_ptr)
        # rw = 0 (read), locality = 3 (keep in all levels), cache type = 1 (data)
        builder.call(fn, [address, i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


_prefetch_at: Any = None
"""llvm.prefetch(&buf[at]) for a 1-D array (jit code only)."""


def _declare() -> None:
    global _prefetch_at
    from numba.extending import intrinsic

    _prefetch_at = intrinsic(_prefetch_typer)


on_numba_load(_declare)


@jit_inline
def prefetch(buf: NDArray[np.uint8], p: Int, end: Int) -> None:
    """Hint that `buf[p + AHEAD]` (or `buf[end - 1]`, if that is nearer) is read soon."""
    at = p + AHEAD
    if at >= end:
        at = end - 1
    if at >= 0:
        _prefetch_at(buf, at)
