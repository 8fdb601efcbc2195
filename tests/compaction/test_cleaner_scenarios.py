"""Kafka's LogCleanerTest scenarios (ref section 9) against the whole pass on real files."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from cleanerd.compaction.cleaner import Cleaner, CleanerConfig
from cleanerd.compaction.keyhash import hash_key
from cleanerd.compaction.offset_map import OffsetMap
from cleanerd.log.ownership import SegmentsChanged
from cleanerd.log.partition_log import PartitionLog
from cleanerd.log.txnindex import AbortedTxn
from cleanerd.records.batch import RecordBatch, decode_batch
from cleanerd.records.walker import scan_batches
from tests.compaction.conftest import (
    DAY,
    LONG_MAX,
    T2,
    TP,
    LogBuilder,
    T,
    aborted_txns,
    clean,
    k,
    last_sequences,
    read_batches,
    segment_metas,
    view,
)


def kv(key: int, value: int | None = None) -> tuple[bytes, bytes | None]:
    return k(key), (k(key if value is None else value))


def test_25_partial_segment_clean(log: LogBuilder) -> None:
    """Scenario 25: a 1-key map cleans the first segment in parts."""
    log.records([kv(0), kv(1), kv(0), kv(1), kv(0)])
    log.roll()
    log.append([kv(9)])
    d = log.write()
    r = clean(d, first_dirty=2, slots=2)
    assert r.end_offset == 3
    v = view(d)
    assert v.keys == [k(1), k(0), k(1), k(0), k(9)]
    assert v.offsets == [1, 2, 3, 4, 5]
    r = clean(d, first_dirty=3, slots=2)
    assert view(d).offsets == [2, 3, 4, 5]
    r = clean(d, first_dirty=4, slots=2)
    assert view(d).offsets == [3, 4, 5]
    assert view(d).keys == [k(1), k(0), k(9)]


def test_21_stats(log: LogBuilder) -> None:
    """Scenario 21: read/written counts and bytes of a pass."""
    log.records([kv(0), kv(1), kv(0), kv(1), kv(0)])
    log.roll()
    log.append([kv(9)])
    d = log.write()
    size = (d / "00000000000000000000.log").stat().st_size
    r = clean(d, first_dirty=2, slots=4)
    assert r.end_offset == 5
    s = r.stats
    assert (s.messages_read, s.bytes_read, s.messages_written, s.invalid_messages_read) == (
        5,
        size,
        2,
        0,
    )
    assert s.bytes_written == (d / "00000000000000000000.log").stat().st_size


def test_3_idempotent_producers_keep_sequences(log: LogBuilder) -> None:
    """Scenario 3: each producer's last batch survives, at least as an empty header."""
    log.append([kv(1), kv(2), kv(3)], pid=1)
    log.append([kv(3), kv(1), kv(4)], pid=2)
    log.append([kv(1), kv(4)], pid=3)
    log.roll()
    log.append([kv(99)])
    d = log.write()
    clean(d)
    v = view(d)
    assert v.last_offsets == [2, 5, 7, 8]
    assert last_sequences(d) == {1: 2, 2: 2, 3: 1}
    assert v.keys[:4] == [k(2), k(3), k(1), k(4)]
    assert v.offsets[:4] == [1, 3, 6, 7]


def test_5_transaction_basics(log: LogBuilder) -> None:
    """Scenario 5: aborted data goes, committed data is deduplicated."""
    log.append([kv(1), kv(2)], pid=1, txn=True)
    log.append([kv(2), kv(3)], pid=2, txn=True)
    log.append([kv(3), kv(4)], pid=1, txn=True)
    log.abort(1)
    log.commit(2)
    log.append([kv(2)], pid=1, txn=True)
    log.commit(1)
    log.roll()
    log.append([kv(99)])
    d = log.write()
    clean(d)
    v = view(d)
    assert v.keys[:2] == [k(3), k(2)]
    assert v.offsets[:5] == [3, 6, 7, 8, 9]


