"""Tests of cleanerd.retention.executor: Kafka's retention applied to real partitions."""

from __future__ import annotations

import dataclasses
import errno
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from cleanerd.config import BrokerConfig
from cleanerd.errors import FileStepError
from cleanerd.log.checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
)
from cleanerd.log.deletions import PendingDeletions
from cleanerd.log.files import TopicPartition
from cleanerd.log.index import TimeIndex
from cleanerd.log.log_dir import LogDir
from cleanerd.log.partition_log import PartitionLog
from cleanerd.log.topic_config import TopicConfig
from cleanerd.retention.executor import apply_retention
from cleanerd.retention.policy import DeletionReason, RetentionRoll
from tests.builders import build_log, kv, partition_flocks, settle_dir

T0 = 1_700_000_000_000
HOUR = 3_600_000
TP = TopicPartition("topic", 0)


def topic(**overrides: Any) -> TopicConfig:
    base = dataclasses.replace(
        BrokerConfig().topic_defaults(), cleanup_policy=("delete",), file_delete_delay_ms=60_000
    )
    return dataclasses.replace(base, **overrides)


def build(tmp_path: Path, ages_h: list[int]) -> Path:
    """Segments of 10 one-record batches each, the records of segment i `ages_h[i]` hours
    old (the last segment is the active one)."""
    segments = [
        [[kv(f"k{i}-{n}", "v", timestamp=T0 - age * HOUR)] for n in range(10)]
        for i, age in enumerate(ages_h)
    ]
    build_log(tmp_path / "logs", segments, state_dir=tmp_path / "state")
    return tmp_path / "logs"


def open_owned(tmp_path: Path) -> tuple[LogDir, PartitionLog]:
    log_dir = LogDir.open(tmp_path / "logs", state_dir=tmp_path / "state")
    return log_dir, log_dir.open_partition(TP)


def test_retention_ms_renames_and_defers_unlink(tmp_path: Path) -> None:
    """Expired segments are renamed .deleted at once, unlinked only after
    file.delete.delay.ms, and the log start offset moves to the first survivor."""
    build(tmp_path, [5, 4, 1, 0])
    log_dir, plog = open_owned(tmp_path)
    with log_dir:
        pending = PendingDeletions()
        out = apply_retention(plog, topic(retention_ms=2 * HOUR), now_ms=T0, pending=pending)
        assert [(d.base_offset, d.reason) for d in out.deletions] == [
            (0, DeletionReason.RETENTION_MS),
            (10, DeletionReason.RETENTION_MS),
        ]
        assert out.log_start_offset == 20
        assert [s.base_offset for s in plog.segments] == [20, 30]
        deleted = sorted(p.name for p in plog.dir.glob("*.deleted"))
        assert deleted
        assert all(p.exists() for p in out.deleted_files)
        assert not (plog.dir / "00000000000000000000.log").exists()
        assert pending.run_due(T0 + 59_999) == []
        assert sorted(p.name for p in pending.run_due(T0 + 60_000)) == deleted
        assert not list(plog.dir.glob("*.deleted"))
        assert PartitionLog.open(plog.dir, read_only=True).log_start_offset == 20


def test_a_roll_that_fails_on_a_full_disk_still_lets_the_due_segments_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every segment is due, so the active one must be rolled, and the roll's final
    time-index entry gets ENOSPC (a full log dir). The inactive due segments are deleted
    all the same (they are what frees the disk), the failure names the file and the
    step, and the next check, with space again, rolls and deletes the old active one."""
    build(tmp_path, [9, 8, 7])
    log_dir, plog = open_owned(tmp_path)
    real = TimeIndex.flush_entries

    def full(index: TimeIndex) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(TimeIndex, "flush_entries", full)
    with log_dir:
        pending = PendingDeletions()
        out = apply_retention(plog, topic(retention_ms=HOUR), now_ms=T0, pending=pending)
        assert [d.base_offset for d in out.deletions] == [0, 10]
        assert out.roll is None
        assert isinstance(out.failure, FileStepError)
        assert out.failure.no_space
        assert str(out.failure).endswith(str(plog.dir / "00000000000000000020.timeindex"))
        assert "last index entries" in str(out.failure)
        assert [s.base_offset for s in plog.segments] == [20]
        checkpoint = OffsetCheckpointFile(tmp_path / "logs" / LOG_START_OFFSET_CHECKPOINT)
        assert PartitionLog.open(plog.dir, read_only=True).log_start_offset == 20
        assert len(pending.run_due(T0 + 60_000)) == len(out.deleted_files) > 0

        monkeypatch.setattr(TimeIndex, "flush_entries", real)
        out = apply_retention(plog, topic(retention_ms=HOUR), now_ms=T0, pending=pending)
        assert out.failure is None
        assert out.roll == RetentionRoll(20, DeletionReason.RETENTION_MS)
        assert [d.base_offset for d in out.deletions] == [20]
        assert [(s.base_offset, s.size) for s in plog.segments] == [(30, 0)]
        assert checkpoint.read() == {}


def test_a_roll_failure_with_nothing_deleted_is_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the active segment is due and its roll fails: nothing was done, so the
    error is raised as the partition's failed step, naming the file."""
    build(tmp_path, [9])
    log_dir, plog = open_owned(tmp_path)

    def full(index: TimeIndex) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(TimeIndex, "flush_entries", full)
    with log_dir, pytest.raises(FileStepError, match=r"00000000000000000000\.timeindex"):
        apply_retention(plog, topic(retention_ms=HOUR), now_ms=T0, pending=PendingDeletions())
    assert [s.base_offset for s in plog.segments] == [0]


