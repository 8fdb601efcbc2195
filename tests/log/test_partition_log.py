"""Tests of cleanerd.log.partition_log: appends, rolls, reads, metadata, concurrency."""

from __future__ import annotations

import dataclasses
import errno
import itertools
import multiprocessing
from collections.abc import MutableMapping
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import crc32c
import pytest
from aiokafka.record.default_records import DefaultRecordBatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from cleanerd.config import load_config
from cleanerd.errors import (
    CheckpointError,
    CorruptRecordError,
    FileStepError,
    InvalidTxnStateError,
)
from cleanerd.log.checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
)
from cleanerd.log.files import TopicPartition
from cleanerd.log.lock import LogDirLock
from cleanerd.log.partition_log import LogConfig, PartitionLog
from cleanerd.log.producer_state import read_snapshot, snapshot_offsets
from cleanerd.log.recovery import SymlinkRefused
from cleanerd.log.segment import LogSegment
from cleanerd.log.txnindex import AbortedTxn
from cleanerd.records.batch import encode_batch, encode_empty_batch
from cleanerd.records.control import ControlRecordType, encode_end_txn_marker
from cleanerd.records.header import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    RECORD_BATCH_OVERHEAD,
    Compression,
)
from cleanerd.records.record import Record
from tests.builders import (
    build_log,
    encode_records,
    kv,
    offsets_and_values,
    partition_flocks,
    set_base_offset,
    settle_dir,
    write_segment,
)
from tests.conftest import NOGROUP, give_mode_and_group, mode_and_group

_CTX = multiprocessing.get_context("spawn")
SMALL = LogConfig(segment_bytes=1024, index_interval_bytes=128)


def rolled_reasons(logs: list[MutableMapping[str, Any]]) -> list[str]:
    """The `reason` of each `segment.rolled` line."""
    return [e["reason"] for e in logs if e["event"] == "segment.rolled"]


def _open(tmp_path: Path, config: LogConfig = SMALL) -> PartitionLog:
    return PartitionLog.open(
        tmp_path / "logs" / "topic-0", state_dir=tmp_path / "state", config=config
    )


def test_offsets_assigned_contiguously(tmp_path: Path) -> None:
    """Appends get consecutive offsets from the log end offset, whatever the records say."""
    plog = build_log(tmp_path / "logs", [[]], state_dir=tmp_path / "state", config=SMALL)
    assert plog.append([kv("a", "1"), kv("b", "2")]) == (0, 1)
    assert plog.append([Record(999, 5, b"c", b"3")], compression=Compression.GZIP) == (2, 2)
    assert plog.log_end_offset == 3
    assert offsets_and_values(plog) == [(0, b"a", b"1"), (1, b"b", b"2"), (2, b"c", b"3")]


def test_rolls_when_segment_bytes_would_overflow(tmp_path: Path) -> None:
    """A batch that would push the active segment past segment.bytes goes to a new
    segment whose base is the log end offset; no segment exceeds the limit."""
    plog = build_log(tmp_path / "logs", [[]], state_dir=tmp_path / "state", config=SMALL)
    with capture_logs() as logs:
        for n in range(40):
            plog.append([kv(f"k{n}", "x" * 50)])
    assert len(plog.segments) > 1
    assert rolled_reasons(logs) == ["segment.bytes"] * (len(plog.segments) - 1)
    assert all(s.size <= 1024 for s in plog.segments)
    for prev, cur in itertools.pairwise(plog.segments):
        assert cur.base_offset == prev.next_offset
    assert [o for o, _, _ in offsets_and_values(plog)] == list(range(40))


def test_rolls_when_offset_index_full(tmp_path: Path) -> None:
    """A full offset index forces a roll."""
    config = LogConfig(segment_bytes=1 << 20, segment_index_bytes=16, index_interval_bytes=0)
    plog = build_log(tmp_path / "logs", [[]], state_dir=tmp_path / "state", config=config)
    with capture_logs() as logs:
        for n in range(8):
            plog.append([kv(f"k{n}", "v")])
    assert all(s.offset_index.entries <= 2 for s in plog.segments)
    assert len(plog.segments) > 1
    assert set(rolled_reasons(logs)) == {"segment.index.bytes"}


def test_follower_append_rolls_on_relative_offset_overflow(tmp_path: Path) -> None:
    """A batch whose offsets cannot be stored relative to the active base rolls to a new
    segment based at the batch's first offset."""
    plog = build_log(tmp_path / "logs", [[[kv("a", "1")]]], state_dir=tmp_path / "state")
    far = 2**31 + 10
    with capture_logs() as logs:
        assert plog.append_batches(encode_records([kv("b", "2")], far)) == (far, far)
    assert rolled_reasons(logs) == ["relative offset overflow"]
    assert [s.base_offset for s in plog.segments] == [0, far]
    assert plog.log_end_offset == far + 1


def test_roll_of_empty_active_is_noop(tmp_path: Path) -> None:
    """Rolling an empty active segment does nothing."""
    plog = build_log(tmp_path / "logs", [[]], state_dir=tmp_path / "state")
    assert plog.roll(now_ms=1) is None
    assert len(plog.segments) == 1
    plog.append([kv("a", "1")])
    new = plog.roll(now_ms=2)
    assert new is not None
    assert new.base_offset == 1
    assert plog.roll(now_ms=3) is None
    assert [s.base_offset for s in plog.segments] == [0, 1]