def test_22_last_batch_per_producer(log: LogBuilder) -> None:
    """Scenario 22: last batches per producer and last sequences survive."""
    log.append([kv(0, 0)])
    log.append([kv(0, 1)], pid=1)
    log.append([kv(0, 2)], pid=2)
    log.append([kv(0, 3)], pid=3)
    log.append([kv(1, 1)], pid=2)
    log.roll()
    log.append([kv(99)])
    d = log.write()
    clean(d)
    v = view(d)
    assert v.last_offsets[:-1] == [1, 3, 4]
    assert last_sequences(d) == {1: 0, 2: 1, 3: 0}
    assert v.keys[:-1] == [k(0), k(1)]
    assert v.offsets[:-1] == [3, 4]


def two_pass(d: Path, now: int = T, **kw: object) -> None:
    """Kafka's runTwoPassClean: at `now`, then just after the horizon it stamped."""
    clean(d, now_ms=now, **kw)  # type: ignore[arg-type]
    clean(d, now_ms=now + DAY + 1, **kw)  # type: ignore[arg-type]


def test_1_basic_recopy(log: LogBuilder) -> None:
    """Scenario 1: keys superseded in the dirty part vanish from the cleaned segments."""
    for i in range(40):
        log.append([kv(i)])
        if i % 10 == 9:
            log.roll()
    for i in (1, 3, 5, 7, 9):
        log.append([kv(i, 100)])
    d = log.write()
    sizes = sum((d / f"{b:020d}.log").stat().st_size for b in (0, 10, 20))
    r = clean(d, first_dirty=40, first_uncleanable=45, slots=64)
    # only segments below the map's end are rewritten: all 4 + the dirty one
    assert r.stats.bytes_read >= sizes
    v = view(d)
    assert [x for x in v.keys if x in {k(1), k(3), k(5), k(7), k(9)}] == [
        k(1),
        k(3),
        k(5),
        k(7),
        k(9),
    ]
    assert v.offsets == [o for o in range(40) if o not in {1, 3, 5, 7, 9}] + [40, 41, 42, 43, 44]


def test_3_pid_batch_becomes_empty_but_stays(log: LogBuilder) -> None:
    """Scenario 3 (second half): a superseded last batch stays as an empty header."""
    log.append([kv(1), kv(2), kv(3)], pid=1)
    log.append([kv(3), kv(1), kv(4)], pid=2)
    log.append([kv(1), kv(4)], pid=3)
    log.roll()
    log.append([kv(2)], pid=4)
    log.roll()
    d = log.write()
    clean(d)
    v = view(d)
    assert v.last_offsets == [2, 5, 7, 8]
    assert last_sequences(d) == {1: 2, 2: 2, 3: 1, 4: 0}
    assert v.keys == [k(3), k(1), k(4), k(2)]
    assert v.offsets == [3, 6, 7, 8]


def test_4_multi_pass_aborted_txns_tiny_map(log: LogBuilder) -> None:
    """Scenario 4: three passes with a 3-key map and two aborted transactions."""
    log.append([kv(1), kv(2)], pid=1, txn=True)
    log.append([kv(2), kv(3)], pid=2, txn=True)
    log.append([kv(3), kv(4)], pid=1, txn=True)
    log.commit(1)
    log.commit(2)
    log.append([kv(2), kv(3)], pid=1, txn=True)
    log.abort(1)
    log.append([kv(4), kv(5)], pid=2, txn=True)
    log.append([kv(5), kv(6)], pid=1, txn=True)
    log.commit(1)
    log.abort(2)
    log.append([kv(6), kv(7)], pid=2, txn=True)
    log.commit(2)
    log.roll()
    d = log.write()
    assert aborted_txns(d) == [AbortedTxn(8, 1, 10, 11), AbortedTxn(11, 2, 16, 17)]
    cfg = CleanerConfig(delete_retention_ms=50_000, producer_id_expiration_ms=LONG_MAX)
    now = 1_000_000
    r = clean(d, first_dirty=0, slots=4, now_ms=now, config=cfg)
    assert r.end_offset == 4
    v = view(d)
    assert v.bases == [0, 2, 4, 6, 7, 10, 13, 15, 16, 17, 19]
    assert v.offsets == [0, 2, 3, 4, 5, 6, 7, 10, 13, 14, 15, 16, 17, 18, 19]
    assert len(aborted_txns(d)) == 2
    r = clean(d, first_dirty=4, slots=4, now_ms=now, config=cfg)
    assert r.end_offset == 14
    v = view(d)
    assert v.bases == [0, 2, 4, 6, 7, 10, 13, 15, 16, 17, 19]
    assert v.offsets == [0, 2, 4, 5, 6, 7, 10, 13, 14, 15, 16, 17, 18, 19]
    assert aborted_txns(d) == []
    r = clean(d, first_dirty=14, slots=4, now_ms=now + 50_000, config=cfg)
    assert r.end_offset == 20
    v = view(d)
    assert v.bases == [0, 2, 4, 6, 7, 13, 15, 17, 19]
    assert v.offsets == [0, 2, 4, 5, 6, 7, 13, 15, 17, 18, 19]


