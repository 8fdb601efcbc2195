"""A real Prometheus server (Debian's `prometheus`) scrapes a real `cleanerd run`.

The test makes a compacted log overdue by about an hour, starts the daemon on it as a
subprocess (metrics on a loopback port, refreshed every second, the cleaner disabled so
the log stays overdue), starts Prometheus on loopback with a temporary config (1 s
scrapes, the shipped alert rules) and asks Prometheus' HTTP API for the delay under the
native and the Kafka name. The delay grows with the wall clock, so the expected value is
bracketed by the clock read before the daemon started and after the query returned.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cleanerd.log.files import TopicPartition
from tests.builders import build_log, kv
from tests.paths import REPO
from tests.tools import require_tool

pytestmark = pytest.mark.network

ALERTS = REPO / "config" / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "config" / "grafana" / "cleanerd-dashboard.json"
TOPIC = "orders"
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
    earliest_ms: int

    def delay_ms(self, now_ms: int) -> int:
        return now_ms - self.earliest_ms - LAG_MS


def make_overdue_log(tmp_path: Path) -> OverdueLog:
    """Two segments: the rolled one holds a record OVERDUE_MS past its deadline."""
    now = _wall_ms()
    earliest = now - OVERDUE_MS - LAG_MS
    log_dir = tmp_path / "data"
    build_log(
        log_dir,
        [[[kv("k", "old", timestamp=earliest)]], [[kv("k", "new", timestamp=now - 1_000)]]],
        state_dir=tmp_path / "state",
        tp=TopicPartition(TOPIC, 0),
    )
    return OverdueLog(log_dir, earliest)


def _daemon_config(tmp_path: Path, overdue: OverdueLog, listen: str) -> Path:
    config = tmp_path / "cleanerd.yaml"
    config.write_text(
        json.dumps(  # JSON is YAML
            {
                "log.dirs": [str(overdue.log_dir)],
                "state_dir": str(tmp_path / "state"),
                # Nothing cleans the log, so it stays overdue and the delay is known.
                "log.cleaner.enable": False,
                "topics": {TOPIC: {"cleanup.policy": "compact", "max.compaction.lag.ms": LAG_MS}},
                "metrics": {"listen": listen, "refresh_interval_s": 1.0},
                "logging": {"format": "json"},
            }
        )
    )
    return config


@contextlib.contextmanager
def run_daemon(tmp_path: Path, overdue: OverdueLog) -> Iterator[str]:
    """`cleanerd run` on the overdue log until its metrics show the delay; yields the
    metrics endpoint's HOST:PORT; stops the daemon with SIGTERM."""
    listen = f"127.0.0.1:{_free_port()}"
    config = _daemon_config(tmp_path, overdue, listen)
    log = tmp_path / "cleanerd.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cleanerd", "run", "-c", str(config)],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_for_delay(proc, listen, log)
        yield listen
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_for_delay(proc: subprocess.Popen[bytes], listen: str, log: Path) -> None:
    """Until the daemon's first snapshot (after its first cycle) is served."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"cleanerd exited {proc.returncode}: {log.read_text()}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"http://{listen}/metrics", timeout=2) as response,
        ):
            if b"\ncleanerd_max_compaction_delay_seconds{" in response.read():
                return
        time.sleep(0.1)
    raise AssertionError(f"cleanerd served no delay within {WAIT_S} s: {log.read_text()}")


def test_prometheus_scrapes_the_overdue_delay_under_both_names(tmp_path: Path) -> None:
    """Through Prometheus' API, from a running daemon: the native delay is the log's
    overdue time in seconds, the Kafka-named gauge is the same in whole seconds, the
    delay keeps growing with nothing written, the shipped overdue alert is pending for
    that log dir, and every dashboard query evaluates."""
    overdue = make_overdue_log(tmp_path)
    low_ms = overdue.delay_ms(_wall_ms())
    with run_daemon(tmp_path, overdue) as target, run_prometheus(tmp_path, target) as prometheus:
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
        # Nothing is written or cleaned, yet the delay grows: it is refreshed on a timer.
        prometheus.wait_for(f"cleanerd_max_compaction_delay_seconds > {native_s}")

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
