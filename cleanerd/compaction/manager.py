"""Who cleans what, when: cleanerd's LogCleanerManager (Kafka's, one class).

State, all in memory (as Kafka keeps it), per topic-partition (a partition lives in one
log dir, as in Kafka; the cycle skips a second copy of one in another dir):

- the cleaning state machine of Kafka's manager (reference 4.14): no state ->
  IN_PROGRESS (picked by `grab_next`, or held by retention) -> no state;
  IN_PROGRESS -> ABORTED (`abort_and_pause`) -> PAUSED(1) when the pass reports back;
  PAUSED(n) <-> PAUSED(n +- 1) by `pause`/`resume`, PAUSED(1) -> no state on `resume`.
  `done_cleaning`/`done_deleting` on a partition with no state or a paused one, and
  `resume` of one that is not paused, are errors (`CleanerStateError`): they are bugs of
  the caller, never a condition of the data;
- the uncleanable registry (`UncleanablePartitions`: marked with a reason, retried after
  a backoff or a config change);
- the candidates of the last `refresh`: every compacted partition's `LogToClean`
  (`cleanable.log_to_clean`), whether it is eligible and why (`cleanable.eligibility`,
  with cleanerd's passed-delete-horizon rule).

Selection: `grab_next(now_ms)` picks the first of the eligible candidates in cleaning
order (overdue first, most overdue first; then the nearest deadline; then the dirtiest)
that has no state and is not uncleanable; the pick becomes IN_PROGRESS. No partition is
therefore handed to two workers at once.

Forced passes (the `clean` command): `force(tp)` asks for one pass of `tp` whatever its
dirty ratio. Forced partitions go first, in the order asked, when free and not
uncleanable, and only when a pass has something to do (cleanable bytes, or a passed
delete horizon); the request is one-shot: it is consumed when its pass is picked, and
dropped when the next refresh finds the partition gone, uncleanable or with nothing to
clean (`take_dropped` hands those on, with why and the ids the requests carried, for the
daemon to answer). `force` may be called from another thread than the cycle loop's (the
daemon's event loop): the set of requests has its own lock.

Retention asks first: `begin_deleting` grants a partition only when it has no state,
and holds it IN_PROGRESS until `done_deleting`, so a pass never starts on a partition
whose segments retention is deleting and retention never deletes the segments of a
partition being cleaned (`retention_hold` wraps both calls). As in Kafka, compacted
partitions marked uncleanable get no cleaner-driven retention either.

Checkpoint resets (reference 4.2 step 4, 4.3): a `cleaner-offset-checkpoint` entry below
the log start offset or above the log end offset is rewritten to the log start offset
the moment `refresh` sees it, whether or not the partition is then picked, under the log
dir's cross-process `checkpoint_lock` (passes in worker processes rewrite the same file).

A failure while computing a partition's candidate (a corrupt segment met while reading
first-batch timestamps or delete horizons, an I/O error) marks that partition
uncleanable with the reason and leaves the others alone (reference scenario 54).

Time is a parameter (`now_ms`, from the cycle's injectable clock); nothing here reads
a clock or sleeps.

Selection order. Kafka hands each free cleaner thread the dirtiest eligible log; with few
threads and many logs a log forced by `max.compaction.lag.ms` can then wait behind
dirtier ones indefinitely, so the deadline is not kept. cleanerd orders eligible logs by
(`priority_key`): overdue logs (deadline before now), most overdue first; then logs with
a deadline, nearest first; then logs without a deadline (no max lag, or no dirty
timestamp); within equal deadlines and in the last class the dirtiest (highest cleanable
ratio) first, and the topic-partition breaks every remaining tie, so two runs over the
same snapshot pick the same order. Deadlines are evaluated at the `now_ms` given, not at
the time the candidates were computed. `order_for_cleaning` is the same order for
`cleanerd plan`.

Uncleanable partitions (`UncleanablePartitions`). A pass that fails (a corrupt batch in
the range to clean, an I/O error, a full disk) leaves the partition's segments as they
were and marks it uncleanable with the reason, so it is not retried in a tight loop and
the operator sees why (log line, `kafka_log_logcleanermanager_uncleanable_partitions_count`
/ `_bytes`, `partition.uncleanable` event). Kafka keeps the mark until the partition goes
away or the broker restarts; cleanerd also clears it when the partition's settings change
(the operator may have fixed the cause) and after a backoff (a full disk may have been
freed), so a long-running daemon recovers without a restart.
"""