def test_7_commit_marker_waits_for_its_data(log: LogBuilder) -> None:
    """Scenario 7: a COMMIT marker stays while batches of its transaction remain."""
    log.append([kv(1)], pid=1, txn=True)
    log.append([kv(2), kv(3)], pid=1, txn=True)
    log.commit(1)
    log.append([kv(2)], pid=1, txn=True)
    log.commit(1)
    log.roll()
    d = log.write()
    clean(d)
    assert (view(d).keys, view(d).offsets) == ([k(1), k(3), k(2)], [0, 2, 3, 4, 5])
    log2 = LogBuilder(d.parent)
    log2.segments = []
    log2.roll(6)
    log2.append([kv(1), kv(3)], pid=1, txn=True)
    log2.commit(1)
    log2.roll()
    log2.write()
    clean(d)
    assert (view(d).keys, view(d).offsets) == ([k(2), k(1), k(3)], [3, 4, 5, 6, 7, 8])
    clean(d)
    assert view(d).offsets == [3, 4, 5, 6, 7, 8]
    clean(d, now_ms=T2)
    assert view(d).offsets == [4, 5, 6, 7, 8]


def test_8_fully_deleted_chunk_still_advances(log: LogBuilder) -> None:
    """Scenario 8: aborted data goes, its marker follows after the horizon."""
    log.append([kv(1)], pid=1, txn=True)
    log.abort(1)
    log.append([kv(2)], pid=1, txn=True)
    log.append([kv(2)], pid=1, txn=True)
    log.commit(1)
    log.roll()
    d = log.write()
    clean(d)
    assert (view(d).keys, view(d).offsets) == ([k(2)], [1, 3, 4])
    two_pass(d)
    assert view(d).offsets == [3, 4]


def test_9_commit_marker_with_empty_batches(log: LogBuilder) -> None:
    """Scenario 9: producers' superseded last batches stay as empty headers."""
    log.append([kv(2), kv(3)], pid=1, txn=True)
    log.roll()
    log.append([kv(2), kv(3)], pid=2, txn=True)
    log.commit(2)
    log.roll()
    log.append([kv(2)])
    log.append([kv(3)])
    log.commit(1)
    log.roll()
    d = log.write()
    clean(d)
    v = view(d)
    assert (v.keys, v.offsets, v.last_offsets) == ([k(2), k(3)], [4, 5, 6, 7], [1, 3, 4, 5, 6, 7])
    clean(d)
    assert view(d) == v
    log2 = LogBuilder(d.parent)
    log2.segments = []
    log2.roll(8)
    log2.sequences = {2: 2}
    log2.append([kv(1)], pid=2, txn=True)
    log2.commit(2)
    log2.roll()
    log2.write()
    clean(d)
    v = view(d)
    assert v.keys == [k(2), k(3), k(1)]
    assert v.offsets == [4, 5, 6, 7, 8, 9]
    assert v.last_offsets == [1, 4, 5, 6, 7, 8, 9]
    two_pass(d)
    v = view(d)
    assert (v.offsets, v.last_offsets) == ([5, 6, 7, 8, 9], [1, 5, 6, 7, 8, 9])


