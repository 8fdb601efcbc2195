"""The Prometheus exporter: exposition from a snapshot, naming, shipped names, HTTP."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from cleanerd.compaction.cleanable import log_to_clean
from cleanerd.compaction.manager import UncleanablePartitions
from cleanerd.compaction.stats import CleanerStats
from cleanerd.config import MetricsConfig
from cleanerd.daemon.metrics.exporter import (
    CLEAN_DURATION_BUCKETS_S,
    DurationHistogram,
    MetricsExporter,
    PassResult,
    ServiceMetrics,
)
from cleanerd.daemon.metrics.model import MetricsSnapshot, build_snapshot
from cleanerd.log.files import TopicPartition
from cleanerd.maintenance.report import MaintenanceCounters, PartitionState, StepError
from cleanerd.retention.disk_usage import DeviceUsage
from tests.builders import build_log, kv
from tests.paths import REPO
from tests.tools import require_tool

ALERTS = REPO / "config" / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "config" / "grafana" / "cleanerd-dashboard.json"

NOW_MS = 1_700_000_000_000
LAG_MS = 30_000
# The overdue partition's first (rolled) segment holds a record this old, so its delay is
# 100.4 s - 30 s = 70.4 s: 70.4 natively, 70 in Kafka's whole seconds.
OLDEST_AGE_MS = 100_400
LOCAL = "127.0.0.1:0"


def _stats(**overrides: float) -> CleanerStats:
    fields: dict[str, float] = {
        "bytes_read": 1000,
        "bytes_written": 333,
        "map_bytes_read": 500,
        "map_messages_read": 5,
        "messages_read": 10,
        "messages_written": 4,
        "invalid_messages_read": 0,
        "buffer_utilization": 0.857,
        "start_ms": 0,
        "map_complete_ms": 1000,
        "end_ms": 2999,
    }
    fields.update(overrides)
    return CleanerStats(**fields)  # type: ignore[arg-type]


def _overdue_state(log_dir: Path, state_dir: Path, topic: str) -> PartitionState:
    """A real compacted partition, two segments, overdue by 70.4 s at NOW_MS."""
    plog = build_log(
        log_dir,
        [
            [[kv("k", "old", timestamp=NOW_MS - OLDEST_AGE_MS)]],
            [[kv("k", "new", timestamp=NOW_MS - 1_000)]],
        ],
        state_dir=state_dir,
        tp=TopicPartition(topic, 0),
    )
    meta = plog.meta()
    ltc = log_to_clean(
        meta,
        checkpoint=None,
        now_ms=NOW_MS,
        min_compaction_lag_ms=0,
        max_compaction_lag_ms=LAG_MS,
    )
    return PartitionState(meta, ltc)


def _snapshot(tmp_path: Path, **overrides: object) -> MetricsSnapshot:
    """Two log dirs: one with an overdue partition and an uncleanable one, one empty;
    a device above its threshold; a worker's last pass; some deletions and rolls."""
    data, empty = tmp_path / "data", tmp_path / "empty"
    empty.mkdir(parents=True)
    overdue = _overdue_state(data, tmp_path / "state", "orders")
    stuck = _overdue_state(data, tmp_path / "state", "stuck")
    uncleanable = UncleanablePartitions()
    uncleanable.mark(TopicPartition("stuck", 0), log_dir=str(data), reason="boom", now_ms=NOW_MS)
    counters = MaintenanceCounters()
    counters.count_deletion("retention.ms", 4096)
    args: dict[str, object] = {
        "now_ms": NOW_MS,
        "partitions": [overdue, stuck],
        "log_dirs": [str(data), str(empty)],
        "uncleanable": uncleanable,
        "last_runs": [_stats()],
        "last_run_ms": NOW_MS - 5_000,
        "devices": [DeviceUsage(os.makedev(8, 1), 1000, 950, 90.0)],
        "device_log_dirs": {os.makedev(8, 1): [str(data), str(empty)]},
        "counters": counters.snapshot(),
    }
    args.update(overrides)
    return build_snapshot(**args)  # type: ignore[arg-type]


