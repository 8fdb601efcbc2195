"""The first reads of a big first opening (`Maintenance(readers=...)`): segment
metadata read beside the owner's opening by `SegmentReaders`, taken by the partitions
opened, so the first cycle reads only what the readers did not; the cycle's outcome is
the same with readers, without them, and with readers that fail."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from cleanerd.engine.local import LocalEngine, WorkerSettings
from cleanerd.log.files import TopicPartition
from cleanerd.log.known_reader import read_dirs
from cleanerd.log.segment import LogSegment
from cleanerd.maintenance import cycle
from cleanerd.maintenance.cycle import Maintenance
from cleanerd.maintenance.report import CycleReport
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
    """Reads each job at `start`, in this process (`ReaderPool`'s are processes); with
    `failing`, the first job fails and the others were never started."""

    def __init__(self, reads: Reads, *, failing: bool = False) -> None:
        self.reads = reads
        self.failing = failing
        self.futures: list[Future[bytes]] = []

    def start(self, jobs: Sequence[Sequence[str]]) -> None:
        for n, job in enumerate(jobs):
            future: Future[bytes] = Future()
            if self.failing and n == 0:
                future.set_exception(OSError("the reader died"))
            elif self.failing:
                future.cancel()
            else:
                self.reads.reading = True
                future.set_result(read_dirs(job))
                self.reads.reading = False
            self.futures.append(future)

    def stop(self) -> list[Future[bytes]]:
        return self.futures


@pytest.fixture(name="reads")
def _reads(monkeypatch: pytest.MonkeyPatch) -> Reads:
    reads = Reads()
    original = LogSegment._read_small_whole

    def counting(self: LogSegment) -> None:
        if reads.reading:
            reads.reader += 1
        else:
            reads.owner += 1
        original(self)

    monkeypatch.setattr(LogSegment, "_read_small_whole", counting)
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
    started: list[InlineReaders] = []

    def readers() -> InlineReaders:
        started.append(InlineReaders(reads))
        return started[-1]

    with capture_logs() as logs:
        got, _ = run(with_readers, engine, readers)
    assert got == expected
    assert len(started) == 1
    assert len(started[0].futures) == 2  # 4 partitions in jobs of 3
    taken = [e for e in logs if e["event"] == "first_reads.taken"]
    assert taken[0]["segments"] == PARTITIONS * 4
    assert reads.reader == PARTITIONS * 4
    assert reads.owner <= PARTITIONS  # at most the active segments


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
    started: list[InlineReaders] = []

    def readers() -> InlineReaders:
        started.append(InlineReaders(reads))
        return started[-1]

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
