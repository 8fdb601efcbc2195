"""The 128-bit key hash that identifies a record key in the offset map.

Kafka's SkimpyOffsetMap keys its slots by the 16-byte MD5 of the record key and compares
keys by hash only. cleanerd does the same with MurmurHash3 x64_128 (seed 0), written here
from Austin Appleby's published description: the key is read as little-endian 64-bit
words in 16-byte blocks, each block mixed into two 64-bit lanes (h1, h2), the 1-15 tail
bytes mixed in the same way with zero padding, then the length is folded in and both
lanes pass through the 64-bit finaliser ``fmix64``. A hash is the pair ``(h1, h2)``, which
the offset map stores as ``(hash_hi, hash_lo)``. For keys not chosen to collide, n
distinct keys of one cleaning round collide with probability about n^2 / 2^129, as with
Kafka's MD5, at a fraction of MD5's cost. Murmur3 is not cryptographic: a producer that
chooses keys can craft two with one hash (seed-independent Murmur3 collisions are
published; MD5 collisions can be crafted too), and compaction would then treat one key's
record as superseding the other's. Kafka carries the same exposure.

The all-zero pair is the offset map's empty-slot marker, and the empty key with seed 0
hashes to exactly that (every lane starts at the seed and no input bit is mixed in). Such a
result is replaced by ``ZERO_KEY_HASH`` = (0, 1). The replacement merges the empty key
with any key whose true hash is (0, 1), a 2^-128 event per key, the same order as any
other collision.

Null keys (length -1) have no hash: keyless records never enter the map, so the caller
filters them out; a negative length here is a caller bug and is refused.
"""

from __future__ import annotations

from typing import Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from cleanerd._jit import jit, jit_inline
from cleanerd.records.address import bytes_address, load_u8
from cleanerd.records.header import INT32_MAX

ZERO_KEY_HASH: Final = (0, 1)
"""What a key whose Murmur3 hash is all zero (the empty key) hashes to instead."""

_C1: Final = np.uint64(0x87C37B91114253D5)
_C2: Final = np.uint64(0x4CF5AD432745937F)
_FMIX1: Final = np.uint64(0xFF51AFD7ED558CCD)
_FMIX2: Final = np.uint64(0xC4CEB9FE1A85EC53)
_ADD1: Final = np.uint64(0x52DCE729)
_ADD2: Final = np.uint64(0x38495AB5)
_FIVE: Final = np.uint64(5)
_MAX_LEN: Final = INT32_MAX  # a Kafka record key length is an int32


@jit_inline
def _rotl(x: np.uint64, r: int) -> np.uint64:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


@jit_inline
def _fmix64(k: np.uint64) -> np.uint64:
    k ^= k >> np.uint64(33)
    k *= _FMIX1
    k ^= k >> np.uint64(33)
    k *= _FMIX2
    k ^= k >> np.uint64(33)
    return k


@jit_inline
def _word8(at: int, pos: int) -> np.uint64:
    """The 8 bytes at `pos` of the bytes at address `at` as a little-endian integer.
    Written out byte by byte so the compiler merges them into one unaligned load."""
    return (
        np.uint64(load_u8(at + pos))
        | (np.uint64(load_u8(at + pos + 1)) << np.uint64(8))
        | (np.uint64(load_u8(at + pos + 2)) << np.uint64(16))
        | (np.uint64(load_u8(at + pos + 3)) << np.uint64(24))
        | (np.uint64(load_u8(at + pos + 4)) << np.uint64(32))
        | (np.uint64(load_u8(at + pos + 5)) << np.uint64(40))
        | (np.uint64(load_u8(at + pos + 6)) << np.uint64(48))
        | (np.uint64(load_u8(at + pos + 7)) << np.uint64(56))
    )


@jit_inline
def _word_le(at: int, pos: int, count: int) -> np.uint64:
    """The `count` (1-8) bytes at `pos` of the bytes at address `at` as a little-endian
    integer, zero padded."""
    w = np.uint64(0)
    for i in range(count):
        w |= np.uint64(load_u8(at + pos + i)) << np.uint64(8 * i)
    return w


@jit_inline
def _mix_k1(k1: np.uint64) -> np.uint64:
    k1 *= _C1
    k1 = _rotl(k1, 31)
    k1 *= _C2
    return k1


@jit_inline
def _mix_k2(k2: np.uint64) -> np.uint64:
    k2 *= _C2
    k2 = _rotl(k2, 33)
    k2 *= _C1
    return k2