@pytest.mark.usefixtures("umask_0027")
def test_a_roll_gives_the_new_segment_and_snapshot_the_bits_of_the_old(tmp_path: Path) -> None:
    """The segment a roll creates, and the producer snapshot written at it, take the bits
    and group of the segment before, not the process's umask (0640) and group."""
    plog = build_log(tmp_path / "logs", [[]], state_dir=tmp_path / "state")
    plog.append([kv("a", "1")])
    give_mode_and_group(sorted(plog.dir.iterdir()), 0o644, NOGROUP)
    new = plog.roll(now_ms=2)
    assert new is not None
    created = sorted(plog.dir.glob(f"{new.base_offset:020d}.*"))
    assert [p.suffix for p in created] == [".index", ".log", ".snapshot", ".timeindex"]
    assert {mode_and_group(p) for p in created} == {(0o644, NOGROUP)}


@pytest.mark.usefixtures("umask_0027")
def test_an_abort_gives_the_new_txnindex_the_bits_of_its_segment(tmp_path: Path) -> None:
    """The `.txnindex` an aborted transaction creates takes the bits and group of its
    segment, not the process's umask (0640) and group: a broker that may open the
    segment may open its index."""
    plog = build_log(tmp_path / "logs", [[]], state_dir=tmp_path / "state")
    plog.append([kv("a", "1")], producer_id=7, producer_epoch=0, is_transactional=True)
    give_mode_and_group(sorted(plog.dir.iterdir()), 0o644, NOGROUP)
    plog.append_end_txn_marker(7, 0, commit=False, timestamp=0)
    txnindex = plog.dir / f"{0:020d}.txnindex"
    assert mode_and_group(txnindex) == (0o644, NOGROUP)


def test_roll_trims_and_finalizes_old_segment(tmp_path: Path) -> None:
    """After a roll the old segment's time index holds its max timestamp as last entry."""
    plog = build_log(
        tmp_path / "logs",
        [
            [
                [kv("a", "1", timestamp=10)],
                [kv("b", "2", timestamp=30)],
                [kv("c", "3", timestamp=20)],
            ],
            [],
        ],
        state_dir=tmp_path / "state",
        config=LogConfig(index_interval_bytes=100_000),
    )
    old = plog.segments[0]
    assert old.time_index.entries == 1
    assert old.time_index.last_entry.timestamp == 30
    assert old.time_index.last_entry.offset == 1
    assert old.time_index_path.stat().st_size == 12
    assert old.offset_index_path.stat().st_size == 0


def test_reopen_gives_same_log_end_offset(tmp_path: Path) -> None:
    """Reopening a log gives the same segments, log end offset and records."""
    plog = build_log(
        tmp_path / "logs",
        [[[kv(f"k{i}", "v" * 30)] for i in range(10)], [[kv("z", "1")]]],
        state_dir=tmp_path / "state",
        config=SMALL,
    )
    again = _open(tmp_path)
    assert again.log_end_offset == plog.log_end_offset == 11
    assert [s.base_offset for s in again.segments] == [s.base_offset for s in plog.segments]
    assert offsets_and_values(again) == offsets_and_values(plog)
    assert again.corrupt is None


def test_reads_from_offset(tmp_path: Path) -> None:
    """batches/records from an offset start at the batch holding it, across segments."""
    plog = build_log(
        tmp_path / "logs",
        [[[kv(f"k{i}", "v"), kv(f"j{i}", "w")] for i in range(5)], [[kv("z", "1")]]],
        state_dir=tmp_path / "state",
    )
    assert [r.offset for r in plog.records(7)] == [7, 8, 9, 10]
    assert [info.base_offset for _, info in plog.batches(7)] == [6, 8, 10]
    assert plog.segment_for(10).base_offset == 10


def test_log_start_offset_from_checkpoint(tmp_path: Path) -> None:
    """The log start offset is max(checkpoint entry, first segment base)."""
    build_log(tmp_path / "logs", [[[kv("a", "1")], [kv("b", "2")]]], state_dir=tmp_path / "state")
    OffsetCheckpointFile(tmp_path / "logs" / LOG_START_OFFSET_CHECKPOINT).write(
        {TopicPartition("topic", 0): 1}
    )
    assert _open(tmp_path).log_start_offset == 1


@pytest.mark.parametrize("read_only", [False, True])
def test_a_log_start_offset_past_the_log_end_is_refused(tmp_path: Path, read_only: bool) -> None:
    """A checkpointed log start past the log end (Kafka's loader would delete every
    segment; retention here deleted all but the active one) fails the open with an
    error naming the file, the partition and both offsets, and every segment stays. A
    log start at the log end, as after deleting every record, still opens."""
    build_log(
        tmp_path / "logs",
        [[[kv("a", "1")], [kv("b", "2")]], [[kv("c", "3")]]],
        state_dir=tmp_path / "state",
    )
    files = sorted(p.name for p in (tmp_path / "logs" / "topic-0").iterdir())
    checkpoint = tmp_path / "logs" / LOG_START_OFFSET_CHECKPOINT
    OffsetCheckpointFile(checkpoint).write({TopicPartition("topic", 0): 4})
    path = tmp_path / "logs" / "topic-0"
    with pytest.raises(CheckpointError) as caught:
        PartitionLog.open(path, state_dir=tmp_path / "state", config=SMALL, read_only=read_only)
    assert str(checkpoint) in str(caught.value)
    assert "topic-0: log start offset 4 is past the log end offset 3" in str(caught.value)
    assert sorted(p.name for p in path.iterdir()) == files
    OffsetCheckpointFile(checkpoint).write({TopicPartition("topic", 0): 3})
    plog = PartitionLog.open(path, state_dir=tmp_path / "state", config=SMALL, read_only=read_only)
    assert plog.log_start_offset == plog.log_end_offset == 3