from __future__ import annotations

import bisect
import enum
import hashlib
import threading
from collections.abc import Iterable, Iterator, Set
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from cleanerd.compaction.cleanable import (
    EligibilityReason,
    LogToClean,
    eligibility,
    topic_log_to_clean,
)
from cleanerd.compaction.horizon import HorizonCache
from cleanerd.errors import CheckpointError, CleanerdError, failure_text
from cleanerd.log.files import TopicPartition, partition_dir_gone
from cleanerd.log.lock import checkpoint_lock
from cleanerd.log.log_dir import LogDir
from cleanerd.log.meta import PartitionMeta
from cleanerd.log.partition_log import PartitionLog
from cleanerd.log.topic_config import TopicConfig
from cleanerd.logger import get_logger

log = get_logger(__name__)

DEFAULT_UNCLEANABLE_BACKOFF_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class UncleanableMark:
    """Why and when a partition was marked, under which config fingerprint."""

    log_dir: str
    reason: str
    since_ms: int
    config_fingerprint: str


@dataclass(slots=True)
class UncleanablePartitions:
    """The registry; one per process, shared by every worker."""

    backoff_ms: int = DEFAULT_UNCLEANABLE_BACKOFF_MS
    _marks: dict[TopicPartition, UncleanableMark] = field(default_factory=dict)

    def mark(
        self,
        tp: TopicPartition,
        *,
        log_dir: str,
        reason: str,
        now_ms: int,
        config_fingerprint: str = "",
    ) -> None:
        """Mark `tp` uncleanable for `reason` (replacing an earlier mark)."""
        self._marks[tp] = UncleanableMark(log_dir, reason, now_ms, config_fingerprint)

    def is_uncleanable(
        self, tp: TopicPartition, *, now_ms: int, config_fingerprint: str = ""
    ) -> bool:
        """Whether `tp` is still to be skipped; an expired mark or one made under another
        config is dropped here."""
        mark = self._marks.get(tp)
        if mark is None:
            return False
        if (
            now_ms - mark.since_ms >= self.backoff_ms
            or mark.config_fingerprint != config_fingerprint
        ):
            del self._marks[tp]
            return False
        return True

    def reason(self, tp: TopicPartition) -> str | None:
        """The reason `tp` was marked, or None."""
        mark = self._marks.get(tp)
        return None if mark is None else mark.reason

    def clear(self, tp: TopicPartition) -> None:
        """Forget `tp` (partition deleted, or an operator's explicit retry)."""
        self._marks.pop(tp, None)

    def clear_all(self) -> list[TopicPartition]:
        """Forget every mark (an operator's retry of them all); returns the partitions."""
        cleared, self._marks = list(self._marks), {}
        return cleared

    def retain_only(self, existing: Iterable[TopicPartition]) -> None:
        """Drop marks of partitions that no longer exist (Kafka does this every loop)."""
        keep = set(existing)
        for tp in [tp for tp in self._marks if tp not in keep]:
            del self._marks[tp]

    def in_dir(self, log_dir: str) -> dict[TopicPartition, UncleanableMark]:
        """The marks of one log dir (for the per-dir metrics)."""
        return {tp: m for tp, m in self._marks.items() if m.log_dir == log_dir}

    def __len__(self) -> int:
        return len(self._marks)


# -- selection order ------------------------------------------------------------------

_OVERDUE, _DEADLINE, _NO_DEADLINE = 0, 1, 2

