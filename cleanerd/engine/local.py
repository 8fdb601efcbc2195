"""The `local` engine: clean passes in a pool of worker processes.

Why processes. A pass spends part of its time in numba kernels that release the GIL, but
the per-batch Python around them (and the numpy calls between kernels) holds it, so two
threads do not clean two partitions in half the time; two processes do
(`bench/workers.py` measures it). The pool has `log.cleaner.threads` workers, each with
one offset map of `log.cleaner.dedupe.buffer.size / threads` bytes (Kafka gives each
cleaner thread one map) and an I/O throttle of `log.cleaner.io.max.bytes.per.second /
threads`, so all workers together stay within the configured rate.

Workers are started by the `forkserver` method, never by `fork`: the daemon holds
`flock` partition locks and the owner lock, and a forked child would inherit their open
file descriptions, keeping a lock held after the daemon released it. The fork server
preloads this module, so a new worker costs a fork, not an interpreter start. Workers
ignore SIGINT and SIGTERM: a terminal's Ctrl-C or a service stop reaches the daemon,
which asks the passes to stop (`abort`) instead of killing them between two renames.

Dispatch. At most `workers` jobs are handed to the `ProcessPoolExecutor` at a time; the
rest wait in a FIFO here, where they can still be cancelled. Each dispatched job holds a
slot in three shared-memory arrays: the job id the parent wants aborted, and the job id
and pid a worker writes when it starts the job. A pass polls its slot between segments
(the `should_abort` hook of `Cleaner`), so an abort costs a pass at most one segment of
work and its output is removed before any swap of the group in progress (the pass
guarantees that). A worker (and this process, for its own passes) keeps the memory a
pass frees for its next job, and gives it back once it has had none for a few seconds
(`heap.py`).

The crash-consistency argument. The worker runs the pass, `Cleaner.clean`, with the partition
lock (`PartitionLock`, a cross-process `flock`) as its swap lock and the log dir's
`checkpoint_lock` around the checkpoint rewrite, exactly as an in-process pass would;
nothing a worker writes differs from the in-process pass. If a worker dies (killed,
out of memory), `ProcessPoolExecutor` fails every job it had and stops the other
workers: the jobs a worker had started fail with `WorkerCrashed` (their partitions hold
at most a prefix of the rename protocol, which the next open of the partition completes
or rolls back), jobs not yet started go back to the queue, the death is counted
(`dead_workers`, Kafka's DeadThreadCount) and a new pool is started on the next dispatch.

One-shot commands (`in_process`). Starting the pool (a fork server that imports this
module, a resource tracker, a forked worker) costs about a second before any work, more
than a small pass takes, and a `cleanerd clean` often has one pass to run. So an engine
made `in_process` runs one pass at a time in this process, in a thread of its own (slot
0), and starts a pool only for passes that run beside it: `workers - 1` processes, none
when `workers` is 1 or this process may use one CPU only. The thread runs the very code
a worker runs (`_clean_job`), with this process as the owner, so the pass makes the same
proofs (`OwnerProof` finds the `.lock` in this process's registry of held locks, the
segments are checked against the snapshot) under the same partition lock and writes the
same bytes. What it does not have is a worker's isolation: signals are delivered to the
main thread, which asks the pass to stop (`abort`, `shutdown(abort=True)`) as it would a
worker, and a crash of the pass is a crash of the command, whose renames the next open
of the partition completes or rolls back. The daemon keeps its pool: its event loop
should not share a GIL with a pass.
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
import os
import pickle
import signal
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from ctypes import c_int64
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from cleanerd.compaction.cleaner import CleaningAborted, CleanResult, swapped_files
from cleanerd.compaction.offset_map import OffsetMap
from cleanerd.compaction.strategy import CompactionStrategy
from cleanerd.compaction.throttle import Throttler
from cleanerd.config import Config
from cleanerd.engine.base import CheckpointLockedCleaner, CleanJob, WorkerCrashed
from cleanerd.engine.heap import IdleRelease, keep_freed_memory
from cleanerd.engine.lifeline import die_with, set_parent_death_signal
from cleanerd.engine.processes import worker_context
from cleanerd.errors import CleanerdError
from cleanerd.log.files import TopicPartition
from cleanerd.log.lock import PartitionLock
from cleanerd.log.ownership import OwnerProof, ProcessId
from cleanerd.logger import log_to_stderr

if TYPE_CHECKING:
    from cleanerd.log_setup import LogFormat, LogLevel

RECENT_RUNS: Final = 1024
"""How many finished jobs `LocalEngine.runs` remembers."""

MAX_REQUEUES: Final = 3
"""How often a job that never started is moved to a new pool before it fails."""


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """What every worker process is started with (picklable)."""

    workers: int
    dedupe_buffer_size: int = 128 * 1024 * 1024
    load_factor: float = 0.9
    io_max_bytes_per_second: float = math.inf
    log_format: LogFormat = "auto"
    log_level: LogLevel = "info"
    """How a worker logs (to stderr, as its parent: its stdout is the parent's)."""


@dataclass(frozen=True, slots=True)
class WorkerRun:
    """Where and when a job ran: the worker's pid and its monotonic clock (system-wide on
    Linux, so runs in different processes compare)."""

    job_id: int
    tp: TopicPartition
    pid: int
    started_ns: int
    finished_ns: int
    cpu_ns: int
    """CPU time (user and system) the worker spent on the job."""


# ---------------------------------------------------------------------------------------
# The worker side.


@dataclass(slots=True)
class _Worker:
    """One worker process's state, set up by `_init_worker`."""

    settings: WorkerSettings
    owner: ProcessId
    """The process that started the pool and holds the log dirs."""
    abort_ids: Any
    started_ids: Any
    started_pids: Any
    abort_all: Any
    throttler: Throttler
    offset_map: OffsetMap | None = None
    heap: IdleRelease = field(default_factory=IdleRelease)
    """Gives back the memory the worker's passes keep for each other once it is idle
    (`heap.py`)."""

    def map_for(self, strategy: CompactionStrategy) -> OffsetMap:
        """The worker's one map (its memory is the worker's share of the dedupe buffer),
        re-made only when a pass needs another strategy."""
        if self.offset_map is None or self.offset_map.strategy is not strategy:
            self.offset_map = None  # free the old table before allocating the new one
            s = self.settings
            self.offset_map = OffsetMap.for_config(
                s.dedupe_buffer_size, s.workers, s.load_factor, strategy
            )
        return self.offset_map

    def aborted(self, slot: int, job_id: int) -> bool:
        return bool(self.abort_all.value) or self.abort_ids[slot] == job_id


_worker: _Worker | None = None


def _init_worker(
    settings: WorkerSettings,
    owner: ProcessId,
    abort_ids: Any,
    started_ids: Any,
    started_pids: Any,
    abort_all: Any,
) -> None:
    global _worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    set_parent_death_signal()
    die_with(owner)
    log_to_stderr(settings.log_format, settings.log_level)
    keep_freed_memory()
    _worker = _Worker(
        settings,
        owner,
        abort_ids,
        started_ids,
        started_pids,
        abort_all,
        Throttler(settings.io_max_bytes_per_second / settings.workers),
    )


def _portable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling unchanged in kind, else a CleanerdError with its
    text: an exception the parent cannot unpickle would break the whole pool."""
    try:
        back = pickle.loads(pickle.dumps(exc))  # noqa: S301 - our own bytes, just made
    except Exception:  # noqa: BLE001 - any failure to round-trip means "not portable"
        back = None
    if type(back) is type(exc):
        return exc
    portable = CleanerdError(f"{type(exc).__name__}: {exc}")
    portable.cleanerd_deleted_files = swapped_files(exc)  # type: ignore[attr-defined]
    return portable


def _release_frames(exc: BaseException) -> None:
    """Clear the locals of the finished frames in the tracebacks of `exc` and of the
    exceptions it carries (`__cause__`, `__context__`), keeping what a traceback prints.
    A failed pass's frames hold its mapped segments, and the pool's worker keeps its
    last error until another job fails: the files of a pass that failed (ENOSPC) stayed
    mapped, so deleting them freed no space and KIP-61 deleted more than it needed."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if e.__traceback__ is not None:
            traceback.clear_frames(e.__traceback__)
        todo += [e.__cause__, e.__context__]


def _pool_worker() -> _Worker:
    assert _worker is not None, "the pool initializer sets up every worker"
    return _worker


def _run_job(
    w: _Worker,
    slot: int,
    job_id: int,
    tp: TopicPartition,
    work: Callable[[_Worker], Any],
) -> tuple[Any, WorkerRun]:
    w.started_pids[slot] = os.getpid()
    w.started_ids[slot] = job_id
    started, cpu = time.monotonic_ns(), time.process_time_ns()
    w.heap.busy()
    try:
        result = work(w)
    except Exception as exc:  # noqa: BLE001 - re-raised, in a form the parent can unpickle
        _release_frames(exc)
        raise _portable(exc) from None
    finally:
        w.heap.idle()
    finished, cpu = time.monotonic_ns(), time.process_time_ns() - cpu
    return result, WorkerRun(job_id, tp, os.getpid(), started, finished, cpu)


def _clean_in_worker(slot: int, job_id: int, job: CleanJob) -> tuple[Any, WorkerRun]:
    return _clean_job(_pool_worker(), slot, job_id, job)


def _clean_job(w0: _Worker, slot: int, job_id: int, job: CleanJob) -> tuple[Any, WorkerRun]:
    """A clean pass, in a pool worker or in this process (`in_process`)."""

    def work(w: _Worker) -> CleanResult:
        cleaner = CheckpointLockedCleaner(
            job.state_dir,
            w.map_for(job.config.strategy.strategy),
            throttler=w.throttler,
            should_abort=lambda: w.aborted(slot, job_id),
        )
        return cleaner.clean(
            log_dir=job.log_dir,
            tp=job.tp,
            segments=job.segments,
            first_dirty=job.first_dirty,
            first_uncleanable=job.first_uncleanable,
            now_ms=job.now_ms,
            config=job.config,
            swap_lock=PartitionLock(job.state_dir, job.log_dir, job.tp),
            owner=OwnerProof(job.log_dir, w.owner),
        )

    return _run_job(w0, slot, job_id, job.tp, work)


# ---------------------------------------------------------------------------------------
# The parent side.


@dataclass(slots=True)
class _Job:
    id: int
    payload: CleanJob
    future: Future[Any]
    slot: int = -1
    generation: int = -1
    requeues: int = 0

    @property
    def tp(self) -> TopicPartition:
        return self.payload.tp


IN_PROCESS_SLOT: Final = 0
"""The slot of the pass an `in_process` engine runs in this process."""


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, e.g. a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class LocalEngine:
    """Clean passes in `settings.workers` worker processes, or with
    `in_process`, one of them in this process (see the module docstring).

    Thread-safe: jobs may be submitted, aborted and awaited from any thread.
    """

    name: Final = "local"

    def __init__(
        self, settings: WorkerSettings, *, in_process: bool = False, cpus: int | None = None
    ) -> None:
        """`cpus`: the CPUs this process may use (default `usable_cpus()`); with one, an
        `in_process` engine never starts a pool."""
        if settings.workers < 1:
            raise ValueError(f"a local engine needs at least one worker, not {settings.workers}")
        self.settings = settings
        self.in_process = in_process
        self._pool_size = settings.workers
        if in_process:
            one_cpu = (usable_cpus() if cpus is None else cpus) == 1
            self._pool_size = 0 if one_cpu else settings.workers - 1
        self._ctx = worker_context()
        self._ctx.set_forkserver_preload([__name__])
        n = self._pool_size + in_process
        self._inline: _Worker | None = None
        self._abort_ids = self._ctx.RawArray(c_int64, n)
        self._started_ids = self._ctx.RawArray(c_int64, n)
        self._started_pids = self._ctx.RawArray(c_int64, n)
        self._abort_all = self._ctx.RawValue(c_int64, 0)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._ids = itertools.count(1)
        self._queue: collections.deque[_Job] = collections.deque()
        self._running: dict[int, _Job] = {}
        self._free_slots = list(range(n - 1, -1, -1))
        self._pool: ProcessPoolExecutor | None = None
        self._generation = 0
        self.workers = self.settings.workers
        self.dead_workers = 0
        """Worker processes that died mid-job, since start (the Engine protocol's)."""
        self._closed = False
        self.runs: collections.deque[WorkerRun] = collections.deque(maxlen=RECENT_RUNS)
        """The last finished jobs, oldest first."""

    @classmethod
    def from_config(cls, config: Config, *, in_process: bool = False) -> LocalEngine:
        """An engine with the config's `log.cleaner.*` worker settings."""
        return cls(
            WorkerSettings(
                workers=config.log_cleaner_threads,
                dedupe_buffer_size=config.log_cleaner_dedupe_buffer_size,
                load_factor=config.log_cleaner_io_buffer_load_factor,
                io_max_bytes_per_second=config.log_cleaner_io_max_bytes_per_second,
                log_format=config.logging.format,
                log_level=config.logging.level,
            ),
            in_process=in_process,
        )

    # -- the Engine protocol ------------------------------------------------------------

    def submit_clean(self, job: CleanJob) -> Future[CleanResult]:
        future: Future[CleanResult] = Future()
        self._submit(_Job(next(self._ids), job, future))
        return future

    def flush(self) -> None:
        pass  # each pass starts as a worker is free

    def abort(self, tp: TopicPartition) -> bool:
        with self._lock:
            queued = next((j for j in self._queue if j.tp == tp), None)
            if queued is not None:
                self._queue.remove(queued)
                self._idle.notify_all()
            else:
                running = [j for j in self._running.values() if j.tp == tp]
                for job in running:
                    self._abort_ids[job.slot] = job.id
                return bool(running)
        queued.future.set_exception(CleaningAborted(tp))
        return True

    def shutdown(self, *, abort: bool = False) -> None:
        dropped: list[_Job] = []
        with self._lock:
            self._closed = True
            if abort:
                self._abort_all.value = 1
                dropped = list(self._queue)
                self._queue.clear()
        for job in dropped:
            job.future.set_exception(CleaningAborted(job.tp))
        with self._lock:
            while self._queue or self._running:
                self._idle.wait()
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    # -- introspection ------------------------------------------------------------------

    def running_pids(self) -> dict[TopicPartition, int]:
        """The pid of the worker running each started job, by partition."""
        with self._lock:
            return {
                job.tp: int(self._started_pids[slot])
                for slot, job in self._running.items()
                if self._started_ids[slot] == job.id
            }

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown(abort=exc[0] is not None)

    # -- dispatch -----------------------------------------------------------------------

    def _submit(self, job: _Job) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the local engine is shut down")
            self._queue.append(job)
            started = self._dispatch_locked()
        self._watch(started)

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=self._pool_size,
            mp_context=self._ctx,
            initializer=_init_worker,
            initargs=(
                self.settings,
                ProcessId.current(),
                self._abort_ids,
                self._started_ids,
                self._started_pids,
                self._abort_all,
            ),
        )

    def _dispatch_locked(self) -> list[tuple[_Job, Future[Any]]]:
        """Hand queued jobs to free slots; returns them with their pool futures, to be
        watched once the lock is released (a done callback may run at once)."""
        started: list[tuple[_Job, Future[Any]]] = []
        while self._queue and self._free_slots:
            job = self._queue.popleft()
            if not job.future.running() and not job.future.set_running_or_notify_cancel():
                continue  # cancelled by its caller while queued
            if self.in_process and IN_PROCESS_SLOT in self._free_slots:
                self._free_slots.remove(IN_PROCESS_SLOT)
                job.slot = IN_PROCESS_SLOT
                self._abort_ids[job.slot] = 0
                self._started_ids[job.slot] = 0
                self._running[job.slot] = job
                started.append((job, self._run_in_process(job)))
                continue
            if self._pool is None:
                self._pool = self._new_pool()
                self._generation += 1
            job.slot = self._free_slots.pop()
            job.generation = self._generation
            self._abort_ids[job.slot] = 0
            self._started_ids[job.slot] = 0
            try:
                inner = self._submit_to_pool(self._pool, job)
            except BrokenProcessPool:
                # The pool broke since the last dispatch and its failures are on their
                # way; the job goes back, and the next round uses a new pool.
                self._free_slots.append(job.slot)
                self._pool_broke_locked(job.generation)
                self._queue.appendleft(job)
                continue
            self._running[job.slot] = job
            started.append((job, inner))
        return started

    def _run_in_process(self, job: _Job) -> Future[tuple[Any, WorkerRun]]:
        """Run `job` in a thread of this process (the `in_process` slot); the future
        resolves as a pool's would."""
        if self._inline is None:
            keep_freed_memory()
            s = self.settings
            self._inline = _Worker(
                s,
                ProcessId.current(),
                self._abort_ids,
                self._started_ids,
                self._started_pids,
                self._abort_all,
                Throttler(s.io_max_bytes_per_second / s.workers),
            )
        w = self._inline
        inner: Future[tuple[Any, WorkerRun]] = Future()
        inner.set_running_or_notify_cancel()

        def run() -> None:
            try:
                done = _clean_job(w, job.slot, job.id, job.payload)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, as a pool would
                inner.set_exception(exc)
            else:
                inner.set_result(done)

        # Not a daemon thread: the interpreter waits for a pass at exit rather than
        # stopping it between two renames.
        threading.Thread(target=run, name=f"cleanerd-pass-{job.tp}").start()
        return inner

    def _watch(self, started: list[tuple[_Job, Future[Any]]]) -> None:
        for job, inner in started:
            inner.add_done_callback(functools.partial(self._finished, job))

    @staticmethod
    def _submit_to_pool(pool: ProcessPoolExecutor, job: _Job) -> Future[tuple[Any, WorkerRun]]:
        return pool.submit(_clean_in_worker, job.slot, job.id, job.payload)

    def _pool_broke_locked(self, generation: int) -> None:
        """Count the death once per pool and drop the pool; the next dispatch makes one."""
        if generation == self._generation and self._pool is not None:
            self.dead_workers += 1
            self._pool.shutdown(wait=False)
            self._pool = None

    def _finished(self, job: _Job, inner: Future[Any]) -> None:
        error = inner.exception()
        requeued = False
        with self._lock:
            del self._running[job.slot]
            self._free_slots.append(job.slot)
            if isinstance(error, BrokenProcessPool):
                began = self._started_ids[job.slot] == job.id
                self._pool_broke_locked(job.generation)
                job.requeues += 1
                if not began and job.requeues <= MAX_REQUEUES:
                    self._queue.appendleft(job)  # it never ran: it runs on the new pool
                    requeued = True
                else:
                    detail = str(error) if began else "the pool kept failing before it started"
                    error = WorkerCrashed(job.tp, detail)
            elif error is None:
                self.runs.append(inner.result()[1])
            started = self._dispatch_locked()
            self._idle.notify_all()
        self._watch(started)
        if requeued:
            return
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(inner.result()[0])
