"""The Prometheus exporter: the metrics model and the service's own counts over HTTP.

Exposition (Prometheus text format 0.0.4, `GET /metrics` on `metrics.listen`, loopback
by default). Native names are `cleanerd_*` in base units (`_seconds`, `_bytes`, `_ratio`,
`_total` on counters, timestamps rather than time-since). With `metrics.kafka_names`
(on by default) Kafka's LogCleaner and LogCleanerManager gauges are exported too, under
the names Prometheus' JMX exporter gives them (`kafka.log:type=LogCleaner,
name=max-compaction-delay-secs` -> `kafka_log_logcleaner_max_compaction_delay_secs`,
label `logDirectory`), in Kafka's units and integer truncation, so dashboards and alerts
written for a broker work unchanged. One deliberate difference: the compaction delay,
native and Kafka-named alike, counts the active segment and is recomputed on the
daemon's timer, not only when a log is picked (Kafka's reads 0 while overdue data waits
in an unrolled active segment). Per-partition series are opt-in
(`metrics.per_partition`): topic x partition can reach thousands of series per host.

Threads. `collect()` runs on the HTTP server's thread; everything else runs on the
event loop. The loop never mutates what a scrape may be reading: it builds a new frozen
`MetricsSnapshot` (the model) or `ServiceMetrics` (the service's counts) and replaces
the exporter's reference in one attribute store, which is atomic in CPython. A scrape
reads each reference once, so it sees one whole snapshot, never a half-updated one, and
no lock is needed. The record_* methods replace state read-modify-write, so they are
called from one thread only (the loop).
"""

from __future__ import annotations

import bisect
import enum
import platform
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Final
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from cleanerd import __version__
from cleanerd.compaction.stats import CleanerStats
from cleanerd.config import MetricsConfig
from cleanerd.daemon.metrics.model import LogDirMetrics, MetricsSnapshot, build_snapshot
from cleanerd.log.roll import RollReason
from cleanerd.retention.disk_usage import device_name
from cleanerd.retention.policy import ROLLING_REASONS, DeletionReason

# Pass durations range from milliseconds (a small partition) to an hour (a large one
# under an I/O throttle).
CLEAN_DURATION_BUCKETS_S: Final = (0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0)


class PassResult(enum.StrEnum):
    """How a cleaning pass ended (the `result` label of `cleanerd_cleaner_passes_total`)."""

    SUCCESS = "success"
    ABORTED = "aborted"
    """Stopped safely (shutdown, partition deleted): `.cleaned` output removed."""
    ERROR = "error"
    """Failed; the partition is marked uncleanable."""


@dataclass(frozen=True, slots=True)
class DurationHistogram:
    """Counts of observed durations per bucket (the last bucket is +Inf) and their sum."""

    bounds: tuple[float, ...] = CLEAN_DURATION_BUCKETS_S
    counts: tuple[int, ...] = (0,) * (len(CLEAN_DURATION_BUCKETS_S) + 1)
    sum_s: float = 0.0

    def observe(self, seconds: float) -> DurationHistogram:
        """This histogram with one more observation."""
        i = bisect.bisect_left(self.bounds, seconds)  # a value equal to a bound is `le` it
        counts = list(self.counts)
        counts[i] += 1
        return replace(self, counts=tuple(counts), sum_s=self.sum_s + seconds)

    def cumulative(self) -> list[tuple[str, float]]:
        """Prometheus' buckets: (le, observations <= le), +Inf last."""
        out, total = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += count
            out.append((_le(bound), float(total)))
        return out


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


def _zeros(keys: Iterable[str]) -> Mapping[str, int]:
    return MappingProxyType(dict.fromkeys(keys, 0))