def test_10_marker_without_data_keeps_empty_header(log: LogBuilder) -> None:
    """Scenario 10: a marker carrying the producer's epoch is stripped to an empty header."""
    log.commit(1)
    log.append([kv(2)])
    log.append([kv(3)])
    log.roll()
    d = log.write()
    two_pass(d)
    v = view(d)
    assert (v.keys, v.offsets, v.last_offsets) == ([k(2), k(3)], [1, 2], [0, 1, 2])
    clean(d, now_ms=LONG_MAX)
    assert view(d) == v


def test_11_committed_txn_across_segments(log: LogBuilder) -> None:
    """Scenario 11: a committed transaction split by a roll keeps data and marker."""
    log.append([kv(1)], pid=1, txn=True)
    log.roll()
    log.commit(1)
    log.roll()
    d = log.write()
    two_pass(d)
    assert (view(d).offsets, view(d).last_offsets) == ([0, 1], [0, 1])


def test_12_aborted_txn_across_segments(log: LogBuilder) -> None:
    """Scenario 12: aborted data of the producer's last batch stays empty; marker stays."""
    log.append([kv(1)], pid=1, txn=True)
    log.roll()
    log.abort(1)
    log.roll()
    d = log.write()
    clean(d)
    assert (view(d).offsets, view(d).last_offsets) == ([1], [0, 1])
    clean(d, now_ms=T2)
    assert (view(d).offsets, view(d).last_offsets) == ([1], [0, 1])


def test_13_abort_marker_removal(log: LogBuilder) -> None:
    """Scenario 13: an abort marker goes once its data is gone and its horizon passed."""
    log.append([kv(1)], pid=1, txn=True)
    log.append([kv(2), kv(3)], pid=1, txn=True)
    log.abort(1)
    log.append([kv(3)], pid=1, txn=True)
    log.commit(1)
    log.roll()
    d = log.write()
    clean(d)
    assert (view(d).keys, view(d).offsets) == ([k(3)], [3, 4, 5])
    two_pass(d)
    assert view(d).offsets == [4, 5]


def test_14_sequence_reuse(log: LogBuilder) -> None:
    """Scenario 14: coordinator-style producers reusing sequence 0."""
    log.append([kv(1)], pid=1, txn=True, sequence=0)
    log.commit(1)
    log.append([kv(2)], pid=1, txn=True, sequence=0)
    log.commit(1)
    log.append([kv(1, 1)])
    log.append([kv(2, 1)])
    log.roll()
    d = log.write()
    clean(d)
    v = view(d)
    assert (v.offsets, v.last_offsets) == ([1, 3, 4, 5], [1, 2, 3, 4, 5])
    two_pass(d)
    v = view(d)
    assert (v.offsets, v.last_offsets) == ([3, 4, 5], [2, 3, 4, 5])


def test_15_abort_marker_with_retained_empty_batch(log: LogBuilder) -> None:
    """Scenario 15: the aborted txn index follows its marker's data."""
    log.append([kv(2), kv(3)], pid=1, txn=True)
    log.abort(1)
    log.roll()
    d = log.write()
    assert aborted_txns(d) == [AbortedTxn(0, 1, 2, 3)]
    clean(d)
    v = view(d)
    assert (v.keys, v.offsets, v.last_offsets) == ([], [2], [1, 2])
    assert aborted_txns(d) == [AbortedTxn(0, 1, 2, 3)]
    two_pass(d)
    assert view(d) == v
    log2 = LogBuilder(d.parent)
    log2.segments = []
    log2.roll(3)
    log2.sequences = {1: 2}
    log2.append([kv(1)], pid=1)
    log2.roll()
    log2.write()
    clean(d)
    v = view(d)
    assert (v.keys, v.offsets, v.last_offsets) == ([k(1)], [2, 3], [2, 3])
    two_pass(d)
    v = view(d)
    assert (v.offsets, v.last_offsets) == ([3], [3])
    assert aborted_txns(d) == []