def _exporter(
    snapshot: MetricsSnapshot | None, *, now_ms: int = NOW_MS, **cfg: object
) -> MetricsExporter:
    clock_s = [now_ms / 1000]
    ex = MetricsExporter(MetricsConfig(listen=LOCAL, **cfg), clock=lambda: clock_s[0])  # type: ignore[arg-type]
    if snapshot is not None:
        ex.update(snapshot)
    return ex


def _value(ex: MetricsExporter, name: str, **labels: str) -> float | None:
    return ex.registry.get_sample_value(name, labels)


def _family_names(text: str) -> dict[str, str]:
    """name -> type of every family in an exposition."""
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def _sample_names(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


# --- content -------------------------------------------------------------------------


def test_overdue_log_reports_its_delay_natively_and_under_kafkas_name(tmp_path: Path) -> None:
    """A real overdue log shows its delay in seconds per log dir, and in Kafka's whole
    seconds under the JMX exporter's name; the empty log dir reports 0."""
    ex = _exporter(_snapshot(tmp_path))
    data, empty = str(tmp_path / "data"), str(tmp_path / "empty")
    assert _value(ex, "cleanerd_max_compaction_delay_seconds", log_dir=data) == 70.4
    assert _value(ex, "cleanerd_max_compaction_delay_seconds", log_dir=empty) == 0
    assert _value(ex, "kafka_log_logcleaner_max_compaction_delay_secs") == 70


def test_kafka_names_are_exactly_the_jmx_exporter_names_of_the_design(tmp_path: Path) -> None:
    """The kafka_* families are the nine names DESIGN section 6 lists, all gauges."""
    families = _family_names(_exporter(_snapshot(tmp_path)).exposition().decode())
    kafka = {name: kind for name, kind in families.items() if name.startswith("kafka_")}
    assert kafka == dict.fromkeys(
        (
            "kafka_log_logcleaner_max_compaction_delay_secs",
            "kafka_log_logcleaner_max_clean_time_secs",
            "kafka_log_logcleaner_max_buffer_utilization_percent",
            "kafka_log_logcleaner_cleaner_recopy_percent",
            "kafka_log_logcleaner_deadthreadcount",
            "kafka_log_logcleanermanager_max_dirty_percent",
            "kafka_log_logcleanermanager_time_since_last_run_ms",
            "kafka_log_logcleanermanager_uncleanable_partitions_count",
            "kafka_log_logcleanermanager_uncleanable_bytes",
        ),
        "gauge",
    )


def test_delay_counts_the_active_segment_under_both_names(tmp_path: Path) -> None:
    """A single overdue active segment (Kafka's own gauge would read 0) is reported."""
    plog = build_log(
        tmp_path / "data",
        [[[kv("k", "v", timestamp=NOW_MS - 40_000)]]],
        state_dir=tmp_path / "state",
    )
    meta = plog.meta()
    ltc = log_to_clean(
        meta, checkpoint=None, now_ms=NOW_MS, min_compaction_lag_ms=0, max_compaction_lag_ms=LAG_MS
    )
    assert ltc.kafka_compaction_delay_ms == 0
    ex = _exporter(build_snapshot(now_ms=NOW_MS, partitions=[PartitionState(meta, ltc)]))
    assert _value(ex, "cleanerd_max_compaction_delay_seconds", log_dir=meta.log_dir) == 10
    assert _value(ex, "kafka_log_logcleaner_max_compaction_delay_secs") == 10


def test_kafka_gauges_use_kafkas_units_and_integer_truncation(tmp_path: Path) -> None:
    """Clean time in whole seconds, utilisation, recopy and dirty ratio as int percents,
    dead threads, time since the last run in ms, uncleanable per logDirectory."""
    snap = replace(_snapshot(tmp_path), max_dirty_ratio=0.999, dead_workers=2)
    ex = _exporter(snap)
    data = str(tmp_path / "data")
    assert _value(ex, "kafka_log_logcleaner_max_clean_time_secs") == 2  # 2999 ms
    assert _value(ex, "kafka_log_logcleaner_max_buffer_utilization_percent") == 85  # 0.857
    assert _value(ex, "kafka_log_logcleaner_cleaner_recopy_percent") == 33  # 333 / 1000
    assert _value(ex, "kafka_log_logcleaner_deadthreadcount") == 2
    assert _value(ex, "kafka_log_logcleanermanager_max_dirty_percent") == 99
    assert _value(ex, "kafka_log_logcleanermanager_time_since_last_run_ms") == 5000
    assert (
        _value(ex, "kafka_log_logcleanermanager_uncleanable_partitions_count", logDirectory=data)
        == 1
    )
    stuck = next(p for p in snap.partitions if p.topic == "stuck")
    assert stuck.cleanable_bytes > 0
    assert (
        _value(ex, "kafka_log_logcleanermanager_uncleanable_bytes", logDirectory=data)
        == stuck.cleanable_bytes
    )


def test_time_since_last_run_is_measured_at_scrape_time(tmp_path: Path) -> None:
    """Kafka's time-since-last-run grows with the scrape clock between snapshots, and
    reads 0 before the first run."""
    clock_s = [NOW_MS / 1000]
    ex = MetricsExporter(MetricsConfig(listen=LOCAL), clock=lambda: clock_s[0])
    ex.update(_snapshot(tmp_path))
    clock_s[0] += 60
    assert _value(ex, "kafka_log_logcleanermanager_time_since_last_run_ms") == 65_000
    ex.update(_snapshot(tmp_path / "again", last_run_ms=None))
    assert _value(ex, "kafka_log_logcleanermanager_time_since_last_run_ms") == 0
    assert _value(ex, "cleanerd_last_clean_timestamp_seconds") == 0


def test_native_gauges_are_in_base_units(tmp_path: Path) -> None:
    """Ratios in 0..1, times as Unix seconds, sizes in bytes."""
    ex = _exporter(_snapshot(tmp_path))
    data = str(tmp_path / "data")
    assert _value(ex, "cleanerd_max_dirty_ratio", log_dir=data) == 1.0
    assert _value(ex, "cleanerd_max_offset_map_utilization_ratio") == 0.857
    assert _value(ex, "cleanerd_last_clean_timestamp_seconds") == (NOW_MS - 5_000) / 1000
    assert _value(ex, "cleanerd_uncleanable_partitions", log_dir=data) == 1
    assert _value(ex, "cleanerd_log_dir_partitions", log_dir=data) == 2
    size = _value(ex, "cleanerd_log_dir_size_bytes", log_dir=data)
    assert size is not None
    assert size > 0


def test_devices_report_usage_against_their_threshold(tmp_path: Path) -> None:
    """A device's usage and threshold are ratios labelled MAJOR:MINOR, and each log dir
    is joined to its device by an info series."""
    ex = _exporter(_snapshot(tmp_path))
    assert _value(ex, "cleanerd_disk_usage_ratio", device="8:1") == 0.95
    assert _value(ex, "cleanerd_disk_usage_threshold_ratio", device="8:1") == 0.9
    info = _value(ex, "cleanerd_log_dir_device_info", log_dir=str(tmp_path / "data"), device="8:1")
    assert info == 1


def test_per_partition_series_are_opt_in(tmp_path: Path) -> None:
    """Per-partition series appear only with metrics.per_partition."""
    snap = _snapshot(tmp_path)
    labels = {"topic": "orders", "partition": "0", "log_dir": str(tmp_path / "data")}
    off = _exporter(snap)
    assert _value(off, "cleanerd_partition_compaction_delay_seconds", **labels) is None
    on = _exporter(snap, per_partition=True)
    assert _value(on, "cleanerd_partition_compaction_delay_seconds", **labels) == 70.4
    assert _value(on, "cleanerd_partition_dirty_ratio", **labels) == 1.0
    assert _value(on, "cleanerd_partition_segments", **labels) == 2


def test_kafka_names_can_be_turned_off_by_reload(tmp_path: Path) -> None:
    """With metrics.kafka_names off (applied by configure) no kafka_* series remain."""
    ex = _exporter(_snapshot(tmp_path))
    assert "kafka_log_logcleaner_deadthreadcount" in _family_names(ex.exposition().decode())
    ex.configure(MetricsConfig(listen=LOCAL, kafka_names=False))
    names = _family_names(ex.exposition().decode())
    assert not [n for n in names if n.startswith("kafka_")]
    assert "cleanerd_max_compaction_delay_seconds" in names


def test_known_reasons_and_results_start_at_zero(tmp_path: Path) -> None:
    """Every roll reason, deletion reason and pass result has a series from the start."""
    ex = _exporter(_snapshot(tmp_path))
    for reason in ("segment.bytes", "segment.ms", "max.compaction.lag.ms"):
        assert _value(ex, "cleanerd_segments_rolled_total", reason=reason) == 0
    for reason in ("retention.bytes", "log.start.offset", "disk.usage"):
        assert _value(ex, "cleanerd_segments_deleted_total", reason=reason) == 0
    assert _value(ex, "cleanerd_segments_deleted_total", reason="retention.ms") == 1
    assert _value(ex, "cleanerd_segments_deleted_bytes_total", reason="retention.ms") == 4096
    for result in PassResult:
        assert _value(ex, "cleanerd_cleaner_passes_total", result=result.value) == 0


def test_before_the_first_snapshot_only_service_metrics_are_served() -> None:
    """A scrape before the daemon's first refresh works and serves build and reload info."""
    ex = _exporter(None)
    names = _family_names(ex.exposition().decode())
    assert "cleanerd_build_info" in names
    assert "cleanerd_max_compaction_delay_seconds" not in names
    assert _value(ex, "cleanerd_config_last_reload_successful") == 1


def test_passes_count_their_bytes_and_durations() -> None:
    """A pass with statistics adds its bytes and duration; one without only counts."""
    ex = _exporter(None)
    ex.record_pass(PassResult.SUCCESS, _stats())
    ex.record_pass(PassResult.ERROR)
    assert _value(ex, "cleanerd_cleaner_passes_total", result="success") == 1
    assert _value(ex, "cleanerd_cleaner_passes_total", result="error") == 1
    assert _value(ex, "cleanerd_cleaner_bytes_read_total") == 1000
    assert _value(ex, "cleanerd_cleaner_bytes_written_total") == 333
    assert _value(ex, "cleanerd_clean_duration_seconds_count") == 1
    assert _value(ex, "cleanerd_clean_duration_seconds_sum") == 2.999
    assert _value(ex, "cleanerd_clean_duration_seconds_bucket", le="1.0") == 0
    assert _value(ex, "cleanerd_clean_duration_seconds_bucket", le="5.0") == 1


def test_reload_outcomes() -> None:
    """A refused reload reads 0 and keeps the last success time; a good one moves it."""
    clock_s = [1000.0]
    ex = MetricsExporter(MetricsConfig(listen=LOCAL), clock=lambda: clock_s[0])
    assert _value(ex, "cleanerd_config_last_reload_success_timestamp_seconds") == 1000
    clock_s[0] = 2000.0
    ex.record_reload(successful=False)
    assert _value(ex, "cleanerd_config_last_reload_successful") == 0
    assert _value(ex, "cleanerd_config_last_reload_success_timestamp_seconds") == 1000
    clock_s[0] = 3000.0
    ex.record_reload(successful=True)
    assert _value(ex, "cleanerd_config_last_reload_successful") == 1
    assert _value(ex, "cleanerd_config_last_reload_success_timestamp_seconds") == 3000


def test_mqtt_connected_is_exported_only_while_mqtt_is_enabled() -> None:
    """No cleanerd_mqtt_connected series with MQTT off, so its alert cannot fire."""
    ex = _exporter(None)
    ex.record_events(published=0, dropped=0, connected=None)
    assert _value(ex, "cleanerd_mqtt_connected") is None
    ex.record_events(published=7, dropped=2, connected=False)
    assert _value(ex, "cleanerd_mqtt_connected") == 0
    assert _value(ex, "cleanerd_events_published_total") == 7
    assert _value(ex, "cleanerd_events_dropped_total") == 2


@settings(deadline=None, max_examples=60)
@given(st.lists(st.sampled_from([0.0, *CLEAN_DURATION_BUCKETS_S, 1e4]) | st.floats(0, 1e4)))
def test_histogram_buckets_count_observations_up_to_their_bound(durations: list[float]) -> None:
    """Each cumulative bucket counts the observations <= its bound; +Inf counts all."""
    hist = DurationHistogram()
    for d in durations:
        hist = hist.observe(d)
    for le, count in hist.cumulative():
        bound = float("inf") if le == "+Inf" else float(le)
        assert count == sum(d <= bound for d in durations)
    assert hist.sum_s == pytest.approx(sum(durations))


def test_service_metrics_are_replaced_never_mutated() -> None:
    """Recording makes a new ServiceMetrics: one a scrape already holds never changes."""
    ex = _exporter(None)
    held: ServiceMetrics = ex.service
    ex.record_pass(PassResult.SUCCESS, _stats())
    ex.record_reload(successful=False)
    assert held.passes[PassResult.SUCCESS] == 0
    assert held.last_reload_successful
    assert ex.service is not held


# --- names ---------------------------------------------------------------------------

_NATIVE_NAME = re.compile(r"cleanerd_[a-z][a-z0-9]*(_[a-z0-9]+)*")
_LABEL_NAME = re.compile(r"[a-z][a-z0-9_]*")
# Non-base or abbreviated units: the suffixes Prometheus' naming rules forbid.
_BAD_UNIT = re.compile(
    r"_(ms|msec|millis|milliseconds|us|microseconds|ns|secs?|mins?|minutes|hours?|days?"
    r"|kb|mb|gb|kilobytes|megabytes|percent|pct)(_|$)"
)


def _full_exporter(tmp_path: Path) -> MetricsExporter:
    ex = _exporter(_snapshot(tmp_path), per_partition=True)
    ex.record_events(published=1, dropped=0, connected=True)
    ex.record_pass(PassResult.SUCCESS, _stats())
    return ex


@pytest.mark.parametrize("kafka_names", [True, False])
def test_a_scrape_of_named_families_gets_every_one_asked_for(
    tmp_path: Path, kafka_names: bool
) -> None:
    """`/metrics?name[]=N` (Prometheus' `params`, `promtool`'s federation) answers for
    each family of the full exposition, the model's and the opt-in ones too (those off
    now may be turned on by a reload). It answered only for the service's families:
    the registry took the names from a collect before the first snapshot."""
    ex = _full_exporter(tmp_path)
    ex.configure(ex.settings.model_copy(update={"kafka_names": kafka_names}))
    ex.start()
    try:
        host, port = ex.address or ("", 0)
        for name, kind in _family_names(ex.exposition().decode()).items():
            # Asked for by a sample's name, as the client library matches them.
            sample = name + {"counter": "_total", "histogram": "_count"}.get(kind, "")
            url = f"http://{host}:{port}/metrics?name[]={sample}"
            with urllib.request.urlopen(url, timeout=10) as response:
                got = _family_names(response.read().decode())
            assert got == {name: kind}, (sample, got)
    finally:
        ex.stop()


def test_native_names_conform_to_prometheus_naming(tmp_path: Path) -> None:
    """cleanerd_* names are snake_case in base units, counters end in _total, only
    counters do, and label names are snake_case."""
    text = _full_exporter(tmp_path).exposition().decode()
    families = [f for f in text_string_to_metric_families(text) if f.name.startswith("cleanerd_")]
    assert len(families) > 25
    for family in families:
        assert _NATIVE_NAME.fullmatch(family.name), family.name
        assert not _BAD_UNIT.search(family.name), family.name
        for sample in family.samples:
            assert sample.name.endswith("_total") == (family.type == "counter"), sample.name
            for label in sample.labels:
                assert _LABEL_NAME.fullmatch(label), (sample.name, label)


def _names_used(text: str) -> set[str]:
    return set(re.findall(r"\b(?:cleanerd|kafka)_[a-z0-9_]+", text))


def test_every_name_in_the_alerts_and_dashboard_is_exported(tmp_path: Path) -> None:
    """Each cleanerd_* and kafka_* name used by alerts.yml or the Grafana dashboard is in
    the exposition (histogram series by their sample names)."""
    exported = _sample_names(_full_exporter(tmp_path).exposition().decode())
    rules = yaml.safe_load(ALERTS.read_text())["groups"]
    alert_exprs = " ".join(r["expr"] for g in rules for r in g["rules"])
    dashboard = json.loads(DASHBOARD.read_text())
    panel_exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", ()))
    variable_queries = " ".join(
        v["definition"] for v in dashboard["templating"]["list"] if "definition" in v
    )
    used = _names_used(alert_exprs) | _names_used(panel_exprs) | _names_used(variable_queries)
    assert len(used) > 15
    assert used - exported == set()


def test_every_native_family_is_in_the_readmes_metrics_table(tmp_path: Path) -> None:
    """Each cleanerd_* family exported is in README's metrics table (its first column):
    an operator looks a series up there (`cleanerd_log_dir_observed` was missing)."""
    text = _full_exporter(tmp_path).exposition().decode()
    families = _family_names(text).items()
    exported = {n + ("_total" if t == "counter" else "") for n, t in families}
    exported = {n for n in exported if n.startswith("cleanerd_")}
    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("| metric | type | labels |") :].split("\n\n", 1)[0]
    listed = {name for row in table.splitlines() for name in _names_used(row.split("|")[1])}
    assert len(exported) > 25
    assert exported - listed == set()


