"""OffsetMap: key hash -> (offset, version) in a fixed memory budget, like Kafka's
SkimpyOffsetMap.

Layout: one numpy structured array of ``slots = memory_bytes // entry_bytes`` entries::

    hash_hi  uint64   first lane of the key's 128-bit hash (keyhash.py)
    hash_lo  uint64   second lane
    offset   int64    the winning record's offset; top bit = "has a version"
    version  int64    the winning record's version (timestamp/header strategies only)

The offset strategy uses 24 bytes per entry (Kafka's MD5 + offset), the timestamp and
header strategies 32. Offsets are non-negative, so the sign bit of the stored offset is
free to say whether the record had a version: the version column costs 8 bytes, the flag
nothing. A slot is empty when both hash lanes are zero; `keyhash` never produces that
pair, and the map refuses it as input. Keys are compared by hash only.

Probing is linear: a key's home slot is the top 32 bits of ``hash_hi * 2^64/phi`` (mod
2^64) scaled to [0, slots) (`_home`), and the search walks forward, wrapping, to the
key's entry or the first empty slot. Linear probing touches neighbouring entries, so the
extra probes of a 0.9 load are mostly in cache lines already fetched; the kernels ask
for the home slot of the record `LOOKAHEAD` ahead, so that a map bigger than the CPU's
caches does not wait for memory at each record. Entries are never removed (only
`clear`), so a search may stop at the first empty slot. At most
``max_keys = floor(slots * load_factor)`` keys are held; a map with
``slots * load_factor <= 1`` is refused, as Kafka refuses to start such a cleaner.

Building the map follows Kafka: records of the dirty range go to `put_many` in offset
order, and **before every put**, also one for a key already present, the map is full if
``size >= max_keys``; the put stops there and reports how many records it took, so the
round ends at the last record put (`latest_offset`). The offset strategy overwrites (the
newest offset wins). The timestamp and header strategies keep the record that beats the
stored one: a record with a version beats one without; a higher version beats a lower;
equal versions, or neither with a version, go to the higher offset.

With those strategies an older record can beat a newer one, and so a record of the
*clean* section (before the dirty range, not mapped) can beat the dirty winner of its
key. Before copying, the cleaner therefore feeds the clean section's keyed records to
`update_existing_many`, which replaces an entry when the clean record beats it but never
inserts a key, so the map does not grow and `latest_offset` is unchanged. Then every
keyed record below `latest_offset` survives iff `keep_mask` says so: the offset strategy
keeps a record whose offset is >= its key's entry (Kafka); the version strategies keep
only the winner itself (offset equal to the entry). Keys not in the map are kept.
`put_many` can report the slot each record went to; `keep_slots` then answers
`keep_mask` for those records by reading their slots, without hashing or probing again
(the map build's own records are most of what the copy phase asks about), as long as
the round's slots have not grown since (`generation`: see `clear`).

Kernels are numba-compiled and release the GIL; a map is not safe for concurrent
mutation (Kafka gives each cleaner thread its own map).
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from cleanerd._jit import jit
from cleanerd.compaction.map_memory import (
    OFFSET_ENTRY_BYTES,
    VERSIONED_ENTRY_BYTES,
    map_slots,
    memory_per_thread,
    too_small,
)
from cleanerd.compaction.strategy import CompactionStrategy, is_versioned
from cleanerd.records.address import load_u64
from cleanerd.records.prefetch import prefetch_line

OFFSET_ENTRY: Final = np.dtype([("hash_hi", "<u8"), ("hash_lo", "<u8"), ("offset", "<i8")])
VERSIONED_ENTRY: Final = np.dtype(
    [("hash_hi", "<u8"), ("hash_lo", "<u8"), ("offset", "<i8"), ("version", "<i8")]
)
assert OFFSET_ENTRY.itemsize == OFFSET_ENTRY_BYTES
assert VERSIONED_ENTRY.itemsize == VERSIONED_ENTRY_BYTES
for _entry in (OFFSET_ENTRY, VERSIONED_ENTRY):  # `_entries`: hash_hi, then hash_lo
    assert _entry.fields is not None
    assert (_entry.fields["hash_hi"][1], _entry.fields["hash_lo"][1]) == (0, 8)

_HAS_VERSION: Final = np.int64(-(2**63))  # the sign bit of a stored offset
_OFFSET_BITS: Final = np.int64(2**63 - 1)
_EMPTY: Final = np.uint64(0)
_FIBONACCI: Final = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / the golden ratio, odd
_NO_VERSIONS: Final = np.zeros(0, dtype=np.int64)  # passed for the offset strategy
_NO_FLAGS: Final = np.zeros(0, dtype=np.bool_)
_NO_SLOTS: Final = np.zeros(0, dtype=np.int64)  # put_many without slot output


@jit
def _home(qh: np.uint64, slots: int) -> int:
    """The home slot of a key whose hash starts with `qh`: the top 32 bits of
    ``qh * 2^64/phi`` (mod 2^64: Fibonacci hashing, so that hashes differing only in low
    bits, as tests' do, still spread) scaled to [0, slots), always in that range. Two
    multiplies, where a modulo is a division. Slots beyond 2^32 (a map of more than 96
    GiB, which `for_config` never makes) would be reached only at steps of slots / 2^32.
    An int64, so that slot + 1 stays an integer."""
    mixed = (qh * _FIBONACCI) >> np.uint64(32)
    return int(np.int64((mixed * np.uint64(slots)) >> np.uint64(32)))


@jit
def _probe(at: int, stride: int, slots: int, qh: np.uint64, ql: np.uint64) -> int:
    """The slot holding the key (qh, ql), else the first empty slot on its path, else -1,
    in the `slots` entries of `stride` bytes at address `at` (`_entries`)."""
    slot = _home(qh, slots)
    for _ in range(slots):
        h = load_u64(at + slot * stride)
        lw = load_u64(at + slot * stride + 8)
        if (h == qh and lw == ql) or (h == _EMPTY and lw == _EMPTY):
            return slot
        slot += 1
        if slot == slots:
            slot = 0
    return -1


@jit
def _is_empty(at: int, stride: int, slot: int) -> bool:
    at += slot * stride
    return bool(load_u64(at) == _EMPTY and load_u64(at + 8) == _EMPTY)


LOOKAHEAD: Final = 16
"""Records ahead whose home slot a put or lookup asks the CPU for: a map bigger than the
CPU's caches would otherwise wait for memory at every record (300,000 keys: a put 16 ->
11 ns, a lookup 9.3 -> 8.2; 1,000 keys, which stay in the caches: 3.8 -> 3.5)."""


@jit
def _prefetch_home(at: int, stride: int, slots: int, qh: np.uint64) -> None:
    prefetch_line(at + _home(qh, slots) * stride)


@jit
def _entries(hi: NDArray[np.uint64]) -> tuple[int, int, int]:
    """(address, stride, slots) of the entries whose `hash_hi` column is `hi` (each
    entry's `hash_lo` follows its `hash_hi`), for `_probe` and `_is_empty`: helpers
    called per record read the entries at an address, not through the column arrays,
    which would cost them a reference count per call (`cleanerd.records.address`)."""
    return hi.ctypes.data, hi.strides[0], hi.shape[0]


@jit
def _beats(offset: int, version: int, has: bool, stored: int, stored_version: int) -> bool:
    """Whether a record (offset, version, has) beats the entry whose encoded offset is
    `stored`: KIP-280's order (version presence, then version, then offset)."""
    stored_has = stored < 0
    if has != stored_has:
        return has
    if has and version != stored_version:
        return version > stored_version
    return bool(offset > (stored & _OFFSET_BITS))


@jit
def _encode(offset: int, has: bool) -> np.int64:
    return np.int64(offset | _HAS_VERSION) if has else np.int64(offset)


@jit
def _put_kernel(
    hi: NDArray[np.uint64],
    lo: NDArray[np.uint64],
    off: NDArray[np.int64],
    ver: NDArray[np.int64],
    versioned: bool,
    size: int,
    max_keys: int,
    grow_at: int,
    hashes: NDArray[np.uint64],
    offsets: NDArray[np.int64],
    versions: NDArray[np.int64],
    has_version: NDArray[np.bool_],
    slots: NDArray[np.int64],
) -> tuple[int, int]:
    """Put records in order until the map is full, or until a new key would make it
    hold more than `grow_at` keys, writing each put record's slot to `slots` unless it
    is empty; returns (records put, new size)."""
    n = hashes.shape[0]
    record = slots.shape[0] > 0
    at, stride, capacity = _entries(hi)
    for j in range(n):
        if size >= max_keys:
            return j, size
        if j + LOOKAHEAD < n:
            _prefetch_home(at, stride, capacity, hashes[j + LOOKAHEAD, 0])
        # Never -1: the map is found full (above) while an empty slot is left.
        slot = _probe(at, stride, capacity, hashes[j, 0], hashes[j, 1])
        has = versioned and has_version[j]
        version = versions[j] if versioned else 0
        if _is_empty(at, stride, slot):
            if size >= grow_at:
                return j, size
            if record:
                slots[j] = slot
            hi[slot] = hashes[j, 0]
            lo[slot] = hashes[j, 1]
            size += 1
        else:
            if record:
                slots[j] = slot
            if versioned and not _beats(offsets[j], version, has, off[slot], ver[slot]):
                continue
        off[slot] = _encode(offsets[j], has)
        if versioned:
            ver[slot] = version
    return n, size


@jit
def _update_existing_kernel(
    hi: NDArray[np.uint64],
    lo: NDArray[np.uint64],
    off: NDArray[np.int64],
    ver: NDArray[np.int64],
    versioned: bool,
    hashes: NDArray[np.uint64],
    offsets: NDArray[np.int64],
    versions: NDArray[np.int64],
    has_version: NDArray[np.bool_],
) -> int:
    """Replace entries of keys already present that the records beat; returns how many."""
    replaced = 0
    at, stride, capacity = _entries(hi)
    for j in range(hashes.shape[0]):
        if j + LOOKAHEAD < hashes.shape[0]:
            _prefetch_home(at, stride, capacity, hashes[j + LOOKAHEAD, 0])
        slot = _probe(at, stride, capacity, hashes[j, 0], hashes[j, 1])
        if slot < 0 or _is_empty(at, stride, slot):
            continue
        has = versioned and has_version[j]
        version = versions[j] if versioned else 0
        if _beats(offsets[j], version, has, off[slot], ver[slot] if versioned else 0):
            off[slot] = _encode(offsets[j], has)
            if versioned:
                ver[slot] = version
            replaced += 1
    return replaced


@jit
def _rehash_kernel(
    hi: NDArray[np.uint64],
    lo: NDArray[np.uint64],
    off: NDArray[np.int64],
    ver: NDArray[np.int64],
    versioned: bool,
    khi: NDArray[np.uint64],
    klo: NDArray[np.uint64],
    koff: NDArray[np.int64],
    kver: NDArray[np.int64],
) -> None:
    """Put the entries (khi, klo, koff, kver), distinct keys, into empty slots."""
    at, stride, capacity = _entries(hi)
    for j in range(khi.shape[0]):
        if j + LOOKAHEAD < khi.shape[0]:
            _prefetch_home(at, stride, capacity, khi[j + LOOKAHEAD])
        slot = _probe(at, stride, capacity, khi[j], klo[j])
        hi[slot] = khi[j]
        lo[slot] = klo[j]
        off[slot] = koff[j]
        if versioned:
            ver[slot] = kver[j]


@jit
def _get_kernel(
    hi: NDArray[np.uint64],
    lo: NDArray[np.uint64],
    off: NDArray[np.int64],
    ver: NDArray[np.int64],
    versioned: bool,
    hashes: NDArray[np.uint64],
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.bool_]]:
    n = hashes.shape[0]
    offsets = np.full(n, -1, dtype=np.int64)
    versions = np.zeros(n, dtype=np.int64)
    has = np.zeros(n, dtype=np.bool_)
    at, stride, capacity = _entries(hi)
    for j in range(n):
        if j + LOOKAHEAD < hashes.shape[0]:
            _prefetch_home(at, stride, capacity, hashes[j + LOOKAHEAD, 0])
        slot = _probe(at, stride, capacity, hashes[j, 0], hashes[j, 1])
        if slot < 0 or _is_empty(at, stride, slot):
            continue
        stored = off[slot]
        offsets[j] = stored & _OFFSET_BITS
        if versioned and stored < 0:
            has[j] = True
            versions[j] = ver[slot]
    return offsets, versions, has


