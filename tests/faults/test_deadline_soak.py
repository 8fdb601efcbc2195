"""The deadline soak, with faults: the real `cleanerd run` in real time keeps
`max.compaction.lag.ms` through a SIGHUP, a `kill -9` and restart, and a log dir held by
another process for a while; its delay gauge never reads 0 while an audit finds an
overdue record; nothing a producer was acknowledged is lost.

Setup: 60 partitions of one compacted topic (ratio 1.0, so only deadlines force
cleaning; max lag L = 3 s; one worker) in two log dirs: A holds d-0..d-29, B d-30..d-59.
Each starts with 20 keys written 3 times. A producer process appends to d-20..d-29 all
along (through the partition locks, as an application writing beside the daemon does).

Timeline: daemon D1 starts; at 8 s a SIGHUP with a changed file; at 14 s D1 is killed
with SIGKILL, a stand-in broker takes B's `.lock` (`fcntl.lockf`, as Kafka) and appends
to d-50..d-59, and daemon D2 starts (B observed, A owned); at 24 s the stand-in lets go,
D2 says so and keeps observing B (a dir let go is owned only from a restart), and D3
replaces D2 and owns B; at 36 s everything stops and a final audit runs.

The slack, derived (not tuned). Take a record r superseded at s (the timestamp of the
record that supersedes it, written at about s into segment S, whose first batch has
timestamp f <= s). Let P be the longest time between two cycle starts over the whole run
(D1's, D2's and D3's, so the restart gaps are in it), C the longest cycle and W the longest a
producer's append waited for the partition lock after taking its timestamp, all measured.

1. S rolls at the first cycle start at which `now - f >= L` and `now - last_roll >=
   min(rolls.min_interval_ms, L)`, where last_roll is the previous segment's mtime,
   which the roll that created S left before S's first append (so <= f + W). Both hold
   from f + W + L on, and a cycle starts within P of that.
2. That cycle's cleaning phase finds S's partition overdue and cleans it before the
   phase ends: within C.

So r is gone by s + L + (W + P + C); the test allows slack = W + 2P + C (one more period
for the cycle that sees S's last append). In an audit round at t, a record older than
L + slack is a violation, except in B from the moment the stand-in took it until its
release plus the slack (nobody may clean a dir another process holds: D2 observes it).

The gauge. A cycle sees a superseding record within P of its append, and from its
deadline on, each metrics refresh (every R = refresh interval + a tick) shows the delay
grown. Each round scrapes the gauge at t1, then audits at t2; when the audit finds a
record overdue by more than (t2 - t1) + R + P, the gauge read at t1 must not be 0.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from cleanerd.clock import wall_clock_ms
from cleanerd.commands.audit import audit_log_dirs
from cleanerd.config import load_config
from cleanerd.log.files import TopicPartition
from cleanerd.log.partition_log import PartitionLog
from tests.builders import kv
from tests.faults.workload import Daemon, records_on_disk, wait_for
from tests.paths import REPO
from tests.tools import free_port

L_MS = 3_000
BACKOFF_MS = 500
REFRESH_S = 0.5
TICK_MS = 1_000
A_PARTITIONS = range(0, 30)
B_PARTITIONS = range(30, 60)
BUSY_A = range(20, 30)
BUSY_B = range(50, 60)
HUP_AT_S, KILL_AT_S, RELEASE_AT_S, STOP_AT_S = 8.0, 14.0, 24.0, 36.0
ROUND_S = 0.5

WRITER = """
import fcntl, json, os, sys, time
from pathlib import Path
from cleanerd.log.partition_log import PartitionLog
from cleanerd.records.record import Record

