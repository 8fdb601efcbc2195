"""Tests of the local engine: passes and audit scans in worker processes."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cleanerd.compaction.cleaner import Cleaner, CleanerConfig, CleaningAborted
from cleanerd.compaction.offset_map import OffsetMap
from cleanerd.compaction.strategy import CompactionStrategy
from cleanerd.engine import Engine, local
from cleanerd.engine.base import CleanJob, WorkerCrashed
from cleanerd.engine.local import LocalEngine, WorkerSettings
from cleanerd.errors import CleanerdError, CorruptRecordError
from cleanerd.log.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleanerd.log.files import TopicPartition
from cleanerd.log.lock import PartitionLock, checkpoint_lock
from cleanerd.log.ownership import OwnershipLost, SegmentsChanged, StaleWork
from cleanerd.log.partition_log import PartitionLog
from cleanerd.log.segment_reader import map_file
from tests.compaction.conftest import TP, LogBuilder, k, segment_metas, view
from tests.engine.owned import own
from tests.paths import REPO
from tests.tools import session_processes, wait_for_session_end

NOW = 1_700_000_000_000
MAP_BYTES = 1 << 20
CONFIG = CleanerConfig(segment_bytes=1024 * 1024)
WAIT_S = 60.0
"""A generous bound on waiting for a worker to reach a point (not a timing assertion)."""


def build(log_dir: Path, tp: TopicPartition = TP, *, segments: int = 3) -> Path:
    """A partition of `segments` rolled segments of 10 records over 3 keys, plus an
    active one; returns its dir."""
    log = LogBuilder(log_dir.parent / f"staging-{tp}")
    for s in range(segments):
        for i in range(10):
            log.append([(k(i % 3), k(f"{s}-{i}"))], timestamps=[NOW - 10_000])
        log.roll()
    log.append([(k(9), b"active")], timestamps=[NOW])
    log_dir.mkdir(parents=True, exist_ok=True)
    return Path(shutil.move(log.write(), log_dir / str(tp)))


def job_for(log_dir: Path, state_dir: Path, tp: TopicPartition = TP, **kw: object) -> CleanJob:
    """A job for the whole dirty range of `tp`, planned by this process as the owner of
    `log_dir`."""
    own(log_dir)
    metas = tuple(segment_metas(log_dir / str(tp)))
    fields: dict[str, object] = {
        "log_dir": log_dir,
        "state_dir": state_dir,
        "tp": tp,
        "segments": metas,
        "first_dirty": 0,
        "first_uncleanable": metas[-1].base_offset,
        "now_ms": NOW,
        "config": CONFIG,
    }
    fields.update(kw)
    return CleanJob(**fields)  # type: ignore[arg-type]


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("the worker never reached the expected point")
        time.sleep(0.01)


@pytest.fixture(name="pool_engine")
def _pool_engine() -> Iterator[LocalEngine]:
    with LocalEngine(WorkerSettings(workers=2, dedupe_buffer_size=MAP_BYTES)) as engine:
        yield engine


@pytest.fixture(name="engine", params=["pool", "in-process"])
def _engine(request: pytest.FixtureRequest) -> Iterator[LocalEngine]:
    """Both ways the local engine runs a pass: every pass in the pool, or (one-shot
    commands) the first in this process and the one beside it in a pool worker. Every
    test of the pass's proofs and aborts runs both ways."""
    settings = WorkerSettings(workers=2, dedupe_buffer_size=MAP_BYTES)
    with LocalEngine(settings, in_process=request.param == "in-process", cpus=2) as engine:
        yield engine


def files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_local_engine_is_an_engine(engine: LocalEngine) -> None:
    """LocalEngine satisfies the Engine protocol and reports its workers."""
    assert isinstance(engine, Engine)
    assert (engine.name, engine.workers, engine.dead_workers) == ("local", 2, 0)


