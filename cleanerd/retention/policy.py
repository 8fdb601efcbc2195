"""Kafka's retention (UnifiedLog.deleteOldSegments) as a pure selection of segments.

Three passes run in Kafka's order, each over the segments the previous ones left:

1. **log start offset** (every policy): a segment goes when the next segment's base is
   at or below the log start offset (moved by DeleteRecords or earlier deletions);
2. **retention.bytes** (`delete` policies, when >= 0): with `diff = size -
   retention.bytes`, oldest segments go while `diff - segment size >= 0`;
3. **retention.ms** (`delete` policies, when >= 0): a segment goes when
   `now - largest timestamp > retention.ms` (largest timestamp falls back to the `.log`
   mtime when the segment holds none). A segment whose largest timestamp lies in the
   future is never expired, and it blocks every later segment: the plan names it so
   the caller can log it.

Each pass walks from the oldest segment and stops at the first that is not deletable.
A segment is deletable only when the high watermark covers it (HW >= the next segment's
base, or the log end offset for the last one) and it is not an empty last segment.

A damaged segment (`SegmentMeta.damage`: its batches cannot be read) is never deletable:
every pass stops before it, so the segments older than it still go, and it and every
later segment stay until the damage is repaired. Its offsets and timestamps are unknown,
and deleting it would be repairing a log by deleting data. When a pass would have gone
on to it (the start offset or `retention.bytes` covers it, or its `.log` mtime is past
`retention.ms`), the plan names it, so the caller can say what the damage holds back.

Kafka may delete the active segment too, rolling an empty one first. cleanerd never
deletes the active segment in a plan: when a pass would take it, the plan says a roll
is needed, and the caller rolls and plans again (the old active segment is then an
ordinary inactive one). The new log start offset is the base of the first surviving
segment, never lower than the current one. `__cluster_metadata` is never touched.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from cleanerd.log.meta import PartitionMeta, SegmentMeta
from cleanerd.log.topic_config import TopicConfig


class DeletionReason(enum.StrEnum):
    """Why a segment is deleted, as the `segment.deleted` event names it."""

    LOG_START_OFFSET = "log.start.offset"
    RETENTION_BYTES = "retention.bytes"
    RETENTION_MS = "retention.ms"
    DISK_USAGE = "disk.usage"


ROLLING_REASONS: Final = (DeletionReason.RETENTION_BYTES, DeletionReason.RETENTION_MS)
"""The rules that can take every segment of a partition, the active one rolled first
(the log start offset never passes the active segment's end, and disk usage never takes
an active segment)."""


@dataclass(frozen=True, slots=True)
class RetentionRoll:
    """The active segment rolled first, because a rule took every segment (Kafka's
    rule: the log can then be emptied); what a retention check did, or plans to do."""

    base_offset: int
    """The segment rolled (then deleted with the others, unless a failure stopped it)."""
    reason: DeletionReason


@dataclass(frozen=True, slots=True)
class Deletion:
    """Delete the segment starting at `base_offset`, for `reason`."""

    base_offset: int
    size_bytes: int
    reason: DeletionReason


@dataclass(frozen=True, slots=True)
class RetentionPlan:
    """What retention deletes from one partition, and what the caller must know."""

    deletions: tuple[Deletion, ...]
    """Oldest first; always a prefix of the partition's segments."""
    log_start_offset: int
    """The log start offset once the deletions are done."""
    roll_for: DeletionReason | None
    """The rule that would also take the active segment (roll, then plan again), or
    None."""
    future_timestamp_base: int | None
    """Base of a segment whose largest timestamp is in the future and that stopped
    time retention; None when none did."""
    future_timestamp_ms: int | None = None
    """That segment's largest timestamp."""
    damaged_base: int | None = None
    """Base of a damaged segment that stopped a pass which would otherwise have taken
    it; None when none did."""

    @property
    def roll_needed(self) -> bool:
        return self.roll_for is not None


_Predicate = Callable[[SegmentMeta, SegmentMeta | None], bool]


def _start_offset_breached(log_start_offset: int) -> _Predicate:
    def breached(_seg: SegmentMeta, nxt: SegmentMeta | None) -> bool:
        return nxt is not None and nxt.base_offset <= log_start_offset

    return breached


def _size_breached(diff: int) -> _Predicate:
    remaining = diff

    def breached(seg: SegmentMeta, _nxt: SegmentMeta | None) -> bool:
        nonlocal remaining
        if remaining - seg.size_bytes < 0:
            return False
        remaining -= seg.size_bytes
        return True

    return breached


def _time_breached(now_ms: int, retention_ms: int) -> _Predicate:
    def breached(seg: SegmentMeta, _nxt: SegmentMeta | None) -> bool:
        return now_ms - seg.largest_timestamp_ms > retention_ms

    return breached