logs, state, acks, hold = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
parts = sys.argv[5:]
if hold == "hold":
    fd = os.open(logs / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.lockf(fd, fcntl.LOCK_EX)  # as a Kafka broker takes its log dir
plogs = {p: PartitionLog.open(logs / f"d-{p}", state_dir=state, recover=False) for p in parts}
print("ready", flush=True)
n = worst = 0
with open(acks, "a") as out:
    while not os.path.exists(acks + ".stop"):
        for p, plog in plogs.items():
            key, value = b"k%d" % (n % 7), b"w%d-%s" % (n, p.encode())
            ts = time.time_ns() // 1_000_000
            first, _ = plog.append([Record(0, ts, key, value, ())])
            worst = max(worst, time.time_ns() // 1_000_000 - ts)
            out.write(json.dumps([int(p), first, key.decode(), value.decode()]) + "\\n")
        out.flush()
        n += 1
        time.sleep(0.02)
print(json.dumps({"rounds": n, "worst_append_wait_ms": worst}), flush=True)
"""


@contextlib.contextmanager
def writer(
    logs: Path, state: Path, acks: Path, parts: range, *, hold: bool
) -> Iterator[dict[str, Any]]:
    """WRITER in its own process until the block ends; yields its summary once stopped."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(logs), str(state), str(acks), "hold" if hold else "-"]
        + [str(p) for p in parts],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    summary: dict[str, Any] = {}
    try:
        yield summary
    finally:
        Path(f"{acks}.stop").touch()
        out, _ = proc.communicate(timeout=60)
        summary.update(json.loads(out.strip().splitlines()[-1]))


@dataclass
class Round:
    scraped_ms: int
    audited_ms: int
    gauge_s: dict[str, float] | None
    """Per log dir, `cleanerd_max_compaction_delay_seconds`; None: no answer (restart)."""
    ages_ms: dict[int, int]
    """Per partition audited whole, the oldest superseded record's age (0: none)."""


@dataclass
class Observer:
    """Audit rounds in the test process, each after a scrape of the daemon's gauge."""

    cfg_path: Path
    port: int
    rounds: list[Round] = field(default_factory=list)
    observed_b: list[float] = field(default_factory=list)

    def scrape(self, b: str) -> dict[str, float] | None:
        try:
            url = f"http://127.0.0.1:{self.port}/metrics"
            with urllib.request.urlopen(url, timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return None
        gauges: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "cleanerd_max_compaction_delay_seconds":
                    gauges[s.labels["log_dir"]] = s.value
                if s.name == "cleanerd_log_dir_observed" and s.labels["log_dir"] == b:
                    self.observed_b.append(s.value)
        return gauges

    def run(self, stop: threading.Event, b: str) -> None:
        cfg = load_config(self.cfg_path)
        while not stop.wait(ROUND_S):
            scraped = wall_clock_ms()
            gauge = self.scrape(b)
            now = wall_clock_ms()
            try:
                audit = audit_log_dirs(cfg, now_ms=now, slack_ms=0, max_listed=1)
            except OSError:
                continue  # a file swapped away mid-read: this round proves nothing
            ages = {
                a.partition: a.result.oldest_superseded_age_ms or 0
                for a in audit.audits
                if a.result is not None and a.error is None
            }
            self.rounds.append(Round(scraped, now, gauge, ages))


def _saw(cycles: list[tuple[int, int]], *, after_ms: int, by_ms: int) -> bool:
    """Whether a cycle started after `after_ms` and finished by `by_ms`."""
    return any(start >= after_ms and start + length <= by_ms for start, length in cycles)


def _write_config(path: Path, a: Path, b: Path, state: Path, port: int, **extra: Any) -> None:
    doc: dict[str, Any] = {
        "log.dirs": [str(a), str(b)],
        "state_dir": str(state),
        "log.cleaner.threads": 1,
        "log.cleaner.backoff.ms": BACKOFF_MS,
        "log.cleaner.dedupe.buffer.size": 16 * 1024 * 1024,
        "metrics": {"listen": f"127.0.0.1:{port}", "refresh_interval_s": REFRESH_S},
        # debug: idle cycles log `cycle.done` at debug, and every cycle's is needed
        "logging": {"format": "json", "level": "debug"},
        "topics": {
            "d": {
                "cleanup.policy": "compact",
                "min.cleanable.dirty.ratio": 1.0,
                "max.compaction.lag.ms": L_MS,
            }
        },
        **extra,
    }
    path.write_text(yaml.safe_dump(doc))


def _setup(a: Path, b: Path, state: Path) -> dict[int, dict[str, tuple[int, str]]]:
    """Every partition's 60 records; returns each key's latest (offset, value)."""
    latest: dict[int, dict[str, tuple[int, str]]] = {}
    now = wall_clock_ms()
    for p in itertools.chain(A_PARTITIONS, B_PARTITIONS):
        logs = a if p in A_PARTITIONS else b
        plog = PartitionLog.create(logs, TopicPartition("d", p), state_dir=state)
        for i in range(60):
            first, _ = plog.append([kv(f"k{i % 20}", f"v{i}", timestamp=now)])
            latest.setdefault(p, {})[f"k{i % 20}"] = (first, f"v{i}")
    return latest


def _acked(latest: dict[int, dict[str, tuple[int, str]]], acks: Path) -> None:
    for line in acks.read_text().splitlines():
        p, offset, key, value = json.loads(line)
        latest[p][key] = (offset, value)


def _check_nothing_lost(a: Path, b: Path, latest: dict[int, dict[str, tuple[int, str]]]) -> None:
    """Every key's latest acknowledged record is on disk (kafka-python's reader)."""
    for p, keys in latest.items():
        logs = a if p in A_PARTITIONS else b
        on_disk: dict[str, tuple[int, str]] = {}
        for offset, key, value in records_on_disk(logs / f"d-{p}"):
            assert value is not None
            on_disk[key.decode()] = (offset, value.decode())
        assert on_disk == keys, f"d-{p}: {set(keys.items()) ^ set(on_disk.items())}"


@pytest.mark.slow
def test_deadline_soak_with_sighup_kill_and_a_held_dir(tmp_path: Path) -> None:
    a, b, state = tmp_path / "a", tmp_path / "b", tmp_path / "state"
    a.mkdir()
    b.mkdir()
    latest = _setup(a, b, state)
    port = free_port()
    cfg_path = tmp_path / "cleanerd.yaml"
    _write_config(cfg_path, a, b, state, port)
    acks_a, acks_b = tmp_path / "acks-a", tmp_path / "acks-b"
    observer = Observer(cfg_path, port)
    stop = threading.Event()
    auditor = threading.Thread(target=observer.run, args=(stop, str(b)))
    t0 = time.monotonic()

    def at(seconds: float) -> None:
        time.sleep(max(0.0, t0 + seconds - time.monotonic()))

    d1 = Daemon.start(cfg_path)
    d2: Daemon | None = None
    d3: Daemon | None = None
    try:
        with writer(a, state, acks_a, BUSY_A, hold=False) as produced:
            auditor.start()
            at(HUP_AT_S)
            _write_config(cfg_path, a, b, state, port, **{"log.cleaner.backoff.ms": 400})
            d1.proc.send_signal(signal.SIGHUP)
            wait_for(lambda: d1.saw("config.reloaded"), 30, "the reload")
            at(KILL_AT_S)
            d1.kill()
            killed_ms = wall_clock_ms()
            with writer(b, tmp_path / "broker-state", acks_b, BUSY_B, hold=True) as held:
                held_ms = wall_clock_ms()
                d2 = Daemon.start(cfg_path)
                assert d2.saw("log_dir.observe_forced")
                at(RELEASE_AT_S)
            released_ms = wall_clock_ms()
            # Let go, B stays observed (a broker restarting would need it back) until a
            # restart, the operator's word that the holder is gone for good.
            wait_for(lambda: d2 is not None and d2.saw("log_dir.released"), 30, "B let go")
            d2.proc.send_signal(signal.SIGTERM)
            assert d2.proc.wait(timeout=60) == 0
            restarted_ms = wall_clock_ms()
            d3 = Daemon.start(cfg_path)
            at(STOP_AT_S)
            stop.set()
            auditor.join()
        d3.proc.send_signal(signal.SIGTERM)
        assert d3.proc.wait(timeout=60) == 0
    finally:
        stop.set()
        for d in (d1, d2, d3):
            if d is not None:
                d.reap()

    assert d2 is not None
    assert d3 is not None
    serving_at = [(killed_ms, d1), (restarted_ms, d2), (math.inf, d3)]
    cycles = sorted(
        d1.cycle_starts_and_lengths()
        + d2.cycle_starts_and_lengths()
        + d3.cycle_starts_and_lengths()
    )
    starts = [s for s, _ in cycles]
    period_ms = max(y - x for x, y in itertools.pairwise(starts))
    cycle_ms = max(length for _, length in cycles)
    wait_ms = max(produced["worst_append_wait_ms"], held["worst_append_wait_ms"])
    slack_ms = wait_ms + 2 * period_ms + cycle_ms
    refresh_ms = int(REFRESH_S * 1000) + TICK_MS

    late: list[str] = []
    worst_ms = 0
    gauge_checked = gauge_lied = 0
    for r in observer.rounds:
        daemon = next(d for until, d in serving_at if r.scraped_ms < until)
        serving = daemon.cycle_starts_and_lengths()
        for p, age in r.ages_ms.items():
            in_b = p in B_PARTITIONS
            excused = in_b and held_ms <= r.audited_ms <= released_ms + slack_ms
            if not excused:
                worst_ms = max(worst_ms, age - L_MS)
                if age > L_MS + slack_ms:
                    late.append(f"d-{p} at {r.audited_ms}: {age} ms")
            if age == 0 or r.gauge_s is None:
                continue
            superseded = r.audited_ms - age
            refreshed = r.scraped_ms - refresh_ms  # the gauge is at most this old
            gauge = r.gauge_s.get(str(b if in_b else a))
            if gauge is None or superseded + L_MS >= refreshed:
                continue
            if not _saw(serving, after_ms=superseded + wait_ms, by_ms=refreshed):
                continue  # no finished cycle had read the superseding record yet
            gauge_checked += 1
            if gauge == 0.0:
                gauge_lied += 1
                late.append(f"gauge 0 for d-{p} at {r.scraped_ms}, {age - L_MS} ms overdue")
    print(
        f"rounds {len(observer.rounds)}, cycles {len(cycles)}, longest cycle {cycle_ms} ms, "
        f"period {period_ms} ms (restart gap included), append wait {wait_ms} ms, "
        f"slack {slack_ms} ms, worst lateness past max lag {worst_ms} ms "
        f"(allowed {slack_ms} ms), gauge checks {gauge_checked}, gauge read 0 {gauge_lied}"
    )
    assert produced["rounds"] > 100
    assert held["rounds"] > 50
    assert len(observer.rounds) >= 30
    assert not late, f"{len(late)} late, e.g. {late[:3]} (slack {slack_ms} ms)"
    assert gauge_checked > 0  # the held dir's records were overdue, and read so
    assert gauge_lied == 0
    assert 1.0 in observer.observed_b
    assert observer.observed_b[-1] == 0.0
    final = audit_log_dirs(
        load_config(cfg_path), now_ms=wall_clock_ms(), slack_ms=slack_ms, max_listed=5
    )
    assert final.violations == 0
    assert not final.errors
    _acked(latest, acks_a)
    _acked(latest, acks_b)
    _check_nothing_lost(a, b, latest)
