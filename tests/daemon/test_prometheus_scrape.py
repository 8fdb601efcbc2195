"""A real Prometheus server (Debian's `prometheus`) scrapes cleanerd's metrics endpoint.

The test makes a compacted log overdue by about an hour, serves its metrics, starts
Prometheus on loopback with a temporary config (1 s scrapes, the shipped alert rules)
and asks Prometheus' HTTP API for the delay under the native and the Kafka name. The
delay grows with the wall clock, so the expected value is bracketed by the clock read
before the endpoint started and after the query returned.
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cleanerd.compaction.cleanable import log_to_clean
from cleanerd.config import MetricsConfig
from cleanerd.daemon.metrics import MetricsExporter
from cleanerd.log.files import TopicPartition
from cleanerd.log.meta import PartitionMeta
from cleanerd.metrics_model import PartitionState, build_snapshot
from tests.builders import build_log, kv
from tests.tools import require_tool

pytestmark = pytest.mark.network

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "config" / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "config" / "grafana" / "cleanerd-dashboard.json"
LAG_MS = 60_000
OVERDUE_MS = 3_600_000
WAIT_S = 60.0  # an upper bound for a first scrape that takes about 6 s, never an assertion


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Prometheus:
    """Prometheus' HTTP API at `url`."""

    url: str

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr} if at is None else {"query": expr, "time": repr(at)}
        result: list[dict[str, Any]] = self.get("/api/v1/query", **params)["result"]
        return result

    def wait_for(self, expr: str) -> list[dict[str, Any]]:
        """The first non-empty result of `expr`, polling for at most WAIT_S."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            result = self.query(expr)
            if result:
                return result
            time.sleep(0.2)
        raise AssertionError(f"Prometheus returned nothing for {expr} within {WAIT_S} s")


@contextlib.contextmanager
def run_prometheus(tmp_path: Path, target: str) -> Iterator[Prometheus]:
    """Prometheus on a free loopback port, scraping `target` every second as job
    `cleanerd`, with the shipped alert rules loaded."""
    binary = require_tool("prometheus", "prometheus")
    port = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        json.dumps(  # JSON is YAML
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(ALERTS)],
                "scrape_configs": [
                    {"job_name": "cleanerd", "static_configs": [{"targets": [target]}]}
                ],
            }
        )
    )
    log = tmp_path / "prometheus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        server = Prometheus(f"http://127.0.0.1:{port}")
        _wait_ready(server, proc, log)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_ready(server: Prometheus, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"prometheus exited {proc.returncode}: {log.read_text()}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as response,
        ):
            if response.status == 200:
                return
        time.sleep(0.1)
    raise AssertionError(f"prometheus not ready within {WAIT_S} s: {log.read_text()}")


@dataclass(frozen=True)
class OverdueLog:
    """A compacted partition whose earliest dirty record is `earliest_ms`."""

    log_dir: Path
    meta: PartitionMeta
    earliest_ms: int

    def delay_ms(self, now_ms: int) -> int:
        return now_ms - self.earliest_ms - LAG_MS


def make_overdue_log(tmp_path: Path) -> OverdueLog:
    """Two segments: the rolled one holds a record OVERDUE_MS past its deadline."""
    now = _wall_ms()
    earliest = now - OVERDUE_MS - LAG_MS
    log_dir = tmp_path / "data"
    plog = build_log(
        log_dir,
        [[[kv("k", "old", timestamp=earliest)]], [[kv("k", "new", timestamp=now - 1_000)]]],
        state_dir=tmp_path / "state",
        tp=TopicPartition("orders", 0),
    )
    return OverdueLog(log_dir, plog.meta(), earliest)


@contextlib.contextmanager
def serve_metrics(overdue: OverdueLog) -> Iterator[str]:
    """The exporter on a free loopback port, serving a snapshot of the overdue log made
    at the current wall-clock time; yields its HOST:PORT."""
    now = _wall_ms()
    ltc = log_to_clean(
        overdue.meta,
        checkpoint=None,
        now_ms=now,
        min_compaction_lag_ms=0,
        max_compaction_lag_ms=LAG_MS,
    )
    exporter = MetricsExporter(MetricsConfig(listen="127.0.0.1:0"))
    exporter.update(
        build_snapshot(now_ms=now, partitions=[PartitionState(overdue.meta, ltc)], last_run_ms=now)
    )
    exporter.start()
    try:
        address = exporter.address
        assert address is not None
        yield f"{address[0]}:{address[1]}"
    finally:
        exporter.stop()


def test_prometheus_scrapes_the_overdue_delay_under_both_names(tmp_path: Path) -> None:
    """Through Prometheus' API: the native delay is the log's overdue time in seconds,
    the Kafka-named gauge is the same in whole seconds, the shipped overdue alert is
    pending for that log dir, and every dashboard query evaluates."""
    overdue = make_overdue_log(tmp_path)
    low_ms = overdue.delay_ms(_wall_ms())
    with serve_metrics(overdue) as target, run_prometheus(tmp_path, target) as prometheus:
        first = prometheus.wait_for("cleanerd_max_compaction_delay_seconds")
        at = float(first[0]["value"][0])
        native = prometheus.query("cleanerd_max_compaction_delay_seconds", at)
        kafka = prometheus.query("kafka_log_logcleaner_max_compaction_delay_secs", at)
        high_ms = overdue.delay_ms(_wall_ms())

        assert [s["metric"]["log_dir"] for s in native] == [str(overdue.log_dir)]
        assert native[0]["metric"]["job"] == "cleanerd"
        native_s = float(native[0]["value"][1])
        assert low_ms / 1000 <= native_s <= high_ms / 1000
        kafka_secs = float(kafka[0]["value"][1])
        assert kafka_secs == math.floor(native_s)  # same scrape, Kafka's int seconds

        alert = prometheus.wait_for('ALERTS{alertname="CleanerdCompactionDeadlineOverdue"}')
        assert alert[0]["metric"]["alertstate"] == "pending"  # `for: 5m` has not passed
        assert alert[0]["metric"]["log_dir"] == str(overdue.log_dir)
        rules = prometheus.get("/api/v1/rules")["groups"][0]["rules"]
        assert {r["health"] for r in rules} == {"ok"}

        for expr in _dashboard_queries():
            prometheus.query(expr)  # raises unless Prometheus accepts and evaluates it


def _dashboard_queries() -> list[str]:
    """Every panel query with the dashboard's variables filled in as Grafana would."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    return [
        e.replace("$job", ".+").replace("$instance", ".+").replace("$__rate_interval", "1m")
        for e in exprs
    ]