def test_6_transactions_spanning_segments(log: LogBuilder) -> None:
    """Scenario 6: only the cleanable segment loses aborted data, then the next one."""
    log.append([kv(1), kv(2)], pid=1, txn=True)
    log.append([kv(2), kv(3)], pid=3, txn=True)
    log.append([kv(3), kv(4)], pid=2, txn=True)
    log.roll()
    log.append([kv(5), kv(6)], pid=2, txn=True)
    log.append([kv(6), kv(7)], pid=3, txn=True)
    log.append([kv(7), kv(8)], pid=1, txn=True)
    log.abort(2)
    log.append([kv(8), kv(9)], pid=3, txn=True)
    log.commit(3)
    log.append([kv(9), kv(10)], pid=1, txn=True)
    log.abort(1)
    d = log.write()
    r = clean(d)
    assert [int(x) for x in view(d).keys] == [2, 3, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10]
    log.segments = log.segments[-1:]
    log.roll()
    log.append([kv(11)], pid=2, txn=True)
    log.append([kv(12)], pid=1, txn=True)
    log.segments = log.segments[-1:]
    log.write()
    clean(d, first_dirty=r.end_offset)
    assert [int(x) for x in view(d).keys] == [2, 3, 6, 7, 8, 9, 11, 12]


def test_20_deletes(log: LogBuilder) -> None:
    """Scenario 20: tombstoned keys lose their values; tombstones stay, stamped."""
    for i in range(20):
        log.append([kv(i)])
    for i in range(0, 20, 2):
        log.append([(k(i), None)])
    for i in range(30):
        log.append([kv(100 + i)])
        if i % 10 == 9:
            log.roll()
    d = log.write()
    clean(d)
    batches = read_batches(d)
    values = {r.key: r.value for b in batches for r in b.records}
    assert all(values[k(i)] is None for i in range(0, 20, 2))
    assert all(values[k(i)] == k(i) for i in range(1, 20, 2))
    stamped = [b for b in batches if any(r.value is None for r in b.records)]
    assert len(stamped) == 10
    assert all(b.header.has_delete_horizon and b.header.base_timestamp == T + DAY for b in stamped)


def test_23_aborted_txn_keeps_last_sequence(log: LogBuilder) -> None:
    """Scenario 23: an aborted producer's last batch stays as a header for its sequence."""
    log.append([kv(1)], pid=1, txn=True)
    log.append([kv(2), kv(3)], pid=1, txn=True)
    log.abort(1)
    log.roll()
    d = log.write()
    clean(d)
    v = view(d)
    assert (v.last_offsets, v.keys, v.offsets) == ([2, 3], [], [3])
    assert last_sequences(d) == {1: 2}
    log.segments = log.segments[-1:]
    log.append([kv(1), kv(5)], pid=1, txn=True)
    log.roll()
    log.write()
    clean(d)
    v = view(d)
    assert (v.last_offsets, v.keys, v.offsets) == ([3, 5], [k(1), k(5)], [3, 4, 5])
    assert last_sequences(d) == {1: 4}


def test_24_data_key_equal_to_marker_key(log: LogBuilder) -> None:
    """Scenario 24: control records are never deduplicated against data keys."""
    log.append([kv(1)], pid=1, txn=True)
    log.commit(1)
    log.append([(b"\x00\x00\x00\x01", b"x")], pid=2, txn=True)
    log.commit(2)
    log.roll()
    d = log.write()
    clean(d)
    v = view(d)
    assert (v.offsets, v.last_offsets) == ([0, 1, 2, 3], [0, 1, 2, 3])


def test_26_uncleanable_section_untouched(log: LogBuilder) -> None:
    """Scenario 26: segments from the uncleanable offset on are byte-for-byte unchanged."""
    for i in range(70):
        log.append([kv(i % 10, i)])
        if i % 10 == 9:
            log.roll()
    d = log.write()
    later = {p.name: p.read_bytes() for p in d.glob("*.log") if int(p.name[:20]) >= 20}
    clean(d, first_uncleanable=20)
    assert {p.name: p.read_bytes() for p in d.glob("*.log") if int(p.name[:20]) >= 20} == later
    assert view(d).offsets[:11] == [*range(10, 20), 20]


