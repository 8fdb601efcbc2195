"""A clean stop (`Maintenance.shutdown`, `checkpoint(clean_stop=True)`): every partition
flushed with a producer snapshot at its end, several partitions at once, and the
clean-shutdown marker only when every one of them made it."""

from __future__ import annotations

import errno
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cleanerd.engine.local import LocalEngine, WorkerSettings
from cleanerd.log.checkpoint import RECOVERY_POINT_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleanerd.log.files import CLEAN_SHUTDOWN_FILE_NAME, TopicPartition
from cleanerd.log.partition_log import PartitionLog
from cleanerd.log.producer_state import snapshot_offsets
from cleanerd.maintenance.cycle import Maintenance
from tests.maintenance.test_cycle import HOUR, T0, build, records, write_config

PARTITIONS = 3


@pytest.fixture(name="engine", scope="module")
def _engine() -> Iterator[LocalEngine]:
    with LocalEngine(WorkerSettings(workers=1, dedupe_buffer_size=4 * 1024 * 1024)) as engine:
        yield engine


def started(tmp_path: Path, engine: LocalEngine) -> Maintenance:
    """A daemon's maintenance after its first cycle over partitions with no snapshot."""
    for n in range(PARTITIONS):
        build(tmp_path, TopicPartition("c", n), [records(range(4), T0 - HOUR)] * 2)
    cfg = write_config(tmp_path, {"c": {"cleanup.policy": "delete"}})
    m = Maintenance(cfg, engine, clock=lambda: T0)
    m.run_once()
    for snapshot in (tmp_path / "logs").glob("c-*/*.snapshot"):
        snapshot.unlink()  # as a start after a crash finds none
    return m


def snapshots(tmp_path: Path) -> dict[int, list[int]]:
    return {n: snapshot_offsets(tmp_path / "logs" / f"c-{n}") for n in range(PARTITIONS)}


def test_partitions_are_made_ready_side_by_side(
    tmp_path: Path, engine: LocalEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each partition's fsyncs overlap with others': two partitions are prepared at the
    same time (a stop that prepared them one by one never meets the barrier)."""
    m = started(tmp_path, engine)
    both = threading.Barrier(2, timeout=30)
    original = PartitionLog.prepare_clean_shutdown

    def meeting(self: PartitionLog, *, snapshot: bool = True) -> None:
        if self.topic_partition.partition < 2:
            both.wait()
        original(self, snapshot=snapshot)

    monkeypatch.setattr(PartitionLog, "prepare_clean_shutdown", meeting)
    assert m.shutdown() == []
    assert snapshots(tmp_path) == {n: [8] for n in range(PARTITIONS)}
    assert (tmp_path / "logs" / CLEAN_SHUTDOWN_FILE_NAME).exists()


def test_a_partition_that_fails_its_stop_costs_the_marker_not_the_others(
    tmp_path: Path, engine: LocalEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One partition's failure is returned naming its file; every other partition is
    still flushed with its snapshot and checkpointed, the failed one keeps the recovery
    point written before, and the dir gets no clean-shutdown marker (its next open
    recovers, as after a crash). The failure cost the whole dir its checkpoint before."""
    m = started(tmp_path, engine)
    checkpoint = OffsetCheckpointFile(tmp_path / "logs" / RECOVERY_POINT_OFFSET_CHECKPOINT)
    checkpoint.write({TopicPartition("c", n): 3 for n in range(PARTITIONS)})
    original = PartitionLog.prepare_clean_shutdown
    failing = tmp_path / "logs" / "c-0" / "00000000000000000008.snapshot"

    def full_disk(self: PartitionLog, *, snapshot: bool = True) -> None:
        if self.topic_partition.partition == 0:
            raise OSError(errno.ENOSPC, "No space left on device", str(failing))
        original(self, snapshot=snapshot)

    monkeypatch.setattr(PartitionLog, "prepare_clean_shutdown", full_disk)
    errors = m.shutdown()
    assert [str(e) for e in errors] == [f"[Errno 28] No space left on device: '{failing}'"]
    assert snapshots(tmp_path) == {0: [], 1: [8], 2: [8]}
    assert checkpoint.read() == {TopicPartition("c", n): rp for n, rp in enumerate([3, 8, 8])}
    assert not (tmp_path / "logs" / CLEAN_SHUTDOWN_FILE_NAME).exists()


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def test_damage_a_step_meets_after_a_clean_start_costs_the_marker(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """A start after a clean stop checks no old segment; damage that a later step meets
    there (a bad CRC the roll reads) is reported, and the stop writes no clean-shutdown
    marker, so the next open recovers as after a crash. The marker was written again."""
    for n in range(PARTITIONS):
        build(tmp_path, TopicPartition("c", n), [records(range(4), T0 - HOUR)] * 2)
    cfg = write_config(tmp_path, {"c": {"cleanup.policy": "delete", "retention.ms": -1}})
    marker = tmp_path / "logs" / CLEAN_SHUTDOWN_FILE_NAME
    with Maintenance(cfg, engine, clock=lambda: T0) as first:
        first.run_once()
        assert first.shutdown() == []
    assert marker.exists()
    damaged = tmp_path / "logs" / "c-0" / "00000000000000000000.log"
    _flip_last_byte(damaged)
    with Maintenance(cfg, engine, clock=lambda: T0) as second:
        report = second.run_once()
        assert {(e.tp, e.phase) for e in report.errors} >= {(TopicPartition("c", 0), "roll")}
        assert all(str(damaged) in e.reason for e in report.errors)
        assert second.shutdown() == []
    assert not marker.exists()
    assert 8 in snapshots(tmp_path)[1]  # the sound partitions are still made ready


def test_damage_the_open_of_a_partition_not_compacted_finds_is_an_error(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """A partition that is not compacted is never marked uncleanable, so the damage its
    open found (an emptied old segment whose index points past it) is reported as the
    open's error, at each cycle's open (which looks again, for a repair), and costs the
    marker; its files stay as they are. It was only logged, and `clean` exited 0."""
    for n in range(PARTITIONS):
        build(tmp_path, TopicPartition("c", n), [records(range(4), T0 - HOUR)] * 2)
    emptied = tmp_path / "logs" / "c-0" / "00000000000000000000.log"
    emptied.write_bytes(b"")
    cfg = write_config(tmp_path, {"c": {"cleanup.policy": "delete", "retention.ms": -1}})
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        for report in (m.run_once(), m.run_once()):
            (error,) = report.errors
            assert (error.tp, error.phase) == (TopicPartition("c", 0), "open")
            assert "corrupt index" in error.reason
        assert m.shutdown() == []
    assert emptied.stat().st_size == 0
    assert not (tmp_path / "logs" / CLEAN_SHUTDOWN_FILE_NAME).exists()