PriorityKey = tuple[int, int, float, str, int]


def priority_key(ltc: LogToClean, now_ms: int) -> PriorityKey:
    """Sort key: smaller is cleaned first. The order of two logs does not depend on
    `now_ms`: deadlines sort ascending within both classes, and a deadline that has passed
    is earlier than one that has not, so the class never reorders them."""
    tp = ltc.topic_partition
    if ltc.deadline_ms is None:
        return (_NO_DEADLINE, 0, -ltc.cleanable_ratio, tp.topic, tp.partition)
    klass = _OVERDUE if ltc.deadline_ms < now_ms else _DEADLINE
    # Ascending deadlines put the most overdue first among overdue logs, too.
    return (klass, ltc.deadline_ms, -ltc.cleanable_ratio, tp.topic, tp.partition)


def order_for_cleaning(candidates: Iterable[LogToClean], now_ms: int) -> list[LogToClean]:
    """Eligible candidates, in the order workers should take them."""
    return sorted(candidates, key=lambda ltc: priority_key(ltc, now_ms))


def select_next(
    candidates: Iterable[LogToClean],
    in_progress: Set[TopicPartition],
    uncleanable: Set[TopicPartition],
    now_ms: int,
) -> LogToClean | None:
    """The first eligible candidate in cleaning order that no worker holds and that is
    not quarantined: what `LogCleanerManager.grab_next` picks."""
    free = (
        ltc
        for ltc in order_for_cleaning(candidates, now_ms)
        if ltc.topic_partition not in in_progress and ltc.topic_partition not in uncleanable
    )
    return next(free, None)


class CleaningState(enum.Enum):
    """Kafka's LogCleaningState."""

    IN_PROGRESS = "in-progress"
    ABORTED = "aborted"
    PAUSED = "paused"


class CleanerStateError(CleanerdError):
    """A state transition the manager does not allow (a caller's bug)."""


def config_fingerprint(topic: TopicConfig) -> str:
    """A short digest of a topic's effective settings: an uncleanable mark made under one
    fingerprint is dropped when the settings change (the operator may have fixed it)."""
    return hashlib.blake2b(repr(topic).encode(), digest_size=8).hexdigest()


@dataclass(frozen=True, slots=True)
class CompactedLog:
    """A partition whose topic has `compact` in its cleanup policy, opened for writing."""

    log_dir: LogDir
    plog: PartitionLog
    topic: TopicConfig
    fingerprint: str = field(init=False)
    """The config fingerprint its uncleanable marks carry."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "fingerprint", config_fingerprint(self.topic))

    @property
    def tp(self) -> TopicPartition:
        """The partition's identity."""
        return self.plog.topic_partition


@dataclass(frozen=True, slots=True)
class Candidate:
    """One compacted partition as the last refresh saw it."""

    log: CompactedLog
    meta: PartitionMeta
    ltc: LogToClean
    eligible: EligibilityReason | None
    """Why it is due for cleaning; None when it is not."""
    horizon_due: bool

    @property
    def tp(self) -> TopicPartition:
        """The partition's identity."""
        return self.ltc.topic_partition

    @property
    def has_work(self) -> bool:
        """Whether a pass has something to do: cleanable bytes, or a passed horizon."""
        return self.ltc.cleanable_bytes > 0 or (self.horizon_due and self.ltc.total_bytes > 0)


@dataclass(frozen=True, slots=True)
class DroppedRequest:
    """A forced pass dropped without running, and why."""

    tp: TopicPartition
    log_dir: str | None
    """None when the partition is in no log dir any more."""
    reason: str
    request_ids: tuple[str, ...]
    """The ids of the `clean` commands that asked for it (those that carried one)."""


@dataclass(frozen=True, slots=True)
class _State:
    kind: CleaningState
    paused: int = 0


