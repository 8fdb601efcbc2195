"""Property tests of the pass over random logs: winners survive, losers and expired
tombstones go, offsets increase, and every batch reads back in aiokafka with a valid CRC."""

from __future__ import annotations

import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

from aiokafka.record.memory_records import MemoryRecords
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cleanerd.compaction import cleaner, offset_map, producers
from cleanerd.compaction.cleaner import CleanerConfig
from cleanerd.compaction.strategy import CompactionStrategy, resolve_strategy
from cleanerd.records.header import Compression
from cleanerd.records.record import RecordHeader
from tests.compaction.conftest import (
    DAY,
    LONG_MAX,
    LogBuilder,
    active_base,
    clean,
    read_batches,
    segment_metas,
)

NOW = 1_700_000_000_000
HEADER = "v"


@dataclass(frozen=True)
class Rec:
    offset: int
    key: bytes
    value: bytes | None
    timestamp: int
    version: bytes | None  # the raw header value, None when absent


def version_of(strategy: CompactionStrategy, r: Rec) -> tuple[bool, int]:
    if strategy is CompactionStrategy.TIMESTAMP:
        return True, r.timestamp
    if r.version is not None and len(r.version) == 8:
        return True, struct.unpack(">q", r.version)[0]
    return False, 0


def winner(strategy: CompactionStrategy, recs: list[Rec]) -> Rec:
    if strategy is CompactionStrategy.OFFSET:
        return max(recs, key=lambda r: r.offset)
    return max(recs, key=lambda r: (*version_of(strategy, r), r.offset))


record_st = st.tuples(
    st.integers(0, 7),  # key
    st.one_of(st.none(), st.binary(min_size=0, max_size=6)),  # value (None = tombstone)
    st.integers(0, 5),  # timestamp step
    st.one_of(st.none(), st.integers(-3, 3).map(lambda v: struct.pack(">q", v)), st.just(b"\x01")),
)
batch_st = st.tuples(
    st.lists(record_st, min_size=1, max_size=4),
    st.sampled_from(list(Compression)),
    st.booleans(),  # roll after
    st.sampled_from([-1, 7]),  # producer id
)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    batches=st.lists(batch_st, min_size=1, max_size=14),
    strategy=st.sampled_from(list(CompactionStrategy)),
    slots=st.integers(3, 40),
    segment_bytes=st.sampled_from([200, 600, 1 << 20]),
)
def test_cleaning_until_stable_keeps_exactly_the_winners(
    batches: list[Batch],
    strategy: CompactionStrategy,
    slots: int,
    segment_bytes: int,
) -> None:
    """Cleaning until nothing changes keeps each key's winner and nothing else of it."""
    root = Path(tempfile.mkdtemp())
    try:
        _check(root, batches, strategy, slots, segment_bytes)
    finally:
        shutil.rmtree(root)


RecordSpec = tuple[int, bytes | None, int, bytes | None]
Batch = tuple[list[RecordSpec], Compression, bool, int]


def _append(
    log: LogBuilder, recs: list[RecordSpec], codec: Compression, pid: int, ts: int
) -> tuple[int, list[int]]:
    """Append one batch of `recs`, their timestamps stepping on from `ts`: (its base
    offset, the timestamps)."""
    kvs, stamps, hdrs = [], [], []
    for key, value, step, version in recs:
        ts += step
        kvs.append((str(key).encode(), value))
        stamps.append(ts)
        hdrs.append(() if version is None else (RecordHeader(HEADER, version),))
    base, _ = log.append(kvs, codec=codec, timestamps=stamps, headers=hdrs, pid=pid)
    return base, stamps


