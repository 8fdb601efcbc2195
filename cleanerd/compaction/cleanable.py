"""Which part of a compacted log may be cleaned, how dirty it is, and how late it is.

Kafka's LogCleanerManager math over a `PartitionMeta` snapshot:

- **First dirty offset**: the `cleaner-offset-checkpoint` entry, or the log start offset
  when there is none. A checkpoint below the log start offset or above the log end
  offset is reset to the log start offset, and the caller rewrites the checkpoint at
  once, whether or not the log is then cleaned (Kafka does the same).
- **First uncleanable offset**: the minimum of the last stable offset, the active
  segment's base and, when `min.compaction.lag.ms > 0`, the base of the first non-active
  segment from the one holding the dirty offset whose largest timestamp is newer than
  `now - min.compaction.lag.ms`; never below the dirty offset; then aligned down to the
  base of the segment holding it, so a cleaning round always ends on a segment boundary.
- **Bytes**: clean bytes are the sizes of segments whose base is below the dirty offset;
  cleanable bytes are the sizes of segments from the one holding
  `min(dirty, uncleanable)` up to (not including) the aligned uncleanable offset. A
  segment straddling the dirty offset counts in both, as in Kafka.
- **Max compaction lag** (KIP-354): Kafka takes the earliest first-batch timestamp
  (maxTimestamp of each segment's first batch, values <= 0 ignored) over the dirty
  *non-active* segments; its delay is how far that lies beyond `now - max lag`. That
  reads 0 while overdue data waits in an unrolled active segment, so cleanerd also
  computes an honest deadline that counts the active segment, used for scheduling and
  `cleanerd_max_compaction_delay_seconds`; Kafka's figure feeds the
  `kafka_log_logcleaner_max_compaction_delay_secs` gauge.
- **Eligibility**: dirty ratio strictly above `min.cleanable.dirty.ratio`; or Kafka's
  delay is positive and there are cleanable bytes (the active segment cannot be cleaned,
  so only overdue data outside it can force a round); or, cleanerd's extension, a
  delete horizon in the log has passed and there are bytes to rewrite.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Final

from cleanerd.log.files import TopicPartition
from cleanerd.log.meta import PartitionMeta
from cleanerd.log.topic_config import TopicConfig

NO_MAX_COMPACTION_LAG: Final = 2**63 - 1
"""Kafka's default max.compaction.lag.ms (Long.MAX_VALUE): no deadline at all."""


class UncleanableBound(enum.StrEnum):
    """What set the first uncleanable offset, as `cleanerd plan` reports it."""

    LAST_STABLE_OFFSET = "last.stable.offset"
    ACTIVE_SEGMENT = "active.segment"
    MIN_COMPACTION_LAG = "min.compaction.lag.ms"


class EligibilityReason(enum.StrEnum):
    """Why a log is due for cleaning."""

    DIRTY_RATIO = "min.cleanable.dirty.ratio"
    MAX_COMPACTION_LAG = "max.compaction.lag.ms"
    DELETE_HORIZON = "delete.retention.ms"
    REQUESTED = "requested"
    """An operator asked for a pass (`LogCleanerManager.force`), whatever the ratio."""


@dataclass(frozen=True, slots=True)
class CleanableRange:
    """The dirty section [first_dirty, first_uncleanable) of one log."""

    first_dirty: int
    uncleanable_offset: int
    """max(first_dirty, min of the bounds), before alignment (Kafka's cleanableOffsets)."""
    first_uncleanable: int
    """`uncleanable_offset` aligned down to the base of the segment holding it."""
    checkpoint_reset: bool
    """The checkpoint was outside [log start, log end]: rewrite it as `first_dirty` now."""
    blocked_by: tuple[UncleanableBound, ...]
    """Every bound at the lowest of them, in the order LSO, active segment, min lag."""


@dataclass(frozen=True, slots=True)
class CompactionDelay:
    """The max-lag deadline of a log's dirty data at one instant."""

    earliest_dirty_timestamp_ms: int | None
    """Earliest first-batch timestamp over the dirty segments; None when none has one."""
    deadline_ms: int | None
    """earliest + max.compaction.lag.ms; None without a timestamp or without a max lag."""
    delay_ms: int
    """max(0, now - deadline): how long the dirty data is overdue."""


