"""The metrics model: one immutable snapshot of everything cleanerd reports, computed purely.

The daemon refreshes the snapshot on a timer (not only when a log is picked, as Kafka
does) from plain inputs: each partition's `PartitionMeta` and, for compacted topics, its
`LogToClean`; the last `CleanerStats` of every worker; the uncleanable registry; the
roll/deletion counters; the devices' usage. The exporter (the daemon's job) only reads
the snapshot, so the HTTP thread never sees a half-updated state.

Per partition and per log dir, and the maximum over all:

- compaction delay, the honest one:
  `max(0, now - earliest dirty timestamp - max.compaction.lag.ms)` where the earliest
  dirty timestamp counts the active segment's first batch too, over every compacted
  partition, uncleanable ones included (an operator must see those first). Its maxima
  feed `cleanerd_max_compaction_delay_seconds` and, deliberately, Kafka's
  `kafka_log_logcleaner_max_compaction_delay_secs` too (whole seconds, as Kafka's
  gauge; see the exporter). Kafka's own variant (dirty non-active segments only: it
  reads 0 while overdue data waits in an unrolled active segment) is `plan`'s "Kafka
  sees" (`LogToClean.kafka_compaction_delay_ms`);
- dirty ratio (Kafka's cleanableRatio); the max over non-empty, cleanable candidates is
  `max-dirty-percent`;
- uncleanable partitions and bytes per log dir (bytes: the partitions' current cleanable
  bytes, Kafka's definition);
- unreadable partitions per log dir: those the last cycle could not open or read, owned
  or observed. They have no numbers of their own, so the maxima above cannot see them;
  this count is what does (an observed partition the broker was changing as it was read
  counts for that one cycle). The log dir's partition count includes them.
- offline log dirs: 1 for a dir the last cycle could not use at all (it could not be
  opened, or its root checkpoint files could not be read); none of its partitions is
  counted anywhere, so this is what shows it.

From the workers' last rounds, as Kafka's LogCleaner gauges: max clean time, max buffer
(offset map) utilisation, recopy ratio `sum(bytes written) / max(sum(bytes read), 1)`,
dead workers; the time of the last selection attempt (exported as a timestamp, and as
Kafka's time-since-last-run). Counters: segments rolled by reason, segments and bytes
deleted by reason. Devices: used and total bytes, usage and threshold as ratios.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from cleanerd.compaction.manager import UncleanablePartitions
from cleanerd.compaction.stats import CleanerStats
from cleanerd.log.files import TopicPartition
from cleanerd.maintenance.report import Counters, PartitionState, StepError, Unreadable
from cleanerd.retention.disk_usage import DeviceUsage


@dataclass(frozen=True, slots=True)
class PartitionMetrics:
    """One partition's numbers."""

    log_dir: str
    topic: str
    partition: int
    size_bytes: int
    segments: int
    compacted: bool
    dirty_ratio: float
    cleanable_bytes: int
    compaction_delay_ms: int
    """cleanerd's delay (active segment counted)."""
    deadline_ms: int | None
    uncleanable: bool
    uncleanable_reason: str | None
    retention_overdue_ms: int = 0
    """How long data older than `retention.ms` has been on disk (0: none)."""
    retention_due_ms: int | None = None
    """When data here first outlived `retention.ms` (`PartitionState.retention_due_ms`)."""

    def aged(self, now_ms: int) -> PartitionMetrics:
        """The same numbers with the delays at `now_ms`, from the deadlines (which do
        not move with the clock)."""
        delay = _past(now_ms, self.deadline_ms)
        overdue = _past(now_ms, self.retention_due_ms)
        if (delay, overdue) == (self.compaction_delay_ms, self.retention_overdue_ms):
            return self
        return replace(self, compaction_delay_ms=delay, retention_overdue_ms=overdue)


def _past(now_ms: int, deadline_ms: int | None) -> int:
    return 0 if deadline_ms is None else max(0, now_ms - deadline_ms)