@jit
def _keep_kernel(
    hi: NDArray[np.uint64],
    lo: NDArray[np.uint64],
    off: NDArray[np.int64],
    versioned: bool,
    hashes: NDArray[np.uint64],
    offsets: NDArray[np.int64],
    keep: NDArray[np.bool_],
) -> None:
    # Outputs are allocated by the caller: a kernel that allocates makes numba import
    # its array module (about 35 ms) in every process that loads it.
    at, stride, capacity = _entries(hi)
    for j in range(hashes.shape[0]):
        if j + LOOKAHEAD < hashes.shape[0]:
            _prefetch_home(at, stride, capacity, hashes[j + LOOKAHEAD, 0])
        slot = _probe(at, stride, capacity, hashes[j, 0], hashes[j, 1])
        if slot < 0 or _is_empty(at, stride, slot):
            continue
        found = off[slot] & _OFFSET_BITS
        keep[j] = offsets[j] == found if versioned else offsets[j] >= found


@jit
def _keep_slots_kernel(
    off: NDArray[np.int64],
    slots: NDArray[np.int64],
    offsets: NDArray[np.int64],
    keep: NDArray[np.bool_],
) -> None:
    at, stride = off.ctypes.data, off.strides[0]
    for j in range(slots.shape[0]):
        if j + LOOKAHEAD < slots.shape[0]:
            prefetch_line(at + slots[j + LOOKAHEAD] * stride)
        keep[j] = (off[slots[j]] & _OFFSET_BITS) == offsets[j]


