"""The retention-deadline audit: data past `retention.ms` still on disk, how long, and
what keeps it.

What counts. Time retention (`policy.deletable_segments`, Kafka's rule) deletes a
segment once its largest timestamp is more than `retention.ms` in the past, so a
segment's deadline is its largest timestamp plus `retention.ms` (the `.log` mtime for a
segment without timestamps, as Kafka's largestTimestamp falls back to it). Over a
partition of a topic with `delete` in its cleanup policy and `retention.ms` >= 0, every
non-empty segment whose deadline has passed is *past retention*, and it is a *deadline
violation* once its deadline passed more than the slack ago (the time a correct deleter
may need after a deadline: the caller states it, see `commands/audit.py`).

That holds whatever keeps the segment. The rules' walk stops at the first segment they
may not delete, so a segment with a future timestamp, a damaged one, one placed before
it that is not yet past `retention.ms`, or a high watermark behind keeps every later
segment; and a daemon or broker that runs no retention check keeps them all. The audit
says which: the rules are run at the audit's time (`policy.retention_plan`, the cycle's
own decision), and `hold` names the segment they stop at and why, when they would keep a
segment past its deadline; segments they would delete are *due* (no retention check
has deleted them since their deadline).

A damaged segment (`SegmentMeta.damage`) has no known timestamps: nothing is proved
about it, so it is named with its damage (`damaged`) and the command counts it as a
failure.

Segment files already renamed `.deleted` (by retention or a cleaning pass) still hold
their bytes until `file.delete.delay.ms` after the rename, when the deleter (the daemon,
a broker) removes them: they are reported as *pending deletion*, and one pending longer
than that delay plus the slack is a *stuck deletion*, a failure too (the deleter is not
running). The rename's time is the file's ctime.

Kafka's rule dates a segment, not a record: a record stays until the newest record of
its segment is past `retention.ms`, so records older than that are on disk as long as a
newer one shares their segment (and a cleaning pass, merging segments, can keep them
longer). The deadline audited is the rule's.

Only segment metadata is read (`PartitionLog.readable_meta`, O(segments)), never a
batch: the audit of a partition under `delete` alone costs what `plan` costs.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cleanerd.log.meta import PartitionMeta, SegmentMeta
from cleanerd.log.topic_config import TopicConfig
from cleanerd.retention.policy import dated_segments, retention_plan


class HoldReason(enum.StrEnum):
    """Why the rules, run now, stop before a segment past its deadline."""

    FUTURE_TIMESTAMP = "future timestamp"
    """The segment they stop at has its largest timestamp in the future."""
    NOT_EXPIRED = "not expired"
    """The segment they stop at is not yet past `retention.ms` (timestamps that go
    back in time from one segment to the next)."""
    DAMAGE = "damage"
    """The segment they stop at cannot be read."""
    HIGH_WATERMARK = "high watermark"
    """The high watermark is below the end of the segment they stop at."""


@dataclass(frozen=True, slots=True)
class Hold:
    """The segment the rules stop at, keeping the later ones past their deadline."""

    base_offset: int
    reason: HoldReason
    largest_timestamp_ms: int
    """Its largest timestamp (the `.log` mtime for an empty or damaged one)."""
    size_bytes: int
    end_offset: int
    """Where it ends: the next segment's base offset, or the log end offset."""
    high_watermark: int
    """The high watermark the rules went by."""
    damage: str | None = None
    """Its damage, when that is the reason."""


@dataclass(frozen=True, slots=True)
class DamagedSegment:
    """A segment that cannot be dated, and why."""

    base_offset: int
    damage: str


@dataclass(frozen=True, slots=True)
class OverdueSegment:
    """A segment past its deadline."""

    base_offset: int
    size_bytes: int
    largest_timestamp_ms: int
    overdue_ms: int
    """How long ago its deadline (largest timestamp + `retention.ms`) passed."""


@dataclass(frozen=True, slots=True)
class PendingFile:
    """A segment's `.log` renamed `.deleted`, waiting out `file.delete.delay.ms`."""

    path: str
    size_bytes: int
    renamed_ms: int
    """When it was renamed (its ctime)."""


