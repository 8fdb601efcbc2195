"""Tests for OffsetMap: capacity, Kafka's build rules, and the KIP-280 winner per key."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.compaction import offset_map as offset_map_module
from cleanerd.compaction.keyhash import hash_key, hash_keys
from cleanerd.compaction.offset_map import (
    MIN_ACTIVE_SLOTS,
    OffsetMap,
    foretold_keys,
)
from cleanerd.compaction.strategy import CompactionStrategy

OFFSET = CompactionStrategy.OFFSET
TIMESTAMP = CompactionStrategy.TIMESTAMP
HEADER = CompactionStrategy.HEADER


def keys(*names: str) -> np.ndarray:
    """The hashes of the given key names, as put_many takes them."""
    return np.array([hash_key(n.encode()) for n in names], dtype=np.uint64)


def key_range(n: int) -> np.ndarray:
    """Hashes of keys "k0" .. "k{n-1}"."""
    return keys(*(f"k{i}" for i in range(n)))


# -- capacity and sizing -------------------------------------------------------------------


def test_capacity_three_slots_holds_two_keys() -> None:
    """72 bytes are 3 offset-strategy slots; at load 0.9 they hold floor(2.7) = 2 keys."""
    offset_map = OffsetMap(72, load_factor=0.9)
    assert (offset_map.slots, offset_map.max_keys) == (3, 2)
    assert offset_map.entry_bytes == offset_map.bytes_per_key == 24
    assert offset_map.memory_bytes == 72


def test_kafka_default_buffer_sizes() -> None:
    """128 MiB gives Kafka's 5,592,405 slots and 5,033,164 keys; with versions, 32 B/slot."""
    offset_map = OffsetMap.for_config(128 * 1024 * 1024, 1, 0.9, OFFSET)
    assert (offset_map.slots, offset_map.max_keys) == (5_592_405, 5_033_164)
    versioned = OffsetMap.for_config(128 * 1024 * 1024, 2, 0.9, TIMESTAMP)
    assert versioned.entry_bytes == 32
    assert (versioned.slots, versioned.max_keys) == (2_097_152, 1_887_436)


@pytest.mark.parametrize(
    ("memory", "load_factor"), [(24, 0.9), (48, 0.5), (47, 1.0), (0, 0.9), (-5, 0.9)]
)
def test_refuses_a_map_that_cannot_hold_a_key(memory: int, load_factor: float) -> None:
    """Like Kafka, a map with slots * load_factor <= 1 is refused."""
    with pytest.raises(ValueError, match="too small"):
        OffsetMap(memory, load_factor=load_factor)


def test_smallest_accepted_map_holds_one_key() -> None:
    """2 slots at 0.9 (1.8 > 1) is accepted, as Kafka accepts it, and holds one key."""
    offset_map = OffsetMap(48, load_factor=0.9)
    assert offset_map.max_keys == 1
    assert offset_map.put_many(key_range(2), [0, 1]) == 1


@pytest.mark.parametrize("load_factor", [0.0, -0.5, 1.01])
def test_refuses_load_factor_outside_unit_interval(load_factor: float) -> None:
    """The load factor must be in (0, 1]."""
    with pytest.raises(ValueError, match="load factor"):
        OffsetMap(1024, load_factor=load_factor)


# -- building: Kafka's scenarios -------------------------------------------------------------


def test_partial_map_stops_when_full() -> None:
    """Scenario 39: capacity 2 keys, k2..k4 at 2..4 put: size 2, k0 and k4 absent, latest 3."""
    offset_map = OffsetMap(72, load_factor=0.9)
    hashes = key_range(5)
    assert offset_map.put_many(hashes[2:], [2, 3, 4]) == 2
    assert offset_map.size == 2
    assert offset_map.latest_offset == 3
    assert offset_map.get_many(hashes)[0].tolist() == [-1, -1, 2, 3, -1]


