"""Tests of cleanerd.compaction.audit: superseded records, their ages and violations."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.compaction import audit as audit_module
from cleanerd.compaction.audit import (
    NEVER,
    AuditColumns,
    audit_columns,
    audit_partition,
    superseded_at,
)
from cleanerd.compaction.strategy import resolve_strategy
from cleanerd.config import BrokerConfig
from cleanerd.errors import CorruptRecordError, FileChangedError
from cleanerd.log.partition_log import PartitionLog
from cleanerd.log.segment import LogSegment
from cleanerd.log.topic_config import TopicConfig
from cleanerd.records.columns import segment_columns
from cleanerd.records.header import Compression
from cleanerd.records.record import RecordHeader
from cleanerd.records.walker import walk
from tests.builders import control_bit_on_first_batch, set_base_offset
from tests.compaction.conftest import LogBuilder, k

NOW = 1_700_000_000_000
MIN = 60_000
LONG_MAX = 2**63 - 1


def topic(**overrides: Any) -> TopicConfig:
    base = dataclasses.replace(
        BrokerConfig().topic_defaults(), cleanup_policy=("compact",), max_compaction_lag_ms=10 * MIN
    )
    return dataclasses.replace(base, **overrides)


def columns(
    keys: list[int],
    timestamps: list[int],
    versions: list[int | None] | None = None,
    **extra: Any,
) -> AuditColumns:
    n = len(keys)
    v = versions if versions is not None else [None] * n
    fields: dict[str, Any] = {
        "hash_hi": np.zeros(n, np.uint64),
        "hash_lo": np.array(keys, np.uint64),
        "offset": np.arange(n, dtype=np.int64),
        "timestamp": np.array(timestamps, np.int64),
        "version": np.array([0 if x is None else x for x in v], np.int64),
        "has_version": np.array([x is not None for x in v], np.bool_),
        "size": np.full(n, 10, np.int64),
        "tombstone": np.zeros(n, np.bool_),
        "horizon": np.full(n, NEVER, np.int64),
        "marker_horizon": np.zeros(0, np.int64),
        "keyless_count": np.zeros(0, np.int64),
        "keyless_first": np.zeros(0, np.int64),
    }
    fields.update(extra)
    return AuditColumns(**fields)


def oracle(
    keys: list[int], ts: list[int], versions: list[int | None], versioned: bool
) -> tuple[list[bool], list[int]]:
    """O(n^2) reference: winners and superseded_at straight from the definition."""

    def rank(i: int) -> tuple[int, ...]:
        if not versioned:
            return (i,)
        v = versions[i]
        return (v is not None, v if v is not None else 0, i)

    winners, times = [], []
    for r in range(len(keys)):
        beaters = [s for s in range(len(keys)) if keys[s] == keys[r] and rank(s) > rank(r)]
        winners.append(not beaters)
        at = NEVER
        for s in beaters:
            t = ts[s] if s > r else ts[r]
            if t >= 0:
                at = min(at, t)
        times.append(NEVER if not beaters else at)
    return winners, times


@settings(max_examples=200, deadline=None)
@given(
    st.data(),
    st.integers(1, 40),
    st.booleans(),
)
def test_superseded_at_matches_definition(data: st.DataObject, n: int, versioned: bool) -> None:
    """Winners and supersession times equal a brute-force evaluation of the definition,
    for the offset strategy and for versioned ones (older offsets may win)."""
    keys = data.draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    ts = data.draw(st.lists(st.integers(-1, 50), min_size=n, max_size=n))
    vs = data.draw(st.lists(st.one_of(st.none(), st.integers(-3, 3)), min_size=n, max_size=n))
    winner, at = superseded_at(columns(keys, ts, vs), versioned=versioned)
    want_winner, want_at = oracle(keys, ts, vs, versioned)
    assert winner.tolist() == want_winner
    assert at.tolist() == want_at


def test_ages_and_violations_from_superseding_timestamps() -> None:
    """A record is superseded when the next record of its key is written; ages and the
    lag + slack cutoff follow from that time; unknown times are never violations."""
    keys = [1, 2, 1, 2, 1, 3, 3]
    ts = [NOW - 100 * MIN, NOW - 90 * MIN, NOW - 30 * MIN, NOW - 12 * MIN, NOW - 5, -1, -1]
    r = audit_columns(
        columns(keys, ts),
        versioned=False,
        now_ms=NOW,
        max_compaction_lag_ms=10 * MIN,
        slack_ms=5 * MIN,
        max_listed=1,
    )
    assert (r.records, r.keys, r.superseded) == (7, 3, 4)
    assert r.superseded_bytes == 40
    assert r.superseded_unknown_age == 1
    assert r.oldest_superseded_age_ms == 30 * MIN
    # offset 0 superseded at -30 min, offset 1 at -12 min: both past 15 minutes
    assert r.violations == 1
    assert [v.offset for v in r.listed_violations] == [0]
    assert r.listed_violations[0].age_ms == 30 * MIN
    no_lag = audit_columns(
        columns(keys, ts), versioned=False, now_ms=NOW, max_compaction_lag_ms=LONG_MAX, slack_ms=0
    )
    assert no_lag.violations == 0
    assert no_lag.superseded == 4


def test_tombstones_and_markers_past_horizon() -> None:
    """Tombstones and markers whose horizon has passed are counted with the oldest."""
    cols = columns(
        [1, 2, 3],
        [NOW] * 3,
        tombstone=np.array([True, True, False]),
        horizon=np.array([NOW - 7, NOW + 1, NOW - 100], np.int64),
        marker_horizon=np.array([NOW - 3, NOW + 3], np.int64),
    )
    r = audit_columns(cols, versioned=False, now_ms=NOW, max_compaction_lag_ms=MIN, slack_ms=0)
    assert (r.tombstones, r.tombstones_past_horizon, r.oldest_tombstone_overdue_ms) == (2, 1, 7)
    assert (r.markers_past_horizon, r.oldest_marker_overdue_ms) == (1, 3)


def test_empty_partition() -> None:
    """No records: nothing superseded, nothing late."""
    r = audit_columns(
        AuditColumns.empty(), versioned=True, now_ms=NOW, max_compaction_lag_ms=1, slack_ms=0
    )
    assert (r.records, r.superseded, r.violations, r.oldest_superseded_age_ms) == (0, 0, 0, None)


def open_log(log: LogBuilder) -> PartitionLog:
    return PartitionLog.open(log.write(), read_only=True)


def test_real_log_offset_strategy_with_compression(tmp_path: Path) -> None:
    """Keys in plain and compressed batches are grouped across segments; the late value is a
    violation, the fresh one is not."""
    log = LogBuilder(tmp_path / "logs")
    log.append([(k("a"), b"1"), (k("b"), b"1")], timestamps=[NOW - 60 * MIN] * 2)
    log.roll()
    log.append([(k("a"), b"2")], timestamps=[NOW - 30 * MIN], codec=Compression.LZ4)
    log.append([(k("b"), None)], timestamps=[NOW - MIN], codec=Compression.GZIP)
    audit = audit_partition(open_log(log), topic(), now_ms=NOW, slack_ms=5 * MIN)
    assert audit.error is None
    r = audit.result
    assert r is not None
    assert (r.records, r.keys, r.superseded, r.violations) == (4, 2, 2, 1)
    assert [v.offset for v in r.listed_violations] == [0]
    assert r.tombstones == 1
    assert audit.strategy == "offset"
    assert audit.to_json()["violations"] == 1


def test_timestamp_strategy_older_offset_wins(tmp_path: Path) -> None:
    """Under the timestamp strategy a later record with an older timestamp is superseded
    from the moment it is written."""
    log = LogBuilder(tmp_path / "logs")
    log.append([(k("a"), b"new")], timestamps=[NOW - 10 * MIN])
    log.append([(k("a"), b"stale")], timestamps=[NOW - 40 * MIN])
    audit = audit_partition(
        open_log(log), topic(compaction_strategy="timestamp"), now_ms=NOW, slack_ms=0
    )
    r = audit.result
    assert r is not None
    assert r.superseded == 1
    assert [(v.offset, v.superseded_at_ms) for v in r.listed_violations] == [(1, NOW - 40 * MIN)]


def test_header_strategy(tmp_path: Path) -> None:
    """Under the header strategy the highest 8-byte version wins; a record without it
    loses to one with it."""
    log = LogBuilder(tmp_path / "logs")
    v = [
        (RecordHeader("v", (5).to_bytes(8, "big")),),
        (RecordHeader("v", (3).to_bytes(8, "big")),),
        (),
    ]
    log.append(
        [(k("a"), b"x"), (k("a"), b"y"), (k("a"), b"z")],
        timestamps=[NOW - 50 * MIN, NOW - 40 * MIN, NOW - 30 * MIN],
        headers=v,
        codec=Compression.SNAPPY,
    )
    cfg = topic(compaction_strategy="header", compaction_strategy_header="v")
    r = audit_partition(open_log(log), cfg, now_ms=NOW, slack_ms=0).result
    assert r is not None
    assert (r.keys, r.superseded) == (1, 2)
    assert sorted(v.offset for v in r.listed_violations) == [1, 2]


def test_aborted_and_open_transactions_are_not_candidates(tmp_path: Path) -> None:
    """Aborted data never supersedes anything; records above the last stable offset (an
    open transaction) are left out."""
    log = LogBuilder(tmp_path / "logs")
    log.append([(k("a"), b"1")], timestamps=[NOW - 60 * MIN])
    log.append([(k("a"), b"aborted")], pid=7, txn=True, timestamps=[NOW - 50 * MIN])
    log.abort(7)
    log.append([(k("b"), b"1")], timestamps=[NOW - 60 * MIN])
    log.append([(k("b"), b"open")], pid=8, txn=True, timestamps=[NOW - 50 * MIN])
    r = audit_partition(open_log(log), topic(), now_ms=NOW, slack_ms=0).result
    assert r is not None
    assert (r.records, r.superseded) == (2, 0)


def test_corrupt_segment_is_reported(tmp_path: Path) -> None:
    """A bad CRC makes the partition unauditable, with the file named."""
    log = LogBuilder(tmp_path / "logs")
    log.append([(k("a"), b"1")])
    log.roll()
    log.append([(k("a"), b"2")])
    d = log.write()
    first = d / "00000000000000000000.log"
    data = bytearray(first.read_bytes())
    data[-1] ^= 0xFF
    first.write_bytes(bytes(data))
    audit = audit_partition(PartitionLog.open(d, read_only=True), topic(), now_ms=NOW, slack_ms=0)
    assert audit.result is None
    assert audit.error is not None
    assert str(first) in audit.error
    assert audit.violations == 0


def test_audit_columns_build_covers_every_field() -> None:
    """`AuditColumns.build` (what the local scan and the Spark audit job both build
    with) fills every field with its dtype, and joins the keyless counts of the ranges
    read into one."""
    built = AuditColumns.build(lambda _name, dtype: (np.arange(2) + 3).astype(dtype))
    for f in dataclasses.fields(AuditColumns):
        if f.name not in ("keyless_count", "keyless_first"):
            assert len(getattr(built, f.name)) == 2, f.name
    assert built.hash_hi.dtype == np.uint64
    assert built.tombstone.dtype == np.bool_
    assert (built.keyless_count.tolist(), built.keyless_first.tolist()) == ([7], [3])


def test_segment_deleted_by_a_live_broker_after_the_listing_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Observe mode: a broker deletes the oldest segment (retention) between the
    partition's listing and the read of its records; the audit lists the partition
    again and audits what is there, not a FileNotFoundError."""
    log = LogBuilder(tmp_path / "logs")
    log.append([(k("a"), b"1")], timestamps=[NOW - 60 * MIN])
    log.roll()
    log.append([(k("a"), b"2"), (k("a"), b"3")], timestamps=[NOW - 30 * MIN] * 2)
    plog = open_log(log)
    read = audit_module.read_audit_columns
    calls: list[int] = []

    def broker_deletes_first(segments: Sequence[LogSegment], **kw: Any) -> AuditColumns:
        if not calls:
            for path in segments[0].paths:
                path.unlink(missing_ok=True)
        calls.append(len(segments))
        return read(segments, **kw)

    monkeypatch.setattr(audit_module, "read_audit_columns", broker_deletes_first)
    audit = audit_partition(plog, topic(), now_ms=NOW, slack_ms=0)
    assert calls == [2, 1]
    assert audit.error is None
    assert audit.result is not None
    assert (audit.result.records, audit.result.superseded) == (2, 1)