def _earliest(times: Iterable[int | None]) -> int | None:
    return min((t for t in times if t is not None), default=None)


@dataclass(frozen=True, slots=True)
class LogDirMetrics:
    """One log dir's numbers (the maxima and sums over its partitions)."""

    log_dir: str
    partitions: int
    size_bytes: int
    max_compaction_delay_ms: int
    max_dirty_ratio: float
    uncleanable_partitions: int
    uncleanable_bytes: int
    observed: bool = False
    """Only observed (nothing is written there)."""
    unreadable_partitions: int = 0
    """Listed, but could not be opened or read (counted in `partitions` too)."""
    offline: bool = False
    """The last cycle could not use the dir at all (`OfflineLogDir`): its numbers are
    those of no partition."""
    max_retention_overdue_ms: int = 0
    """The longest a partition's data older than `retention.ms` has been on disk."""
    failed_steps: int = 0
    """Steps of the last cycle that failed there (`StepError`: a roll, a retention, an
    open, a partition whose topic two globs match), each tried again every cycle."""
    earliest_deadline_ms: int | None = None
    """The earliest compaction deadline of its partitions: the maximal delay is
    `now - earliest` from then on."""
    earliest_retention_due_ms: int | None = None
    """The same for data outliving `retention.ms`."""

    def aged(self, now_ms: int) -> LogDirMetrics:
        """The same numbers with the maximal delays at `now_ms` (`PartitionMetrics.aged`
        of each partition, in O(1))."""
        delay = max(self.max_compaction_delay_ms, _past(now_ms, self.earliest_deadline_ms))
        overdue = max(self.max_retention_overdue_ms, _past(now_ms, self.earliest_retention_due_ms))
        if (delay, overdue) == (self.max_compaction_delay_ms, self.max_retention_overdue_ms):
            return self
        return replace(self, max_compaction_delay_ms=delay, max_retention_overdue_ms=overdue)


@dataclass(frozen=True, slots=True)
class DeviceMetrics:
    """One device's usage and threshold."""

    device: int
    log_dirs: tuple[str, ...]
    total_bytes: int
    used_bytes: int
    threshold_ratio: float
    """`log.retention.disk.usage.percent` / 100 (1.0: off)."""

    @property
    def usage_ratio(self) -> float:
        """used / total (0 for a device of no size)."""
        return self.used_bytes / self.total_bytes if self.total_bytes > 0 else 0.0


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """Everything the exporter publishes, at `now_ms`."""

    now_ms: int
    partitions: tuple[PartitionMetrics, ...]
    log_dirs: tuple[LogDirMetrics, ...]
    devices: tuple[DeviceMetrics, ...]
    max_compaction_delay_ms: int
    max_dirty_ratio: float
    last_run_ms: int | None
    max_clean_time_ms: int
    max_buffer_utilization: float
    recopy_ratio: float
    dead_workers: int
    counters: Counters

    @property
    def ageing_from_ms(self) -> int | None:
        """From when some delay grows with the clock (`aged` then changes something): the
        earliest compaction deadline or retention due time of any partition, observed
        dirs' and uncleanable partitions' included; None if never."""
        dirs = self.log_dirs
        return _earliest(
            [*(d.earliest_deadline_ms for d in dirs), *(d.earliest_retention_due_ms for d in dirs)]
        )

    def aged(self, now_ms: int, *, partitions: bool = True) -> MetricsSnapshot:
        """The snapshot at `now_ms`, its delays grown with the clock from the deadlines:
        what `build_snapshot` would give at `now_ms` from the same states, without
        building every partition's numbers anew. Without `partitions`, the partitions'
        own numbers are left as they were (for an exporter that does not publish them:
        a later ageing computes them from their deadlines, so nothing is lost)."""
        dirs = tuple(d.aged(now_ms) for d in self.log_dirs)
        return replace(
            self,
            now_ms=now_ms,
            partitions=(
                tuple(p.aged(now_ms) for p in self.partitions) if partitions else self.partitions
            ),
            log_dirs=dirs,
            max_compaction_delay_ms=max((d.max_compaction_delay_ms for d in dirs), default=0),
        )

    @property
    def uncleanable_partitions(self) -> int:
        """Over every log dir."""
        return sum(d.uncleanable_partitions for d in self.log_dirs)

    @property
    def uncleanable_bytes(self) -> int:
        """Over every log dir."""
        return sum(d.uncleanable_bytes for d in self.log_dirs)

    # Kafka's gauges, in Kafka's units and integer truncation.

    @property
    def kafka_max_dirty_percent(self) -> int:
        """`max-dirty-percent`."""
        return int(100 * self.max_dirty_ratio)

    @property
    def kafka_time_since_last_run_ms(self) -> int:
        """`time-since-last-run-ms` (0 before the first run)."""
        return 0 if self.last_run_ms is None else max(0, self.now_ms - self.last_run_ms)

    @property
    def kafka_max_clean_time_secs(self) -> int:
        """`max-clean-time-secs`."""
        return self.max_clean_time_ms // 1000

    @property
    def kafka_max_buffer_utilization_percent(self) -> int:
        """`max-buffer-utilization-percent`."""
        return int(100 * self.max_buffer_utilization)

    @property
    def kafka_cleaner_recopy_percent(self) -> int:
        """`cleaner-recopy-percent`."""
        return int(100 * self.recopy_ratio)


