"""The steps of a maintenance cycle, in their order, and the rules that decide each: one
list for the cycle that carries them out (`cycle.Maintenance`, on the files, each step
under its partition lock) and for `cleanerd plan`, which predicts them over snapshots
(`plan.plan_cycle`, pure). Both take each decision from the same function:

1. **roll** (`roller.roll_decision`): `segment.bytes`, or `segment.ms` /
   `max.compaction.lag.ms` (KIP-354) after the minimum roll interval;
2. **retention** (`retention_applies`, then `executor.retention_plan`): every partition
   of a `delete` topic, and compacted partitions while `log.cleaner.enable` is on
   (Kafka's cleaner-driven retention: only the log start offset rule without `delete`),
   at every cycle; a plan that would take the active segment rolls it first
   (`retention_step`);
3. **disk usage** (`disk_usage_applies`): KIP-61, whenever a device is above
   `log.retention.disk.usage.percent`, over every partition's snapshot after retention;
4. **clean** (`compaction_plan`; the manager computes the same `log_to_clean` and
   `eligibility`): compacted partitions, in the deadline-first order.

When each step's time rules fall due is the daemon's business (`cleanerd.daemon`), not
a gate here: a cycle applies every step to every partition it is given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from cleanerd.compaction.cleanable import (
    EligibilityReason,
    LogToClean,
    eligibility,
    topic_log_to_clean,
)
from cleanerd.compaction.horizon import SegmentHorizon, horizon_due
from cleanerd.log.files import TopicPartition
from cleanerd.log.meta import PartitionMeta, SegmentMeta
from cleanerd.log.roll import (
    DEFAULT_MIN_ROLL_INTERVAL_MS,
    RollDecision,
    SegmentAge,
    time_roll_due,
)
from cleanerd.log.roller import roll_decision, time_rule
from cleanerd.log.topic_config import TopicConfig
from cleanerd.retention.policy import RetentionPlan, RetentionRoll, retention_plan

STEPS: Final = ("roll", "retention", "disk usage", "clean")
"""The steps of a cycle, in order."""


HELD_UNCLEANABLE: Final = "partition is uncleanable"
"""Why the retention step passes a compacted partition by: it is marked uncleanable (found
corrupt at its open, a damaged segment, a failed pass), and Kafka's cleaner-driven
retention skips an uncleanable log."""


def retention_applies(topic: TopicConfig, *, cleaner_enabled: bool) -> bool:
    """Whether the retention step acts on a partition of `topic`: always for a topic
    without `compact`; for a compacted one only while the cleaner runs (Kafka)."""
    return not topic.compact or cleaner_enabled


def disk_usage_applies(*, any_device_above: bool, all_topics: bool) -> bool:
    """Whether the disk-usage step runs: a device is above its threshold, and the cycle
    covers every topic (KIP-61 orders segments across all topics of a device)."""
    return any_device_above and all_topics


@dataclass(frozen=True, slots=True)
class RollPlan:
    """The active segment's roll: due now, or when."""

    decision: RollDecision | None
    limit_ms: int
    """Kafka's maxSegmentMs for the topic."""
    limit_reason: str
    due_at_ms: int | None
    """When the time rule will roll the segment (None: empty segment, never)."""
    held_by_min_interval: bool = False
    """The minimum roll interval (`rolls.min_interval_ms`), not the time rule, sets
    `due_at_ms`."""
    min_interval_ms: int = DEFAULT_MIN_ROLL_INTERVAL_MS
    """The floor in force: `rolls.min_interval_ms`, or the time rule's limit if that is
    shorter."""


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    """The cleaning candidate's numbers and verdict."""

    ltc: LogToClean
    min_cleanable_ratio: float
    eligible: EligibilityReason | None
    horizon_due: bool
    uncleanable: str | None
    pass_fails: bool = False
    """`uncleanable` is what the pass the partition was eligible for will fail on
    (`plan` foresees it: the cycle marks the partition uncleanable then, after its
    retention step)."""

    @property
    def blocked_by(self) -> tuple[str, ...]:
        """What set the first uncleanable offset (LSO, active segment, min lag)."""
        return tuple(b.value for b in self.ltc.cleanable_range.blocked_by)


def _empty_segment(base: int, now_ms: int) -> SegmentMeta:
    return SegmentMeta(
        base_offset=base,
        next_offset=base,
        size_bytes=0,
        largest_timestamp_ms=now_ms,
        first_batch_timestamp_ms=None,
        offset_index_bytes=0,
        time_index_bytes=0,
        last_modified_ms=now_ms,
    )


def simulate_roll(meta: PartitionMeta, now_ms: int) -> PartitionMeta:
    """`meta` after a roll: an empty active segment at the log end offset."""
    if meta.active.is_empty:
        return meta
    segments = (*meta.segments, _empty_segment(meta.log_end_offset, now_ms))
    return dataclasses.replace(meta, segments=segments)


def simulate_deletions(meta: PartitionMeta, count: int) -> PartitionMeta:
    """`meta` after its `count` oldest segments are deleted (retention's and disk usage's
    deletions are a prefix, never the active segment): the log start offset moves up to
    the first segment left."""
    if not count:
        return meta
    left = meta.segments[count:]
    start = max(meta.log_start_offset, left[0].base_offset)
    return dataclasses.replace(meta, segments=left, log_start_offset=start)