TRACKED_FRACTION: Final = 16
"""`clear` zeroes the filled slots one by one while they are at most 1/16 of the slots
in use."""

MIN_ACTIVE_SLOTS: Final = 1024
"""The fewest slots a round bounded by `clear(keys_at_most=...)` uses."""

FIRST_ACTIVE_SLOTS = 1 << 18
"""The slots a bounded round starts with (6 MiB of offset entries) when its bound is
more; it grows (`_grow`) as keys come, up to the bound. (Not final: `build-kernels`'
warm-up starts with a few, so that growth runs on its few keys.)"""
GROW_LOAD: Final = 0.5
"""A bounded round's share of its slots in use past which a new key grows them."""


def foretold_keys(keys: int, records: int, round_records: int) -> float:
    """The distinct keys a round of `round_records` records will hold, from the `keys`
    its first `records` held: as if each record drew its key uniformly from K keys,
    with K the number that makes `records` draws find `keys` distinct ones on average
    (``keys = K * (1 - exp(-records / K))``); the round's `round_records` draws then find
    ``K * (1 - exp(-round_records / K))``. Records that were all distinct so far foretell
    as many keys as the round has records. Keys drawn unevenly (a few hot ones) foretell
    fewer than will come, and the round grows again as they come: a map grown too little
    costs a rehash, one grown too much costs cache misses on every put. (Keys per
    record times records foretells a round of 3,000,000 records over 300,000 keys,
    whose first growth comes after 131,072 keys in about 172,000 records, as 2.3
    million keys: a map of 134 MB in place of 24, whose page faults and cache misses
    made that clean 12% slower.)"""
    if records <= 0 or keys >= records:
        return float(max(keys, round_records))
    if keys <= 0:  # records with no key yet: none foretold
        return 0.0
    ratio = keys / records  # = (1 - exp(-x)) / x for x = records / K, falling in x
    low, high = 0.0, 1.0 / ratio + 1.0  # (1 - exp(-x)) / x < 1 / x <= ratio at `high`
    for _ in range(64):
        x = (low + high) / 2
        if -math.expm1(-x) / x > ratio:
            low = x
        else:
            high = x
    universe = records / high
    return max(float(keys), -math.expm1(-round_records / universe) * universe)