@dataclass(frozen=True, slots=True)
class RetentionAudit:
    """The retention audit of one partition, with what it was measured against."""

    log_dir: str
    topic: str
    partition: int
    now_ms: int
    retention_ms: int
    slack_ms: int
    segments: int
    """Segments dated (`policy.dated_segments`): the ones whose deadline is known."""
    past_retention: int
    """Segments past their deadline (the slack aside)."""
    past_retention_bytes: int
    violations: int
    """Segments past their deadline by more than the slack."""
    most_overdue_ms: int | None
    """How long ago the oldest deadline passed; None when none has."""
    due: int
    """Segments past their deadline that the rules, run now, delete."""
    hold: Hold | None
    """Where the rules stop before a segment past its deadline; None when they stop
    before none."""
    listed: tuple[OverdueSegment, ...]
    """Violations, the most overdue first, at most the caller's `max_listed`."""
    damaged: tuple[DamagedSegment, ...]
    """The damaged segments, about which nothing is proved."""
    file_delete_delay_ms: int = 0
    pending: tuple[PendingFile, ...] = ()
    """Files pending deletion, the longest pending first."""
    stuck: int = 0
    """Of those, the ones pending longer than `file.delete.delay.ms` plus the slack."""

    @property
    def failed(self) -> bool:
        """A violation, a stuck deletion, or a segment that could not be dated."""
        return bool(self.violations or self.stuck or self.damaged)

    @property
    def name(self) -> str:
        """The partition's dir, as messages name it."""
        return str(Path(self.log_dir) / f"{self.topic}-{self.partition}")

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (an entry of `cleanerd audit --json`'s `retention`)."""
        return asdict(self)


def audits_retention(topic: TopicConfig) -> bool:
    """True when `topic`'s data has a retention deadline: `delete` in its policy and
    `retention.ms` >= 0."""
    return topic.delete and topic.retention_ms >= 0


def audit_retention(
    meta: PartitionMeta,
    topic: TopicConfig,
    *,
    now_ms: int,
    slack_ms: int,
    max_listed: int,
    pending: Sequence[PendingFile] = (),
) -> RetentionAudit:
    """The retention audit of `meta` (a `readable_meta` snapshot) at `now_ms`, for a
    topic with a retention deadline (`audits_retention`), with the files of its dir
    pending deletion."""
    retention_ms = topic.retention_ms
    plan = retention_plan(meta, topic, now_ms=now_ms)
    deleted = len(meta.segments) if plan.roll_needed else len(plan.deletions)
    place = {s.base_offset: i for i, s in enumerate(meta.segments)}
    past = [
        (now_ms - s.largest_timestamp_ms - retention_ms, s)
        for s in dated_segments(meta)
        if now_ms - s.largest_timestamp_ms > retention_ms
    ]
    past.sort(key=lambda p: (-p[0], p[1].base_offset))
    late = [
        OverdueSegment(s.base_offset, s.size_bytes, s.largest_timestamp_ms, overdue)
        for overdue, s in past
        if overdue > slack_ms
    ]
    kept = any(place[s.base_offset] >= deleted for _, s in past)
    return RetentionAudit(
        log_dir=meta.log_dir,
        topic=meta.topic,
        partition=meta.partition,
        now_ms=now_ms,
        retention_ms=retention_ms,
        slack_ms=slack_ms,
        segments=len(dated_segments(meta)),
        past_retention=len(past),
        past_retention_bytes=sum(s.size_bytes for _, s in past),
        violations=len(late),
        most_overdue_ms=past[0][0] if past else None,
        due=sum(place[s.base_offset] < deleted for _, s in past),
        hold=_hold(meta, deleted, now_ms=now_ms) if kept else None,
        listed=tuple(late[:max_listed]),
        damaged=tuple(
            DamagedSegment(s.base_offset, s.damage) for s in meta.segments if s.damage is not None
        ),
        file_delete_delay_ms=topic.file_delete_delay_ms,
        pending=tuple(sorted(pending, key=lambda f: (f.renamed_ms, f.path))),
        stuck=sum(now_ms - f.renamed_ms > topic.file_delete_delay_ms + slack_ms for f in pending),
    )


def _hold(meta: PartitionMeta, deleted: int, *, now_ms: int) -> Hold:
    """Why the rules stop at segment `deleted` of `meta`, in the order their walk
    (`policy._Walk.delete_while`) asks."""
    stop: SegmentMeta = meta.segments[deleted]
    hw = meta.high_watermark_or_end
    nxt = meta.segments[deleted + 1] if deleted + 1 < len(meta.segments) else None
    upper = meta.log_end_offset if nxt is None else nxt.base_offset
    if hw < upper:
        reason = HoldReason.HIGH_WATERMARK
    elif stop.damage is not None:
        reason = HoldReason.DAMAGE
    elif stop.largest_timestamp_ms > now_ms:
        reason = HoldReason.FUTURE_TIMESTAMP
    else:
        reason = HoldReason.NOT_EXPIRED
    return Hold(
        stop.base_offset,
        reason,
        stop.largest_timestamp_ms,
        size_bytes=stop.size_bytes,
        end_offset=upper,
        high_watermark=hw,
        damage=stop.damage if reason is HoldReason.DAMAGE else None,
    )
