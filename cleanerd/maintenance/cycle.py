"""One maintenance cycle over every log dir: the steps of `steps`, carried out.

A cycle, at the instant `now = clock()` it starts:

1. **discover**: list the partitions of each log dir (owner mode; a dir a broker holds
   is observed and left alone), open new ones (finishing any interrupted swap), forget
   vanished ones. A topic-partition found in a second log dir is skipped there: cleaning
   state is per topic-partition, as in Kafka. One that cannot be opened (a refused
   symlink, an unreadable file) is reported in `errors`, left alone this cycle and tried
   again the next; the others go on. A log dir that cannot be opened or listed, or
   whose root checkpoint files cannot be read (a malformed line, an I/O error), is
   offline for the cycle, as Kafka takes such a dir offline: reported in `offline`,
   nothing in it rolled, deleted or cleaned, no checkpoint written there (also when the
   file goes bad after the dir was read: the writes read it again first), a copy of one
   of its partitions in a later dir still skipped; tried again the next cycle, the
   other dirs maintained meanwhile. A process where no dir can be opened at all does
   not start. When `MANY_OPENS` or more of a dir's partitions
   are opened for the first time with nothing kept of them (a first start, or one after
   a crash before anything was kept), `SegmentReaders` read their segments' metadata in
   other processes meanwhile, and each partition takes what was read of its very files
   (`PartitionLog.take_known`); when `MANY_OPENS` or more open as after a crash and
   fewer than that have nothing kept, they only warm the kernel's caches for the
   opening, which checks and reads every partition itself;
2. **roll** (`roller.maybe_roll`): every active segment due by size or time;
3. **retention** (`executor.apply_retention`) on every partition the step applies to
   (`steps.retention_applies`), each only when the manager grants it
   (`LogCleanerManager.retention_hold`: not while a pass holds it; not a compacted
   partition marked uncleanable, which a compacted partition with a damaged segment is
   from the retention step on, as one its open found corrupt is from its open); a
   partition with a damaged segment loses only segments older than it;
4. **disk usage** (KIP-61, `disk.enforce_disk_usage`) when a device is above
   `log.retention.disk.usage.percent` (`steps.disk_usage_applies`), over the partitions
   the manager grants;
5. **clean**: every compacted partition's candidate is computed; while the manager has
   an eligible free partition (`grab_next`: overdue first, then nearest deadline, then
   dirtiest) and the engine a free worker, a pass is submitted; each finished pass
   re-evaluates its partition, which goes back in the queue while it is still eligible
   (a pass whose offset map filled up ends early). The phase ends when nothing eligible
   is left and no pass is running. A failed pass is recovered (its partition reopened)
   and marks its partition uncleanable; a pass whose worker died, that was planned on a
   stale state, or that ran out of space after space was freed is retried once. Passes
   may run for hours (terabytes, a throttled cleaner, a Spark job): once they have run
   `INTERLEAVE_AFTER_S`, steps 2-4 and 6 run again beside them whenever a time rule
   falls due, and when `interject` asks (a device went above its threshold), so that no
   deletion deadline and no full disk waits for them (`_interleave`);
6. **flush**: `.deleted` files whose `file.delete.delay.ms` has passed are unlinked.

Everything done is returned as a `CycleReport`, and told while the cycle runs
(`on_news`: after each step and as passes finish, `CycleNews` of what happened since the
last telling), so that what a cycle of hours did is known as it happens. Nothing here
decides: the decisions are the pure functions `steps` names; this module only orders
them and carries them out, and every mutation is one of the crash-safe operations of the
log layer (roll, `delete_segments`, the pass's swap), each under its partition lock.
`Maintenance.drain` (the daemon's `pause`) makes the cleaning phase pick no new
partition and let the passes in flight finish; a `stop` event given to `run_once` aborts
them instead.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, nullcontext, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final, NamedTuple, Protocol

from cleanerd.clock import wall_clock_ms
from cleanerd.collector import long_lived_objects
from cleanerd.compaction.cleanable import LogToClean, topic_log_to_clean
from cleanerd.compaction.cleaner import (
    CleanerConfig,
    CleaningAborted,
    CleanResult,
    swapped_files,
)
from cleanerd.compaction.manager import (
    Candidate,
    CleaningState,
    CompactedLog,
    DroppedRequest,
    LogCleanerManager,
    UncleanablePartitions,
)
from cleanerd.compaction.strategy import resolve_strategy
from cleanerd.config import Config, log_dir_failure
from cleanerd.engine.base import CleanJob, Engine, PassNotStarted, WorkerCrashed
from cleanerd.errors import (
    DAMAGE,
    CheckpointError,
    CleanerdError,
    ConfigError,
    FileStepError,
    LogDirLockedError,
    failure_text,
)
from cleanerd.log.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleanerd.log.deletions import PendingDeletions
from cleanerd.log.files import (
    METADATA_TOPIC,
    TopicPartition,
    list_partitions,
    log_file,
    partition_dir_gone,
)
from cleanerd.log.known_segments import KnownSegment, decode
from cleanerd.log.lock import partition_locks, remove_partition_lock
from cleanerd.log.log_dir import LogDir, Mode, ReadOnlyFileSystem
from cleanerd.log.meta import PartitionMeta
from cleanerd.log.ownership import Holder, OwnerProof, OwnershipLost, StaleWork, lock_holder
from cleanerd.log.partition_log import LogConfig, PartitionLog
from cleanerd.log.roller import FirstSeen, maybe_roll, segment_age
from cleanerd.log.topic_config import TopicConfig
from cleanerd.logger import get_logger
from cleanerd.maintenance.progress import CycleProgress
from cleanerd.maintenance.report import (
    CleanedLog,
    Counters,
    CycleNews,
    CycleReport,
    FailedLog,
    MaintenanceCounters,
    OfflineLogDir,
    PartitionState,
    RolledSegment,
    SkippedLog,
    StepError,
    TailCut,
    Unreadable,
)
from cleanerd.maintenance.steps import (
    HELD_UNCLEANABLE,
    disk_usage_applies,
    due_wait_ms,
    next_due_ms,
    retention_applies,
)
from cleanerd.retention.disk import (
    DiskUsageReport,
    UsageProbe,
    device_of,
    enforce_disk_usage,
    group_devices,
    is_above,
    measure,
    psutil_space,
)
from cleanerd.retention.disk_usage import DiskDeletion, device_name, freed_bytes
from cleanerd.retention.executor import RetentionOutcome, apply_retention
from cleanerd.retention.policy import retention_due_ms
from cleanerd.wording import count

log = get_logger(__name__)

ENGINE_KEYS: Final = (
    "log_cleaner_threads",
    "log_cleaner_dedupe_buffer_size",
    "log_cleaner_io_buffer_load_factor",
    "log_cleaner_io_max_bytes_per_second",
)
"""The settings a worker pool is built with: a change gives the next cycle a new engine."""
CRASH_RETRIES: Final = 1
"""Passes of a partition retried after their worker died, before it is marked."""
CYCLE_RETRIES: Final = 1
"""Passes of a partition retried in one cycle after a stale plan or, once space was
freed, a full disk."""
POLL_S: Final = 0.2
"""How often the cleaning phase looks at the stop event while passes run."""
INTERLEAVE_AFTER_S: Final = 5.0
"""How long the cleaning phase waits on its passes before it keeps the time rules going
beside them (`_interleave`)."""
MANY_OPENS: Final = 1000
"""Partitions a log dir must have to open (the daemon's first cycle on a storage host)
for the opening to run as long-lived work (`cleanerd.collector`): the partitions stay
open for the process's life, and on 10,000 of them the collections cost 2 s. Below this
the collector costs little, and a cycle that opens a few partitions (a new topic) is
left to it."""
CLEAN_STOP_THREADS: Final = 8
"""Partitions with segments to flush made what a clean stop leaves at once
(`Maintenance.checkpoint`), so their fsyncs overlap: the stop of 2,000 partitions opened
with no snapshot (12,000 fsyncs, one partition after another) took 11 s, against a
`TimeoutStopSec` of 60 s."""
KEEP_INTERVAL_MS: Final = 60_000
"""The least time between two keeps of a dir's known segments (`Maintenance.keep_known`,
about 0.6 s of one core on 10,000 partitions), as Kafka writes its recovery-point
checkpoint at most every `log.flush.offset.checkpoint.interval.ms` (60 s)."""
READ_CHUNK: Final = 100
"""Partition dirs per job of the first reads (`SegmentReaders`): small enough that the
cycle waits little for the reads running when its opening is done."""


Clock = Callable[[], int]
"""Milliseconds since the epoch."""


class SegmentReaders(Protocol):
    """Processes that read segment metadata beside this one (`known_reader.py`), for a
    first opening of `MANY_OPENS` or more partitions with nothing kept of them (or that
    only warm the kernel's caches for one as after a crash, with what was kept)."""

    def start(
        self, jobs: Sequence[Sequence[str]], *, check: bool = False, warm: bool = False
    ) -> None:
        """Start reading the partition dirs of each job, in order, without waiting; with
        `check`, running the open's cheap check of each segment too; with `warm`, only
        bringing what an open after a crash reads into the kernel's caches, answering no
        rows (`known_reader.warm_dirs`)."""
        ...

    def finished(self) -> list[Future[bytes]]:
        """The futures of the jobs done since the last call, from the first job on; `stop`
        does not return them again."""
        ...

    def take_back(self) -> Sequence[str] | None:
        """The last job no reader has started, which they will not read now (this
        process reads it meanwhile); None once each has started."""
        ...

    def stop(self) -> list[Future[bytes]]:
        """Drop the jobs not started; the futures of the others (a cancelled one was
        dropped) but those `finished` gave, each answering `known_segments.py`'s format
        for its job's dirs."""
        ...


@dataclass(frozen=True, slots=True)
class _FirstReads:
    """The reads started for one log dir's first opening."""

    readers: SegmentReaders
    partitions: frozenset[TopicPartition]
    """Opened without prefetching (and leaving the checks that need not come first):
    the readers read them, and run those checks."""
    check: bool
    """The readers check every segment (some of the partitions open as after a crash);
    without it, only the active ones."""
    warm: bool = False
    """The readers only warm the kernel's caches for the opening (`warm_dirs`): they
    read nothing for it to take, and no partition is left to them."""


@dataclass(slots=True)
class _Taking:
    """What the owner has taken so far of one log dir's first reads."""

    log_dir: LogDir
    reads: _FirstReads
    by_name: dict[str, TopicPartition]
    seen: set[TopicPartition] = field(default_factory=set)
    """The partitions some reader's answer held, and those of the jobs taken back."""
    taken: int = 0
    """Segments seeded from the answers."""
    failed: list[Exception] = field(default_factory=list)


def _fields(tp: TopicPartition, log_dir: Path) -> dict[str, str | int]:
    """The fields every log line about a partition carries (DESIGN 6)."""
    return {"topic": tp.topic, "partition": tp.partition, "log_dir": str(log_dir)}


def cleaner_config_for(topic: TopicConfig, *, producer_id_expiration_ms: int) -> CleanerConfig:
    """The settings a pass reads, from a topic's effective config."""
    return CleanerConfig(
        segment_bytes=topic.segment_bytes,
        max_index_size=topic.segment_index_bytes,
        index_interval_bytes=topic.index_interval_bytes,
        delete_retention_ms=topic.delete_retention_ms,
        producer_id_expiration_ms=producer_id_expiration_ms,
        strategy=resolve_strategy(topic.compaction_strategy, topic.compaction_strategy_header),
    )


@dataclass(slots=True)
class _Interleaving:
    """The cleaning phase's steps beside its passes (`Maintenance._interleave`)."""

    since: float
    """When the phase began (monotonic seconds)."""
    due_ms: int | None = None
    """The next time-rule deadline; None: none."""
    due_known: bool = False
    """`due_ms` was computed (only once the passes ran `INTERLEAVE_AFTER_S`)."""
    ran_at_ms: int | None = None
    """When the steps beside the passes last ended (the cycle's clock); None: never."""
    ran_ms: int = 0
    """How long they ran then (`steps.due_wait_ms`)."""


@dataclass(slots=True)
class _Builder:
    """The report of the cycle in progress."""

    now_ms: int
    rolled: list[RolledSegment] = field(default_factory=list)
    retention: list[RetentionOutcome] = field(default_factory=list)
    disk_usage: DiskUsageReport | None = None
    cleaned: list[CleanedLog] = field(default_factory=list)
    failed: list[FailedLog] = field(default_factory=list)
    errors: list[StepError] = field(default_factory=list)
    skipped: list[SkippedLog] = field(default_factory=list)
    unlinked: list[Path] = field(default_factory=list)
    states: list[PartitionState] = field(default_factory=list)
    observed: list[str] = field(default_factory=list)
    aborted: bool = False
    next_due_ms: int | None = None
    truncated: list[TailCut] = field(default_factory=list)
    unreadable: list[Unreadable] = field(default_factory=list)
    offline: list[OfflineLogDir] = field(default_factory=list)
    dropped: list[DroppedRequest] = field(default_factory=list)
    damaged: set[tuple[Path, TopicPartition]] = field(default_factory=set)
    """Where damaged data was met (the process's set, shared by its cycles)."""
    repeated: Mapping[tuple[str, TopicPartition, str], str] = field(default_factory=dict)
    """The previous cycle's step errors (log dir, partition, phase -> reason)."""
    _skipped: set[SkippedLog] = field(default_factory=set)
    _errors: set[StepError] = field(default_factory=set)
    later_states: list[PartitionState] = field(default_factory=list)
    """`CycleNews.later_states`."""
    _told: tuple[int, int, int, int, int, int, int] = (0, 0, 0, 0, 0, 0, 0)
    """How many of each kind of `CycleNews` were told (`news`): each list only grows."""

    def skip(self, log_dir: Path | str, tp: TopicPartition | None, phase: str, reason: str) -> None:
        """Record a step left out; once per cycle (a step run again beside long passes
        meets the same partitions again)."""
        skipped = SkippedLog(str(log_dir), tp, phase, reason)
        if skipped not in self._skipped:
            self._skipped.add(skipped)
            self.skipped.append(skipped)

    def error(self, log_dir: Path, tp: TopicPartition, phase: str, exc: BaseException) -> None:
        """Record a failed step, logged as an error naming the partition (and, through
        the exception's text, the file)."""
        # The same failure as the previous cycle's is logged at debug: a damaged
        # partition fails its steps every cycle until it is repaired, and the daemon
        # would log it again every few seconds.
        # So is one the same cycle met already (its steps run again beside long passes).
        # A partition deleted meanwhile (its topic) met its deletion, not a failure.
        if partition_dir_gone(Path(log_dir) / str(tp)):
            log.info(f"{phase}.partition_gone", **_fields(tp, log_dir), error=str(exc))
            return
        error = StepError(str(log_dir), tp, phase, str(exc))
        same = self.repeated.get((str(log_dir), tp, phase)) == str(exc)
        met = error in self._errors  # a set: a dir's thousands of partitions may fail
        logged = log.debug if same or met else log.error
        logged(f"{phase}.failed", **_fields(tp, log_dir), error=str(exc), repeated=same)
        if not met:
            self._errors.add(error)
            self.errors.append(error)
        self.met(log_dir, tp, exc)

    def unread(self, log_dir: Path, tp: TopicPartition, topic: TopicConfig, reason: str) -> None:
        """Record a partition that could not be opened or read."""
        self.unreadable.append(Unreadable(str(log_dir), tp, topic.cleanup_policy, reason))

    def met(self, log_dir: Path, tp: TopicPartition, exc: BaseException) -> None:
        """Keep `tp` among the damaged partitions when `exc` is damage it holds."""
        if isinstance(exc, DAMAGE):
            self.damaged.add((log_dir, tp))

    def _disk_deleted(self) -> tuple[DiskDeletion, ...]:
        return () if self.disk_usage is None else self.disk_usage.deleted

    def touched_untold(self) -> set[tuple[str, TopicPartition]]:
        """The partitions (log dir, topic-partition) rolled or deleted from since the last
        `news`."""
        rolled, retained, disk = self._told[:3]
        return (
            {(r.log_dir, r.tp) for r in self.rolled[rolled:]}
            | {(o.log_dir, TopicPartition(o.topic, o.partition)) for o in self.retention[retained:]}
            | {(d.log_dir, d.topic_partition) for d in self._disk_deleted()[disk:]}
        )

    def news(self) -> CycleNews:
        """What the cycle did since the last call (empty: nothing)."""
        disk = self._disk_deleted()
        r, o, d, c, f, x, p = self._told
        self._told = (
            len(self.rolled),
            len(self.retention),
            len(disk),
            len(self.cleaned),
            len(self.failed),
            len(self.dropped),
            len(self.later_states),
        )
        return CycleNews(
            tuple(self.rolled[r:]),
            tuple(self.retention[o:]),
            disk[d:],
            tuple(self.cleaned[c:]),
            tuple(self.failed[f:]),
            tuple(self.dropped[x:]),
            tuple(self.later_states[p:]),
        )

    def build(self, finished_ms: int) -> CycleReport:
        return CycleReport(
            now_ms=self.now_ms,
            finished_ms=finished_ms,
            rolled=tuple(self.rolled),
            retention=tuple(self.retention),
            disk_usage=self.disk_usage,
            cleaned=tuple(self.cleaned),
            failed=tuple(self.failed),
            skipped=tuple(self.skipped),
            unlinked=tuple(self.unlinked),
            states=tuple(self.states),
            observed=tuple(self.observed),
            aborted=self.aborted,
            errors=tuple(self.errors),
            next_due_ms=self.next_due_ms,
            truncated=tuple(self.truncated),
            unreadable=tuple(self.unreadable),
            offline=tuple(self.offline),
            dropped=tuple(self.dropped),
        )


# ---------------------------------------------------------------------------------------
# The cycle


@dataclass(frozen=True, slots=True)
class MaintenanceStatus:
    """What the metrics read of the maintenance state between cycles (`status`)."""

    uncleanable: UncleanablePartitions
    counters: Counters
    last_run_ms: int | None
    """When the manager last looked for work (Kafka's time of last run)."""
    dead_workers: int


@dataclass(frozen=True, slots=True)
class _Partition:
    log_dir: LogDir
    plog: PartitionLog
    topic: TopicConfig

    @property
    def tp(self) -> TopicPartition:
        return self.plog.topic_partition


@dataclass(slots=True)
class _Running:
    candidate: Candidate
    job: CleanJob
    started_ms: int


class Maintenance:
    """The long-lived state of the cycles over the log dirs of `config`: the open log
    dirs (owner locks held until `close`), the open partitions, the scheduler, the
    first-seen registries, the pending deletions and the counters.

    Args:
        config: the configuration.
        engine: where passes run (`create_engine`).
        clock: milliseconds since the epoch; a constant clock evaluates every rule at
            one instant (`cleanerd clean --now-ms`).
        topics: only these topics are rolled, retained and cleaned (None: all); disk
            usage, which orders segments across every topic, is then not enforced.
        usage_probe: a device's capacity and usage (statvfs through psutil; tests give
            a model of a small disk).
        progress_interval_s: log `cycle.progress` this often during a long cycle (the
            daemon's; None: never, as for `cleanerd clean`, which draws its own).
        on_news: called, in the cycle's thread, with what the cycle in progress did
            since it was last called (the daemon's events); None: the report only.
    """

    def __init__(
        self,
        config: Config,
        engine: Engine,
        *,
        clock: Clock = wall_clock_ms,
        topics: frozenset[str] | None = None,
        usage_probe: UsageProbe = psutil_space,
        progress_interval_s: float | None = None,
        readers: Callable[[], SegmentReaders | None] | None = None,
        on_news: Callable[[CycleNews], None] | None = None,
    ) -> None:
        """`readers`: starts `SegmentReaders` for a big first opening (None: none)."""
        self.config = config
        self.on_news = on_news
        self.readers = readers
        self.progress_interval_s = progress_interval_s
        self._progress = CycleProgress(math.inf)
        self._stop: threading.Event | None = None
        """The running cycle's stop event (`run_once`)."""
        self.usage_probe = usage_probe
        self.engine = engine
        self.clock = clock
        self.topics = topics
        self.manager = LogCleanerManager()
        self.pending = PendingDeletions()
        self.counters = MaintenanceCounters()
        self.log_dirs: list[LogDir] = []
        """The log dirs opened, in the order of `log.dirs`."""
        self._unopened: dict[Path, str] = {}
        """The log dirs of `log.dirs` that could not be opened, and why: opened again at
        the next cycle (`_open_unopened`)."""
        self._offline: dict[Path, str] = {}
        """The log dirs offline in the last cycle, and why (a repeat is logged at debug)."""
        self._listed: dict[Path, list[TopicPartition]] = {}
        """Each log dir's partitions when it was last listed."""
        self._lock_files_left: dict[Path, set[TopicPartition]] = {}
        """Per owned log dir, the gone partitions whose lock files could not be removed
        yet (`_remove_gone_locks`); a dir not in it was never listed as owned."""
        self._maintained_in: dict[TopicPartition, Path] = {}
        """The log dir each partition is maintained in, kept while that dir is offline: a
        copy that appears in another dir (one that came online with a stale copy) does
        not take its place."""
        self._reload_lock = threading.Lock()
        self._retry_pending = False
        """A reload asked for the uncleanable partitions to be tried again."""
        self._first_seen: dict[Path, FirstSeen] = {}
        self._plogs: dict[tuple[Path, TopicPartition], PartitionLog] = {}
        self._crashes: dict[TopicPartition, int] = {}
        self._retries: dict[TopicPartition, int] = {}
        """Passes retried this cycle, by partition (`CYCLE_RETRIES`)."""
        self._passed_again: dict[TopicPartition, int] = {}
        """Whole passes of a partition looked at again in this cycle (`_finished`)."""
        self._last_step_errors: Mapping[tuple[str, TopicPartition, str], str] = {}
        """The previous cycle's step errors, whose repeats are logged at debug."""
        self._last_notes: set[tuple[str, Path, TopicPartition | None, str]] = set()
        self._notes: set[tuple[str, Path, TopicPartition | None, str]] = set()
        """Warnings about a partition's or a dir's state (event, dir, partition or None,
        detail) of the previous cycle and of this one: a repeat is logged at debug
        (`_once`)."""
        self._holders: dict[Path, Holder] = {}
        """The process last seen holding each observed dir held when opened, when it is
        not the one that held it then (`_note_released` names who let go)."""
        self._cuts_reported: dict[tuple[Path, TopicPartition], tuple[PartitionLog, int]] = {}
        """How many of each open partition's tail cuts the reports have listed, and of
        which opening of it (a reopen after a failed pass recovers anew)."""
        self._damaged: set[tuple[Path, TopicPartition]] = set()
        """The partitions where a step of this process met damaged data: a clean stop
        writes no clean-shutdown marker in their dirs."""
        self._kept: dict[Path, _Kept] = {}
        """Per owned log dir, what `keep_known` last kept."""
        self.drain = threading.Event()
        """While set, the cleaning phase starts no pass (those in flight finish). Any
        thread may set or clear it."""
        self._interject = threading.Event()
        """Set by `interject`: the cleaning phase runs the other steps again beside its
        passes."""
        lent = False  # a dir a one-shot command owns: it will be usable
        try:
            for path in self._configured_dirs():
                try:
                    self._open_dir(path)
                except LogDirLockedError as exc:
                    if not exc.ends_by_itself:
                        raise  # another cleanerd daemon owns it: a mistake to fix first
                    # A one-shot command (a `produce` that came after the start's wait):
                    # offline until it lets go, tried again every cycle.
                    self._unopened[path] = log_dir_failure(self.config, path, exc)
                    lent = True
                except (CleanerdError, OSError) as exc:
                    self._unopened[path] = log_dir_failure(self.config, path, exc)
            if not self.log_dirs and not lent:  # none usable: as a broker, do not start
                why = "; ".join(self._unopened.values())
                raise CleanerdError(f"no log dir could be opened: {why}")
        except BaseException:
            self.close(unlink_pending=False)
            raise

    def _configured_dirs(self) -> list[Path]:
        return [Path(p) for p in self.config.log_dirs]

    @property
    def _mode_wanted(self) -> Mode:
        return Mode.OBSERVE if self.config.observe else Mode.OWNER

    def _open_dir(self, path: Path) -> None:
        log_dir = LogDir.open(path, observe=self.config.observe, state_dir=self.config.state_dir)
        self.log_dirs.append(log_dir)
        order = self._configured_dirs()
        self.log_dirs.sort(key=lambda d: order.index(d.path) if d.path in order else len(order))
        if log_dir.mode is Mode.OBSERVE and log_dir.held_by is None:
            log.info("log_dir.observed", log_dir=str(log_dir.path), reason="mode: observe")

    def _open_unopened(self) -> None:
        """Open the log dirs that could not be opened before (tried every cycle: the
        operator may have mounted the disk or fixed the file since)."""
        for path in list(self._unopened):
            try:
                self._open_dir(path)
            except (CleanerdError, OSError) as exc:
                self._unopened[path] = log_dir_failure(self.config, path, exc)
            else:
                del self._unopened[path]

    def _online_dirs(self) -> list[LogDir]:
        """The log dirs open and not offline this cycle."""
        return [d for d in self.log_dirs if d.path not in self._offline]

    @property
    def offline_dirs(self) -> list[Path]:
        """The log dirs offline in the last cycle, and those not opened since (before
        the first cycle: the ones the start could not open)."""
        # Asked from the daemon's event loop while a cycle may change them: copies (a
        # dict's copy is made whole under the GIL) rather than iterations.
        offline, unopened = self._offline.copy(), self._unopened.copy()
        return list(offline) + [p for p in unopened if p not in offline]

    def _last_listed(self, path: Path) -> list[TopicPartition]:
        """The partitions of the offline dir `path`: listed now, or when it last was."""
        with suppress(OSError):  # unreadable now: its last listing stands
            self._listed[path] = list(list_partitions(path))
        return self._listed.get(path, [])

    def _report_offline(self, report: _Builder, offline: dict[Path, str]) -> None:
        """List the log dirs offline this cycle, logged as errors (at debug when the last
        cycle logged the same), and log the ones back since."""
        for path, why in offline.items():
            report.offline.append(OfflineLogDir(str(path), why))
            self._once("log_dir.offline", path, None, why, error=True)(
                "log_dir.offline", log_dir=str(path), error=why
            )
        for path in self._offline.keys() - offline.keys():
            log.info("log_dir.online", log_dir=str(path))
        self._offline = offline

    def close(self, *, unlink_pending: bool) -> list[Path]:
        """Release the log dirs; with `unlink_pending`, unlink every waiting `.deleted`
        file first (a one-shot process has nobody left to honour the delay)."""
        unlinked = self.pending.unlink_all() if unlink_pending else []
        for log_dir in self.log_dirs:
            log_dir.close()
        self.log_dirs = []
        return unlinked

    def checkpoint(self, *, clean_stop: bool = False) -> list[CleanerdError | OSError]:
        """Write each owned log dir's `recovery-point-offset-checkpoint` and
        `log-start-offset-checkpoint` for the open partitions. Each recovery point says
        what is already known durable, and the next open recovers the rest, as after a
        crash. With `clean_stop`, first make each partition what a clean stop leaves
        (flushed where it was not, a producer snapshot at its end: only partitions
        appended to since their last flush cost an fsync), and after the checkpoints
        keep what is known of the segments (`known_segments.py`) and write Kafka's
        clean-shutdown marker in every dir where all of that worked for every partition
        (`log_dir.py`). Returns the errors (each names its file), one
        log dir's failure not stopping the others."""
        errors: list[CleanerdError | OSError] = []
        for log_dir, plogs in self._owned():  # (an offline dir's partitions are dropped)
            if not plogs:
                continue
            try:
                # A dir another process holds now (its `.lock` replaced and taken), or a
                # root checkpoint gone bad since the cycle read it: the dir is written
                # nothing (no snapshot, no checkpoint over the file, no marker).
                OwnerProof.of_this_process(log_dir.path).verify()
                log_dir.reload_checkpoints()
                failed: dict[PartitionLog, CleanerdError | OSError] = {}
                if clean_stop:
                    marked = self.manager.registry.in_dir(str(log_dir.path))
                    # A damaged partition is left byte for byte as it is, and an
                    # uncleanable one gets no snapshot (it is flushed all the same).
                    sound = [p for p in plogs if p.corrupt is None]
                    failed = _prepare_clean_shutdown(sound, marked)
                    errors += failed.values()
                # A partition that could not be prepared (its dir gone, a file that
                # cannot be written) keeps its checkpoint lines as the last cycle wrote
                # them; the dir's other partitions are checkpointed all the same.
                log_dir.checkpoint_logs(p for p in plogs if p not in failed)
                if clean_stop and not failed and _all_sound(log_dir, plogs, self._damaged):
                    log_dir.keep_known_segments(plogs)
                    log_dir.mark_clean_shutdown()
            except (CleanerdError, OSError) as exc:
                errors.append(exc)
        return errors

    def _owned(self) -> Iterator[tuple[LogDir, list[PartitionLog]]]:
        """Each log dir this process owns and has online, with its open writable
        partitions."""
        for log_dir in self.log_dirs:
            if log_dir.mode is Mode.OWNER and log_dir.path not in self._offline:
                plogs = [
                    plog
                    for (path, _), plog in self._plogs.items()
                    if path == log_dir.path and not plog.read_only
                ]
                yield log_dir, plogs

    def keep_known(self) -> None:
        """Keep what is known of each owned dir's segments (`LogDir.keep_known_segments`)
        when they changed since it was last kept, at most every `KEEP_INTERVAL_MS`: the
        daemon calls this after each cycle, so that a start after a crash takes the
        metadata of the segments wholly below the recovery point instead of reading them
        again (`recovery.py`). Only partitions whose open finished its checks and met no
        damage since are kept, and a partition that leaves that set (damage met, a
        partition gone) is dropped from the file at once, whenever it was last kept."""
        now = self.clock()
        for log_dir, writable in self._owned():
            plogs = _sound(log_dir, writable, self._damaged)
            tps = frozenset(p.topic_partition for p in plogs)
            last = self._kept.get(log_dir.path)
            if last is not None and last.partitions <= tps:
                if 0 <= now - last.at_ms < KEEP_INTERVAL_MS:  # (a clock set back keeps)
                    continue
                key = _segments_key(plogs)
                if key == last.key:
                    continue
            else:
                key = _segments_key(plogs)
            try:
                try:
                    kept = log_dir.keep_known_segments(plogs)
                except (CleanerdError, OSError):
                    # A partition deleted since the cycle (its topic): kept without it.
                    plogs = [p for p in plogs if not partition_dir_gone(p.dir)]
                    kept = log_dir.keep_known_segments(plogs)
            except (CleanerdError, OSError) as exc:  # a segment gone since the cycle
                log.warning("known_segments.not_kept", log_dir=str(log_dir.path), error=str(exc))
                kept = False
            if kept:
                self._kept[log_dir.path] = _Kept(key, tps, now)

    @property
    def observed_dirs(self) -> list[Path]:
        """The log dirs only observed (nothing is written there)."""
        return [d.path for d in self.log_dirs if d.mode is Mode.OBSERVE]

    def shutdown(self) -> list[CleanerdError | OSError]:
        """The end of a clean stop: write the checkpoints (`checkpoint`), unlink the
        `.deleted` files still waiting (nobody is left to honour their delay, and a
        stopped service should not hold disk space), release the log dirs, stop the
        engine (aborting anything still running). Returns the checkpoint errors."""
        try:
            return self.checkpoint(clean_stop=True)
        finally:
            self.close(unlink_pending=True)
            self.engine.shutdown(abort=True)

    def reconfigure(self, config: Config, make_engine: Callable[[Config], Engine]) -> None:
        """Run the next cycles under `config` (between cycles: no pass is running); a
        change of the worker settings gets a new engine."""
        old, self.config = self.config, config
        if any(getattr(old, k) != getattr(config, k) for k in ENGINE_KEYS):
            retired, self.engine = self.engine, make_engine(config)
            retired.shutdown()
            log.info("engine.replaced", workers=self.engine.workers)

    def status(self) -> MaintenanceStatus:
        """A copy of what the metrics read of the maintenance state (taken in the thread
        that drives the cycles, so readers elsewhere never see it change under them)."""
        registry = self.manager.registry
        copy = UncleanablePartitions(backoff_ms=registry.backoff_ms)
        for log_dir in self.log_dirs:
            for tp, mark in registry.in_dir(str(log_dir.path)).items():
                copy.mark(
                    tp,
                    log_dir=mark.log_dir,
                    reason=mark.reason,
                    now_ms=mark.since_ms,
                    config_fingerprint=mark.config_fingerprint,
                )
        return MaintenanceStatus(
            uncleanable=copy,
            counters=self.counters.snapshot(),
            last_run_ms=self.manager.last_run_ms,
            dead_workers=self.engine.dead_workers,
        )

    def request_clean(
        self, tp: TopicPartition, log_dirs: Iterable[str], request_id: str | None = None
    ) -> None:
        """Ask for one pass of `tp` (found in `log_dirs`) in the next cycle, whatever its
        dirty ratio; raise CleanerdError with the reason when it cannot be cleaned here
        (the cleaner is off, not a compacted topic, or in no log dir this process owns).
        A request the cycle drops (nothing to clean, say) is in its report's `dropped`,
        with `request_id`. Thread-safe."""
        if not self.config.log_cleaner_enable:
            raise CleanerdError("log.cleaner.enable is false: no pass runs")
        topic = self.config.topic_config(tp.topic)
        if not topic.compact:
            raise CleanerdError(
                f"topic {tp.topic!r} is not compacted (cleanup.policy "
                f"{','.join(topic.cleanup_policy)})"
            )
        where = set(log_dirs)
        if not any(d.mode is Mode.OWNER and str(d.path) in where for d in self.log_dirs):
            raise CleanerdError(f"{tp} is in a log dir this process does not own")
        self.manager.force(tp, request_id)

    def __enter__(self) -> Maintenance:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(unlink_pending=False)

    # -- one cycle ----------------------------------------------------------------------

    def run_once(self, stop: threading.Event | None = None, *, act: bool = True) -> CycleReport:
        """One cycle (see the module docstring). Without `act` (the daemon paused), only
        the partitions' states: no roll, retention, pass or delayed deletion, but the
        delays and sizes the metrics show still follow what is written meanwhile."""
        report = _Builder(
            now_ms=self.clock(), damaged=self._damaged, repeated=self._last_step_errors
        )
        self._retries.clear()
        self._passed_again.clear()
        self._interject.clear()  # this cycle's own steps come first: they act on it
        self._last_notes, self._notes = self._notes, set()
        every = self.progress_interval_s
        self._progress = CycleProgress(math.inf if every is None else every)
        self._stop = stop
        try:
            return self._run(report, act=act)
        finally:  # what a failing cycle did is told too
            self._tell(report)

    def _run(self, report: _Builder, *, act: bool) -> CycleReport:
        """The steps of `run_once`, into `report`."""
        self._retry_marked()
        partitions = self._discover(report)
        if act:
            self._roll(partitions, report, report.now_ms)
            self._retention(partitions, report, report.now_ms)
            self._tell(report)
        else:
            report.skip("", None, "cycle", "paused: states only")
        compacted = [
            CompactedLog(p.log_dir, p.plog, p.topic)
            for p in partitions
            if p.topic.compact and not p.plog.is_metadata
        ]
        report.states += self._plain_states(partitions, report)
        self._clean(compacted, partitions, report, act=act)
        report.dropped += self.manager.take_dropped()
        if act:
            report.unlinked += self.pending.run_due(self.clock())
        self._checkpoint_recovery_points()
        self._report_later_cuts(partitions, report)
        # Paused, no time rule acts: a deadline would only start cycles that skip it (a
        # `.deleted` file's, past and never unlinked, started one after each).
        report.next_due_ms = self._next_due(partitions, report.now_ms) if act else None
        self._last_step_errors = {(e.log_dir, e.tp, e.phase): e.reason for e in report.errors}
        return report.build(self.clock())

    def _tell(self, report: _Builder, *, taken: bool = False) -> None:
        """Hand what the cycle did since the last telling to `on_news`, if anything; with
        `taken`, the report so far too (every partition's state is in it)."""
        if self.on_news is None:
            return
        news = report.news()
        if taken:
            news = replace(news, taken=report.build(self.clock()))
        if news:
            self.on_news(news)

    def _note(self, event: str, p: _Partition, detail: str, **fields: object) -> None:
        """Log a warning about `p`'s state, at debug when the previous cycle logged the
        same: a damaged partition is met every cycle until it is repaired."""
        self._once(event, p.log_dir.path, p.tp, detail)(
            event, **_fields(p.tp, p.log_dir.path), **fields
        )

    def _once(
        self,
        event: str,
        log_dir: Path,
        tp: TopicPartition | None,
        detail: str,
        *,
        error: bool = False,
        info: bool = False,
    ) -> Callable[..., object]:
        """`log.warning` (`log.error` with `error`, `log.info` with `info`), or
        `log.debug` when this cycle (its steps run again beside long passes) or the
        previous one logged the same."""
        key = (event, log_dir, tp, detail)
        seen = key in self._notes or key in self._last_notes
        self._notes.add(key)
        if seen:
            return log.debug
        return log.error if error else log.info if info else log.warning

    def _report_later_cuts(self, partitions: list[_Partition], report: _Builder) -> None:
        """List the torn tails a step cut after the open (a write checks the active
        segment's tail first, `PartitionLog._check_active_tail`), as the open's are."""
        for p in partitions:
            key = (p.log_dir.path, p.tp)
            plog = self._plogs.get(key, p.plog)
            cuts = plog.recovery_report.truncated
            seen_in, seen = self._cuts_reported.get(key, (plog, len(cuts)))
            if seen_in is not plog:
                seen = 0  # reopened since: all its cuts are its own open's
            path = str(p.log_dir.path)
            report.truncated += [TailCut(path, p.tp, cut) for cut in cuts[seen:]]
            self._cuts_reported[key] = (plog, len(cuts))

    def _checkpoint_recovery_points(self) -> None:
        """Keep `recovery-point-offset-checkpoint` current (Kafka writes it every
        `log.flush.offset.checkpoint.interval.ms`): the segments rolled during the cycle
        are flushed (`PartitionLog.flush_rolled`), and a dir where that or a flush moved
        a partition's recovery point gets its checkpoints written at the end of the
        cycle, so an open after a crash walks only what was not yet durable. A failure
        is logged (naming the file) and tried again after the next cycle."""
        for log_dir, plogs in self._owned():
            for plog in plogs:
                try:
                    plog.flush_rolled()
                except DAMAGE as exc:
                    # Damage its open or a step met, and reported as its own error (the
                    # partition uncleanable or unreadable): no checkpoint's failure.
                    damaged = not _sound(log_dir, [plog], self._damaged)
                    (log.debug if damaged else log.error)(
                        "checkpoint.flush_failed", log_dir=str(log_dir.path), error=str(exc)
                    )
                except (CleanerdError, OSError) as exc:
                    if not partition_dir_gone(plog.dir):  # else deleted (its topic) meanwhile
                        log.error(
                            "checkpoint.flush_failed", log_dir=str(log_dir.path), error=str(exc)
                        )
            known = log_dir.checkpoints.recovery_points
            if all(
                known.get(p.topic_partition, 0) == p.recovery_point_to_checkpoint for p in plogs
            ):
                continue
            try:
                log_dir.reload_checkpoints()  # one gone bad since the cycle read it stays
                log_dir.checkpoint_logs(plogs)
            except (CleanerdError, OSError) as exc:
                log.error("checkpoint.failed", log_dir=str(log_dir.path), error=str(exc))

    def _next_due(self, partitions: list[_Partition], now_ms: int) -> int | None:
        """The first time-rule deadline after `now_ms` (the cycle's instant, so one that
        came while the cycle ran starts the next cycle at once), over the partitions as
        the cycle left them."""
        due = [] if (d := self.pending.next_due_ms()) is None else [d]
        for p in partitions:
            try:
                meta = p.plog.readable_meta()  # retention still acts before any damage
                compacted = p.topic.compact and not p.plog.is_metadata and meta.damage is None
                horizons = self.manager.horizons.partition(p.plog) if compacted else ()
            except (CleanerdError, OSError):
                continue  # the next cycle reports the partition's error
            first_seen = self._first_seen.get(p.log_dir.path)
            if first_seen is None:
                continue  # the roll step did not reach its dir
            d = next_due_ms(
                meta,
                p.topic,
                now_ms=now_ms,
                age=segment_age(p.plog, first_seen, meta.active, now_ms),
                horizons=horizons,
                cleaner_enabled=self.config.log_cleaner_enable,
                min_roll_interval_ms=self.config.rolls.min_interval_ms,
            )
            if d is not None:
                due.append(d)
        return min(due, default=None)

    def _maintained(self, tp: TopicPartition) -> bool:
        """A partition the cycle works on: of a selected topic, and not the metadata log."""
        return tp.topic != METADATA_TOPIC and (self.topics is None or tp.topic in self.topics)

    def reloaded(self) -> None:
        """A reload is the operator's word that something outside the config may have
        changed too: the next cycle tries again the partitions marked uncleanable (a
        full disk freed, a damaged file put back), whose marks would otherwise hold for
        an hour. Thread-safe."""
        with self._reload_lock:
            self._retry_pending = True

    def _retry_marked(self) -> None:
        """Drop every uncleanable mark when a reload asked (`reloaded`)."""
        with self._reload_lock:
            asked, self._retry_pending = self._retry_pending, False
        cleared = self.manager.registry.clear_all() if asked else []
        if cleared:
            log.info("uncleanable.retried", partitions=sorted(map(str, cleared)))

    def _note_released(self) -> None:
        """Say once that a log dir another process held when it was opened is free now.

        It stays observed until cleanerd restarts: the process that lets go of a log
        dir is most often a broker stopping to restart (or crashing, to be restarted by
        its supervisor), whose next start would fail on the `.lock` cleanerd held by
        then, and after a crash the owner's open would cut and quarantine the tails the
        broker's own recovery expects to find. Nothing while it runs tells that apart
        from a holder gone for good (a retired broker), so the operator says so, by a
        restart."""
        for log_dir in self.log_dirs:
            if log_dir.held_by is None:
                continue
            last = self._holders.get(log_dir.path, log_dir.held_by)
            pid = lock_holder(log_dir.path)
            if pid is not None:
                if pid != last.pid:  # another process took it since: the next to let go
                    self._holders[log_dir.path] = Holder.of(log_dir.path, self.config.state_dir)
                continue
            self._once("log_dir.released", log_dir.path, None, str(last))(
                "log_dir.released",
                log_dir=str(log_dir.path),
                was_held_by=str(last),
                hint="still only observed: restart cleanerd to own and maintain it; a broker "
                "being restarted needs it back, and beside a broker `mode: observe` belongs "
                "in the config",
            )

    def _discover(self, report: _Builder) -> list[_Partition]:
        self._note_released()
        self._open_unopened()
        offline = dict(self._unopened)
        found: list[_Partition] = []
        seen: dict[TopicPartition, Path] = {}
        live: set[tuple[Path, TopicPartition]] = set()
        opened = total = 0
        opened_dirs = {d.path: d for d in self.log_dirs}
        maintained_in = self._maintained_in
        for path in self._configured_dirs():
            log_dir, why = opened_dirs.get(path), self._unopened.get(path)
            listed: list[TopicPartition] = []
            if log_dir is not None:
                try:
                    if log_dir.mode is Mode.OWNER:
                        # Its `.lock` replaced and taken by another process (a broker
                        # started): nothing more is written there in this one's name.
                        OwnerProof.of_this_process(log_dir.path).verify()
                        log_dir.verify_writable()
                    log_dir.reload_checkpoints()
                    listed = list(log_dir.partitions())
                except (CheckpointError, OSError, OwnershipLost, ReadOnlyFileSystem) as exc:
                    why = failure_text(exc)
            if log_dir is None or why is not None:
                offline[path] = why or ""
                # Its open partitions are dropped below, as vanished ones; a copy of one
                # of its partitions in a later dir stays skipped, as while it was online.
                if (log_dir.mode if log_dir else self._mode_wanted) is Mode.OWNER:
                    for tp in self._last_listed(path):
                        seen.setdefault(tp, path)
                continue
            before, self._listed[path] = self._listed.get(path), listed
            listed = self._unambiguous(log_dir.path, listed, report)
            if log_dir.mode is not Mode.OWNER:
                why = str(log_dir.held_by or f"{log_dir.mode.value} mode")
                report.skip(log_dir.path, None, "discover", why)
                report.observed.append(str(log_dir.path))
                report.states += self._observe(log_dir, listed, report, live)
                continue
            self._remove_gone_locks(log_dir, before, self._listed[path])
            total += len(listed)
            reads = self._start_first_reads(log_dir, listed)
            try:
                with self._opening(log_dir, listed):
                    for n, tp in enumerate(listed):
                        self._progress.tick("open", opened + n, total)
                        if not self._maintained(tp):
                            continue
                        other = seen.get(tp) or maintained_in.get(tp, log_dir.path)
                        if other != log_dir.path:
                            self._duplicate(log_dir.path, tp, other, report)
                            continue
                        seen[tp] = maintained_in[tp] = log_dir.path
                        live.add((log_dir.path, tp))
                        by_readers = reads is not None and tp in reads.partitions
                        partition = self._open(log_dir, tp, report, by_readers=by_readers)
                        if partition is not None:
                            found.append(partition)
            finally:
                if reads is not None:
                    self._take_first_reads(log_dir, reads, report)
            # A partition whose left checks failed as its open would have is not open.
            found = [p for p in found if self._plogs.get((p.log_dir.path, p.tp)) is p.plog]
            opened += len(listed)
        for key in [k for k in self._plogs if k not in live]:
            del self._plogs[key]
            self._cuts_reported.pop(key, None)
        listed_in = {path: set(self._listed.get(path, ())) for path in opened_dirs}
        for tp, path in list(maintained_in.items()):
            if path not in offline and tp not in listed_in.get(path, ()):
                del maintained_in[tp]  # gone from its dir: a copy elsewhere may take over
        if self.topics is None:
            self.manager.registry.retain_only(seen)
        elif not offline:  # an offline dir may hold what the others do not
            self._report_absent_topics(self.topics, report)
        self._report_offline(report, offline)
        return found

    def _duplicate(self, path: Path, tp: TopicPartition, other: Path, report: _Builder) -> None:
        """Leave alone the copy of `tp` in `path`, the one in `other` being maintained, and
        say so (once while it lasts): a broker refuses to start with a partition in two
        log dirs, and which copy is right is the operator's call."""
        report.skip(path, tp, "discover", f"also in log dir {other}")
        self._once("partition.duplicate", path, tp, str(other))(
            "partition.duplicate",
            **_fields(tp, path),
            maintained_in=str(other),
            consequence="this copy is left alone; a Kafka broker would refuse to start",
        )

    def _unambiguous(
        self, path: Path, listed: list[TopicPartition], report: _Builder
    ) -> list[TopicPartition]:
        """`listed` without the partitions of topics that two `topics:` globs match, each
        of which is a failed step naming the globs: which settings apply is the config's
        to say, and the other partitions are maintained, whether the topic was there when
        the config was loaded or came since (`config.ambiguous_on_disk`)."""
        why: dict[str, CleanerdError] = {}
        for topic in {tp.topic for tp in listed if self._maintained(tp)}:
            try:
                self.config.topic_entry(topic)
            except ConfigError as exc:
                why[topic] = CleanerdError(exc.reason)
        for tp in listed:
            if tp.topic in why:
                report.error(path, tp, "discover", why[tp.topic])
        return [tp for tp in listed if tp.topic not in why] if why else listed

    def _report_absent_topics(self, topics: frozenset[str], report: _Builder) -> None:
        """Name each of `topics` (the cycle's `--topic`) that no log dir holds a partition
        of, every dir listed: a typo, or a topic with no replica on this host (so a
        warning, not a failure)."""
        held = {tp.topic for listed in self._listed.values() for tp in listed}
        for topic in sorted(topics - held):
            why = f"--topic {topic} matches no partition in the log dirs"
            named, _, number = topic.rpartition("-")
            if named in held and number.isdigit():  # a partition's dir name
                why += f" (it names a partition of topic {named})"
            log.warning("topic.absent", topic=topic, reason=why)
            report.skip("", None, "discover", why)

    def _start_first_reads(
        self, log_dir: LogDir, listed: list[TopicPartition]
    ) -> _FirstReads | None:
        """Start `SegmentReaders` on the partitions of `log_dir` opened for the first
        time with nothing kept of them, when there are `MANY_OPENS` or more; else, when
        `MANY_OPENS` or more open for the first time as after a crash (fewer than that
        with nothing kept), start them warming the kernel's caches for the opening
        (`warm_dirs`), from the last partition back."""
        if self.readers is None:
            return None
        opening = [
            tp for tp in listed if (log_dir.path, tp) not in self._plogs and self._maintained(tp)
        ]
        first = [tp for tp in opening if not log_dir.knows(tp)]
        owner = log_dir.mode is Mode.OWNER
        # An open as after a crash leaves the checks below the recovery point too; an
        # observer's leaves none.
        crashed = owner and not all(log_dir.opens_cleanly(tp) for tp in opening)
        warm = len(first) < MANY_OPENS
        if warm and (not crashed or len(opening) < MANY_OPENS):
            return None
        try:
            readers = self.readers()
        except OSError as exc:
            log.warning("first_reads.unavailable", log_dir=str(log_dir.path), error=str(exc))
            return None
        if readers is None:
            return None
        paths = [str(log_dir.path / str(tp)) for tp in (opening[::-1] if warm else first)]
        jobs = [paths[i : i + READ_CHUNK] for i in range(0, len(paths), READ_CHUNK)]
        readers.start(jobs, check=crashed and not warm, warm=warm)
        if warm:  # the opening checks and reads every partition itself
            return _FirstReads(readers, frozenset(), check=False, warm=True)
        return _FirstReads(readers, frozenset(first), check=crashed)

    def _take_first_reads(self, log_dir: LogDir, reads: _FirstReads, report: _Builder) -> None:
        """Take what the readers have read, job by job as they finish, and read the jobs
        they have not started, from the last one back, while they read on from the
        first; then take the rest. Both CPUs so work to the end: the owner's part of a
        partition the readers read (its seeding, the checks the open left that no reader
        ran, its first `meta`) runs while they read others."""
        if reads.warm:
            reads.readers.stop()  # what they warmed is in the kernel's caches
            return
        taking = _Taking(log_dir, reads, {str(tp): tp for tp in reads.partitions})
        try:
            while True:
                for future in reads.readers.finished():
                    self._take_read(taking, future, report)
                if (job := reads.readers.take_back()) is None:
                    break
                tps = [taking.by_name[Path(path).name] for path in job]
                taking.seen.update(tps)
                plogs = [self._plogs.get((log_dir.path, tp)) for tp in tps]
                self._read_here([p for p in plogs if p is not None], log_dir, report)
        finally:
            futures = reads.readers.stop()
        for future in futures:
            if not future.cancelled():
                self._take_read(taking, future, report)
        for tp in sorted(reads.partitions - taking.seen):  # a failed reader's, or no rows
            plog = self._plogs.get((log_dir.path, tp))
            if plog is not None and self._check_unchecked(plog, log_dir, report, {}):
                plog.prefetch()
        log.info("first_reads.taken", log_dir=str(log_dir.path), segments=taking.taken)
        if taking.failed:
            log.warning(
                "first_reads.failed",
                log_dir=str(log_dir.path),
                reads=len(taking.failed),
                error=repr(taking.failed[0]),
                action="read by this process",
            )

    def _take_read(self, taking: _Taking, future: Future[bytes], report: _Builder) -> None:
        """Seed the partitions of one reader's answer, run the checks their opens left
        that it did not, and read what the cycle needs of them beyond it (`meta`)."""
        log_dir = taking.log_dir
        try:
            kept = decode(future.result()).segments
        except Exception as exc:  # noqa: BLE001 - a reader's failure only loses its answer
            taking.failed.append(exc)
            return
        for name, rows in kept.items():
            tp = taking.by_name.get(name)
            plog = None if tp is None else self._plogs.get((log_dir.path, tp))
            if tp is None or plog is None:
                continue
            taking.seen.add(tp)
            taking.taken += plog.take_known(rows)
            if not taking.reads.check:  # rows of segments no reader checked: the active one's was
                active = plog.active_segment.base_offset
                rows = {active: rows[active]} if active in rows else {}
            self._check_and_read(plog, log_dir, report, rows, prefetch=True)

    def _read_here(self, plogs: list[PartitionLog], log_dir: LogDir, report: _Builder) -> None:
        """Check and read the segments of `plogs` that the first cycle reads (a job taken
        back from the readers), all of them advised first so that their reads overlap."""
        for plog in plogs:
            plog.prefetch()  # so that the reads of the job's segments overlap
        for plog in plogs:
            self._check_and_read(plog, log_dir, report, {}, prefetch=False)

    def _check_and_read(
        self,
        plog: PartitionLog,
        log_dir: LogDir,
        report: _Builder,
        checked: Mapping[int, KnownSegment],
        *,
        prefetch: bool,
    ) -> None:
        """The checks the open of `plog` left (`_check_unchecked`), then, if it stays
        open, what the first cycle reads of it (`meta`), with `prefetch` advised first; a
        failure of that read is met again, and reported, by the step that reads it."""
        if not self._check_unchecked(plog, log_dir, report, checked):
            return
        if prefetch:
            # After the checks: advised before them, the index files of every segment a
            # reader already checked would be opened for nothing.
            plog.prefetch()
        with suppress(CleanerdError, OSError):
            plog.meta()

    def _check_unchecked(
        self,
        plog: PartitionLog,
        log_dir: LogDir,
        report: _Builder,
        checked: Mapping[int, KnownSegment],
    ) -> bool:
        """The checks the open of `plog` left (`PartitionLog.check_unchecked`); damage
        they find is reported as that open's. Whether the partition stays open: a check
        that fails as the open would fail (an index it cannot rebuild) is that open's
        error, and the partition is opened anew by the next cycle."""
        if not plog.recovery_report.unchecked:
            return True
        tp = plog.topic_partition
        topic = self.config.topic_config(tp.topic)
        sound = plog.corrupt is None
        try:
            plog.check_unchecked(checked)
        except (CleanerdError, OSError) as exc:
            report.error(log_dir.path, tp, "open", exc)
            report.unread(log_dir.path, tp, topic, str(exc))
            del self._plogs[(log_dir.path, tp)]
            self._cuts_reported.pop((log_dir.path, tp), None)
            return False
        if sound and plog.corrupt is not None:
            self._report_damage(_Partition(log_dir, plog, topic), report, opening=True)
        return True

    def _opening(
        self, log_dir: LogDir, listed: list[TopicPartition]
    ) -> AbstractContextManager[None]:
        """How to open `log_dir`'s partitions: as long-lived work when `MANY_OPENS` or
        more of them are not open yet."""
        unopened = sum((log_dir.path, tp) not in self._plogs for tp in listed)
        return long_lived_objects() if unopened >= MANY_OPENS else nullcontext()

    def _remove_gone_locks(
        self, log_dir: LogDir, before: list[TopicPartition] | None, listed: list[TopicPartition]
    ) -> None:
        """Remove the partition lock files of `log_dir`'s partitions that are gone (their
        topics deleted): those listed `before` (the dir's previous listing) and not now,
        those left from earlier tries (held by another process then, a `produce` on its
        way, or failing), and at the dir's first listing as its owner, any it finds (left
        by earlier processes). An aid to the state dir's size: an error is never the
        cycle's."""
        now, path = set(listed), log_dir.path
        left = self._lock_files_left.get(path)
        try:
            if left is None:
                candidates = set(partition_locks(log_dir.state_dir, path))
            else:
                candidates = left | (set(before or ()) - now)
        except OSError as exc:
            log.debug("lock.remove_failed", log_dir=str(path), error=str(exc))
            return
        self._lock_files_left[path] = left = set()
        for tp in candidates - now:
            try:
                if partition_dir_gone(path / str(tp)) and not remove_partition_lock(
                    log_dir.state_dir, path, tp
                ):
                    left.add(tp)
            except OSError as exc:
                left.add(tp)
                log.debug("lock.remove_failed", **_fields(tp, path), error=str(exc))

    def _plain_states(self, partitions: list[_Partition], report: _Builder) -> list[PartitionState]:
        """The snapshots of the partitions that are not compacted (sizes and counts for
        the metrics); compacted ones get theirs with their candidate."""
        states = []
        for p in partitions:
            if p.topic.compact or p.plog.is_metadata:
                continue
            try:
                states.append(_state(p.plog.meta(), p.topic))
            except (CleanerdError, OSError) as exc:
                self._note("partition.unreadable", p, str(exc), error=str(exc))
                report.met(p.log_dir.path, p.tp, exc)
                report.unread(p.log_dir.path, p.tp, p.topic, str(exc))
        return states

    def _observe(
        self,
        log_dir: LogDir,
        listed: list[TopicPartition],
        report: _Builder,
        live: set[tuple[Path, TopicPartition]],
    ) -> list[PartitionState]:
        """The state of every partition of an observed log dir (a live broker's), read
        without writing a byte there: the same snapshot and cleaning candidate owner mode
        computes, for the metrics. The broker changes the files as they are read (a
        segment renamed or deleted between listing and opening, an append in flight):
        a partition that cannot be read whole now is skipped this cycle (reported as
        unreadable) and read again the next, never marked."""
        checkpoints = log_dir.checkpoints.cleaner_offsets
        with self._opening(log_dir, listed):
            reads = self._start_first_reads(log_dir, listed)
            if reads is not None:
                try:
                    self._open_observed(log_dir, listed, reads.partitions)
                finally:
                    self._take_first_reads(log_dir, reads, report)
            return list(self._observe_listed(log_dir, listed, checkpoints, report, live))

    def _open_observed(
        self, log_dir: LogDir, listed: list[TopicPartition], read: Collection[TopicPartition]
    ) -> None:
        """Open the partitions of an observed dir that readers read, reading none of their
        segments here; a failure is met again, and reported, by `_observe_listed`."""
        for tp in listed:
            if tp in read:
                topic = self.config.topic_config(tp.topic)
                with suppress(CleanerdError, OSError):
                    self._plogs[(log_dir.path, tp)] = log_dir.open_partition(
                        tp, config=LogConfig.of_topic(topic), prefetch=False
                    )

    def _observe_listed(
        self,
        log_dir: LogDir,
        listed: list[TopicPartition],
        checkpoints: Mapping[TopicPartition, int],
        report: _Builder,
        live: set[tuple[Path, TopicPartition]],
    ) -> Iterator[PartitionState]:
        for tp in listed:
            if not self._maintained(tp):
                continue
            key = (log_dir.path, tp)
            live.add(key)
            topic = self.config.topic_config(tp.topic)
            try:
                plog = self._plogs.get(key)
                if plog is None:
                    plog = log_dir.open_partition(tp, config=LogConfig.of_topic(topic))
                    self._plogs[key] = plog
                else:
                    plog.follow_checkpoints(log_dir.checkpoints)
                meta = plog.meta()
            except (CleanerdError, OSError) as exc:
                self._plogs.pop(key, None)
                self._cuts_reported.pop(key, None)
                if partition_dir_gone(log_dir.path / str(tp)):
                    # Its topic deleted as it was read: gone, not unreadable (the gauge
                    # of unreadable partitions counted each deletion for a cycle).
                    live.discard(key)
                    log.info("observe.partition_gone", **_fields(tp, log_dir.path), error=str(exc))
                    continue
                self._observe_skipped(log_dir.path, tp, str(exc))
                report.unread(log_dir.path, tp, topic, str(exc))
                continue
            ltc = None
            if topic.compact:
                ltc = topic_log_to_clean(
                    meta, topic, checkpoint=checkpoints.get(tp), now_ms=report.now_ms
                )
            yield _state(meta, topic, ltc)

    def _observe_skipped(self, log_dir: Path, tp: TopicPartition, reason: str) -> None:
        """Log an observed partition that could not be read: at debug, as a broker
        changing it as it was read makes it so for one cycle; once the same error is met
        in the next cycle too, it stays (damage, a file it may not read), and a warning
        says so, once."""
        skipped = ("observe.skipped", log_dir, tp, reason)
        if skipped in self._last_notes:
            self._once("observe.unreadable", log_dir, tp, reason)(
                "observe.unreadable", **_fields(tp, log_dir), error=reason
            )
        self._notes.add(skipped)
        log.debug("observe.skipped", **_fields(tp, log_dir), reason=reason)

    def _open(
        self, log_dir: LogDir, tp: TopicPartition, report: _Builder, *, by_readers: bool = False
    ) -> _Partition | None:
        """Open `tp` (or follow the checkpoints of its open log); `by_readers`: a first
        opening's readers read its segments and run the checks its open leaves."""
        topic = self.config.topic_config(tp.topic)
        key = (log_dir.path, tp)
        plog = self._plogs.get(key)
        stale = plog is not None and (
            plog.config != LogConfig.of_topic(topic)
            # Found corrupt when opened, and the mark has expired: look again (the
            # operator may have repaired it); the reopen checks the segments anew.
            or (
                plog.corrupt is not None
                and not self.manager.is_uncleanable(
                    CompactedLog(log_dir, plog, topic), report.now_ms
                )
            )
        )
        opening = plog is None or stale
        try:
            if plog is None or stale:
                plog = log_dir.open_partition(
                    tp,
                    config=LogConfig.of_topic(topic),
                    prefetch=not by_readers,
                    check_later=by_readers,
                )
                self._plogs[key] = plog
            else:
                plog.follow_checkpoints(log_dir.checkpoints)
        except (CleanerdError, OSError) as exc:
            report.error(log_dir.path, tp, "open", exc)
            report.unread(log_dir.path, tp, topic, str(exc))
            return None
        if not by_readers and not self._check_unchecked(plog, log_dir, report, {}):
            return None  # left by an opening whose cycle failed before it ran them
        if opening:
            cuts = plog.recovery_report.truncated
            report.truncated += [TailCut(str(log_dir.path), tp, cut) for cut in cuts]
            self._cuts_reported[key] = (plog, len(cuts))
        partition = _Partition(log_dir, plog, topic)
        self._report_damage(partition, report, opening=opening)
        return partition

    def _report_damage(self, p: _Partition, report: _Builder, *, opening: bool) -> None:
        """What the open of `p` found damaged (`corrupt`): a compacted partition is marked
        uncleanable; another one's damage is the open's error."""
        corrupt, tp = p.plog.corrupt, p.tp
        if corrupt is not None and p.topic.compact:
            item = CompactedLog(p.log_dir, p.plog, p.topic)
            if not self.manager.is_uncleanable(item, report.now_ms):
                self._mark(item, str(corrupt), report.now_ms, report, during_pass=False)
            report.met(p.log_dir.path, tp, corrupt)
        elif corrupt is not None and opening:
            # Not compacted, so never marked uncleanable (and opened again each cycle, to
            # see a repair): the damage its open found is that step's error.
            report.error(p.log_dir.path, tp, "open", corrupt)

    def _roll(self, partitions: list[_Partition], report: _Builder, now_ms: int) -> None:
        by_dir: dict[Path, list[_Partition]] = {}
        for p in partitions:
            by_dir.setdefault(p.log_dir.path, []).append(p)
        done = 0
        for path, items in by_dir.items():
            first_seen = self._first_seen.get(path)
            if first_seen is None:
                first_seen = FirstSeen.load(self.config.state_dir, path)
                self._first_seen[path] = first_seen
            for p in items:
                if self._paused_in("roll", report):
                    break
                self._progress.tick("roll", done, len(partitions))
                done += 1
                try:
                    decision = maybe_roll(
                        p.plog,
                        p.topic,
                        first_seen,
                        now_ms=now_ms,
                        min_roll_interval_ms=self.config.rolls.min_interval_ms,
                    )
                except (CleanerdError, OSError) as exc:
                    report.error(path, p.tp, "roll", exc)
                    continue
                if decision is not None:
                    self.counters.count_roll(decision)
                    report.rolled.append(
                        RolledSegment(
                            str(path),
                            p.tp,
                            decision.base_offset,
                            decision.reason.value,
                            decision.waited_ms,
                        )
                    )
            if self.topics is None:
                first_seen.retain_only(p.tp for p in items)
            try:
                first_seen.save()
            except (CleanerdError, OSError) as exc:
                # Advisory (`roller.py`): the times stay in memory, and the next cycle
                # writes them again; a state dir that cannot be written stops no roll.
                why = failure_text(exc)
                self._once("first_seen.save_failed", path, None, why)(
                    "first_seen.save_failed", log_dir=str(path), error=why
                )

    def _paused_in(self, step: str, report: _Builder) -> bool:
        """Whether a pause (`drain`) or a stop (`run_once`'s `stop`) came while the cycle
        runs: its roll, retention and disk usage steps then change nothing more (once
        said per step), as the cycles after a pause change nothing, and a stop does not
        wait for the retention of thousands of partitions (the daemon's stop gives up
        after 30 s and leaves without its checkpoints); the passes in flight finish
        (`_clean`), or a stop aborts them."""
        if self._stop is not None and self._stop.is_set():
            report.aborted = True
            why = "stopping"
        elif self.drain.is_set():
            why = "paused"
        else:
            return False
        report.skip("", None, step, why)
        return True

    def _devices_above(self) -> bool:
        percent = self.config.log_retention_disk_usage_percent
        if percent >= 100:
            return False
        owned = [d.path for d in self._online_dirs() if d.mode is Mode.OWNER]
        devices = measure(group_devices(owned), percent, self.usage_probe)
        return any(is_above(u) for u in devices)

    def _retention(self, partitions: list[_Partition], report: _Builder, now: int) -> None:
        cleaner_enabled = self.config.log_cleaner_enable
        wanted = [
            p for p in partitions if retention_applies(p.topic, cleaner_enabled=cleaner_enabled)
        ]
        by_tp = {p.tp: p for p in wanted}
        for p in wanted:
            if p.topic.compact and not p.plog.is_metadata:
                self._mark_damaged(p, report)
        changed: dict[LogDir, list[_Partition]] = {}
        with self.manager.retention_hold([(p.tp, p.topic) for p in wanted], now) as granted:
            held = set(granted)  # a set: `in` on the list is quadratic over 10,000 partitions
            for p in wanted:
                if p.tp not in held and not self._in_its_pass(p):
                    report.skip(p.log_dir.path, p.tp, "retention", self._why_held(p))
            try:
                if not self._retain(granted, by_tp, report, now, changed):
                    return
            finally:
                _checkpoint_retention(changed, report)
        if self._paused_in("disk usage", report):
            return
        above = self._devices_above()
        if disk_usage_applies(any_device_above=above, all_topics=self.topics is None):
            self._disk_usage(partitions, report, now)
        elif above:
            report.skip("", None, "disk usage", "not enforced for a --topic subset")

    def _retain(
        self,
        granted: list[TopicPartition],
        by_tp: dict[TopicPartition, _Partition],
        report: _Builder,
        now: int,
        changed: dict[LogDir, list[_Partition]],
    ) -> bool:
        """Apply retention to the `granted` partitions, adding those it changed to
        `changed` by log dir, for the caller to checkpoint; False: a stop or a pause
        ended the step."""
        for n, tp in enumerate(granted):
            if self._paused_in("retention", report):
                return False
            self._progress.tick("retention", n, len(granted))
            p = by_tp[tp]
            try:
                outcome = apply_retention(p.plog, p.topic, now_ms=now, pending=self.pending)
            except (CleanerdError, OSError) as exc:
                report.error(p.log_dir.path, tp, "retention", exc)
                continue
            if outcome.deletions:
                changed.setdefault(p.log_dir, []).append(p)
            self.counters.count_retention(outcome)
            if (later := _still_future(outcome, self.clock)) is not None:
                self._note(
                    "retention.future_timestamp",
                    p,
                    str(outcome.future_timestamp_base),
                    base_offset=outcome.future_timestamp_base,
                    now_ms=later,
                    consequence="retention.ms deletes nothing from this segment on",
                )
            if outcome.damaged_base is not None:
                base = outcome.damaged_base
                self._note(
                    "retention.stopped_at_damage",
                    p,
                    str(base),
                    base_offset=base,
                    path=str(log_file(p.plog.dir, base)),
                    consequence="retention deletes nothing from this segment on until "
                    "it is repaired",
                )
            roll = outcome.roll
            if roll is not None:
                # Every segment was due: the old active segment was rolled first,
                # then deleted with the others (Kafka's rule).
                self.counters.count_rolled(roll.reason.value)
                report.rolled.append(
                    RolledSegment(
                        str(p.log_dir.path), tp, roll.base_offset, roll.reason.value, None
                    )
                )
            if outcome.deletions or roll is not None:
                report.retention.append(outcome)
            if outcome.failure is not None:
                report.error(p.log_dir.path, tp, "retention", outcome.failure)
        return True

    def _mark_damaged(self, p: _Partition, report: _Builder) -> None:
        """Mark a compacted partition uncleanable when a segment's metadata shows damage,
        before its retention: Kafka's cleaner-driven retention skips an uncleanable log,
        and the partition is one from the first cycle that meets the damage, as one its
        open found corrupt is (which `plan` predicts)."""
        item = CompactedLog(p.log_dir, p.plog, p.topic)
        if self.manager.is_uncleanable(item, report.now_ms):
            return
        try:
            damage = p.plog.readable_meta().damage
        except (CleanerdError, OSError):
            return  # the partition's steps report it
        if damage is not None:
            self._mark(item, damage, report.now_ms, report, during_pass=False)

    def _mark(
        self, item: CompactedLog, reason: str, now_ms: int, report: _Builder, *, during_pass: bool
    ) -> None:
        """Mark `item` uncleanable for `reason`, and list it among the cycle's failed."""
        self.manager.mark_uncleanable(item, reason, now_ms)
        report.failed.append(FailedLog(str(item.log_dir.path), item.tp, reason, during_pass))

    def _in_its_pass(self, p: _Partition) -> bool:
        """A compacted partition without `delete` whose pass is running: the retention
        step passes it by without a word, as Kafka's cleaner-driven retention passes a
        log being cleaned (only the log start offset rule applies to it, and the next
        cycle applies it)."""
        return not p.topic.delete and self.manager.state(p.tp) is CleaningState.IN_PROGRESS

    def _why_held(self, p: _Partition) -> str:
        state = self.manager.state(p.tp)
        if state is not None:
            return f"partition is {state.value}"
        return HELD_UNCLEANABLE

    def _disk_usage(self, partitions: list[_Partition], report: _Builder, now: int) -> None:
        logs = [(p.tp, p.topic) for p in partitions]
        with self.manager.retention_hold(logs, now, skip_uncleanable=False) as granted:
            held = set(granted)
            for p in partitions:
                if p.tp not in held:
                    report.skip(p.log_dir.path, p.tp, "disk usage", self._why_held(p))
            # A partition a pass holds is still on its device; only its segments are
            # not candidates for deletion until the pass is done.
            disk = enforce_disk_usage(
                self._online_dirs(),
                [p.plog for p in partitions if p.tp in held],
                percent=self.config.log_retention_disk_usage_percent,
                protects=self.config.disk_usage.protects,
                now_ms=now,
                dry_run=self.config.disk_usage.dry_run,
                probe=self.usage_probe,
                pending=self.pending,
            )
        for log_dir, tp, error in disk.unreadable:
            # Met at every check until it is repaired: a warning once, as the others.
            event, path = "disk_usage.partition_unreadable", Path(log_dir)
            self._once(event, path, tp, error)(
                event,
                **_fields(tp, path),
                error=error,
                consequence="nothing of it is deleted for disk usage while it cannot be read",
            )
        for d in disk.deletions if disk.dry_run else ():
            # What a dry run would delete is said once, not at every check while the
            # device stays above its threshold.
            path = Path(d.log_dir)
            self._once(
                "disk_usage.would_delete", path, d.topic_partition, str(d.base_offset), info=True
            )(
                "disk_usage.would_delete",
                **_fields(d.topic_partition, path),
                base_offset=d.base_offset,
                freed_bytes=d.freed_bytes,
                device=device_name(d.device),
                reason=d.reason.value,
            )
        for u in disk.after:
            if u.device in disk.still_above:
                # Said when it starts: a device that stays full stays so cycle after cycle.
                device = device_name(u.device)
                # A dry run's usage is projected past its deletions: so are the log bytes.
                would = [d for d in disk.deletions if disk.dry_run and d.device == u.device]
                in_logs = _log_bytes_on(u.device, u.block_bytes, partitions) - sum(
                    d.freed_bytes for d in would
                )
                limit = u.limit_bytes(u.threshold_percent)
                consequence = "nothing deletable is left, or writers outpace the deletions"
                if u.used_bytes - in_logs > limit:
                    consequence = (
                        "other files fill the device: without a byte of the log dirs it "
                        "would still be above the threshold"
                    )
                if disk.dry_run:
                    made = count(len(would), "deletion")
                    consequence = (
                        f"dry run: above even after the {made} it would make ({consequence})"
                    )
                self._once("disk.pressure", Path(device), None, device)(
                    "disk.pressure",
                    device=device,
                    used_bytes=u.used_bytes,
                    limit_bytes=limit,
                    log_dirs_bytes=in_logs,
                    consequence=consequence,
                )
        self.counters.count_disk_usage(disk)
        report.disk_usage = disk if report.disk_usage is None else report.disk_usage.then(disk)

    # -- cleaning -----------------------------------------------------------------------

    def _clean(
        self,
        compacted: list[CompactedLog],
        partitions: list[_Partition],
        report: _Builder,
        *,
        act: bool,
    ) -> None:
        now = self.clock()
        marked = {item.tp for item in compacted if self.manager.is_uncleanable(item, now)}
        candidates = self.manager.refresh(compacted, now)
        report.states += [_state(c.meta, c.log.topic, c.ltc) for c in candidates]
        for item in compacted:
            unread = self.manager.unreadable.get(item.tp)
            if unread is not None:  # marked uncleanable too
                report.unread(item.log_dir.path, item.tp, item.topic, unread)
            if item.tp not in marked and self.manager.is_uncleanable(item, now):
                reason = self.manager.registry.reason(item.tp) or ""
                report.failed.append(FailedLog(str(item.log_dir.path), item.tp, reason, False))
        self._tell(report, taken=True)
        if not self.config.log_cleaner_enable:
            report.skip("", None, "clean", "log.cleaner.enable is false")
            return
        if not act or not any(d.mode is Mode.OWNER for d in self._online_dirs()):
            # Only observed: no worker looks for a log to clean, so the last-clean gauges
            # (Kafka's time since the cleaner last ran) stay as they are.
            return
        running: dict[Future[CleanResult], _Running] = {}
        stopping = False
        beside = _Interleaving(since=time.monotonic())
        while True:
            if self._stop is not None and self._stop.is_set() and not stopping:
                stopping = report.aborted = True
                for r in running.values():
                    self.engine.abort(r.job.tp)
            if self.drain.is_set() and not running:
                report.skip("", None, "clean", "draining (cleaning paused)")
                return
            while not stopping and not self.drain.is_set() and len(running) < self.engine.workers:
                submitted = self._submit_next()
                if submitted is None:
                    break
                running[submitted[0]] = submitted[1]
            self.engine.flush()  # this round's passes may start together (one Spark job)
            if not running:
                return
            done, _ = wait(running, timeout=POLL_S, return_when=FIRST_COMPLETED)
            for future in done:
                self._finished(future, running.pop(future), report, requeue=not stopping)
            if running and not stopping and not self.drain.is_set():
                self._interleave(partitions, report, beside, running.values())
            self._tell(report)
            self._progress.tick(
                "clean",
                len(report.cleaned),
                None,
                running=sorted(str(r.job.tp) for r in running.values()),
            )

    def _interleave(
        self,
        partitions: list[_Partition],
        report: _Builder,
        beside: _Interleaving,
        running: Iterable[_Running],
    ) -> None:
        """Beside passes that run long (a partition of terabytes, a throttled cleaner, a
        Spark job), run the roll, retention and disk-usage steps and the delayed
        deletions again when a time rule falls due or `interject` asks, so that
        no deletion deadline and no full disk waits for the passes to end (in Kafka,
        retention does not wait for the cleaner either). The partitions the passes
        hold are left out of retention and disk usage, as at any time; a roll only adds
        a segment after a pass's range, which the pass's proof does not cover. Rules
        falling due one after another wait `due_wait_ms` after the last run, as the
        daemon's cycles do."""
        asked = self._interject.is_set()
        if not asked:
            if not beside.due_known:
                if time.monotonic() - beside.since < INTERLEAVE_AFTER_S:
                    return
                # From the cycle's instant: a rule that fell due since its steps ran is due.
                beside.due_ms, beside.due_known = self._next_due(partitions, report.now_ms), True
            if beside.due_ms is None or self.clock() < beside.due_ms:
                return
            wait_ms = due_wait_ms(beside.ran_ms, backoff_ms=self.config.log_cleaner_backoff_ms)
            if beside.ran_at_ms is not None and self.clock() - beside.ran_at_ms < wait_ms:
                return
        self._interject.clear()
        now = self.clock()
        log.info(
            "cycle.interleaved",
            reason="asked" if asked else "time rule due",
            running=sorted(str(r.job.tp) for r in running),
        )
        self._tell(report)  # so that what the steps change is what is left to tell
        self._roll(partitions, report, now)
        self._retention(partitions, report, now)
        report.unlinked += self.pending.run_due(now)
        self._changed_states(partitions, report)
        beside.due_ms, beside.due_known = self._next_due(partitions, now), True
        beside.ran_at_ms = self.clock()
        beside.ran_ms = beside.ran_at_ms - now

    def interject(self) -> None:
        """Have the cycle in progress, if its passes run on, run its roll, retention and
        disk-usage steps again now (the daemon asks when a device goes above
        `log.retention.disk.usage.percent`). Thread-safe."""
        self._interject.set()

    def _submit_next(self) -> tuple[Future[CleanResult], _Running] | None:
        now = self.clock()
        candidate = self.manager.grab_next(now)
        if candidate is None:
            return None
        item = candidate.log
        job = CleanJob(
            log_dir=item.log_dir.path,
            state_dir=item.log_dir.state_dir,
            tp=candidate.tp,
            segments=candidate.meta.segments,
            first_dirty=candidate.ltc.first_dirty,
            first_uncleanable=candidate.ltc.first_uncleanable,
            now_ms=now,
            config=cleaner_config_for(
                item.topic, producer_id_expiration_ms=self.config.producer_id_expiration_ms
            ),
        )
        where = _fields(job.tp, job.log_dir)
        if job.config.strategy.warning is not None:
            log.warning("compaction.strategy", **where, warning=job.config.strategy.warning)
        log.debug("clean.submitted", **where, reason=str(candidate.eligible))
        try:
            future = self.engine.submit_clean(job)
        except (CleanerdError, OSError) as exc:
            # Failed as a pass the engine failed: the partition, in progress since it was
            # grabbed, is released when its future is seen done.
            future = Future()
            future.set_exception(PassNotStarted(job.tp, exc))
        return future, _Running(candidate, job, now)

    def _changed_states(self, partitions: list[_Partition], report: _Builder) -> None:
        """The later states of the partitions the steps beside the passes changed, all
        else having been told before them (for a listener only: `_later_state`)."""
        if self.on_news is None:
            return
        changed = report.touched_untold()
        cleaner: dict[Path, dict[TopicPartition, int] | None] = {}
        for p in partitions:
            if (str(p.log_dir.path), p.tp) not in changed:
                continue
            cleaned_to = None
            if p.topic.compact:
                path = p.log_dir.path / CLEANER_OFFSET_CHECKPOINT
                if path not in cleaner:
                    try:
                        cleaner[path] = OffsetCheckpointFile(path).read()
                    except (CleanerdError, OSError):
                        cleaner[path] = None
                offsets = cleaner[path]
                if offsets is None:
                    continue  # its state waits for the next cycle, which reads it again
                cleaned_to = offsets.get(p.tp)
            plog = self._plogs.get((p.log_dir.path, p.tp), p.plog)
            self._later_state(report, plog, p.topic, self.clock(), cleaned_to)

    def _later_state(
        self,
        report: _Builder,
        plog: PartitionLog,
        topic: TopicConfig,
        now: int,
        cleaned_to: int | None,
    ) -> None:
        """Add `plog`'s state at `now` to `report`'s later states, for the metrics, when
        someone listens (`on_news`); one that cannot be read is read by the next cycle.
        A compacted partition is clean up to `cleaned_to` (None: not cleaned yet)."""
        if self.on_news is None:
            return
        with suppress(CleanerdError, OSError):
            meta = plog.meta()
            ltc = None
            if topic.compact:
                ltc = topic_log_to_clean(meta, topic, checkpoint=cleaned_to, now_ms=now)
            report.later_states.append(_state(meta, topic, ltc))

    def _finished(
        self, future: Future[CleanResult], r: _Running, report: _Builder, *, requeue: bool
    ) -> None:
        candidate, item = r.candidate, r.candidate.log
        now = self.clock()
        self.manager.done_cleaning(candidate.tp)
        error = future.exception()
        if error is None:
            result = future.result()
            self._crashes.pop(candidate.tp, None)
            self.pending.schedule(
                list(result.deleted_files), now_ms=now, delay_ms=item.topic.file_delete_delay_ms
            )
            report.cleaned.append(self._cleaned(r, result, now))
            if result.ran_out_of_space:
                # It got through, but the next pass, or the broker's next append, may not.
                log.warning(
                    "clean.ran_out_of_space",
                    **_fields(candidate.tp, item.log_dir.path),
                    consequence="the pass went on once the segments it had replaced were "
                    "unlinked at once, without file.delete.delay.ms",
                )
            if not item.plog.read_only:
                item.plog.take_snapshot()  # the state at the end of the cleaned log
            self._later_state(report, item.plog, item.topic, now, result.end_offset)
            # A pass that stopped short of its range (the offset map filled up) made
            # progress and has more to do: the partition goes back in the queue. One that
            # covered its range is looked at once more: it is eligible again only when
            # the horizons it stamped have passed already (`delete.retention.ms: 0`),
            # and then the tombstones go in this cycle, as `plan` says (`clean` ended
            # with the partition still eligible). One that made no progress is done.
            partial = result.first_dirty < result.end_offset < r.job.first_uncleanable
            progressed = result.end_offset > result.first_dirty
            if requeue and (partial or (progressed and self._may_pass_again(candidate.tp))):
                self.manager.refresh_one(item, now)
            return
        # Groups a failed pass had swapped in are done: their old files go as usual.
        self.pending.schedule(
            list(swapped_files(error)), now_ms=now, delay_ms=item.topic.file_delete_delay_ms
        )
        if isinstance(error, CleaningAborted):
            if not error.requested:
                # The engine failed the pass (a Spark job that failed or was killed).
                # Nothing is marked, as the partition is not at fault, but the pass
                # failed: said, and a failed step of the cycle.
                report.error(item.log_dir.path, candidate.tp, "clean", error)
            else:  # a stop or a pause: which pass it cut short, for the operator
                log.info("clean.aborted", **_fields(candidate.tp, item.log_dir.path))
            return  # stopped before its next swap: nothing to recover
        # The pass may have stopped between two renames of a swap (its worker died, the
        # disk filled): recovery, under the partition lock, completes or rolls that back
        # before anything plans on the partition again.
        fresh = self._reopen(item, now, report)
        if fresh is None:
            return
        where = _fields(candidate.tp, item.log_dir.path)
        retry = False
        if isinstance(error, StaleWork):
            # Planned on a state that no longer holds; nothing was changed. Planned again,
            # unless the dir is another process's now.
            log.warning("clean.stale", **where, detail=str(error))
            retry = not isinstance(error, OwnershipLost) and self._may_retry(candidate.tp)
            if not retry:
                return
        elif isinstance(error, WorkerCrashed):
            crashes = self._crashes.get(candidate.tp, 0) + 1
            self._crashes[candidate.tp] = crashes
            if crashes <= CRASH_RETRIES:
                log.warning("clean.worker_died", **where, detail=error.detail)
                retry = True
        elif (
            isinstance(error, FileStepError)
            and error.no_space
            and self._free_space(error, r)
            and self._may_retry(candidate.tp)
        ):
            log.warning("clean.no_space_retry", **where, detail=str(error))
            retry = True
        if retry:
            if requeue:
                self.manager.refresh_one(fresh, now)
            return
        self._mark(fresh, failure_text(error), now, report, during_pass=True)
        report.met(item.log_dir.path, candidate.tp, error)

    def _may_pass_again(self, tp: TopicPartition) -> bool:
        """Count a second whole pass of `tp` in this cycle; False after the first."""
        return _count_within(self._passed_again, tp, 1)

    def _may_retry(self, tp: TopicPartition) -> bool:
        """Count a retry of `tp` in this cycle; False once it had its `CYCLE_RETRIES`."""
        return _count_within(self._retries, tp, CYCLE_RETRIES)

    def _free_space(self, error: FileStepError, r: _Running) -> bool:
        """A pass ran out of space: unlink at once every file waiting for
        `file.delete.delay.ms` on its device (KIP-61's rule: under disk pressure the
        delay yields). Returns whether anything was freed."""
        try:
            device = r.job.dir_path.stat().st_dev
        except OSError:
            return False
        return bool(self.pending.unlink_on_device(device, str(error)))

    def _reopen(self, item: CompactedLog, now: int, report: _Builder) -> CompactedLog | None:
        """Open the partition of `item` again (recovering what a failed pass left); None,
        with the partition marked, when it cannot be opened."""
        key = (item.log_dir.path, item.tp)
        try:
            plog = item.log_dir.open_partition(item.tp, config=LogConfig.of_topic(item.topic))
        except (CleanerdError, OSError) as exc:
            if partition_dir_gone(item.log_dir.path / str(item.tp)):
                return None  # deleted under the pass (its topic): the next cycle forgets it
            self._mark(
                item, f"cannot reopen after a failed pass: {exc}", now, report, during_pass=True
            )
            report.met(item.log_dir.path, item.tp, exc)
            return None
        self._plogs[key] = plog
        return CompactedLog(item.log_dir, plog, item.topic)

    @staticmethod
    def _cleaned(r: _Running, result: CleanResult, now: int) -> CleanedLog:
        c = r.candidate
        deadline = c.ltc.deadline_ms
        overdue = 0 if deadline is None else max(0, r.started_ms - deadline)
        return CleanedLog(
            log_dir=str(c.log.log_dir.path),
            tp=c.tp,
            reason=c.eligible.value if c.eligible is not None else "",
            deadline_ms=deadline,
            overdue_ms=overdue,
            first_dirty=result.first_dirty,
            end_offset=result.end_offset,
            stats=result.stats,
            started_ms=r.started_ms,
            finished_ms=now,
        )


def _still_future(outcome: RetentionOutcome, clock: Callable[[], int]) -> int | None:
    """The clock, read again, when the segment whose future timestamp stopped time
    retention is still ahead of it; else None. The cycle's time was taken before it read
    the segments, and a batch an application appended since, stamped with its clock, was
    no more than a few milliseconds ahead of it, which is not a timestamp to warn about."""
    stamp = outcome.future_timestamp_ms
    if stamp is None:
        return None
    now = clock()
    return now if stamp > now else None


def _count_within(counts: dict[TopicPartition, int], tp: TopicPartition, most: int) -> bool:
    """Count one more for `tp`; whether that stays within `most`."""
    counts[tp] = counts.get(tp, 0) + 1
    return counts[tp] <= most


def _checkpoint_retention(changed: dict[LogDir, list[_Partition]], report: _Builder) -> None:
    """Write each dir's checkpoints once for the partitions its retention step changed
    (see `cleanerd.retention.executor`: the renames are durable already). A failure (a
    full disk) is each of those partitions' failed retention step; their deletions stand,
    and the start offsets are read back from the first segments meanwhile."""
    for log_dir, changed_in in changed.items():
        try:
            log_dir.checkpoint_logs(p.plog for p in changed_in)
        except (CleanerdError, OSError) as exc:
            for p in changed_in:
                report.error(log_dir.path, p.tp, "retention", exc)


def _prepare_clean_shutdown(
    plogs: list[PartitionLog], marked: Collection[TopicPartition]
) -> dict[PartitionLog, CleanerdError | OSError]:
    """`PartitionLog.prepare_clean_shutdown` of every partition of `plogs` (no snapshot
    for the `marked` uncleanable ones). Those with segments to flush go to
    `CLEAN_STOP_THREADS` threads: each costs a few fsyncs (its unflushed segments, its
    producer snapshot, its directory), which a disk completes several at a time (Kafka's
    shutdown also flushes a dir's logs in `num.recovery.threads.per.data.dir` threads).
    The others, nearly every partition of an idle host, cost a little Python each, which
    threads would only slow down. Every partition is prepared even if one fails; returns
    the failures, in partition order (each error names its file)."""
    pooled = [plog.unflushed for plog in plogs]
    futures: dict[int, Future[None]] = {}
    failures: dict[int, CleanerdError | OSError] = {}
    workers = max(1, min(CLEAN_STOP_THREADS, sum(pooled)))
    with ThreadPoolExecutor(workers, thread_name_prefix="cleanerd-clean-stop") as pool:
        for n, (plog, in_pool) in enumerate(zip(plogs, pooled, strict=True)):
            snapshot = plog.topic_partition not in marked
            if in_pool:
                futures[n] = pool.submit(plog.prepare_clean_shutdown, snapshot=snapshot)
                continue
            try:
                plog.prepare_clean_shutdown(snapshot=snapshot)
            except (CleanerdError, OSError) as exc:
                failures[n] = exc
    for n, future in futures.items():
        try:
            future.result()
        except (CleanerdError, OSError) as exc:
            failures[n] = exc
    return {plogs[n]: failures[n] for n in sorted(failures)}


def _state(
    meta: PartitionMeta, topic: TopicConfig, ltc: LogToClean | None = None
) -> PartitionState:
    """A partition's state for the metrics, with when its data first outlived
    `retention.ms` (`retention_due_ms`)."""
    due = retention_due_ms(meta, retention_ms=topic.retention_ms, policy_delete=topic.delete)
    return PartitionState(meta, ltc, due)


def _log_bytes_on(device: int, block_bytes: int, partitions: list[_Partition]) -> int:
    """What the segments of `partitions` whose log dir is on `device` take of it, counted
    as a deletion frees it (`disk_usage.freed_bytes`: each `.log` and index file in whole
    blocks), so that a dry run's deletions can be taken off it. (The `.log` sizes alone
    came out below the deletions of tiny segments: a negative size in `disk.pressure`.)"""
    devices = {p.log_dir.path: 0 for p in partitions}
    for path in devices:
        with suppress(OSError):
            devices[path] = device_of(path)
    total = 0
    for p in partitions:
        if devices[p.log_dir.path] == device:
            with suppress(CleanerdError, OSError):  # unreadable: its bytes go uncounted
                total += sum(freed_bytes(s, block_bytes) for s in p.plog.readable_meta().segments)
    return total


class _Kept(NamedTuple):
    """What `Maintenance.keep_known` last kept of a log dir."""

    key: object
    """`_segments_key` of the partitions kept."""
    partitions: frozenset[TopicPartition]
    at_ms: int


def _segments_key(plogs: list[PartitionLog]) -> object:
    """What `keep_known` compares between cycles: each partition's closed segments, by
    base offset, inode and whether they were read (a roll, a clean, a deletion or a
    first read moves it; an append does not: a start after a crash takes nothing of the
    active segment)."""
    return [
        (p.topic_partition, [(s.base_offset, s.inode, s.unread) for s in p.segments[:-1]])
        for p in plogs
    ]


def _sound(
    log_dir: LogDir, plogs: list[PartitionLog], damaged: Collection[tuple[Path, TopicPartition]]
) -> list[PartitionLog]:
    """Those of `log_dir`'s `plogs` checked (no check their open left is still undone: a
    cycle failed before it) and not damaged (found so by their open, or by any step
    since): what a clean stop's marker and a start after a crash may trust."""
    return [
        p
        for p in plogs
        if p.corrupt is None
        and not p.recovery_report.unchecked
        and (log_dir.path, p.topic_partition) not in damaged
    ]


def _all_sound(
    log_dir: LogDir, plogs: list[PartitionLog], damaged: Collection[tuple[Path, TopicPartition]]
) -> bool:
    """Every writable partition of the dir is open here and sound (`_sound`): only then
    may the next owner skip recovery."""
    opened = {p.topic_partition for p in _sound(log_dir, plogs, damaged)}
    writable = {tp for tp in log_dir.partitions() if tp.topic != METADATA_TOPIC}
    return writable <= opened