def test_full_check_precedes_every_put_even_for_present_keys() -> None:
    """A full map takes no further put, even one that would only overwrite a present key."""
    offset_map = OffsetMap(72, load_factor=0.9)
    hashes = keys("a", "b", "a")
    assert offset_map.put_many(hashes, [0, 1, 2]) == 2
    assert offset_map.get_many(hashes[:1])[0].tolist() == [0]
    assert offset_map.put_many(hashes[:1], [5]) == 0
    assert offset_map.latest_offset == 1


def test_map_with_large_offsets() -> None:
    """Scenario 38: offsets 0 and 7206178 give size 2 and latest offset 7206178."""
    offset_map = OffsetMap(1024)
    hashes = key_range(2)
    offset_map.put_many(hashes, [0, 7_206_178])
    assert (offset_map.size, offset_map.latest_offset) == (2, 7_206_178)
    assert offset_map.get_many(hashes)[0].tolist() == [0, 7_206_178]


@pytest.mark.parametrize(("start", "end"), [(0, 100), (100, 300), (300, 500)])
def test_map_of_a_range_holds_exactly_its_keys(start: int, end: int) -> None:
    """Scenario 35: the map of [start, end) of key=i at offset i holds exactly those keys."""
    hashes = key_range(500)
    offset_map = OffsetMap(1 << 16)
    assert offset_map.put_many(hashes[start:end], np.arange(start, end)) == end - start
    assert offset_map.latest_offset + 1 == end
    found = offset_map.get_many(hashes)[0]
    expected = np.where((np.arange(500) >= start) & (np.arange(500) < end), np.arange(500), -1)
    assert found.tolist() == expected.tolist()


def test_offset_strategy_put_overwrites() -> None:
    """With the offset strategy, each put of a key replaces its offset."""
    offset_map = OffsetMap(1024)
    hashes = keys("a", "b", "a", "a")
    offset_map.put_many(hashes, [0, 1, 2, 3])
    assert offset_map.size == 2
    offsets, versions, has = offset_map.get_many(keys("a", "b"))
    assert offsets.tolist() == [3, 1]
    assert not has.any()
    assert not versions.any()


def test_latest_offset_can_be_moved_past_unput_records() -> None:
    """update_latest_offset moves the map's end over offsets that were read but not put."""
    offset_map = OffsetMap(1024)
    offset_map.put_many(keys("a"), [4])
    offset_map.update_latest_offset(9)
    assert offset_map.latest_offset == 9


def test_clear_resets_everything() -> None:
    """clear empties the map: size 0, latest offset -1, every key absent, reusable."""
    offset_map = OffsetMap(72, load_factor=0.9)
    hashes = key_range(3)
    offset_map.put_many(hashes[:2], [0, 1])
    offset_map.clear()
    assert (offset_map.size, offset_map.latest_offset, offset_map.utilization) == (0, -1, 0.0)
    assert offset_map.get_many(hashes)[0].tolist() == [-1, -1, -1]
    assert offset_map.put_many(hashes[1:], [5, 6]) == 2


def test_utilization_is_size_over_slots() -> None:
    """utilization = size / slots."""
    offset_map = OffsetMap(24 * 10, load_factor=0.9)
    offset_map.put_many(key_range(4), [0, 1, 2, 3])
    assert offset_map.utilization == pytest.approx(0.4)


def test_full_table_lookup_of_absent_key_terminates() -> None:
    """At load factor 1 every slot can fill; a lookup of another key still ends, absent."""
    offset_map = OffsetMap(24 * 5, load_factor=1.0)
    assert offset_map.put_many(key_range(6), np.arange(6)) == 5
    assert offset_map.get_many(keys("absent"))[0].tolist() == [-1]
    assert offset_map.keep_mask(keys("absent"), [0]).tolist() == [True]


