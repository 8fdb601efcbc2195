"""Tests of cleanerd.retention.disk: KIP-61 enforcement on real partitions, with a
simulated usage probe and on real tmpfs devices."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from cleanerd.log.deletions import PendingDeletions
from cleanerd.log.files import TopicPartition
from cleanerd.log.log_dir import LogDir
from cleanerd.log.partition_log import LogConfig, PartitionLog
from cleanerd.records.record import Record
from cleanerd.retention.disk import (
    DiskSpace,
    DiskUsageReport,
    enforce_disk_usage,
    group_devices,
    psutil_space,
)
from cleanerd.retention.disk_usage import DeviceUsage, DiskDeletion
from cleanerd.retention.policy import DeletionReason
from tests.builders import kv
from tests.tools import tmpfs

HOUR = 3_600_000
NOW = 1_700_000_000_000
KB = 1024
_CTX = multiprocessing.get_context("spawn")


def fill(
    log_dir: LogDir,
    tp: TopicPartition,
    ages_h: Sequence[float],
    *,
    now_ms: int = NOW,
    value_bytes: int = 1000,
    records: int = 4,
    config: LogConfig | None = None,
) -> PartitionLog:
    """One segment per age (its records that many hours old); the last one is active."""
    plog = log_dir.create_partition(tp, config=config)
    for n, age in enumerate(ages_h):
        ts = now_ms - int(age * HOUR)
        plog.append([kv(f"{tp}-{n}-{i}", "x" * value_bytes, timestamp=ts) for i in range(records)])
        if n + 1 < len(ages_h):
            plog.roll()
    return plog


def used_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def files_probe(root: Path, total: int) -> Callable[[Path], DiskSpace]:
    """A device of `total` bytes whose used bytes are the sizes of the files under `root`."""

    def probe(_path: Path) -> DiskSpace:
        return DiskSpace(total, used_bytes(root))

    return probe


@pytest.fixture(name="dirs")
def _dirs(tmp_path: Path) -> Iterator[list[LogDir]]:
    """Two owned log dirs on one device (the test's file system)."""
    opened = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        opened.append(LogDir.open(tmp_path / name, state_dir=tmp_path / "state"))
    yield opened
    for d in opened:
        d.close()


def segments_of(plog: PartitionLog) -> list[int]:
    plog.refresh()
    return [s.base_offset for s in plog.segments]


def test_log_dirs_on_one_device_are_one_device(tmp_path: Path) -> None:
    """Several log dirs on one file system form one device."""
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    devices = group_devices([tmp_path / "y", tmp_path / "x"])
    assert len(devices) == 1
    assert devices[0].log_dirs == (tmp_path / "x", tmp_path / "y")
    assert devices[0].device == (tmp_path / "x").stat().st_dev


def test_globally_oldest_go_first_across_dirs_and_topics(
    tmp_path: Path, dirs: list[LogDir]
) -> None:
    """Segments go oldest first across every topic and log dir of the device, of every
    policy, until usage is at or below the threshold; active segments stay, files are
    unlinked at once and each log start offset moves."""
    a = fill(dirs[0], TopicPartition("orders", 0), [9, 7, 5, 0])
    b = fill(dirs[1], TopicPartition("events", 0), [8, 6, 4, 0])
    root = tmp_path
    used = used_bytes(root)
    seg = a.segments[0].size + a.segments[0].offset_index.size_in_bytes
    seg += a.segments[0].time_index.size_in_bytes
    total = 2 * used  # 50% used now; 40% needs about four segments gone
    report = enforce_disk_usage(
        dirs,
        [a, b],
        percent=100 * (used - 3.5 * seg) / total,
        protects=lambda _t: False,
        now_ms=NOW,
        probe=files_probe(root, total),
    )
    order = [(d.topic_partition.topic, d.base_offset) for d in report.deletions]
    assert order == [("orders", 0), ("events", 0), ("orders", 4), ("events", 4)]
    assert all(d.reason is DeletionReason.DISK_USAGE for d in report.deletions)
    assert segments_of(a) == [8, 12]
    assert segments_of(b) == [8, 12]
    assert a.log_start_offset == 8
    assert not list(root.rglob("*.deleted"))
    assert report.still_above == ()
    assert report.after[0].used_bytes <= report.after[0].limit_bytes(
        report.after[0].threshold_percent
    )


def test_protected_topics_and_metadata_are_spared(tmp_path: Path, dirs: list[LogDir]) -> None:
    """Protected topics are never deleted, even when oldest; the device stays above its
    threshold when nothing else is left, and says so."""
    a = fill(dirs[0], TopicPartition("audit", 0), [9, 8, 0])
    b = fill(dirs[1], TopicPartition("events", 0), [1, 0])
    report = enforce_disk_usage(
        dirs,
        [a, b],
        percent=1,
        protects=lambda topic: topic.startswith("aud"),
        now_ms=NOW,
        probe=files_probe(tmp_path, 2 * used_bytes(tmp_path)),
    )
    assert [(d.topic_partition.topic, d.base_offset) for d in report.deletions] == [("events", 0)]
    assert segments_of(a) == [0, 4, 8]
    assert report.still_above == (report.before[0].device,)  # the cycle says so


def test_dry_run_changes_nothing(tmp_path: Path, dirs: list[LogDir]) -> None:
    """dry_run reports the deletions and projected usage and touches no file."""
    a = fill(dirs[0], TopicPartition("orders", 0), [9, 7, 0])
    before = sorted((p, p.stat().st_size) for p in tmp_path.rglob("*.log"))
    report = enforce_disk_usage(
        dirs,
        [a],
        percent=1,
        protects=lambda _t: False,
        now_ms=NOW,
        dry_run=True,
        probe=files_probe(tmp_path, 2 * used_bytes(tmp_path)),
    )
    assert report.dry_run
    assert [d.base_offset for d in report.deletions] == [0, 4]
    assert report.after[0].used_bytes < report.before[0].used_bytes
    assert sorted((p, p.stat().st_size) for p in tmp_path.rglob("*.log")) == before
    assert segments_of(a) == [0, 4, 8]


def test_pending_deleted_files_go_before_live_segments(tmp_path: Path, dirs: list[LogDir]) -> None:
    """`.deleted` files waiting in the pending-deletion queue for file.delete.delay.ms
    are unlinked first, each said in the log (it was silent: the files were just gone
    before their delay); when that frees enough, no live segment is deleted."""
    a = fill(dirs[0], TopicPartition("orders", 0), [9, 0])
    leftover = a.dir / "00000000000000000099.log.deleted"
    leftover.write_bytes(b"x" * 100 * KB)
    pending = PendingDeletions()
    pending.schedule([leftover], now_ms=NOW, delay_ms=HOUR)
    probe = files_probe(tmp_path, 400 * KB)
    with capture_logs() as logs:
        report = enforce_disk_usage(
            dirs,
            [a],
            percent=20,
            protects=lambda _t: False,
            now_ms=NOW,
            probe=probe,
            pending=pending,
        )
    assert report.freed_pending == (leftover,)
    (early,) = [e for e in logs if e["event"] == "segment.unlinked_early"]
    assert early["path"] == str(leftover)
    assert early["reason"].endswith("is above its threshold")
    assert len(pending) == 0
    assert report.deletions == ()
    assert segments_of(a) == [0, 4]


def test_below_threshold_or_off_does_nothing(tmp_path: Path, dirs: list[LogDir]) -> None:
    """A device at or below its threshold, or a threshold of 100, deletes nothing."""
    a = fill(dirs[0], TopicPartition("orders", 0), [9, 0])
    for percent in (100.0, 99.0):
        report = enforce_disk_usage(
            dirs,
            [a],
            percent=percent,
            protects=lambda _t: False,
            now_ms=NOW,
            probe=lambda _p: DiskSpace(1000, 990),
        )
        assert report.deletions == ()
    assert segments_of(a) == [0, 4]


def test_observed_dirs_are_never_touched(tmp_path: Path) -> None:
    """Only owned log dirs are enforced; an observed dir is left alone."""
    (tmp_path / "a").mkdir()
    with LogDir.open(tmp_path / "a", state_dir=tmp_path / "state") as owner:
        plog = fill(owner, TopicPartition("orders", 0), [9, 0])
    observed = LogDir.open(tmp_path / "a", observe=True, state_dir=tmp_path / "state")
    report = enforce_disk_usage(
        [observed],
        [PartitionLog.open(plog.dir, read_only=True)],
        percent=1,
        protects=lambda _t: False,
        now_ms=NOW,
        probe=files_probe(tmp_path, 10**6),
    )
    assert report.deletions == ()
    assert report.before == ()


def produce(log_dir: str, state_dir: str, acked: str, stop: Event, count: int) -> None:
    """A producer in its own process: appends through the partition lock of a log dir the
    test process owns, and records each acknowledged offset."""
    config = LogConfig(segment_bytes=16 * KB)
    with (
        LogDir.open(Path(log_dir), allow_shared=True, state_dir=Path(state_dir)) as shared,
        open(acked, "a") as out,
    ):
        plog = shared.create_partition(TopicPartition("events", 0), config=config)
        for i in range(count):
            if stop.is_set():
                break
            now = time.time_ns() // 1_000_000
            first, _ = plog.append([Record(0, now, f"p{i}".encode(), b"y" * 200)])
            out.write(f"{first}\n")
            out.flush()
            time.sleep(0.001)


def listing(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_size) for p in root.rglob("*"))