def test_meta_snapshot(tmp_path: Path) -> None:
    """meta() gives F's PartitionMeta: segments, offsets, high watermark, flags."""
    build_log(
        tmp_path / "logs",
        [[[kv("a", "1", timestamp=5)]], [[kv("b", "2", timestamp=7)]]],
        state_dir=tmp_path / "state",
    )
    OffsetCheckpointFile(tmp_path / "logs" / REPLICATION_OFFSET_CHECKPOINT).write(
        {TopicPartition("topic", 0): 1}
    )
    meta = _open(tmp_path).meta()
    assert (meta.topic, meta.partition, meta.log_dir) == ("topic", 0, str(tmp_path / "logs"))
    assert [(s.base_offset, s.next_offset) for s in meta.segments] == [(0, 1), (1, 2)]
    assert [s.first_batch_timestamp_ms for s in meta.segments] == [5, 7]
    assert (meta.log_start_offset, meta.log_end_offset, meta.high_watermark) == (0, 2, 1)
    assert meta.first_unstable_offset is None
    assert not meta.is_metadata


def test_transactions_tracked_and_aborts_indexed(tmp_path: Path) -> None:
    """An open transaction sets the first unstable offset; an abort writes a `.txnindex`
    entry (pid, first offset, marker offset, LSO) in the marker's segment."""
    plog = build_log(tmp_path / "logs", [[[kv("x", "0")]]], state_dir=tmp_path / "state")
    plog.append([kv("a", "1")], producer_id=7, producer_epoch=0, is_transactional=True)
    plog.append([kv("b", "2")], producer_id=8, producer_epoch=0, is_transactional=True)
    assert plog.meta().first_unstable_offset == 1
    assert plog.append_end_txn_marker(7, 0, commit=False, timestamp=0) == 3
    assert plog.meta().first_unstable_offset == 2
    assert plog.active_segment.txn_index.entries == [AbortedTxn(1, 7, 3, 2)]
    assert plog.append_end_txn_marker(8, 0, commit=True, timestamp=0) == 4
    assert plog.meta().first_unstable_offset is None
    reopened = _open(tmp_path, LogConfig())
    assert reopened.collect_aborted_transactions(0, 10) == [AbortedTxn(1, 7, 3, 2)]
    reopened.append([kv("c", "3")], producer_id=9, producer_epoch=0, is_transactional=True)
    assert _open(tmp_path, LogConfig()).meta().first_unstable_offset == 5


def test_a_write_outside_an_open_transaction_is_refused_whole(tmp_path: Path) -> None:
    """A non-transactional batch from a producer whose transaction is open is refused, as
    Kafka refuses it (InvalidTxnStateException): by `append`, and by `append_batches`
    before any of its batches is written; other producers, and the same producer once
    its marker is written, append as before."""
    plog = build_log(tmp_path / "logs", [[[kv("x", "0")]]], state_dir=tmp_path / "state")
    plog.append([kv("a", "1")], producer_id=7, producer_epoch=0, is_transactional=True)
    with pytest.raises(
        InvalidTxnStateError, match="producer 7, whose transaction is open since offset 1"
    ):
        plog.append([kv("b", "2")], producer_id=7, producer_epoch=0, base_sequence=1)
    assert plog.log_end_offset == 2
    other = encode_batch(
        [dataclasses.replace(kv("c", "3"), offset=2)],
        base_offset=2,
        producer_id=8,
        producer_epoch=0,
    )
    late = encode_batch(
        [dataclasses.replace(kv("d", "4"), offset=3)],
        base_offset=3,
        producer_id=7,
        producer_epoch=0,
    )
    with pytest.raises(InvalidTxnStateError) as refused:
        plog.append_batches(other + late)
    assert (refused.value.producer_id, refused.value.offset) == (7, 3)
    assert plog.log_end_offset == 2  # not even producer 8's batch
    assert plog.append([kv("c", "3")], producer_id=8, producer_epoch=0) == (2, 2)
    plog.append_end_txn_marker(7, 0, commit=True, timestamp=0)
    assert plog.append([kv("b", "2")], producer_id=7, producer_epoch=0, base_sequence=1) == (4, 4)


def test_malformed_snapshot_name_is_no_snapshot(tmp_path: Path) -> None:
    """A file named like a producer snapshot without the 20-digit stem is not read as one
    (the partition's transactions are still tracked from the log) and stays on disk."""
    plog = build_log(tmp_path / "logs", [[[kv("x", "0")]]], state_dir=tmp_path / "state")
    stray = plog.dir / "00000000000000000abc.snapshot"
    stray.write_bytes(b"not a snapshot")
    plog.append([kv("a", "1")], producer_id=7, producer_epoch=0, is_transactional=True)
    assert _open(tmp_path, LogConfig()).meta().first_unstable_offset == 1
    assert stray.read_bytes() == b"not a snapshot"


def test_partition_dir_swapped_for_a_link_after_open_is_refused(tmp_path: Path) -> None:
    """A partition dir replaced by a link once open: the next roll or append re-reads the
    dir, refuses the link and creates nothing at its target."""
    plog = build_log(tmp_path / "logs", [[[kv("x", "0")]]], state_dir=tmp_path / "state")
    elsewhere = tmp_path / "elsewhere"
    plog.dir.rename(elsewhere)
    plog.dir.symlink_to(elsewhere)
    before = sorted(p.name for p in elsewhere.iterdir())
    with pytest.raises(SymlinkRefused):
        plog.roll()
    with pytest.raises(SymlinkRefused):
        plog.append([kv("y", "1")])
    assert sorted(p.name for p in elsewhere.iterdir()) == before


