"""The reader processes of a big first opening (`first_reads.ReaderPool`): they answer
what `read_dirs` reads in this process, hand out each answer finished once, give back
the jobs not started from the last one, drop those left when stopped, and are not
started on a host with one CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from cleanerd.engine import first_reads, local
from cleanerd.engine.first_reads import ReaderPool
from cleanerd.log.files import TopicPartition
from cleanerd.log.known_reader import read_dirs
from cleanerd.log.known_segments import decode
from tests.builders import build_log, kv


def built(root: Path, partitions: int) -> list[str]:
    for n in range(partitions):
        segments = [[[kv(f"k{i}", "v" * 40)] for i in range(10)] for _ in range(3)]
        build_log(root, segments, state_dir=root.parent / "state", tp=TopicPartition("t", n))
    return [str(root / f"t-{n}") for n in range(partitions)]


def first_done(jobs: list[list[str]], *, warm: bool = False) -> ReaderPool:
    """A pool of one process that was handed every job of `jobs` and has done the first
    (the others may not be)."""
    pool = ReaderPool(1)
    pool.start(jobs, warm=warm)
    assert pool._thread is not None
    pool._thread.join()  # every job handed over
    pool._jobs[0][0].result(timeout=60)
    return pool


def test_the_readers_answer_what_this_process_reads(tmp_path: Path) -> None:
    paths = built(tmp_path / "logs", 4)
    jobs = [paths[:1], paths[1:3], paths[3:]]
    futures = first_done(jobs).stop()

    assert len(futures) == 3
    assert not futures[0].cancelled()
    for job, future in zip(jobs, futures, strict=True):
        if not future.cancelled():  # dropped unless it was running
            assert decode(future.result(timeout=60)).segments == decode(read_dirs(job)).segments
    answer = decode(futures[0].result()).segments
    assert len(answer["t-0"]) == 3  # every segment


def test_warming_readers_answer_no_rows(tmp_path: Path) -> None:
    """`warm`: the processes run `warm_dirs`, which reads nothing for the owner."""
    (future,) = first_done([built(tmp_path / "logs", 2)], warm=True).stop()
    assert decode(future.result()).segments == {}


def test_the_answers_finished_are_handed_out_once(tmp_path: Path) -> None:
    paths = built(tmp_path / "logs", 3)
    pool = first_done([paths[:1], paths[1:2], paths[2:]])
    finished = pool.finished()
    assert finished[:1] == [pool._jobs[0][0]]  # the first, and any done after it
    for future in finished:
        assert decode(future.result()).segments  # done: no wait
    pool._jobs[-1][0].result(timeout=60)  # one process: every job is done
    later = pool.finished()  # the others, not those handed out already
    rest = pool.stop()
    assert rest == []
    assert finished + later + rest == [future for future, _ in pool._jobs]


def test_the_jobs_not_started_are_taken_back_from_the_last(tmp_path: Path) -> None:
    paths = built(tmp_path / "logs", 3)
    # Long jobs (300 dir reads each): the first ones handed to the process take a while.
    jobs = [paths * 100 for _ in range(10)]
    pool = ReaderPool(1)
    pool.start(jobs, check=True)
    taken = []
    while (job := pool.take_back()) is not None:
        taken.append(job)
    futures = pool.stop()
    assert taken  # one process, busy with the first: the others were still waiting
    assert all(t is j for t, j in zip(taken, reversed(jobs), strict=False))
    assert len(taken) + len(futures) == len(jobs)
    for job, future in zip(jobs, futures, strict=False):
        if not future.cancelled():
            assert decode(future.result(timeout=60)).segments == decode(read_dirs(job)).segments


def test_a_stop_drops_the_jobs_not_handed_over_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = built(tmp_path / "logs", 1)
    pool = ReaderPool(1)
    pool._stopping.set()  # as if stopped before the thread handed anything over
    pool.start([paths] * 5)
    assert pool.stop() == []


def test_a_host_with_one_cpu_gets_no_readers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local, "usable_cpus", lambda: 1)
    assert ReaderPool.for_this_host() is None
    monkeypatch.setattr(local, "usable_cpus", lambda: 64)
    pool = ReaderPool.for_this_host()
    assert pool is not None
    assert pool.workers == first_reads.MAX_READERS
    pool.stop()
