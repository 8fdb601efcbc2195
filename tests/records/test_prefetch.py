"""Tests of cleanerd.records.prefetch: a hint at any position, clamped into the buffer."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from cleanerd._jit import jit
from cleanerd.records.prefetch import AHEAD, prefetch


@jit
def _hop(buf: NDArray[np.uint8], step: int) -> int:
    """Sum every `step`-th byte, prefetching ahead of each, as a batch walk does."""
    total = 0
    p = 0
    at = buf.ctypes.data
    while p < buf.shape[0]:
        prefetch(at, p, buf.shape[0])
        total += buf[p]
        p += step
    prefetch(at, 0, 0)  # an empty span: no hint, no fault
    return total


def test_prefetch_changes_no_result_at_any_size() -> None:
    rng = np.random.default_rng(7)
    for size in (0, 1, AHEAD - 1, AHEAD, AHEAD + 1, 5 * AHEAD + 3):
        buf = rng.integers(0, 256, size, dtype=np.uint8)
        for step in (1, 61, 4097):
            assert _hop(buf, step) == int(buf[::step].sum())