@dataclass(frozen=True, slots=True)
class ServiceMetrics:
    """What the service counts itself, beyond the metrics model. Immutable: each change
    gives a new value, so a scrape never sees a torn update."""

    last_reload_successful: bool
    last_reload_success_s: float
    """Wall-clock time of the last successful load (the start-up load counts)."""
    passes: Mapping[str, int] = field(default_factory=lambda: _zeros(PassResult))
    bytes_read: int = 0
    bytes_written: int = 0
    clean_duration: DurationHistogram = DurationHistogram()
    events_published: int = 0
    events_dropped: int = 0
    mqtt_connected: bool | None = None
    """None while MQTT is off: no `cleanerd_mqtt_connected` series, so no alert."""
    cycles_done: int = 0
    cycles_failed: int = 0
    cycle_failures_in_a_row: int = 0
    """Cycles that failed whole (an exception out of the cycle) since the last one done."""
    paused: bool = False
    """Cleaning paused by the `pause` command: no new pass until `resume`."""

    def with_pass(self, result: PassResult, stats: CleanerStats | None) -> ServiceMetrics:
        """One more pass; its bytes and duration count when its statistics are known."""
        passes = dict(self.passes)
        passes[result] = passes.get(result, 0) + 1
        if stats is None:
            return replace(self, passes=MappingProxyType(passes))
        return replace(
            self,
            passes=MappingProxyType(passes),
            bytes_read=self.bytes_read + stats.bytes_read,
            bytes_written=self.bytes_written + stats.bytes_written,
            clean_duration=self.clean_duration.observe(stats.elapsed_secs),
        )

    def with_reload(self, successful: bool, now_s: float) -> ServiceMetrics:
        """The outcome of a reload at `now_s` (the success time moves only on success)."""
        return replace(
            self,
            last_reload_successful=successful,
            last_reload_success_s=now_s if successful else self.last_reload_success_s,
        )

    def with_cycle(self, done: bool) -> ServiceMetrics:
        """One more cycle, done or failed whole."""
        if done:
            return replace(self, cycles_done=self.cycles_done + 1, cycle_failures_in_a_row=0)
        return replace(
            self,
            cycles_failed=self.cycles_failed + 1,
            cycle_failures_in_a_row=self.cycle_failures_in_a_row + 1,
        )

    def with_events(self, published: int, dropped: int, connected: bool | None) -> ServiceMetrics:
        """The event publisher's counters and connection state now."""
        return replace(
            self, events_published=published, events_dropped=dropped, mqtt_connected=connected
        )


# ---------------------------------------------------------------------------
# Metric families: pure functions of the state, one call per scrape


def _gauge(name: str, doc: str, value: float, labels: Mapping[str, str] | None = None) -> Metric:
    family = GaugeMetricFamily(name, doc, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), value)
    return family


def _by_reason(name: str, doc: str, counts: Mapping[str, int], reasons: Iterable[str]) -> Metric:
    # Every known reason is exported from the start (at 0), so rate() sees the first one.
    family = CounterMetricFamily(name, doc, labels=["reason"])
    for reason in sorted({*reasons, *counts}):
        family.add_metric([reason], counts.get(reason, 0))
    return family


def service_families(service: ServiceMetrics, *, version: str) -> Iterator[Metric]:
    """Build info, config reloads, cycles, passes, cleaner bytes, pass durations, events,
    MQTT."""
    yield _gauge(
        "cleanerd_build_info",
        "cleanerd's version and Python's, as labels; the value is always 1.",
        1,
        {"version": version, "python": platform.python_version()},
    )
    yield _gauge(
        "cleanerd_config_last_reload_successful",
        "Whether the last config load (start-up or SIGHUP) succeeded (1) or was refused (0).",
        int(service.last_reload_successful),
    )
    yield _gauge(
        "cleanerd_config_last_reload_success_timestamp_seconds",
        "When the config was last loaded successfully (Unix time).",
        service.last_reload_success_s,
    )
    cycles = CounterMetricFamily(
        "cleanerd_cycles",
        "Maintenance cycles by how they ended: done, or failed whole (an error no step "
        "could keep to one partition, such as an unreadable root checkpoint file).",
        labels=["result"],
    )
    cycles.add_metric(["done"], service.cycles_done)
    cycles.add_metric(["failed"], service.cycles_failed)
    yield cycles
    yield _gauge(
        "cleanerd_cycle_failures_in_a_row",
        "Cycles failed whole since the last one done (0: the last cycle was done); while it "
        "is above 0 the metrics still show the last done cycle's state.",
        service.cycle_failures_in_a_row,
    )
    passes = CounterMetricFamily(
        "cleanerd_cleaner_passes", "Cleaning passes by how they ended.", labels=["result"]
    )
    for result in PassResult:
        passes.add_metric([result.value], service.passes.get(result, 0))
    yield passes
    yield CounterMetricFamily(
        "cleanerd_cleaner_bytes_read",
        "Bytes the cleaner read in its copy phases (Kafka's bytesRead, summed over passes).",
        value=service.bytes_read,
    )
    yield CounterMetricFamily(
        "cleanerd_cleaner_bytes_written",
        "Bytes the cleaner wrote to cleaned segments (Kafka's bytesWritten, summed).",
        value=service.bytes_written,
    )
    yield HistogramMetricFamily(
        "cleanerd_clean_duration_seconds",
        "Duration of the cleaning passes that report statistics.",
        buckets=service.clean_duration.cumulative(),
        sum_value=service.clean_duration.sum_s,
    )
    yield CounterMetricFamily(
        "cleanerd_events_published",
        "Events the MQTT broker acknowledged.",
        value=service.events_published,
    )
    yield CounterMetricFamily(
        "cleanerd_events_dropped",
        "Events dropped because the queue to the MQTT broker was full.",
        value=service.events_dropped,
    )
    yield _gauge(
        "cleanerd_cleaning_paused",
        "1 while cleaning is paused (the MQTT `pause` command): no new pass until `resume`.",
        int(service.paused),
    )
    if service.mqtt_connected is not None:
        yield _gauge(
            "cleanerd_mqtt_connected",
            "Whether the MQTT broker connection is up (exported only while MQTT is enabled).",
            int(service.mqtt_connected),
        )