@pytest.mark.root
def test_tmpfs_devices_oldest_first_with_concurrent_producer(tmp_path: Path) -> None:
    """On two real tmpfs devices, filling one past the threshold deletes its globally
    oldest segments across topics and log dirs (never protected topics, the metadata log
    or active segments) until usage is under the threshold; the other device is
    untouched, and a concurrent producer loses no acknowledged record except ones
    deleted as oldest."""
    state = tmp_path / "state"
    now = time.time_ns() // 1_000_000
    with tmpfs(tmp_path / "dev-a", "4m") as dev_a, tmpfs(tmp_path / "dev-b", "4m") as dev_b:
        for path in (dev_a / "a1", dev_a / "a2", dev_b / "b1"):
            path.mkdir()
        # The metadata log, oldest of all, written under another name: cleanerd never
        # writes __cluster_metadata itself.
        with LogDir.open(dev_a / "a2", state_dir=state) as source:
            fill(source, TopicPartition("source", 0), [99, 98, 0], now_ms=now)
        (dev_a / "a2" / "source-0").rename(dev_a / "a2" / "__cluster_metadata-0")
        dirs = [LogDir.open(p, state_dir=state) for p in (dev_a / "a1", dev_a / "a2", dev_b / "b1")]
        try:
            layout = {
                (0, TopicPartition("orders", 0)): [20 - 3 * i for i in range(6)] + [0],
                (0, TopicPartition("events", 0)): [19 - 3 * i for i in range(6)] + [0],
                (1, TopicPartition("metrics", 0)): [18 - 3 * i for i in range(6)] + [0],
                (1, TopicPartition("audit", 0)): [50, 49, 48, 0],
                (2, TopicPartition("orders", 1)): [40, 30, 20, 0],
            }
            config = LogConfig(segment_bytes=128 * KB)
            logs = {
                tp: fill(
                    dirs[i], tp, ages, now_ms=now, value_bytes=12_000, records=8, config=config
                )
                for (i, tp), ages in layout.items()
            }
            metadata = dirs[1].open_partition(TopicPartition("__cluster_metadata", 0))
            b_before = listing(dev_b)
            used = psutil_space(dev_a).used_bytes
            percent = 100 * (used - 400 * KB) / psutil_space(dev_a).total_bytes
            assert percent > 40  # the fill must put device A well above the threshold
            candidates = sorted(
                (s.largest_timestamp_ms, str(tp), s.base_offset)
                for tp, plog in logs.items()
                if tp.topic != "audit" and plog.log_dir.parent == dev_a
                for s in (seg.meta() for seg in plog.segments[:-1])
            )
            actives = {tp: plog.active_segment.base_offset for tp, plog in logs.items()}

            stop = _CTX.Event()
            acked = tmp_path / "acked.txt"
            acked.touch()
            producer = _CTX.Process(
                target=produce, args=(str(dev_a / "a1"), str(state), str(acked), stop, 150)
            )
            producer.start()
            try:
                deadline = time.monotonic() + 30
                while len(acked.read_text().split()) < 20 and time.monotonic() < deadline:
                    time.sleep(0.01)
                report = enforce_disk_usage(
                    dirs,
                    [*logs.values(), metadata],
                    percent=percent,
                    protects=lambda topic: topic == "audit",
                    now_ms=now,
                    hysteresis_percent=2,
                )
            finally:
                stop.set()
                producer.join(30)
            assert producer.exitcode == 0

            deleted = [(str(d.topic_partition), d.base_offset) for d in report.deletions]
            assert deleted == [(tp, base) for _ts, tp, base in candidates[: len(deleted)]]
            assert len({tp for tp, _ in deleted}) >= 3
            assert report.after[0].used_bytes <= report.after[0].limit_bytes(percent)
            assert psutil_space(dev_a).used_bytes < psutil_space(dev_a).total_bytes * percent / 100
            assert report.still_above == ()
            assert listing(dev_b) == b_before
            assert segments_of(metadata) == [0, 4, 8]
            assert segments_of(logs[TopicPartition("audit", 0)]) == [0, 8, 16, 24]
            for tp, plog in logs.items():
                assert segments_of(plog)[-1] >= actives[tp]
                assert actives[tp] in segments_of(plog)
            events = logs[TopicPartition("events", 0)]
            events.refresh()
            readable = {r.offset for r in events.records()}
            acked_offsets = [int(line) for line in acked.read_text().split()]
            assert len(acked_offsets) > 20
            lost = [o for o in acked_offsets if o not in readable]
            assert all(o < events.log_start_offset for o in lost)
        finally:
            for log_dir in dirs:
                log_dir.close()