def test_active_segment_swapped_for_a_link_after_open_is_refused(tmp_path: Path) -> None:
    """An active `.log` replaced by a link to a file outside once the log is open: the
    next append refuses it instead of writing through it."""
    plog = build_log(tmp_path / "logs", [[[kv("x", "0")]]], state_dir=tmp_path / "state")
    outside = tmp_path / "outside.log"
    active = plog.active_segment.log_path
    outside.write_bytes(active.read_bytes())
    active.unlink()
    active.symlink_to(outside)
    before = outside.read_bytes()
    with pytest.raises(SymlinkRefused, match=active.name):
        plog.append([kv("y", "1")])
    assert outside.read_bytes() == before


def test_read_only_log_refuses_writes(tmp_path: Path) -> None:
    """A log opened read-only cannot be appended to or rolled."""
    build_log(tmp_path / "logs", [[[kv("a", "1")]]], state_dir=tmp_path / "state")
    plog = PartitionLog.open(tmp_path / "logs" / "topic-0", read_only=True)
    assert plog.read_only
    with pytest.raises(PermissionError, match="read-only"):
        plog.append([kv("b", "2")])
    with pytest.raises(PermissionError, match="read-only"):
        plog.roll()


def test_reader_sees_appends_of_another_instance(tmp_path: Path) -> None:
    """A second PartitionLog on the same dir sees appends and rolls made by the first."""
    writer = build_log(tmp_path / "logs", [[]], state_dir=tmp_path / "state", config=SMALL)
    reader = _open(tmp_path)
    writer.append([kv("a", "1")])
    writer.roll()
    writer.append([kv("b", "2")])
    assert [r.offset for r in reader.records()] == [0, 1]
    assert reader.log_end_offset == 2
    assert reader.append([kv("c", "3")]) == (2, 2)
    assert writer.append([kv("d", "4")]) == (3, 3)


def test_killed_writer_partial_batch_is_cut_before_next_append(tmp_path: Path) -> None:
    """A partial batch left at the end of the active segment (a writer killed mid-write) is
    quarantined and cut under the lock before the next append."""
    plog = build_log(tmp_path / "logs", [[[kv("a", "1")]]], state_dir=tmp_path / "state")
    torn = encode_records([kv("b", "2")], 1)[:30]
    with open(plog.active_segment.log_path, "ab") as f:
        f.write(torn)
    assert plog.append([kv("c", "3")]) == (1, 1)
    assert offsets_and_values(plog) == [(0, b"a", b"1"), (1, b"c", b"3")]
    quarantined = list((tmp_path / "state" / "quarantine").rglob("*.tail"))
    assert [q.read_bytes() for q in quarantined] == [torn]


def _hold_dir_lock(log_dir: Path, held: Event, done: Event) -> None:
    with LogDirLock(log_dir):
        held.set()
        done.wait(30)


def test_no_recovery_when_another_process_owns_the_dir(tmp_path: Path) -> None:
    """Opening a partition whose log dir `.lock` another process holds (the owning daemon)
    leaves that owner's in-flight `.cleaned` output alone; appends still work."""
    plog = build_log(tmp_path / "logs", [[[kv("a", "1")]]], state_dir=tmp_path / "state")
    in_flight = plog.dir / "00000000000000000000.log.cleaned"
    in_flight.write_bytes(b"owner's partial output")
    held, done = _CTX.Event(), _CTX.Event()
    proc = _CTX.Process(target=_hold_dir_lock, args=(tmp_path / "logs", held, done))
    proc.start()
    try:
        assert held.wait(30)
        producer = _open(tmp_path)
        assert in_flight.exists()
        assert producer.append([kv("b", "2")]) == (1, 1)
    finally:
        done.set()
        proc.join(30)
    _open(tmp_path)
    assert not in_flight.exists()


def _writer(log_dir: Path, state: Path, name: str, count: int) -> None:
    plog = PartitionLog.open(log_dir / "topic-0", state_dir=state, config=SMALL)
    for n in range(count):
        plog.append([kv(f"{name}-{n}", f"{name}:{n}")])