def test_hashes_differing_in_low_bits_only_spread_over_the_slots() -> None:
    """Home slots come from the top bits of a mixed hash: 1,000 keys whose hashes are
    1..1000 in both lanes (as tests and crafted keys have) start at many distinct slots
    spread over the whole map (not at slot 0, where the top bits alone would put them,
    nor in its first 1,000 slots, where their value would), and a put of them probes
    little."""
    offset_map = OffsetMap(24 * 4096)
    slots_in_map = offset_map.slots
    hashes = np.repeat(np.arange(1, 1001, dtype=np.uint64)[:, None], 2, axis=1)
    slots = np.empty(1000, dtype=np.int64)
    assert offset_map.put_many(hashes, np.arange(1000), slots=slots) == 1000
    homes = np.array([offset_map_module._home(np.uint64(h), slots_in_map) for h in range(1, 1001)])
    assert len(set(homes.tolist())) > 900
    assert np.count_nonzero(homes >= slots_in_map // 2) > 400
    assert np.mean((slots - homes) % slots_in_map) < 2  # linear probing from a spread start


@given(
    st.integers(min_value=0, max_value=2**64 - 1),
    st.integers(min_value=1, max_value=2**32 - 1),
)
def test_home_slot_is_in_range(qh: int, slots: int) -> None:
    assert 0 <= offset_map_module._home(np.uint64(qh), slots) < slots


def test_refuses_bad_input() -> None:
    """All-zero hashes, negative offsets, bad shapes and mismatched lengths are refused."""
    offset_map = OffsetMap(1024, strategy=HEADER)
    with pytest.raises(ValueError, match="all zero"):
        offset_map.put_many(np.array([[1, 2], [0, 0]], np.uint64), [0, 1])
    with pytest.raises(ValueError, match="negative offset -3"):
        offset_map.put_many(keys("a"), [-3])
    with pytest.raises(ValueError, match=r"shape \(n, 2\)"):
        offset_map.get_many(np.array([1, 2, 3], np.uint64))
    with pytest.raises(ValueError, match="2 hashes but 1 offsets"):
        offset_map.keep_mask(keys("a", "b"), [0])
    with pytest.raises(ValueError, match="must hold 2 entries"):
        offset_map.put_many(keys("a", "b"), [0, 1], [5])
    assert offset_map.size == 0


# -- versions and the clean section --------------------------------------------------------


def test_versioned_entry_round_trips_version_and_flag() -> None:
    """A versioned map returns each winner's offset, version and whether it had one."""
    offset_map = OffsetMap(1024, strategy=TIMESTAMP)
    offset_map.put_many(keys("a", "b"), [3, 4], [-7, 2**63 - 1], [True, False])
    offsets, versions, has = offset_map.get_many(keys("a", "b", "c"))
    assert offsets.tolist() == [3, 4, -1]
    assert versions.tolist() == [-7, 0, 0]
    assert has.tolist() == [True, False, False]


def test_versions_default_to_present_when_given() -> None:
    """Versions without has_version all count as present; no versions mean none."""
    offset_map = OffsetMap(1024, strategy=HEADER)
    offset_map.put_many(keys("a"), [0], [9])
    offset_map.put_many(keys("a"), [1])
    assert offset_map.get_many(keys("a"))[0].tolist() == [0]


def test_update_existing_never_grows_the_map() -> None:
    """Clean-section records of keys not in the map are not inserted."""
    offset_map = OffsetMap(72, load_factor=0.9, strategy=HEADER)
    offset_map.put_many(keys("a"), [10], [1])
    changed = offset_map.update_existing_many(keys("b", "c", "d"), [0, 1, 2], [5, 5, 5])
    assert changed == 0
    assert (offset_map.size, offset_map.latest_offset) == (1, 10)
    assert offset_map.get_many(keys("b", "c", "d"))[0].tolist() == [-1, -1, -1]


def test_update_existing_lets_an_older_clean_record_win() -> None:
    """An older record with a higher version replaces the dirty entry of its key."""
    offset_map = OffsetMap(1024, strategy=HEADER)
    offset_map.put_many(keys("a", "b"), [10, 11], [1, 1])
    changed = offset_map.update_existing_many(keys("a", "b"), [2, 3], [5, 1])
    assert changed == 1
    assert offset_map.get_many(keys("a", "b"))[0].tolist() == [2, 11]
    assert offset_map.latest_offset == 11
    hashes = keys("a", "a", "b", "b")
    assert offset_map.keep_mask(hashes, [2, 10, 3, 11]).tolist() == [True, False, False, True]


def test_update_existing_is_a_no_op_for_the_offset_strategy() -> None:
    """With the offset strategy an older record never beats the mapped one."""
    offset_map = OffsetMap(1024)
    offset_map.put_many(keys("a"), [10])
    assert offset_map.update_existing_many(keys("a"), [2], [99]) == 0
    assert offset_map.get_many(keys("a"))[0].tolist() == [10]


def test_offset_strategy_keep_mask() -> None:
    """Offset strategy: keep absent keys and offsets at or above the mapped offset."""
    offset_map = OffsetMap(1024)
    offset_map.put_many(keys("a"), [5])
    hashes = keys("a", "a", "a", "z")
    assert offset_map.keep_mask(hashes, [4, 5, 6, 0]).tolist() == [False, True, True, True]


# -- properties ------------------------------------------------------------------------------


@settings(deadline=None, max_examples=50)
@given(st.lists(st.binary(max_size=12), min_size=1, max_size=300))
def test_get_returns_each_keys_last_put(raw_keys: list[bytes]) -> None:
    """Random keys never merge: each key maps to the offset of its last put."""
    buf = b"".join(raw_keys)
    lens = np.array([len(k) for k in raw_keys])
    hashes = hash_keys(np.frombuffer(buf, np.uint8), np.cumsum(lens) - lens, lens)
    offset_map = OffsetMap(24 * 400, load_factor=1.0)
    assert offset_map.put_many(hashes, np.arange(len(raw_keys))) == len(raw_keys)
    last = {k: i for i, k in enumerate(raw_keys)}
    assert offset_map.size == len(last)
    assert offset_map.get_many(hashes)[0].tolist() == [last[k] for k in raw_keys]


@settings(deadline=None, max_examples=50)
@given(st.lists(st.integers(0, 9), max_size=40), st.integers(2, 8))
def test_put_stops_at_the_first_record_that_finds_the_map_full(
    sequence: list[int], slots: int
) -> None:
    """put_many takes records until, before some put, size >= max_keys."""
    offset_map = OffsetMap(24 * slots, load_factor=0.9)
    seen: set[int] = set()
    expected = len(sequence)
    for i, key in enumerate(sequence):
        if len(seen) >= offset_map.max_keys:
            expected = i
            break
        seen.add(key)
    hashes = key_range(10)[sequence] if sequence else np.zeros((0, 2), np.uint64)
    assert offset_map.put_many(hashes, np.arange(len(sequence))) == expected
    assert offset_map.size == len(seen)
    assert offset_map.latest_offset == expected - 1


@dataclass(frozen=True)
class Record:
    key: int
    offset: int
    version: int
    has: bool


def beats(a: Record, b: Record, strategy: CompactionStrategy) -> bool:
    """The plain-Python statement of each strategy's order."""
    if strategy is OFFSET:
        return a.offset > b.offset
    if a.has != b.has:
        return a.has
    if a.has and a.version != b.version:
        return a.version > b.version
    return a.offset > b.offset


records_st = st.lists(
    st.tuples(st.integers(0, 5), st.integers(-2, 2), st.booleans()), min_size=1, max_size=40
)


@settings(deadline=None, max_examples=150)
@given(records_st, st.integers(0, 40), st.sampled_from([OFFSET, TIMESTAMP, HEADER]), st.booleans())
def test_winners_match_reference(
    raw: list[tuple[int, int, bool]], split: int, strategy: CompactionStrategy, bounded: bool
) -> None:
    """Dirty records put, clean ones fed to update_existing: winners and kept records match."""
    records = [Record(k, i, v, h) for i, (k, v, h) in enumerate(raw)]
    split = min(split, len(records) - 1)
    clean, dirty = records[:split], records[split:]
    winners: dict[int, Record] = {}
    for r in dirty:
        if r.key not in winners or beats(r, winners[r.key], strategy):
            winners[r.key] = r
    for r in clean:
        if r.key in winners and beats(r, winners[r.key], strategy):
            winners[r.key] = r

    all_hashes = key_range(6)[[r.key for r in records]]
    offsets = np.array([r.offset for r in records])
    versions = np.array([r.version for r in records])
    has = np.array([r.has for r in records])
    offset_map = OffsetMap(2**20 if bounded else 1024, strategy=strategy)
    if bounded:  # a round of few records in a big map uses its first slots only
        offset_map.clear(keys_at_most=len(dirty))
    slots = np.empty(len(dirty), dtype=np.int64)
    assert offset_map.put_many(
        all_hashes[split:], offsets[split:], versions[split:], has[split:], slots=slots
    )
    offset_map.update_existing_many(
        all_hashes[:split], offsets[:split], versions[:split], has[:split]
    )

    got_offsets, got_versions, got_has = offset_map.get_many(key_range(6))
    for key in range(6):
        w = winners.get(key)
        assert got_offsets[key] == (w.offset if w else -1)
        if w and strategy is not OFFSET:
            assert bool(got_has[key]) == w.has
            assert got_versions[key] == (w.version if w.has else 0)
    expected_keep = [r.key not in winners or winners[r.key] == r for r in records]
    assert offset_map.keep_mask(all_hashes, offsets).tolist() == expected_keep
    assert offset_map.keep_slots(slots, offsets[split:]).tolist() == expected_keep[split:]
    assert offset_map.size == len(winners)
    assert offset_map.latest_offset == records[-1].offset


def test_put_slots_of_a_partial_put_answer_keep_mask() -> None:
    """A put stopped by a full map gives slots for the records it took, and keep_slots
    agrees with keep_mask on them."""
    offset_map = OffsetMap(24 * 4, load_factor=0.75)  # 4 slots, 3 keys
    hashes = keys("a", "b", "a", "c", "b")
    offsets = np.arange(5, dtype=np.int64)
    slots = np.full(5, -1, dtype=np.int64)
    put = offset_map.put_many(hashes, offsets, slots=slots)
    assert put == 4
    assert (slots[:put] >= 0).all()
    expected = offset_map.keep_mask(hashes[:put], offsets[:put])
    assert offset_map.keep_slots(slots[:put], offsets[:put]).tolist() == expected.tolist()
    assert expected.tolist() == [False, True, True, True]


def test_put_many_refuses_slots_of_the_wrong_shape_or_type() -> None:
    """The slots output must hold one int64 per record."""
    offset_map = OffsetMap(1024)
    with pytest.raises(ValueError, match="slots"):
        offset_map.put_many(keys("a", "b"), [0, 1], slots=np.empty(1, dtype=np.int64))
    with pytest.raises(ValueError, match="slots"):
        offset_map.put_many(keys("a", "b"), [0, 1], slots=np.empty(2, dtype=np.int32))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 10**6), min_size=1, max_size=300), max_size=4),
    st.sampled_from(list(CompactionStrategy)),
)
def test_clear_zeroes_every_filled_slot_whether_few_or_many(
    rounds: list[list[int]], strategy: CompactionStrategy
) -> None:
    """`clear` zeroes only the slots it tracked while they were few (a small partition
    does not pay for the whole map), and the whole map past that: either way the map is
    all zero afterwards and a second use sees nothing of the first."""
    m = OffsetMap(4096 * 24, strategy=strategy)  # 4096 slots: tracking stops at 256 puts
    offset = 0
    for batch in rounds:
        offsets = np.arange(offset, offset + len(batch), dtype=np.int64)
        m.put_many(keys(*(f"k{k}" for k in batch)), offsets)
        offset += len(batch)
    m.clear()
    assert not m._table.view(np.uint8).any()
    assert m.size == 0