def test_dashboard_has_the_variables_and_panels_operators_need() -> None:
    """datasource/job/instance variables, every query filtered by job and instance, and
    panels for delay, dirty ratio, passes, deletions, disk vs threshold, uncleanable."""
    dashboard = json.loads(DASHBOARD.read_text())
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource", "job", "instance"]
    targets = [t for p in dashboard["panels"] for t in p.get("targets", ())]
    for target in targets:
        assert 'job=~"$job", instance=~"$instance"' in target["expr"], target["expr"]
        assert target["datasource"]["uid"] == "${datasource}"
    exprs = " ".join(t["expr"] for t in targets)
    for name in (
        "cleanerd_max_compaction_delay_seconds",
        "cleanerd_max_dirty_ratio",
        "cleanerd_cleaner_passes_total",
        "cleanerd_segments_deleted_total",
        "cleanerd_disk_usage_ratio",
        "cleanerd_disk_usage_threshold_ratio",
        "cleanerd_uncleanable_partitions",
    ):
        assert name in exprs
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def _promtool_check_metrics(exposition: bytes) -> subprocess.CompletedProcess[str]:
    promtool = require_tool("promtool", "prometheus")
    return subprocess.run(
        [promtool, "check", "metrics"],
        input=exposition.decode(),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_promtool_check_metrics_passes_on_the_native_exposition(tmp_path: Path) -> None:
    """`promtool check metrics` finds no problem in the native metrics."""
    ex = _full_exporter(tmp_path)
    ex.configure(MetricsConfig(listen=LOCAL, per_partition=True, kafka_names=False))
    result = _promtool_check_metrics(ex.exposition())
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout + result.stderr == ""


def test_promtool_flags_only_the_kafka_compatibility_names(tmp_path: Path) -> None:
    """With Kafka's names on, promtool's lint complaints concern only kafka_* names,
    which must keep the JMX exporter's spelling (ms units, camelCase logDirectory)."""
    result = _promtool_check_metrics(_full_exporter(tmp_path).exposition())
    problems = (result.stdout + result.stderr).strip().splitlines()
    assert problems
    assert all(line.startswith("kafka_") for line in problems), problems


# --- HTTP endpoint -------------------------------------------------------------------


def _get(address: tuple[str, int]) -> bytes:
    host, port = address
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
        return bytes(response.read())


def _kafka_delay(body: bytes) -> float:
    for family in text_string_to_metric_families(body.decode()):
        if family.name == "kafka_log_logcleaner_max_compaction_delay_secs":
            return float(family.samples[0].value)
    raise AssertionError("no kafka_log_logcleaner_max_compaction_delay_secs")


def test_http_endpoint_serves_the_latest_snapshot(tmp_path: Path) -> None:
    """GET /metrics serves the exposition, and a new snapshot replaces the old one."""
    ex = _exporter(_snapshot(tmp_path))
    ex.start()
    try:
        address = ex.address
        assert address is not None
        assert address[0] == "127.0.0.1"
        assert _kafka_delay(_get(address)) == 70
        ex.update(replace(_snapshot(tmp_path / "later"), max_compaction_delay_ms=80_999))
        assert _kafka_delay(_get(address)) == 80
    finally:
        ex.stop()
    assert ex.address is None


def test_stop_releases_the_port() -> None:
    """After stop the port can be bound again."""
    ex = _exporter(None)
    ex.start()
    address = ex.address
    assert address is not None
    ex.stop()
    with socket.socket() as s:
        s.bind(address)


def test_reload_moves_the_endpoint_to_a_new_address() -> None:
    """A changed metrics.listen is served at the new address, the old one is released;
    the same port on another interface works too."""
    ex = _exporter(None)
    ex.start()
    try:
        old = ex.address
        assert old is not None
        ex.configure(MetricsConfig(listen=LOCAL, kafka_names=False))  # unchanged listen
        assert ex.address == old
        ex.configure(MetricsConfig(listen=f"0.0.0.0:{old[1]}"))
        assert ex.address == ("0.0.0.0", old[1])
        assert b"cleanerd_build_info" in _get(("127.0.0.1", old[1]))
    finally:
        ex.stop()


def test_a_taken_port_names_the_key_and_the_address() -> None:
    """Binding a port in use fails with an error naming `metrics.listen` and the address."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        listen = f"127.0.0.1:{busy.getsockname()[1]}"
        ex = MetricsExporter(MetricsConfig(listen=listen))
        with pytest.raises(OSError, match=f"^metrics.listen {listen}: cannot bind: Address "):
            ex.start()


def test_reload_to_an_address_in_use_keeps_the_old_endpoint() -> None:
    """If the new address cannot be bound, OSError is raised and the endpoint keeps
    serving under the old settings, at its old address: an ephemeral one (port 0) was
    released and bound again, to another port, before."""
    ex = _exporter(None)
    ex.start()
    before = ex.address
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        try:
            with pytest.raises(OSError):
                ex.configure(MetricsConfig(listen=f"127.0.0.1:{port}"))
            assert ex.settings.listen == LOCAL
            assert ex.address == before
            assert before is not None
            assert b"cleanerd_build_info" in _get(before)
        finally:
            ex.stop()


def test_a_failed_move_to_the_same_port_elsewhere_keeps_the_old_address() -> None:
    """The old endpoint (listen on port 0: an ephemeral port P) is released to try the
    new address on P's port on another interface, which a third party holds: it is
    bound again at P, not at a new ephemeral port."""
    ex = _exporter(None)
    ex.start()
    before = ex.address
    assert before is not None
    with socket.socket() as busy:
        busy.bind(("127.0.0.3", before[1]))
        busy.listen()
        try:
            with pytest.raises(OSError):
                ex.configure(MetricsConfig(listen=f"0.0.0.0:{before[1]}"))
            assert ex.settings.listen == LOCAL
            assert ex.address == before
            assert b"cleanerd_build_info" in _get(before)
        finally:
            ex.stop()


def test_offline_log_dirs_say_so(tmp_path: Path) -> None:
    """`cleanerd_log_dir_offline` is 1 for a log dir the last cycle could not use (its
    root checkpoints unreadable: it has no partition numbers), 0 for the others."""
    data, empty = str(tmp_path / "data"), str(tmp_path / "empty")
    ex = _exporter(_snapshot(tmp_path, offline_log_dirs=[empty]))
    assert _value(ex, "cleanerd_log_dir_offline", log_dir=empty) == 1
    assert _value(ex, "cleanerd_log_dir_offline", log_dir=data) == 0


def test_the_steps_that_failed_are_counted_per_log_dir(tmp_path: Path) -> None:
    """`cleanerd_failed_steps` counts the last cycle's failed steps of each log dir (a
    roll, a retention, a partition whose topic two globs match): they were only logged,
    so no alert could say that retention waited on a failing step."""
    data, empty = str(tmp_path / "data"), str(tmp_path / "empty")
    failed = [
        StepError(data, TopicPartition("users", 0), "roll", "No space left on device"),
        StepError(data, TopicPartition("xy", 0), "discover", "topics: topic 'xy' matches"),
    ]
    ex = _exporter(_snapshot(tmp_path, failed_steps=failed))
    assert _value(ex, "cleanerd_failed_steps", log_dir=data) == 2
    assert _value(ex, "cleanerd_failed_steps", log_dir=empty) == 0


def test_observed_log_dirs_say_so(tmp_path: Path) -> None:
    """`cleanerd_log_dir_observed` is 1 for a log dir only observed (a broker's), 0 for
    one this process owns; the observed dir's other gauges are there as in owner mode."""
    data, empty = str(tmp_path / "data"), str(tmp_path / "empty")
    ex = _exporter(_snapshot(tmp_path, observed_log_dirs=[data]))
    assert _value(ex, "cleanerd_log_dir_observed", log_dir=data) == 1
    assert _value(ex, "cleanerd_log_dir_observed", log_dir=empty) == 0
    delay = _value(ex, "cleanerd_max_compaction_delay_seconds", log_dir=data)
    assert delay is not None
    assert delay > 0


def test_data_kept_past_its_retention_is_measured_to_the_snapshot(tmp_path: Path) -> None:
    """The retention gauges say how long data older than retention.ms has been on disk,
    per log dir (its oldest such partition) and per partition, to the snapshot's time;
    a dir or partition without such data reads 0."""
    overdue = _overdue_state(tmp_path / "data", tmp_path / "state", "orders")
    events = _overdue_state(tmp_path / "data", tmp_path / "state", "events")
    kept = replace(events, ltc=None, retention_due_ms=NOW_MS - 90_000)
    snap = _snapshot(tmp_path, partitions=[overdue, kept])
    ex = _exporter(snap, per_partition=True)
    data, empty = str(tmp_path / "data"), str(tmp_path / "empty")
    assert _value(ex, "cleanerd_max_retention_overdue_seconds", log_dir=data) == 90.0
    assert _value(ex, "cleanerd_max_retention_overdue_seconds", log_dir=empty) == 0.0
    series = "cleanerd_partition_retention_overdue_seconds"
    labels = {"topic": "events", "partition": "0", "log_dir": data}
    assert _value(ex, series, **labels) == 90.0
    assert _value(ex, series, **{**labels, "topic": "orders"}) == 0.0
    later = _snapshot(tmp_path / "later", partitions=[kept], now_ms=NOW_MS + 10_000)
    assert _value(_exporter(later, per_partition=True), series, **labels) == 100.0