def test_two_processes_append_concurrently(tmp_path: Path) -> None:
    """Two writer processes appending N batches each produce offsets 0..2N-1 exactly once,
    valid CRCs (checked by aiokafka's reader too) and consistent indexes."""
    count = 60
    build_log(tmp_path / "logs", [[]], state_dir=tmp_path / "state", config=SMALL)
    procs = [
        _CTX.Process(target=_writer, args=(tmp_path / "logs", tmp_path / "state", name, count))
        for name in ("a", "b")
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    plog = PartitionLog.open(
        tmp_path / "logs" / "topic-0", state_dir=tmp_path / "state", config=SMALL, full_check=True
    )
    assert plog.corrupt is None
    assert plog.recovery_report.rebuilt_indexes == []
    records = list(plog.records())
    assert [r.offset for r in records] == list(range(2 * count))
    for name in ("a", "b"):
        mine = [r.value for r in records if r.key is not None and r.key.startswith(name.encode())]
        assert mine == [f"{name}:{n}".encode() for n in range(count)]
    for segment, info in plog.batches():
        assert DefaultRecordBatch(segment.read_batch(info)).validate_crc()
    for segment in plog.segments:
        assert not segment.sanity_check()


@pytest.mark.parametrize(
    ("min_roll_interval_ms", "bases"), [(0, [0, 3, 6, 9]), (15 * 60_000, [0, 3])]
)
def test_an_append_rolls_when_its_records_are_segment_ms_past_the_first_batch(
    tmp_path: Path, min_roll_interval_ms: int, bases: list[int]
) -> None:
    """Records written at once with timestamps 30 minutes apart under a one-hour
    `segment.ms` are split by their timestamps, as a broker splits them (a segment holds
    at most an hour of them), so that `retention.ms` can delete the old ones; without the
    minimum roll interval exactly where Kafka rolls, with it once (the segment that
    follows a roll waits for the interval on the clock)."""
    hour = 3_600_000
    config = LogConfig(segment_ms=hour, min_roll_interval_ms=min_roll_interval_ms)
    (tmp_path / "logs").mkdir()
    plog = PartitionLog.create(
        tmp_path / "logs", TopicPartition("t", 0), config=config, state_dir=tmp_path / "state"
    )
    t0 = 1_700_000_000_000
    for i in range(10):
        plog.append([kv(f"k{i}", "v", timestamp=t0 + i * hour // 2)], now_ms=t0 + 5 * hour)
    assert [s.base_offset for s in plog.segments] == bases
    assert plog.log_end_offset == 10


def test_a_compacted_topics_append_rolls_at_max_compaction_lag(tmp_path: Path) -> None:
    """maxSegmentMs is max.compaction.lag.ms when lower, for a compacted topic only."""
    minute = 60_000
    for compact, bases in ((True, [0, 2]), (False, [0])):
        config = LogConfig(max_compaction_lag_ms=minute, compact=compact, min_roll_interval_ms=0)
        (tmp_path / str(compact)).mkdir()
        plog = PartitionLog.create(
            tmp_path / str(compact), TopicPartition("t", 0), config=config,
            state_dir=tmp_path / "state",
        )  # fmt: skip
        for ts in (0, minute, minute + 1):
            plog.append([kv("k", "v", timestamp=10**12 + ts)])
        assert [s.base_offset for s in plog.segments] == bases


def test_delete_segments_renames_and_moves_start(tmp_path: Path) -> None:
    """Deleting the oldest segments renames their files to `.deleted`, and the producer
    snapshot at a deleted segment's base with them (as Kafka does: it stayed behind),
    returns them for later unlinking, and moves the log start offset; the active segment
    is refused."""
    plog = build_log(
        tmp_path / "logs",
        [[[kv("a", "1")]], [[kv("b", "2")]], [[kv("c", "3")]]],
        state_dir=tmp_path / "state",
    )
    assert snapshot_offsets(plog.dir) == [1, 2]  # taken at each roll
    first, second, active = plog.segments
    deleted = plog.delete_segments([first, second], reason="retention.ms")
    assert sorted(p.name for p in deleted) == sorted(
        [f"{b:020d}{k}.deleted" for b in (0, 1) for k in (".log", ".index", ".timeindex")]
        + [f"{1:020d}.snapshot.deleted"]
    )
    assert snapshot_offsets(plog.dir) == [2]
    assert all(p.exists() for p in deleted)
    assert plog.log_start_offset == 2
    assert [s.base_offset for s in plog.segments] == [2]
    with pytest.raises(ValueError, match="active segment"):
        plog.delete_segments([active], reason="retention.ms")
    assert offsets_and_values(_open(tmp_path)) == [(2, b"c", b"3")]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.integers(1, 4), st.integers(0, 300)),
            st.tuples(st.just("roll"), st.just(0), st.just(0)),
            st.tuples(st.just("reopen"), st.just(0), st.just(0)),
        ),
        min_size=1,
        max_size=25,
    )
)
def test_random_appends_rolls_reopens_keep_log_consistent(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int, int]]
) -> None:
    """Any sequence of appends, rolls and reopens leaves contiguous offsets, segments
    chained base-to-next, and on-disk indexes equal to a rebuild from the log."""
    root = tmp_path_factory.mktemp("prop")
    config = LogConfig(segment_bytes=600, index_interval_bytes=90)
    plog = build_log(root / "logs", [[]], state_dir=root / "state", config=config)
    expected = 0
    for op, count, size in ops:
        if op == "append":
            records = [kv(f"k{expected + i}", "x" * size, timestamp=expected) for i in range(count)]
            assert plog.append(records) == (expected, expected + count - 1)
            expected += count
        elif op == "roll":
            plog.roll()
        else:
            plog = PartitionLog.open(plog.dir, state_dir=root / "state", config=config)
    assert [r.offset for r in plog.records()] == list(range(expected))
    segments = plog.segments
    for prev, cur in itertools.pairwise(segments):
        assert cur.base_offset == prev.next_offset
    for segment in segments[:-1]:
        on_disk = (segment.offset_index_path.read_bytes(), segment.time_index_path.read_bytes())
        segment.rebuild_indexes()
        assert (
            segment.offset_index_path.read_bytes(),
            segment.time_index_path.read_bytes(),
        ) == on_disk


