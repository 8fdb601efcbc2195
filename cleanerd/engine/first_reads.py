"""Helper processes that read segment metadata for the owner's first cycle
(`cleanerd.log.known_reader`), while the owner's process opens the partitions.

Started only for a start with thousands of partitions and nothing kept of them, or
(only warming the kernel's caches, `warm_dirs`) thousands opened as after a crash with
what was kept of most of them (see `Maintenance`), and stopped when the first opening
is done. The jobs are handed to the processes from a thread of their own, so the
owner's opening never waits for the processes to start. The workers are started by
`forkserver` (never `fork`: the daemon holds locks and threads; the server is the one
the local engine's workers come from) and die with the owner (`lifeline.py`), though
they write nothing: a reader left running would only waste a core. A reader that fails
or dies loses its answer, never a byte: the owner reads those segments itself.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import TYPE_CHECKING, Final

from cleanerd.engine.lifeline import die_with, set_parent_death_signal
from cleanerd.engine.processes import worker_context
from cleanerd.log.known_reader import read_dirs, warm_dirs
from cleanerd.log.ownership import ProcessId
from cleanerd.logger import log_to_stderr

if TYPE_CHECKING:
    from cleanerd.log_setup import LogFormat, LogLevel

MAX_READERS: Final = 8
"""Readers at most: past a few, the owner's opening is what the start waits for."""


def _init_reader(owner: ProcessId, log_format: LogFormat, log_level: LogLevel) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    set_parent_death_signal()
    die_with(owner)
    log_to_stderr(log_format, log_level)  # a reader's stdout is its parent's


class ReaderPool:
    """`workers` reader processes (`SegmentReaders` of `cleanerd.maintenance.cycle`)."""

    def __init__(
        self, workers: int, log_format: LogFormat = "auto", log_level: LogLevel = "info"
    ) -> None:
        self.workers = workers
        self._pool = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=worker_context(),
            initializer=_init_reader,
            initargs=(ProcessId.current(), log_format, log_level),
        )
        self._jobs: list[tuple[Future[bytes], Sequence[str]]] = []
        self._handed = 0
        """How many of `_jobs`, from the first, `finished` has handed out."""
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_this_host(
        cls, log_format: LogFormat = "auto", log_level: LogLevel = "info"
    ) -> ReaderPool | None:
        """A pool of one reader per CPU beside the owner's (`MAX_READERS` at most); None
        with a single CPU, where the owner reads faster itself."""
        from cleanerd.engine.local import usable_cpus  # here: the workers need none of it

        cpus = usable_cpus()
        return cls(min(cpus - 1, MAX_READERS), log_format, log_level) if cpus > 1 else None

    def start(
        self, jobs: Sequence[Sequence[str]], *, check: bool = False, warm: bool = False
    ) -> None:
        """Start reading the partition dirs of each job (`read_dirs`, with `check`; with
        `warm`, `warm_dirs`), in order."""
        self._thread = threading.Thread(
            target=self._submit,
            args=(jobs, check, warm),
            name="cleanerd-first-reads",
            daemon=True,
        )
        self._thread.start()

    def _submit(self, jobs: Sequence[Sequence[str]], check: bool, warm: bool) -> None:
        for job in jobs:
            if self._stopping.is_set():
                return
            try:
                future = (
                    self._pool.submit(warm_dirs, list(job))
                    if warm
                    else self._pool.submit(read_dirs, list(job), check=check)
                )
                self._jobs.append((future, job))
            except Exception as exc:  # noqa: BLE001 - handed to `stop`'s caller as the answer
                failed: Future[bytes] = Future()
                failed.set_exception(exc)
                self._jobs.append((failed, job))
                return

    def finished(self) -> list[Future[bytes]]:
        """The futures of the jobs done since the last call, in order up to the first
        one that is not (a cancelled job was taken back and is not among them); `stop`
        returns only the others."""
        done = []
        for future, _ in self._jobs[self._handed :]:
            if not future.done():
                break
            done.append(future)
        self._handed += len(done)
        return done

    def take_back(self) -> Sequence[str] | None:
        """The last job that no reader has started, which they will not read now; None
        once each has started (the processes take the jobs in order)."""
        if self._thread is not None:
            self._thread.join()
        if len(self._jobs) > self._handed and self._jobs[-1][0].cancel():
            return self._jobs.pop()[1]
        return None

    def stop(self) -> list[Future[bytes]]:
        """Drop the jobs not started; the futures of those handed to the processes (a
        cancelled one was dropped), which may still be running, but those `finished`
        gave."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        self._pool.shutdown(wait=False, cancel_futures=True)
        return [future for future, _ in self._jobs[self._handed :]]