def _enforcement(used: tuple[int, int], bases: list[int], *, dry_run: bool) -> DiskUsageReport:
    tp = TopicPartition("t", 0)
    before, after = (DeviceUsage(1, 100, u, 50.0) for u in used)
    return DiskUsageReport(
        dry_run=dry_run,
        before=(before,),
        after=(after,),
        deletions=tuple(DiskDeletion(tp, "/l", b, 10, 10, 1, b + 1) for b in bases),
        freed_pending=(Path(f"/l/t-0/{bases[0]}.log.deleted"),) if bases else (),
        still_above=(1,) if after.used_bytes > 50 else (),
    )


def test_two_enforcements_of_one_cycle_report_as_one() -> None:
    """A cycle that enforces again beside its long passes reports both: usage before the
    first and after the later, the deletions of both; of a dry run, the later one's
    projection only (it saw the same segments)."""
    first = _enforcement((90, 70), [0, 1], dry_run=False)
    later = _enforcement((80, 40), [2], dry_run=False)
    both = first.then(later)
    assert [d.base_offset for d in both.deletions] == [0, 1, 2]
    assert (both.before, both.after) == (first.before, later.after)
    assert both.still_above == ()
    assert len(both.freed_pending) == 2
    dry = _enforcement((90, 70), [0, 1], dry_run=True).then(
        _enforcement((90, 70), [0, 1], dry_run=True)
    )
    assert [d.base_offset for d in dry.deletions] == [0, 1]
    assert dry.still_above == (1,)