def test_a_partition_a_broker_keeps_changing_is_read_again_past_three_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Observe mode, a busy broker: the read meets a swap four times in a row. The audit
    goes on listing and reading (CHANGED_READ_SECONDS) and audits what is there; a
    count of three reads gave up with an error here."""
    log = LogBuilder(tmp_path / "logs")
    log.append([(k("a"), b"1"), (k("a"), b"2")], timestamps=[NOW - 60 * MIN] * 2)
    plog = open_log(log)
    read = audit_module.read_audit_columns
    calls: list[int] = []

    def swapped_four_times(segments: Sequence[LogSegment], **kw: Any) -> AuditColumns:
        calls.append(len(segments))
        if len(calls) <= 4:
            raise FileChangedError("now another file", path=segments[0].log_path)
        return read(segments, **kw)

    monkeypatch.setattr(audit_module, "read_audit_columns", swapped_four_times)
    audit = audit_partition(plog, topic(), now_ms=NOW, slack_ms=0)
    assert len(calls) == 5
    assert audit.error is None
    assert audit.result is not None
    assert (audit.result.records, audit.result.superseded) == (2, 1)


def test_a_change_is_not_read_again_in_an_owned_dir_or_a_deleted_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dir this process owns has no other writer, and a deleted partition dir no
    files to read: the first change is the audit's error, with no read after it."""
    log = LogBuilder(tmp_path / "logs")
    log.append([(k("a"), b"1")], timestamps=[NOW - 60 * MIN])
    d = log.write()
    calls: list[int] = []

    def changed(segments: Sequence[LogSegment], **kw: Any) -> AuditColumns:
        calls.append(len(segments))
        raise FileChangedError("now another file", path=segments[0].log_path)

    monkeypatch.setattr(audit_module, "read_audit_columns", changed)
    owned = audit_partition(PartitionLog.open(d), topic(), now_ms=NOW, slack_ms=0)
    assert calls == [1]
    assert owned.error is not None
    assert "changed by another process while read" in owned.error

    observed = PartitionLog.open(d, read_only=True)
    calls.clear()

    def deleted(segments: Sequence[LogSegment], **kw: Any) -> AuditColumns:
        calls.append(len(segments))
        for path in sorted(d.iterdir()):
            path.unlink()
        d.rmdir()
        raise FileNotFoundError(2, "No such file or directory", str(segments[0].log_path))

    monkeypatch.setattr(audit_module, "read_audit_columns", deleted)
    gone = audit_partition(observed, topic(), now_ms=NOW, slack_ms=0)
    assert calls == [1]
    assert gone.error is not None
    assert "No such file or directory" in gone.error


