"""Tests for the 128-bit key hash (MurmurHash3 x64_128)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.compaction.keyhash import (
    ZERO_KEY_HASH,
    hash_key,
    hash_keys,
    hash_record_keys,
    murmur3_x64_128,
)

MASK = (1 << 64) - 1


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & MASK


def _fmix(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & MASK
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & MASK
    return k ^ (k >> 33)


def reference_murmur3(data: bytes, seed: int = 0) -> tuple[int, int]:
    """A plain-Python MurmurHash3 x64_128, written for these tests."""
    c1, c2 = 0x87C37B91114253D5, 0x4CF5AD432745937F
    h1 = h2 = seed
    full = len(data) - len(data) % 16
    for i in range(0, full, 16):
        k1, k2 = struct.unpack_from("<QQ", data, i)
        h1 ^= (_rotl((k1 * c1) & MASK, 31) * c2) & MASK
        h1 = (((_rotl(h1, 27) + h2) & MASK) * 5 + 0x52DCE729) & MASK
        h2 ^= (_rotl((k2 * c2) & MASK, 33) * c1) & MASK
        h2 = (((_rotl(h2, 31) + h1) & MASK) * 5 + 0x38495AB5) & MASK
    tail = data[full:] + bytes(16 - len(data) % 16)
    k1, k2 = struct.unpack("<QQ", tail)
    if len(data) % 16 > 8:
        h2 ^= (_rotl((k2 * c2) & MASK, 33) * c1) & MASK
    if len(data) % 16:
        h1 ^= (_rotl((k1 * c1) & MASK, 31) * c2) & MASK
    h1 ^= len(data)
    h2 ^= len(data)
    h1 = (h1 + h2) & MASK
    h2 = (h2 + h1) & MASK
    h1, h2 = _fmix(h1), _fmix(h2)
    h1 = (h1 + h2) & MASK
    h2 = (h2 + h1) & MASK
    return h1, h2


def _lanes(data: bytes, seed: int) -> tuple[int, int]:
    buf = np.frombuffer(data, dtype=np.uint8)
    h1, h2 = murmur3_x64_128(buf.ctypes.data, 0, len(data), seed)
    return int(h1), int(h2)


def _as_uint32_words_hex(h1: int, h2: int) -> str:
    """The lanes printed as the smhasher-derived test suites do: four native uint32s."""
    return "".join(f"{w:08x}" for w in struct.unpack("<4I", struct.pack("<QQ", h1, h2)))


@pytest.mark.parametrize(
    ("seed", "data", "expected"),
    [
        (123, b"Hello, world!", "8743acad421c8c73d373c3f5f19732fd"),
        (321, b"Hello, world!", "f86d4004ca47f42bb9546c7979200aee"),
        (123, b"x" * 28, "becf7e04dbcf74637751664ef66e73e0"),
        (123, b"", "4cd9597081679d1abd92f8784bace33d"),
    ],
)
def test_published_vectors(seed: int, data: bytes, expected: str) -> None:
    """The kernel reproduces the published MurmurHash3 x64_128 test vectors."""
    assert _as_uint32_words_hex(*_lanes(data, seed)) == expected


def test_seed_zero_digest_bytes() -> None:
    """With seed 0, the digest bytes (h1, h2 little-endian) match the published value."""
    h1, h2 = _lanes(b"Hello world", 0)
    assert struct.pack("<QQ", h1, h2).hex() == "09c01ad2296d65bdb32ceb54cdb5b54a"
    assert hash_key(b"Hello world") == (h1, h2)


def test_empty_key_never_hashes_to_zero() -> None:
    """The empty key's raw hash is all zero, so it is replaced by ZERO_KEY_HASH."""
    assert _lanes(b"", 0) == (0, 0)
    assert hash_key(b"") == ZERO_KEY_HASH
    rows = hash_keys(np.zeros(4, np.uint8), np.array([0, 4]), np.array([0, 0]))
    assert rows.tolist() == [list(ZERO_KEY_HASH)] * 2


@settings(deadline=None, max_examples=200)
@given(st.lists(st.binary(max_size=70), max_size=20), st.binary(max_size=5))
def test_matches_reference(keys: list[bytes], prefix: bytes) -> None:
    """Every key hashed in place inside a shared buffer equals the reference hash."""
    buf = prefix + b"".join(keys)
    lens = np.array([len(k) for k in keys], dtype=np.int32)
    pos = len(prefix) + np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    rows = hash_keys(np.frombuffer(buf, np.uint8), pos[: len(keys)], lens)
    assert rows.shape == (len(keys), 2)
    assert rows.dtype == np.uint64
    for key, row in zip(keys, rows.tolist(), strict=True):
        expected = reference_murmur3(key) if key else ZERO_KEY_HASH
        assert tuple(row) == expected
        assert hash_key(key) == expected


def test_distinct_keys_never_collide() -> None:
    """200,000 distinct keys of a dense key space have 200,000 distinct hashes."""
    n = 200_000
    buf = np.arange(n, dtype=">u8").view(np.uint8)
    rows = hash_keys(buf, np.arange(n) * 8, np.full(n, 8))
    assert np.unique(rows, axis=0).shape[0] == n
    assert not ((rows[:, 0] == 0) & (rows[:, 1] == 0)).any()


@pytest.mark.parametrize(
    ("pos", "length"),
    [(0, -1), (-1, 2), (3, 2), (0, 5), (5, 1)],
    ids=["null-key", "negative-position", "past-end", "too-long", "start-at-end"],
)
def test_refuses_null_and_out_of_bounds_keys(pos: int, length: int) -> None:
    """A null key or a key outside the buffer is refused, naming its index and position."""
    buf = np.zeros(4, np.uint8)
    with pytest.raises(ValueError, match=f"key 1 at position {pos}"):
        hash_keys(buf, np.array([0, pos]), np.array([1, length]))


def test_refuses_mismatched_columns() -> None:
    """key_pos and key_len must have one entry per key."""
    with pytest.raises(ValueError, match="key_pos has 2 entries but key_len has 1"):
        hash_keys(np.zeros(4, np.uint8), np.array([0, 1]), np.array([1]))


@settings(deadline=None, max_examples=50)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=40)), min_size=1, max_size=30))
def test_hash_record_keys_matches_hash_keys_and_marks_null_keys(keys: list[bytes | None]) -> None:
    """Every record's key gets hash_keys' row (strided columns are fine); a null key gets
    (0, 0), which no key hashes to."""
    buf = np.frombuffer(b"".join(k or b"" for k in keys) + b"\0", dtype=np.uint8)
    rows = np.zeros(len(keys), dtype=[("pos", "<i8"), ("len", "<i4"), ("pad", "<i4")])
    pos = 0
    for i, key in enumerate(keys):
        rows[i] = (pos, -1 if key is None else len(key), 0)
        pos += len(key or b"")
    got = hash_record_keys(buf, rows["pos"], rows["len"])
    for i, key in enumerate(keys):
        want = (0, 0) if key is None else hash_key(key)
        assert (int(got[i, 0]), int(got[i, 1])) == want


def test_hash_record_keys_refuses_a_key_outside_the_buffer() -> None:
    """A key span past the end of the buffer is a ValueError naming the row."""
    buf = np.zeros(8, dtype=np.uint8)
    with pytest.raises(ValueError, match="key 1 at position 4 with length 5"):
        hash_record_keys(buf, np.array([0, 4], dtype=np.int64), np.array([2, 5], dtype=np.int32))