_LOG_DIR_GAUGES: Final[tuple[tuple[str, str, Callable[[LogDirMetrics], float]], ...]] = (
    (
        "cleanerd_max_compaction_delay_seconds",
        "How far the most overdue compacted partition in the log dir is past its "
        "max.compaction.lag.ms deadline (active segment counted; 0: none overdue).",
        lambda d: d.max_compaction_delay_ms / 1000,
    ),
    (
        "cleanerd_max_retention_overdue_seconds",
        "How long data older than retention.ms has been on disk in the log dir, in its "
        "oldest such partition (0: none): whatever keeps it (a retention check not yet run, "
        "a future timestamp, damage, a pause, a dir only observed; an offline dir reads 0).",
        lambda d: d.max_retention_overdue_ms / 1000,
    ),
    (
        "cleanerd_max_dirty_ratio",
        "Highest dirty ratio (cleanable bytes / total bytes) of a cleanable partition.",
        lambda d: d.max_dirty_ratio,
    ),
    (
        "cleanerd_uncleanable_partitions",
        "Partitions whose cleaning failed and that are skipped for now.",
        lambda d: d.uncleanable_partitions,
    ),
    (
        "cleanerd_uncleanable_bytes",
        "Cleanable bytes of the uncleanable partitions (Kafka's uncleanable-bytes).",
        lambda d: d.uncleanable_bytes,
    ),
    (
        "cleanerd_unreadable_partitions",
        "Partitions the last cycle could not open or read (damage, permissions, files "
        "changing under an observed broker): no other gauge has numbers for them.",
        lambda d: d.unreadable_partitions,
    ),
    (
        "cleanerd_failed_steps",
        "Steps of the last cycle that failed in the log dir (a roll, a retention, an open "
        "or reopen, a pass its engine failed, a partition whose topic two topics: globs "
        "match), each logged as <step>.failed and tried again every cycle.",
        lambda d: d.failed_steps,
    ),
    ("cleanerd_log_dir_size_bytes", "Bytes of segments in the log dir.", lambda d: d.size_bytes),
    (
        "cleanerd_log_dir_partitions",
        "Partitions in the log dir (unreadable ones included; the KRaft metadata log, "
        "which cleanerd never touches, left out).",
        lambda d: d.partitions,
    ),
    (
        "cleanerd_log_dir_observed",
        "1 when the log dir is only observed (mode: observe, or its .lock is held by "
        "another process: a running broker); nothing is written there.",
        lambda d: float(d.observed),
    ),
    (
        "cleanerd_log_dir_offline",
        "1 when the last cycle could not use the log dir at all: it could not be opened, "
        "or its root checkpoint files could not be read (Kafka takes such a dir offline). "
        "Nothing in it is maintained or counted until it is back.",
        lambda d: float(d.offline),
    ),
)