def many_small_segments(root: Path) -> PartitionLog:
    """A quiet partition rolled often: eight small segments, with compressed batches, a
    transaction aborted across a roll and a committed one, and tombstones."""
    log = LogBuilder(root)
    for i in range(8):
        log.append([(k("a"), b"%d" % i), (k(f"k{i}"), b"x")], timestamps=[NOW - (60 - i) * MIN] * 2)
        if i == 2:
            log.append([(k("a"), b"aborted")], pid=7, txn=True, timestamps=[NOW - 50 * MIN])
        if i == 3:
            log.abort(7)
            log.append([(k("b"), b"1")], codec=Compression.LZ4, timestamps=[NOW - 40 * MIN])
        if i == 5:
            log.append([(k("b"), b"2")], pid=8, txn=True, timestamps=[NOW - 30 * MIN])
            log.commit(8)
            log.append([(k("k1"), None)], codec=Compression.ZSTD, timestamps=[NOW - 20 * MIN])
        log.roll()
    return open_log(log)


def read_columns(plog: PartitionLog) -> AuditColumns:
    scope = audit_module.audit_scope(plog)
    return audit_module.read_audit_columns(
        plog.segments,
        strategy=resolve_strategy("offset", ""),
        stable_offset=scope.stable_offset,
        aborted=scope.aborted,
    )