def _check(
    root: Path, batches: list[Batch], strategy: CompactionStrategy, slots: int, segment_bytes: int
) -> None:
    log = LogBuilder(root / "logs")
    originals: list[Rec] = []
    ts = NOW - 1000
    for recs, codec, roll, pid in batches:
        base, stamps = _append(log, recs, codec, pid, ts)
        ts = stamps[-1]
        for i, (key, value, _, version) in enumerate(recs):
            originals.append(Rec(base + i, str(key).encode(), value, stamps[i], version))
        if roll:
            log.roll()
    log.roll()
    d = log.write()
    end = active_base(d)
    cfg = CleanerConfig(
        segment_bytes=segment_bytes,
        producer_id_expiration_ms=LONG_MAX,
        strategy=resolve_strategy(strategy.value, HEADER),
    )
    dirty = 0
    for _ in range(100):
        dirty = clean(d, first_dirty=dirty, slots=slots, now_ms=NOW, config=cfg).end_offset
        if dirty >= end:
            break
    assert dirty == end
    clean(d, first_dirty=end, slots=slots, now_ms=NOW + DAY + 1, config=cfg)

    by_key: dict[bytes, list[Rec]] = {}
    for r in originals:
        by_key.setdefault(r.key, []).append(r)
    expected: dict[int, tuple[bytes | None, bytes | None]] = {}
    for key_bytes, versions in by_key.items():
        w = winner(strategy, versions)
        if w.value is not None:
            expected[w.offset] = (key_bytes, w.value)

    got: dict[int, tuple[bytes | None, bytes | None]] = {}
    last = -1
    batches_read = read_batches(d)
    for b in batches_read:
        assert b.header.base_offset > last
        last = b.header.last_offset
        for record in b.records:
            assert record.offset <= last
            got[record.offset] = (record.key, record.value)
    assert got == expected
    assert last == end - 1  # the round's last offset slot is kept
    _check_aiokafka(d)
    assert segment_metas(d)[0].base_offset == 0


def _check_aiokafka(d: Path) -> None:
    for path in sorted(d.glob("*.log")):
        data = path.read_bytes()
        records = MemoryRecords(data)
        while records.has_next():
            batch = records.next_batch()
            assert batch is not None
            assert batch.validate_crc()
            for _ in batch:
                pass


txn_op_st = st.one_of(
    st.tuples(st.just("data"), st.integers(0, 5), st.booleans(), st.sampled_from([-1, 1, 2])),
    st.tuples(st.just("commit"), st.integers(1, 2)),
    st.tuples(st.just("abort"), st.integers(1, 2)),
    st.tuples(st.just("roll"), st.just(0)),
)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(ops=st.lists(txn_op_st, min_size=1, max_size=25), slots=st.integers(3, 30))
def test_transactions_aborted_data_goes_committed_winners_stay(
    ops: list[tuple[object, ...]], slots: int
) -> None:
    """With random transactions, cleaning keeps exactly the latest non-aborted value per
    key, and no record of an aborted transaction."""
    root = Path(tempfile.mkdtemp())
    try:
        _check_transactions(root, ops, slots)
    finally:
        shutil.rmtree(root)


def _check_transactions(root: Path, ops: list[tuple[object, ...]], slots: int) -> None:
    log = LogBuilder(root / "logs")
    live: list[tuple[int, bytes, bytes | None]] = []  # (offset, key, value) not aborted
    open_txn: dict[int, list[tuple[int, bytes, bytes | None]]] = {}
    for op in ops:
        if op[0] == "data":
            _, key, tombstone, pid = op
            assert isinstance(key, int)
            assert isinstance(pid, int)
            kv = (str(key).encode(), None if tombstone else b"v%d" % log.next_offset)
            offset, _ = log.append([kv], pid=pid, txn=pid > 0)
            entry = (offset, kv[0], kv[1])
            (open_txn.setdefault(pid, []) if pid > 0 else live).append(entry)
        elif op[0] in ("commit", "abort"):
            pid = op[1]
            assert isinstance(pid, int)
            if pid not in open_txn:
                continue
            data = open_txn.pop(pid)
            if op[0] == "commit":
                log.commit(pid)
                live.extend(data)
            else:
                log.abort(pid)
        else:
            log.roll()
    for pid in sorted(open_txn):  # close what is open, so the whole log is stable
        log.commit(pid)
        live.extend(open_txn.pop(pid))
    log.roll()
    d = log.write()
    end = active_base(d)
    cfg = CleanerConfig(producer_id_expiration_ms=LONG_MAX)
    dirty = 0
    for _ in range(100):
        dirty = clean(d, first_dirty=dirty, slots=slots, now_ms=NOW, config=cfg).end_offset
        if dirty >= end:
            break
    clean(d, first_dirty=end, slots=slots, now_ms=NOW + DAY + 1, config=cfg)

    latest: dict[bytes, tuple[int, bytes | None]] = {}
    for offset, key, value in sorted(live):
        latest[key] = (offset, value)
    expected = {o: (k, v) for k, (o, v) in latest.items() if v is not None}
    got = {
        r.offset: (r.key, r.value)
        for b in read_batches(d)
        if not b.header.is_control
        for r in b.records
    }
    assert got == expected
    _check_aiokafka(d)


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()
    }


