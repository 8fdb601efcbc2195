"""What the daemon tells the world about its cycles: events, log lines, metrics.

While a cycle runs, `Reporter.happened` turns what it did so far (`CycleNews`, told
after each step and as passes finish) into MQTT events (a roll, a deletion with its
reason, a pass with its statistics, a partition found uncleanable, a requested pass
dropped without running), `log.cleaned` lines (rolls and deletions are logged by the log
layer as they happen) and the pass counters of the exporter: a cycle whose passes run
for hours does not hold back the news of the passes that ended and of the deletions made
beside them. `Reporter.snapshot` builds the metrics model from the partitions' latest
states (`Reporter.states`: those the last cycle took before its passes, told then, each
replaced by a later one told since) aged to the present (`PartitionState.aged`: delays
grow with the clock without reading a file), the maintenance status, the devices' usage
and the statistics of the last passes, one per worker (Kafka's cleaner gauges are maxima
over each worker's last round). Events are queued, never awaited: a slow or absent
broker never slows a cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import structlog
from pydantic import JsonValue

from cleanerd.compaction.stats import CleanerStats
from cleanerd.daemon.events import Event, EventKind, EventPublisher
from cleanerd.daemon.metrics.exporter import MetricsExporter, PassResult
from cleanerd.daemon.metrics.model import MetricsSnapshot, build_snapshot
from cleanerd.log.files import TopicPartition
from cleanerd.log_setup import partition_context
from cleanerd.maintenance.cycle import MaintenanceStatus
from cleanerd.maintenance.report import CycleNews, CycleReport, PartitionState
from cleanerd.retention.disk_usage import DeviceUsage, device_name

log = structlog.get_logger("cleanerd.service")


class Reporter:
    """Events and metrics of the daemon's cycles (see the module docstring).

    Args:
        exporter: the Prometheus exporter (pass counters).
        publisher: the current event publisher (it is replaced on an MQTT reload).
        clock_ms: wall-clock milliseconds, the time of each event.
    """

    def __init__(
        self,
        exporter: MetricsExporter,
        publisher: Callable[[], EventPublisher],
        clock_ms: Callable[[], int],
    ) -> None:
        self.exporter = exporter
        self.publisher = publisher
        self.clock_ms = clock_ms
        self.last_stats: tuple[CleanerStats, ...] = ()
        """The statistics of the last pass of each worker."""
        self._later: dict[tuple[str, TopicPartition], PartitionState] = {}
        """`CycleNews.later_states` told since the last cycle took its states."""
        self.later_count = 0
        """How many later states were told: a new one changes the metrics."""

    def emit(
        self,
        kind: EventKind,
        data: dict[str, JsonValue],
        *,
        tp: TopicPartition | None = None,
        log_dir: str | None = None,
    ) -> None:
        """Queue an event (never blocks; dropped and counted when the queue is full)."""
        self.publisher().publish(
            Event(
                kind=kind,
                time_ms=self.clock_ms(),
                topic=None if tp is None else tp.topic,
                partition=None if tp is None else tp.partition,
                log_dir=log_dir,
                data=data,
            )
        )

    def disk_pressure(self, u: DeviceUsage) -> None:
        """A device went above `log.retention.disk.usage.percent`."""
        data: dict[str, JsonValue] = {
            "device": device_name(u.device),
            "used_bytes": u.used_bytes,
            "total_bytes": u.total_bytes,
            "threshold_percent": u.threshold_percent,
        }
        log.warning("disk.pressure_detected", **data)
        self.emit("disk.pressure", data)

    def happened(self, news: CycleNews, *, workers: int) -> None:
        """Events, log lines, pass counters and states for what a cycle did since it last
        told; the statistics of the last `workers` passes are kept (Kafka's cleaner
        gauges are over each worker's last round, whichever cycle it was in)."""
        for r in news.rolled:
            self.emit(
                "segment.rolled",
                {"base_offset": r.base_offset, "reason": r.reason, "waited_ms": r.waited_ms},
                tp=r.tp,
                log_dir=r.log_dir,
            )
        for o in news.retention:
            tp = TopicPartition(o.topic, o.partition)
            for d in o.deletions:
                data: dict[str, JsonValue] = {
                    "reason": d.reason.value,
                    "base_offset": d.base_offset,
                    "size_bytes": d.size_bytes,
                }
                self.emit("segment.deleted", data, tp=tp, log_dir=o.log_dir)
        for dd in news.disk_deleted:
            data = {
                "reason": dd.reason.value,
                "base_offset": dd.base_offset,
                "size_bytes": dd.size_bytes,
                "freed_bytes": dd.freed_bytes,
                "device": device_name(dd.device),
            }
            self.emit("segment.deleted", data, tp=dd.topic_partition, log_dir=dd.log_dir)
        for c in news.cleaned:
            stats: dict[str, JsonValue] = dict(c.stats.fields())
            with partition_context(c.tp.topic, c.tp.partition, c.log_dir):
                log.info(
                    "log.cleaned",
                    reason=c.reason,
                    overdue_ms=c.overdue_ms,
                    first_dirty=c.first_dirty,
                    end_offset=c.end_offset,
                    **stats,
                )
            self.exporter.record_pass(PassResult.SUCCESS, c.stats)
            data = {
                "reason": c.reason,
                "overdue_ms": c.overdue_ms,
                "first_dirty": c.first_dirty,
                "end_offset": c.end_offset,
                "stats": stats,
            }
            self.emit("log.cleaned", data, tp=c.tp, log_dir=c.log_dir)
        for f in news.failed:
            if f.during_pass:  # damage found before any pass is no failed pass
                self.exporter.record_pass(PassResult.ERROR)
            self.emit("partition.uncleanable", {"reason": f.reason}, tp=f.tp, log_dir=f.log_dir)
        for dropped in news.dropped:
            ids: list[JsonValue] = list(dropped.request_ids)
            data = {"reason": dropped.reason, "ids": ids}
            self.emit("clean.request_dropped", data, tp=dropped.tp, log_dir=dropped.log_dir)
        if news.cleaned:
            self.last_stats = (self.last_stats + tuple(c.stats for c in news.cleaned))[-workers:]
        if news.taken is not None:  # newer than any later state told before
            self._later = {}
        for state in news.later_states:
            self._later[_key(state)] = state
        self.later_count += len(news.later_states)

    def states(self, report: CycleReport) -> tuple[PartitionState, ...]:
        """The partitions' latest states: those of `report` (the last cycle's, from when it
        took them), each replaced by a later one told since, if any (after a pass, or a
        roll or deletion beside the passes)."""
        latest = {_key(s): s for s in report.states}
        for key, state in self._later.items():
            if key in latest:
                latest[key] = state
        return tuple(latest.values())

    def snapshot(
        self,
        report: CycleReport,
        states: Sequence[PartitionState],
        status: MaintenanceStatus,
        *,
        now_ms: int,
        log_dirs: Sequence[str],
        usage: Sequence[DeviceUsage],
        device_dirs: Mapping[int, Sequence[str]],
    ) -> MetricsSnapshot:
        """The metrics model at `now_ms` from the last cycle and the partitions' latest
        `states` (see the module docstring)."""
        return build_snapshot(
            now_ms=now_ms,
            partitions=[s.aged(now_ms) for s in states],
            log_dirs=log_dirs,
            uncleanable=status.uncleanable,
            last_runs=self.last_stats,
            last_run_ms=status.last_run_ms,
            dead_workers=status.dead_workers,
            devices=usage,
            device_log_dirs=device_dirs,
            counters=status.counters,
            observed_log_dirs=report.observed,
            unreadable=report.unreadable,
            offline_log_dirs=[o.log_dir for o in report.offline],
            failed_steps=report.errors,
        )


def _key(state: PartitionState) -> tuple[str, TopicPartition]:
    return state.meta.log_dir, state.meta.topic_partition
