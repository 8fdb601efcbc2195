"""What the cleaned segment looks like: kept batches byte for byte, partial ones with the
original header fields, the last source segment's mtime, consistent indexes."""

from __future__ import annotations

import itertools
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from cleanerd.compaction import cleaner
from cleanerd.compaction.keyhash import hash_keys
from cleanerd.compaction.offset_map import MIN_ACTIVE_SLOTS, OffsetMap
from cleanerd.errors import CorruptRecordError
from cleanerd.log.meta import SegmentMeta
from cleanerd.log.recovery import SegmentOptions, recover_partition
from cleanerd.log.segment_reader import map_segment
from cleanerd.records.columns import SegmentColumns, segment_columns
from cleanerd.records.header import Buffer, Compression
from cleanerd.records.walker import ANY_OFFSETS, OffsetRange, Window, scan_batches
from tests.compaction.conftest import LogBuilder, clean, k, read_batches
from tests.conftest import NOGROUP, give_mode_and_group, mode_and_group


def test_fully_kept_batches_are_copied_byte_for_byte(log: LogBuilder) -> None:
    """A batch whose records all survive keeps its exact bytes (CRC and all)."""
    log.append([(k(1), b"a"), (k(2), b"b")], leader_epoch=7)
    log.append([(k(3), b"c")])
    log.append([(k(3), b"d")])
    log.roll()
    d = log.write()
    original = log.segments[0].batches[0]
    clean(d)
    data = (d / "00000000000000000000.log").read_bytes()
    assert data.startswith(original)


def test_partial_batch_keeps_header_fields(log: LogBuilder) -> None:
    """A re-encoded batch keeps codec, base offset, last offset delta, producer fields and
    leader epoch; only count, length, timestamps and CRC change."""
    log.append(
        [(k(1), b"a"), (k(2), b"b"), (k(3), b"c")],
        pid=9,
        epoch=2,
        leader_epoch=5,
        codec=Compression.LZ4,
    )
    log.append([(k(2), b"new")])
    log.roll()
    d = log.write()
    clean(d)
    h = read_batches(d)[0].header
    assert (h.base_offset, h.last_offset_delta, h.records_count) == (0, 2, 2)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (9, 2, 0)
    assert (h.partition_leader_epoch, h.compression) == (5, Compression.LZ4)
    assert [r.key for r in read_batches(d)[0].records] == [k(1), k(3)]


def test_cleaned_segment_takes_last_source_mtime_and_valid_indexes(tmp_path: Path) -> None:
    """The output's files carry the last source segment's mtime; its indexes verify."""
    log = LogBuilder(tmp_path / "logs", index_interval=100)
    for i in range(60):
        log.append([(k(i % 7), b"x" * 40)])
        if i % 20 == 19:
            log.roll()
    log.append([(k(0), b"active")])
    d = log.write()
    for n, base in enumerate((0, 20, 40)):
        os.utime(d / f"{base:020d}.log", ns=(10**18 + n, 10**18 + n * 10**9))
    clean(d)
    for suffix in (".log", ".index", ".timeindex"):
        assert (d / f"{0:020d}{suffix}").stat().st_mtime_ns == 10**18 + 2 * 10**9
    segments, report = recover_partition(
        d, SegmentOptions(100, 10 * 1024 * 1024), recover=False, full_check=True
    )
    assert report.errors == []
    assert [s.base_offset for s in segments] == [0, 60]
    data = (d / f"{0:020d}.log").read_bytes()
    assert len(list(scan_batches(data))) == 7