def counting_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the byte length of every buffer the audit decodes."""
    decode = segment_columns
    sizes: list[int] = []

    def counted(buf: Any, *, start: int = 0, end: int | None = None, **kw: Any) -> Any:
        sizes.append((len(buf) if end is None else end) - start)
        return decode(buf, start=start, end=end, **kw)

    monkeypatch.setattr(audit_module, "segment_columns", counted)
    return sizes


def assert_same_columns(a: AuditColumns, b: AuditColumns) -> None:
    for f in dataclasses.fields(AuditColumns):
        np.testing.assert_array_equal(getattr(a, f.name), getattr(b, f.name), err_msg=f.name)


def test_small_segments_are_decoded_in_one_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition of small segments is decoded in one call over their bytes joined, and
    gives the very rows of a decode of one segment at a time (the aborted transaction's
    tracker carried across segments as before)."""
    plog = many_small_segments(tmp_path / "logs")
    sizes = counting_decodes(monkeypatch)
    joined = read_columns(plog)
    assert sizes == [sum(s.size for s in plog.segments if s.size)]
    monkeypatch.setattr(audit_module, "SMALL_SEGMENT_BYTES", -1)
    sizes.clear()
    singly = read_columns(plog)
    assert len(sizes) == len(plog.segments)
    assert_same_columns(joined, singly)
    assert len(joined) == 19  # 16 plain, 2 of b, 1 tombstone; the aborted one is not
    assert joined.tombstone.sum() == 1


