"""The daemon keeps what it knows of the segments after its cycles
(`Maintenance.keep_known`), so that a start after a crash takes the metadata of the
segments wholly below the recovery point instead of reading them again."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path

import pytest

from cleanerd.engine.local import LocalEngine, WorkerSettings
from cleanerd.log import known_segments
from cleanerd.log import log_dir as log_dir_module
from cleanerd.log.files import CLEAN_SHUTDOWN_FILE_NAME, TopicPartition
from cleanerd.log.known_segments import known_segments_path, read_known_segments
from cleanerd.log.partition_log import PartitionLog
from cleanerd.maintenance.cycle import KEEP_INTERVAL_MS, Maintenance
from tests.maintenance.test_cycle import HOUR, T0, build, records, write_config

TP = TopicPartition("c", 0)
OTHER = TopicPartition("c", 1)


@pytest.fixture(name="engine", scope="module")
def _engine() -> Iterator[LocalEngine]:
    with LocalEngine(WorkerSettings(workers=1, dedupe_buffer_size=4 * 1024 * 1024)) as engine:
        yield engine


def built(tmp_path: Path) -> Path:
    """Two partitions of four segments each, nothing of cleanerd's kept."""
    for tp in (TP, OTHER):
        build(tmp_path, tp, [records(range(4), T0 - HOUR)] * 4)
    return tmp_path / "logs"


def maintenance(tmp_path: Path, engine: LocalEngine, now: list[int] | None = None) -> Maintenance:
    cfg = write_config(tmp_path, {"c": {"cleanup.policy": "delete"}})
    clock = [T0] if now is None else now
    return Maintenance(cfg, engine, clock=lambda: clock[0])


def kept_partitions(tmp_path: Path) -> list[str]:
    """The partition dirs the file kept for the log dir holds, by name."""
    return sorted(read_known_segments(tmp_path / "state", tmp_path / "logs").segments)


def plog(m: Maintenance, root: Path, tp: TopicPartition) -> PartitionLog:
    return m._plogs[(root, tp)]


def test_a_start_after_a_crash_takes_what_the_cycles_kept(
    tmp_path: Path, engine: LocalEngine
) -> None:
    root = built(tmp_path)
    m = maintenance(tmp_path, engine)
    m.run_once()
    m.keep_known()
    kept = read_known_segments(tmp_path / "state", root).segments
    assert sorted(kept) == [str(TP), str(OTHER)]
    expected = plog(m, root, TP).meta()
    m.close(unlink_pending=False)  # a crash: no clean stop, no marker
    assert not (root / CLEAN_SHUTDOWN_FILE_NAME).exists()

    again = maintenance(tmp_path, engine)
    again.run_once()
    restarted = plog(again, root, TP)
    closed = [s.base_offset for s in restarted.segments[:-1]]
    assert len(closed) == 3
    assert restarted.recovery_report.as_kept == closed
    assert restarted.meta() == expected
    again.close(unlink_pending=False)


def test_nothing_is_written_again_until_the_segments_change_and_the_interval_passed(
    tmp_path: Path, engine: LocalEngine
) -> None:
    root = built(tmp_path)
    now = [T0]
    m = maintenance(tmp_path, engine, now)
    m.run_once()
    m.keep_known()
    path = known_segments_path(tmp_path / "state", root)
    first = path.stat().st_ino  # each write replaces the file

    now[0] += 10 * KEEP_INTERVAL_MS
    m.run_once()
    m.keep_known()
    assert path.stat().st_ino == first  # nothing changed

    plog(m, root, TP).roll()
    m.run_once()
    m.keep_known()
    assert path.stat().st_ino != first
    second = path.stat().st_ino
    assert len(read_known_segments(tmp_path / "state", root).segments[str(TP)]) == 5

    plog(m, root, OTHER).roll()
    now[0] += KEEP_INTERVAL_MS - 1
    m.run_once()
    m.keep_known()
    assert path.stat().st_ino == second  # changed, but kept less than the interval ago
    now[0] += 1
    m.keep_known()
    assert path.stat().st_ino != second
    m.close(unlink_pending=False)


def test_a_damaged_partition_is_not_kept(tmp_path: Path, engine: LocalEngine) -> None:
    """What a start after a crash trusts, a check has passed: a partition the open found
    damaged keeps nothing (the others are kept)."""
    root = built(tmp_path)
    second = sorted((root / str(OTHER)).glob("*.log"))[1]
    data = bytearray(second.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a CRC that fails, in a segment the recovery walks
    second.write_bytes(bytes(data))
    m = maintenance(tmp_path, engine)
    m.run_once()
    assert plog(m, root, OTHER).corrupt is not None
    m.keep_known()
    assert kept_partitions(tmp_path) == [str(TP)]
    m.close(unlink_pending=False)


def test_a_partition_with_checks_left_or_damage_met_is_not_kept(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """What a start after a crash trusts, the open checked: a partition whose checks are
    still left, or where a step met damage, is not kept."""
    root = built(tmp_path)
    m = maintenance(tmp_path, engine)
    m.run_once()
    plog(m, root, TP).recovery_report.unchecked.append(0)
    m.keep_known()
    assert kept_partitions(tmp_path) == [str(OTHER)]
    plog(m, root, TP).recovery_report.unchecked.clear()
    m._damaged.add((root, OTHER))
    m._kept.clear()
    m.keep_known()
    assert kept_partitions(tmp_path) == [str(TP)]
    m.close(unlink_pending=False)


def test_a_partition_that_leaves_the_kept_set_is_dropped_at_once(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """Damage met since the last keep drops the partition from the file at the next
    keep, however soon: a start after a crash must not trust it."""
    root = built(tmp_path)
    m = maintenance(tmp_path, engine)
    m.run_once()
    m.keep_known()
    m._damaged.add((root, OTHER))
    m.keep_known()  # the clock has not moved
    assert kept_partitions(tmp_path) == [str(TP)]
    m.close(unlink_pending=False)


def test_a_keep_that_failed_is_tried_again(
    tmp_path: Path, engine: LocalEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = built(tmp_path)
    m = maintenance(tmp_path, engine)
    m.run_once()
    original = known_segments.write_known_segments

    def full_disk(*args: object, **kwargs: object) -> Path:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(log_dir_module, "write_known_segments", full_disk)
    m.keep_known()
    assert not known_segments_path(tmp_path / "state", root).exists()
    monkeypatch.setattr(log_dir_module, "write_known_segments", original)
    m.keep_known()  # nothing changed, the clock has not moved: but nothing was kept
    assert kept_partitions(tmp_path) == [str(TP), str(OTHER)]
    m.close(unlink_pending=False)