def partition_metrics(
    state: PartitionState, *, uncleanable_reason: str | None, now_ms: int
) -> PartitionMetrics:
    """One partition's numbers from its snapshot and LogToClean, at `now_ms`."""
    meta, ltc = state.meta, state.ltc
    return PartitionMetrics(
        log_dir=meta.log_dir,
        topic=meta.topic,
        partition=meta.partition,
        size_bytes=meta.size_bytes,
        segments=len(meta.segments),
        compacted=ltc is not None,
        dirty_ratio=0.0 if ltc is None else ltc.cleanable_ratio,
        cleanable_bytes=0 if ltc is None else ltc.cleanable_bytes,
        compaction_delay_ms=0 if ltc is None else ltc.compaction_delay_ms,
        deadline_ms=None if ltc is None else ltc.deadline_ms,
        uncleanable=uncleanable_reason is not None,
        uncleanable_reason=uncleanable_reason,
        retention_overdue_ms=state.retention_overdue_ms(now_ms),
        retention_due_ms=state.retention_due_ms,
    )


def _considered_by_kafka(p: PartitionMetrics) -> bool:
    return p.compacted and not p.uncleanable


def log_dir_metrics(log_dir: str, partitions: Sequence[PartitionMetrics]) -> LogDirMetrics:
    """One log dir's maxima and sums."""
    kafka = [p for p in partitions if _considered_by_kafka(p)]
    uncleanable = [p for p in partitions if p.uncleanable]
    return LogDirMetrics(
        log_dir=log_dir,
        partitions=len(partitions),
        size_bytes=sum(p.size_bytes for p in partitions),
        max_compaction_delay_ms=max((p.compaction_delay_ms for p in partitions), default=0),
        max_dirty_ratio=max((p.dirty_ratio for p in kafka if p.size_bytes > 0), default=0.0),
        uncleanable_partitions=len(uncleanable),
        uncleanable_bytes=sum(p.cleanable_bytes for p in uncleanable),
        max_retention_overdue_ms=max((p.retention_overdue_ms for p in partitions), default=0),
        earliest_deadline_ms=_earliest(p.deadline_ms for p in partitions),
        earliest_retention_due_ms=_earliest(p.retention_due_ms for p in partitions),
    )