def test_log_config_follows_the_topic_config() -> None:
    """The log layer gets the topic's segment, index and deletion settings."""
    topic = load_config(None).topic_config("demo-users")
    log_config = LogConfig.of_topic(topic)
    assert log_config.segment_bytes == topic.segment_bytes == 16 * 1024
    assert log_config.segment_index_bytes == topic.segment_index_bytes
    assert log_config.index_interval_bytes == topic.index_interval_bytes
    assert log_config.file_delete_delay_ms == topic.file_delete_delay_ms


def test_meta_is_the_last_one_while_the_files_are_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second meta() with nothing changed is the same snapshot, taken without the
    partition lock; an append by another writer, a new file in the dir, and this
    object's own deletions each give a fresh one."""
    build_log(
        tmp_path / "logs",
        [[[kv("a", "1")]], [[kv("b", "2")]], [[kv("c", "3")]]],
        state_dir=tmp_path / "state",
    )
    plog = _open(tmp_path)
    settle_dir(plog.dir)
    first = plog.meta()
    taken = partition_flocks(monkeypatch)
    assert plog.meta() is first
    assert taken == []

    other = _open(tmp_path)  # another writer of the same partition
    other.append([kv("d", "4")])
    before = len(taken)
    appended = plog.meta()
    assert appended.log_end_offset == 4
    assert len(taken) == before + 1  # read anew, under the lock

    other.roll()
    rolled = plog.meta()
    assert [s.base_offset for s in rolled.segments] == [0, 1, 2, 4]
    settle_dir(plog.dir)
    assert plog.meta() is not rolled  # read once more under the new stamp
    settled = plog.meta()
    assert plog.meta() is settled

    plog.delete_segments(plog.segments[:1], reason="test")
    after = plog.meta()
    assert [s.base_offset for s in after.segments] == [1, 2, 4]
    assert after.log_start_offset == 1


@pytest.mark.parametrize(("recovery_point", "flushed"), [(0, [0, 2]), (3, [2]), (6, [])])
@pytest.mark.parametrize("snapshot", [True, False])
def test_a_clean_stop_flushes_every_segment_above_the_recovery_point(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    recovery_point: int,
    flushed: list[int],
    snapshot: bool,
) -> None:
    """After a crash the segments a broker closed above its recovery point may never have
    been fsynced: a clean stop fsyncs each of them (and the active one) before the
    recovery point moves to the log end, as Kafka's flush does, and syncs the dir once
    (the snapshot's rename does it when there is one)."""
    segments = [[[kv("a", "1")], [kv("b", "2")]]] * 3
    plog = build_log(tmp_path / "logs", segments, state_dir=tmp_path / "state", config=SMALL)
    plog.append([kv("c", "3")])
    plog.recovery_point = recovery_point  # as the open of a crashed broker's dir sets it
    synced: list[int] = []
    dir_syncs: list[Path] = []
    monkeypatch.setattr(LogSegment, "flush", lambda self: synced.append(self.base_offset))
    monkeypatch.setattr("cleanerd.log.partition_log.fsync_dir", dir_syncs.append)

    plog.prepare_clean_shutdown(snapshot=snapshot)

    active = plog.active_segment.base_offset
    assert active == 4
    assert synced == sorted({*flushed, active})
    assert plog.recovery_point == plog.log_end_offset == 7
    assert dir_syncs == ([] if snapshot else [plog.dir])
    assert snapshot_offsets(plog.dir)[-1:] == ([7] if snapshot else [4])  # (4: the roll's)


def test_a_clean_stop_that_fails_names_the_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An fsync refused at a clean stop (a file system the kernel made read-only) raises
    an error naming the step and the partition's dir: an fsync's own error names no
    file, and `shutdown.checkpoint_failed` said only `[Errno 30] Read-only file system`."""
    plog = build_log(tmp_path / "logs", [[[kv("a", "1")]]], state_dir=tmp_path / "state")
    plog.append([kv("b", "2")])

    def refused(self: LogSegment) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(LogSegment, "flush", refused)
    with pytest.raises(FileStepError) as info:
        plog.prepare_clean_shutdown()
    assert str(info.value).startswith("Read-only file system (EROFS) while preparing the ")
    assert str(info.value).endswith(f": {plog.dir}")


def test_a_roll_fsyncs_the_segment_it_closes_and_the_flush_after_it_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A roll fsyncs the segment it closes; the recovery point moves to the new base
    only when nothing below it is unflushed. After an open of a crashed dir, the closed
    segments above the recovery point (a broker's may never have been fsynced) are
    fsynced by the flush after the roll (`flush_rolled`, at the end of a cycle), which
    then moves the recovery point to the active segment; below it, none is fsynced
    again, and a flush with nothing to do fsyncs nothing."""
    segments = [[[kv("a", "1")], [kv("b", "2")]]] * 3
    plog = build_log(tmp_path / "logs", segments, state_dir=tmp_path / "state", config=SMALL)
    synced: list[int] = []
    monkeypatch.setattr(LogSegment, "flush", lambda self: synced.append(self.base_offset))

    plog.recovery_point = 3  # as the open of a crashed broker's dir sets it
    plog.roll()
    assert synced == [4]
    assert plog.recovery_point == 3
    plog.append([kv("c", "3")])
    plog.roll()
    assert synced == [4, 6]
    assert plog.recovery_point == 3

    synced.clear()
    plog.flush_rolled()
    assert synced == [2, 4, 6]
    assert plog.recovery_point == 7

    synced.clear()
    plog.flush_rolled()
    plog.append([kv("d", "4")])
    plog.roll()
    assert synced == [7]
    assert plog.recovery_point == 8