def test_log_start_offset_checkpoint_follows_deletions(tmp_path: Path) -> None:
    """A checkpointed log start offset deletes the segments below it and stays
    checkpointed while it lies above the first survivor's base; once deletions pass it,
    its entry goes (the first base is the start offset, as Kafka writes it) when the
    caller checkpoints the partition, as the cycle does after its retention step."""
    build(tmp_path, [3, 3, 3, 0])
    OffsetCheckpointFile(tmp_path / "logs" / LOG_START_OFFSET_CHECKPOINT).write({TP: 15})
    log_dir, plog = open_owned(tmp_path)
    with log_dir:
        out = apply_retention(plog, topic(), now_ms=T0, pending=PendingDeletions())
        assert [(d.base_offset, d.reason) for d in out.deletions] == [
            (0, DeletionReason.LOG_START_OFFSET)
        ]
        log_dir.checkpoint_logs([plog])
        checkpoint = OffsetCheckpointFile(tmp_path / "logs" / LOG_START_OFFSET_CHECKPOINT)
        assert checkpoint.read() == {TP: 15}
        out = apply_retention(
            plog, topic(retention_ms=2 * HOUR), now_ms=T0, pending=PendingDeletions()
        )
        assert [d.base_offset for d in out.deletions] == [10, 20]
        assert out.log_start_offset == 30
        log_dir.checkpoint_logs([plog])
        assert checkpoint.read() == {}


def test_retention_bytes_deletes_oldest(tmp_path: Path) -> None:
    """retention.bytes removes the oldest segments while the excess covers them."""
    build(tmp_path, [0, 0, 0, 0])
    log_dir, plog = open_owned(tmp_path)
    with log_dir:
        size = plog.segments[0].size
        cfg = topic(retention_bytes=2 * size)
        out = apply_retention(plog, cfg, now_ms=T0, pending=PendingDeletions())
        assert [(d.base_offset, d.reason) for d in out.deletions] == [
            (0, DeletionReason.RETENTION_BYTES),
            (10, DeletionReason.RETENTION_BYTES),
        ]


def test_rolls_first_when_every_segment_expired(tmp_path: Path) -> None:
    """When the active segment is expired too, it is rolled first: every old segment goes,
    an empty active segment at the log end offset stays."""
    build(tmp_path, [9, 8])
    log_dir, plog = open_owned(tmp_path)
    with log_dir, capture_logs() as logs:
        out = apply_retention(plog, topic(retention_ms=HOUR), now_ms=T0, pending=PendingDeletions())
        assert out.roll == RetentionRoll(10, DeletionReason.RETENTION_MS)
        rolled = [e for e in logs if e["event"] == "segment.rolled"]
        assert [e["reason"] for e in rolled] == ["retention.ms"]
        assert [d.base_offset for d in out.deletions] == [0, 10]
        assert [(s.base_offset, s.size) for s in plog.segments] == [(20, 0)]
        assert plog.log_end_offset == 20
        assert out.log_start_offset == 20