def _build(root: Path, batches: list[Batch], txn_ops: list[tuple[object, ...]]) -> Path:
    """A log of `batches` (as in the winners test) with `txn_ops`' transactions between
    them, every transaction closed."""
    log = LogBuilder(root / "logs")
    ts = NOW - 1000
    ops = iter(txn_ops)
    open_txn: set[int] = set()
    for recs, codec, roll, pid in batches:
        ts = _append(log, recs, codec, pid, ts)[1][-1]
        op = next(ops, None)
        if op is not None and op[0] == "data":
            _, txn_key, tombstone, data_pid = op
            assert isinstance(data_pid, int)
            value = None if tombstone else b"t%d" % log.next_offset
            log.append([(str(txn_key).encode(), value)], pid=data_pid, txn=data_pid > 0)
            if data_pid > 0:
                open_txn.add(data_pid)
        elif op is not None and op[0] in ("commit", "abort") and op[1] in open_txn:
            end_pid = op[1]
            assert isinstance(end_pid, int)
            (log.commit if op[0] == "commit" else log.abort)(end_pid)
            open_txn.discard(end_pid)
        if roll:
            log.roll()
    for txn_pid in sorted(open_txn):
        log.commit(txn_pid)
    log.roll()
    return log.write()


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    batches=st.lists(batch_st, min_size=1, max_size=14),
    txn_ops=st.lists(txn_op_st, max_size=14),
    strategy=st.sampled_from(list(CompactionStrategy)),
    slots=st.integers(3, 40),
    window=st.one_of(st.just(1), st.integers(1, 300)),
    fold_rows=st.integers(1, 4),
    first_slots=st.sampled_from([offset_map.FIRST_ACTIVE_SLOTS, 2, 5]),
)
def test_a_segment_cleaned_in_windows_gives_the_same_files(
    batches: list[Batch],
    txn_ops: list[tuple[object, ...]],
    strategy: CompactionStrategy,
    slots: int,
    window: int,
    fold_rows: int,
    first_slots: int,
) -> None:
    """Decoding each segment `window` bytes at a time (whole batches; a bigger batch
    alone) and folding producer state every `fold_rows` batches, pass after pass (maps
    that fill mid-window, transactions across windows, mixed codecs, every strategy),
    with a map whose slots grow from `first_slots` as keys come, writes byte for byte
    the files and checkpoint that whole segments do."""
    root = Path(tempfile.mkdtemp())
    try:
        d = _build(root / "whole", batches, txn_ops)
        shutil.copytree(root / "whole", root / "windows")
        windowed = root / "windows" / d.relative_to(root / "whole")
        cfg = CleanerConfig(
            segment_bytes=600,
            producer_id_expiration_ms=LONG_MAX,
            strategy=resolve_strategy(strategy.value, HEADER),
        )
        end = active_base(d)
        dirty = 0
        for now in (NOW, NOW, NOW, NOW + DAY + 1):
            whole = clean(d, first_dirty=dirty, slots=slots, now_ms=now, config=cfg)
            with (
                mock.patch.object(cleaner, "DECODE_WINDOW_BYTES", window),
                mock.patch.object(producers, "FOLD_ROWS", fold_rows),
                mock.patch.object(offset_map, "FIRST_ACTIVE_SLOTS", first_slots),
            ):
                parts = clean(windowed, first_dirty=dirty, slots=slots, now_ms=now, config=cfg)
            assert (parts.end_offset, parts.stats.messages_read, parts.stats.messages_written) == (
                whole.end_offset,
                whole.stats.messages_read,
                whole.stats.messages_written,
            )
            assert _files(root / "windows") == _files(root / "whole")
            dirty = min(whole.end_offset, end)
    finally:
        shutil.rmtree(root)