def test_worker_pass_writes_what_the_in_process_pass_writes(
    tmp_path: Path, pool_engine: LocalEngine
) -> None:
    """A pass in a worker process leaves byte-identical files and the same checkpoint."""
    build(tmp_path / "a")
    build(tmp_path / "b")
    result = pool_engine.submit_clean(job_for(tmp_path / "a", tmp_path / "state")).result()
    reference = Cleaner(OffsetMap.for_config(MAP_BYTES, 2, 0.9, CompactionStrategy.OFFSET)).clean(
        log_dir=tmp_path / "b",
        tp=TP,
        segments=segment_metas(tmp_path / "b" / str(TP)),
        first_dirty=0,
        first_uncleanable=30,
        now_ms=NOW,
        config=CONFIG,
    )
    assert (result.first_dirty, result.end_offset) == (0, 30)
    assert result.stats.messages_written == reference.stats.messages_written
    for p in result.deleted_files:
        p.unlink()
    for p in reference.deleted_files:
        p.unlink()
    assert files(tmp_path / "a" / str(TP)) == files(tmp_path / "b" / str(TP))
    assert OffsetCheckpointFile(tmp_path / "a" / CLEANER_OFFSET_CHECKPOINT).read() == {TP: 30}
    assert view(tmp_path / "a" / str(TP)).keys == [k(1), k(2), k(0), k(9)]
    assert len(pool_engine.runs) == 1
    assert pool_engine.runs[0].pid != os.getpid()


def test_two_workers_clean_two_partitions_at_once(tmp_path: Path, engine: LocalEngine) -> None:
    """Two passes run in two different processes over overlapping intervals, and the
    shared checkpoint file keeps both partitions' entries."""
    logs, state = tmp_path / "logs", tmp_path / "state"
    tps = [TopicPartition("t", 0), TopicPartition("t", 1)]
    for tp in tps:
        build(logs, tp)
    locks = [PartitionLock(state, logs, tp) for tp in tps]
    for lock in locks:
        lock.acquire()  # each pass waits at its swap until both are running
    try:
        futures = [engine.submit_clean(job_for(logs, state, tp)) for tp in tps]
        wait_until(lambda: len(engine.running_pids()) == 2)
    finally:
        for lock in locks:
            lock.release()
    for f in futures:
        f.result()
    a, b = engine.runs
    assert a.pid != b.pid
    assert a.started_ns < b.finished_ns
    assert b.started_ns < a.finished_ns
    assert OffsetCheckpointFile(logs / CLEANER_OFFSET_CHECKPOINT).read() == {
        tps[0]: 30,
        tps[1]: 30,
    }


