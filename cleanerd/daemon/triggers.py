"""When the daemon runs a cycle, and why (pure decisions over plain data).

A cycle over every partition costs CPU in proportion to the partition count even when
nothing changed, so the daemon does not repeat it blindly: it runs one at startup, then
whenever `cycle_due` finds a reason (see `cleanerd.daemon.service` for the list). The
deadlines come from the last cycle's states (`deadlines`); the changes the daemon made
itself (`touched_partitions`) never start another cycle.
"""

from __future__ import annotations

import contextlib
import enum
from dataclasses import dataclass
from typing import Final

from cleanerd.daemon.watcher import PartitionKey
from cleanerd.log.files import TopicPartition, parse_topic_partition
from cleanerd.maintenance.report import CycleReport
from cleanerd.maintenance.steps import due_wait_ms


class CycleTrigger(enum.StrEnum):
    """Why a cycle starts (logged with it)."""

    STARTUP = "startup"
    MORE_WORK = "more-work"
    CHANGED = "changed"
    DEADLINE = "deadline"
    DUE = "due"
    OVERDUE = "overdue"
    DISK_PRESSURE = "disk-pressure"
    REVISIT = "revisit"
    REQUESTED = "requested"
    RETRY = "retry"


@dataclass(frozen=True, slots=True)
class CycleClock:
    """What `cycle_due` decides on (all times in wall-clock milliseconds)."""

    now_ms: int
    last_end_ms: int | None
    """When the previous cycle ended; None before the first."""
    last_cleaned: bool
    """A pass of the previous cycle made progress (`made_progress`)."""
    changed: bool
    """The watcher saw a change since the previous cycle started."""
    next_deadline_ms: int | None
    """The earliest max-lag deadline after the previous cycle's instant."""
    next_due_ms: int | None
    """The earliest time-rule deadline after the previous cycle's instant (a roll, a
    retention, a delete horizon, a min lag, a `.deleted` file: `CycleReport.next_due_ms`)."""
    overdue: bool
    """A partition was past its deadline after the previous cycle and not marked
    uncleanable (its dirty data waits for a roll, or for a blocking bound to move)."""
    disk_pressure: bool
    requested: bool
    failures_in_a_row: int = 0
    """Cycles that failed whole since the last one done (`retry_wait_ms`)."""
    last_length_ms: int = 0
    """How long the previous cycle ran (`due_wait_ms`)."""


def cycle_due(c: CycleClock, *, backoff_ms: int, revisit_ms: int) -> CycleTrigger | None:
    """Whether a cycle starts now, and why (see the module docstring)."""
    if c.last_end_ms is None:
        return CycleTrigger.STARTUP
    if c.requested:
        return CycleTrigger.REQUESTED
    if c.failures_in_a_row:
        waited = c.now_ms - c.last_end_ms
        wait = retry_wait_ms(c.failures_in_a_row, backoff_ms=backoff_ms, revisit_ms=revisit_ms)
        return CycleTrigger.RETRY if waited >= wait else None
    if c.last_cleaned:
        return CycleTrigger.MORE_WORK
    idle_for = c.now_ms - c.last_end_ms
    if c.disk_pressure and idle_for >= backoff_ms:
        return CycleTrigger.DISK_PRESSURE
    paced = idle_for >= due_wait_ms(c.last_length_ms, backoff_ms=backoff_ms)
    if paced and c.next_deadline_ms is not None and c.now_ms >= c.next_deadline_ms:
        return CycleTrigger.DEADLINE
    if paced and c.next_due_ms is not None and c.now_ms >= c.next_due_ms:
        return CycleTrigger.DUE
    if c.overdue and idle_for >= backoff_ms:
        return CycleTrigger.OVERDUE
    if c.changed and idle_for >= backoff_ms:
        return CycleTrigger.CHANGED
    if idle_for >= revisit_ms:
        return CycleTrigger.REVISIT
    return None


MIN_RETRY_WAIT_MS: Final = 1000
"""The least wait after a failed cycle, whatever `log.cleaner.backoff.ms` (0 is allowed)."""


def retry_wait_ms(failures_in_a_row: int, *, backoff_ms: int, revisit_ms: int) -> int:
    """How long after a cycle that failed whole the next one waits: `backoff_ms` (at
    least `MIN_RETRY_WAIT_MS`), doubled for each failure in a row after the first, up to
    `revisit_ms` (never less than the first wait). What failed the cycle fails the next
    one too until something changes, and a due time rule, a deadline or the watcher would
    otherwise start it at once, a traceback logged at every tick; a request (a command,
    a reload after a fix) does not wait."""
    first = max(backoff_ms, MIN_RETRY_WAIT_MS)
    return max(first, min(first << min(failures_in_a_row - 1, 32), revisit_ms))


@dataclass(frozen=True, slots=True)
class Deadlines:
    """What the last cycle says about deadlines."""

    next_ms: int | None = None
    """The earliest max-lag deadline still to come."""
    overdue: bool = False
    """Some partition not marked uncleanable is past its max-lag deadline."""
    due_ms: int | None = None
    """The earliest time-rule deadline (`CycleReport.next_due_ms`)."""


def deadlines(report: CycleReport, *, uncleanable: frozenset[TopicPartition]) -> Deadlines:
    """The deadlines after `report`'s cycle, seen from its instant. The partitions of
    the log dirs it only observed have none the daemon can meet (nothing is written
    there): a broker whose cleaner lags kept an observing daemon cycling every backoff,
    a full cycle each time, for as long as it lagged; their delay gauges age at each
    scrape."""
    upcoming: list[int] = []
    overdue = False
    now_ms = report.now_ms
    observed = frozenset(report.observed)
    for s in report.states:
        deadline = None if s.ltc is None else s.ltc.deadline_ms
        if deadline is None or s.meta.log_dir in observed:
            continue
        if deadline > now_ms:
            upcoming.append(deadline)
        elif s.meta.topic_partition not in uncleanable:
            overdue = True
    return Deadlines(min(upcoming, default=None), overdue, report.next_due_ms)


def touched_partitions(report: CycleReport) -> frozenset[PartitionKey]:
    """The partitions whose files `report`'s cycle changed itself (rolls, deletions,
    passes, unlinked `.deleted` files): the watcher's next scan sees those changes, and
    they must not start another cycle."""
    keys = [PartitionKey.of(r.log_dir, r.tp) for r in report.rolled]
    keys += [PartitionKey(o.log_dir, o.topic, o.partition) for o in report.retention]
    keys += [PartitionKey.of(c.log_dir, c.tp) for c in report.cleaned]
    if report.disk_usage is not None:
        keys += [PartitionKey.of(d.log_dir, d.topic_partition) for d in report.disk_usage.deletions]
    for path in report.unlinked:
        with contextlib.suppress(ValueError):
            keys.append(
                PartitionKey.of(str(path.parent.parent), parse_topic_partition(path.parent.name))
            )
    return frozenset(keys)
