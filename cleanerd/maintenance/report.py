"""What a maintenance cycle reports, and the one JSON schema that `cleanerd clean --json`
(what a cycle did) and `cleanerd plan --json` (what the next cycle would do) share.

A cycle's report (`CycleReport`) lists the segments rolled, the segments deleted (by
retention, with its rule as the reason, and by KIP-61 disk usage), the passes run, the
partitions marked uncleanable, the steps that failed and the partitions left alone, and
the state of every compacted partition before cleaning (`PartitionState`, the metrics'
input). What a cycle did so far (`CycleNews`) is told while it runs: the daemon's events
come as things happen, not once a cycle of hours of passes ends. The counters
(`MaintenanceCounters`) add up rolls and deletions by reason over the process's life.

JSON: one name per field in both documents. A rolled segment is `{log_dir, topic,
partition, base_offset, reason, waited_ms}`; a deleted segment `{log_dir, topic,
partition, base_offset, size_bytes, reason}` (`device` too for `disk.usage`); `plan`
adds its explanations per partition (`partitions`) and the order passes would run in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from cleanerd.compaction.cleanable import LogToClean
from cleanerd.compaction.manager import DroppedRequest
from cleanerd.compaction.stats import CleanerStats
from cleanerd.log.files import TopicPartition
from cleanerd.log.meta import PartitionMeta
from cleanerd.log.recovery import TruncatedTail
from cleanerd.log.roll import RollDecision
from cleanerd.log.tail import ZERO_TAIL
from cleanerd.retention.disk import DiskUsageReport
from cleanerd.retention.disk_usage import DiskDeletion, device_name
from cleanerd.retention.executor import RetentionOutcome
from cleanerd.retention.policy import Deletion


@dataclass(frozen=True, slots=True)
class RolledSegment:
    """An active segment the cycle rolled."""

    log_dir: str
    tp: TopicPartition
    base_offset: int
    reason: str
    waited_ms: int | None


@dataclass(frozen=True, slots=True)
class CleanedLog:
    """One pass the cycle ran."""

    log_dir: str
    tp: TopicPartition
    reason: str
    """Why the partition was eligible (`min.cleanable.dirty.ratio`, ...)."""
    deadline_ms: int | None
    overdue_ms: int
    """How far past its deadline it was when picked (0: not overdue)."""
    first_dirty: int
    end_offset: int
    stats: CleanerStats
    started_ms: int
    finished_ms: int


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A partition that could not be opened or read (its metadata): it is neither rolled
    nor cleaned, and it has no state for the metrics; retention and disk usage delete
    only segments older than its damage (`PartitionLog.readable_meta`). `policy`: its
    topic's `cleanup.policy`."""

    log_dir: str
    tp: TopicPartition
    policy: tuple[str, ...]
    reason: str

    def to_json(self) -> dict[str, Any]:
        """As a JSON-ready dict (`unreadable` in `clean --json` and `plan --json`)."""
        return {
            **_where(self.log_dir, self.tp),
            "cleanup_policy": list(self.policy),
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class FailedLog:
    """A partition marked uncleanable with `reason`: by a pass that failed, or before
    any pass, by damage its open or its metadata showed."""

    log_dir: str
    tp: TopicPartition
    reason: str
    during_pass: bool
    """A pass ran and failed (counted among the passes); False when none ran."""


@dataclass(frozen=True, slots=True)
class StepError:
    """A step the cycle could not carry out on a partition (an I/O error, a refused
    file): `phase` is `discover` (a topic two `topics:` globs match), `open`, `roll`,
    `retention`, `reopen` or `clean` (a pass its engine failed with nothing changed: a
    Spark job that failed). Unlike a skip, never by design; the step is tried again the
    next cycle, and `cleanerd clean` exits 1."""

    log_dir: str
    tp: TopicPartition
    phase: str
    reason: str


@dataclass(frozen=True, slots=True)
class OfflineLogDir:
    """A log dir the cycle could not use at all: it could not be opened or listed, or its
    root checkpoint files could not be read (a malformed line, an I/O error). As Kafka takes
    such a dir offline, the cycle leaves every partition in it alone (nothing there is
    rolled, deleted or cleaned, and no checkpoint file written; only `.deleted` files
    queued before are unlinked when due) and goes on with the other dirs; it tries the
    dir again every cycle, and `cleanerd clean` exits 1."""

    log_dir: str
    reason: str


@dataclass(frozen=True, slots=True)
class SkippedLog:
    """A partition (or log dir) the cycle left alone, and why."""

    log_dir: str
    tp: TopicPartition | None
    phase: str
    reason: str


@dataclass(frozen=True, slots=True)
class TailCut:
    """A torn tail cut from a partition's active segment (a crash in the middle of an
    append; `recovery.py`) by an owner's open, or by a step's write, which checks the
    tail first; its bytes first copied to the quarantine dir."""

    log_dir: str
    tp: TopicPartition
    tail: TruncatedTail

    def to_json(self) -> dict[str, Any]:
        return {**_where(self.log_dir, self.tp), **dataclasses.asdict(self.tail)}

    def text(self, *, foreseen: bool = False) -> str:
        """The line `clean` prints for the cut (`plan`, `foreseen`: for the cut to come)."""
        what = (
            f"a torn tail of {self.tail.bytes_cut} bytes at position {self.tail.position} "
            f"of {self.tail.path} ({self.tail.reason})"
        )
        if foreseen:
            kept = (
                ", copying it to the quarantine dir first" if self.tail.reason != ZERO_TAIL else ""
            )
            return f"{self.tp}: the open will cut {what}{kept}"
        kept = "" if self.tail.quarantined_to is None else f", copied to {self.tail.quarantined_to}"
        return f"{self.tp}: cut {what}{kept}"


@dataclass(frozen=True, slots=True)
class CycleReport:
    """What one cycle did."""

    now_ms: int
    """The instant rolls and retention were evaluated at."""
    finished_ms: int
    rolled: tuple[RolledSegment, ...]
    retention: tuple[RetentionOutcome, ...]
    """Partitions retention changed (deleted segments or rolled first)."""
    disk_usage: DiskUsageReport | None
    """None when KIP-61 is off or not due."""
    cleaned: tuple[CleanedLog, ...]
    failed: tuple[FailedLog, ...]
    skipped: tuple[SkippedLog, ...]
    unlinked: tuple[Path, ...]
    """`.deleted` files removed at the end of the cycle."""
    states: tuple[PartitionState, ...]
    """Each partition's snapshot and, when compacted, its candidate before cleaning (the
    metrics' input; uncleanable and observed partitions included)."""
    aborted: bool = False
    """The cycle was stopped during its cleaning phase."""
    observed: tuple[str, ...] = ()
    """Log dirs only observed (configured so, or held by another process: a broker);
    their partitions' states are in `states` too, nothing else concerns them."""
    errors: tuple[StepError, ...] = ()
    """Steps that failed (a failure for `cleanerd clean`; the daemon tries them again
    every cycle)."""
    next_due_ms: int | None = None
    """The first instant after `now_ms` at which a time rule may act on an owned
    partition (`steps.next_due_ms`) or a `.deleted` file falls due: the daemon's next
    time-rule deadline."""
    truncated: tuple[TailCut, ...] = ()
    """Torn tails the opens of this cycle cut."""
    unreadable: tuple[Unreadable, ...] = ()
    """Partitions this cycle could not open or read (owned or observed): they have no
    entry in `states`, so the metrics count them apart."""
    offline: tuple[OfflineLogDir, ...] = ()
    """Log dirs this cycle could not use at all (`OfflineLogDir`)."""
    dropped: tuple[DroppedRequest, ...] = ()
    """Requested passes (the `clean` command) this cycle dropped without running."""

    @property
    def idle(self) -> bool:
        """Nothing was rolled, deleted, unlinked, cleaned or found failing, unreadable or
        offline, and nothing was cut short: the cycle only looked (the daemon logs such
        cycles at debug). A dry run's would-be deletions delete nothing: they are said
        once, by `disk_usage.would_delete`, not by every cycle that finds them again."""
        disk_deleted = self.disk_usage is not None and bool(self.disk_usage.deleted)
        return not (
            self.rolled
            or any(o.deletions or o.roll is not None for o in self.retention)
            or disk_deleted
            or self.cleaned
            or self.failed
            or self.unlinked
            or self.errors
            or self.aborted
            or self.truncated
            or self.unreadable
            or self.offline
        )

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON-ready dict (`cleanerd clean --json`; see the module
        docstring for the fields it shares with `cleanerd plan --json`)."""
        disk = self.disk_usage
        return {
            "now_ms": self.now_ms,
            "finished_ms": self.finished_ms,
            "aborted": self.aborted,
            "rolled": [
                rolled_json(r.log_dir, r.tp, r.base_offset, r.reason, r.waited_ms)
                for r in self.rolled
            ],
            "deleted": [
                deleted_json(o.log_dir, TopicPartition(o.topic, o.partition), d)
                for o in self.retention
                for d in o.deletions
            ]
            + [disk_deleted_json(d) for d in (disk.deleted if disk else ())],
            "disk_usage": None
            if disk is None
            else {
                "dry_run": disk.dry_run,
                "devices": [
                    {
                        "device": device_name(b.device),
                        "used_bytes_before": b.used_bytes,
                        "used_bytes_after": a.used_bytes,
                        "total_bytes": b.total_bytes,
                        "threshold_percent": b.threshold_percent,
                    }
                    for b, a in zip(disk.before, disk.after, strict=True)
                ],
                "still_above": [device_name(d) for d in disk.still_above],
            },
            "cleaned": [
                {
                    **_where(c.log_dir, c.tp),
                    "reason": c.reason,
                    "deadline_ms": c.deadline_ms,
                    "overdue_ms": c.overdue_ms,
                    "first_dirty": c.first_dirty,
                    "end_offset": c.end_offset,
                    "started_ms": c.started_ms,
                    "finished_ms": c.finished_ms,
                    "stats": c.stats.fields(),
                }
                for c in self.cleaned
            ],
            "failed": [{**_where(f.log_dir, f.tp), "reason": f.reason} for f in self.failed],
            "errors": [
                {**_where(e.log_dir, e.tp), "phase": e.phase, "reason": e.reason}
                for e in self.errors
            ],
            "skipped": [skipped_json(s.log_dir, s.tp, s.phase, s.reason) for s in self.skipped],
            "unlinked": [str(p) for p in self.unlinked],
            "truncated": [t.to_json() for t in self.truncated],
            "unreadable": [u.to_json() for u in self.unreadable],
            "offline": [{"log_dir": o.log_dir, "reason": o.reason} for o in self.offline],
        }


@dataclass(frozen=True, slots=True)
class CycleNews:
    """What a cycle did since it last told: the rolls, deletions, passes, partitions
    found uncleanable and requested passes dropped, in the order they happened per kind
    (the daemon's events, sent as the cycle goes: `Maintenance`'s `on_news`)."""

    rolled: tuple[RolledSegment, ...] = ()
    retention: tuple[RetentionOutcome, ...] = ()
    disk_deleted: tuple[DiskDeletion, ...] = ()
    cleaned: tuple[CleanedLog, ...] = ()
    failed: tuple[FailedLog, ...] = ()
    dropped: tuple[DroppedRequest, ...] = ()
    later_states: tuple[PartitionState, ...] = ()
    """States taken after the report's `states` (which are from before the cleaning): a
    partition's after its pass, or after a roll or deletion beside the passes. The
    metrics follow them, as Kafka's cleaner gauges follow each of its rounds."""
    taken: CycleReport | None = None
    """The report so far, told once the cycle has taken every partition's state, before
    its passes: the metrics show those states from then on, not from the cycle's end
    (the first cycle of a big host may clean for minutes)."""

    def __bool__(self) -> bool:
        return bool(
            self.rolled
            or self.retention
            or self.disk_deleted
            or self.cleaned
            or self.failed
            or self.dropped
            or self.later_states
            or self.taken is not None
        )


@dataclass(frozen=True, slots=True)
class PartitionState:
    """The input for one partition: its snapshot and, when compacted, its LogToClean."""

    meta: PartitionMeta
    ltc: LogToClean | None = None
    """None for a topic without `compact` in its cleanup policy."""
    retention_due_ms: int | None = None
    """When data here first outlived `retention.ms` (`policy.retention_due_ms`)."""

    def aged(self, now_ms: int) -> PartitionState:
        """The state with its compaction delays at `now_ms` (`LogToClean.aged`)."""
        if self.ltc is None:
            return self
        ltc = self.ltc.aged(now_ms)
        return self if ltc is self.ltc else replace(self, ltc=ltc)

    def retention_overdue_ms(self, now_ms: int) -> int:
        """How long data older than `retention.ms` has been on disk at `now_ms`."""
        due = self.retention_due_ms
        return 0 if due is None else max(0, now_ms - due)


@dataclass(frozen=True, slots=True)
class Counters:
    """Monotonic counts since the process started, by reason."""

    segments_rolled: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    segments_deleted: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    bytes_deleted: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


class MaintenanceCounters:
    """The mutable counters the executors' outcomes are added to; `snapshot` freezes."""

    def __init__(self) -> None:
        self._rolled: dict[str, int] = {}
        self._deleted: dict[str, int] = {}
        self._bytes: dict[str, int] = {}

    def count_roll(self, decision: RollDecision) -> None:
        """One segment rolled, for the decision's reason."""
        self.count_rolled(decision.reason.value)

    def count_rolled(self, reason: str) -> None:
        """One segment rolled for `reason`: a roll rule, or the retention rule that took
        every segment (the active one rolled first)."""
        self._rolled[reason] = self._rolled.get(reason, 0) + 1

    def count_deletion(self, reason: str, size_bytes: int) -> None:
        """One segment deleted for `reason`, freeing `size_bytes` of `.log`."""
        self._deleted[reason] = self._deleted.get(reason, 0) + 1
        self._bytes[reason] = self._bytes.get(reason, 0) + size_bytes

    def count_retention(self, outcome: RetentionOutcome) -> None:
        """Every deletion of a retention check."""
        for d in outcome.deletions:
            self.count_deletion(d.reason.value, d.size_bytes)

    def count_disk_usage(self, report: DiskUsageReport) -> None:
        """Every deletion of a disk-usage enforcement (nothing for a dry run)."""
        if report.dry_run:
            return
        for d in report.deletions:
            self.count_deletion(d.reason.value, d.size_bytes)

    def snapshot(self) -> Counters:
        """The counts now, frozen."""
        return Counters(
            MappingProxyType(dict(self._rolled)),
            MappingProxyType(dict(self._deleted)),
            MappingProxyType(dict(self._bytes)),
        )


def made_progress(c: CleanedLog) -> bool:
    """Whether a pass moved the cleaner checkpoint or removed a record. A pass that did
    neither (say, one run for a delete horizon that it could not act on) is no reason to
    start the next cycle at once: the same candidate would be picked again."""
    return c.end_offset > c.first_dirty or c.stats.messages_written < c.stats.messages_read


# -- JSON, shared by `clean --json` and `plan --json` -------------------------------------


def _where(log_dir: str, tp: TopicPartition | None) -> dict[str, Any]:
    where: dict[str, Any] = {"log_dir": log_dir}
    if tp is not None:
        where |= {"topic": tp.topic, "partition": tp.partition}
    return where


def skipped_json(
    log_dir: str, tp: TopicPartition | None, phase: str, reason: str
) -> dict[str, Any]:
    """A step that passed a partition (or, without one, a whole log dir) by, and why."""
    return {**_where(log_dir, tp), "phase": phase, "reason": reason}


def rolled_json(
    log_dir: str, tp: TopicPartition, base_offset: int, reason: str, waited_ms: int | None
) -> dict[str, Any]:
    """A rolled segment."""
    return {
        **_where(log_dir, tp),
        "base_offset": base_offset,
        "reason": reason,
        "waited_ms": waited_ms,
    }


def deleted_json(log_dir: str, tp: TopicPartition, d: Deletion) -> dict[str, Any]:
    """A segment deleted by retention (`size_bytes`: its `.log`)."""
    return {
        **_where(log_dir, tp),
        "base_offset": d.base_offset,
        "size_bytes": d.size_bytes,
        "reason": d.reason.value,
    }


def disk_deleted_json(d: DiskDeletion) -> dict[str, Any]:
    """A segment deleted for disk usage: as `deleted_json`, with the device, the bytes
    given back to it (`.log` and indexes) and the partition's new log start offset."""
    return {
        **_where(d.log_dir, d.topic_partition),
        "base_offset": d.base_offset,
        "size_bytes": d.size_bytes,
        "reason": d.reason.value,
        "device": device_name(d.device),
        "freed_bytes": d.freed_bytes,
        "log_start_offset": d.log_start_offset,
    }