def build_snapshot(
    *,
    now_ms: int,
    partitions: Iterable[PartitionState],
    log_dirs: Sequence[str] = (),
    uncleanable: UncleanablePartitions | None = None,
    last_runs: Sequence[CleanerStats] = (),
    last_run_ms: int | None = None,
    dead_workers: int = 0,
    devices: Sequence[DeviceUsage] = (),
    device_log_dirs: Mapping[int, Sequence[str]] | None = None,
    counters: Counters | None = None,
    observed_log_dirs: Iterable[str] = (),
    unreadable: Iterable[Unreadable] = (),
    offline_log_dirs: Iterable[str] = (),
    failed_steps: Iterable[StepError] = (),
) -> MetricsSnapshot:
    """The snapshot at `now_ms`. `log_dirs` lists dirs to report even when they hold no
    partition (so their series exist); `last_runs` holds each worker's last round;
    `unreadable`, the partitions the last cycle could not read; `offline_log_dirs`, the
    log dirs it could not use at all; `failed_steps`, its steps that failed."""
    states = list(partitions)
    observed = set(observed_log_dirs)
    offline = set(offline_log_dirs)
    unread: dict[str, set[TopicPartition]] = {}
    for u in unreadable:
        unread.setdefault(u.log_dir, set()).add(u.tp)
    failed = Counter(e.log_dir for e in failed_steps)
    dirs = list(
        dict.fromkeys([*log_dirs, *(s.meta.log_dir for s in states), *unread, *offline, *failed])
    )
    marks = {d: uncleanable.in_dir(d) for d in dirs} if uncleanable is not None else {}
    per_partition = []
    for s in states:
        mark = marks.get(s.meta.log_dir, {}).get(s.meta.topic_partition)
        per_partition.append(
            partition_metrics(
                s, uncleanable_reason=None if mark is None else mark.reason, now_ms=now_ms
            )
        )
    by_dir: dict[str, list[PartitionMetrics]] = {d: [] for d in dirs}
    for p in per_partition:
        by_dir[p.log_dir].append(p)
    dir_metrics = []
    for d in dirs:
        m = log_dir_metrics(d, by_dir[d])
        # A partition marked uncleanable but not snapshotted (it failed to open) still
        # counts, with no cleanable bytes known.
        seen = {TopicPartition(p.topic, p.partition) for p in by_dir[d]}
        unseen = set(marks.get(d, {})) - seen
        if unseen:
            m = replace(m, uncleanable_partitions=m.uncleanable_partitions + len(unseen))
        unread_here = unread.get(d, set()) - seen
        m = replace(
            m,
            partitions=m.partitions + len(unread_here),
            unreadable_partitions=len(unread_here),
            observed=d in observed,
            offline=d in offline,
            failed_steps=failed[d],
        )
        dir_metrics.append(m)
    read = sum(r.bytes_read for r in last_runs)
    written = sum(r.bytes_written for r in last_runs)
    where = device_log_dirs or {}
    return MetricsSnapshot(
        now_ms=now_ms,
        partitions=tuple(per_partition),
        log_dirs=tuple(dir_metrics),
        devices=tuple(
            DeviceMetrics(
                device=u.device,
                log_dirs=tuple(where.get(u.device, ())),
                total_bytes=u.total_bytes,
                used_bytes=u.used_bytes,
                threshold_ratio=min(u.threshold_percent, 100) / 100,
            )
            for u in devices
        ),
        max_compaction_delay_ms=max((d.max_compaction_delay_ms for d in dir_metrics), default=0),
        max_dirty_ratio=max((d.max_dirty_ratio for d in dir_metrics), default=0.0),
        last_run_ms=last_run_ms,
        max_clean_time_ms=max((r.end_ms - r.start_ms for r in last_runs), default=0),
        max_buffer_utilization=max((r.buffer_utilization for r in last_runs), default=0.0),
        recopy_ratio=written / max(read, 1),
        dead_workers=dead_workers,
        counters=Counters() if counters is None else counters,
    )