def test_crcs_are_checked_once_per_pass(log: LogBuilder, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dirty segment decoded again for the copy (no room to keep it decoded) is not
    CRC-checked a second time; every segment is checked once."""
    for i in range(6):
        log.append([(k(i % 2), k(i))])
        if i == 2:
            log.roll()
    log.roll()
    d = log.write()
    checked: list[tuple[int, bool]] = []

    def spy(
        raw: Buffer, *, start: int, end: int, verify_crc: bool, offsets: OffsetRange
    ) -> SegmentColumns:
        checked.append((len(raw), verify_crc))
        return segment_columns(raw, start=start, end=end, verify_crc=verify_crc, offsets=offsets)

    monkeypatch.setattr(cleaner, "segment_columns", spy)
    monkeypatch.setattr(cleaner, "CACHE_BYTES", 0)
    clean(d)
    assert [v for _, v in checked] == [True, True, False, False]


def test_each_segment_is_mapped_once_per_pass(
    log: LogBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The producer-state walk and the decode share one mapping of each segment to clean
    (its pages are faulted in once); the active segment is mapped for the walk only."""
    for i in range(6):
        log.append([(k(i % 2), k(i))])
        if i == 2:
            log.roll()
    log.roll()
    log.append([(k(0), b"active")])
    d = log.write()
    mapped: list[str] = []

    def spy(path: Path, seg: SegmentMeta, *, active: bool) -> Buffer:
        mapped.append(path.name)
        return map_segment(path, seg, active=active)

    monkeypatch.setattr(cleaner, "map_segment", spy)
    clean(d)
    assert sorted(mapped) == sorted(set(mapped))
    assert len(mapped) == 3


def test_map_oracle_answers_from_put_slots_for_the_records_put() -> None:
    """Keep decisions for a segment whose records the map build put come from their map
    slots, without hashing; other offsets fall back to a lookup by hash."""
    buf = np.frombuffer(b"abacb", dtype=np.uint8)
    hashes = hash_keys(buf, np.arange(5), np.ones(5, dtype=np.int64))
    offsets = np.arange(10, 15, dtype=np.int64)
    offset_map = OffsetMap(1024)
    slots = np.empty(5, dtype=np.int64)
    offset_map.put_many(hashes, offsets, slots=slots)
    oracle = cleaner._MapOracle(offset_map, {(10, 0): (offsets, slots, 0)})

    def no_hashes() -> np.ndarray:
        raise AssertionError("answered by hash lookup")

    got = oracle.keep_keyed(10, 0, offsets, no_hashes, final=True)
    assert got.tolist() == [False, False, True, True, True]
    oracle = cleaner._MapOracle(offset_map, {(10, 0): (offsets, slots, 0)})
    got = oracle.keep_keyed(10, 0, offsets[2:], lambda: hashes[2:], final=True)
    assert got.tolist() == [True, True, True]
    # Another window of the segment: its own slots, or none.
    oracle = cleaner._MapOracle(offset_map, {(10, 0): (offsets, slots, 0)})
    got = oracle.keep_keyed(10, 2, offsets[2:], lambda: hashes[2:], final=True)
    assert got.tolist() == [True, True, True]
    assert (10, 0) in oracle.put_slots
    # Slots from before the map grew: a lookup by hash.
    offset_map.generation += 1
    oracle = cleaner._MapOracle(offset_map, {(10, 0): (offsets, slots, 0)})
    got = oracle.keep_keyed(10, 0, offsets, lambda: hashes, final=True)
    assert got.tolist() == [False, False, True, True, True]
    oracle = cleaner._MapOracle(offset_map, {(10, 0): (offsets, slots, 0)})
    with pytest.raises(AssertionError, match="hash lookup"):
        oracle.keep_keyed(10, 0, offsets, no_hashes, final=True)


@pytest.mark.parametrize("window", [1, 10**9])
def test_a_full_map_ends_the_round_after_the_marker_before_it(
    log: LogBuilder, monkeypatch: pytest.MonkeyPatch, window: int
) -> None:
    """The map fills at a batch right after a COMMIT marker: the round ends after the
    marker (its offset is covered, as Kafka's builder covers every batch it read), also
    when that batch starts a window of its own, the marker having ended the window
    before."""
    log.append([(k(1), b"a")])
    log.append([(k(2), b"b")])
    log.append([(k(3), b"c")], pid=5, txn=True)
    marker = log.commit(5)
    log.append([(k(4), b"d")])
    log.roll()
    d = log.write()
    monkeypatch.setattr(cleaner, "DECODE_WINDOW_BYTES", window)
    result = clean(d, slots=4)
    assert result.end_offset == marker + 1


def test_a_big_segment_is_decoded_a_window_at_a_time(
    log: LogBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No decode of the pass covers more than `DECODE_WINDOW_BYTES` of a segment (each window
    whole batches), so a segment of any size is cleaned in bounded memory; together the
    windows cover the segment."""
    for i in range(300):
        log.append([(k(i % 40), b"v%d" % i)], pid=7)
    log.roll()
    d = log.write()
    size = (d / f"{0:020d}.log").stat().st_size
    decoded: set[tuple[int, int]] = set()

    def spy(
        raw: Buffer, *, start: int, end: int, verify_crc: bool, offsets: OffsetRange
    ) -> SegmentColumns:
        decoded.add((start, end))
        return segment_columns(raw, start=start, end=end, verify_crc=verify_crc, offsets=offsets)

    monkeypatch.setattr(cleaner, "segment_columns", spy)
    monkeypatch.setattr(cleaner, "DECODE_WINDOW_BYTES", 1000)
    clean(d, slots=64)
    spans = sorted(decoded)
    assert len(spans) > size // 1000
    assert max(end - start for start, end in spans) <= 1000
    assert spans[0][0] == 0
    assert spans[-1][1] == size
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))


def test_windows_are_decoded_ahead_in_threads_the_pass_stops(
    log: LogBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the pass works on one window, the next ones are decoded (CRCs checked, keys
    hashed) in the pass's decode threads; the result is the one of a pass that decodes
    in order, and no decode thread outlives the pass."""
    for i in range(300):
        log.append([(k(i % 40), b"v%d" % i)], pid=7)
    log.roll()
    d = log.write()
    threads: list[str] = []

    def spy(raw: Buffer, window: Window, path: Path, *, verify_crc: bool) -> object:
        threads.append(threading.current_thread().name)
        return decode_ahead(raw, window, path, verify_crc=verify_crc)

    decode_ahead = cleaner._decode_ahead
    monkeypatch.setattr(cleaner, "_decode_ahead", spy)
    monkeypatch.setattr(cleaner, "DECODE_WINDOW_BYTES", 1000)
    clean(d, slots=64)
    assert len(threads) > 5
    assert all(name.startswith("cleaner-decode") for name in threads)
    assert not [t for t in threading.enumerate() if t.name.startswith("cleaner-decode")]
    survivors = [r.key for b in read_batches(d) for r in b.records]
    assert survivors == [k(i % 40) for i in range(260, 300)]


def test_a_corrupt_window_decoded_ahead_fails_the_pass_when_its_turn_comes(
    log: LogBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad CRC in a window decoded ahead fails the pass with the file and the byte
    position of its batch, as an in-order decode does, and leaves the files as they
    were."""
    for i in range(300):
        log.append([(k(i % 40), b"v%d" % i)], pid=7)
    log.roll()
    d = log.write()
    seg = d / f"{0:020d}.log"
    data = bytearray(seg.read_bytes())
    batches = list(scan_batches(bytes(data)))
    bad = batches[200].position
    data[bad + 70] ^= 0x01
    seg.write_bytes(bytes(data))
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    monkeypatch.setattr(cleaner, "DECODE_WINDOW_BYTES", 1000)
    with pytest.raises(CorruptRecordError) as info:
        clean(d, slots=64)
    assert info.value.path == str(seg)
    assert info.value.position == bad
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before
    assert not [t for t in threading.enumerate() if t.name.startswith("cleaner-decode")]


def test_a_decoded_window_counts_all_it_holds(log: LogBuilder) -> None:
    """The cache budget counts every array a decoded window holds, its batch table too
    (which, for 1-record batches, is as big as its record table)."""
    for i in range(500):
        log.append([(k(i), b"v")], pid=7)
    log.roll()
    d = log.write()
    path = d / f"{0:020d}.log"
    raw = path.read_bytes()
    c = cleaner._read_columns(raw, Window(0, len(raw), ANY_OFFSETS), path, verify_crc=True)
    c.hashes(c.keyed)
    held: dict[int, int] = {}
    for name in dir(c.sc) + dir(c):
        value = getattr(c.sc, name, None) if hasattr(c.sc, name) else getattr(c, name, None)
        if isinstance(value, np.ndarray) and value is not c.sc.segment:
            owner = value if value.base is None else value.base
            if isinstance(owner, np.ndarray):
                held[id(owner)] = owner.nbytes
    assert c.memory_bytes >= sum(held.values())


def test_a_pass_probes_the_map_slots_its_offsets_need(log: LogBuilder) -> None:
    """A pass over a few records in a big map uses a slot prefix sized by its dirty
    range, not all of the map (which a first pass would fault in, page by page)."""
    for i in range(40):
        log.append([(k(i % 7), b"v%d" % i)])
    log.roll()
    d = log.write()
    offset_map = OffsetMap(2**20)
    clean(d, offset_map=offset_map)
    assert offset_map.slots_in_use == MIN_ACTIVE_SLOTS < offset_map.slots
    survivors = [r.key for b in read_batches(d) for r in b.records]
    assert survivors == [k(i % 7) for i in range(33, 40)]  # each key's last record


@pytest.mark.usefixtures("umask_0027")
def test_cleaned_files_take_the_bits_and_group_of_the_segments_they_replace(
    tmp_path: Path,
) -> None:
    """Under the unit's umask a cleaned segment was 0640 in cleanerd's group, so the
    broker (or its group) could no longer read a retired dir it cleaned. Its files now
    take the bits and group of the segment they replace."""
    log = LogBuilder(tmp_path / "logs")
    for i in range(30):
        log.append([(k(i % 3), b"v%d" % i)])
        if i == 4:
            log.append([(k(9), b"aborted")], pid=7, txn=True)
            log.abort(7)
        if i % 10 == 9:
            log.roll()
    d = log.write()
    give_mode_and_group(sorted(d.iterdir()), 0o644, NOGROUP)
    before = {p.name: p.stat().st_ino for p in d.iterdir()}
    clean(d)
    written = [
        p for p in d.iterdir() if p.suffix != ".deleted" and before.get(p.name) != p.stat().st_ino
    ]
    kinds = {".log", ".index", ".timeindex", ".txnindex"}
    assert {p.suffix for p in written} == kinds  # the cleaned segment's files
    assert {mode_and_group(p) for p in written} == {(0o644, NOGROUP)}