def test_28_keyless_records_dropped_and_counted(log: LogBuilder) -> None:
    """Scenario 28: keyless records are dropped and counted as invalid."""
    for i in range(5):
        log.append([(None, k(i))])
    log.roll()
    keyed_start = log.next_offset
    for i in range(5):
        log.append([kv(i)])
    log.roll()
    d = log.write()
    keyed_size = (d / f"{keyed_start:020d}.log").stat().st_size
    r = clean(d)
    assert r.stats.invalid_messages_read == 5
    assert sum(p.stat().st_size for p in d.glob("*.log")) == keyed_size
    assert view(d).keys == [k(i) for i in range(5)]


def test_30_last_batch_kept_empty(log: LogBuilder) -> None:
    """Scenario 30: when every record goes, the round's last batch stays, empty."""
    log.records([kv(0), kv(1)])
    log.roll()
    log.records([kv(2), kv(3)])
    log.roll()
    log.records([(k(i), None) for i in range(4)])
    log.roll()
    log.append([kv(9)])
    d = log.write()
    two_pass(d)
    assert len(list(d.glob("*.log"))) == 2
    batches = read_batches(d)
    assert [(b.header.last_offset, len(b.records)) for b in batches] == [(7, 0), (8, 1)]


def test_40_tombstone_retention_ignores_record_timestamps(log: LogBuilder) -> None:
    """Scenario 40: the horizon comes from cleaning time, never the record's timestamp."""
    now = 10 * DAY
    log.append([kv(0)], timestamps=[now + DAY + 10_000])
    log.roll()
    d = log.write()
    clean(d, now_ms=now)
    log.segments = log.segments[-1:]
    log.append([(k(0), None)], timestamps=[now - DAY - 10_000])
    log.roll()
    log.write()
    clean(d, first_dirty=1, now_ms=now)
    assert view(d).last_offsets[0] == 1
    log.segments = log.segments[-1:]
    log.append([kv(1)])
    log.roll()
    log.write()
    clean(d, first_dirty=2, now_ms=now)
    assert read_batches(d)[0].header.last_offset == 1


def test_41_offset_gaps(log: LogBuilder) -> None:
    """Scenario 41: the round's end offset skips offset gaps up to the uncleanable base."""
    log.records([kv(i) for i in range(10)])
    log.roll(11)
    log.append([kv(11)])
    d = log.write()
    assert clean(d).end_offset == 11


def test_41_offset_gaps_across_segments(tmp_path: Path) -> None:
    """Scenario 41: gaps between several segments are covered too."""
    log = LogBuilder(tmp_path / "logs")
    log.records([kv(i) for i in range(10)])
    log.roll(15)
    log.records([kv(i) for i in range(15, 25)])
    log.roll(30)
    log.append([kv(30)])
    d = log.write()
    assert clean(d).end_offset == 30


def test_39_partial_map(log: LogBuilder) -> None:
    """Scenario 39: a 2-key map built from offset 2 stops before key 4."""
    log.records([kv(i) for i in range(5)])
    log.roll()
    log.append([kv(9)])
    d = log.write()
    m = OffsetMap(3 * 24, load_factor=0.75)
    r = clean(d, first_dirty=2, offset_map=m)
    assert m.size == 2
    got = m.get_many(np.array([hash_key(k(i)) for i in (0, 2, 3, 4)], dtype=np.uint64))[0]
    assert got.tolist() == [-1, 2, 3, -1]
    assert r.stats.map_messages_read == 4
    assert r.end_offset == 4


def test_38_map_with_large_offsets(tmp_path: Path) -> None:
    """Scenario 38: offsets far apart map exactly."""
    log = LogBuilder(tmp_path / "logs")
    log.append([kv(0)])
    log.roll(7206178)
    log.append([kv(1)])
    log.roll()
    d = log.write()
    m = OffsetMap(64 * 24)
    r = clean(d, offset_map=m)
    assert (m.latest_offset, m.size, r.end_offset) == (7206178, 2, 7206179)
    got = m.get_many(np.array([hash_key(k(0)), hash_key(k(1))], dtype=np.uint64))[0]
    assert got.tolist() == [0, 7206178]