class OffsetMap:
    """A fixed-size map from key hash to the winning record's offset (and version).

    Args:
        memory_bytes: the buffer for the entries; ``slots = memory_bytes // entry_bytes``.
        load_factor: the share of slots that may fill, in (0, 1].
        strategy: the compaction strategy; timestamp and header add a version column.
    """

    def __init__(
        self,
        memory_bytes: int,
        *,
        load_factor: float = 0.9,
        strategy: CompactionStrategy = CompactionStrategy.OFFSET,
    ) -> None:
        if not 0.0 < load_factor <= 1.0:
            raise ValueError(f"load factor {load_factor} is not in (0, 1]")
        self.strategy = strategy
        self.versioned = is_versioned(strategy)
        dtype = VERSIONED_ENTRY if self.versioned else OFFSET_ENTRY
        self.slots = map_slots(memory_bytes, dtype.itemsize)
        why = too_small(memory_bytes, dtype.itemsize, load_factor)
        if why is not None:
            raise ValueError(why)
        self.load_factor = load_factor
        self.max_keys = int(self.slots * load_factor)
        self._table = np.zeros(self.slots, dtype=dtype)
        self._active = self.slots  # the first slots, the round's (see `clear`)
        self._bound = self.slots  # the most slots the round may grow to
        self._round_records = 0  # the records the round may put (`clear`'s bound)
        self._records_seen = 0  # the records offered to `put_many` in the round so far
        self.generation = 0
        """Counts the times a round's slots grew: slots `put_many` reported before a
        growth no longer hold their keys (see `keep_slots`)."""
        self._size = 0
        self._latest_offset = -1
        self._touched: list[NDArray[np.int64]] | None = []
        """The slots filled since the last clear, while few (None: too many to track)."""
        self._tracked = 0

    @classmethod
    def for_config(
        cls,
        dedupe_buffer_size: int,
        threads: int,
        load_factor: float,
        strategy: CompactionStrategy,
    ) -> OffsetMap:
        """One cleaner thread's map, of `memory_per_thread` bytes."""
        memory = memory_per_thread(dedupe_buffer_size, threads)
        return cls(memory, load_factor=load_factor, strategy=strategy)

    @property
    def entry_bytes(self) -> int:
        """Bytes per slot: 24 for the offset strategy, 32 with versions."""
        return int(self._table.dtype.itemsize)

    @property
    def bytes_per_key(self) -> int:
        """Map memory per key held, as Kafka counts it (the entry size); for metrics and
        the bench's 24-byte target."""
        return self.entry_bytes

    @property
    def memory_bytes(self) -> int:
        """Bytes the entries occupy."""
        return int(self._table.nbytes)

    @property
    def slots_in_use(self) -> int:
        """The slots this round probes: all of them, or fewer for a round whose keys
        `clear` was given a bound on (see `clear`)."""
        return self._active

    @property
    def size(self) -> int:
        """Keys held."""
        return self._size

    @property
    def latest_offset(self) -> int:
        """The offset up to which the map covers the log, -1 when nothing was put."""
        return self._latest_offset

    @property
    def utilization(self) -> float:
        """size / slots (Kafka's buffer utilisation; at most the load factor)."""
        return self._size / self.slots

    def update_latest_offset(self, offset: int) -> None:
        """Move `latest_offset` past records that were read but not put (a batch's or a
        segment's end, so offset gaps count as covered), as Kafka's map builder does."""
        self._latest_offset = offset

    def clear(self, *, keys_at_most: int | None = None) -> None:
        """Empty the map for the next round. Entries are only ever added by a put, so
        zeroing the slots the puts filled empties it: a pass over a small partition does
        not pay for zeroing the whole map (128 MiB by default) again.

        `keys_at_most` bounds the keys the round can put (its records: the offsets it
        spans). The round then probes at most the first twice that many slots (at least
        `MIN_ACTIVE_SLOTS`, at most all): a round over a small partition touches, and
        first faults in, a few pages of the map, not all of them, and its probes stay in
        the CPU's caches (a first clean of 1,000,000 records over 100,000 keys faulted
        in the whole 128 MiB map). It starts with `FIRST_ACTIVE_SLOTS` of those and
        grows them (`_grow`), rehashing, when a new key would fill more than
        `GROW_LOAD` of them: a round's records are mostly versions of fewer keys (that
        clean then faulted in 6 MiB instead of 48). Which keys fit, and when the map is
        full, do not change, since a round cannot put more keys than the bound; one
        that did anyway would find the map full, and end, before its slots in use ran
        out."""
        if self._size:
            if self._touched is None:
                self._table[: self._active].view(np.uint8)[:] = 0
            else:
                for filled in self._touched:
                    self._table[filled] = 0
        if keys_at_most is None:
            self._active = self._bound = self.slots
        else:
            self._bound = min(self.slots, max(MIN_ACTIVE_SLOTS, 2 * keys_at_most))
            self._active = min(self._bound, FIRST_ACTIVE_SLOTS)
        self._round_records, self._records_seen = keys_at_most or 0, 0
        self._size = 0
        self._latest_offset = -1
        self._touched, self._tracked = [], 0

    def _track(self, slots: NDArray[np.int64], count: int) -> None:
        """Remember the slots of `count` records just put, while they stay few."""
        if self._touched is None:
            return
        if slots.size < count or self._tracked + count > self._active // TRACKED_FRACTION:
            self._touched = None
            return
        self._touched.append(slots[:count].copy())
        self._tracked += count

    def put_many(
        self,
        hashes: ArrayLike,
        offsets: ArrayLike,
        versions: ArrayLike | None = None,
        has_version: ArrayLike | None = None,
        *,
        slots: NDArray[np.int64] | None = None,
    ) -> int:
        """Put records in offset order, stopping before the first one that finds the map
        full; return how many were put. `versions` and `has_version` (for version
        strategies) default to "no version" and "every record has one" respectively.
        `slots` (one int64 per record) receives each put record's slot, for
        `keep_slots`."""
        h, o = _records(hashes, offsets)
        v, has = self._versions(o.size, versions, has_version)
        if slots is None:
            if self._tracked + o.size > self._active // TRACKED_FRACTION:
                self._touched = None  # too many to zero one by one: `clear` zeroes all
            slots = np.empty(o.size, np.int64) if self._touched is not None else _NO_SLOTS
        elif slots.shape != o.shape or slots.dtype != np.int64:
            raise ValueError(f"slots must be {o.size} int64 entries")
        # Within a bounded round's slots, a put that would fill the last one finds the
        # map full instead, so every probe still meets an empty slot.
        bounded = self._bound < self.slots
        max_keys = min(self.max_keys, self._bound - 1) if bounded else self.max_keys
        count, n = 0, o.size
        while True:
            growing = self._active < self._bound
            grow_at = int(self._active * GROW_LOAD) if growing else max_keys
            put, self._size = _put_kernel(
                *self._columns(),
                self.versioned,
                self._size,
                max_keys,
                grow_at,
                h[count:],
                o[count:],
                v[count:] if self.versioned else v,
                has[count:] if self.versioned else has,
                slots[count:] if slots.size else slots,
            )
            count += int(put)
            self._records_seen += int(put)
            if count == n or not growing or self._size >= max_keys:
                break
            self._grow()
        self._track(slots, int(count))
        if count:
            self._latest_offset = int(o[count - 1])
        return int(count)

    def _grow(self) -> None:
        """Grow the round's slots (at most to its bound), every key moved to its home in
        the new slots; slots reported before no longer hold their keys. At least twice
        as many, and enough for the keys the round's records so far foretell
        (`foretold_keys`): a round of distinct keys grows once, straight to its bound,
        instead of doubling over and over, and one whose keys repeat grows to what they
        need, not to its bound."""
        old = self._table[: self._active]
        kept = old[(old["hash_hi"] != _EMPTY) | (old["hash_lo"] != _EMPTY)].copy()
        old.view(np.uint8)[:] = 0
        target = 2 * self._active
        if self._records_seen:
            keys = foretold_keys(self._size, self._records_seen, self._round_records)
            foretold = keys / GROW_LOAD
            target = max(target, 1 << math.ceil(math.log2(max(foretold, 1.0))))
        self._active = min(self._bound, target)
        self._touched = None  # too many to zero one by one: `clear` zeroes all
        self.generation += 1
        ver = kept["version"] if self.versioned else kept["offset"]
        _rehash_kernel(
            *self._columns(),
            self.versioned,
            np.ascontiguousarray(kept["hash_hi"]),
            np.ascontiguousarray(kept["hash_lo"]),
            np.ascontiguousarray(kept["offset"]),
            np.ascontiguousarray(ver),
        )

    def keep_slots(self, slots: NDArray[np.int64], offsets: NDArray[np.int64]) -> NDArray[np.bool_]:
        """`keep_mask` of records put since the last `clear` and the last growth (their
        `slots` from `put_many` at the same `generation`, and their `offsets`), without a
        lookup: a record's slot holds its key's entry, so it survives iff it is the
        entry's own record (for the offset strategy, where the newest offset wins, the
        same as offset >= the entry's)."""
        _, _, off, _ = self._columns()
        keep = np.empty(slots.shape[0], dtype=np.bool_)
        _keep_slots_kernel(off, slots, np.ascontiguousarray(offsets, dtype=np.int64), keep)
        return keep

    def update_existing_many(
        self,
        hashes: ArrayLike,
        offsets: ArrayLike,
        versions: ArrayLike | None = None,
        has_version: ArrayLike | None = None,
    ) -> int:
        """For records of the clean section: replace the entry of each key already in the
        map when the record beats it; never insert. Return how many entries changed."""
        h, o = _records(hashes, offsets)
        v, has = self._versions(o.size, versions, has_version)
        return int(_update_existing_kernel(*self._columns(), self.versioned, h, o, v, has))

    def get_many(
        self, hashes: ArrayLike
    ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.bool_]]:
        """(offsets, versions, has_version) of each key's entry; offset -1 when absent."""
        return _get_kernel(*self._columns(), self.versioned, _hashes(hashes))

    def keep_mask(self, hashes: ArrayLike, offsets: ArrayLike) -> NDArray[np.bool_]:
        """Whether each keyed data record at or below `latest_offset` survives: keys not
        in the map survive; the offset strategy keeps offsets >= the entry's, the version
        strategies keep only the entry's own record."""
        h, o = _records(hashes, offsets)
        hi, lo, off, _ = self._columns()
        keep = np.ones(o.size, dtype=np.bool_)
        _keep_kernel(hi, lo, off, self.versioned, h, o, keep)
        return keep

    def _columns(
        self,
    ) -> tuple[NDArray[np.uint64], NDArray[np.uint64], NDArray[np.int64], NDArray[np.int64]]:
        t = self._table[: self._active]
        # Without a version column the kernels never touch `ver`; passing the offset column
        # in its place keeps one compiled specialisation for both entry layouts.
        ver = t["version"] if self.versioned else t["offset"]
        return t["hash_hi"], t["hash_lo"], t["offset"], ver

    def _versions(
        self,
        n: int,
        versions: ArrayLike | None,
        has_version: ArrayLike | None,
    ) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
        if not self.versioned:
            return _NO_VERSIONS, _NO_FLAGS
        v = np.zeros(n, np.int64) if versions is None else np.ascontiguousarray(versions, np.int64)
        if has_version is None:
            has = np.full(n, versions is not None, dtype=np.bool_)
        else:
            has = np.ascontiguousarray(has_version, dtype=np.bool_)
        if v.shape != (n,) or has.shape != (n,):
            raise ValueError(f"versions and has_version must hold {n} entries")
        return v, has