def test_clear_after_a_few_puts_writes_only_their_slots() -> None:
    """The cheap path: a slot no put filled is not written by `clear` (seen through a
    marker planted there), so a small pass costs in proportion to its keys."""
    m = OffsetMap(4096 * 24)
    m.put_many(key_range(10), np.arange(10, dtype=np.int64))
    free = int(np.flatnonzero(m._table["offset"] == 0)[-1])
    m._table["offset"][free] = 12345  # not a real entry: only a witness
    m.clear()
    assert m._table["offset"][free] == 12345
    assert int(np.count_nonzero(m._table["hash_hi"])) == 0


def test_a_bounded_round_uses_the_first_slots_only() -> None:
    """A round of at most 500 keys in a 1 MiB map (43,690 slots) probes its first 1,024:
    those are all the pages of the map it touches."""
    offset_map = OffsetMap(2**20)
    offset_map.clear(keys_at_most=500)
    hashes, offsets = key_range(500), np.arange(500, dtype=np.int64)
    slots = np.empty(500, dtype=np.int64)
    assert offset_map.put_many(hashes, offsets, slots=slots) == 500
    assert slots.min() >= 0
    assert slots.max() < MIN_ACTIVE_SLOTS
    assert offset_map.get_many(hashes)[0].tolist() == offsets.tolist()
    assert offset_map.utilization == 500 / offset_map.slots