def test_32_sparse_offsets_with_empty_segments(log: LogBuilder) -> None:
    """Scenario 32: segments 2^31 offsets apart are cleaned apart; emptied ones merge."""
    span = 2**31
    for i in range(3):
        log.append([(b"key", b"val")])
        log.append([(b"key", b"val")], offset=(i + 1) * span - 1)
        log.roll()
    log.append([(b"key", b"val")])
    d = log.write()
    first_uncleanable = 3 * span
    clean(d, first_uncleanable=first_uncleanable)
    metas = segment_metas(d)
    assert len(metas) == 4
    assert metas[0].size_bytes == 0
    clean(d, first_uncleanable=first_uncleanable)
    assert len(segment_metas(d)) == 3
    assert view(d).offsets == [3 * span - 1, 3 * span]


def test_16_large_batches(log: LogBuilder) -> None:
    """Scenario 16: 1 MiB records clean like any other (whole segments are decoded)."""
    big = bytes(1024 * 1024)
    log.records([(k(0), big), (k(1), big), (k(0), big + b"!")])
    log.roll()
    d = log.write()
    clean(d)
    assert [len(r.value or b"") for b in read_batches(d) for r in b.records] == [
        len(big),
        len(big) + 1,
    ]


def test_2_cleaned_log_is_exactly_its_batches(log: LogBuilder) -> None:
    """Scenario 2 without preallocation: cleanerd never preallocates, so the cleaned
    .log (segment.bytes 1024) holds exactly its batches, below 1024 bytes."""
    log.records([kv(0), kv(1), kv(0, 2), kv(1, 3), kv(0, 4)])
    log.roll()
    d = log.write()
    clean(d, first_dirty=2, config=CleanerConfig(segment_bytes=1024))
    first = segment_metas(d)[0]
    size = (d / f"{first.base_offset:020d}.log").stat().st_size
    assert size == sum(b.header.size_in_bytes for b in read_batches_of(d, first.base_offset))
    assert size < 1024


INT32_MAX = 2**31 - 1


def relative_spans_fit(d: Path) -> bool:
    return all(
        b.header.last_offset - m.base_offset <= INT32_MAX
        for m in segment_metas(d)
        for b in read_batches_of(d, m.base_offset)
    )


def read_batches_of(d: Path, base: int) -> list[RecordBatch]:
    data = (d / f"{base:020d}.log").read_bytes()
    return [decode_batch(data, info.position) for info in scan_batches(data)]


def sparse_log(log: LogBuilder, *, extra: bool) -> Path:
    """Scenario 33's log: a first segment of records, then records at Int.MAX - 1 and
    Int.MAX (and Int.MAX + 1 with `extra`) in a second, then an active segment."""
    log.records([kv(i) for i in range(10)])
    log.roll()
    log.append([kv(10)], offset=INT32_MAX - 1)
    log.append([kv(11)])
    if extra:
        log.append([kv(12)])
    log.roll()
    log.append([kv(13)])
    return log.write()


def test_33_sparse_offsets_one_group(log: LogBuilder) -> None:
    """Scenario 33: records up to Int.MAX in the second segment still group with the
    first: the pass writes one cleaned segment, every record kept."""
    d = sparse_log(log, extra=False)
    before = view(d)
    clean(d)
    assert [m.base_offset for m in segment_metas(d)] == [0, INT32_MAX + 1]
    assert view(d) == before
    assert relative_spans_fit(d)


def test_33_sparse_offsets_past_int_max_two_groups(tmp_path: Path) -> None:
    """Scenario 33: one more record past Int.MAX makes two groups (the estimate of the
    second segment's last offset crosses the span), each within the int32 range."""
    d = sparse_log(LogBuilder(tmp_path / "logs"), extra=True)
    before = view(d)
    clean(d)
    assert [m.base_offset for m in segment_metas(d)] == [0, 10, INT32_MAX + 2]
    assert view(d).offsets == before.offsets
    assert relative_spans_fit(d)


