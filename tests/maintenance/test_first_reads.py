"""The first reads of a big first opening (`Maintenance(readers=...)`): segment
metadata read beside the owner's opening by `SegmentReaders`, taken by the partitions
opened, so the first cycle reads only what the readers did not; the cycle's outcome is
the same with readers, without them, and with readers that fail."""

from __future__ import annotations

import errno
import re
import shutil
import struct
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from cleanerd.engine.local import LocalEngine, WorkerSettings
from cleanerd.log.checkpoint import RECOVERY_POINT_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleanerd.log.files import CLEAN_SHUTDOWN_FILE_NAME, TopicPartition
from cleanerd.log.known_reader import read_dirs, warm_dirs
from cleanerd.log.meta import PartitionMeta
from cleanerd.log.partition_log import PartitionLog
from cleanerd.log.segment import LogSegment
from cleanerd.maintenance import cycle
from cleanerd.maintenance.cycle import Maintenance
from cleanerd.maintenance.report import CycleReport
from tests.holders import HOLD_BROKER_LOCK, held_by_other_process
from tests.maintenance.test_cycle import HOUR, T0, build, records, write_config

PARTITIONS = 4


@pytest.fixture(name="engine", scope="module")
def _engine() -> Iterator[LocalEngine]:
    with LocalEngine(WorkerSettings(workers=1, dedupe_buffer_size=4 * 1024 * 1024)) as engine:
        yield engine


@dataclass
class Reads:
    """Segments read whole, by the owner and by `InlineReaders`."""

    owner: int = 0
    reader: int = 0
    reading: bool = False


class InlineReaders:
    """Reads each job at `start`, in this process (`ReaderPool`'s are processes), but the
    last `waiting` ones, which `take_back` gives back; with `failing`, the first job fails
    and the others were never started. `finished` hands out the answers (`events` records
    when, and when a job is taken back)."""

    def __init__(self, reads: Reads, *, failing: bool = False, waiting: int = 0) -> None:
        self.reads = reads
        self.failing = failing
        self.waiting = waiting
        self.futures: list[Future[bytes]] = []
        self.check: bool | None = None
        self.waiting_jobs: list[Sequence[str]] = []
        self.taken_back: list[Sequence[str]] = []
        self.handed = 0
        self.events: list[str] = []
        self.warm: bool | None = None
        self.jobs: list[Sequence[str]] = []

    def start(
        self, jobs: Sequence[Sequence[str]], *, check: bool = False, warm: bool = False
    ) -> None:
        self.check, self.warm, self.jobs = check, warm, list(jobs)
        started = len(jobs) - self.waiting
        self.waiting_jobs = list(jobs[started:])
        for n, job in enumerate(jobs[:started]):
            future: Future[bytes] = Future()
            if self.failing and n == 0:
                future.set_exception(OSError("the reader died"))
            elif self.failing:
                future.cancel()
            else:
                self.reads.reading = True
                future.set_result(warm_dirs(job) if warm else read_dirs(job, check=check))
                self.reads.reading = False
            self.futures.append(future)

    def finished(self) -> list[Future[bytes]]:
        done = []
        for future in self.futures[self.handed :]:
            if future.cancelled():  # only `stop` drops jobs
                break
            done.append(future)
        self.handed += len(done)
        self.events += ["finished"] * bool(done)
        return done

    def take_back(self) -> Sequence[str] | None:
        if not self.waiting_jobs:
            return None
        self.taken_back.append(self.waiting_jobs.pop())
        self.events.append("taken back")
        return self.taken_back[-1]

    def stop(self) -> list[Future[bytes]]:
        return self.futures[self.handed :]


def starting(
    reads: Reads, **options: Any
) -> tuple[list[InlineReaders], Callable[[], InlineReaders]]:
    """A readers factory for `Maintenance` (`InlineReaders` with `options`), and the list
    of the readers it started."""
    started: list[InlineReaders] = []

    def readers() -> InlineReaders:
        started.append(InlineReaders(reads, **options))
        return started[-1]

    return started, readers