def test_joined_reads_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No call decodes more than JOINED_READ_BYTES of small segments, and a segment above
    SMALL_SEGMENT_BYTES is decoded alone, between runs of small ones."""
    plog = many_small_segments(tmp_path / "logs")
    segment_sizes = [s.size for s in plog.segments]
    expected = read_columns(plog)
    sizes = counting_decodes(monkeypatch)
    monkeypatch.setattr(audit_module, "JOINED_READ_BYTES", 3 * max(segment_sizes))
    monkeypatch.setattr(audit_module, "SMALL_SEGMENT_BYTES", sorted(segment_sizes)[-2])
    assert_same_columns(read_columns(plog), expected)
    assert max(sizes) <= 3 * max(segment_sizes)
    assert sum(sizes) == sum(segment_sizes)
    assert max(segment_sizes) in sizes  # alone
    assert 1 < len(sizes) < len(segment_sizes)
    assert segment_sizes.index(max(segment_sizes)) > 0  # with small ones on both sides


def test_a_big_segment_is_decoded_a_window_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segment above DECODE_WINDOW_BYTES is decoded in windows of whole batches (the
    transaction tracker carried across them), giving the rows of one decode."""
    plog = many_small_segments(tmp_path / "logs")
    monkeypatch.setattr(audit_module, "SMALL_SEGMENT_BYTES", -1)
    expected = read_columns(plog)
    sizes = counting_decodes(monkeypatch)
    window = 150
    monkeypatch.setattr(audit_module, "DECODE_WINDOW_BYTES", window)
    assert_same_columns(read_columns(plog), expected)
    assert max(sizes) <= window
    assert len(sizes) > len(plog.segments)
    assert sum(sizes) == sum(s.size for s in plog.segments)


def test_corrupt_small_segment_is_named_with_its_position(tmp_path: Path) -> None:
    """A bad CRC in the fourth of eight small segments: the error names that file and the
    batch's position in it, not a position in the joined bytes."""
    plog = many_small_segments(tmp_path / "logs")
    fourth = plog.segments[3]
    data = bytearray(fourth.log_path.read_bytes())
    last_batch = int(walk(bytes(data)).table.position[-1])
    data[-1] ^= 0xFF
    fourth.log_path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError) as caught:
        read_columns(plog)
    assert caught.value.path == str(fourth.log_path)
    assert caught.value.position == last_batch
    assert "CRC" in str(caught.value)


