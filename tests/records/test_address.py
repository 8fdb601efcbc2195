"""Tests of cleanerd.records.address: loads at an address read what the array holds."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from numpy.typing import NDArray

from cleanerd._jit import jit
from cleanerd.records.address import load_u8, load_u64


@jit
def _bytes_at(buf: NDArray[np.uint8], out: NDArray[np.int64]) -> None:
    at = buf.ctypes.data
    for i in range(buf.shape[0]):
        out[i] = load_u8(at + i)


@jit
def _words_at(buf: NDArray[np.uint8], out: NDArray[np.uint64]) -> None:
    """The 8 bytes at every position that has 8 (most of them unaligned)."""
    at = buf.ctypes.data
    for i in range(buf.shape[0] - 7):
        out[i] = load_u64(at + i)


@given(st.binary(min_size=0, max_size=300))
def test_load_u8_reads_each_byte(data: bytes) -> None:
    buf = np.frombuffer(data, dtype=np.uint8)
    out = np.zeros(len(data), np.int64)
    _bytes_at(buf, out)
    assert out.tolist() == list(data)


@given(st.binary(min_size=8, max_size=300))
def test_load_u64_reads_little_endian_words_at_any_alignment(data: bytes) -> None:
    buf = np.frombuffer(data, dtype=np.uint8)
    out = np.zeros(len(data) - 7, np.uint64)
    _words_at(buf, out)
    assert [int(w) for w in out] == [
        int.from_bytes(data[i : i + 8], "little") for i in range(len(data) - 7)
    ]