def test_a_roll_whose_deletion_fails_is_still_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention rolls the only segment, then its deletion fails (a full disk, say): the
    roll happened, so it is in the outcome, naming the segment rolled, beside the
    failure; the check raised before, and the roll went uncounted and unreported."""
    build(tmp_path, [9])
    log_dir, plog = open_owned(tmp_path)

    def failing(*_: object, **__: object) -> list[Path]:
        raise OSError(errno.ENOSPC, "No space left on device")

    with log_dir:
        monkeypatch.setattr(PartitionLog, "delete_segments", failing)
        out = apply_retention(plog, topic(retention_ms=HOUR), now_ms=T0, pending=PendingDeletions())
        assert out.roll == RetentionRoll(0, DeletionReason.RETENTION_MS)
        assert out.deletions == ()
        assert isinstance(out.failure, OSError)
        assert [s.base_offset for s in plog.segments] == [0, 10]


def test_compact_only_keeps_expired_segments(tmp_path: Path) -> None:
    """A compact-only topic runs only the start-offset pass: nothing expires by time."""
    build(tmp_path, [9, 8, 0])
    log_dir, plog = open_owned(tmp_path)
    with log_dir:
        cfg = topic(cleanup_policy=("compact",), retention_ms=HOUR)
        out = apply_retention(plog, cfg, now_ms=T0, pending=PendingDeletions())
        assert out.deletions == ()
        assert len(plog.segments) == 3


def test_high_watermark_bounds_deletion(tmp_path: Path) -> None:
    """A segment not covered by the high watermark is never deleted."""
    build(tmp_path, [9, 8, 7, 0])
    OffsetCheckpointFile(tmp_path / "logs" / REPLICATION_OFFSET_CHECKPOINT).write({TP: 15})
    log_dir, plog = open_owned(tmp_path)
    with log_dir:
        out = apply_retention(plog, topic(retention_ms=HOUR), now_ms=T0, pending=PendingDeletions())
        assert [d.base_offset for d in out.deletions] == [0]


def test_future_timestamp_blocks_and_is_named(tmp_path: Path) -> None:
    """A segment stamped in the future stops time retention there; the outcome names it
    (the cycle logs it, `test_cycle`)."""
    build(tmp_path, [9, -5, 9, 0])
    log_dir, plog = open_owned(tmp_path)
    with log_dir:
        out = apply_retention(plog, topic(retention_ms=HOUR), now_ms=T0, pending=PendingDeletions())
    assert [d.base_offset for d in out.deletions] == [0]
    assert out.future_timestamp_base == 10


def test_metadata_log_untouched_and_read_only_refused(tmp_path: Path) -> None:
    """__cluster_metadata is left alone; a read-only partition cannot be changed."""
    meta_tp = TopicPartition("__cluster_metadata", 0)
    source = build_log(
        tmp_path / "logs",
        [[[kv("k", "v", timestamp=0)]], [[kv("k", "v", timestamp=0)]]],
        state_dir=tmp_path / "state",
        tp=TopicPartition("source", 0),
    )
    source.dir.rename(tmp_path / "logs" / str(meta_tp))  # cleanerd never writes it itself
    build(tmp_path, [9, 0])
    with LogDir.open(tmp_path / "logs", state_dir=tmp_path / "state") as log_dir:
        metadata = log_dir.open_partition(meta_tp)
        out = apply_retention(
            metadata, topic(retention_ms=0), now_ms=T0, pending=PendingDeletions()
        )
        assert out.deletions == ()
        assert len(metadata.segments) == 2
        read_only = PartitionLog.open(tmp_path / "logs" / str(TP), read_only=True)
        with pytest.raises(PermissionError):
            apply_retention(read_only, topic(retention_ms=0), now_ms=T0, pending=PendingDeletions())


def test_nothing_to_delete_is_decided_without_the_partition_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition with nothing due is checked on its current metadata without the
    partition lock; one with expired segments takes it and deletes."""
    build(tmp_path, [5, 4, 0])
    log_dir, plog = open_owned(tmp_path)
    with log_dir:
        settle_dir(plog.dir)
        plog.meta()
        taken = partition_flocks(monkeypatch)
        pending = PendingDeletions()
        out = apply_retention(plog, topic(retention_ms=6 * HOUR), now_ms=T0, pending=pending)
        assert out.deletions == ()
        assert taken == []
        out = apply_retention(plog, topic(retention_ms=2 * HOUR), now_ms=T0, pending=pending)
        assert [d.base_offset for d in out.deletions] == [0, 10]
        assert taken == [plog.lock.path]