@jit
def _first_empty_hash(hashes: NDArray[np.uint64]) -> int:
    """The first row that is the empty-slot marker, or -1 (one pass, no temporaries)."""
    for j in range(hashes.shape[0]):
        if hashes[j, 0] == _EMPTY and hashes[j, 1] == _EMPTY:
            return j
    return -1


@jit
def _first_negative(offsets: NDArray[np.int64]) -> int:
    for j in range(offsets.shape[0]):
        if offsets[j] < 0:
            return j
    return -1


def _hashes(hashes: ArrayLike) -> NDArray[np.uint64]:
    h = np.ascontiguousarray(hashes, dtype=np.uint64)
    if h.ndim != 2 or h.shape[1] != 2:
        raise ValueError(f"hashes must have shape (n, 2), got {h.shape}")
    empty = _first_empty_hash(h)
    if empty >= 0:
        raise ValueError(f"hash {empty} is all zero, the empty-slot marker")
    return h


def _records(hashes: ArrayLike, offsets: ArrayLike) -> tuple[NDArray[np.uint64], NDArray[np.int64]]:
    """Checked (hashes, offsets) columns of a run of records."""
    h = _hashes(hashes)
    o = np.ascontiguousarray(offsets, dtype=np.int64).reshape(-1)
    if h.shape[0] != o.shape[0]:
        raise ValueError(f"{h.shape[0]} hashes but {o.shape[0]} offsets")
    negative = _first_negative(o)
    if negative >= 0:
        raise ValueError(f"negative offset {int(o[negative])}")
    return h, o