def test_a_data_batch_flagged_control_is_named_without_transactions(tmp_path: Path) -> None:
    """A CRC-valid batch whose attributes say control but whose record is data, in a
    partition with no transaction (no tracker): damage named with its file and position.
    Before, the audit read no control record there and silently left its records out."""
    log = LogBuilder(tmp_path / "logs")
    for i in range(4):
        log.append([(k(f"k{i % 2}"), b"v")], timestamps=[NOW - (60 - i) * MIN])
        log.roll()
    plog = open_log(log)
    third = plog.segments[2]
    control_bit_on_first_batch(third.log_path)
    with pytest.raises(CorruptRecordError, match="control record has a") as caught:
        read_columns(plog)
    assert (caught.value.path, caught.value.position) == (str(third.log_path), 0)


def test_a_damaged_base_offset_in_a_small_segment_is_named(tmp_path: Path) -> None:
    """A base offset no CRC covers, below its batch's predecessor in the fourth of eight
    small segments read joined: the error names that file and the batch's position."""
    plog = many_small_segments(tmp_path / "logs")
    fourth = plog.segments[3]
    position = set_base_offset(fourth.log_path, -1, fourth.base_offset)
    with pytest.raises(CorruptRecordError) as caught:
        read_columns(plog)
    assert caught.value.path == str(fourth.log_path)
    assert caught.value.position == position
    assert "is not above the previous batch's last offset" in str(caught.value)


def test_scope_reads_no_closed_segments_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The audit's scope (the segments and the last stable offset) reads no segment's
    metadata: the decode reads each small segment's bytes once, not twice. It is the
    scope the partition's metadata gives, an open transaction included."""
    log = LogBuilder(tmp_path / "logs")
    for i in range(4):
        log.append([(k("a"), b"%d" % i)], timestamps=[NOW - MIN])
        log.roll()
    log.append([(k("a"), b"open")], pid=8, txn=True, timestamps=[NOW - MIN])
    log.append([(k("b"), b"after")], timestamps=[NOW - MIN])
    plog = open_log(log)
    read: list[int] = []
    meta = LogSegment.meta

    def counted(segment: LogSegment) -> Any:
        read.append(segment.base_offset)
        return meta(segment)

    monkeypatch.setattr(LogSegment, "meta", counted)
    scope = audit_module.audit_scope(plog)
    assert read == []
    expected = plog.meta()
    assert scope.stable_offset == expected.last_stable_offset == 4
    assert [s.base_offset for s in scope.segments] == [s.base_offset for s in expected.segments]


# -- audits in key buckets (bounded memory) ---------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.data(), st.integers(0, 40), st.integers(1, 5), st.booleans(), st.integers(1, 4))
def test_buckets_merged_give_the_one_bucket_result(
    data: st.DataObject, n: int, buckets: int, versioned: bool, max_listed: int
) -> None:
    """Auditing each key bucket's rows and merging the results gives exactly the result
    of auditing every row at once: counts, oldest ages, and the listed violations (ties
    in superseded time listed in offset order)."""
    keys = data.draw(st.lists(st.integers(0, 9), min_size=n, max_size=n))
    ts = data.draw(
        st.lists(st.sampled_from([-1, NOW - 90 * MIN, NOW - 30 * MIN, NOW]), min_size=n, max_size=n)
    )
    vs = data.draw(st.lists(st.one_of(st.none(), st.integers(-2, 2)), min_size=n, max_size=n))
    tomb = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    hz = data.draw(
        st.lists(st.sampled_from([NEVER, NOW - 7, NOW + 7, NOW - 70]), min_size=n, max_size=n)
    )
    markers = data.draw(st.lists(st.sampled_from([NOW - 3, NOW + 3, NOW - 30]), max_size=3))
    keyless = data.draw(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 99)), max_size=3))
    cols = columns(
        keys,
        ts,
        vs,
        hash_hi=np.array([(x * 0x9E3779B97F4A7C15) % 2**64 for x in keys], np.uint64),
        tombstone=np.array(tomb, np.bool_),
        horizon=np.array(hz, np.int64),
        marker_horizon=np.array(markers, np.int64),
        keyless_count=np.array([c for c, _ in keyless], np.int64),
        keyless_first=np.array([f for _, f in keyless], np.int64),
    )
    kwargs: dict[str, Any] = {
        "versioned": versioned,
        "now_ms": NOW,
        "max_compaction_lag_ms": 10 * MIN,
        "slack_ms": 5 * MIN,
        "max_listed": max_listed,
    }
    parts = []
    for index in range(buckets):
        bucket = audit_module.KeyBucket(index, buckets)
        rows = np.flatnonzero(bucket.holds(cols.hash_hi))

        def column(name: str, _dtype: Any, rows: Any = rows) -> Any:
            whole = getattr(cols, name)
            return (
                whole
                if name in ("marker_horizon", "keyless_count", "keyless_first")
                else whole[rows]
            )

        part = AuditColumns.build(column)
        if index:  # a batch's markers and keyless records go with bucket 0
            none = np.zeros(0, np.int64)
            part = dataclasses.replace(
                part, marker_horizon=none, keyless_count=none, keyless_first=none
            )
        parts.append(audit_columns(part, **kwargs))
    merged = audit_module.merge_results(parts, max_listed=max_listed)
    assert merged == audit_columns(cols, **kwargs)