def test_abort_of_a_running_pass_keeps_the_rest_unchanged(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """An aborted pass stops before its next group: no leftovers, no checkpoint, the
    segments it had not reached byte for byte as they were."""
    logs, state = tmp_path / "logs", tmp_path / "state"
    d = build(logs, segments=4)
    tail_before = {n: b for n, b in files(d).items() if not n.startswith("00000000000000000000")}
    # Tiny groups: every segment is cleaned and swapped on its own.
    job = job_for(logs, state, config=CleanerConfig(segment_bytes=600))
    lock = PartitionLock(state, logs, TP)
    with lock:
        future = engine.submit_clean(job)
        wait_until(lambda: any(p.name.endswith(".cleaned") for p in d.iterdir()))
        assert engine.abort(TP)
    with pytest.raises(CleaningAborted):
        future.result()
    after = files(d)
    assert not [n for n in after if n.endswith((".cleaned", ".swap"))]
    assert not (logs / CLEANER_OFFSET_CHECKPOINT).exists()
    for base in (10, 20, 30, 40):
        name = f"{base:020d}.log"
        assert after[name] == tail_before[name]


def test_abort_of_a_queued_pass_never_runs_it(tmp_path: Path) -> None:
    """A queued pass that is aborted fails with CleaningAborted and touches nothing."""
    logs, state = tmp_path / "logs", tmp_path / "state"
    d = build(logs)
    before = files(d)
    with LocalEngine(WorkerSettings(workers=1, dedupe_buffer_size=MAP_BYTES)) as engine:
        other = TopicPartition("u", 0)
        build(logs, other)
        with PartitionLock(state, logs, other):
            first = engine.submit_clean(job_for(logs, state, other))
            queued = engine.submit_clean(job_for(logs, state))
            assert engine.abort(TP)
        first.result()
        with pytest.raises(CleaningAborted):
            queued.result()
        assert not engine.abort(TP)
    assert files(d) == before


def test_killed_worker_counts_as_dead_and_the_pool_restarts(
    tmp_path: Path, pool_engine: LocalEngine
) -> None:
    """A worker killed mid-pass fails its job with WorkerCrashed; the next job runs on a
    new pool; reopening the partition removes the pass's leftovers."""
    logs, state = tmp_path / "logs", tmp_path / "state"
    d = build(logs)
    before = view(d)
    with PartitionLock(state, logs, TP):
        future = pool_engine.submit_clean(job_for(logs, state))
        wait_until(lambda: TP in pool_engine.running_pids())
        os.kill(pool_engine.running_pids()[TP], signal.SIGKILL)
        with pytest.raises(WorkerCrashed):
            future.result(timeout=WAIT_S)
    assert pool_engine.dead_workers == 1
    PartitionLog.open(d, state_dir=state, recover=True)
    assert not [p for p in d.iterdir() if p.name.endswith((".cleaned", ".swap"))]
    assert view(d) == before
    result = pool_engine.submit_clean(job_for(logs, state)).result()
    assert result.end_offset == 30
    assert pool_engine.dead_workers == 1


def test_corrupt_segment_error_names_file_and_position(tmp_path: Path, engine: LocalEngine) -> None:
    """A pass failing in a worker raises the pass's own error, file and position intact."""
    logs, state = tmp_path / "logs", tmp_path / "state"
    d = build(logs)
    seg = d / "00000000000000000010.log"
    data = bytearray(seg.read_bytes())
    data[100] ^= 0xFF
    seg.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError) as info:
        engine.submit_clean(job_for(logs, state)).result()
    assert info.value.path == str(seg)
    assert info.value.position is not None


def test_shutdown_with_abort_stops_running_and_queued_passes(tmp_path: Path) -> None:
    """shutdown(abort=True) fails the queued pass, stops the running one before its next
    group, and refuses new work."""
    logs, state = tmp_path / "logs", tmp_path / "state"
    build(logs, segments=4)
    engine = LocalEngine(WorkerSettings(workers=1, dedupe_buffer_size=MAP_BYTES))
    job = job_for(logs, state, config=CleanerConfig(segment_bytes=600))
    with PartitionLock(state, logs, TP):
        running, queued = engine.submit_clean(job), engine.submit_clean(job)
        wait_until(lambda: TP in engine.running_pids())
        stopper = threading.Thread(target=engine.shutdown, kwargs={"abort": True})
        stopper.start()
        wait_until(queued.done)
    stopper.join()
    for f in (running, queued):
        with pytest.raises(CleaningAborted):
            f.result()
    with pytest.raises(RuntimeError, match="shut down"):
        engine.submit_clean(job)