def _log_dir_families(snap: MetricsSnapshot) -> Iterator[Metric]:
    for name, doc, value in _LOG_DIR_GAUGES:
        family = GaugeMetricFamily(name, doc, labels=["log_dir"])
        for d in snap.log_dirs:
            family.add_metric([d.log_dir], value(d))
        yield family
    info = GaugeMetricFamily(
        "cleanerd_log_dir_device_info",
        "The device (MAJOR:MINOR) each log dir lives on; the value is always 1.",
        labels=["log_dir", "device"],
    )
    for dev in snap.devices:
        for log_dir in dev.log_dirs:
            info.add_metric([log_dir, device_name(dev.device)], 1)
    yield info


def _device_families(snap: MetricsSnapshot) -> Iterator[Metric]:
    usage = GaugeMetricFamily(
        "cleanerd_disk_usage_ratio",
        "Used share of the device holding log dirs (used / (used + free), as df shows it).",
        labels=["device"],
    )
    threshold = GaugeMetricFamily(
        "cleanerd_disk_usage_threshold_ratio",
        "log.retention.disk.usage.percent / 100 for the device (1: disk-usage retention off).",
        labels=["device"],
    )
    for dev in snap.devices:
        usage.add_metric([device_name(dev.device)], dev.usage_ratio)
        threshold.add_metric([device_name(dev.device)], dev.threshold_ratio)
    yield usage
    yield threshold


def model_families(snap: MetricsSnapshot) -> Iterator[Metric]:
    """The native metrics of the model: per log dir, per device, workers, counters."""
    yield from _log_dir_families(snap)
    yield from _device_families(snap)
    yield _gauge(
        "cleanerd_dead_workers",
        "Cleaning workers that died with an unexpected error.",
        snap.dead_workers,
    )
    yield _gauge(
        "cleanerd_max_offset_map_utilization_ratio",
        "Highest offset-map fill ratio over the workers' last passes.",
        snap.max_buffer_utilization,
    )
    yield _gauge(
        "cleanerd_last_clean_timestamp_seconds",
        "When a worker last looked for a log to clean (Unix time; 0: not yet).",
        0 if snap.last_run_ms is None else snap.last_run_ms / 1000,
    )
    counters = snap.counters
    yield _by_reason(
        "cleanerd_segments_rolled",
        "Active segments rolled, by the setting that forced the roll (a retention rule "
        "that took every segment rolls the active one first).",
        counters.segments_rolled,
        [*RollReason, *ROLLING_REASONS],
    )
    yield _by_reason(
        "cleanerd_segments_deleted",
        "Segments deleted by retention, by reason.",
        counters.segments_deleted,
        DeletionReason,
    )
    yield _by_reason(
        "cleanerd_segments_deleted_bytes",
        "Bytes of segment .log files deleted by retention, by reason.",
        counters.bytes_deleted,
        DeletionReason,
    )


def partition_families(snap: MetricsSnapshot) -> Iterator[Metric]:
    """The opt-in per-partition series (compaction ones for compacted topics only)."""
    labels = ["topic", "partition", "log_dir"]
    delay = GaugeMetricFamily(
        "cleanerd_partition_compaction_delay_seconds",
        "How far the partition is past its max.compaction.lag.ms deadline (active segment "
        "counted; 0: not overdue).",
        labels=labels,
    )
    dirty = GaugeMetricFamily(
        "cleanerd_partition_dirty_ratio",
        "The partition's dirty ratio (cleanable bytes / total bytes).",
        labels=labels,
    )
    size = GaugeMetricFamily(
        "cleanerd_partition_size_bytes", "Bytes of the partition's segments.", labels=labels
    )
    segments = GaugeMetricFamily(
        "cleanerd_partition_segments", "Segments in the partition.", labels=labels
    )
    overdue = GaugeMetricFamily(
        "cleanerd_partition_retention_overdue_seconds",
        "How long data older than retention.ms has been on disk in the partition (0: none).",
        labels=labels,
    )
    for p in snap.partitions:
        key = [p.topic, str(p.partition), p.log_dir]
        size.add_metric(key, p.size_bytes)
        segments.add_metric(key, p.segments)
        overdue.add_metric(key, p.retention_overdue_ms / 1000)
        if p.compacted:
            delay.add_metric(key, p.compaction_delay_ms / 1000)
            dirty.add_metric(key, p.dirty_ratio)
    yield from (delay, dirty, size, segments, overdue)


