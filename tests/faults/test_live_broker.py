"""The real `cleanerd run` beside a live broker: the stand-in broker
(`tests.standin_broker`, another process holding `.lock` as Kafka does) appends, tears
and completes tails, rolls, cleans through `.cleaned` -> `.swap` -> `.deleted`, deletes
segments and rewrites its checkpoints for 20 s while the daemon observes the dir.

What must hold:

- the daemon logs no traceback and no error, and no warning but the one that says the
  dir is observed; it never marks a partition uncleanable (no log line, the
  `cleanerd_uncleanable_partitions` gauge 0 at every scrape);
- it never writes a byte into the dir: every file or dir that differs between the
  snapshots before and after the run (content, size, mtime, presence) is one the
  stand-in journaled writing; and once the stand-in is idle (still holding `.lock`),
  two more cycles change nothing at all;
- `/metrics` says the dir is observed and counts its partitions at every scrape;
- the delay gauges agree with `cleanerd plan --json --now-ms T` run afterwards: the
  gauge was computed at most one refresh period R (refresh interval + a tick) before
  T, and the stand-in's dirty records no longer change, so per partition and for the
  dir, 0 <= plan's overdue_ms - gauge <= R;
- and with what `cleanerd audit --json --now-ms T` finds on disk: the oldest superseded
  record's age past the max lag is at most the gauge + R (the gauge never reads less
  than what is really overdue).

Variant (root): the daemon reads the dir through a read-only bind mount of it
(`mode: observe`, as the systemd unit for this case has it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from cleanerd.clock import wall_clock_ms
from tests.faults.test_read_only import read_only_bind
from tests.faults.workload import Daemon, wait_for
from tests.paths import REPO
from tests.tools import free_port

BROKER_S = 20.0
MAX_LAG_MS = 2_000
REFRESH_S = 0.5
TICK_MS = 1_000
SCRAPE_S = 0.3

Snapshot = dict[str, tuple[str, int]]
"""Relative path -> (content digest, or "dir"; mtime ns)."""


def snapshot(root: Path) -> Snapshot:
    out: Snapshot = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            path = Path(dirpath, name)
            out[str(path.relative_to(root))] = ("dir", path.stat().st_mtime_ns)
        for name in filenames:
            path = Path(dirpath, name)
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            out[str(path.relative_to(root))] = (digest, path.stat().st_mtime_ns)
    out["."] = ("dir", root.stat().st_mtime_ns)
    return out


def changed(before: Snapshot, after: Snapshot) -> set[str]:
    return {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}


def unexplained(changes: set[str], journal: set[str]) -> set[str]:
    """Changes the stand-in did not make: a file it never wrote, or a dir in which it
    created, renamed or removed nothing (a dir's mtime moves with its entries)."""
    parents = {str(Path(p).parent) for p in journal}
    return {p for p in changes if p not in journal and p not in parents}


@contextlib.contextmanager
def standin_broker(log_dir: Path, journal: Path, seed: int) -> Iterator[subprocess.Popen[str]]:
    """The stand-in, its dir set up and `.lock` held, waiting for a line to start."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.standin_broker",
            str(log_dir),
            str(journal),
            str(BROKER_S),
            str(seed),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline() == "ready\n"
        yield proc
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
        proc.stdout.close()


class Scraper:
    """`/metrics` every SCRAPE_S in a thread: each scrape's samples by (name, labels)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.scrapes: list[dict[tuple[str, tuple[tuple[str, str], ...]], float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            text = r.read().decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def _run(self) -> None:
        while not self.stop.wait(SCRAPE_S):
            with contextlib.suppress(OSError):
                self.scrapes.append(self.scrape())

    def values(self, name: str, **labels: str) -> list[float]:
        want = set(labels.items())
        return [
            v for s in self.scrapes for (n, ls), v in s.items() if n == name and want <= set(ls)
        ]


def write_config(path: Path, log_dir: Path, state: Path, port: int, **extra: Any) -> Path:
    doc: dict[str, Any] = {
        "log.dirs": [str(log_dir)],
        "state_dir": str(state),
        "log.cleaner.backoff.ms": 500,
        # An observed dir has no deadline to meet: with nothing new, cycles come at the
        # revisit, which the idle cycles the test waits for need often.
        "log.retention.check.interval.ms": 1000,
        "metrics": {
            "listen": f"127.0.0.1:{port}",
            "refresh_interval_s": REFRESH_S,
            "per_partition": True,
        },
        "logging": {"format": "json", "level": "debug"},
        "topics": {
            "t": {"cleanup.policy": "compact", "max.compaction.lag.ms": MAX_LAG_MS},
            "r": {"cleanup.policy": "delete"},
        },
        **extra,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def cycles(daemon: Daemon) -> int:
    return sum(1 for e in list(daemon.events) if e.get("event") == "cycle.done")


def observe_live_broker(tmp_path: Path, data: Path, seen_as: Path, **extra: Any) -> None:
    """The whole test: the stand-in writes `data`, the daemon reads `seen_as` (the same
    dir, or a read-only view of it)."""
    state, journal = tmp_path / "state", tmp_path / "journal"
    port = free_port()
    config = write_config(tmp_path / "cleanerd.yaml", seen_as, state, port, **extra)
    scraper = Scraper(port)
    daemon: Daemon | None = None
    with standin_broker(data, journal, seed=11) as broker:
        assert broker.stdin is not None
        assert broker.stdout is not None
        before = snapshot(data)
        try:
            daemon = Daemon.start(config)
            scraper.thread.start()
            broker.stdin.write("go\n")
            broker.stdin.flush()
            assert broker.stdout.readline() == "idle\n"
            during = cycles(daemon)
            idle = snapshot(data)
            done = during + 3  # the one running now may have read files the stand-in changed
            wait_for(lambda: daemon is not None and cycles(daemon) >= done, 60, "idle cycles")
            time.sleep(REFRESH_S + TICK_MS / 1000)  # a refresh from a cycle of the idle dir
            after = snapshot(data)
            scraped_ms = wall_clock_ms()
            final = scraper.scrape()
            scraper.stop.set()
            scraper.thread.join()
        finally:
            scraper.stop.set()
            if daemon is not None:
                daemon.reap()
    assert daemon is not None
    plan = subprocess.run(
        [
            sys.executable,
            "-m",
            "cleanerd",
            "plan",
            "-c",
            str(config),
            "--json",
            "--now-ms",
            str(scraped_ms),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
        timeout=120,
    )

    audit = subprocess.run(
        [
            sys.executable,
            "-m",
            "cleanerd",
            "audit",
            "-c",
            str(config),
            "--json",
            "--slack-ms",
            "0",
            "--now-ms",
            str(scraped_ms),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
        timeout=120,
    )

    text = "".join(daemon.lines)
    assert "Traceback" not in text, text[-5000:]
    bad = [
        e
        for e in daemon.events
        if e.get("level") in ("error", "critical")
        or (e.get("level") == "warning" and e.get("event") != "log_dir.observe_forced")
        or "uncleanable" in json.dumps(e)
    ]
    assert not bad, bad[:5]
    skipped = sum(1 for e in daemon.events if e.get("event") == "observe.skipped")

    journaled = set(journal.read_text().splitlines())
    assert not unexplained(changed(before, idle), journaled)
    assert changed(idle, after) == set()

    log_dir = str(seen_as)
    assert during >= 5
    assert len(scraper.scrapes) >= 20
    assert set(scraper.values("cleanerd_log_dir_observed", log_dir=log_dir)) == {1.0}
    assert set(scraper.values("cleanerd_uncleanable_partitions")) <= {0.0}
    partitions = scraper.values("cleanerd_log_dir_partitions", log_dir=log_dir)
    assert partitions
    assert min(partitions) > 0
    assert final[("cleanerd_log_dir_partitions", (("log_dir", log_dir),))] == 4.0

    assert plan.returncode == 0, plan.stdout + plan.stderr
    planned = {
        f"{p['topic']}-{p['partition']}": p["compaction"]["overdue_ms"]
        for p in json.loads(plan.stdout)["partitions"]
        if p.get("compaction") is not None
    }
    assert planned.keys() == {"t-0", "t-1", "t-2"}
    refresh_ms = int(REFRESH_S * 1000) + TICK_MS
    for name, overdue_ms in planned.items():
        topic, _, partition = name.rpartition("-")
        labels = (("log_dir", log_dir), ("partition", partition), ("topic", topic))
        gauge_ms = final[("cleanerd_partition_compaction_delay_seconds", labels)] * 1000
        assert 0 <= overdue_ms - gauge_ms <= refresh_ms, (name, overdue_ms, gauge_ms)
    dir_gauge_ms = final[("cleanerd_max_compaction_delay_seconds", (("log_dir", log_dir),))] * 1000
    assert max(planned.values()) > 0
    assert 0 <= max(planned.values()) - dir_gauge_ms <= refresh_ms
    # What `audit` finds on disk at the same instant: the oldest superseded record's age
    # past the max lag. The gauge, computed at most R earlier from the oldest dirty
    # record (never younger than the oldest superseded one), is within R of it or above.
    assert audit.returncode in (0, 1), audit.stdout + audit.stderr
    audited = {
        f"{a['topic']}-{a['partition']}": max(0, (a["oldest_superseded_age_ms"] or 0) - MAX_LAG_MS)
        for a in json.loads(audit.stdout)["partitions"]
        if a["error"] is None and a["topic"] == "t"
    }
    assert audited.keys() == planned.keys()
    for name, overdue_ms in audited.items():
        topic, _, partition = name.rpartition("-")
        labels = (("log_dir", log_dir), ("partition", partition), ("topic", topic))
        gauge_ms = final[("cleanerd_partition_compaction_delay_seconds", labels)] * 1000
        assert gauge_ms >= overdue_ms - refresh_ms, (name, overdue_ms, gauge_ms)
    assert dir_gauge_ms >= max(audited.values()) - refresh_ms
    print(
        f"cycles while the stand-in wrote: {during}, scrapes {len(scraper.scrapes)}, "
        f"partitions skipped for a round: {skipped}, files it changed: {len(journaled)}, "
        f"plan overdue ms {planned}, audit overdue ms {audited}, "
        f"dir gauge ms {dir_gauge_ms:.0f}"
    )


@pytest.mark.slow
def test_run_observes_a_live_broker_without_writing_or_failing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    observe_live_broker(tmp_path, data, data)


@pytest.mark.slow
@pytest.mark.root
def test_run_observes_a_live_broker_through_a_read_only_bind_mount(tmp_path: Path) -> None:
    data, view = tmp_path / "data", tmp_path / "view"
    data.mkdir()
    view.mkdir()
    with read_only_bind(view, source=data):
        observe_live_broker(tmp_path, data, view, mode="observe")
