"""Tests of cleanerd.records.address: loads at an address read what the array holds,
stores and copies write there and nowhere else."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numpy.typing import NDArray

from cleanerd._jit import jit
from cleanerd.records.address import bytes_address, copy_bytes, load_u8, load_u64, store_u8


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


@jit
def _store_at(out: NDArray[np.uint8], p: int, value: int) -> None:
    store_u8(out.ctypes.data + p, value)


@jit
def _copy_at(src: NDArray[np.uint8], s: int, out: NDArray[np.uint8], d: int, n: int) -> None:
    copy_bytes(out.ctypes.data + d, src.ctypes.data + s, n)


@jit
def _nibble_or_none(at: int, present: bool) -> int:
    """The high nibble of the byte at `at`, or -1: two branches whose types numba
    unifies, as a decoder's `(length, position)` or `(-1, position)` are."""
    if present:
        return int(load_u8(at) >> 4)
    return -1


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


def test_load_u8_is_an_int64() -> None:
    """A byte loaded unsigned and shifted is a uint64, which numba unifies with an int64
    as a float: the value of a branch would be a float (and an address computed from
    one could not be used)."""
    buf = np.array([0x34], np.uint8)
    result = _nibble_or_none(buf.ctypes.data, True)
    assert type(result) is int
    assert result == 3
    assert _nibble_or_none(buf.ctypes.data, False) == -1


@given(st.binary(min_size=1, max_size=64), st.data())
def test_store_u8_writes_the_low_byte_at_its_position_only(
    data: bytes, draw: st.DataObject
) -> None:
    out = np.frombuffer(bytearray(data), np.uint8)
    p = draw.draw(st.integers(0, len(data) - 1))
    value = draw.draw(st.integers(-(2**63), 2**63 - 1))
    _store_at(out, p, value)
    expected = bytearray(data)
    expected[p] = value & 0xFF
    assert out.tobytes() == bytes(expected)


@given(st.binary(max_size=200), st.binary(min_size=1, max_size=200), st.data())
def test_copy_bytes_copies_the_range_and_nothing_else(
    src: bytes, dst: bytes, draw: st.DataObject
) -> None:
    s = draw.draw(st.integers(0, len(src)))
    d = draw.draw(st.integers(0, len(dst)))
    n = draw.draw(st.integers(-3, min(len(src) - s, len(dst) - d)))
    out = np.frombuffer(bytearray(dst), np.uint8)
    _copy_at(np.frombuffer(src, np.uint8), s, out, d, n)
    expected = bytearray(dst)
    if n > 0:
        expected[d : d + n] = src[s : s + n]
    assert out.tobytes() == bytes(expected)


@jit
def _address(buf: NDArray[Any]) -> int:
    return bytes_address(buf)


def test_bytes_address_is_the_arrays_address_when_its_bytes_are_adjacent() -> None:
    buf = np.arange(16, dtype=np.uint8)
    assert _address(buf) == buf.ctypes.data
    assert _address(buf[3:9]) == buf.ctypes.data + 3
    assert _address(buf[::2][:1]) == buf.ctypes.data  # one element: nothing between


@pytest.mark.parametrize(
    "array",
    [np.arange(16, dtype=np.uint8)[::2], np.arange(8, dtype=np.uint16)],
    ids=["strided", "wider elements"],
)
def test_bytes_address_refuses_an_array_whose_bytes_are_not_adjacent(
    array: NDArray[np.generic],
) -> None:
    """A helper reading it at its address would read the bytes between its elements (or
    each element's bytes as elements)."""
    with pytest.raises(ValueError, match="bytes must be adjacent"):
        _address(array)
