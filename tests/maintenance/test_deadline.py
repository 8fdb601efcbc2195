"""The max-lag deadline holds in real time: 50 partitions, idle ones and ones a producer
process keeps writing, ratio 1.0 (only deadlines force cleaning), one worker.

The slack, derived. Take a record r superseded at s (the timestamp of the record that
supersedes it, written at about s into segment S, whose first batch has timestamp
f <= s). Let P be the longest time between two cycle starts (at most the backoff plus
the longest cycle) and C the longest cycle, both measured during the run, and W the
longest a producer's append waited for the partition lock after taking its timestamp.

1. S rolls at the first cycle start at which `now - f >= L` (L = max.compaction.lag.ms)
   and `now - first_seen(S) >= L` (the roller's minimum roll interval, measured from
   when it first saw S holding a batch: at the latest one cycle start after S's first
   append, so first_seen(S) <= f + W + P). Both hold from f + W + P + L on, and a cycle
   starts within P of that: the roll happens by f + W + 2P + L.
2. That cycle's cleaning phase finds S's partition overdue (its earliest dirty
   timestamp is at most f, so its deadline f + L has passed) and cleans it before the
   phase ends: by the roll + C.

So r is gone by f + L + W + 2P + C <= s + L + (W + 2P + C), and the audit may only
find it older than L when it is younger than L + slack, slack = W + 2P + C, where
P <= backoff + C. Every audit round measures ages at the instant it starts, before it
reads a file, so an age it reports is never larger than the record's true age when read.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from cleanerd.commands.audit import audit_log_dirs
from cleanerd.config import load_config
from cleanerd.engine import create_engine
from cleanerd.log.files import TopicPartition
from cleanerd.log.partition_log import PartitionLog
from cleanerd.maintenance.cycle import Maintenance, wall_clock_ms
from cleanerd.maintenance.report import CycleReport, made_progress
from tests.builders import kv
from tests.paths import REPO

PARTITIONS = 50
BUSY = range(40, 50)
"""Partitions the producer process writes all along; the others are written once."""
MAX_LAG_MS = 3_000
BACKOFF_MS = 500
RUN_S = 24.0
AUDIT_EVERY_S = 0.5

PRODUCER = """
import json, sys, time
from pathlib import Path
from cleanerd.log.partition_log import PartitionLog
from cleanerd.records.record import Record

