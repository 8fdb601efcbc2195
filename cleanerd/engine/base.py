"""The engine interface: where a clean pass runs.

The scheduler decides *what* to clean (a partition, its segments, the range
[first_dirty, first_uncleanable), the instant `now_ms`); an engine decides *where* the work
runs: `local` in a pool of worker processes on this host, `spark` on a Spark cluster,
`auto` on either, pass by pass. All take the same plain, picklable job descriptions and
answer with the same results, so the scheduler and the `clean` command never know
which engine they use.

The crash-consistency contract every engine keeps, whatever runs the pass:

- A `CleanJob` future that resolves with a `CleanResult` means the cleaned segments were
  swapped in with Kafka's `.cleaned` -> `.swap` -> `.deleted` protocol (`swap.py`), each
  rename step under the partition lock (`PartitionLock` in `state_dir`, a cross-process
  `flock`, so a worker process and a `cleanerd produce` exclude each other), and the
  `cleaner-offset-checkpoint` entry was moved to `end_offset`. The old segment files in
  `deleted_files` are still on disk (renamed `.deleted`); the caller unlinks them after
  `file.delete.delay.ms`.
- A future that fails left the originals as they were (any partial `.cleaned` output is
  removed before the failure is reported), or, for `WorkerCrashed` only, a prefix of the
  rename protocol that the next open of the partition completes (Kafka's startup
  recovery, `cleanerd.log.recovery`). The exceptions: `CleaningAborted` (asked to stop by
  `abort` or `shutdown(abort=True)`; no mark), `WorkerCrashed` (the process running the
  job died: counted as a dead worker, the pool replaced), or any `CleanerdError`/`OSError`
  of the pass (a corrupt batch, a full disk: the caller marks the partition uncleanable).
- An engine runs at most what it is given: no partition is submitted twice at once
  (the scheduler's in-progress set guarantees it), and an engine never reorders the
  renames of one partition with another pass of it.

The `cleaner-offset-checkpoint` of a log dir is rewritten whole by every pass and by the
manager's resets, under the cross-process `cleanerd.log.lock.checkpoint_lock` (the
engines' passes and installs through `CheckpointLockedCleaner`).

Futures are `concurrent.futures.Future`s, so synchronous callers wait on them and an
asyncio daemon awaits them with `asyncio.wrap_future` without blocking its loop.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from cleanerd.compaction.cleaner import Cleaner, CleanerConfig, CleaningAborted, CleanResult
from cleanerd.compaction.offset_map import OffsetMap
from cleanerd.compaction.swap import SwapProof
from cleanerd.errors import CleanerdError
from cleanerd.log.files import TopicPartition
from cleanerd.log.lock import checkpoint_lock
from cleanerd.log.meta import SegmentMeta


class CheckpointLockedCleaner(Cleaner):
    """A `Cleaner` that holds the log dir's cross-process `checkpoint_lock` around its
    rewrite of `cleaner-offset-checkpoint` (its own lock covers the threads of one
    process): what every engine runs its passes and installs with."""

    def __init__(self, state_dir: Path, offset_map: OffsetMap | None, **kwargs: Any) -> None:
        super().__init__(offset_map, **kwargs)
        self.state_dir = state_dir

    def _write_checkpoint(
        self, log_dir: Path, tp: TopicPartition, end_offset: int, proof: SwapProof
    ) -> None:
        with checkpoint_lock(self.state_dir, log_dir):
            super()._write_checkpoint(log_dir, tp, end_offset, proof)


@dataclass(frozen=True, slots=True)
class CleanJob:
    """One clean pass over one partition, as plain data (picklable, engine-neutral).

    `segments` is the snapshot the range was computed on (ascending, the active segment
    last); the pass reads only those segments, so appends to the active segment during
    the pass are never touched.
    """

    log_dir: Path
    state_dir: Path
    """cleanerd's state dir: the partition lock lives under it."""
    tp: TopicPartition
    segments: tuple[SegmentMeta, ...]
    first_dirty: int
    first_uncleanable: int
    now_ms: int
    config: CleanerConfig

    @property
    def dir_path(self) -> Path:
        """The partition dir."""
        return self.log_dir / str(self.tp)


class WorkerCrashed(CleanerdError):
    """The worker running a job died (killed, out of memory, a crash in native code)."""

    def __init__(self, tp: TopicPartition, detail: str) -> None:
        self.tp = tp
        self.detail = detail
        super().__init__(f"worker cleaning {tp} died: {detail}")


class PassNotStarted(CleaningAborted):
    """The engine could not take the pass (`submit_clean` raised: the Spark engine the
    `auto` engine needs cannot start, say): an aborted pass, nothing changed and nothing
    marked, as the partition is not at fault; the cycle reports it as a failed step."""

    requested = False

    def __init__(self, tp: TopicPartition, error: BaseException) -> None:
        super().__init__(tp)
        self.args = (f"the engine could not start the pass of {tp}: {error}",)


@runtime_checkable
class Engine(Protocol):
    """Runs clean passes; see the module docstring for the contract."""

    @property
    def name(self) -> str:
        """`local`, `spark` or `auto` (the `engine.name` config value)."""
        ...

    @property
    def workers(self) -> int:
        """How many clean passes may run at once (`log.cleaner.threads` for `local`)."""
        ...

    @property
    def dead_workers(self) -> int:
        """Workers that died since the engine started (Kafka's `DeadThreadCount`)."""
        ...

    def submit_clean(self, job: CleanJob) -> Future[CleanResult]:
        """Start a pass; the future resolves when the swap is done (see the contract)."""
        ...

    def flush(self) -> None:
        """Start every pass submitted so far without waiting for more: the caller has
        submitted all it means to for now (the cycle says so after each round). An engine
        that gathers passes into jobs (`spark`) starts its job; the others start each
        pass as it is submitted and do nothing here."""
        ...

    def abort(self, tp: TopicPartition) -> bool:
        """Ask the pass of `tp` (queued or running) to stop before its next swap; its
        future then fails with CleaningAborted. False when no pass of `tp` is known."""
        ...

    def shutdown(self, *, abort: bool = False) -> None:
        """Stop accepting work and wait for the work in flight; with `abort`, ask every
        running pass to stop first (a bounded wait: each pass checks between segments)."""
        ...