def test_a_round_past_its_bound_finds_the_map_full_and_clear_empties_it() -> None:
    """Putting more keys than the round's bound ends the put before its slots in use run
    out (the keys put all found), and the next `clear` empties them, whatever the next
    round's bound."""
    offset_map = OffsetMap(2**20)
    offset_map.clear(keys_at_most=600)  # 1,200 slots in use
    hashes, offsets = key_range(2000), np.arange(2000, dtype=np.int64)
    put = offset_map.put_many(hashes, offsets)
    assert put == 1199
    assert offset_map.get_many(hashes[:put])[0].tolist() == offsets[:put].tolist()
    offset_map.clear()
    assert offset_map.size == 0
    assert (offset_map.get_many(hashes)[0] == -1).all()
    assert offset_map.put_many(hashes, offsets) == 2000


@pytest.mark.parametrize("strategy", [OFFSET, TIMESTAMP])
@pytest.mark.parametrize("late", [False, True])
def test_a_bounded_round_grows_its_slots_as_keys_come(
    strategy: CompactionStrategy, late: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round starts with `FIRST_ACTIVE_SLOTS` of its bound and grows them (rehashing)
    whenever more than half hold keys, to what its keys per record so far foretell: a
    round of distinct keys goes straight to its bound; keys that come late (`late`: the
    first 2,000 records over 8 keys) grow it step by step. Every key keeps its winner,
    the round fills where a map without growth does, and the slots of a put before a
    growth are told apart by the map's generation."""
    monkeypatch.setattr(offset_map_module, "FIRST_ACTIVE_SLOTS", 16)
    keys = np.where(np.arange(5000) < 2000, np.arange(5000) % 8, np.arange(5000) % 1500)
    if not late:
        keys = np.arange(5000) % 1500
    hashes = key_range(1500)[keys]
    offsets = np.arange(5000, dtype=np.int64)
    versions = (offsets * 7919) % 1000
    grown = OffsetMap(2**20, strategy=strategy)
    fixed = OffsetMap(2**20, strategy=strategy)
    grown.clear(keys_at_most=5000)
    with monkeypatch.context() as m:
        m.setattr(offset_map_module, "FIRST_ACTIVE_SLOTS", 2**20)
        fixed.clear(keys_at_most=5000)
    assert (grown.slots_in_use, fixed.slots_in_use) == (16, 10_000)
    versioned = strategy is not OFFSET
    early = np.empty(2100, np.int64)
    head = (versions[:2100], None) if versioned else (None, None)
    assert grown.put_many(hashes[:2100], offsets[:2100], *head, slots=early) == 2100
    assert grown.generation >= 1
    tail = (versions[2100:], None) if versioned else (None, None)
    assert grown.put_many(hashes[2100:], offsets[2100:], *tail) == 2900
    assert grown.generation >= (3 if late else 1)
    assert grown.slots_in_use == (4096 if late else 10_000)
    fixed.put_many(hashes, offsets, *((versions, None) if versioned else (None, None)))
    assert grown.size == fixed.size == 1500
    for got, want in zip(grown.get_many(hashes), fixed.get_many(hashes), strict=True):
        assert got.tolist() == want.tolist()

    # Full where a map without growth is full: the bound's last slot is never filled.
    grown.clear(keys_at_most=600)
    assert grown.put_many(key_range(2000), np.arange(2000, dtype=np.int64)) == 1199
    assert grown.slots_in_use == 1200
    grown.clear()
    assert grown.size == 0
    assert int(np.count_nonzero(grown._table["hash_hi"])) == 0


def test_a_round_whose_keys_repeat_grows_to_what_they_need() -> None:
    """A round of 100,000 records drawn from 3,000 keys, starting with 1,024 slots: its
    first growth comes after 512 keys in about 560 records, which a plain keys-per-record
    ratio reads as 91,000 keys to come (and so grows to the bound, 200,000 slots); the
    round needs 8,192 slots to hold 3,000 keys at most half full."""
    offset_map = OffsetMap(2**23)
    offset_map.clear(keys_at_most=100_000)
    offset_map._active = 1024  # as FIRST_ACTIVE_SLOTS starts a round, scaled down
    hashes = key_range(3000)[np.random.default_rng(7).integers(0, 3000, 100_000)]
    assert offset_map.put_many(hashes, np.arange(100_000, dtype=np.int64)) == 100_000
    assert offset_map.size == 3000
    assert offset_map.generation >= 1
    assert offset_map.slots_in_use == 8192


@pytest.mark.parametrize("universe", [10_000, 1_000_000])
def test_foretold_keys_of_uniform_draws(universe: int) -> None:
    """Records that draw keys uniformly foretell about the keys there are, from a
    sample of a quarter of them on; no fewer than were seen, never more than records."""
    rng = np.random.default_rng(universe)
    round_records = 20 * universe
    draws = rng.integers(0, universe, round_records)
    for seen in (universe // 4, universe, 5 * universe):
        keys = int(np.unique(draws[:seen]).size)
        foretold = foretold_keys(keys, seen, round_records)
        assert keys <= foretold <= round_records
        assert foretold == pytest.approx(universe, rel=0.15 if seen < universe else 0.06)


def test_foretold_keys_at_the_edges() -> None:
    """Distinct keys so far foretell as many keys as records; nothing seen foretells
    the bound; one key over many records foretells that key, records without keys none;
    more records to come never foretell fewer keys, nor a round fewer than were seen."""
    assert foretold_keys(500, 500, 10_000) == 10_000
    assert foretold_keys(0, 0, 10_000) == 10_000
    assert foretold_keys(8, 2_000, 5_000) == pytest.approx(8, abs=1e-6)
    assert foretold_keys(1, 1_000_000, 10**9) == 1
    assert foretold_keys(100, 150, 1_000) < foretold_keys(100, 150, 10_000)
    assert foretold_keys(600, 600, 100) == 600  # never fewer than were seen
    assert foretold_keys(0, 5, 100) == 0