def test_a_log_with_markers_a_cleaner_emptied_opens_and_snapshots(tmp_path: Path) -> None:
    """A compacted log keeps a producer's emptied marker (a control batch without a
    record) as its last batch; opening it without a producer snapshot walks that batch
    as Kafka's loader does (it changes nothing), and the snapshot written next holds the
    producer's last data batch."""
    part = tmp_path / "logs" / "topic-0"
    part.mkdir(parents=True)
    data = encode_batch(
        [kv("a", "1")], base_offset=0, producer_id=7, producer_epoch=2, is_transactional=True
    )
    marker = encode_empty_batch(
        base_offset=1,
        last_offset_delta=0,
        max_timestamp=9,
        producer_id=7,
        producer_epoch=2,
        is_transactional=True,
        is_control=True,
    )
    write_segment(part, 0, [data, marker], inactive=False)
    plog = _open(tmp_path, LogConfig())
    assert plog.meta().first_unstable_offset == 0  # the emptied marker closed nothing
    snapshot = plog.take_snapshot()
    assert snapshot is not None
    entry = read_snapshot(snapshot).entries[7]
    assert (entry.epoch, entry.last_offset, entry.txn_first_offset) == (2, 0, 0)


def test_a_marker_whose_record_does_not_parse_is_an_error_naming_the_segment(
    tmp_path: Path,
) -> None:
    """Producer state walks a marker's record for its coordinator epoch; one that does
    not parse (its CRC intact) is a CorruptRecordError naming the segment file and a
    position inside the marker, not a bare position."""
    part = tmp_path / "logs" / "topic-0"
    part.mkdir(parents=True)
    data = encode_batch(
        [kv("a", "1")], base_offset=0, producer_id=7, producer_epoch=0, is_transactional=True
    )
    marker = bytearray(
        encode_batch(
            [encode_end_txn_marker(ControlRecordType.COMMIT, 3, offset=1, timestamp=5)],
            base_offset=1,
            producer_id=7,
            producer_epoch=0,
            is_transactional=True,
            is_control=True,
        )
    )
    marker[RECORD_BATCH_OVERHEAD] = 0x7E  # the record's length varint: past the batch end
    marker[CRC_OFFSET : CRC_OFFSET + 4] = crc32c.crc32c(bytes(marker[ATTRIBUTES_OFFSET:])).to_bytes(
        4, "big"
    )
    write_segment(part, 0, [data, bytes(marker)], inactive=False)
    plog = _open(tmp_path, LogConfig())
    with pytest.raises(CorruptRecordError) as caught:
        plog.meta()
    assert caught.value.path == str(part / "00000000000000000000.log")
    assert caught.value.position is not None
    assert len(data) <= caught.value.position < len(data) + len(marker)


def test_a_snapshot_past_the_recovered_log_end_is_deleted(tmp_path: Path) -> None:
    """A crash took back appends below a snapshot (written at the log end, unflushed):
    the owner's next open deletes that snapshot, naming it, as Kafka's loader does, so
    that the batches appended at those offsets later are walked, not taken from it."""
    plog = build_log(tmp_path / "logs", [[[kv("x", "0")]]], state_dir=tmp_path / "state")
    plog.append([kv("a", "1")], producer_id=7, producer_epoch=0, is_transactional=True)
    active = plog.active_segment.log_path
    kept = active.stat().st_size
    plog.append_end_txn_marker(7, 0, commit=True, timestamp=0)
    snapshot = plog.take_snapshot()
    assert snapshot is not None
    assert snapshot.name == "00000000000000000003.snapshot"
    del plog
    with active.open("r+b") as f:  # the marker was never flushed: a crash lost it
        f.truncate(kept)
    with capture_logs() as logs:
        reopened = _open(tmp_path, LogConfig())
    assert not snapshot.exists()
    assert [e["path"] for e in logs if e["event"] == "producer_snapshot.past_log_end"] == [
        str(snapshot)
    ]
    assert reopened.meta().first_unstable_offset == 1  # the transaction is open again
    reopened.append([kv("b", "2")])
    reopened.append([kv("c", "3")])  # offset 3 again, past where the snapshot was
    assert reopened.meta().first_unstable_offset == 1


