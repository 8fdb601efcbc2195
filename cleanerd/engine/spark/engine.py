"""The `spark` engine: clean passes whose winners are found by a Spark job, installed here.

This module runs in the daemon's (or a command's) process and never imports Spark: it
writes a spec into a staging dir (`specs.py`), starts a job process on it
(`launch_job`: ``python -m cleanerd.engine.spark.clean_job SPEC.json`` or
``... .audit_job``, in its own session) and reads the results back.

Submitted passes are batched: the dispatcher thread gathers them until the caller says it
has submitted all it means to for now (`flush`: the maintenance cycle does after each
round of submissions), or until `max_passes` are queued, or, for a caller that never
flushes, until `linger_s` (5 s) passes with no new submission. Then it hands everything
queued (up to `max_passes`) to one job process, so the JVM's start-up is paid once per
round rather than once per partition, however long the caller takes between two
submissions (the `auto` engine samples each dirty range before routing it). Jobs run one
after another; passes submitted while a job runs go into the next.

The clean job (`clean_job.py`) writes every pass's `.cleaned` segments and a manifest.
This process then, per pass:

1. **verifies** the output against the manifest and the snapshot the pass was planned on:
   every replaced segment still has the size it had; every `.cleaned` log has the
   manifest's size and record count, valid CRCs, batches in increasing offset order from
   the group's base up to its next offset; its indexes pass their sanity checks and stay
   inside the log;
2. **installs** it with the local pass's own code (`Cleaner.install`: Kafka's `.cleaned`
   -> `.swap` -> `.deleted` renames under the partition lock, then the checkpoint under
   the log dir's checkpoint lock).

So crash safety lives in one place: the job only ever adds `.cleaned` files, which any
crash leaves to Kafka's recovery to delete, and the swap is the one the local engine does.
A job that fails or is killed (exit status, signal, no manifest) fails its passes with
`SparkJobFailed`, a `CleaningAborted`: their `.cleaned` output is removed, the originals
are untouched, nothing is marked, the cycle reports the failed step (`clean.failed`,
and `cleanerd clean` exits 1), and the next cycle plans the partition again. A pass
the job itself reports failed (a corrupt segment) or whose output fails verification
fails with a `CleanerdError`, which marks the partition uncleanable as a local pass
would; one that failed in the job keeps its kind where it matters (`install_outcome`:
stale work is planned again, a full disk is a `FileStepError`). `abort(tp)` of a pass
whose job is running discards that pass's output, and kills the job once every pass of
it is aborted (a stop of the daemon aborts them all); `shutdown(abort=True)` kills the
job's process group. Removing a pass's output removes every `.cleaned` file of its
partition (`swap.remove_stale_cleaned`): only the pass writes them (the scheduler runs
one pass of a partition at a time), and an output that overflowed a segment is based at
offsets of no source segment.

Audits (`audit_on_spark`, for `cleanerd audit --engine spark`) run the audit job
(`audit_job.py`) the same way, one job per call.

Staging dirs are `<state_dir>/spark/<job|audit>-<pid>-<start ticks>-<n>`, named after
the process that made them (`new_staging_dir`), which removes its own when the job ends.
One left by a killed process is removed when the next staging dir is made in that state
dir.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import importlib.util
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from cleanerd.compaction.audit import PartitionAudit
from cleanerd.compaction.cleaner import (
    CleanedGroup,
    CleaningAborted,
    CleanResult,
)
from cleanerd.compaction.swap import FileOps, SwapProof, cleaner_offset, remove_stale_cleaned
from cleanerd.config import Config
from cleanerd.engine.base import CheckpointLockedCleaner, CleanJob
from cleanerd.engine.lifeline import owner_env
from cleanerd.engine.spark.specs import (
    MANIFEST,
    REPORT,
    SPEC,
    AuditPartition,
    AuditReport,
    AuditSpec,
    JobSpec,
    Manifest,
    PassOutcome,
    PassSpec,
    progress_marks,
)
from cleanerd.engine.spark.tasks import AUDIT_JOB, CLEAN_JOB, python_path_env
from cleanerd.errors import CleanerdError, CorruptRecordError, FileStepError, file_step
from cleanerd.log.files import (
    CLEANED_FILE_SUFFIX,
    INDEX_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    TopicPartition,
    log_file,
    segment_file,
)
from cleanerd.log.index import OffsetIndex, TimeIndex
from cleanerd.log.lock import PartitionLock
from cleanerd.log.ownership import OwnerProof, ProcessId
from cleanerd.log.segment_reader import map_file
from cleanerd.logger import get_logger
from cleanerd.records.columns import segment_columns
from cleanerd.records.walker import DECODE_WINDOW_BYTES, OffsetRange, batch_windows

log = get_logger(__name__)

MISSING_MESSAGE: Final = "the spark engine needs `pip install cleanerd[spark]` and Java 17"
LINGER_S: Final = 5.0
MAX_PASSES_PER_JOB: Final = 64
KILL_GRACE_S: Final = 10.0
LOG_TAIL_LINES: Final = 20
_TRACEBACK: Final = "Traceback (most recent call last):"
_LINES_BEFORE: Final = 3  # of a failed job's log, shown before its exception
_JVM_HINT: Final = "Spark 4 needs Java 17 or later, from JAVA_HOME or else the PATH"
_SPARK_LOG_LINE: Final = re.compile(
    r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d (INFO|WARN|DEBUG|TRACE) |Setting default log level"
    r"|To adjust logging level|Using Spark's default log4j profile"
    # What the JVM and PySpark say at every start, whatever went wrong: a JDK module note,
    # a Python warning and the source line it quotes, socketserver's banner.
    r"|WARNING: Using incubator modules|\S+:\d+: \w*Warning: |\s+\w+\(.*\)$|-{20,}$"
    r"|Exception occurred during processing of request from"
)
_GATEWAY_GONE: Final = (
    "ConnectionRefusedError",
    "Py4JNetworkError",
    "Answer from Java side is empty",
)
"""How a job's Python side finds its Spark driver's JVM gone (killed, or out of memory)."""
_FULL_BYTES: Final = 1 << 20
"""Free bytes below which a job's staging dir counts as on a full file system."""
PROGRESS_POLL_S: Final = 0.5
STARVED_S: Final = 120.0
"""A job whose tasks no executor took for this long is stopped (`Starvation`)."""
_STARVED_LINE: Final = b"has not accepted any resources"
"""Spark's scheduler warning, repeated every 15 s while no executor takes a task set."""
_STARVED_GAP_S: Final = 40.0
"""Warnings further apart than this are two spells, not one."""
_STARVED_CHECK_S: Final = 5.0