@pytest.fixture(name="reads")
def _reads(monkeypatch: pytest.MonkeyPatch) -> Reads:
    reads = Reads()
    read_small_whole, check = LogSegment._read_small_whole, LogSegment.check

    def count(segment: LogSegment) -> None:
        if reads.reading:
            reads.reader += 1
        else:
            reads.owner += 1

    def counting(self: LogSegment) -> None:
        count(self)
        read_small_whole(self)

    def checking(self: LogSegment) -> None:
        count(self)
        check(self)

    monkeypatch.setattr(LogSegment, "_read_small_whole", counting)
    monkeypatch.setattr(LogSegment, "check", checking)
    monkeypatch.setattr(cycle, "MANY_OPENS", PARTITIONS)
    monkeypatch.setattr(cycle, "READ_CHUNK", 3)
    return reads


def built(tmp_path: Path) -> Path:
    """Partitions of several small segments each, some past retention."""
    for n in range(PARTITIONS):
        build(
            tmp_path,
            TopicPartition("d", n),
            [records(range(3), T0 - 3 * HOUR), records(range(3), T0 - HOUR)]
            + [records(range(2), T0)] * 3,
        )
    return tmp_path


def run(root: Path, engine: LocalEngine, readers: Any) -> tuple[str, CycleReport]:
    cfg = write_config(root, {"d": {"cleanup.policy": "delete", "retention.ms": 2 * HOUR}})
    with Maintenance(cfg, engine, clock=lambda: T0, readers=readers) as m:
        report = m.run_once()
        metas = {str(k[1]): str(p.meta()) for k, p in m._plogs.items()}
    # The same but for where the copy is and its files' inodes.
    found = re.sub(r"inode=\d+", "inode=", str((report.to_json(), metas)))
    return found.replace(str(root), "<root>"), report


def copies(tmp_path: Path, n: int) -> list[Path]:
    built(tmp_path / "built")
    for i in range(n):
        shutil.copytree(tmp_path / "built", tmp_path / str(i))
    return [tmp_path / str(i) for i in range(n)]


def test_a_big_first_opening_takes_what_the_readers_read(
    tmp_path: Path, engine: LocalEngine, reads: Reads
) -> None:
    plain, with_readers = copies(tmp_path, 2)
    expected, report = run(plain, engine, None)
    assert report.retention  # the cycle did something with what it read
    assert reads.owner >= PARTITIONS * 4  # every closed segment read by the owner

    reads.owner = 0
    started, readers = starting(reads)

    with capture_logs() as logs:
        got, _ = run(with_readers, engine, readers)
    assert got == expected
    assert len(started) == 1
    assert len(started[0].futures) == 2  # 4 partitions in jobs of 3
    taken = [e for e in logs if e["event"] == "first_reads.taken"]
    assert taken[0]["segments"] == reads.reader == PARTITIONS * 5  # the active ones too
    assert reads.owner == 0


def test_the_jobs_no_reader_started_are_read_by_the_owner_meanwhile(
    tmp_path: Path, engine: LocalEngine, reads: Reads
) -> None:
    """Once its opening is done, the owner takes back the jobs the readers have not
    started (from the last one) and reads them while the readers read on."""
    plain, with_readers = copies(tmp_path, 2)
    expected, _ = run(plain, engine, None)
    reads.owner = 0
    started, readers = starting(reads, waiting=1)

    got, _ = run(with_readers, engine, readers)
    assert got == expected
    assert [list(job) for job in started[0].taken_back] == [[str(with_readers / "logs/d-3")]]
    assert reads.reader == 3 * 5  # the first job's three partitions
    assert reads.owner == 5  # the last one's