def jmx_exporter_name(mbean_type: str, name: str) -> str:
    """The Prometheus name the JMX exporter's Kafka rules give `kafka.log:type=T,name=N`
    (`kafka_$1_$2_$3` with lowercaseOutputName; it turns hyphens into underscores)."""
    return f"kafka_log_{mbean_type}_{name}".lower().replace("-", "_")


def _jmx_help(mbean_type: str, name: str, note: str = "") -> str:
    return f"Kafka's kafka.log:type={mbean_type},name={name}{note}, under the JMX exporter's name."


def kafka_families(snap: MetricsSnapshot, now_ms: int) -> Iterator[Metric]:
    """Kafka's cleaner gauges in Kafka's units and int semantics; `now_ms` is the scrape
    time, which `time-since-last-run-ms` is measured against, as Kafka reads it."""
    since_last_run = 0 if snap.last_run_ms is None else max(0, now_ms - snap.last_run_ms)
    gauges: tuple[tuple[str, str, int, str], ...] = (
        (
            "LogCleaner",
            "max-compaction-delay-secs",
            snap.max_compaction_delay_ms // 1000,
            " (unlike a broker's, counting the active segment)",
        ),
        ("LogCleaner", "max-clean-time-secs", snap.kafka_max_clean_time_secs, ""),
        (
            "LogCleaner",
            "max-buffer-utilization-percent",
            snap.kafka_max_buffer_utilization_percent,
            "",
        ),
        ("LogCleaner", "cleaner-recopy-percent", snap.kafka_cleaner_recopy_percent, ""),
        ("LogCleaner", "DeadThreadCount", snap.dead_workers, ""),
        ("LogCleanerManager", "max-dirty-percent", snap.kafka_max_dirty_percent, ""),
        ("LogCleanerManager", "time-since-last-run-ms", since_last_run, ""),
    )
    for mbean_type, name, value, note in gauges:
        yield _gauge(jmx_exporter_name(mbean_type, name), _jmx_help(mbean_type, name, note), value)
    per_dir: tuple[tuple[str, Callable[[LogDirMetrics], int]], ...] = (
        ("uncleanable-partitions-count", lambda d: d.uncleanable_partitions),
        ("uncleanable-bytes", lambda d: d.uncleanable_bytes),
    )
    for name, of_dir in per_dir:
        family = GaugeMetricFamily(
            jmx_exporter_name("LogCleanerManager", name),
            _jmx_help("LogCleanerManager", name + ",logDirectory=<dir>"),
            labels=["logDirectory"],
        )
        for d in snap.log_dirs:
            family.add_metric([d.log_dir], of_dir(d))
        yield family


# ---------------------------------------------------------------------------
# The collector and the exporter


class SnapshotCollector:
    """A prometheus_client collector over the exporter's current state."""

    def __init__(self, exporter: MetricsExporter) -> None:
        self._exporter = exporter

    def describe(self) -> Iterator[Metric]:
        """Every family `collect` may yield, whatever the settings say now (a reload may
        turn the opt-ins on): the registry learns the names it answers a scrape for
        named families with (`/metrics?name[]=...`) from these. It took them from a
        `collect` at registration, before the first snapshot: only the service's."""
        ex = self._exporter
        empty = build_snapshot(now_ms=0, partitions=())
        yield from service_families(replace(ex.service, mqtt_connected=False), version=ex.version)
        yield from model_families(empty)
        yield from partition_families(empty)
        yield from kafka_families(empty, 0)

    def collect(self) -> Iterator[Metric]:
        """Every family, from one read of each state reference."""
        ex = self._exporter
        settings, snap, service = ex.settings, ex.snapshot, ex.service
        yield from service_families(service, version=ex.version)
        if snap is None:  # before the daemon's first refresh
            return
        yield from model_families(snap)
        if settings.per_partition:
            yield from partition_families(snap)
        if settings.kafka_names:
            yield from kafka_families(snap, round(ex.clock() * 1000))