def test_checkpoint_rewrite_waits_for_the_cross_process_lock(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """A worker's pass rewrites cleaner-offset-checkpoint only under the log dir's
    checkpoint lock (another process's rewrite cannot interleave with it)."""
    logs, state = tmp_path / "logs", tmp_path / "state"
    d = build(logs)
    with checkpoint_lock(state, logs):
        future = engine.submit_clean(job_for(logs, state))
        wait_until(lambda: any(p.name.endswith(".deleted") for p in d.iterdir()))  # swapped
        assert not (logs / CLEANER_OFFSET_CHECKPOINT).exists()
        assert not future.done()
    assert future.result().end_offset == 30
    assert OffsetCheckpointFile(logs / CLEANER_OFFSET_CHECKPOINT).read() == {TP: 30}


# -- what a pass proves before it swaps (SwapProof) ---------------------------------------


def _blocked_at_first_swap(
    engine: LocalEngine, logs: Path, state: Path
) -> tuple[Path, dict[str, bytes], PartitionLock]:
    """A pass over 4 one-segment groups, held at its first swap by the partition lock
    (returned, held); the partition dir and its files before."""
    d = build(logs, segments=4)
    before = files(d)
    lock = PartitionLock(state, logs, TP)
    lock.acquire()
    return d, before, lock


def test_pass_of_an_owner_that_let_go_of_the_dir_changes_nothing(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """The owner releases the log dir while its worker's pass waits to swap: the pass
    proves ownership under the lock, fails, removes its output; nothing changed."""
    logs, state = tmp_path / "logs", tmp_path / "state"
    d, before, lock = _blocked_at_first_swap(engine, logs, state)
    future = engine.submit_clean(job_for(logs, state, config=CleanerConfig(segment_bytes=600)))
    wait_until(lambda: any(p.name.endswith(".cleaned") for p in d.iterdir()))
    own(logs).release()
    lock.release()
    with pytest.raises(OwnershipLost, match="nobody holds it"):
        future.result(timeout=WAIT_S)
    assert files(d) == before
    assert not (logs / CLEANER_OFFSET_CHECKPOINT).exists()


def test_pass_whose_segment_was_replaced_meanwhile_changes_nothing(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """Another process replaces a segment the pass read (same bytes, a new file, as a
    swap or recovery makes): the pass's proof fails before its first rename."""
    logs, state = tmp_path / "logs", tmp_path / "state"
    d, before, lock = _blocked_at_first_swap(engine, logs, state)
    future = engine.submit_clean(job_for(logs, state, config=CleanerConfig(segment_bytes=600)))
    wait_until(lambda: any(p.name.endswith(".cleaned") for p in d.iterdir()))
    seg = d / "00000000000000000020.log"
    copy = seg.with_name("copy")
    copy.write_bytes(seg.read_bytes())
    copy.replace(seg)
    lock.release()
    with pytest.raises(SegmentsChanged, match=r"00000000000000000020\.log was replaced"):
        future.result(timeout=WAIT_S)
    assert files(d) == before


def test_pass_whose_checkpoint_entry_moved_meanwhile_changes_nothing(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """Another cleaner moved the partition's cleaner-offset-checkpoint entry during the
    pass: the pass does not swap."""
    logs, state = tmp_path / "logs", tmp_path / "state"
    d, before, lock = _blocked_at_first_swap(engine, logs, state)
    future = engine.submit_clean(job_for(logs, state, config=CleanerConfig(segment_bytes=600)))
    wait_until(lambda: any(p.name.endswith(".cleaned") for p in d.iterdir()))
    OffsetCheckpointFile(logs / CLEANER_OFFSET_CHECKPOINT).write({TP: 20})
    lock.release()
    with pytest.raises(StaleWork, match="moved from None to 20"):
        future.result(timeout=WAIT_S)
    assert files(d) == before


_OWNER = """
import sys, time
from pathlib import Path
from cleanerd.compaction.cleaner import CleanerConfig
from cleanerd.engine.local import LocalEngine, WorkerSettings
from tests.engine.test_local import job_for

logs, state = Path(sys.argv[1]), Path(sys.argv[2])
engine = LocalEngine(WorkerSettings(workers=1, dedupe_buffer_size=1 << 20,
                                    io_max_bytes_per_second=2_000))
future = engine.submit_clean(job_for(logs, state, config=CleanerConfig(segment_bytes=600)))
while not engine.running_pids():
    time.sleep(0.01)
print("running", flush=True)
future.result()
print("finished", flush=True)
"""


def test_killed_owner_takes_its_worker_fork_server_and_tracker_along(tmp_path: Path) -> None:
    """SIGKILL of the process that owns the dir and started the pool ends every process
    it started (worker, fork server, resource tracker) within seconds, and the pass it
    had running never swaps: the partition is as it was, now and later."""
    logs, state = tmp_path / "logs", tmp_path / "state"
    d = build(logs, segments=4)
    before = files(d)
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER, str(logs), str(state)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=REPO,
    )
    try:
        assert owner.stdout is not None
        assert owner.stdout.readline().strip() == "running"
        session = session_processes(owner.pid)
        assert len(session) >= 3  # owner, fork server, worker (and the resource tracker)
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        wait_for_session_end(owner.pid, WAIT_S / 6)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()
    time.sleep(1)  # the pass's throttle would have let it swap by now
    PartitionLog.open(d, state_dir=state, recover=True)  # as the next owner does
    assert files(d) == before


# -- one-shot commands: passes in this process (in_process) -------------------------------


@pytest.mark.parametrize(("workers", "cpus"), [(1, 2), (2, 1)])
def test_in_process_engine_runs_every_pass_here_with_one_worker_or_one_cpu(
    tmp_path: Path, workers: int, cpus: int
) -> None:
    """With one worker, or one CPU to run on, an in_process engine runs every pass in
    this process, one after the other, and leaves what a pool worker's pass leaves."""
    logs, state = tmp_path / "logs", tmp_path / "state"
    tps = [TopicPartition("t", 0), TopicPartition("t", 1)]
    for tp in tps:
        build(logs, tp)
        build(tmp_path / "pool", tp)
    settings = WorkerSettings(workers=workers, dedupe_buffer_size=MAP_BYTES)
    with LocalEngine(settings, in_process=True, cpus=cpus) as engine:
        results = [
            f.result() for f in [engine.submit_clean(job_for(logs, state, tp)) for tp in tps]
        ]
    with LocalEngine(WorkerSettings(workers=1, dedupe_buffer_size=MAP_BYTES)) as pool:
        pooled = [pool.submit_clean(job_for(tmp_path / "pool", state, tp)).result() for tp in tps]
    assert [r.pid for r in engine.runs] == [os.getpid(), os.getpid()]
    assert [r.pid for r in pool.runs] != [os.getpid(), os.getpid()]
    a, b = engine.runs
    assert a.finished_ns <= b.started_ns  # one at a time
    for r in [*results, *pooled]:
        for p in r.deleted_files:
            p.unlink()
    for tp in tps:
        assert files(logs / str(tp)) == files(tmp_path / "pool" / str(tp))


def test_in_process_pass_runs_beside_the_callers_thread(tmp_path: Path) -> None:
    """The pass runs in a thread of its own: submit returns at once, and the pass waits
    for the partition lock the caller holds, as a worker's would."""
    logs, state = tmp_path / "logs", tmp_path / "state"
    build(logs)
    settings = WorkerSettings(workers=1, dedupe_buffer_size=MAP_BYTES)
    with LocalEngine(settings, in_process=True) as engine:
        with PartitionLock(state, logs, TP):
            future = engine.submit_clean(job_for(logs, state))
            wait_until(lambda: TP in engine.running_pids())
            assert engine.running_pids()[TP] == os.getpid()
            assert not future.done()
        assert future.result().end_offset == 30


def test_a_failed_job_keeps_none_of_its_files_mapped(tmp_path: Path) -> None:
    """A job that fails, holding a mapped segment in a frame of its traceback (or of an
    error it chains), leaves nothing mapped once its error is raised, although the error
    itself lives on (the pool's worker keeps its last one until another job fails): a
    failed pass's segments stayed mapped, so deleting them freed no space."""
    seg = tmp_path / "00000000000000000000.log"
    seg.write_bytes(b"x" * 65536)

    def work(_w: local._Worker) -> None:
        raw = map_file(seg)
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as exc:
            raise CleanerdError(f"writing the cleaned segment beside {len(raw)} bytes") from exc

    worker = local._Worker(  # what `_run_job` uses of a pool worker's state
        settings=WorkerSettings(workers=1),
        owner=None,  # type: ignore[arg-type]
        abort_ids=None,
        started_ids=[0],
        started_pids=[0],
        abort_all=None,
        throttler=None,  # type: ignore[arg-type]
    )
    with pytest.raises(CleanerdError) as caught:
        local._run_job(worker, 0, 1, TP, work)
    chained = caught.value.__context__  # (its cause is dropped to make it portable)
    assert isinstance(chained, OSError)
    assert str(seg) not in Path("/proc/self/maps").read_text()
    assert "raise OSError" in "".join(traceback.format_exception(chained))  # still printable