class SparkUnavailable(CleanerdError):
    """PySpark, PyArrow or Java is missing."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(f"{MISSING_MESSAGE} ({detail})")


class SparkJobFailed(CleaningAborted):
    """The Spark job failed or was killed: an aborted pass (nothing marked), reported as
    a failed step of the cycle."""

    requested = False

    def __init__(self, tp: TopicPartition, detail: str) -> None:
        super().__init__(tp)
        self.detail = detail
        self.args = (f"spark job for {tp} failed: {detail}",)


def check_spark_available() -> None:
    """Raise SparkUnavailable unless pyspark, pyarrow and a `java` are installed."""
    for module in ("pyspark", "pyarrow"):
        if importlib.util.find_spec(module) is None:
            raise SparkUnavailable(f"no module {module}")
    java_home = os.environ.get("JAVA_HOME")
    if shutil.which("java") is None and not (java_home and Path(java_home, "bin", "java").exists()):
        raise SparkUnavailable("no java on PATH or in JAVA_HOME")


@dataclass(frozen=True, slots=True)
class SparkSettings:
    """The engine's settings (`engine.spark` of the config)."""

    master: str = "local[*]"
    conf: tuple[tuple[str, str], ...] = ()
    max_passes: int = MAX_PASSES_PER_JOB
    linger_s: float = LINGER_S


class JobRunner(Protocol):
    """Runs the job of a spec file; returns when it ended, raising when it failed. The
    default (`launch_job`) starts the job process; tests run the job in-process."""

    def __call__(
        self, spec_path: Path, staging: Path, kill: threading.Event, *, module: str = ...
    ) -> None:
        """Run ``python -m MODULE SPEC`` (with staging dir `staging`), stopping at `kill`."""
        ...