def many_keys_log(root: Path) -> PartitionLog:
    """Four segments of 400 updates of 200 keys over an hour, with tombstones, compressed
    batches, an aborted and a committed transaction and an open one at the end."""
    log = LogBuilder(root)
    for seg in range(4):
        for step in range(5):
            t = NOW - (60 - 12 * seg - 2 * step) * MIN
            n = 20 * seg + 4 * step
            batch: list[tuple[bytes, bytes | None]] = [
                (k(f"key{(37 * (n + j)) % 200}"), b"%d" % step) for j in range(20)
            ]
            if step == 3:
                batch[0] = (batch[0][0], None)
            codec = Compression.ZSTD if step % 2 else Compression.NONE
            log.append(batch, timestamps=[t] * len(batch), codec=codec)
        if seg == 1:
            log.append([(k("key1"), b"aborted")], pid=7, txn=True, timestamps=[NOW - 20 * MIN])
            log.abort(7)
        if seg == 2:
            log.append([(k("key2"), b"won")], pid=8, txn=True, timestamps=[NOW - 15 * MIN])
            log.commit(8)
        log.roll()
    log.append([(k("key3"), b"open")], pid=9, txn=True, timestamps=[NOW - MIN])
    return open_log(log)


def counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int | None, int]]:
    """Record (buckets, row limit, rows) of every read of the audit that did not overflow."""
    read = audit_module.read_audit_columns
    reads: list[tuple[int, int | None, int]] = []

    def counted(*args: Any, **kwargs: Any) -> AuditColumns:
        cols = read(*args, **kwargs)
        reads.append((kwargs["bucket"].count, kwargs["row_limit"], len(cols)))
        return cols

    monkeypatch.setattr(audit_module, "read_audit_columns", counted)
    return reads


@pytest.mark.parametrize("strategy", ["offset", "timestamp"])
def test_a_partition_over_the_memory_budget_is_audited_in_key_buckets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: str
) -> None:
    """With a budget of 100 rows, the 400 candidate rows are audited in key buckets of at
    most that many (each read from the segments again; how many, from the records counted
    first), and the report is the report of the whole partition read at once."""
    plog = many_keys_log(tmp_path / "logs")
    cfg = topic(compaction_strategy=strategy)
    whole = audit_partition(plog, cfg, now_ms=NOW, slack_ms=0, max_listed=5)
    assert whole.result is not None
    assert whole.result.records == 401
    assert whole.result.violations > 5
    reads = counting_reads(monkeypatch)
    limit = 100
    budget = limit * audit_module.ROW_BYTES
    bucketed = audit_partition(plog, cfg, now_ms=NOW, slack_ms=0, max_listed=5, memory_bytes=budget)
    assert bucketed == whole
    buckets = reads[-1][0]
    last = [rows for count, _, rows in reads if count == buckets]
    assert buckets > 1
    assert len(reads) == len(last) == buckets  # counted first: no read overflowed
    assert {row_limit for count, row_limit, _ in reads} == {limit}
    assert max(last) <= limit
    assert sum(last) == whole.result.records