class LogCleanerManager:
    """See the module docstring. Not thread-safe: one cycle loop drives it."""

    def __init__(
        self,
        *,
        registry: UncleanablePartitions | None = None,
        horizons: HorizonCache | None = None,
    ) -> None:
        self.registry = registry if registry is not None else UncleanablePartitions()
        self.horizons = horizons if horizons is not None else HorizonCache()
        self.last_run_ms: int | None = None
        """When `grab_next` last looked for work (Kafka's time of last run)."""
        self._states: dict[TopicPartition, _State] = {}
        self._candidates: dict[TopicPartition, Candidate] = {}
        self.unreadable: dict[TopicPartition, str] = {}
        """The logs whose metadata the last refresh could not read, with the error."""
        self._forced: dict[TopicPartition, tuple[str, ...]] = {}
        """Forced partitions, in the order asked, with the ids of their requests."""
        self._dropped: list[DroppedRequest] = []
        """Forced passes dropped since the last `take_dropped`."""
        self._dir_unread: dict[TopicPartition, Path] = {}
        """The logs of the last refresh whose dir's checkpoints could not be read again
        (no candidate: `_cleaner_offsets`), and their dir."""
        self._order: list[Candidate] | None = None
        """The eligible candidates in cleaning order, sorted on the first `grab_next`
        after the candidates changed; the first `_taken` of them are picked already."""
        self._taken = 0
        self._forced_lock = threading.Lock()

    # -- the state machine ----------------------------------------------------------------

    def state(self, tp: TopicPartition) -> CleaningState | None:
        """The partition's cleaning state; None when it has none."""
        st = self._states.get(tp)
        return None if st is None else st.kind

    def paused_count(self, tp: TopicPartition) -> int:
        """How many pauses are held on `tp` (0 unless PAUSED)."""
        st = self._states.get(tp)
        return st.paused if st is not None and st.kind is CleaningState.PAUSED else 0

    def pause(self, tp: TopicPartition) -> None:
        """Keep `tp` from being picked until a matching `resume`. A partition in progress
        cannot be paused this way: use `abort_and_pause`."""
        st = self._states.get(tp)
        if st is None:
            self._states[tp] = _State(CleaningState.PAUSED, 1)
        elif st.kind is CleaningState.PAUSED:
            self._states[tp] = _State(CleaningState.PAUSED, st.paused + 1)
        else:
            raise CleanerStateError(f"{tp} cannot be paused: it is {st.kind.value}")

    def abort_and_pause(self, tp: TopicPartition) -> bool:
        """Pause `tp`; when a pass holds it, mark it ABORTED (it becomes PAUSED(1) when the
        pass reports back) and return True: the caller then asks the engine to abort."""
        st = self._states.get(tp)
        if st is not None and st.kind is CleaningState.IN_PROGRESS:
            self._states[tp] = _State(CleaningState.ABORTED)
            return True
        if st is not None and st.kind is CleaningState.ABORTED:
            return True
        self.pause(tp)
        return False

    def resume(self, tp: TopicPartition) -> None:
        """Release one pause of `tp`."""
        st = self._states.get(tp)
        if st is None or st.kind is not CleaningState.PAUSED:
            what = "no state" if st is None else st.kind.value
            raise CleanerStateError(f"{tp} cannot be resumed: it has {what}")
        if st.paused > 1:
            self._states[tp] = _State(CleaningState.PAUSED, st.paused - 1)
        else:
            del self._states[tp]

    def _finish(self, tp: TopicPartition, what: str) -> None:
        st = self._states.get(tp)
        if st is None or st.kind is CleaningState.PAUSED:
            state = "no state" if st is None else "paused"
            raise CleanerStateError(f"done {what} of {tp}, which has {state}")
        if st.kind is CleaningState.ABORTED:
            self._states[tp] = _State(CleaningState.PAUSED, 1)
        else:
            del self._states[tp]

    # -- selection ----------------------------------------------------------------------

    def refresh(self, logs: Iterable[CompactedLog], now_ms: int) -> list[Candidate]:
        """Compute every log's candidate at `now_ms`, rewriting invalid checkpoints at
        once and marking logs whose candidate cannot be computed uncleanable. Uncleanable
        and busy logs are computed too (the metrics report them) but never picked."""
        by_dir: dict[Path, list[CompactedLog]] = {}
        for item in logs:
            by_dir.setdefault(item.log_dir.path, []).append(item)
        self._candidates = {}
        self.unreadable = {}
        self._dir_unread = {}
        for items in by_dir.values():
            checkpoints = _cleaner_offsets(items[0].log_dir)
            if checkpoints is None:
                self._dir_unread.update((item.tp, item.log_dir.path) for item in items)
                continue
            for item in items:
                candidate = self._evaluate(item, checkpoints.get(item.tp), now_ms)
                if candidate is not None:
                    self._candidates[item.tp] = candidate
        self._order = None
        self._drop_pointless_forces(now_ms)
        return list(self._candidates.values())

    def refresh_one(self, item: CompactedLog, now_ms: int) -> Candidate | None:
        """Recompute one log's candidate (after its pass)."""
        checkpoints = _cleaner_offsets(item.log_dir)
        candidate = None
        if checkpoints is not None:
            candidate = self._evaluate(item, checkpoints.get(item.tp), now_ms)
        if candidate is None:
            self._candidates.pop(item.tp, None)
        else:
            self._candidates[item.tp] = candidate
            if self._order is not None and candidate.eligible is not None:
                # Into the sorted order, not a new sort per pass (n passes over n
                # candidates cost O(n^2 log n)); an entry replaced or gone is passed over
                # (`_waiting`), and one sorting before the picks so far is next.
                bisect.insort(
                    self._order,
                    candidate,
                    lo=self._taken,
                    key=lambda c: priority_key(c.ltc, now_ms),
                )
        return candidate

    def _evaluate(
        self, item: CompactedLog, checkpoint: int | None, now_ms: int
    ) -> Candidate | None:
        self.unreadable.pop(item.tp, None)
        try:
            meta = item.plog.meta()
        except (CleanerdError, OSError) as exc:
            if self._failed(item, exc, now_ms):
                self.unreadable[item.tp] = str(exc)
            return None
        ltc = topic_log_to_clean(meta, item.topic, checkpoint=checkpoint, now_ms=now_ms)
        if ltc.cleanable_range.checkpoint_reset:
            try:
                self._reset_checkpoint(item, checkpoint, ltc.first_dirty)
            except (CleanerdError, OSError) as exc:
                # Read, but its checkpoint cannot be set right: never picked until it is.
                self._failed(item, exc, now_ms)
                return Candidate(item, meta, ltc, None, False)
        try:
            due = self.horizons.horizon_due(
                item.plog, now_ms=now_ms, end_offset=ltc.first_uncleanable
            )
        except (CleanerdError, OSError) as exc:
            # The range is known (the metrics report its bytes as uncleanable); the
            # segments cannot be read.
            self._failed(item, exc, now_ms)
            return Candidate(item, meta, ltc, None, False)
        reason = eligibility(ltc, item.topic.min_cleanable_dirty_ratio, horizon_due=due)
        return Candidate(item, meta, ltc, reason, due)

    def _failed(self, item: CompactedLog, exc: Exception, now_ms: int) -> bool:
        """Mark `item` for `exc`; False, and nothing marked, when its dir is gone: it met
        its deletion (its topic), not damage, and the next cycle forgets it."""
        if partition_dir_gone(item.plog.dir):
            return False
        if not self.is_uncleanable(item, now_ms):
            self.mark_uncleanable(item, failure_text(exc), now_ms)
        return True

    @staticmethod
    def _reset_checkpoint(item: CompactedLog, old: int | None, first_dirty: int) -> None:
        log_dir = item.log_dir
        with checkpoint_lock(log_dir.state_dir, log_dir.path):
            log_dir.update_cleaner_offset(item.tp, first_dirty)
        log.info(
            "cleaner_checkpoint.reset",
            topic=item.tp.topic,
            partition=item.tp.partition,
            log_dir=str(log_dir.path),
            checkpoint=old,
            first_dirty=first_dirty,
        )

    @property
    def candidates(self) -> dict[TopicPartition, Candidate]:
        """The candidates of the last refresh, by partition."""
        return dict(self._candidates)

    def is_uncleanable(self, item: CompactedLog, now_ms: int) -> bool:
        """Whether `item` is marked (an expired mark or one made under other settings
        is dropped here)."""
        return self.registry.is_uncleanable(
            item.tp, now_ms=now_ms, config_fingerprint=item.fingerprint
        )

    # -- forced passes ------------------------------------------------------------------

    def force(self, tp: TopicPartition, request_id: str | None = None) -> None:
        """Ask for one pass of `tp` now, whatever its dirty ratio (see the module
        docstring); `request_id` names the request, for its outcome. Thread-safe."""
        with self._forced_lock:
            ids = self._forced.get(tp, ())
            self._forced[tp] = ids if request_id is None else (*ids, request_id)

    def take_dropped(self) -> tuple[DroppedRequest, ...]:
        """The forced passes dropped since the last call. Thread-safe."""
        with self._forced_lock:
            dropped, self._dropped = tuple(self._dropped), []
        return dropped

    @property
    def forced(self) -> tuple[TopicPartition, ...]:
        """The forced passes asked for and not yet picked or dropped, in order."""
        with self._forced_lock:
            return tuple(self._forced)

    def _drop_pointless_forces(self, now_ms: int) -> None:
        with self._forced_lock:
            for tp, ids in list(self._forced.items()):
                c = self._candidates.get(tp)
                if tp in self._states:
                    continue  # busy: its turn comes when it is free
                reason = self._pointless(tp, c, now_ms)
                if reason is None:
                    continue
                del self._forced[tp]
                log_dir = None if c is None else str(c.log.log_dir.path)
                self._dropped.append(DroppedRequest(tp, log_dir, reason, ids))
                log.info(
                    "clean.request_dropped",
                    topic=tp.topic,
                    partition=tp.partition,
                    log_dir=log_dir,
                    reason=reason,
                    ids=list(ids),
                )

    def _pointless(self, tp: TopicPartition, c: Candidate | None, now_ms: int) -> str | None:
        """Why a forced pass of `tp` (its candidate `c`) would do nothing, if it would.
        A partition without a candidate was not found by the refresh, or was found and
        could not be read (its segments, or its dir's checkpoints)."""
        if c is None:
            if tp in self.unreadable:
                return f"unreadable: {self.unreadable[tp]}"
            if tp in self._dir_unread:
                return f"the checkpoints of its log dir {self._dir_unread[tp]} cannot be read"
            return "no such partition"
        if self.is_uncleanable(c.log, now_ms):
            return f"marked uncleanable: {self.registry.reason(c.tp)}"
        if not c.has_work:
            return "nothing to clean"
        return None

    def _grab_forced(self, now_ms: int) -> Candidate | None:
        with self._forced_lock:
            for tp in list(self._forced):
                c = self._candidates.get(tp)
                if c is None or tp in self._states or not c.has_work:
                    continue
                if self.is_uncleanable(c.log, now_ms):
                    continue
                del self._forced[tp]
                self._states[tp] = _State(CleaningState.IN_PROGRESS)
                del self._candidates[tp]
                return replace(c, eligible=c.eligible or EligibilityReason.REQUESTED)
        return None

    def grab_next(self, now_ms: int) -> Candidate | None:
        """The next log to clean, now IN_PROGRESS: a forced one first; None when nothing
        eligible is free."""
        self.last_run_ms = now_ms
        forced = self._grab_forced(now_ms)
        if forced is not None:
            return forced
        if self._order is None:
            # The order does not change as time passes (see `priority_key`), so it is
            # sorted once per refresh, not once per pick: picking all of n candidates
            # costs O(n log n), not O(n^2).
            eligible = [c for c in self._candidates.values() if c.eligible is not None]
            self._order = sorted(eligible, key=lambda c: priority_key(c.ltc, now_ms))
            self._taken = 0
        order = self._order
        while self._taken < len(order) and not self._waiting(order[self._taken]):
            self._taken += 1
        for i in range(self._taken, len(order)):
            c = order[i]
            if not self._waiting(c) or c.tp in self._states:
                continue
            if self.is_uncleanable(c.log, now_ms):
                continue
            self._states[c.tp] = _State(CleaningState.IN_PROGRESS)
            return self._candidates.pop(c.tp)
        return None

    def _waiting(self, c: Candidate) -> bool:
        """Whether `c` is still the partition's candidate (not picked or replaced)."""
        return self._candidates.get(c.tp) is c

    def done_cleaning(self, tp: TopicPartition) -> None:
        """The pass of `tp` reported back (done, failed or aborted): its state clears, or
        becomes PAUSED(1) if an abort was requested. The pass itself moved the
        checkpoint; the next `refresh_one` reads it."""
        self._finish(tp, "cleaning")

    def mark_uncleanable(self, item: CompactedLog, reason: str, now_ms: int) -> None:
        """Quarantine `item` with `reason` (logged)."""
        self.registry.mark(
            item.tp,
            log_dir=str(item.log_dir.path),
            reason=reason,
            now_ms=now_ms,
            config_fingerprint=item.fingerprint,
        )
        self._candidates.pop(item.tp, None)
        log.warning(
            "partition.uncleanable",
            topic=item.tp.topic,
            partition=item.tp.partition,
            log_dir=str(item.log_dir.path),
            reason=reason,
        )

    # -- retention ----------------------------------------------------------------------

    def begin_deleting(
        self,
        logs: Iterable[tuple[TopicPartition, TopicConfig]],
        now_ms: int,
        *,
        skip_uncleanable: bool = True,
    ) -> list[TopicPartition]:
        """Of `logs` (partitions with their topic's settings), the ones retention may act
        on now, held IN_PROGRESS until `done_deleting`: those with no state and, when
        compacted, not uncleanable (Kafka's deletableLogs). Disk-usage retention passes
        `skip_uncleanable=False`: a quarantined partition still fills its device."""
        granted = []
        for tp, topic in logs:
            if tp in self._states:
                continue
            if (
                skip_uncleanable
                and topic.compact
                and self.registry.is_uncleanable(
                    tp, now_ms=now_ms, config_fingerprint=config_fingerprint(topic)
                )
            ):
                continue
            self._states[tp] = _State(CleaningState.IN_PROGRESS)
            granted.append(tp)
        return granted

    def done_deleting(self, tp: TopicPartition) -> None:
        """Retention is done with `tp`."""
        self._finish(tp, "deleting")

    @contextmanager
    def retention_hold(
        self,
        logs: Iterable[tuple[TopicPartition, TopicConfig]],
        now_ms: int,
        *,
        skip_uncleanable: bool = True,
    ) -> Iterator[list[TopicPartition]]:
        """`begin_deleting` ... `done_deleting` around a block."""
        granted = self.begin_deleting(logs, now_ms, skip_uncleanable=skip_uncleanable)
        try:
            yield granted
        finally:
            for tp in granted:
                self.done_deleting(tp)


def _cleaner_offsets(log_dir: LogDir) -> dict[TopicPartition, int] | None:
    """The dir's `cleaner-offset-checkpoint` read again, or None when its root checkpoints
    went bad since the cycle read them: no log of the dir is a candidate then, and the
    next cycle takes the dir offline."""
    try:
        return log_dir.reload_checkpoints().cleaner_offsets
    except (CheckpointError, OSError) as exc:
        log.error(
            "log_dir.checkpoints_unreadable", log_dir=str(log_dir.path), error=failure_text(exc)
        )
        return None