def roll_plan(
    tp: TopicPartition,
    active: SegmentMeta,
    topic: TopicConfig,
    *,
    now_ms: int,
    age: SegmentAge,
    min_roll_interval_ms: int = DEFAULT_MIN_ROLL_INTERVAL_MS,
) -> RollPlan:
    """The roll decision at `now_ms` and, by the time rule, when it falls due."""
    limit, jitter = time_rule(tp, active.base_offset, topic)
    decision = roll_decision(
        tp, active, topic, now_ms=now_ms, age=age, min_roll_interval_ms=min_roll_interval_ms
    )
    if active.is_empty:
        return RollPlan(decision, limit.ms, limit.reason.value, None)
    due = time_roll_due(
        active,
        max_segment_ms=limit.ms,
        jitter_ms=jitter,
        age=age,
        min_roll_interval_ms=min_roll_interval_ms,
    )
    return RollPlan(
        decision,
        limit.ms,
        limit.reason.value,
        due.at_ms,
        due.held_by_min_interval,
        min(min_roll_interval_ms, limit.ms),  # the floor `time_roll_due` applies
    )


def retention_step(
    meta: PartitionMeta, topic: TopicConfig, *, now_ms: int
) -> tuple[RetentionPlan, RetentionRoll | None, PartitionMeta]:
    """The retention step over `meta`: the plan, the roll of the active segment done
    first (every segment was due; None when there is none), and the snapshot after it."""
    plan = retention_plan(meta, topic, now_ms=now_ms)
    roll = None
    if plan.roll_for is not None and not meta.active.is_empty:
        roll = RetentionRoll(meta.active.base_offset, plan.roll_for)
        meta = simulate_roll(meta, now_ms)
        plan = retention_plan(meta, topic, now_ms=now_ms)
    return plan, roll, simulate_deletions(meta, len(plan.deletions))


def compaction_plan(
    meta: PartitionMeta,
    topic: TopicConfig,
    *,
    now_ms: int,
    checkpoint: int | None,
    horizons: Iterable[SegmentHorizon],
    uncleanable: str | None,
) -> CompactionPlan:
    """The clean step of a compacted partition: its cleaning candidate (the manager's
    `log_to_clean` and `eligibility`, as a cycle computes them) over the snapshot left
    by the roll and retention steps."""
    ltc = topic_log_to_clean(meta, topic, checkpoint=checkpoint, now_ms=now_ms)
    live = {s.base_offset for s in meta.segments}
    due = horizon_due(
        (h for h in horizons if h.base_offset in live),
        now_ms=now_ms,
        end_offset=ltc.first_uncleanable,
    )
    eligible = None
    if uncleanable is None:
        eligible = eligibility(ltc, topic.min_cleanable_dirty_ratio, horizon_due=due)
    return CompactionPlan(ltc, topic.min_cleanable_dirty_ratio, eligible, due, uncleanable)


def next_due_ms(
    meta: PartitionMeta,
    topic: TopicConfig,
    *,
    now_ms: int,
    age: SegmentAge,
    horizons: Iterable[SegmentHorizon] = (),
    cleaner_enabled: bool = True,
    min_roll_interval_ms: int = DEFAULT_MIN_ROLL_INTERVAL_MS,
) -> int | None:
    """The first instant after `now_ms` at which a time rule may act on the partition:
    its active segment's time roll (`segment.ms` / `max.compaction.lag.ms`),
    `retention.ms` reaching the oldest segment, a delete horizon passing or a segment
    leaving the `min.compaction.lag.ms` bound (a compacted partition may become
    eligible). The daemon runs a cycle then, so each rule acts within a cycle's slack of
    its due time (max-lag deadlines come with the cleaning candidates, `.deleted` files
    with `PendingDeletions.next_due_ms`). A damaged partition (`PartitionMeta.damage`)
    is neither rolled nor cleaned: only its oldest segment's retention counts, when that
    one is not the damaged segment."""
    if meta.never_touched:
        return None
    damaged = meta.damage is not None
    due: list[int] = []
    if not meta.active.is_empty and not damaged:
        tp = meta.topic_partition
        plan = roll_plan(
            tp,
            meta.active,
            topic,
            now_ms=now_ms,
            age=age,
            min_roll_interval_ms=min_roll_interval_ms,
        )
        if plan.due_at_ms is not None:
            due.append(plan.due_at_ms)
    oldest = meta.segments[0]
    if (
        topic.delete
        and topic.retention_ms >= 0
        and retention_applies(topic, cleaner_enabled=cleaner_enabled)
        and not oldest.is_empty
        and oldest.damage is None
    ):
        # Deletion takes a prefix, so the oldest segment's breach is the next one; Kafka
        # deletes once now - largest timestamp > retention.ms.
        due.append(oldest.largest_timestamp_ms + topic.retention_ms + 1)
    if topic.compact and cleaner_enabled and not damaged:
        due += [h.earliest_ms for h in horizons if h.earliest_ms is not None]
        if topic.min_compaction_lag_ms > 0:
            # A segment leaves the min-lag bound once now - lag >= its largest timestamp.
            lag = topic.min_compaction_lag_ms
            due += [s.largest_timestamp_ms + lag for s in meta.segments[:-1]]
    return min((d for d in due if d > now_ms), default=None)


DUE_SHARE: Final = 0.1
"""The most of the time that the steps started by time rules falling due take when
those fall due one after another (`due_wait_ms`)."""


def due_wait_ms(last_ms: int, *, backoff_ms: int) -> int:
    """How long after the steps last ran (for `last_ms`) a time rule that fell due runs
    them again: at once after a quick run, else after nine times its length, so that rules
    falling due one after another (thousands of partitions, each rolling and expiring at
    its own instant) take a tenth of a core rather than all of it, and each run acts on
    all that fell due meanwhile; never longer than `log.cleaner.backoff.ms`, the delay
    Kafka's cleaner takes to see a log (its retention runs every
    `log.retention.check.interval.ms`, 5 minutes)."""
    return min(round(last_ms * (1 - DUE_SHARE) / DUE_SHARE), backoff_ms)