@pytest.mark.parametrize("damaged_base", [2, 4])
def test_the_readable_meta_stands_a_damaged_segment_in_by_its_files(
    tmp_path: Path, damaged_base: int
) -> None:
    """A bad CRC in the first batch of a rolled or of the active segment: `meta` raises,
    naming the file; `readable_meta` gives every other segment as `meta` would, and the
    damaged one by its files only (its size, its mtime as its largest timestamp, the
    damage named), with the log end offset at the active segment's base when that is the
    damaged one."""
    batches = [[kv(f"k{i}", f"v{i}", timestamp=1_000 + i)] for i in range(2)]
    build_log(tmp_path / "logs", [batches] * 3, state_dir=tmp_path / "state")
    path = tmp_path / "logs" / "topic-0" / f"{damaged_base:020d}.log"
    data = bytearray(path.read_bytes())
    data[65] ^= 0xFF
    path.write_bytes(bytes(data))
    plog = PartitionLog.open(path.parent, state_dir=tmp_path / "state", read_only=True)
    with pytest.raises(CorruptRecordError, match=str(path)):
        plog.meta()
    meta = plog.readable_meta()
    assert [s.base_offset for s in meta.segments] == [0, 2, 4]
    assert [s.damage is None for s in meta.segments] == [b != damaged_base for b in (0, 2, 4)]
    bad = meta.segments[damaged_base // 2]
    assert meta.damage == bad.damage
    assert bad.damage is not None
    assert str(path) in bad.damage
    assert "CRC mismatch" in bad.damage
    assert (bad.next_offset, bad.size_bytes) == (damaged_base, path.stat().st_size)
    assert bad.largest_timestamp_ms == path.stat().st_mtime_ns // 1_000_000
    assert meta.segments[0].largest_timestamp_ms == 1_001
    assert meta.log_end_offset == (4 if damaged_base == 4 else 6)


def test_a_segment_reaching_the_next_ones_base_is_damaged(tmp_path: Path) -> None:
    """A rolled segment's last batch whose base offset (which no CRC covers) reaches the
    next segment's: the metadata, read from the segment's tail, would take it as the
    segment's end, so `meta` refuses it naming the file, the batch's position and the
    offsets, and `readable_meta` stands the segment in as damaged (retention then stops
    before it). Before, the position was missing: found from the tail, the damage was
    not looked for in the file."""
    batches = [[kv(f"k{i}", f"v{i}", timestamp=1_000 + i)] for i in range(2)]
    build_log(tmp_path / "logs", [batches] * 3, state_dir=tmp_path / "state")
    path = tmp_path / "logs" / "topic-0" / f"{2:020d}.log"
    set_base_offset(path, -1, 9)
    second = 12 + int.from_bytes(path.read_bytes()[8:12], "big")  # the last batch's position
    plog = PartitionLog.open(path.parent, state_dir=tmp_path / "state", read_only=True)
    reason = "last offset 9 is not below the next segment's base offset 4"
    with pytest.raises(CorruptRecordError) as caught:
        plog.meta()
    assert str(caught.value) == f"corrupt record batch in {path} at position {second}: {reason}"
    meta = plog.readable_meta()
    assert [s.damage is None for s in meta.segments] == [True, False, True]
    assert meta.damage == str(caught.value)
    assert meta.segments[1].next_offset == 2


def test_an_active_segment_ending_past_its_index_range_is_damaged(tmp_path: Path) -> None:
    """The active segment's last batch with a base offset (no CRC covers it) far past
    what its index can hold relative to its base: no next segment bounds it, so it
    passed as the log end, and a roll then failed the whole cycle on writing the index
    entry. `meta` refuses it; `readable_meta` stands the segment in as damaged."""
    batches = [[kv(f"k{i}", f"v{i}", timestamp=1_000 + i)] for i in range(2)]
    build_log(tmp_path / "logs", [batches] * 2, state_dir=tmp_path / "state")
    path = tmp_path / "logs" / "topic-0" / f"{2:020d}.log"
    set_base_offset(path, -1, 10**15)
    plog = PartitionLog.open(path.parent, state_dir=tmp_path / "state", read_only=True)
    reason = f"last offset {10**15} is more than 2147483647 past the segment's base offset 2"
    second = 12 + int.from_bytes(path.read_bytes()[8:12], "big")
    with pytest.raises(CorruptRecordError, match=f"at position {second}: {reason}"):
        plog.meta()
    meta = plog.readable_meta()
    assert [s.damage is None for s in meta.segments] == [True, False]
    assert meta.log_end_offset == 2


def test_the_readable_meta_stands_in_for_damage_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error that is not damage (too many open files, say) fails `readable_meta` as it
    fails `meta`: a passing condition must not stand a healthy segment in as damaged,
    which would mark a compacted partition uncleanable until the mark expires."""
    batches = [[kv(f"k{i}", f"v{i}", timestamp=1_000 + i)] for i in range(2)]
    build_log(tmp_path / "logs", [batches] * 2, state_dir=tmp_path / "state")
    plog = PartitionLog.open(
        tmp_path / "logs" / "topic-0", state_dir=tmp_path / "state", read_only=True
    )

    def exhausted(self: LogSegment) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(LogSegment, "meta", exhausted)
    with pytest.raises(OSError, match="Too many open files"):
        plog.readable_meta()


def test_a_live_partition_cut_and_written_past_its_last_walk_rebuilds_its_producers(
    tmp_path: Path,
) -> None:
    """Beside a live broker, the producer state walks only what was appended since its
    last call. A truncation (Kafka's `truncateTo`) followed by appends past where that
    walk ended leaves its end inside a batch; and a truncation alone takes back batches
    it walked. Either way the state is rebuilt from the snapshot. The first was a corrupt
    batch ("unexpected magic") that skipped the partition in about 45% of an observing
    daemon's cycles under a churning broker."""
    batches = [[kv(f"k{n}", "v" * 10, timestamp=1000 + n)] for n in range(6)]
    build_log(tmp_path / "logs", [batches], state_dir=tmp_path / "state")
    path = tmp_path / "logs" / "topic-0"
    plog = PartitionLog.open(path, read_only=True)
    assert plog.segments[-1].growing
    plog.producer_state()  # walked to the end of the active segment
    log = plog.segments[-1].log_path
    data = log.read_bytes()
    first_end = len(encode_records(batches[0], 0))
    bigger = [encode_records([kv(f"n{n}", "w" * 300, timestamp=2000)], 1 + n) for n in range(4)]
    log.write_bytes(data[:first_end] + b"".join(bigger))  # same inode, past the old end
    assert log.stat().st_size > len(data)
    plog.refresh()
    plog.producer_state()
    assert plog.log_end_offset == 5
    log.write_bytes(data[:first_end])  # cut only: the walked batches are taken back
    plog.refresh()
    plog.producer_state()
    assert plog.log_end_offset == 1