@dataclass(frozen=True, slots=True)
class LogToClean:
    """One compacted log as a cleaning candidate (Kafka's LogToClean, plus deadlines)."""

    topic_partition: TopicPartition
    first_dirty: int
    first_uncleanable: int
    clean_bytes: int
    cleanable_bytes: int
    total_bytes: int
    cleanable_ratio: float
    compaction_delay_ms: int
    """cleanerd's delay: counts the active segment."""
    kafka_compaction_delay_ms: int
    """Kafka's delay: dirty non-active segments only."""
    earliest_dirty_timestamp_ms: int | None
    deadline_ms: int | None
    needs_compaction_now: bool
    """Kafka's needCompactionNow: its delay is positive."""
    cleanable_range: CleanableRange
    kafka_deadline_ms: int | None = None
    """Kafka's deadline (dirty non-active segments only); None without one."""

    def aged(self, now_ms: int) -> LogToClean:
        """The same candidate with its delays at `now_ms` (the deadlines do not move
        with the clock, so no snapshot is read again)."""
        delay = 0 if self.deadline_ms is None else max(0, now_ms - self.deadline_ms)
        kafka = 0 if self.kafka_deadline_ms is None else max(0, now_ms - self.kafka_deadline_ms)
        if (delay, kafka) == (self.compaction_delay_ms, self.kafka_compaction_delay_ms):
            return self
        return dataclasses.replace(
            self,
            compaction_delay_ms=delay,
            kafka_compaction_delay_ms=kafka,
            needs_compaction_now=kafka > 0,
        )


def _segment_floor_base(meta: PartitionMeta, offset: int) -> int:
    return meta.segments[meta.segment_index_for(offset)].base_offset


def _min_lag_bound(meta: PartitionMeta, first_dirty: int, cleanable_until_ms: int) -> int | None:
    for seg in meta.inactive[meta.segment_index_for(first_dirty) :]:
        if seg.largest_timestamp_ms > cleanable_until_ms:
            return seg.base_offset
    return None


def cleanable_range(
    meta: PartitionMeta,
    *,
    checkpoint: int | None,
    now_ms: int,
    min_compaction_lag_ms: int,
) -> CleanableRange:
    """Kafka's cleanableOffsets over `meta`, with the bound that stopped the range."""
    first_dirty = meta.log_start_offset if checkpoint is None else checkpoint
    reset = checkpoint is not None and not (
        meta.log_start_offset <= checkpoint <= meta.log_end_offset
    )
    if reset:
        first_dirty = meta.log_start_offset

    bounds: list[tuple[int, UncleanableBound]] = [
        (meta.last_stable_offset, UncleanableBound.LAST_STABLE_OFFSET),
        (meta.active.base_offset, UncleanableBound.ACTIVE_SEGMENT),
    ]
    if min_compaction_lag_ms > 0:
        lag_bound = _min_lag_bound(meta, first_dirty, now_ms - min_compaction_lag_ms)
        if lag_bound is not None:
            bounds.append((lag_bound, UncleanableBound.MIN_COMPACTION_LAG))
    lowest = min(offset for offset, _ in bounds)
    uncleanable = max(first_dirty, lowest)
    return CleanableRange(
        first_dirty=first_dirty,
        uncleanable_offset=uncleanable,
        first_uncleanable=_segment_floor_base(meta, uncleanable),
        checkpoint_reset=reset,
        blocked_by=tuple(bound for offset, bound in bounds if offset == lowest),
    )


def clean_bytes(meta: PartitionMeta, first_dirty: int) -> int:
    """Sizes of the segments whose base offset is below the dirty offset."""
    return sum(s.size_bytes for s in meta.segments if s.base_offset < first_dirty)


def cleanable_bytes(meta: PartitionMeta, first_dirty: int, first_uncleanable: int) -> int:
    """Sizes of the segments from the one holding min(dirty, uncleanable) up to uncleanable."""
    start = _segment_floor_base(meta, min(first_dirty, first_uncleanable))
    return sum(s.size_bytes for s in meta.segments if start <= s.base_offset < first_uncleanable)