class MetricsExporter:
    """Per-instance registry, collector and HTTP endpoint; see the module docstring.

    The daemon's use: create it with `cfg.metrics` and `start()` it during start-up;
    every `metrics.refresh_interval_s` `update()` a fresh model snapshot and
    `record_events()` from the publisher; `record_pass()` after each pass,
    `record_cycle()` after each cycle, `record_reload()` after each SIGHUP,
    `configure()` with the reloaded section;
    `stop()` during shutdown. The start-up config load counts as a successful reload.

    Args:
        settings: the `metrics` config section (listen address, opt-ins).
        clock: wall-clock seconds (`time.time`); injected for tests.
        version: reported by `cleanerd_build_info`.
    """

    def __init__(
        self,
        settings: MetricsConfig,
        *,
        clock: Callable[[], float] = time.time,
        version: str = __version__,
    ) -> None:
        # Process-wide: no `_created` series beside counters (the library is untyped here).
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.settings = settings
        self.clock = clock
        self.version = version
        self.snapshot: MetricsSnapshot | None = None
        self.service = ServiceMetrics(last_reload_successful=True, last_reload_success_s=clock())
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.registry.register(SnapshotCollector(self))
        self._server: tuple[WSGIServer, threading.Thread] | None = None

    # --- state, from the event loop -------------------------------------------------

    def update(self, snapshot: MetricsSnapshot) -> None:
        """Publish a fresh model snapshot (an atomic reference swap)."""
        self.snapshot = snapshot

    def record_pass(self, result: PassResult, stats: CleanerStats | None = None) -> None:
        """Count a finished pass (with its statistics when it has them)."""
        self.service = self.service.with_pass(result, stats)

    def record_reload(self, successful: bool) -> None:
        """Report a config reload's outcome, timed by the exporter's clock."""
        self.service = self.service.with_reload(successful, self.clock())

    def record_cycle(self, done: bool) -> None:
        """Count a cycle, done or failed whole."""
        self.service = self.service.with_cycle(done)

    def record_paused(self, paused: bool) -> None:
        """Whether cleaning is paused now."""
        self.service = replace(self.service, paused=paused)

    def record_events(self, published: int, dropped: int, connected: bool | None) -> None:
        """Copy the event publisher's counters (`connected` None: MQTT is off)."""
        self.service = self.service.with_events(published, dropped, connected)

    def exposition(self) -> bytes:
        """What a scrape returns now (text format)."""
        return generate_latest(self.registry)

    # --- HTTP endpoint -----------------------------------------------------------

    @property
    def address(self) -> tuple[str, int] | None:
        """(host, port) the endpoint is bound to, or None when stopped."""
        if self._server is None:
            return None
        host, port = self._server[0].server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        """Bind `settings.listen` and serve in a daemon thread (OSError if the bind fails)."""
        if self._server is None:
            self._server = self._bind(self.settings)

    def stop(self) -> None:
        """Stop serving and release the port (no-op when stopped)."""
        server, self._server = self._server, None
        if server is not None:
            _shutdown(server)

    def configure(self, settings: MetricsConfig) -> None:
        """Apply reloaded settings. The opt-ins apply at the next scrape; a new listen
        address is bound before the old one is released (or, when they share a port and
        so may conflict, right after it); if the new one cannot be bound the old endpoint
        stays (at its address, bound again when it was released for the attempt) and
        OSError is raised with the settings unchanged."""
        if self._server is not None and settings.listen != self.settings.listen:
            old = self._server
            try:
                self._server = self._bind(settings)
            except OSError:
                port = int(old[0].server_address[1])
                if settings.port != port:
                    raise  # not the old endpoint in the way: it stays, where it is
                _shutdown(old)
                self._server = None
                try:
                    self._server = self._bind(settings)
                except OSError:
                    # Back where it was, the port it had (not a new one for port 0); if
                    # that is taken in the gap too, this raises and nothing is served.
                    host = self.settings.listen.rsplit(":", 1)[0]
                    where = self.settings.model_copy(update={"listen": f"{host}:{port}"})
                    self._server = self._bind(where)
                    raise
            else:
                _shutdown(old)
        self.settings = settings

    def _bind(self, settings: MetricsConfig) -> tuple[WSGIServer, threading.Thread]:
        try:
            return start_http_server(settings.port, addr=settings.host, registry=self.registry)
        except OSError as e:
            raise ListenError(e.errno, e.strerror, settings.listen) from e


class ListenError(OSError):
    """`metrics.listen` could not be bound; the message names the key and the address
    (the bare `[Errno 98] Address already in use` names neither)."""

    def __str__(self) -> str:
        return f"metrics.listen {self.filename}: cannot bind: {self.strerror}"


def _shutdown(server: tuple[WSGIServer, threading.Thread]) -> None:
    httpd, thread = server
    httpd.shutdown()
    httpd.server_close()
    thread.join()