def test_a_key_bigger_than_the_budget_is_read_whole_after_max_splits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One key's rows cannot be split: its bucket alone is halved MAX_SPLITS times, then
    read whole; the other buckets are read once each, and the result is the whole
    partition's."""
    log = LogBuilder(tmp_path / "logs")
    for i in range(60):
        key = k("hot") if i % 2 else k(f"cold{i}")
        log.append([(key, b"%d" % i)], timestamps=[NOW - (60 - i) * MIN])
    plog = open_log(log)
    whole = audit_partition(plog, topic(), now_ms=NOW, slack_ms=0)
    reads = counting_reads(monkeypatch)
    budget = 10 * audit_module.ROW_BYTES
    assert audit_partition(plog, topic(), now_ms=NOW, slack_ms=0, memory_bytes=budget) == whole
    assert sum(rows for _, _, rows in reads) == 60
    first = reads[0][0]
    assert first == 8  # 60 records, 10 a bucket, a quarter to spare
    hot = [(count, row_limit) for count, row_limit, rows in reads if rows >= 30]
    assert hot == [(first * 2**audit_module.MAX_SPLITS, None)]  # halved, then read whole
    # the other buckets read once each; the hot key's halves: the other half at each split
    assert len(reads) == first - 1 + audit_module.MAX_SPLITS + 1


def test_halves_hold_exactly_the_buckets_keys() -> None:
    """A bucket's two halves hold its keys, each key in one of them."""
    bucket = audit_module.KeyBucket(3, 8)
    low, high = bucket.halves()
    assert [(low.index, low.count), (high.index, high.count)] == [(3, 16), (11, 16)]
    hashes = np.arange(10_000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    both = low.holds(hashes).astype(np.int64) + high.holds(hashes)
    np.testing.assert_array_equal(both, bucket.holds(hashes))
    assert bucket.holds(hashes).any()


def test_first_buckets_count_records_only_past_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition whose offsets fit the budget is read in one bucket without a walk;
    past it, its records are counted from the batch headers."""
    plog = many_keys_log(tmp_path / "logs")
    scope = audit_module.audit_scope(plog)
    walks: list[int] = []
    walked = LogSegment.walked

    def counted(self: LogSegment, **kwargs: Any) -> Any:
        walks.append(self.base_offset)
        return walked(self, **kwargs)

    monkeypatch.setattr(LogSegment, "walked", counted)
    assert audit_module.first_buckets(scope, row_limit=scope.stable_offset) == 1
    assert walks == []
    assert scope.stable_offset == 404  # the open transaction's record stays out
    # 405 records: 20 batches of 20, three transactional records and two markers
    assert audit_module.first_buckets(scope, row_limit=403) == 2
    assert audit_module.first_buckets(scope, row_limit=100) == 8  # 506 rows to spare
    assert len(walks) == 2 * len(scope.segments)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 6), max_size=40),
    st.sampled_from(["distinct", "shared", "unordered"]),
    st.randoms(use_true_random=False),
)
def test_rank_order_is_the_order_by_hash_then_offset(
    keys: list[int], hashes: str, rnd: Any
) -> None:
    """The offset strategy's row order is by (hash, offset) whatever the rows: the stable
    sort by the hash's high word when the rows are in offset order and no two keys share
    that word, the full sort when two keys do (`shared`) or the rows are not in offset
    order (`unordered`)."""
    n = len(keys)
    offsets = list(range(0, 3 * n, 3))
    if hashes == "unordered":
        rnd.shuffle(offsets)
    hi = [7 if hashes == "shared" else (k * 0x9E3779B97F4A7C15) % 2**64 for k in keys]
    ts = [NOW - 1000 + rnd.randrange(100) for _ in range(n)]
    cols = columns(
        keys,
        ts,
        hash_hi=np.array(hi, np.uint64),
        offset=np.array(offsets, np.int64),
    )
    want = np.lexsort((cols.offset, cols.hash_lo, cols.hash_hi))
    assert audit_module._rank_order(cols, versioned=False).tolist() == want.tolist()
    winner, at = superseded_at(cols, versioned=False)
    order = sorted(range(n), key=lambda i: offsets[i])  # the oracle ranks by position
    want_winner, want_at = oracle(
        [keys[i] for i in order], [ts[i] for i in order], [None] * n, False
    )
    assert [winner[i] for i in order] == want_winner
    assert [at[i] for i in order] == want_at