def _compaction_delay(
    meta: PartitionMeta,
    first_dirty: int,
    *,
    now_ms: int,
    max_compaction_lag_ms: int,
    include_active: bool,
) -> CompactionDelay:
    segments = meta.segments if include_active else meta.inactive
    stamps = [
        s.first_batch_timestamp_ms
        for s in segments[meta.segment_index_for(first_dirty) :]
        if s.first_batch_timestamp_ms is not None and s.first_batch_timestamp_ms > 0
    ]
    earliest = min(stamps, default=None)
    if earliest is None or max_compaction_lag_ms >= NO_MAX_COMPACTION_LAG:
        return CompactionDelay(earliest, None, 0)
    deadline = earliest + max(max_compaction_lag_ms, 0)
    return CompactionDelay(earliest, deadline, max(0, now_ms - deadline))


def kafka_max_compaction_delay(
    meta: PartitionMeta, *, first_dirty: int, now_ms: int, max_compaction_lag_ms: int
) -> CompactionDelay:
    """Kafka's maxCompactionDelay: over dirty non-active segments only."""
    return _compaction_delay(
        meta,
        first_dirty,
        now_ms=now_ms,
        max_compaction_lag_ms=max_compaction_lag_ms,
        include_active=False,
    )


def max_compaction_delay(
    meta: PartitionMeta, *, first_dirty: int, now_ms: int, max_compaction_lag_ms: int
) -> CompactionDelay:
    """cleanerd's honest delay: the active segment's dirty data counts too."""
    return _compaction_delay(
        meta,
        first_dirty,
        now_ms=now_ms,
        max_compaction_lag_ms=max_compaction_lag_ms,
        include_active=True,
    )


def log_to_clean(
    meta: PartitionMeta,
    *,
    checkpoint: int | None,
    now_ms: int,
    min_compaction_lag_ms: int,
    max_compaction_lag_ms: int,
) -> LogToClean:
    """Everything the scheduler and `plan` need to know about one compacted log."""
    rng = cleanable_range(
        meta, checkpoint=checkpoint, now_ms=now_ms, min_compaction_lag_ms=min_compaction_lag_ms
    )
    clean = clean_bytes(meta, rng.first_dirty)
    cleanable = cleanable_bytes(meta, rng.first_dirty, rng.first_uncleanable)
    total = clean + cleanable
    kafka = kafka_max_compaction_delay(
        meta,
        first_dirty=rng.first_dirty,
        now_ms=now_ms,
        max_compaction_lag_ms=max_compaction_lag_ms,
    )
    honest = max_compaction_delay(
        meta,
        first_dirty=rng.first_dirty,
        now_ms=now_ms,
        max_compaction_lag_ms=max_compaction_lag_ms,
    )
    return LogToClean(
        topic_partition=meta.topic_partition,
        first_dirty=rng.first_dirty,
        first_uncleanable=rng.first_uncleanable,
        clean_bytes=clean,
        cleanable_bytes=cleanable,
        total_bytes=total,
        cleanable_ratio=cleanable / total if total else 0.0,
        compaction_delay_ms=honest.delay_ms,
        kafka_compaction_delay_ms=kafka.delay_ms,
        earliest_dirty_timestamp_ms=honest.earliest_dirty_timestamp_ms,
        deadline_ms=honest.deadline_ms,
        needs_compaction_now=kafka.delay_ms > 0,
        cleanable_range=rng,
        kafka_deadline_ms=kafka.deadline_ms,
    )


def topic_log_to_clean(
    meta: PartitionMeta, topic: TopicConfig, *, checkpoint: int | None, now_ms: int
) -> LogToClean:
    """`log_to_clean` under `topic`'s compaction lags."""
    return log_to_clean(
        meta,
        checkpoint=checkpoint,
        now_ms=now_ms,
        min_compaction_lag_ms=topic.min_compaction_lag_ms,
        max_compaction_lag_ms=topic.max_compaction_lag_ms,
    )


def eligibility(
    ltc: LogToClean, min_cleanable_ratio: float, *, horizon_due: bool
) -> EligibilityReason | None:
    """The first reason `ltc` is due for cleaning, or None when it is not.

    `horizon_due` says a tombstone or transaction marker in the log has a delete horizon
    that has passed (computed from the batches, elsewhere).
    """
    if ltc.cleanable_ratio > min_cleanable_ratio:
        return EligibilityReason.DIRTY_RATIO
    if ltc.needs_compaction_now and ltc.cleanable_bytes > 0:
        return EligibilityReason.MAX_COMPACTION_LAG
    if horizon_due and ltc.total_bytes > 0:
        return EligibilityReason.DELETE_HORIZON
    return None