def test_the_owner_takes_each_answer_as_it_comes_before_reading_a_job_itself(
    tmp_path: Path, engine: LocalEngine, reads: Reads, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the readers read on, the owner seeds the partitions of each answer come
    in, and reads what its first cycle needs of them beyond it (`meta`), before it takes
    back a job: that part of the owner's work runs beside the readers', not after."""
    plain, with_readers = copies(tmp_path, 2)
    expected, _ = run(plain, engine, None)
    started, readers = starting(reads, waiting=1)

    meta = PartitionLog.meta

    def noted(self: PartitionLog) -> PartitionMeta:
        if started:
            started[0].events.append(f"meta {self.topic_partition}")
        return meta(self)

    monkeypatch.setattr(PartitionLog, "meta", noted)
    got, _ = run(with_readers, engine, readers)
    assert got == expected
    events = started[0].events
    assert events[: events.index("taken back") + 2] == [
        "finished",
        "meta d-0",
        "meta d-1",
        "meta d-2",
        "taken back",
        "meta d-3",
    ]


def test_an_observer_takes_what_the_readers_read_beside_its_opening(
    tmp_path: Path, engine: LocalEngine, reads: Reads
) -> None:
    """Beside a live broker (its `.lock` held), a big first opening is read by readers
    too: they check only the active segments (an observer's open leaves no check), and
    the states come out as without them."""
    plain, with_readers = copies(tmp_path, 2)
    with held_by_other_process(HOLD_BROKER_LOCK, plain / "logs"):
        expected, report = run(plain, engine, None)
    assert report.observed == (str(plain / "logs"),)
    assert len(report.states) == PARTITIONS
    assert reads.owner >= PARTITIONS * 4
    reads.owner = 0
    started, readers = starting(reads)

    with held_by_other_process(HOLD_BROKER_LOCK, with_readers / "logs"):
        got, _ = run(with_readers, engine, readers)
    holder = re.compile(r"pid \d+")  # the holder the skip names is another process
    assert holder.sub("pid", got) == holder.sub("pid", expected)
    assert started[0].check is False
    assert reads.reader == PARTITIONS * 5
    assert reads.owner == 0


def test_readers_that_fail_only_lose_their_answer(
    tmp_path: Path, engine: LocalEngine, reads: Reads
) -> None:
    plain, with_readers = copies(tmp_path, 2)
    expected, _ = run(plain, engine, None)
    reads.owner = 0

    with capture_logs() as logs:
        got, _ = run(with_readers, engine, lambda: InlineReaders(reads, failing=True))

    assert got == expected
    failed = [e for e in logs if e["event"] == "first_reads.failed"]
    assert failed[0]["reads"] == 1
    assert "the reader died" in failed[0]["error"]
    assert reads.owner >= PARTITIONS * 4


def test_no_readers_for_a_small_opening_nor_once_the_partitions_are_open(
    tmp_path: Path, engine: LocalEngine, reads: Reads, monkeypatch: pytest.MonkeyPatch
) -> None:
    (root,) = copies(tmp_path, 1)
    started, readers = starting(reads)

    cfg = write_config(root, {"d": {"cleanup.policy": "delete", "retention.ms": 2 * HOUR}})
    monkeypatch.setattr(cycle, "MANY_OPENS", PARTITIONS + 1)
    with Maintenance(cfg, engine, clock=lambda: T0, readers=readers) as m:
        m.run_once()
    assert started == []
    monkeypatch.setattr(cycle, "MANY_OPENS", PARTITIONS)
    with Maintenance(cfg, engine, clock=lambda: T0, readers=readers) as m:
        m.run_once()
        m.run_once()
    assert len(started) == 1
    # A host with one CPU gets no readers: the factory answers None.
    with Maintenance(cfg, engine, clock=lambda: T0, readers=lambda: None) as m:
        m.run_once()


def crashed_copies(
    tmp_path: Path, engine: LocalEngine, n: int, *, kept: bool = False
) -> list[Path]:
    """`n` copies of partitions that a daemon's cycle left with their recovery points at
    the log ends, then crashed: no marker, nothing kept (with `kept`, what the daemon
    keeps after its cycle, by a cycle of each copy: it is kept by the log dir's path)."""
    root = built(tmp_path / "built")
    cfg = write_config(root, {"d": {"cleanup.policy": "delete", "retention.ms": 2 * HOUR}})
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        m.run_once()
    assert not (root / "logs" / CLEAN_SHUTDOWN_FILE_NAME).exists()
    points = OffsetCheckpointFile(root / "logs" / RECOVERY_POINT_OFFSET_CHECKPOINT).read()
    assert len(points) == PARTITIONS
    for i in range(n):
        shutil.copytree(root, tmp_path / str(i))
        if kept:
            policy = {"d": {"cleanup.policy": "delete", "retention.ms": 2 * HOUR}}
            with Maintenance(
                write_config(tmp_path / str(i), policy), engine, clock=lambda: T0
            ) as m:
                m.run_once()
                m.keep_known()
    return [tmp_path / str(i) for i in range(n)]


def segments(root: Path) -> int:
    return sum(len(list(d.glob("*.log"))) for d in (root / "logs").glob("d-*"))


@pytest.mark.parametrize("waiting", [0, 1])
def test_after_a_crash_the_readers_run_the_checks_the_opening_leaves(
    tmp_path: Path, engine: LocalEngine, reads: Reads, waiting: int
) -> None:
    """Below the recovery point the opens leave their cheap checks to the readers, which
    read those segments once for both (the owner runs those of the jobs it took back);
    the cycle's outcome is the same."""
    plain, with_readers = crashed_copies(tmp_path, engine, 2)
    expected, _ = run(plain, engine, None)
    reads.owner = reads.reader = 0
    started, readers = starting(reads, waiting=waiting)

    got, _ = run(with_readers, engine, readers)
    assert got == expected
    assert started[0].check is True
    every = segments(with_readers)
    assert every >= PARTITIONS * 3
    if waiting:
        assert reads.reader == every * 3 // PARTITIONS  # the first job's three partitions
    else:
        assert reads.reader == every
        assert reads.owner == 0


def test_after_a_crash_with_what_was_kept_the_readers_warm_the_caches_from_the_back(
    tmp_path: Path, engine: LocalEngine, reads: Reads
) -> None:
    """The opening takes what was kept below the recovery points and leaves no check or
    read to the readers; they only warm the kernel's caches for it (`warm_dirs`, no
    segment read), from the last partition back while it opens from the first. The
    cycle's outcome is the same."""
    plain, with_readers = crashed_copies(tmp_path, engine, 2, kept=True)
    expected, _ = run(plain, engine, None)
    reads.owner = reads.reader = 0
    started, readers = starting(reads)

    with capture_logs() as logs:
        got, _ = run(with_readers, engine, readers)
    assert got == expected
    assert started[0].warm is True
    names = [[Path(p).name for p in job] for job in started[0].jobs]
    assert names == [["d-3", "d-2", "d-1"], ["d-0"]]  # jobs of 3
    assert reads.reader == 0
    assert not [e for e in logs if e["event"] == "first_reads.taken"]  # nothing to take


@pytest.mark.parametrize("readers", [None, "reader", "taken back", "warming"])
def test_after_a_crash_damage_below_the_recovery_point_is_the_opens_error(
    tmp_path: Path, engine: LocalEngine, reads: Reads, readers: str | None
) -> None:
    """Found before any step reads the partition, whoever ran the check (the owner's
    open, the owner for a reader, the owner for a job it took back, the owner's open
    beside readers that only warm the caches: the damaged file is no longer as kept),
    and reported as the open's error (the topic is not compacted); the files stay as
    they are."""
    (root,) = crashed_copies(tmp_path, engine, 1, kept=readers == "warming")
    damaged = sorted((root / "logs" / "d-0").glob("*.log"))[0]
    data = bytearray(damaged.read_bytes())
    data[-3] ^= 0xFF  # a value byte of its last batch
    damaged.write_bytes(bytes(data))
    waiting = 2 if readers == "taken back" else 0
    started, factory = starting(reads, waiting=waiting)

    cfg = write_config(root, {"d": {"cleanup.policy": "delete", "retention.ms": 2 * HOUR}})
    with Maintenance(cfg, engine, clock=lambda: T0, readers=factory if readers else None) as m:
        report = m.run_once()
    assert [r.warm for r in started] == ([True] if readers == "warming" else [False] * len(started))
    phases = [(e.tp, e.phase) for e in report.errors]
    assert phases[0] == (TopicPartition("d", 0), "open")
    assert all(tp == TopicPartition("d", 0) for tp, _ in phases)
    assert all(str(damaged) in e.reason for e in report.errors)
    assert damaged.read_bytes() == bytes(data)


@pytest.mark.parametrize("readers", [None, "reader"])
def test_partitions_opened_again_after_their_dir_was_offline_get_the_checks_too(
    tmp_path: Path, engine: LocalEngine, reads: Reads, readers: str | None
) -> None:
    """After a clean stop, a dir that goes offline for a cycle has its partitions opened
    again as after a crash (only a first open trusts the marker): the readers then check
    every segment, and damage below the recovery point is the open's error."""
    (root,) = copies(tmp_path, 1)
    cfg = write_config(root, {"d": {"cleanup.policy": "delete", "retention.ms": 2 * HOUR}})
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        m.run_once()
        assert m.checkpoint(clean_stop=True) == []
    logs = root / "logs"
    started, factory = starting(reads)

    with Maintenance(cfg, engine, clock=lambda: T0, readers=factory if readers else None) as m:
        m.run_once()
        points = logs / RECOVERY_POINT_OFFSET_CHECKPOINT
        good = points.read_bytes()
        points.write_text("garbage\n")
        assert m.run_once().offline
        points.write_bytes(good)
        # The time index's last entry names an offset past its log: the cheap check's.
        index = sorted((logs / "d-0").glob("*.timeindex"))[0]
        index.write_bytes(index.read_bytes() + struct.pack(">qi", T0, 1_000_000))
        report = m.run_once()
    if readers:  # (the start after the clean stop took what it kept: no readers)
        assert [r.check for r in started] == [True]
    errors = [(e.tp, e.phase) for e in report.errors]
    assert errors == [(TopicPartition("d", 0), "open")]
    assert str(index) in report.errors[0].reason


@pytest.mark.parametrize("readers", [None, "failing", "taken back"])
def test_a_check_that_fails_as_an_open_would_is_that_opens_error(
    tmp_path: Path,
    engine: LocalEngine,
    reads: Reads,
    readers: str | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An I/O error in a check the open left (one it cannot run, as it could not have
    run it at the open) is that partition's open error: the cycle goes on without the
    partition, and the next one opens it anew, checks included."""
    (root,) = crashed_copies(tmp_path, engine, 1)
    cfg = write_config(root, {"d": {"cleanup.policy": "delete", "retention.ms": 2 * HOUR}})
    original = LogSegment.sanity_check
    broken = {"d-1"}

    def sanity_check(self: LogSegment) -> bool:
        if self.log_path.parent.name in broken:
            raise OSError(errno.EIO, "Input/output error", str(self.log_path))
        return original(self)

    monkeypatch.setattr(LogSegment, "sanity_check", sanity_check)
    factory = {
        None: None,
        "failing": lambda: InlineReaders(reads, failing=True),
        "taken back": lambda: InlineReaders(reads, waiting=2),
    }[readers]
    with Maintenance(cfg, engine, clock=lambda: T0, readers=factory) as m:
        report = m.run_once()
        assert [(e.tp, e.phase) for e in report.errors] == [(TopicPartition("d", 1), "open")]
        assert all(not p.recovery_report.unchecked for p in m._plogs.values())
        assert (root / "logs", TopicPartition("d", 1)) not in m._plogs
        broken.clear()
        assert m.run_once().errors == ()
        assert (root / "logs", TopicPartition("d", 1)) in m._plogs


class BrokenReaders(InlineReaders):
    """Readers that finish nothing and whose stop fails (as a bug would): the cycle
    fails before the checks."""

    def finished(self) -> list[Future[bytes]]:
        return []

    def stop(self) -> list[Future[bytes]]:
        raise RuntimeError("the readers could not be stopped")


def test_checks_a_failed_cycle_left_undone_are_run_first_and_cost_the_marker(
    tmp_path: Path, engine: LocalEngine, reads: Reads
) -> None:
    """A cycle that fails before the checks its opening left leaves them undone: a clean
    stop then writes no marker (so the next start checks again), and the next cycle runs
    them before any step reads the partition."""
    (root,) = crashed_copies(tmp_path, engine, 1)
    damaged = sorted((root / "logs" / "d-0").glob("*.log"))[0]
    data = bytearray(damaged.read_bytes())
    data[-3] ^= 0xFF
    damaged.write_bytes(bytes(data))
    cfg = write_config(root, {"d": {"cleanup.policy": "delete", "retention.ms": 2 * HOUR}})
    marker = root / "logs" / CLEAN_SHUTDOWN_FILE_NAME
    with Maintenance(cfg, engine, clock=lambda: T0, readers=lambda: BrokenReaders(reads)) as m:
        with pytest.raises(RuntimeError):
            m.run_once()
        assert any(p.recovery_report.unchecked for p in m._plogs.values())
        m.checkpoint(clean_stop=True)
    assert not marker.exists()
    with Maintenance(cfg, engine, clock=lambda: T0, readers=lambda: BrokenReaders(reads)) as m:
        with pytest.raises(RuntimeError):
            m.run_once()
        report = m.run_once()
        assert [(e.tp, e.phase) for e in report.errors][:1] == [(TopicPartition("d", 0), "open")]
        assert str(damaged) in report.errors[0].reason
        assert all(not p.recovery_report.unchecked for p in m._plogs.values())