logs, state, stop = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
plogs = [PartitionLog.open(logs / f"d-{p}", state_dir=state) for p in sys.argv[4:]]
n = worst = 0
while not stop.exists():
    for plog in plogs:
        ts = time.time_ns() // 1_000_000
        plog.append([Record(0, ts, b"k%d" % (n % 7), b"v%d" % n, ())])
        worst = max(worst, time.time_ns() // 1_000_000 - ts)
    n += 1
    time.sleep(0.02)
print(json.dumps({"rounds": n, "worst_append_wait_ms": worst}))
"""


@dataclass
class Audits:
    """The oldest superseded record each audit round found, with how old it was."""

    rounds: int = 0
    errors: int = 0
    oldest_ms: int = 0
    superseded_seen: int = 0
    worst: list[str] = field(default_factory=list)

    def run(self, cfg_path: Path, stop: threading.Event) -> None:
        cfg = load_config(cfg_path)
        while not stop.wait(AUDIT_EVERY_S):
            now = wall_clock_ms()
            try:
                audit = audit_log_dirs(cfg, now_ms=now, slack_ms=0, max_listed=1)
            except OSError:
                self.errors += 1  # a file swapped away mid-read: this round proves nothing
                continue
            self.rounds += 1
            for a in audit.audits:
                if a.result is None or a.result.oldest_superseded_age_ms is None:
                    continue
                self.superseded_seen += a.result.superseded
                if a.result.oldest_superseded_age_ms > self.oldest_ms:
                    self.oldest_ms = a.result.oldest_superseded_age_ms
                    self.worst = [f"{a.topic}-{a.partition} at {now}"]


@pytest.mark.slow
def test_deadline_holds_for_idle_and_busy_partitions(tmp_path: Path) -> None:
    """No superseded record outlives max.compaction.lag.ms plus the derived slack."""
    logs, state = tmp_path / "logs", tmp_path / "state"
    cfg_path = tmp_path / "cleanerd.yaml"
    cfg_path.write_text(
        yaml.safe_dump(
            {
                "log.dirs": [str(logs)],
                "state_dir": str(state),
                "log.cleaner.threads": 1,
                "log.cleaner.backoff.ms": BACKOFF_MS,
                "log.cleaner.dedupe.buffer.size": 16 * 1024 * 1024,
                "topics": {
                    "d": {
                        "cleanup.policy": "compact",
                        "min.cleanable.dirty.ratio": 1.0,
                        "max.compaction.lag.ms": MAX_LAG_MS,
                    }
                },
            }
        )
    )
    logs.mkdir()
    now = wall_clock_ms()
    for p in range(PARTITIONS):
        plog = PartitionLog.create(logs, TopicPartition("d", p), state_dir=state)
        for i in range(60):  # 20 keys, 3 versions each: 40 superseded records
            plog.append([kv(f"k{i % 20}", f"v{i}", timestamp=now)])
    cfg = load_config(cfg_path)
    reports: list[CycleReport] = []
    stop_loop, stop_audit = threading.Event(), threading.Event()
    stop_file = tmp_path / "stop-producer"
    engine = create_engine(cfg)
    audits = Audits()
    auditor = threading.Thread(target=audits.run, args=(cfg_path, stop_audit))
    try:
        with Maintenance(cfg, engine) as maintenance:
            producer = subprocess.Popen(
                [sys.executable, "-c", PRODUCER, str(logs), str(state), str(stop_file)]
                + [str(p) for p in BUSY],
                cwd=REPO,
                stdout=subprocess.PIPE,
                text=True,
            )
            auditor.start()
            timer = threading.Timer(RUN_S, stop_loop.set)
            timer.start()
            try:
                while not stop_loop.is_set():
                    reports.append(report := maintenance.run_once(stop_loop))
                    if not any(map(made_progress, report.cleaned)):
                        stop_loop.wait(BACKOFF_MS / 1000)  # the daemon's backoff
            finally:
                timer.cancel()
                stop_audit.set()
                auditor.join()
                stop_file.touch()
                out, _ = producer.communicate(timeout=60)
    finally:
        engine.shutdown()
    produced = json.loads(out)

    starts = [r.now_ms for r in reports]
    cycle_ms = max(r.finished_ms - r.now_ms for r in reports)
    period_ms = max(b - a for a, b in itertools.pairwise(starts))
    slack_ms = produced["worst_append_wait_ms"] + 2 * period_ms + cycle_ms

    assert produced["rounds"] > 100
    assert audits.rounds >= 10
    assert audits.superseded_seen > 0  # the audit does see superseded records...
    cleaned = {c.tp for r in reports for c in r.cleaned}
    assert len(cleaned) == PARTITIONS  # ...and every partition was cleaned by deadline
    assert all(c.reason == "max.compaction.lag.ms" for r in reports for c in r.cleaned)
    assert audits.oldest_ms <= MAX_LAG_MS + slack_ms, (
        f"oldest superseded record {audits.oldest_ms} ms ({audits.worst}), "
        f"allowed {MAX_LAG_MS} + {slack_ms} ms (period {period_ms}, cycle {cycle_ms}, "
        f"append wait {produced['worst_append_wait_ms']})"
    )
    print(
        f"cycles {len(reports)}, longest cycle {cycle_ms} ms, period {period_ms} ms, "
        f"append wait {produced['worst_append_wait_ms']} ms, slack {slack_ms} ms, "
        f"oldest superseded seen {audits.oldest_ms} ms (limit {MAX_LAG_MS + slack_ms} ms), "
        f"{audits.rounds} audit rounds ({audits.errors} retried)"
    )
    final = audit_log_dirs(cfg, now_ms=wall_clock_ms(), slack_ms=slack_ms, max_listed=5)
    assert final.violations == 0
    assert not final.errors