@jit_inline
def murmur3_x64_128(at: int, pos: int, length: int, seed: int) -> tuple[np.uint64, np.uint64]:
    """MurmurHash3 x64_128 of the `length` bytes at `pos` of the bytes at address `at`
    (``array.ctypes.data``: `cleanerd.records.address`): the lanes (h1, h2), unmodified."""
    h1 = np.uint64(seed)
    h2 = np.uint64(seed)
    nblocks = length >> 4  # length >= 0
    for b in range(nblocks):
        p = pos + 16 * b
        h1 ^= _mix_k1(_word8(at, p))
        h1 = _rotl(h1, 27)
        h1 += h2
        h1 = h1 * _FIVE + _ADD1
        h2 ^= _mix_k2(_word8(at, p + 8))
        h2 = _rotl(h2, 31)
        h2 += h1
        h2 = h2 * _FIVE + _ADD2
    tail = pos + 16 * nblocks
    rest = length - 16 * nblocks
    if rest > 8:
        h2 ^= _mix_k2(_word_le(at, tail + 8, rest - 8))
        h1 ^= _mix_k1(_word8(at, tail))
    elif rest > 0:
        h1 ^= _mix_k1(_word_le(at, tail, rest))
    h1 ^= np.uint64(length)
    h2 ^= np.uint64(length)
    h1 += h2
    h2 += h1
    h1 = _fmix64(h1)
    h2 = _fmix64(h2)
    h1 += h2
    h2 += h1
    return h1, h2


@jit_inline
def _key_hash(at: int, pos: int, length: int) -> tuple[np.uint64, np.uint64]:
    """The map's hash of one key: Murmur3 with the all-zero result replaced. Inlined,
    with Murmur3 and its steps, into the kernels that hash keys (`jit_inline`): as calls
    they took more time than the hash itself (33 ns a 12-byte key, against 15)."""
    h1, h2 = murmur3_x64_128(at, pos, length, 0)
    return h1, h2 if h1 != 0 or h2 != 0 else np.uint64(1)


@jit
def _hash_keys_kernel(
    buf: NDArray[np.uint8], key_pos: NDArray[np.int64], key_len: NDArray[np.int64]
) -> NDArray[np.uint64]:
    n = key_pos.shape[0]
    out = np.empty((n, 2), dtype=np.uint64)
    at = bytes_address(buf)
    for i in range(n):
        out[i, 0], out[i, 1] = _key_hash(at, key_pos[i], key_len[i])
    return out


@jit
def _hash_record_keys_kernel(
    buf: NDArray[np.uint8],
    key_pos: NDArray[np.int64],
    key_len: NDArray[np.int32],
    out: NDArray[np.uint64],
) -> int:
    """Hash every record's key into `out`, (0, 0) for a null key; returns the first row
    whose key lies outside `buf`, or -1."""
    size = buf.shape[0]
    at = bytes_address(buf)
    for i in range(key_pos.shape[0]):
        length = key_len[i]
        if length < 0:
            out[i, 0] = 0
            out[i, 1] = 0
            continue
        pos = key_pos[i]
        if pos < 0 or pos > size - length:
            return i
        out[i, 0], out[i, 1] = _key_hash(at, pos, length)
    return -1


def hash_keys(
    buf: ArrayLike,
    key_pos: ArrayLike,
    key_len: ArrayLike,
) -> NDArray[np.uint64]:
    """Hash the keys ``buf[key_pos[i] : key_pos[i] + key_len[i]]``.

    Returns an (n, 2) uint64 array of (hash_hi, hash_lo) rows, never all zero. Raises
    ValueError if a key is null (negative length) or lies outside `buf`.
    """
    data = np.ascontiguousarray(buf, dtype=np.uint8).reshape(-1)
    pos = np.ascontiguousarray(key_pos, dtype=np.int64).reshape(-1)
    lens = np.ascontiguousarray(key_len, dtype=np.int64).reshape(-1)
    if pos.shape != lens.shape:
        raise ValueError(f"key_pos has {pos.size} entries but key_len has {lens.size}")
    _check_spans(data.size, pos, lens)
    return _hash_keys_kernel(data, pos, lens)


def hash_record_keys(
    buf: NDArray[np.uint8], key_pos: NDArray[np.int64], key_len: NDArray[np.int32]
) -> NDArray[np.uint64]:
    """Hash the key of every record of a decoded segment (`key_pos`, `key_len` as the
    record columns hold them, strided views are fine): an (n, 2) array whose rows are
    `hash_keys`' rows, and (0, 0), the empty-slot marker no key hashes to, for a null
    key (length -1). One pass, no copies of the columns: the cleaner hashes whole
    segments this way. Raises ValueError if a key lies outside `buf`."""
    out = np.empty((key_pos.shape[0], 2), dtype=np.uint64)
    buf = np.ascontiguousarray(buf)  # read at its address: no copy when contiguous
    bad = int(_hash_record_keys_kernel(buf, key_pos, key_len, out))
    if bad >= 0:
        raise ValueError(
            f"key {bad} at position {int(key_pos[bad])} with length {int(key_len[bad])} is "
            f"outside the {buf.shape[0]}-byte buffer"
        )
    return out


def _check_spans(size: int, pos: NDArray[np.int64], lens: NDArray[np.int64]) -> None:
    bad = (lens < 0) | (lens > _MAX_LEN) | (pos < 0) | (pos > size - lens)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"key {i} at position {int(pos[i])} with length {int(lens[i])} is null or "
            f"outside the {size}-byte buffer"
        )


def hash_key(key: bytes) -> tuple[int, int]:
    """The (hash_hi, hash_lo) of one key, equal to its row in `hash_keys`."""
    data = np.frombuffer(key, dtype=np.uint8)
    row = hash_keys(data, np.zeros(1, np.int64), np.array([len(key)], np.int64))[0]
    return int(row[0]), int(row[1])