@dataclass(slots=True)
class _Walk:
    """The segments left after each pass, and what the passes took."""

    remaining: Sequence[SegmentMeta]
    log_end_offset: int
    high_watermark: int
    deletions: list[Deletion] = field(default_factory=list)
    roll_for: DeletionReason | None = None
    damaged_base: int | None = None

    def delete_while(self, reason: DeletionReason, predicate: _Predicate) -> SegmentMeta | None:
        """Take leading segments as Kafka's deletableSegments does; return the segment
        that stopped the walk, or None when the walk took the active one (roll needed)."""
        taken = 0
        for i, seg in enumerate(self.remaining):
            nxt = self.remaining[i + 1] if i + 1 < len(self.remaining) else None
            upper = nxt.base_offset if nxt is not None else self.log_end_offset
            if self.high_watermark < upper or (nxt is None and seg.is_empty):
                break
            if not predicate(seg, nxt):
                break
            if seg.damage is not None:
                self.damaged_base = seg.base_offset
                break
            taken += 1
        stopper: SegmentMeta | None = None
        if taken == len(self.remaining):
            self.roll_for = self.roll_for or reason
            taken -= 1
        else:
            stopper = self.remaining[taken]
        self.deletions.extend(
            Deletion(s.base_offset, s.size_bytes, reason) for s in self.remaining[:taken]
        )
        self.remaining = self.remaining[taken:]
        return stopper


def deletable_segments(
    meta: PartitionMeta,
    *,
    now_ms: int,
    retention_ms: int,
    retention_bytes: int,
    policy_delete: bool,
    high_watermark: int | None = None,
) -> RetentionPlan:
    """Kafka's deleteOldSegments over `meta`: the segments to delete, oldest first.

    `high_watermark` defaults to the snapshot's (its log end offset when unknown). With
    `policy_delete` False (compact only) only the start-offset pass runs.
    """
    if meta.never_touched:
        return RetentionPlan((), meta.log_start_offset, None, None)
    hw = meta.high_watermark_or_end if high_watermark is None else high_watermark
    walk = _Walk(meta.segments, meta.log_end_offset, hw)
    walk.delete_while(
        DeletionReason.LOG_START_OFFSET, _start_offset_breached(meta.log_start_offset)
    )
    future: SegmentMeta | None = None
    if policy_delete:
        size = sum(s.size_bytes for s in walk.remaining)
        if retention_bytes >= 0 and size >= retention_bytes:
            walk.delete_while(
                DeletionReason.RETENTION_BYTES, _size_breached(size - retention_bytes)
            )
        if retention_ms >= 0:
            stopper = walk.delete_while(
                DeletionReason.RETENTION_MS, _time_breached(now_ms, retention_ms)
            )
            # An empty segment has no record timestamp: its largest is the file's mtime,
            # which a fresh roll may leave a moment past the cycle's clock.
            if (
                stopper is not None
                and stopper.largest_timestamp_ms > now_ms
                and stopper.size_bytes > 0
                and not stopper.damage
            ):
                future = stopper
    return RetentionPlan(
        deletions=tuple(walk.deletions),
        log_start_offset=max(meta.log_start_offset, walk.remaining[0].base_offset),
        roll_for=walk.roll_for,
        future_timestamp_base=None if future is None else future.base_offset,
        future_timestamp_ms=None if future is None else future.largest_timestamp_ms,
        damaged_base=walk.damaged_base,
    )


def retention_plan(meta: PartitionMeta, topic: TopicConfig, *, now_ms: int) -> RetentionPlan:
    """Kafka's deleteOldSegments over `meta` with `topic`'s settings."""
    return deletable_segments(
        meta,
        now_ms=now_ms,
        retention_ms=topic.retention_ms,
        retention_bytes=topic.retention_bytes,
        policy_delete=topic.delete,
    )


def dated_segments(meta: PartitionMeta) -> list[SegmentMeta]:
    """The segments of `meta` that time retention dates: non-empty and readable (a
    damaged segment's timestamps are unknown)."""
    return [s for s in meta.segments if s.size_bytes and s.damage is None]


def retention_due_ms(meta: PartitionMeta, *, retention_ms: int, policy_delete: bool) -> int | None:
    """When data of `meta` first outlived `retention.ms`: the least largest timestamp
    (the `.log` mtime for a segment with none) plus `retention.ms` over its non-empty,
    readable segments; None without time retention (not a `delete` policy, a negative
    `retention.ms`, the metadata log) or without such a segment. Past it, data older
    than `retention.ms` is on disk whatever keeps it (a later segment's future timestamp,
    damage, a high watermark behind, a paused daemon, a log dir only observed),
    which is what a deadline to delete by needs to see, whether the rules would delete
    it yet or not."""
    if not policy_delete or retention_ms < 0 or meta.never_touched:
        return None
    stamps = [s.largest_timestamp_ms for s in dated_segments(meta)]
    return min(stamps) + retention_ms if stamps else None