def launch_job(
    spec_path: Path,
    staging: Path,
    kill: threading.Event,
    *,
    module: str = CLEAN_JOB,
) -> None:
    """Run ``python -m MODULE SPEC`` in its own session (its own process group, so a
    kill reaches the JVM and Python workers too) and wait for it. The job dies with this
    process, whole session (`lifeline.die_with_owner_from_env`)."""
    log_path = staging / "job.log"
    env = {**os.environ, **python_path_env(), **owner_env()}
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(  # noqa: S603 - this interpreter, our module, our spec file
            [sys.executable, "-m", module, str(spec_path)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    starvation = Starvation()
    checked = time.monotonic()
    while proc.poll() is None:
        if kill.wait(0.2):
            _kill_group(proc)
            raise CleanerdError("killed (shutdown)")
        now = time.monotonic()
        if now - checked >= _STARVED_CHECK_S:
            checked = now
            if starvation.seen(log_path.read_bytes().count(_STARVED_LINE), now):
                _kill_group(proc)
                raise CleanerdError(
                    f"stopped: no Spark executor took the job's tasks for {STARVED_S:.0f} s "
                    "(Spark: 'Initial job has not accepted any resources'): no worker is "
                    "registered, or none has the cores and memory the job asks for "
                    "(engine.spark: master, spark.executor.memory, spark.executor.cores)"
                )
    if proc.returncode != 0:
        how = (
            f"killed by signal {-proc.returncode}"
            if proc.returncode < 0
            else f"exit status {proc.returncode}"
        )
        raise CleanerdError(f"{how}; {_tail(log_path)}")


class Starvation:
    """Whether a job's tasks have waited for an executor for `STARVED_S`: Spark warns
    every 15 s while none takes them (no worker, or none big enough), and would wait so
    for ever, the pass with it, and with it every pass of a daemon's Spark batches."""

    def __init__(self) -> None:
        self._count = 0
        self._since: float | None = None
        """When the current spell of warnings began."""
        self._last = 0.0

    def seen(self, count: int, now: float) -> bool:
        """Take the count of warnings in the log at `now`; True once one spell of them,
        none more than `_STARVED_GAP_S` apart, has lasted `STARVED_S`."""
        if count > self._count:
            if self._since is None or now - self._last > _STARVED_GAP_S:
                self._since = now
            self._count, self._last = count, now
        elif self._since is not None and now - self._last > _STARVED_GAP_S:
            self._since = None  # the tasks were taken: the warnings stopped
        return self._since is not None and now - self._since >= STARVED_S


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _tail(path: Path) -> str:
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    summary = job_log_summary([line for line in lines if line.strip() and " WARN " not in line])
    with contextlib.suppress(OSError):
        free = shutil.disk_usage(path.parent).free
        if free < _FULL_BYTES:
            # The job's own log is in the staging dir: on a full disk it is cut short.
            return (
                f"the state dir's file system is full ({free} bytes free at {path.parent}), "
                f"which cut the job's log short; {summary}"
            )
    return summary


def job_log_summary(lines: Sequence[str]) -> str:
    """What a failed job's log says: the exception that ended it (with the Java one a
    Py4JJavaError carries), after what was printed before its traceback that is not
    Spark's own logging (a JVM that did not start says why there); the log's last lines
    when it has no whole traceback (one cut short, say)."""
    starts = [i for i, line in enumerate(lines) if line.startswith(_TRACEBACK)]
    ending = _exception_lines(lines[starts[-1] + 1 :]) if starts else []
    if not ending:
        return "log tail: " + " | ".join(lines[-LOG_TAIL_LINES:]) if lines else "no output"
    name, _, message = ending[0].partition(": ")
    error = " ".join([f"{name.rsplit('.', 1)[-1]}: {message}" if message else name, *ending[1:]])
    before = [line for line in lines[: starts[0]] if not _said_nothing(line)]
    before = before[-_LINES_BEFORE:]
    if "JAVA_GATEWAY_EXITED" in error and not before:
        error += f" (the JVM did not start: {_JVM_HINT})"
    elif any(sign in error for sign in _GATEWAY_GONE):
        error += " (the Spark driver's JVM is gone: killed, or out of memory)"
    return " | ".join([*before, error])


def _said_nothing(line: str) -> bool:
    """A line of Spark's own logging, or of a Java stack trace (a frame, `... N more`):
    what a JVM that stopped says of why is the exception line above its frames."""
    text = line.strip()
    return bool(_SPARK_LOG_LINE.match(line)) or text.startswith("at ") or text.startswith("...")


def _exception_lines(after: Sequence[str]) -> list[str]:
    """The exception line a traceback ends with (the first line after its frames, which
    are indented), and the `: java.…` line a Py4JJavaError prints after it; [] when the
    traceback was cut short."""
    for i, line in enumerate(after):
        if line[:1].isspace():
            continue
        java = (
            [after[i + 1].strip()] if i + 1 < len(after) and after[i + 1].startswith(": ") else []
        )
        return [line, *java]
    return []


# ---------------------------------------------------------------------------------------
# Verifying and installing one pass's output.


def verify_cleaned(job: CleanJob, outcome: PassOutcome) -> None:
    """Raise CleanerdError unless the manifest's output of `job` is sound (see the module
    docstring; that the sources are unchanged is the install's `SwapProof`)."""
    for group in outcome.cleaned:
        _check_group(job.dir_path, group, job.config.max_index_size)


def _check_group(dir_path: Path, group: CleanedGroup, max_index_size: int) -> None:
    """The group's output segments (one, or more when it overflowed a segment) against
    the manifest: sizes, records, CRCs, offsets in order within [base, next offset)."""
    size = records = 0
    ends = group.base
    for base, upper in zip(group.bases, [*group.bases[1:], group.next_offset], strict=True):
        path = log_file(dir_path, base, CLEANED_FILE_SUFFIX)
        if not path.exists():
            raise CleanerdError(f"{path}: missing, the job wrote it")
        data = map_file(path)
        # Decoded a window at a time, like any segment (an output is up to 1 GiB).
        windows = batch_windows(data, DECODE_WINDOW_BYTES, OffsetRange.of_segment(base, upper))
        try:
            for start, end, offsets in windows:
                sc = segment_columns(data, start=start, end=end, verify_crc=True, offsets=offsets)
                records += int(sc.records_count.sum())
                if sc.num_batches:
                    ends = int(sc.base_offset[-1]) + int(sc.last_offset_delta[-1]) + 1
                del sc  # no view of the mapping may outlive the loop
        except CorruptRecordError as exc:
            raise exc.located(path) from exc
        size += len(data)
        _check_indexes(dir_path, base, len(data), max_index_size)
    if size != group.size_bytes or records != group.records or ends != group.next_offset:
        raise CleanerdError(
            f"{log_file(dir_path, group.base, CLEANED_FILE_SUFFIX)}: {size} bytes, {records} "
            f"records ending at {ends}; the job wrote {group.size_bytes} bytes, "
            f"{group.records} records ending at {group.next_offset}"
        )


def _check_indexes(dir_path: Path, base: int, log_size: int, max_index_size: int) -> None:
    index = OffsetIndex.load(
        segment_file(dir_path, base, INDEX_FILE_SUFFIX, CLEANED_FILE_SUFFIX),
        base,
        max_index_size=max_index_size,
    )
    index.sanity_check()
    index.check_within(log_size, log_file(dir_path, base, CLEANED_FILE_SUFFIX))
    TimeIndex.load(
        segment_file(dir_path, base, TIME_INDEX_FILE_SUFFIX, CLEANED_FILE_SUFFIX),
        base,
        max_index_size=max_index_size,
    ).sanity_check()


def install_outcome(
    job: CleanJob, outcome: PassOutcome, proof: SwapProof, *, extra_index_ms: int = 0
) -> CleanResult:
    """Verify and swap in one pass's output, proving `proof` (taken when the pass was
    submitted) under the partition lock first; raise CleanerdError (output removed) if
    the job reported the pass failed or its output is not sound, StaleWork (output
    removed) if the partition changed since, which is also what a failure in the job is
    when the partition changed under it (a segment replaced as it was read), and a
    FileStepError, as the local pass's, for a file operation that failed there (a full
    disk: the cycle frees space and tries again)."""
    try:
        if outcome.error is not None or outcome.stats is None:
            proof.verify()
            if outcome.errno is not None:
                cause = OSError(outcome.errno, outcome.error)
                raise FileStepError("running the pass in the Spark job", job.dir_path, cause)
            raise CleanerdError(outcome.error or "the job reported no statistics")
        verify_cleaned(job, outcome)
    except BaseException:
        _remove_output(job)
        raise
    # From here on a failure is the local pass's: whatever prefix of the renames happened
    # is finished or rolled back by the next open of the partition (Kafka's recovery).
    deleted = CheckpointLockedCleaner(job.state_dir, None).install(
        log_dir=job.log_dir,
        tp=job.tp,
        cleaned=outcome.cleaned,
        end_offset=outcome.end_offset,
        proof=proof,
        swap_lock=PartitionLock(job.state_dir, job.log_dir, job.tp),
    )
    stats = dataclasses.replace(
        outcome.stats,
        start_ms=outcome.stats.start_ms - extra_index_ms,
        map_bytes_read=sum(
            s.size_bytes
            for s in job.segments
            if s.base_offset < job.first_uncleanable and s.next_offset > job.first_dirty
        ),
    )
    return CleanResult(job.first_dirty, outcome.end_offset, stats, deleted)


def _remove_output(job: CleanJob) -> None:
    """Remove the `.cleaned` output of `job`'s pass (see the module docstring)."""
    remove_stale_cleaned(job.dir_path, FileOps())


def _pass_spec(job: CleanJob) -> PassSpec:
    return PassSpec(
        log_dir=job.log_dir,
        tp=job.tp,
        segments=job.segments,
        first_dirty=job.first_dirty,
        first_uncleanable=job.first_uncleanable,
        now_ms=job.now_ms,
        config=job.config,
    )


# ---------------------------------------------------------------------------------------
# The engine.


@dataclass(slots=True)
class _Pending:
    job: CleanJob
    future: Future[CleanResult]
    proof: SwapProof
    aborted: bool = False


class SparkEngine:
    """Clean passes on Spark, batched into job processes; see the module docstring.

    Thread-safe. `runner` replaces the job process (tests run the job in-process on a
    shared session).
    """

    name: Final = "spark"

    def __init__(self, settings: SparkSettings, *, runner: JobRunner | None = None) -> None:
        if runner is None:
            check_spark_available()
        self.settings = settings
        self._runner = runner if runner is not None else launch_job
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: collections.deque[_Pending] = collections.deque()
        self._running: list[_Pending] = []
        self._kill = threading.Event()
        """Kills the running job (each job gets its own)."""
        self._closed = False
        self._flushed = False
        """Everything queued was flushed: the next job need not wait for more."""
        self._last_submitted = 0.0
        self._ids = itertools.count(1)
        self.workers = settings.max_passes
        self.dead_workers = 0
        """Jobs that failed, since start (the Engine protocol's); not those killed because
        every pass of theirs was aborted."""
        self.manifests: collections.deque[Manifest] = collections.deque(maxlen=64)
        """The manifests of the last jobs (timings for metrics and the bench)."""
        self._thread = threading.Thread(target=self._dispatch, name="spark-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: Config) -> SparkEngine:
        """An engine on the config's `engine.spark` master and settings."""
        spark = config.engine.spark
        return cls(SparkSettings(master=spark.master, conf=tuple(sorted(spark.conf.items()))))

    # -- the Engine protocol ------------------------------------------------------------

    def submit_clean(self, job: CleanJob) -> Future[CleanResult]:
        future: Future[CleanResult] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the spark engine is shut down")
            self._queue.append(_Pending(job, future, _proof_of(job)))
            self._flushed = False
            self._last_submitted = time.monotonic()
            self._wake.notify_all()
        return future

    def flush(self) -> None:
        with self._lock:
            self._flushed = True
            self._wake.notify_all()

    def abort(self, tp: TopicPartition) -> bool:
        with self._lock:
            queued = next((p for p in self._queue if p.job.tp == tp), None)
            if queued is not None:
                self._queue.remove(queued)
            else:
                running = [p for p in self._running if p.job.tp == tp]
                for p in running:
                    p.aborted = True
                if running and all(p.aborted for p in self._running):
                    self._kill.set()  # nothing of the job is wanted any more: stop it now
                return bool(running)
        queued.future.set_exception(CleaningAborted(tp))
        return True

    def shutdown(self, *, abort: bool = False) -> None:
        with self._lock:
            self._closed = True
            dropped = list(self._queue) if abort else []
            if abort:
                self._queue.clear()
                self._kill.set()
                for p in self._running:
                    p.aborted = True
            self._wake.notify_all()
        for p in dropped:
            p.future.set_exception(CleaningAborted(p.job.tp))
        self._thread.join()

    def __enter__(self) -> SparkEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown(abort=exc[0] is not None)

    # -- dispatch -----------------------------------------------------------------------

    def _dispatch(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._wake.wait()
                if not self._queue:
                    return
                self._gather()
                batch = [
                    p
                    for p in itertools.islice(self._queue, self.settings.max_passes)
                    if p.future.set_running_or_notify_cancel()
                ]
                for _ in range(min(len(self._queue), self.settings.max_passes)):
                    self._queue.popleft()
                self._running = batch
                self._kill = threading.Event()
            if batch:
                self._run_batch(batch)
            with self._lock:
                self._running = []

    def _gather(self) -> None:
        """Wait (holding the lock) until the queue may go to a job: flushed, full, shut
        down, or `linger_s` after the last submission."""
        while not (self._flushed or self._closed or len(self._queue) >= self.settings.max_passes):
            quiet = time.monotonic() - self._last_submitted
            if quiet >= self.settings.linger_s:
                return
            self._wake.wait(self.settings.linger_s - quiet)

    def _run_batch(self, batch: list[_Pending]) -> None:
        staging: Path | None = None
        try:
            staging = new_staging_dir(batch[0].job.state_dir, "job", next(self._ids))
            manifest = self._run_job(batch, staging)
            for p, outcome in zip(batch, manifest.outcomes, strict=True):
                self._finish(p, outcome, manifest.startup_ms + manifest.reduce_ms)
        except BaseException as exc:  # noqa: BLE001 - every pass of the job fails with it
            if not all(p.aborted for p in batch):  # a job killed as asked did not die
                self.dead_workers += 1
            for p in batch:
                if not p.future.done():
                    _remove_output(p.job)
                    # A job killed by `shutdown(abort=True)` aborted its passes, as asked.
                    failure = (
                        CleaningAborted(p.job.tp)
                        if p.aborted
                        else SparkJobFailed(p.job.tp, str(exc))
                    )
                    p.future.set_exception(failure)
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)

    def _run_job(self, batch: Sequence[_Pending], staging: Path) -> Manifest:
        spec = JobSpec(
            passes=tuple(_pass_spec(p.job) for p in batch),
            staging=staging,
            master=self.settings.master,
            conf=dict(self.settings.conf),
        )
        spec_path = staging / SPEC
        spec.write(spec_path)
        self._runner(spec_path, staging, self._kill)
        manifest_path = staging / MANIFEST
        if not manifest_path.exists():
            raise CleanerdError("the job ended without a manifest")
        manifest = Manifest.read(manifest_path)
        if len(manifest.outcomes) != len(batch):
            raise CleanerdError(f"{len(manifest.outcomes)} outcomes for {len(batch)} passes")
        self.manifests.append(manifest)
        return manifest

    @staticmethod
    def _finish(p: _Pending, outcome: PassOutcome, index_ms: int) -> None:
        if p.aborted:
            _remove_output(p.job)
            p.future.set_exception(CleaningAborted(p.job.tp))
            return
        try:
            result = install_outcome(p.job, outcome, p.proof, extra_index_ms=index_ms)
        except (CleanerdError, OSError) as exc:
            p.future.set_exception(exc)
            return
        p.future.set_result(result)


def _proof_of(job: CleanJob) -> SwapProof:
    """What the install proves: this process (the owner) still holds the dir, the
    segments and the checkpoint entry are those of the moment the pass was submitted."""
    return SwapProof(
        job.log_dir,
        job.tp,
        job.segments,
        cleaner_offset(job.log_dir, job.tp),
        OwnerProof.of_this_process(job.log_dir),
    )


STAGING_ROOT: Final = "spark"
"""The staging dirs' dir under the state dir."""
_STAGING: Final = re.compile(r"(?:job|audit)-(\d+)-(\d+)-\d+")
"""`<kind>-<pid>-<start ticks>-<n>`: a pid with its start time names one process."""
_OLD_STAGING: Final = re.compile(r"(?:job|audit)-\d+-\d+|audit-\d+")
"""The names of staging dirs made before they held the start time (`job-<pid>-<n>`,
`audit-<pid>-<n>`, and `audit-<ns>` before that)."""
OLD_STAGING_AGE_S: Final = 86_400
"""An old-named staging dir is removed once this old: no job of that version runs on."""


def new_staging_dir(state_dir: Path, kind: str, n: int) -> Path:
    """A fresh, empty staging dir `<state_dir>/spark/<kind>-<pid>-<start ticks>-<n>` of
    this process.

    A process killed while its job ran (SIGKILL, OOM, power) left its staging dir behind,
    bitmaps and decoded columns that can run to gigabytes, and nothing else will remove
    it: so the ones whose process is gone are removed first. Those of a process still
    running (a `cleanerd audit --engine spark` beside the daemon) are left to it. The
    start time tells a dir of this process from one of an earlier process with its pid
    (a container's daemon runs as pid 1 at every start)."""
    root = state_dir / STAGING_ROOT
    for left in left_over_staging(root, now=time.time()):
        shutil.rmtree(left, ignore_errors=True)
        if not left.exists():
            log.info("spark.staging_removed", path=str(left))
    me = ProcessId.current()
    path = root / f"{kind}-{me.pid}-{me.start_ticks or 0}-{n}"
    shutil.rmtree(path, ignore_errors=True)
    with file_step("creating the Spark job's staging dir", path):
        path.mkdir(parents=True)
    return path


def left_over_staging(root: Path, *, now: float) -> list[Path]:
    """The staging dirs under `root` whose process is gone, and old-named ones a day
    old (at `now`)."""
    try:
        entries = list(root.iterdir())
    except OSError:
        return []
    left = []
    for path in entries:
        if path.is_symlink() or not path.is_dir():
            continue
        if (found := _STAGING.fullmatch(path.name)) is not None:
            pid, ticks = int(found.group(1)), int(found.group(2))
            if not ProcessId(pid, ticks or None).alive():
                left.append(path)
        elif _OLD_STAGING.fullmatch(path.name):
            with contextlib.suppress(OSError):  # removed meanwhile
                if now - path.stat().st_mtime > OLD_STAGING_AGE_S:
                    left.append(path)
    return sorted(left)


# ---------------------------------------------------------------------------------------
# Audits.


def audit_on_spark(
    partitions: Sequence[AuditPartition],
    *,
    now_ms: int,
    slack_ms: int,
    max_listed: int,
    parquet: str | None,
    settings: SparkSettings,
    staging: Path,
    runner: JobRunner | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[PartitionAudit]:
    """Audit `partitions` in an audit job process (or with `runner`); the reports in
    order, as `audit.audit_partition` gives them. While the job runs, `on_progress`
    gets every `PROGRESS_POLL_S` the segments and bytes the executors finished since
    the last call (zeros too: the caller's sign of life while Spark starts)."""
    staging.mkdir(parents=True, exist_ok=True)
    spec = AuditSpec(
        partitions=tuple(partitions),
        now_ms=now_ms,
        slack_ms=slack_ms,
        max_listed=max_listed,
        staging=staging,
        parquet=parquet,
        master=settings.master,
        conf=dict(settings.conf),
    )
    spec.write(staging / SPEC)
    done = threading.Event()
    counted: set[str] = set()

    def report() -> None:
        marks = progress_marks(staging)
        new = marks.keys() - counted
        counted.update(new)
        if on_progress is not None:
            on_progress(len(new), sum(marks[name] for name in new))

    def watch() -> None:
        while not done.wait(PROGRESS_POLL_S):
            report()

    watcher = threading.Thread(target=watch, name="spark-audit-progress", daemon=True)
    watcher.start()
    try:
        (runner or launch_job)(staging / SPEC, staging, threading.Event(), module=AUDIT_JOB)
    finally:
        done.set()
        watcher.join()
    report()
    return list(AuditReport.read(staging / REPORT).audits)