def test_34_stale_index_does_not_drive_grouping(tmp_path: Path) -> None:
    """Scenario 34: with no index entries (interval 400), the grouping estimates a
    segment's last offset from the next base, so the segment rolled at Int.MAX/2 holding
    Int.MAX + 1 is cleaned on its own: 2 groups, not a split output."""
    log = LogBuilder(tmp_path / "logs", index_interval=400)
    log.records([kv(0), kv(1)])
    log.roll(INT32_MAX // 2)
    log.append([kv(2)])
    log.append([kv(3)], offset=INT32_MAX + 1)
    log.roll()
    log.append([kv(4)])
    d = log.write()
    before = view(d)
    clean(d, config=CleanerConfig(index_interval_bytes=400, producer_id_expiration_ms=LONG_MAX))
    assert [m.base_offset for m in segment_metas(d)] == [0, INT32_MAX // 2, INT32_MAX + 2]
    assert view(d) == before
    assert relative_spans_fit(d)


def test_35_offset_map_ranges(tmp_path: Path) -> None:
    """Scenario 35: for the ranges [0, seg1), [seg1, seg3), [seg3, active base) the map
    holds exactly the keys in range at their offsets, ends at the range end, misses the
    keys just outside and counts the range's records as read."""
    log = LogBuilder(tmp_path / "template" / "logs")
    for i in range(500):
        log.append([kv(i)])
        if i % 100 == 99:
            log.roll()
    log.append([kv(500)])
    template = log.write().parent
    bases = [0, 100, 200, 300, 400, 500]
    for start, end in [(0, bases[1]), (bases[1], bases[3]), (bases[3], bases[5])]:
        root = tmp_path / f"range-{start}"
        shutil.copytree(template, root)
        m = OffsetMap(2048 * 24)
        r = clean(root / "t-0", first_dirty=start, first_uncleanable=end, offset_map=m)
        assert (m.size, m.latest_offset + 1, r.end_offset) == (end - start, end, end)
        inside = np.array([hash_key(k(i)) for i in range(start, end)], dtype=np.uint64)
        assert m.get_many(inside)[0].tolist() == list(range(start, end))
        outside = [hash_key(k(i)) for i in (start - 1, end) if i >= 0]
        assert m.get_many(np.array(outside, dtype=np.uint64))[0].tolist() == [-1] * len(outside)
        assert r.stats.map_messages_read == end - start


def test_42_retention_during_swap_is_serialised(tmp_path: Path) -> None:
    """Scenario 42: retention that takes the partition lock just before the swap (log
    start moved to the active base) renames each old segment to `.deleted` once. Kafka
    then swaps the cleaned segment in anyway, below the new log start; cleanerd's pass
    proves its sources under the lock first (`SwapProof`), finds them gone, removes its
    output and changes nothing more: only the active segment remains."""
    log = LogBuilder(tmp_path / "logs")
    for i in range(6):
        log.append([kv(i % 2, i)])
        if i in (2, 4):
            log.roll()
    d = log.write()
    plog = PartitionLog.open(d, state_dir=tmp_path / "state")
    active = plog.segments[-1].base_offset
    deleted: list[Path] = []

    class RetentionAtSwap:
        """The partition lock, taken first by retention when the swap wants it."""

        entries = 0

        def __enter__(self) -> None:
            self.entries += 1
            if self.entries == 1:
                deleted.extend(plog.delete_segments(plog.segments[:-1], reason="retention"))
            plog.lock.acquire()

        def __exit__(self, *exc: object) -> None:
            plog.lock.release()

    with pytest.raises(SegmentsChanged, match="removed"):
        Cleaner(OffsetMap(1024 * 24)).clean(
            log_dir=d.parent,
            tp=TP,
            segments=segment_metas(d),
            first_dirty=0,
            first_uncleanable=active,
            now_ms=T,
            config=CleanerConfig(producer_id_expiration_ms=LONG_MAX),
            swap_lock=RetentionAtSwap(),
        )
    names = sorted(p.name for p in d.iterdir())
    assert [n for n in names if n.endswith(".log")] == [f"{active:020d}.log"]
    assert sorted(p.name for p in deleted).count(f"{0:020d}.log.deleted") == 1
    assert not any(n.endswith((".deleted.deleted", ".cleaned", ".swap")) for n in names)
    plog.refresh()
    assert plog.log_start_offset == active
