"""Tests of the maintenance cycle end to end on real log dirs, with injected time."""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import os
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Final

import pytest
import yaml
from structlog.testing import capture_logs

from cleanerd.compaction.cleaner import Cleaner, CleanResult
from cleanerd.compaction.manager import config_fingerprint
from cleanerd.compaction.offset_map import OffsetMap
from cleanerd.config import Config, load_config
from cleanerd.daemon.metrics.model import build_snapshot
from cleanerd.engine.base import CleanJob, WorkerCrashed
from cleanerd.engine.local import LocalEngine, WorkerSettings
from cleanerd.engine.spark.engine import SparkJobFailed, SparkUnavailable
from cleanerd.errors import CleanerdError
from cleanerd.log.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
)
from cleanerd.log.files import CLEAN_SHUTDOWN_FILE_NAME, TopicPartition
from cleanerd.log.lock import PartitionLock, partition_locks
from cleanerd.log.log_dir import LogDir
from cleanerd.log.meta import PartitionMeta
from cleanerd.log.ownership import lock_holder
from cleanerd.log.partition_log import PartitionLog
from cleanerd.log.roller import first_seen_path, maybe_roll
from cleanerd.log.segment import LogSegment
from cleanerd.maintenance import cycle
from cleanerd.maintenance.cycle import Maintenance
from cleanerd.maintenance.report import CycleNews
from cleanerd.records.record import Record
from cleanerd.retention import executor
from cleanerd.retention.disk import DiskSpace
from cleanerd.retention.disk_usage import device_name
from tests.builders import build_log, encode_records, kv, offsets_and_values
from tests.compaction.crashing_ops import CrashingOps, SimulatedCrash
from tests.faults.workload import dir_state
from tests.holders import HOLD_BROKER_LOCK, HOLD_FLOCK, held_by_other_process

MIN = 60_000
HOUR = 60 * MIN
T0 = 1_700_000_000_000


def write_config(tmp_path: Path, topics: dict[str, dict[str, Any]], **broker: Any) -> Config:
    doc = {
        "log.dirs": [str(tmp_path / "logs")],
        "state_dir": str(tmp_path / "state"),
        "log.cleaner.dedupe.buffer.size": 4 * 1024 * 1024,
        "topics": topics,
        **broker,
    }
    path = tmp_path / "cleanerd.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_config(path)


def records(keys: range | list[int], ts: int, tag: str = "v") -> list[list[Record]]:
    """One batch per record, key `k<i>`."""
    return [[kv(f"k{i}", f"{tag}{i}", timestamp=ts)] for i in keys]


def build(
    tmp_path: Path, tp: TopicPartition, segments: list[list[list[Record]]], logs: str = "logs"
) -> Path:
    """The partition, its files last modified when their newest record was written (as
    if a producer had written them then)."""
    build_log(tmp_path / logs, segments, state_dir=tmp_path / "state", tp=tp)
    d = tmp_path / logs / str(tp)
    newest = max((r.timestamp for seg in segments for batch in seg for r in batch), default=T0)
    for f in d.iterdir():
        os.utime(f, ns=(newest * 1_000_000, newest * 1_000_000))
    return d


def mark_uncleanable(m: Maintenance, tp: TopicPartition, log_dir: Path, reason: str) -> None:
    """Mark `tp` uncleanable at T0 under its topic's current settings."""
    fingerprint = config_fingerprint(m.config.topic_config(tp.topic))
    m.manager.registry.mark(
        tp, log_dir=str(log_dir), reason=reason, now_ms=T0, config_fingerprint=fingerprint
    )


def values(d: Path, state: Path) -> list[tuple[int, bytes | None, bytes | None]]:
    return offsets_and_values(PartitionLog.open(d, state_dir=state, read_only=True))


@pytest.fixture(name="engine", scope="module")
def _engine() -> Iterator[LocalEngine]:
    with LocalEngine(WorkerSettings(workers=1, dedupe_buffer_size=4 * 1024 * 1024)) as engine:
        yield engine


def test_a_long_cycle_logs_its_progress(tmp_path: Path, engine: LocalEngine) -> None:
    """With a progress interval (0 here: every step is "long"), each phase logs
    `cycle.progress` with partitions done of the total, and the clean phase the passes
    finished and those running; without one (`cleanerd clean`) nothing is logged."""
    c, d = TopicPartition("c", 0), TopicPartition("d", 0)
    build(tmp_path, c, [records(range(6), T0 - 3 * HOUR) + records(range(3), T0 - 2 * HOUR)])
    build(tmp_path, d, [records(range(3), T0 - 3 * HOUR), records(range(3), T0)])
    topics = {
        "c": {"cleanup.policy": "compact", "max.compaction.lag.ms": HOUR},
        "d": {"cleanup.policy": "delete", "retention.ms": HOUR},
    }
    cfg = write_config(tmp_path, topics)
    with capture_logs() as quiet, Maintenance(cfg, engine, clock=lambda: T0) as m:
        m.run_once()
    assert not [e for e in quiet if e["event"] == "cycle.progress"]
    build(tmp_path, c, [records(range(6), T0 - 3 * HOUR) + records(range(3), T0 - 2 * HOUR)])
    with (
        capture_logs() as logs,
        Maintenance(cfg, engine, clock=lambda: T0, progress_interval_s=0) as m,
    ):
        m.run_once(threading.Event())
    lines = [e for e in logs if e["event"] == "cycle.progress"]
    by_phase = {phase: [e for e in lines if e["phase"] == phase] for phase in ("open", "roll")}
    assert [(e["done"], e["total"]) for e in by_phase["open"]] == [(0, 2), (1, 2)]
    assert [(e["done"], e["total"]) for e in by_phase["roll"]] == [(0, 2), (1, 2)]
    cleaning = [e for e in lines if e["phase"] == "clean"]
    assert cleaning
    assert cleaning[-1]["done"] == 1
    assert cleaning[-1]["running"] == []
    assert all(e["elapsed_s"] >= 0 for e in lines)


def test_a_cycle_after_a_crash_fsyncs_no_segment_its_clean_replaced(
    tmp_path: Path, engine: LocalEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crashed dir's segments above its recovery point are fsynced once, at the end of
    the cycle (the flush after a roll), not by the roll: a segment the cycle's clean
    replaced (its output fsynced by the swap) is never written out, and the recovery
    point checkpoint then holds the active segment's base."""
    c = TopicPartition("c", 0)
    d = build(tmp_path, c, [records(range(6), T0 - 3 * HOUR), records(range(3), T0 - 2 * HOUR)])
    for leftover in (RECOVERY_POINT_OFFSET_CHECKPOINT, CLEAN_SHUTDOWN_FILE_NAME):
        (tmp_path / "logs" / leftover).unlink(missing_ok=True)
    closed = (d / f"{0:020d}.log").stat().st_ino
    cfg = write_config(
        tmp_path,
        {"c": {"cleanup.policy": "compact", "max.compaction.lag.ms": HOUR}},
    )
    flushed: list[int] = []
    flush = LogSegment.flush

    def spy(self: LogSegment) -> None:
        flushed.append(self.log_path.stat().st_ino)
        flush(self)

    monkeypatch.setattr(LogSegment, "flush", spy)
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        report = m.run_once()
        recovery = OffsetCheckpointFile(tmp_path / "logs" / RECOVERY_POINT_OFFSET_CHECKPOINT)
        assert recovery.read() == {c: 9}
    assert [r.base_offset for r in report.rolled] == [6]
    assert [x.end_offset for x in report.cleaned] == [9]
    assert (d / f"{0:020d}.log").stat().st_ino != closed
    assert flushed
    assert closed not in flushed


def test_one_cycle_rolls_deletes_and_cleans(tmp_path: Path, engine: LocalEngine) -> None:
    """An idle compacted partition rolls by max lag and is cleaned at once (deadline),
    a delete topic loses its expired segment, and the report says so."""
    c, d = TopicPartition("c", 0), TopicPartition("d", 0)
    build(tmp_path, c, [records(range(6), T0 - 3 * HOUR) + records(range(3), T0 - 2 * HOUR)])
    build(tmp_path, d, [records(range(3), T0 - 3 * HOUR), records(range(3), T0)])
    cfg = write_config(
        tmp_path,
        {
            "c": {
                "cleanup.policy": "compact",
                "max.compaction.lag.ms": HOUR,
                "min.cleanable.dirty.ratio": 1.0,
            },
            "d": {"cleanup.policy": "delete", "retention.ms": HOUR},
        },
    )
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        report = m.run_once()
        unlinked = m.close(unlink_pending=True)
    assert [(r.tp, r.base_offset, r.reason) for r in report.rolled] == [
        (c, 0, "max.compaction.lag.ms")
    ]
    assert [(o.topic, [x.base_offset for x in o.deletions]) for o in report.retention] == [
        ("d", [0])
    ]
    assert [(x.tp, x.reason) for x in report.cleaned] == [(c, "max.compaction.lag.ms")]
    assert report.cleaned[0].overdue_ms == 2 * HOUR
    assert report.cleaned[0].end_offset == 9
    assert [v for _, _, v in values(tmp_path / "logs" / str(c), tmp_path / "state")] == [
        b"v3",
        b"v4",
        b"v5",
        b"v0",
        b"v1",
        b"v2",
    ]
    assert any(p.name.endswith(".log.deleted") for p in unlinked)
    doc = report.to_json()
    assert doc["cleaned"][0]["topic"] == "c"
    assert doc["deleted"][0]["reason"] == "retention.ms"


def test_a_topic_two_globs_match_fails_its_partitions_only(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """A topic created after the config was loaded that two `topics:` globs match: each
    of its partitions is a failed step naming the globs, left as it is, and the other
    partitions are maintained. The whole cycle failed, every cycle, so nothing was
    rolled, deleted or cleaned anywhere."""
    d, xy = TopicPartition("d", 0), TopicPartition("xy", 0)
    build(tmp_path, d, [records(range(3), T0 - 3 * HOUR), records(range(3), T0)])
    retain = {"cleanup.policy": "delete", "retention.ms": HOUR}
    cfg = write_config(tmp_path, {"d": retain, "x*": retain, "*y": retain})
    xy_dir = build(tmp_path, xy, [records(range(3), T0 - 3 * HOUR), records(range(3), T0)])
    before = dir_state(xy_dir)
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        report = m.run_once()
    assert [(o.topic, [x.base_offset for x in o.deletions]) for o in report.retention] == [
        ("d", [0])
    ]
    assert [(e.tp, e.phase, e.reason) for e in report.errors] == [
        (
            xy,
            "discover",
            "topics: topic 'xy' matches more than one glob: '*y' and 'x*'; add an exact "
            "entry for it or make the globs disjoint",
        )
    ]
    assert dir_state(xy_dir) == before


def test_a_roll_for_retention_is_counted_and_named_by_its_rule(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """Retention that takes every segment rolls the active one first: that roll is
    reported and counted (`cleanerd_segments_rolled_total`) under the rule that forced
    it, `retention.ms`, as the `segment.rolled` line names it. It was reported as
    "retention" and not counted."""
    d = TopicPartition("d", 0)
    build(tmp_path, d, [records(range(3), T0 - 3 * HOUR), records(range(3), T0 - 2 * HOUR)])
    cfg = write_config(
        tmp_path,
        {"d": {"cleanup.policy": "delete", "retention.ms": HOUR, "segment.ms": 100 * HOUR}},
    )
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        report = m.run_once()
        counted = m.counters.snapshot()
    assert [(r.tp, r.base_offset, r.reason) for r in report.rolled] == [(d, 3, "retention.ms")]
    assert dict(counted.segments_rolled) == {"retention.ms": 1}
    assert dict(counted.segments_deleted) == {"retention.ms": 2}
    assert report.to_json()["rolled"][0]["reason"] == "retention.ms"


HOLD_AS_PRODUCE = """
import sys
from pathlib import Path
from cleanerd.log.lock import LogDirLock, OwnerLock
log_dir, state_dir = Path(sys.argv[1]), Path(sys.argv[2])
LogDirLock(log_dir).acquire()
OwnerLock(state_dir, log_dir).acquire("produce")
print("ready", flush=True)
sys.stdin.read()
"""


def test_a_dir_a_one_shot_command_owns_at_the_start_is_taken_when_it_lets_go(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """A `produce` (named by the owner marker: its process's command line says nothing
    here) owns the dir as the cycle's owner opens: the open neither fails nor observes
    it for good; the dir is offline, saying who has it, and the next cycle after it let
    go takes it. The start failed (a daemon's start past its wait)."""
    tp = TopicPartition("t", 0)
    build(tmp_path, tp, [records(range(5), T0), records([0], T0)])
    logs = tmp_path / "logs"
    cfg = write_config(tmp_path, {"t": {"cleanup.policy": "compact"}})
    with held_by_other_process(HOLD_AS_PRODUCE, logs, tmp_path / "state"):
        m = Maintenance(cfg, engine, clock=lambda: T0)
        first = m.run_once()
    try:
        second = m.run_once()
    finally:
        m.close(unlink_pending=False)
    (offline,) = first.offline
    assert "is owned for now by another cleanerd process" in offline.reason
    assert "`cleanerd produce`), which lets go when it is done" in offline.reason
    assert not second.offline
    assert [s.meta.topic_partition for s in second.states] == [tp]


def test_a_dir_held_at_start_is_observed_and_owned_only_from_a_restart(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """A log dir whose `.lock` another process holds (`fcntl.lockf`, as a broker) is
    observed: its overdue partition is reported, nothing is written there. Once the
    holder lets go, it is still only observed, and the cycle says it is free: a broker
    that stopped to restart must find it free (the next cycle took it, and the broker's
    start failed on its lock). A reload does not take it either; a restart (a new
    `Maintenance`) owns the dir and rolls and cleans the partition."""
    c = TopicPartition("c", 0)
    d = build(tmp_path, c, [records(range(6), T0 - 3 * HOUR) + records(range(3), T0 - 2 * HOUR)])
    cfg = write_config(
        tmp_path, {"c": {"cleanup.policy": "compact", "max.compaction.lag.ms": HOUR}}
    )
    with held_by_other_process(HOLD_BROKER_LOCK, tmp_path / "logs"):
        m = Maintenance(cfg, engine, clock=lambda: T0)
        before = dir_state(d)
        held = m.run_once()
        assert held.observed == (str(tmp_path / "logs"),)
        assert (held.rolled, held.cleaned) == ((), ())
        (state,) = held.states
        assert state.ltc is not None
        assert state.ltc.compaction_delay_ms == 2 * HOUR
        assert dir_state(d) == before
    with m:
        with capture_logs() as logs:
            let_go = m.run_once()
            m.reloaded()
            reloaded = m.run_once()
        for report in (let_go, reloaded):
            assert report.observed == (str(tmp_path / "logs"),)
            assert (report.rolled, report.cleaned) == ((), ())
        assert dir_state(d) == before
        released = [e for e in logs if e["event"] == "log_dir.released"]
        assert released[0]["log_level"] == "warning"
        assert "restart cleanerd" in released[0]["hint"]
    with Maintenance(cfg, engine, clock=lambda: T0) as restarted:
        owned = restarted.run_once()
    assert owned.observed == ()
    assert [(r.tp, r.reason) for r in owned.rolled] == [(c, "max.compaction.lag.ms")]
    assert [x.tp for x in owned.cleaned] == [c]


def test_a_release_names_the_process_that_let_go(tmp_path: Path, engine: LocalEngine) -> None:
    """A dir held at start (a broker) is let go, then held and let go by another
    process (a one-shot `cleanerd clean` run beside it): each release names the process
    that let go. The second named the broker's pid from the start."""
    c = TopicPartition("c", 0)
    build(tmp_path, c, [records(range(3), T0)])
    cfg = write_config(tmp_path, {"c": {"cleanup.policy": "compact"}})
    pids = []
    with held_by_other_process(HOLD_BROKER_LOCK, tmp_path / "logs"):
        pids.append(lock_holder(tmp_path / "logs"))
        m = Maintenance(cfg, engine, clock=lambda: T0)
        m.run_once()
    released = []
    with m:
        with capture_logs() as logs:
            m.run_once()
        released += [e for e in logs if e["event"] == "log_dir.released"]
        with held_by_other_process(HOLD_FLOCK, tmp_path / "logs"):
            pids.append(lock_holder(tmp_path / "logs"))
            m.run_once()
        with capture_logs() as logs:
            m.run_once()
        released += [e for e in logs if e["event"] == "log_dir.released"]
    assert pids[0] != pids[1]
    assert [f"pid {pid} " in e["was_held_by"] for e in released for pid in pids] == [
        True,
        False,
        False,
        True,
    ]


def test_a_reload_retries_a_partition_marked_uncleanable(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """A pass that failed marks its partition uncleanable for an hour (a damaged batch
    here; a full disk in a trial). Once the cause is fixed, a reload (`reloaded`) has
    the next cycle try it again, and it is cleaned: a reload left the mark to expire."""
    c = TopicPartition("c", 0)
    d = build(tmp_path, c, [records(range(6), T0 - 3 * HOUR), records(range(3), T0 - 2 * HOUR)])
    cfg = write_config(tmp_path, {"c": {"cleanup.policy": "compact"}})
    segment = d / "00000000000000000000.log"
    good = segment.read_bytes()
    segment.write_bytes(good[:-1] + bytes([good[-1] ^ 0xFF]))  # the last batch's CRC fails
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        assert [f.tp for f in m.run_once().failed] == [c]
        segment.write_bytes(good)
        assert m.run_once().cleaned == ()  # still marked
        m.reloaded()
        with capture_logs() as logs:
            retried = m.run_once()
    assert [x.tp for x in retried.cleaned] == [c]
    assert [e["partitions"] for e in logs if e["event"] == "uncleanable.retried"] == [["c-0"]]


def test_overdue_logs_are_cleaned_first_most_overdue_first(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """One worker: the most overdue log, then the less overdue one, then the dirtiest
    log without a deadline, whatever their dirtiness."""
    late, later, dirty = TopicPartition("a", 0), TopicPartition("b", 0), TopicPartition("z", 0)
    build(tmp_path, late, [records([0, 1], T0 - 5 * HOUR), records([9], T0)])
    build(tmp_path, later, [records([0, 1], T0 - 3 * HOUR), records([9], T0)])
    build(tmp_path, dirty, [records([0] * 20, T0), records([9], T0)])
    lag = {"cleanup.policy": "compact", "max.compaction.lag.ms": HOUR}
    cfg = write_config(
        tmp_path,
        {"a": lag, "b": lag, "z": {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.1}},
    )
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        report = m.run_once()
    assert [x.tp for x in report.cleaned] == [late, later, dirty]
    assert [x.overdue_ms for x in report.cleaned] == [4 * HOUR, 2 * HOUR, 0]


def test_max_lag_forces_cleaning_only_at_the_deadline(tmp_path: Path, engine: LocalEngine) -> None:
    """Scenario 56 with injected time: ratio 1.0, min lag 1 h, max lag 6 h. Nothing is
    cleaned after 3 h; after 6 h the first block is (the idle active segment rolls by
    the deadline); a second block written then is cleaned only 6 h later."""
    tp = TopicPartition("t", 0)
    dirs = tmp_path / "logs" / str(tp)
    build(tmp_path, tp, [records(list(range(100)) * 3, T0)])
    cfg = write_config(
        tmp_path,
        {
            "t": {
                "cleanup.policy": "compact",
                "min.cleanable.dirty.ratio": 1.0,
                "min.compaction.lag.ms": HOUR,
                "max.compaction.lag.ms": 6 * HOUR,
            }
        },
    )
    now = [T0 + 3 * HOUR]
    with Maintenance(cfg, engine, clock=lambda: now[0]) as m:
        assert not m.run_once().cleaned
        now[0] = T0 + 6 * HOUR + 1
        report = m.run_once()
        assert [x.end_offset for x in report.cleaned] == [300]
        plog = PartitionLog.open(dirs, state_dir=tmp_path / "state")
        for batch in records([0] * 100, now[0], tag="zero"):
            plog.append(batch)
        assert not m.run_once().cleaned  # the second block is not overdue yet
        now[0] += 6 * HOUR + 1
        report = m.run_once()
        assert [x.end_offset for x in report.cleaned] == [400]
    kept = values(dirs, tmp_path / "state")
    assert len(kept) == 100
    assert kept[-1][2] == b"zero0"
    assert OffsetCheckpointFile(tmp_path / "logs" / CLEANER_OFFSET_CHECKPOINT).read() == {tp: 400}


def test_cleaner_driven_retention_skips_delete_and_uncleanable_logs(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """Scenario 48 end to end: which logs get cleaner-driven retention (here the
    log-start-offset rule): compacted ones, not one marked uncleanable. A delete topic
    gets its own retention in the same step, at every cycle (cleanerd's retention
    acts when due, not at the next `log.retention.check.interval.ms`)."""
    topics = {
        "del": {"cleanup.policy": "delete"},
        "cd": {"cleanup.policy": "compact,delete"},
        "c": {"cleanup.policy": "compact"},
        "bad": {"cleanup.policy": "compact"},
    }
    for name in topics:
        build(tmp_path, TopicPartition(name, 0), [records([0], T0), records([1], T0), []])
    OffsetCheckpointFile(tmp_path / "logs" / LOG_START_OFFSET_CHECKPOINT).write(
        {TopicPartition(name, 0): 1 for name in topics}
    )
    cfg = write_config(tmp_path, topics)
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        bad = TopicPartition("bad", 0)
        mark_uncleanable(m, bad, tmp_path / "logs", "test")
        report = m.run_once()
    assert sorted(o.topic for o in report.retention) == ["c", "cd", "del"]
    assert [(s.tp, s.reason) for s in report.skipped if s.phase == "retention"] == [
        (bad, "partition is uncleanable")
    ]


def test_uncleanable_partitions_and_their_bytes_reach_the_metrics(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """Scenario 57: two of three partitions have garbage in their last rolled segment:
    both are marked, uncleanable bytes are their cleanable bytes; once one partition is
    removed the count drops to 1."""
    tps = [TopicPartition("t", p) for p in range(3)]
    for tp in tps:
        build(tmp_path, tp, [records(range(100), T0), records(range(100), T0), records([0], T0)])
    for tp in tps[1:]:
        # Between the first batch and the last index entry: the log layer reads the
        # segment's first batch and its tail without meeting it; the pass, which checks
        # every CRC, does.
        seg = tmp_path / "logs" / str(tp) / "00000000000000000100.log"
        data = bytearray(seg.read_bytes())
        data[30 * 72 + 65] ^= 0xFF  # inside the records of batch 30: its CRC fails
        seg.write_bytes(bytes(data))
    cfg = write_config(tmp_path, {"t": {"cleanup.policy": "compact"}})
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        report = m.run_once()
        assert sorted(f.tp for f in report.failed) == tps[1:]
        # The reason is the error's own text, which names the file and position.
        assert all(f.reason.startswith("corrupt record batch in ") for f in report.failed)
        snap = build_snapshot(now_ms=T0, partitions=report.states, uncleanable=m.manager.registry)
        assert snap.uncleanable_partitions == 2
        sizes = [
            sum(
                p.stat().st_size
                for p in (tmp_path / "logs" / str(tp)).glob("*.log")
                if not p.name.startswith("00000000000000000200")
            )
            for tp in tps[1:]
        ]
        assert snap.uncleanable_bytes == sum(sizes)
        shutil.rmtree(tmp_path / "logs" / str(tps[2]))
        report = m.run_once()
        snap = build_snapshot(now_ms=T0, partitions=report.states, uncleanable=m.manager.registry)
        assert snap.uncleanable_partitions == 1


@pytest.mark.parametrize("mode", ["owner", "observe"])
def test_a_partition_that_cannot_be_opened_is_reported_unreadable_and_counted(
    tmp_path: Path, engine: LocalEngine, mode: str
) -> None:
    """A partition the cycle cannot open (a symbolic link in its dir, refused in every
    mode) has no state, so no delay or size gauge sees it: the report lists it as
    unreadable (in `--json` too), the metrics count it in its log dir, and the cycle is
    not an idle one. Owned, its open is a failed step as well; observed, it is not (a
    broker may have been changing it)."""
    good, bad = TopicPartition("c", 0), TopicPartition("c", 1)
    build(tmp_path, good, [records(range(3), T0)])
    bad_dir = build(tmp_path, bad, [records(range(3), T0)])
    (tmp_path / "elsewhere").write_bytes(b"")
    (bad_dir / "00000000000000000099.snapshot").symlink_to(tmp_path / "elsewhere")
    observe = {"mode": "observe"} if mode == "observe" else {}
    cfg = write_config(tmp_path, {"c": {"cleanup.policy": "compact"}}, **observe)
    logs = str(tmp_path / "logs")
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        report = m.run_once()
    assert [s.meta.topic_partition for s in report.states] == [good]
    (unread,) = report.unreadable
    assert (unread.log_dir, unread.tp, unread.policy) == (logs, bad, ("compact",))
    assert "00000000000000000099.snapshot" in unread.reason
    assert [e.tp for e in report.errors] == ([bad] if mode == "owner" else [])
    assert not report.idle  # the daemon logs the cycle at info: something is wrong
    assert report.to_json()["unreadable"] == [
        {
            "log_dir": logs,
            "topic": "c",
            "partition": 1,
            "cleanup_policy": ["compact"],
            "reason": unread.reason,
        }
    ]
    snap = build_snapshot(
        now_ms=T0, partitions=report.states, log_dirs=[logs], unreadable=report.unreadable
    )
    (counted,) = snap.log_dirs
    assert (counted.partitions, counted.unreadable_partitions) == (2, 1)


def test_an_observed_partition_unreadable_two_cycles_in_a_row_is_a_warning_once(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """An observed partition that cannot be read is logged at debug the first time (a
    broker was changing it, most often), with a warning naming the error once it is met
    again in the next cycle, and not again after: damage beside a broker was said only
    at debug."""
    bad = TopicPartition("c", 1)
    bad_dir = build(tmp_path, bad, [records(range(3), T0)])
    (tmp_path / "elsewhere").write_bytes(b"")
    (bad_dir / "00000000000000000099.snapshot").symlink_to(tmp_path / "elsewhere")
    cfg = write_config(tmp_path, {"c": {"cleanup.policy": "compact"}}, mode="observe")
    warned = []
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        for _ in range(3):
            with capture_logs() as logs:
                m.run_once()
            warned.append([e for e in logs if e["log_level"] == "warning"])
    assert [e["event"] for e in warned[0] + warned[2] if e["event"].startswith("observe.")] == []
    (warning,) = (e for e in warned[1] if e["event"].startswith("observe."))
    assert (warning["event"], warning["topic"], warning["partition"]) == (
        "observe.unreadable",
        "c",
        1,
    )
    assert "00000000000000000099.snapshot" in warning["error"]


def test_an_observed_partition_deleted_as_it_is_read_is_gone_not_unreadable(
    tmp_path: Path, engine: LocalEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker deletes an observed partition's topic while the cycle reads it: the
    partition is gone (no state, logged at info), not an unreadable one, which the
    unreadable-partitions gauge counted for a cycle at each topic deletion."""
    gone, kept = TopicPartition("c", 1), TopicPartition("c", 2)
    gone_dir = build(tmp_path, gone, [records(range(3), T0)])
    build(tmp_path, kept, [records(range(3), T0)])
    cfg = write_config(tmp_path, {"c": {"cleanup.policy": "compact"}}, mode="observe")
    opened = LogDir.open_partition

    def deleted_as_read(self: LogDir, tp: TopicPartition, **kwargs: Any) -> PartitionLog:
        if tp == gone:
            shutil.rmtree(gone_dir)
        return opened(self, tp, **kwargs)

    monkeypatch.setattr(LogDir, "open_partition", deleted_as_read)
    with Maintenance(cfg, engine, clock=lambda: T0) as m, capture_logs() as logs:
        report = m.run_once()
    assert report.unreadable == ()
    assert [s.meta.topic_partition for s in report.states] == [kept]
    (said,) = (e for e in logs if e["event"] == "observe.partition_gone")
    assert (said["log_level"], said["partition"]) == ("info", 1)


@pytest.mark.parametrize("marked_before", [False, True])
def test_a_compacted_partition_whose_metadata_cannot_be_read_is_unreadable(
    tmp_path: Path, engine: LocalEngine, marked_before: bool
) -> None:
    """A compacted partition whose segments' metadata cannot be read (a bad CRC in the
    first batch of a rolled segment) is marked uncleanable and has no state: it is
    listed unreadable too, with this error (not the reason of an earlier mark), so its
    log dir's gauges count it, and the cycle is not an idle one."""
    tp = TopicPartition("t", 0)
    build(tmp_path, tp, [records(range(100), T0), records(range(100), T0), records([0], T0)])
    seg = tmp_path / "logs" / str(tp) / "00000000000000000100.log"
    data = bytearray(seg.read_bytes())
    data[65] ^= 0xFF  # inside the records of the first batch: its CRC fails
    seg.write_bytes(bytes(data))
    cfg = write_config(tmp_path, {"t": {"cleanup.policy": "compact"}})
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        if marked_before:
            mark_uncleanable(m, tp, tmp_path / "logs", "an earlier pass failed")
        report = m.run_once()
        assert report.states == ()
        assert [f.tp for f in report.failed] == ([] if marked_before else [tp])
        (unread,) = report.unreadable
        assert unread.tp == tp
        assert "CRC mismatch" in unread.reason
        assert str(seg) in unread.reason
        assert not report.idle
        snap = build_snapshot(
            now_ms=T0,
            partitions=report.states,
            uncleanable=m.manager.registry,
            unreadable=report.unreadable,
        )
    (counted,) = snap.log_dirs
    assert (counted.partitions, counted.unreadable_partitions) == (1, 1)
    assert counted.uncleanable_partitions == 1


def _damage_first_batch(segment: Path) -> None:
    """Flip a byte inside the records of `segment`'s first batch (its CRC fails there),
    keeping the file's mtime."""
    st = segment.stat()
    data = bytearray(segment.read_bytes())
    data[65] ^= 0xFF
    segment.write_bytes(bytes(data))
    os.utime(segment, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_retention_deletes_the_expired_segments_older_than_a_damaged_one(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """A bad CRC in the first batch of a rolled segment of a `delete` topic: the expired
    segment before it is still deleted on time, the damaged one and those after it
    stay, the warning names it, and retention is not a failed step. Before, the whole
    partition's metadata failed and nothing was deleted: a legal deletion missed for as
    long as the damage stayed."""
    tp = TopicPartition("d", 0)
    d = build(
        tmp_path,
        tp,
        [records(range(100), T0 - 5 * HOUR), records(range(100), T0 - 4 * HOUR), records([0], T0)],
    )
    for f in d.glob("00000000000000000[01]00.*"):
        os.utime(f, ns=((T0 - 4 * HOUR) * 1_000_000,) * 2)
    damaged = d / "00000000000000000100.log"
    _damage_first_batch(damaged)
    cfg = write_config(tmp_path, {"d": {"cleanup.policy": "delete", "retention.ms": HOUR}})
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        with capture_logs() as logs:
            report = m.run_once()
        with capture_logs() as again:
            m.run_once()
    ((outcome),) = report.retention
    assert [x.base_offset for x in outcome.deletions] == [0]
    assert (outcome.damaged_base, outcome.log_start_offset) == (100, 100)
    assert sorted(f.name for f in d.glob("*.log")) == [damaged.name, "00000000000000000200.log"]
    assert "retention" not in [e.phase for e in report.errors]
    (warning,) = [e for e in logs if e["event"] == "retention.stopped_at_damage"]
    assert (warning["base_offset"], warning["path"]) == (100, str(damaged))
    assert warning["log_level"] == "warning"
    # The next cycle meets the same damage: logged at debug (which the test setup may
    # drop), not as a new warning.
    for event in ("retention.stopped_at_damage", "partition.unreadable"):
        assert [e["log_level"] for e in logs if e["event"] == event] == ["warning"]
        assert {e["log_level"] for e in again if e["event"] == event} <= {"debug"}
    (unread,) = report.unreadable
    assert str(damaged) in unread.reason


def test_a_damaged_partition_does_not_stop_disk_usage(tmp_path: Path, engine: LocalEngine) -> None:
    """Above log.retention.disk.usage.percent, one partition with a damaged segment gives
    its segments older than the damage and nothing after it, and every other partition
    gives its oldest ones. Before, its metadata error escaped the disk-usage step and
    failed the whole cycle, every cycle: a full disk stayed full."""
    bad, good = TopicPartition("bad", 0), TopicPartition("good", 0)
    for tp, age in ((bad, 6), (good, 5)):
        segments = [records(range(20), T0 - age * HOUR), records(range(20), T0 - (age - 2) * HOUR)]
        build(tmp_path, tp, [*segments, records(range(20), T0 - 3 * HOUR), records([0], T0)])
    damaged = tmp_path / "logs" / str(bad) / "00000000000000000020.log"
    _damage_first_batch(damaged)
    logs = tmp_path / "logs"

    def used() -> int:
        return sum(p.stat().st_size for p in logs.rglob("*") if p.is_file())

    total = used() * 100 // 95

    def probe(_path: Path) -> DiskSpace:
        return DiskSpace(total, used())

    topics = {"bad": {"cleanup.policy": "delete"}, "good": {"cleanup.policy": "delete"}}
    cfg = write_config(tmp_path, topics, **{"log.retention.disk.usage.percent": 10})
    with Maintenance(cfg, engine, clock=lambda: T0, usage_probe=probe) as m:
        report = m.run_once()
    disk = report.disk_usage
    assert disk is not None
    assert [(x.topic_partition, x.base_offset) for x in disk.deletions] == [
        (bad, 0),
        (good, 0),
        (good, 20),
        (good, 40),
    ]
    assert disk.still_above
    assert damaged.exists()


def test_a_partition_disk_usage_cannot_read_is_warned_about_once(
    tmp_path: Path, engine: LocalEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above log.retention.disk.usage.percent, a partition whose segments cannot be read
    (EIO here) offers nothing and the others are deleted from; the cycle meets it again
    at every check, and warns once while the error stays the same (it was a warning at
    every round of every cycle), naming it in the report each time."""
    bad, good = TopicPartition("bad", 0), TopicPartition("good", 0)
    for tp in (bad, good):
        build(tmp_path, tp, [records(range(20), T0 - 5 * HOUR), records([0], T0)])
    original = PartitionLog.readable_meta

    def sick(self: PartitionLog) -> PartitionMeta:
        if self.topic_partition == bad:
            raise OSError(errno.EIO, "Input/output error", str(self.dir))
        return original(self)

    monkeypatch.setattr(PartitionLog, "readable_meta", sick)
    probe = lambda _path: DiskSpace(100, 99, 4096)  # noqa: E731 (above, whatever is deleted)
    topics = {"bad": {"cleanup.policy": "delete"}, "good": {"cleanup.policy": "delete"}}
    cfg = write_config(tmp_path, topics, **{"log.retention.disk.usage.percent": 50})
    with (
        Maintenance(cfg, engine, clock=lambda: T0, usage_probe=probe) as m,
        capture_logs() as logs,
    ):
        reports = [m.run_once() for _ in range(3)]
    disks = [r.disk_usage for r in reports if r.disk_usage is not None]
    assert len(disks) == 3
    for disk in disks:
        assert [(d, tp) for d, tp, _ in disk.unreadable] == [(str(tmp_path / "logs"), bad)]
    assert [(x.topic_partition, x.base_offset) for x in disks[0].deletions] == [(good, 0)]
    # At debug after the first (which the suite's logging setup may filter out).
    unread = [e for e in logs if e["event"] == "disk_usage.partition_unreadable"]
    assert [e["log_level"] for e in unread if e["log_level"] != "debug"] == ["warning"]
    assert "Input/output error" in unread[0]["error"]
    # The device stays above its threshold all along: said once too, by its name (it was
    # a warning at every cycle, naming the device by its raw number).
    pressure = [e for e in logs if e["event"] == "disk.pressure"]
    assert [e["log_level"] for e in pressure if e["log_level"] != "debug"] == ["warning"]
    assert pressure[0]["device"] == device_name(disks[0].before[0].device)
    assert ":" in pressure[0]["device"]


SEGMENT_FILES: Final = (".log", ".index", ".timeindex")


def test_disk_pressure_says_when_other_files_fill_the_device(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """A device that stays above its threshold because files outside the log dirs fill
    it is said to be so, with the log dirs' bytes: 'nothing deletable is left' sent the
    operator looking for Kafka data that was not there."""
    tp = TopicPartition("t", 0)
    build(tmp_path, tp, [records(range(20), T0 - 5 * HOUR), records([0], T0)])
    logs = tmp_path / "logs"
    in_logs = sum(p.stat().st_size for p in (logs / str(tp)).glob("*.log"))
    other = 100 * in_logs  # foreign files, 100 times the log bytes, on the same device

    def probe(_path: Path) -> DiskSpace:
        used = sum(p.stat().st_size for p in (logs / str(tp)).glob("*.log"))
        return DiskSpace(4 * other, other + used)

    cfg = write_config(
        tmp_path, {"t": {"cleanup.policy": "delete"}}, **{"log.retention.disk.usage.percent": 10}
    )
    with (
        Maintenance(cfg, engine, clock=lambda: T0, usage_probe=probe) as m,
        capture_logs() as logs_,
    ):
        report = m.run_once()
    assert report.disk_usage is not None
    assert report.disk_usage.still_above
    (pressure,) = [e for e in logs_ if e["event"] == "disk.pressure"]
    assert pressure["log_dirs_bytes"] == sum(
        p.stat().st_size for p in (logs / str(tp)).glob("*") if p.suffix in SEGMENT_FILES
    )
    assert pressure["consequence"].startswith("other files fill the device")


def test_a_dry_run_says_once_what_it_would_delete_and_that_it_deleted_nothing(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """`disk_usage.dry_run` above the threshold: the segments it would delete are logged
    at info once (at debug while the device stays above), nothing is deleted, and the
    pressure line says the device would stay above even after those deletions, and the
    cycle counts as idle (its `cycle.done` at debug). The same lines came at info at every
    check, and 'nothing deletable is left' beside 4 deletable segments."""
    tp = TopicPartition("t", 0)
    build(tmp_path, tp, [records(range(5), T0 - 5 * HOUR), records([0], T0)])
    part = tmp_path / "logs" / str(tp)
    before = dir_state(part)

    block = 4096  # tiny segments on a file system of 4 KiB blocks
    log_bytes = sum(-(-f.stat().st_size // block) * block for f in part.iterdir())
    other = 100_000  # other files, just over the threshold (half of the device) alone

    def probe(_path: Path) -> DiskSpace:
        return DiskSpace(2 * other - 2, other + log_bytes, block)

    cfg = write_config(
        tmp_path,
        {"t": {"cleanup.policy": "delete"}},
        **{"log.retention.disk.usage.percent": 50, "disk_usage": {"dry_run": True}},
    )
    with Maintenance(cfg, engine, clock=lambda: T0, usage_probe=probe) as m:
        cycles = []
        for _ in range(2):
            with capture_logs() as logs:
                report = m.run_once()
            cycles.append(logs)
    levels = [
        [e["log_level"] for e in c if e["event"] == "disk_usage.would_delete"] for c in cycles
    ]
    # (A test before may have set the level to info: the repeat's debug line is dropped.)
    assert levels in ([["info"], ["debug"]], [["info"], []])
    assert report.disk_usage is not None
    assert report.disk_usage.dry_run
    assert [d.base_offset for d in report.disk_usage.deletions] == [0]
    # Nothing else to say: the daemon logs the cycle at debug, not at every backoff.
    assert report.idle
    (pressure,) = [e for e in cycles[0] if e["event"] == "disk.pressure"]
    assert pressure["consequence"] == (
        "dry run: above even after the 1 deletion it would make (other files fill the "
        "device: without a byte of the log dirs it would still be above the threshold)"
    )
    # What the log dirs would take after the deletion, in the blocks a deletion frees
    # (it was their `.log` bytes less the deletion's blocks: below 0 for tiny segments).
    kept = [f for f in part.iterdir() if f.suffix in SEGMENT_FILES]
    (deletion,) = report.disk_usage.deletions
    assert pressure["log_dirs_bytes"] == (
        sum(-(-f.stat().st_size // block) * block for f in kept) - deletion.freed_bytes
    )
    assert pressure["log_dirs_bytes"] > 0
    assert dir_state(part) == before


def test_the_states_say_when_data_outlived_its_retention(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """A delete-policy partition whose expired data a segment with a future timestamp
    keeps (Kafka's rule deletes nothing from it on) carries, in the cycle's states, when
    that data outlived retention.ms: what the retention gauges show; a compacted
    partition carries none."""
    d, c = TopicPartition("d", 0), TopicPartition("c", 0)
    build(
        tmp_path,
        d,
        [records(range(3), T0 + HOUR), records(range(3), T0 - 5 * HOUR), records([0], T0)],
    )
    build(tmp_path, c, [records(range(3), T0 - 5 * HOUR), records([0], T0)])
    topics: dict[str, dict[str, Any]] = {
        "d": {"cleanup.policy": "delete", "retention.ms": HOUR},
        "c": {"cleanup.policy": "compact"},
    }
    cfg = write_config(tmp_path, topics)
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        report = m.run_once()
    assert all(not r.deletions for r in report.retention)  # the future timestamp holds
    states = {s.meta.topic: s for s in report.states}
    assert states["d"].retention_due_ms == T0 - 4 * HOUR
    assert states["d"].retention_overdue_ms(T0) == 4 * HOUR
    assert states["c"].retention_due_ms is None


def _replace_lock_file(logs: Path) -> None:
    """Put another file where the log dir's `.lock` is (renamed over it: as a broker
    starting over a removed lock file, or a disk mounted again, shows it)."""
    fresh = logs.parent / "lock.new"
    fresh.write_bytes(b"")
    fresh.replace(logs / ".lock")


@contextlib.contextmanager
def _owner_whose_lock_file_was_replaced(
    tmp_path: Path, engine: LocalEngine
) -> Iterator[tuple[Maintenance, Path]]:
    """An owner of a compacted partition past its first cycle, whose log dir's `.lock`
    was then replaced by another file: the owner and the log dir."""
    build(tmp_path, TopicPartition("t", 0), [records(range(20), T0 - 5 * HOUR), records([0], T0)])
    logs = tmp_path / "logs"
    cfg = write_config(tmp_path, {"t": {"cleanup.policy": "compact"}})
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        m.run_once()
        _replace_lock_file(logs)
        yield m, logs


def test_a_dir_whose_lock_another_process_took_is_written_nothing_more(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """Once another process holds the dir's `.lock` (the file replaced, then locked, as a
    broker starting over a removed lock file would), the owner's next cycle leaves the
    dir alone (offline, naming the holder) and its clean stop writes nothing there: no
    snapshot, no checkpoint, no clean-shutdown marker (which would let that process skip
    its recovery). It wrote all three at its stop."""
    with (
        _owner_whose_lock_file_was_replaced(tmp_path, engine) as (m, logs),
        held_by_other_process(HOLD_BROKER_LOCK, logs),
    ):
        before = {p: p.stat().st_mtime_ns for p in logs.rglob("*") if p.name != ".lock"}
        errors = m.checkpoint(clean_stop=True)  # a stop right after the other took it
        report = m.run_once()
        m.checkpoint(clean_stop=True)
        after = {p: p.stat().st_mtime_ns for p in logs.rglob("*") if p.name != ".lock"}
    assert [o.log_dir for o in report.offline] == [str(logs)]
    assert "is no longer held by its owner" in report.offline[0].reason
    assert [type(e).__name__ for e in errors] == ["OwnershipLost"]
    assert after == before
    assert not (logs / ".kafka_cleanshutdown").exists()


def test_a_dir_whose_lock_file_was_replaced_says_so_and_waits_for_a_restart(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """The dir's `.lock` is another file than the one the owner locked, and nobody holds
    it (its disk unmounted and mounted again under the daemon): the dir is offline, the
    reason saying what happened and that a restart takes it again, and it stays so (the
    owner cannot tell the same dir from another's). It said only 'nobody holds it'."""
    with _owner_whose_lock_file_was_replaced(tmp_path, engine) as (m, logs):
        reports = [m.run_once(), m.run_once()]
    for report in reports:
        (offline,) = report.offline
        assert offline.reason == (
            f"{logs / '.lock'} is no longer the file this process locked, and nobody holds "
            "it: the dir or its .lock was replaced or removed, or its disk unmounted and "
            "mounted again; nothing is changed in its name (a restart of cleanerd takes it "
            "again, the operator's word that it is the same dir)"
        )


class _Wrapping:
    """An engine that hands every call to the local engine `inner`; a test's engine
    changes what its test needs."""

    def __init__(self, inner: LocalEngine) -> None:
        self.inner = inner
        self.name, self.workers, self.dead_workers = "local", 1, 0

    def submit_clean(self, job: CleanJob) -> Future[CleanResult]:
        return self.inner.submit_clean(job)

    def flush(self) -> None:
        self.inner.flush()

    def abort(self, tp: TopicPartition) -> bool:
        return self.inner.abort(tp)

    def shutdown(self, *, abort: bool = False) -> None:
        self.inner.shutdown(abort=abort)


class _StopWhileSwapping(_Wrapping):
    """An engine that holds the partition lock from the submission (so the pass waits
    at its first swap) and sets `stop` at once; the cycle's abort releases the lock."""

    def __init__(self, inner: LocalEngine, stop: threading.Event, lock: PartitionLock) -> None:
        super().__init__(inner)
        self.stop, self.lock = stop, lock

    def submit_clean(self, job: CleanJob) -> Future[CleanResult]:
        self.lock.acquire()
        future = self.inner.submit_clean(job)
        self.stop.set()
        return future

    def abort(self, tp: TopicPartition) -> bool:
        aborted = self.inner.abort(tp)
        self.lock.release()
        return aborted


def test_stop_aborts_the_pass_in_flight(tmp_path: Path, engine: LocalEngine) -> None:
    """Setting the stop event during cleaning aborts the running pass before its next
    group; the cycle returns with `aborted` and leaves no state behind."""
    tp = TopicPartition("t", 0)
    d = build(tmp_path, tp, [records(range(10), T0)] * 4 + [records([0], T0)])
    tail = {p.name: p.read_bytes() for p in d.glob("*.log") if not p.name.startswith("0" * 20)}
    cfg = write_config(tmp_path, {"t": {"cleanup.policy": "compact", "segment.bytes": 800}})
    stop = threading.Event()
    lock = PartitionLock(tmp_path / "state", tmp_path / "logs", tp)
    with (
        capture_logs() as logs,
        Maintenance(cfg, _StopWhileSwapping(engine, stop, lock), clock=lambda: T0) as m,
    ):
        report = m.run_once(stop)
        assert report.aborted
        assert not report.cleaned
        assert m.manager.state(tp) is None
    # The pass the stop cut short is named.
    aborted = [(e["topic"], e["partition"]) for e in logs if e["event"] == "clean.aborted"]
    assert aborted == [("t", 0)]
    assert not (tmp_path / "logs" / CLEANER_OFFSET_CHECKPOINT).exists()
    assert {p.name: p.read_bytes() for p in d.glob("*.log") if p.name in tail} == tail


def test_second_copy_and_observed_dirs_are_left_alone(tmp_path: Path, engine: LocalEngine) -> None:
    """A topic-partition already seen in another log dir, and a log dir another process
    holds, are reported as skipped."""
    tp = TopicPartition("t", 0)
    build(tmp_path, tp, [records([0, 0], T0), records([1], T0)], logs="logs")
    build(tmp_path, tp, [records([0, 0], T0), records([1], T0)], logs="logs2")
    build(tmp_path, TopicPartition("u", 0), [records([0], T0)], logs="logs3")
    cfg = write_config(tmp_path, {"t": {"cleanup.policy": "compact"}})
    cfg = cfg.model_copy(
        update={"log_dirs": tuple(str(tmp_path / n) for n in ("logs", "logs2", "logs3"))}
    )
    with (
        LogDir.open(tmp_path / "logs3", state_dir=tmp_path / "other-state"),
        Maintenance(cfg, engine, clock=lambda: T0) as m,
    ):
        report = m.run_once()
    skipped = {(s.log_dir, str(s.tp)): s.reason for s in report.skipped}
    assert skipped[(str(tmp_path / "logs2"), "t-0")] == f"also in log dir {tmp_path / 'logs'}"
    held = skipped[(str(tmp_path / "logs3"), "None")]
    lock = tmp_path / "logs3" / ".lock"
    assert held == f"{lock} is held by pid {os.getpid()} (a running Kafka broker?): observed only"
    assert [x.log_dir for x in report.cleaned] == [str(tmp_path / "logs")]


def test_a_stale_copy_in_a_dir_that_comes_online_does_not_replace_the_maintained_one(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """The first log dir is missing at the start, and `t-0` is maintained in the second;
    the first comes online holding an older copy of `t-0`: the maintained copy stays,
    even over a cycle that finds its dir offline, and the other is left alone and said
    to be a duplicate. The first dir's copy silently took over, being first in the
    config."""
    tp = TopicPartition("t", 0)
    build(tmp_path, tp, [records([0, 1], T0), records([2], T0)], logs="logs2")
    cfg = write_config(tmp_path, {"t": {"cleanup.policy": "compact"}})
    cfg = cfg.model_copy(update={"log_dirs": (str(tmp_path / "logs"), str(tmp_path / "logs2"))})
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        first = m.run_once()
        build(tmp_path, tp, [records([0], T0 - HOUR)], logs="logs")  # the stale copy comes
        with capture_logs() as logs:
            second = m.run_once()
        (tmp_path / "logs2").rename(tmp_path / "away")  # offline for a cycle
        third = m.run_once()
        (tmp_path / "away").rename(tmp_path / "logs2")
        fourth = m.run_once()
    assert [s.meta.log_dir for s in first.states] == [str(tmp_path / "logs2")]
    assert [s.meta.log_dir for s in second.states] == [str(tmp_path / "logs2")]
    assert ([o.log_dir for o in third.offline], third.states) == ([str(tmp_path / "logs2")], ())
    assert [s.meta.log_dir for s in fourth.states] == [str(tmp_path / "logs2")]
    skipped = {(s.log_dir, str(s.tp)): s.reason for s in second.skipped}
    assert skipped[(str(tmp_path / "logs"), "t-0")] == f"also in log dir {tmp_path / 'logs2'}"
    (warned,) = [e for e in logs if e["event"] == "partition.duplicate"]
    assert (warned["log_dir"], warned["maintained_in"]) == (
        str(tmp_path / "logs"),
        str(tmp_path / "logs2"),
    )


def test_partition_that_cannot_be_opened_is_reported_and_the_others_go_on(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """A symlinked partition dir is reported in `errors` with the reason, every cycle,
    is not counted as an uncleanable pass (the daemon's events and metrics stay as they
    were), and the other partitions are cleaned; nothing happens at the link's target."""
    tp = TopicPartition("t", 0)
    build(tmp_path, tp, [records([0, 0], T0), records([1], T0)])
    victim = tmp_path / "outside" / "victim"
    victim.mkdir(parents=True)
    (victim / "00000000000000000000.log.deleted").write_bytes(b"keep me")
    (tmp_path / "logs" / "evil-0").symlink_to(victim)
    cfg = write_config(tmp_path, {"*": {"cleanup.policy": "compact"}})
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        reports = [m.run_once(), m.run_once()]
    for report in reports:
        assert [(e.log_dir, e.tp, e.phase) for e in report.errors] == [
            (str(tmp_path / "logs"), TopicPartition("evil", 0), "open")
        ]
        assert "is a symlink to" in report.errors[0].reason
        assert report.failed == ()
    assert [c.tp for c in reports[0].cleaned] == [tp]
    assert reports[0].to_json()["errors"] == [
        {
            "log_dir": str(tmp_path / "logs"),
            "topic": "evil",
            "partition": 0,
            "phase": "open",
            "reason": reports[0].errors[0].reason,
        }
    ]
    assert [p.name for p in victim.iterdir()] == ["00000000000000000000.log.deleted"]


def _two_dirs(tmp_path: Path) -> tuple[Config, TopicPartition, TopicPartition]:
    """Log dirs `logs` (t-0) and `logs2` (t-1), each partition with a superseded key."""
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    build(tmp_path, a, [records([0, 0], T0), records([1], T0)], logs="logs")
    build(tmp_path, b, [records([0, 0], T0), records([1], T0)], logs="logs2")
    cfg = write_config(tmp_path, {"t": {"cleanup.policy": "compact"}})
    dirs = tuple(str(tmp_path / n) for n in ("logs", "logs2"))
    return cfg.model_copy(update={"log_dirs": dirs}), a, b


BAD_CHECKPOINT = b"garbage\n"


def test_a_dir_whose_root_checkpoints_turn_malformed_goes_offline_and_the_others_go_on(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """As Kafka takes a log dir offline when a checkpoint file is malformed, a cycle
    leaves that dir alone (its partitions untouched, the bad file byte for byte as it
    is, not rewritten by the recovery-point checkpoint nor at the stop), reports it in
    `offline` and logs it once, maintains the other dir, and takes the dir back once
    the file is fixed. Before, every cycle failed whole."""
    cfg, a, b = _two_dirs(tmp_path)
    bad = tmp_path / "logs" / "recovery-point-offset-checkpoint"
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        m.run_once()  # opens both and writes their checkpoints
        build(tmp_path, b, [records([0, 0], T0), records([1], T0), records([1], T0)], "logs2")
        before = dir_state(tmp_path / "logs" / str(a))
        bad.write_bytes(BAD_CHECKPOINT)
        with capture_logs() as logs:
            reports = [m.run_once(), m.run_once()]
        assert dir_state(tmp_path / "logs" / str(a)) == before
        assert bad.read_bytes() == BAD_CHECKPOINT
        for report in reports:
            assert [(o.log_dir, o.reason) for o in report.offline] == [
                (
                    str(tmp_path / "logs"),
                    f"malformed checkpoint file {bad} line 1: version 'garbage' is not an integer",
                )
            ]
            assert report.to_json()["offline"] == [
                {"log_dir": str(tmp_path / "logs"), "reason": report.offline[0].reason}
            ]
            assert not report.idle
        assert [c.tp for c in reports[0].cleaned] == [b]
        # The repeat is at debug, which the suite's logger config may filter out.
        offline = [e["log_level"] for e in logs if e["event"] == "log_dir.offline"]
        assert offline in (["error"], ["error", "debug"])
        bad.unlink()  # the operator's fix
        with capture_logs() as logs:
            back = m.run_once()
        assert back.offline == ()
        assert [e["log_dir"] for e in logs if e["event"] == "log_dir.online"] == [
            str(tmp_path / "logs")
        ]
        assert [s.meta.topic_partition for s in back.states] == [a, b]
        m.checkpoint(clean_stop=True)
    assert bad.read_text().splitlines()[2:] == ["t 0 3"]


def test_a_dir_that_cannot_be_opened_at_start_is_offline_until_it_can_be(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """A dir whose root checkpoint is malformed when the process starts: the other dir
    is maintained; the bad dir's locks are not kept (its open released them), it is
    opened at the first cycle after its fix and maintained from then on. With no dir
    that can be opened, the process does not start, naming the file."""
    cfg, a, b = _two_dirs(tmp_path)
    bad = tmp_path / "logs" / "cleaner-offset-checkpoint"
    bad.write_bytes(BAD_CHECKPOINT)
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        first = m.run_once()
        assert [o.log_dir for o in first.offline] == [str(tmp_path / "logs")]
        assert [c.tp for c in first.cleaned] == [b]
        assert bad.read_bytes() == BAD_CHECKPOINT
        bad.unlink()
        second = m.run_once()
        assert second.offline == ()
        assert [c.tp for c in second.cleaned] == [a]
        assert [d.path for d in m.log_dirs] == [tmp_path / "logs", tmp_path / "logs2"]
    bad.write_bytes(BAD_CHECKPOINT)
    only = cfg.model_copy(update={"log_dirs": (str(tmp_path / "logs"),)})
    with pytest.raises(CleanerdError, match=f"no log dir could be opened: .*{bad}"):
        Maintenance(only, engine, clock=lambda: T0)
    bad.unlink()
    with LogDir.open(tmp_path / "logs", state_dir=tmp_path / "state") as log_dir:
        assert log_dir.mode.value == "owner"  # the failed open let go of both locks


def test_an_offline_dir_gets_no_write_at_a_clean_stop_nor_after_a_cycle_it_went_bad_in(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """A root checkpoint that goes bad in the middle of a cycle (after the dir was read)
    fails neither that cycle (the dir's logs are no candidates; the other dir is
    cleaned) nor the stop after it, and is never written over: not by the cycle's
    recovery-point checkpoint, nor by the clean stop, which writes no marker there."""
    cfg, _, b = _two_dirs(tmp_path)
    bad = tmp_path / "logs" / "recovery-point-offset-checkpoint"
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        roll = m._roll

        def going_bad(*args: Any) -> Any:  # after discover, before the clean phase
            bad.write_bytes(BAD_CHECKPOINT)
            return roll(*args)

        m._roll = going_bad  # type: ignore[method-assign,assignment]
        report = m.run_once()
        assert [c.tp for c in report.cleaned] == [b]
        assert bad.read_bytes() == BAD_CHECKPOINT
        (error,) = m.checkpoint(clean_stop=True)
    assert str(bad) in str(error)
    assert bad.read_bytes() == BAD_CHECKPOINT
    assert not (tmp_path / "logs" / ".kafka_cleanshutdown").exists()
    assert (tmp_path / "logs2" / ".kafka_cleanshutdown").exists()


def test_an_offline_dir_keeps_its_partitions_copies_elsewhere_skipped_and_marks(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """While the dir that holds the maintained copy of a topic-partition is offline, the
    copy in a later dir stays skipped (it is not rolled nor cleaned: the two would
    differ once the first is back), and the uncleanable mark of the offline dir's
    partition is kept."""
    tp, other = TopicPartition("t", 0), TopicPartition("t", 1)
    build(tmp_path, tp, [records([0, 0], T0), records([1], T0)], logs="logs")
    build(tmp_path, other, [records([0, 0], T0), records([1], T0)], logs="logs")
    copy = build(tmp_path, tp, [records([0, 0], T0), records([1], T0)], logs="logs2")
    cfg = write_config(tmp_path, {"t": {"cleanup.policy": "compact"}})
    cfg = cfg.model_copy(update={"log_dirs": (str(tmp_path / "logs"), str(tmp_path / "logs2"))})
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        m.run_once()
        mark_uncleanable(m, other, tmp_path / "logs", "a failed pass")
        before = dir_state(copy)
        (tmp_path / "logs" / "cleaner-offset-checkpoint").write_bytes(BAD_CHECKPOINT)
        report = m.run_once()
        assert [o.log_dir for o in report.offline] == [str(tmp_path / "logs")]
        assert [(s.log_dir, s.tp) for s in report.skipped] == [(str(tmp_path / "logs2"), tp)]
        assert dir_state(copy) == before
        assert m.manager.registry.reason(other) == "a failed pass"


def test_a_dir_whose_marker_cannot_be_taken_or_that_vanished_is_offline_alone(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """Start-up with one dir whose clean-shutdown marker cannot be removed (a dir in its
    place here; EIO on a sick disk does the same): only that dir is offline. A dir that
    vanishes later (its disk unmounted) is offline too, disk usage measuring the others
    (a stat of the gone dir failed the whole cycle)."""
    cfg, a, b = _two_dirs(tmp_path)
    cfg = cfg.model_copy(update={"log_retention_disk_usage_percent": 90.0})
    marker = tmp_path / "logs" / ".kafka_cleanshutdown"
    (marker / "x").mkdir(parents=True)
    probe = lambda _path: DiskSpace(100, 10, 4096)  # noqa: E731 (below the threshold)
    with Maintenance(cfg, engine, clock=lambda: T0, usage_probe=probe) as m:
        first = m.run_once()
        assert [o.log_dir for o in first.offline] == [str(tmp_path / "logs")]
        assert "clean-shutdown marker" in first.offline[0].reason
        assert [c.tp for c in first.cleaned] == [b]
        shutil.rmtree(marker)
        (tmp_path / "logs2").rename(tmp_path / "unmounted")
        second = m.run_once()
        assert [o.log_dir for o in second.offline] == [str(tmp_path / "logs2")]
        assert [c.tp for c in second.cleaned] == [a]


def test_a_dir_offline_under_a_broker_logs_its_warnings_once(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """A dir a broker holds whose checkpoint is malformed, tried every cycle: its
    `log_dir.offline` error and the observe warning are logged once, not every cycle."""
    cfg, _, _ = _two_dirs(tmp_path)
    (tmp_path / "logs" / "cleaner-offset-checkpoint").write_bytes(BAD_CHECKPOINT)
    with (
        held_by_other_process(HOLD_BROKER_LOCK, tmp_path / "logs"),
        Maintenance(cfg, engine, clock=lambda: T0) as m,
        capture_logs() as logs,
    ):
        for _ in range(3):
            m.run_once()
    warned = [e["event"] for e in logs if e["log_level"] in ("warning", "error")]
    assert warned == ["log_dir.offline"]


def test_a_first_seen_registry_that_cannot_be_written_stops_no_cycle(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """The first-seen registry is advisory: when its file cannot be written (a dir in
    its place here; a full or read-only state volume does the same), the cycle still
    rolls, deletes and cleans in every log dir, and says so once. Before, every cycle
    failed whole."""
    cfg, a, b = _two_dirs(tmp_path)
    path = first_seen_path(tmp_path / "state", tmp_path / "logs")
    (path.parent / (path.name + ".tmp")).mkdir(parents=True)
    with Maintenance(cfg, engine, clock=lambda: T0) as m, capture_logs() as logs:
        reports = [m.run_once(), m.run_once()]
    assert [c.tp for c in reports[0].cleaned] == [a, b]
    failed = [e for e in logs if e["event"] == "first_seen.save_failed"]
    assert [e["log_level"] for e in failed if e["log_level"] != "debug"] == ["warning"]
    assert f"{path}.tmp" in failed[0]["error"]


def test_an_empty_partition_dir_is_one_unreadable_partition_when_observed(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """A partition dir with no segment yet (a broker creating it, or a crash between
    the mkdir and the first segment), read without owning the dir: that partition is
    unreadable for the cycle, the others are read. Before, every observing cycle failed
    whole (a ValueError from the snapshot of no segment)."""
    cfg, a, b = _two_dirs(tmp_path)
    (tmp_path / "logs" / "t-7").mkdir()
    cfg = cfg.model_copy(update={"mode": "observe"})
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        report = m.run_once()
    assert [(u.tp, u.reason) for u in report.unreadable] == [
        (
            TopicPartition("t", 7),
            "no segment yet (a partition being created, or one a crash left so: its "
            "owner's open creates the first segment)",
        )
    ]
    assert sorted(s.meta.topic_partition for s in report.states) == [a, b]
    assert list((tmp_path / "logs" / "t-7").iterdir()) == []  # observed: nothing created


def test_disk_usage_deletes_the_oldest_segments_across_topics(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """Above log.retention.disk.usage.percent the globally oldest segments go first,
    across topics and policies, until usage is under the threshold; active segments stay."""
    old, new = TopicPartition("keep", 0), TopicPartition("comp", 0)
    build(
        tmp_path,
        old,
        [records(range(20), T0 - 5 * HOUR), records(range(20), T0 - 1 * HOUR), records([0], T0)],
    )
    build(
        tmp_path,
        new,
        [records(range(20), T0 - 4 * HOUR), records(range(20), T0 - 2 * HOUR), records([0], T0)],
    )
    logs = tmp_path / "logs"

    def used() -> int:
        return sum(p.stat().st_size for p in logs.rglob("*") if p.is_file())

    total = used() * 100 // 70  # 70 % used; a threshold of 50 % needs about 2 segments gone

    def probe(_path: Path) -> DiskSpace:
        return DiskSpace(total, used())

    cfg = write_config(
        tmp_path,
        {
            "keep": {"cleanup.policy": "delete"},
            "comp": {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 1.0},
        },
        **{"log.retention.disk.usage.percent": 50},
    )
    with Maintenance(cfg, engine, clock=lambda: T0, usage_probe=probe) as m:
        report = m.run_once()
    disk = report.disk_usage
    assert disk is not None
    assert [(x.topic_partition, x.base_offset) for x in disk.deletions] == [(old, 0), (new, 0)]
    assert used() <= total // 2
    assert not disk.still_above


def test_a_pass_cut_short_by_a_full_map_is_followed_by_more(tmp_path: Path) -> None:
    """With a map too small for the dirty range, the partition is cleaned pass after pass
    in the same cycle while it stays eligible, here until its whole range is done."""
    tp = TopicPartition("t", 0)
    build(tmp_path, tp, [records(range(10), T0), records(range(10, 20), T0), records([0], T0)])
    topic = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.0}
    cfg = write_config(tmp_path, {"t": topic})
    small = WorkerSettings(workers=1, dedupe_buffer_size=24 * 10)  # room for 9 keys
    with LocalEngine(small) as engine, Maintenance(cfg, engine, clock=lambda: T0) as m:
        report = m.run_once()
    ends = [c.end_offset for c in report.cleaned]
    assert len(ends) > 1
    assert ends == sorted(ends)
    assert ends[-1] == 20
    assert OffsetCheckpointFile(tmp_path / "logs" / CLEANER_OFFSET_CHECKPOINT).read() == {tp: 20}


class _Recording(_Wrapping):
    """An engine that notes each submission and flush, in order."""

    def __init__(self, inner: LocalEngine) -> None:
        super().__init__(inner)
        self.calls: list[str] = []
        self.workers = 2

    def submit_clean(self, job: CleanJob) -> Future[CleanResult]:
        self.calls.append(f"submit {job.tp}")
        return self.inner.submit_clean(job)

    def flush(self) -> None:
        self.calls.append("flush")


def _two_dirty_partitions(tmp_path: Path) -> tuple[list[TopicPartition], Config]:
    """t-0 and t-1, each with keys written twice: both eligible at T0."""
    tps = [TopicPartition("t", i) for i in range(2)]
    for tp in tps:
        build(tmp_path, tp, [records(range(5), T0) * 2, records([0], T0)])
    return tps, write_config(tmp_path, {"t": {"cleanup.policy": "compact"}})


def test_the_cycle_flushes_each_round_of_submissions(tmp_path: Path, engine: LocalEngine) -> None:
    """The cycle flushes after submitting what its free workers take, so an engine that
    gathers passes into jobs (Spark) starts the round's job at once, with all of them."""
    _, cfg = _two_dirty_partitions(tmp_path)
    recording = _Recording(engine)
    with Maintenance(cfg, recording, clock=lambda: T0) as m:
        assert len(m.run_once().cleaned) == 2
    assert sorted(recording.calls[:2]) == ["submit t-0", "submit t-1"]
    assert recording.calls[2] == "flush"


class _DrainOnSubmit(_Wrapping):
    """An engine that sets the cycle's drain flag as it accepts its first pass."""

    def __init__(self, inner: LocalEngine) -> None:
        super().__init__(inner)
        self.drain: threading.Event | None = None

    def submit_clean(self, job: CleanJob) -> Future[CleanResult]:
        assert self.drain is not None
        self.drain.set()
        return self.inner.submit_clean(job)


def test_drain_finishes_the_pass_in_flight_and_picks_no_more(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """With `drain` set mid-cycle the running pass completes, no other starts, and
    clearing it lets the next cycle clean the rest."""
    tps, cfg = _two_dirty_partitions(tmp_path)
    draining = _DrainOnSubmit(engine)
    with Maintenance(cfg, draining, clock=lambda: T0) as m:
        draining.drain = m.drain
        report = m.run_once(threading.Event())
        assert len(report.cleaned) == 1
        assert not report.aborted
        assert any(s.phase == "clean" and "draining" in s.reason for s in report.skipped)
        m.drain.clear()
        draining.drain = threading.Event()
        again = m.run_once()
    assert [c.tp for c in again.cleaned] == [t for t in tps if t != report.cleaned[0].tp]


class _JobFails:
    """An engine whose passes fail as a Spark job that failed to start fails them."""

    name, workers, dead_workers = "spark", 1, 0

    def submit_clean(self, job: CleanJob) -> Future[CleanResult]:
        future: Future[CleanResult] = Future()
        future.set_exception(SparkJobFailed(job.tp, "exit status 1; JAVA_GATEWAY_EXITED"))
        return future

    def flush(self) -> None:
        pass

    def abort(self, tp: TopicPartition) -> bool:
        return False

    def shutdown(self, *, abort: bool = False) -> None:
        pass


def test_a_pass_the_engine_failed_is_a_failed_step_not_a_silent_one(tmp_path: Path) -> None:
    """A Spark job that fails (Java missing, a bad conf) fails its passes with nothing
    changed: the partition is not marked, but the cycle reports the failed step with the
    job's error (`clean` exits 1). It returned as a stop asked for: `clean` printed
    "0 cleaning passes" and exited 0, and the daemon logged nothing."""
    c = TopicPartition("c", 0)
    build(tmp_path, c, [records(range(6), T0 - 3 * HOUR) + records(range(3), T0 - 2 * HOUR)])
    cfg = write_config(
        tmp_path,
        {"c": {"cleanup.policy": "compact", "max.compaction.lag.ms": HOUR}},
    )
    with Maintenance(cfg, _JobFails(), clock=lambda: T0) as m:
        report = m.run_once()
    assert report.cleaned == ()
    assert report.failed == ()  # not marked uncleanable: the partition is not at fault
    (error,) = report.errors
    assert (error.tp, error.phase) == (c, "clean")
    assert "spark job for c-0 failed: exit status 1; JAVA_GATEWAY_EXITED" in error.reason


class _RefusesFirst(_Wrapping):
    """An engine whose first submission raises, as the `auto` engine's does when the
    Spark engine it needs cannot start; later passes run on `inner`."""

    refused = False

    def submit_clean(self, job: CleanJob) -> Future[CleanResult]:
        if not self.refused:
            self.refused = True
            raise SparkUnavailable("no java on PATH or in JAVA_HOME")
        return self.inner.submit_clean(job)


def test_a_pass_the_engine_cannot_start_is_a_failed_step_and_the_partition_is_freed(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """A submission the engine refuses (Java missing when `auto` first needs Spark) is a
    failed step naming why, nothing marked, and the next cycle cleans the partition: the
    cycle failed with a traceback, and the partition, left in progress, was never
    cleaned again until a restart."""
    c = TopicPartition("c", 0)
    build(tmp_path, c, [records(range(6), T0 - 3 * HOUR) + records(range(3), T0 - 2 * HOUR)])
    cfg = write_config(
        tmp_path, {"c": {"cleanup.policy": "compact", "max.compaction.lag.ms": HOUR}}
    )
    with Maintenance(cfg, _RefusesFirst(engine), clock=lambda: T0) as m:
        refused = m.run_once()
        later = m.run_once()
    assert refused.cleaned == ()
    assert refused.failed == ()
    (error,) = refused.errors
    assert (error.tp, error.phase) == (c, "clean")
    assert "the engine could not start the pass of c-0: the spark engine needs" in error.reason
    assert [r.tp for r in later.cleaned] == [c]


class _DiesMidSwap(_Wrapping):
    """An engine whose first pass dies between two renames of its swap (the `.swap`
    files in place, an old segment already `.deleted`), as a worker killed there leaves
    it; later passes run on `inner`."""

    def submit_clean(self, job: CleanJob) -> Future[CleanResult]:
        future: Future[CleanResult] = Future()
        if self.dead_workers:
            return self.inner.submit_clean(job)
        self.dead_workers += 1
        ops = CrashingOps()
        first_deleted = None
        try:
            Cleaner(OffsetMap(1 << 20), ops=_DieAt(".deleted", ops)).clean(
                log_dir=job.log_dir,
                tp=job.tp,
                segments=job.segments,
                first_dirty=job.first_dirty,
                first_uncleanable=job.first_uncleanable,
                now_ms=job.now_ms,
                config=job.config,
            )
        except SimulatedCrash as crash:
            first_deleted = str(crash)
        assert first_deleted is not None
        future.set_exception(WorkerCrashed(job.tp, f"killed at {first_deleted}"))
        return future


class _DieAt(CrashingOps):
    """Dies at the second rename whose target ends with `suffix`."""

    def __init__(self, suffix: str, _: CrashingOps) -> None:
        super().__init__()
        self.suffix, self.seen = suffix, 0

    def rename(self, src: Path, dst: Path) -> None:
        if dst.name.endswith(self.suffix):
            self.seen += 1
            if self.seen == 2:
                raise SimulatedCrash(f"rename {src.name} -> {dst.name}")
        super().rename(src, dst)


def test_a_pass_whose_worker_died_mid_swap_is_recovered_before_it_is_retried(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """The worker dies between two renames of its swap: the cycle recovers the partition
    (the swap completed from its `.swap` files) before the retried pass plans on it, so
    the log ends compacted with nothing left behind and no record lost."""
    tp = TopicPartition("t", 0)
    d = build(tmp_path, tp, [records(range(10), T0), records(range(10), T0, "w"), records([0], T0)])
    cfg = write_config(tmp_path, {"t": {"cleanup.policy": "compact"}})
    with Maintenance(cfg, _DiesMidSwap(engine), clock=lambda: T0) as m:
        report = m.run_once()
        m.close(unlink_pending=True)
    assert report.failed == ()
    assert [c.tp for c in report.cleaned] == [tp]
    assert not [p.name for p in d.iterdir() if p.name.endswith((".cleaned", ".swap", ".deleted"))]
    assert [v for _, _, v in values(d, tmp_path / "state")] == [
        *(f"w{i}".encode() for i in range(10)),
        b"v0",  # in the active segment, which is never cleaned
    ]


def _hold(log_dir: Path, held: Any, done: Any) -> None:
    with LogDir.open(log_dir, state_dir=log_dir.parent / "broker-state"):
        held.set()
        done.wait(30)


def test_an_observed_dir_reports_its_states_and_nothing_in_it_changes(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """A log dir another process holds (as a broker does) is observed: the cycle reports
    every partition's state, the overdue compacted one with its honest delay, and writes
    not a byte there (no roll, no pass, no checkpoint, no index)."""
    c, d = TopicPartition("c", 0), TopicPartition("d", 0)
    build(tmp_path, c, [records(range(6), T0 - 3 * HOUR) + records(range(3), T0 - 2 * HOUR)])
    build(tmp_path, d, [records(range(3), T0 - 3 * HOUR), records(range(3), T0)])
    cfg = write_config(
        tmp_path,
        {
            "c": {"cleanup.policy": "compact", "max.compaction.lag.ms": HOUR},
            "d": {"cleanup.policy": "delete", "retention.ms": HOUR},
        },
    )
    logs = tmp_path / "logs"
    before = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in logs.rglob("*")}
    ctx = multiprocessing.get_context("spawn")
    held, done = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(logs, held, done))
    holder.start()
    try:
        assert held.wait(30)
        with Maintenance(cfg, engine, clock=lambda: T0) as m:
            report = m.run_once()
            assert m.observed_dirs == [logs]
            # No worker looked for a log to clean (the last-clean gauges stay at 0).
            assert m.manager.last_run_ms is None
    finally:
        done.set()
        holder.join(30)
    assert report.observed == (str(logs),)
    assert (report.rolled, report.retention, report.cleaned, report.failed) == ((), (), (), ())
    states = {s.meta.topic: s for s in report.states}
    assert set(states) == {"c", "d"}
    assert states["d"].ltc is None
    overdue = states["c"].ltc
    assert overdue is not None
    assert overdue.compaction_delay_ms == 2 * HOUR
    assert overdue.kafka_compaction_delay_ms == 0  # Kafka ignores the active segment
    after = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in logs.rglob("*")}
    assert after == before
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        m.run_once()
        assert m.manager.last_run_ms == T0  # owned now: the workers looked


def test_opening_many_partitions_runs_as_long_lived_work(
    tmp_path: Path, engine: LocalEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cycle that opens `MANY_OPENS` or more partitions of a dir does so with the
    collector paused and the opened partitions frozen (`cleanerd.collector`); a cycle
    with them open already, or with fewer to open, leaves the collector alone."""
    for n in range(3):
        build(tmp_path, TopicPartition("d", n), [records(range(3), T0)])
    cfg = write_config(tmp_path, {"d": {"cleanup.policy": "delete"}})
    running: list[Maintenance] = []
    open_at_exit: list[int] = []

    @contextlib.contextmanager
    def recording() -> Iterator[None]:
        # Stands in for the real one: this test process must not freeze its objects.
        yield
        open_at_exit.append(len(running[-1]._plogs))

    monkeypatch.setattr(cycle, "long_lived_objects", recording)
    monkeypatch.setattr(cycle, "MANY_OPENS", 3)
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        running.append(m)
        m.run_once()
        assert open_at_exit == [3]
        m.run_once()
        assert open_at_exit == [3]
    monkeypatch.setattr(cycle, "MANY_OPENS", 4)
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        running.append(m)
        m.run_once()
    assert open_at_exit == [3]


def test_a_step_that_fails_the_same_way_again_is_logged_once(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """A damaged partition fails its roll every cycle until it is repaired: each report
    has the error, but only the first cycle logs it as an error (then at debug), and a
    different failure is logged again. The daemon logged it every few seconds."""
    d = build(tmp_path, TopicPartition("c", 0), [records(range(4), T0 - HOUR)] * 2)
    cfg = write_config(tmp_path, {"c": {"cleanup.policy": "delete", "retention.ms": -1}})
    first = d / "00000000000000000000.log"
    data = bytearray(first.read_bytes())
    data[-1] ^= 0xFF
    first.write_bytes(bytes(data))
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        levels = []
        for _ in range(3):
            with capture_logs() as logs:
                report = m.run_once()
            # Retention stops before the damage without failing (readable_meta).
            assert [e.phase for e in report.errors] == ["open", "roll"]
            errors = [e for e in logs if e["event"] == "roll.failed" and e["log_level"] == "error"]
            levels.append(len(errors))
    assert levels == [1, 0, 0]  # the repeats go to debug (which the test setup may drop)


def test_the_next_cycle_is_due_when_a_segment_older_than_the_damage_expires(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """A damaged partition's oldest healthy segment still sets when the daemon runs its
    next cycle (its retention.ms breach), so it is deleted on time, not at the next
    safety-net cycle."""
    tp = TopicPartition("d", 0)
    d = build(
        tmp_path,
        tp,
        [records(range(100), T0 - 50 * MIN), records(range(100), T0 - 40 * MIN), records([0], T0)],
    )
    _damage_first_batch(d / "00000000000000000100.log")
    cfg = write_config(tmp_path, {"d": {"cleanup.policy": "delete", "retention.ms": HOUR}})
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        assert m.run_once().next_due_ms == T0 + 10 * MIN + 1
    with Maintenance(cfg, engine, clock=lambda: T0 + 10 * MIN + 1) as m:
        report = m.run_once()
        assert [x.base_offset for x in report.retention[0].deletions] == [0]
        # The `.deleted` files' file.delete.delay.ms (a minute); nothing from the damage.
        assert report.next_due_ms == T0 + 11 * MIN + 1


def test_a_compacted_partition_whose_damage_its_open_did_not_read_skips_retention_at_once(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """After a clean stop, the open trusts the segments and reads none: a damaged first
    batch of a rolled segment of a `compact,delete` partition (its file changed since the
    stop recorded it) is met by its metadata.
    The partition is marked uncleanable before its retention in that very cycle, as one
    whose open found it corrupt is, so the first cycle skips its retention as every
    later one does (and as `plan` says). Before, the first cycle deleted and the next
    ones did not."""
    tp = TopicPartition("cd", 0)
    d = build(
        tmp_path,
        tp,
        [records(range(100), T0 - 5 * HOUR), records(range(100), T0 - 4 * HOUR), records([0], T0)],
    )
    topics = {
        "cd": {
            "cleanup.policy": "compact,delete",
            "retention.ms": 10 * HOUR,
            "min.cleanable.dirty.ratio": 1.0,
        }
    }
    cfg = write_config(tmp_path, topics)
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        m.run_once()
        assert m.shutdown() == []
    _damage_first_batch(d / "00000000000000000100.log")
    os.utime(d / "00000000000000000100.log")  # not the file the stop recorded
    later = write_config(tmp_path, {"cd": {**topics["cd"], "retention.ms": HOUR}})
    with Maintenance(later, engine, clock=lambda: T0) as m:
        for _ in range(2):
            report = m.run_once()
            assert report.retention == ()
            assert [(s.tp, s.reason) for s in report.skipped if s.phase == "retention"] == [
                (tp, "partition is uncleanable")
            ]
        assert [f.tp for f in report.failed] == []  # listed once, in the first cycle
    assert sorted(f.name for f in d.glob("*.log"))[0] == "00000000000000000000.log"


def _stopped_cleanly_with_two_expired(
    tmp_path: Path, engine: LocalEngine
) -> tuple[TopicPartition, Path, dict[str, Any]]:
    """A `delete` partition of two old segments and an active one, stopped cleanly by a
    cycle that kept everything: its partition, active `.log` and topic settings."""
    tp = TopicPartition("d", 0)
    d = build(
        tmp_path,
        tp,
        [records(range(10), T0 - 5 * HOUR), records(range(10), T0 - 4 * HOUR), records([0, 1], T0)],
    )
    topic = {"cleanup.policy": "delete", "retention.ms": -1}
    with Maintenance(write_config(tmp_path, {"d": topic}), engine, clock=lambda: T0) as m:
        m.run_once()
        assert m.shutdown() == []
    return tp, max(d.glob("*.log")), topic


def test_a_bad_crc_in_the_last_batch_a_clean_stop_flushed_is_left_as_it_is(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """After a clean stop, a bad CRC in the active segment's last batch is damage, not a
    torn append (the stop flushed it, and the recovery point says so): the retention
    step deletes the expired segments before it and cuts nothing, the active segment is
    left byte for byte, and the next cycle does not cut it either. Before, the step's
    write cut the batch, and the next append took its offset."""
    _, active, topic = _stopped_cleanly_with_two_expired(tmp_path, engine)
    data = bytearray(active.read_bytes())
    data[-1] ^= 0xFF
    active.write_bytes(bytes(data))
    later = write_config(tmp_path, {"d": {**topic, "retention.ms": HOUR}})
    with Maintenance(later, engine, clock=lambda: T0) as m:
        report = m.run_once()
        assert [x.base_offset for x in report.retention[0].deletions] == [0, 10]
        assert report.truncated == ()
        assert m.run_once().truncated == ()
        m.shutdown()
    assert active.read_bytes() == bytes(data)


def test_a_bad_last_batch_the_open_called_damage_is_not_cut_by_a_steps_write(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """A last batch past the recovery point that fails its CRC, in a dir whose clean
    stop left its marker: the open reports it as damage, and the retention step deletes
    the segments before it and leaves the active segment byte for byte. Its write cut
    the batch as a killed writer's torn tail (to the quarantine dir) in the very cycle
    whose report called it damage."""
    tp, active, topic = _stopped_cleanly_with_two_expired(tmp_path, engine)
    torn = bytearray(encode_records([kv("x", "torn")], 22))
    torn[-1] ^= 0xFF
    with open(active, "ab") as f:
        f.write(torn)
    data = active.read_bytes()
    later = write_config(tmp_path, {"d": {**topic, "retention.ms": HOUR}})
    with Maintenance(later, engine, clock=lambda: T0) as m:
        report = m.run_once()
        assert [x.base_offset for x in report.retention[0].deletions] == [0, 10]
        assert report.truncated == ()
        assert [(e.tp, e.phase) for e in report.errors][:1] == [(tp, "open")]
        assert str(active) in report.errors[0].reason
        assert active.read_bytes() == data


@pytest.mark.parametrize("policy", ["delete", "compact,delete"])
@pytest.mark.parametrize("batch", [1, 3])
def test_a_bad_batch_length_in_the_active_segment_stops_retention_only_before_it(
    tmp_path: Path, engine: LocalEngine, batch: int, policy: str
) -> None:
    """After a clean stop, the length field of the active segment's second or last batch
    is zeroed (damage, not a torn tail): the expired older segments of a `delete` topic
    are still deleted, beside the active segment, which is left byte for byte; a
    `compact,delete` partition is uncleanable, its retention skipped. Before, the producer
    walk (a bad batch inside) or the deletion's check of the active tail failed
    retention, and nothing was deleted."""
    tp = TopicPartition("d", 0)
    d = build(
        tmp_path,
        tp,
        [records(range(4), T0 - 5 * HOUR), records(range(4), T0 - 4 * HOUR), records(range(4), T0)],
    )
    topic = {"cleanup.policy": policy, "retention.ms": -1, "min.cleanable.dirty.ratio": 1.0}
    with Maintenance(write_config(tmp_path, {"d": topic}), engine, clock=lambda: T0) as m:
        m.run_once()
        assert m.shutdown() == []
    active = d / "00000000000000000008.log"
    data = bytearray(active.read_bytes())
    position = 0
    for _ in range(batch):
        position += 12 + int.from_bytes(data[position + 8 : position + 12], "big")
    data[position + 8 : position + 12] = bytes(4)
    active.write_bytes(bytes(data))
    later = write_config(tmp_path, {"d": {**topic, "retention.ms": HOUR}})
    with Maintenance(later, engine, clock=lambda: T0) as m:
        report = m.run_once()
    assert "retention" not in [e.phase for e in report.errors]
    if policy == "delete":
        (outcome,) = report.retention
        assert [x.base_offset for x in outcome.deletions] == [0, 4]
    else:
        assert report.retention == ()
        assert [(s.tp, s.reason) for s in report.skipped if s.phase == "retention"] == [
            (tp, "partition is uncleanable")
        ]
        assert [f.tp for f in report.failed] == [tp]
    assert active.read_bytes() == bytes(data)
    assert report.truncated == ()


def test_a_future_timestamp_that_blocks_retention_is_a_warning_once(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """A segment stamped in the future stops time retention every cycle until the clock
    passes it: the first cycle warns naming it, the next ones log it at debug (which the
    test setup may drop). The daemon warned every cycle."""
    tp = TopicPartition("d", 0)
    build(
        tmp_path,
        tp,
        [records(range(4), T0 - 5 * HOUR), records(range(4), T0 + HOUR), records([0], T0)],
    )
    cfg = write_config(tmp_path, {"d": {"cleanup.policy": "delete", "retention.ms": HOUR}})
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        with capture_logs() as first:
            m.run_once()
        with capture_logs() as again:
            report = m.run_once()
    (warning,) = [e for e in first if e["event"] == "retention.future_timestamp"]
    assert (warning["log_level"], warning["base_offset"]) == ("warning", 4)
    levels = {e["log_level"] for e in again if e["event"] == "retention.future_timestamp"}
    assert levels <= {"debug"}
    assert report.retention == ()


def test_damage_only_the_producer_walk_meets_stops_retention_at_its_segment(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """A crash left a dir without a producer snapshot, and a batch in the middle of a
    big rolled segment has a zeroed length: the segment's head and tail read well (its
    metadata does not see the damage), but the producer walk a snapshot of the
    partition needs stops there. That segment is the damaged one: the expired segment
    before it is deleted, it and the later ones stay. Before, the walk's error failed
    the partition's retention."""
    tp = TopicPartition("d", 0)
    value = "x" * 1000
    big = [[kv(f"k{i}", value, timestamp=T0 - 4 * HOUR)] for i in range(400)]  # ~420 KB
    d = build(tmp_path, tp, [records(range(4), T0 - 5 * HOUR), big, records([0], T0)])
    for f in d.glob("*.snapshot"):
        f.unlink()  # as a crash leaves it
    damaged = d / "00000000000000000004.log"
    data = bytearray(damaged.read_bytes())
    position = 0
    for _ in range(200):
        position += 12 + int.from_bytes(data[position + 8 : position + 12], "big")
    data[position + 8 : position + 12] = bytes(4)
    damaged.write_bytes(bytes(data))
    os.utime(damaged, ns=((T0 - 4 * HOUR) * 1_000_000,) * 2)
    cfg = write_config(tmp_path, {"d": {"cleanup.policy": "delete", "retention.ms": HOUR}})
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        report = m.run_once()
    assert "retention" not in [e.phase for e in report.errors]
    (outcome,) = report.retention
    assert ([x.base_offset for x in outcome.deletions], outcome.damaged_base) == ([0], 4)
    assert damaged.read_bytes() == bytes(data)


def test_a_paused_cycle_sets_no_deadline(tmp_path: Path, engine: LocalEngine) -> None:
    """Paused (`act=False`), a cycle reads the states and deletes nothing, and sets no
    time-rule deadline: a `.deleted` file's, past and never unlinked while paused, was
    the next cycle's deadline after every cycle, and a paused daemon ran them back to
    back (4,402 cycles in 3 s in a trial). Acting again, the file goes."""
    tp = TopicPartition("e", 0)
    build(tmp_path, tp, [records(range(10), T0 - 2 * HOUR), records([0], T0)])
    cfg = write_config(tmp_path, {"e": {"cleanup.policy": "delete", "retention.ms": HOUR}})
    now = [T0]
    with Maintenance(cfg, engine, clock=lambda: now[0]) as m:
        deleted = m.run_once()
        assert [x.base_offset for x in deleted.retention[0].deletions] == [0]
        assert deleted.next_due_ms == T0 + MIN  # the `.deleted` file's delay
        now[0] = T0 + 2 * MIN
        paused = m.run_once(act=False)
        assert (paused.next_due_ms, paused.unlinked) == (None, ())
        assert paused.states
        acting = m.run_once()
        assert "00000000000000000000.log.deleted" in [p.name for p in acting.unlinked]


def test_a_clean_request_is_refused_while_the_cleaner_is_off(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """With `log.cleaner.enable: false` no pass runs, so a requested one is refused with
    that reason: it was accepted, then never run nor dropped, and so never answered."""
    tp = TopicPartition("c", 0)
    build(tmp_path, tp, [records(range(6), T0 - HOUR), records([0], T0)])
    cfg = write_config(
        tmp_path, {"c": {"cleanup.policy": "compact"}}, **{"log.cleaner.enable": False}
    )
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        m.run_once()
        with pytest.raises(CleanerdError, match=r"log\.cleaner\.enable is false"):
            m.request_clean(tp, [str(tmp_path / "logs")])


@pytest.mark.parametrize("appended_after_the_cycles_time", [True, False])
def test_a_future_timestamp_is_judged_against_the_clock_read_again(
    tmp_path: Path,
    engine: LocalEngine,
    monkeypatch: pytest.MonkeyPatch,
    appended_after_the_cycles_time: bool,
) -> None:
    """`retention.future_timestamp` is a warning only for a segment still ahead of the
    clock when the retention step has read it: the cycle took its time before, and an
    application appending meanwhile stamps its batches a few milliseconds past it (here
    the clock moves on 10 s while the step reads; its active segment is stamped 5 s past
    the cycle's time). Before, such an active segment drew the warning every few
    cycles."""
    tp = TopicPartition("d", 0)
    build(tmp_path, tp, [records(range(10), T0 - 5 * HOUR), records([0], T0 + 5_000)])
    clock = [T0]
    apply = executor.apply_retention

    def reading(*args: Any, **kwargs: Any) -> Any:
        outcome = apply(*args, **kwargs)
        if appended_after_the_cycles_time:
            clock[0] = T0 + 10_000
        return outcome

    monkeypatch.setattr(cycle, "apply_retention", reading)
    topic = {"cleanup.policy": "delete", "retention.ms": HOUR}
    config = write_config(tmp_path, {"d": topic})
    with Maintenance(config, engine, clock=lambda: clock[0]) as m, capture_logs() as logs:
        report = m.run_once()
    assert [d.base_offset for o in report.retention for d in o.deletions] == [0]
    warned = [e for e in logs if e["event"] == "retention.future_timestamp"]
    if appended_after_the_cycles_time:
        assert warned == []
    else:
        (line,) = warned
        assert (line["base_offset"], line["now_ms"]) == (10, T0)


def test_the_lock_files_of_partitions_gone_are_removed(tmp_path: Path, engine: LocalEngine) -> None:
    """A partition deleted (its topic) loses its lock file in the state dir at the next
    cycle, as do those earlier processes left of partitions gone, at the first; one a
    process holds stays until a cycle finds it free. Before, the state dir kept a file
    for every partition that ever was."""
    logs, state = tmp_path / "logs", tmp_path / "state"
    kept, deleted = TopicPartition("d", 0), TopicPartition("d", 1)
    for tp in (kept, deleted):
        build(tmp_path, tp, [records(range(3), T0)])
    left, held = TopicPartition("old", 0), TopicPartition("old", 1)
    for tp in (kept, deleted, left):
        with PartitionLock(state, logs, tp):  # as an earlier process left them
            pass
    holder = PartitionLock(state, logs, held)
    holder.acquire()  # a `produce` on its way, say
    try:
        with Maintenance(write_config(tmp_path, {"d": {}}), engine, clock=lambda: T0) as m:
            m.run_once()
            assert sorted(partition_locks(state, logs)) == [kept, deleted, held]
            shutil.rmtree(logs / str(deleted))
            m.run_once()
            assert sorted(partition_locks(state, logs)) == [kept, held]
            holder.release()
            m.run_once()
            assert partition_locks(state, logs) == [kept]
    finally:
        if holder._depth:
            holder.release()


def test_a_lock_file_that_cannot_be_looked_at_fails_no_cycle(
    tmp_path: Path, engine: LocalEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The removal of gone partitions' lock files only keeps the state dir small: an
    error in it (the locks dir unreadable, say) fails no step of the cycle."""

    def unreadable(*_args: Any) -> list[TopicPartition]:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(cycle, "partition_locks", unreadable)
    build(tmp_path, TopicPartition("d", 0), [records(range(3), T0)])
    with Maintenance(write_config(tmp_path, {"d": {}}), engine, clock=lambda: T0) as m:
        report = m.run_once()
    assert (report.errors, report.offline) == ((), ())


def test_a_pause_during_a_cycle_stops_its_rolls_and_deletions(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """A pause (`drain`) that comes while a cycle runs: its roll, retention and disk
    usage steps change nothing more, as the cycles after a pause change nothing, and the
    report says so. Before, only its cleaning phase stopped: the running cycle went on
    rolling and deleting after the operator paused."""
    tp = TopicPartition("d", 0)
    d = build(tmp_path, tp, [records(range(10), T0 - 5 * HOUR), records([0, 1], T0 - 4 * HOUR)])
    before = dir_state(d)
    topic = {"cleanup.policy": "delete", "retention.ms": HOUR, "segment.ms": HOUR}
    with Maintenance(write_config(tmp_path, {"d": topic}), engine, clock=lambda: T0) as m:
        m.drain.set()  # as `pause` sets it while the cycle is on its way
        report = m.run_once()
    assert (report.rolled, report.retention) == ((), ())
    assert {(s.phase, s.reason) for s in report.skipped if s.tp is None} >= {
        ("roll", "paused"),
        ("retention", "paused"),
    }
    assert dir_state(d) == before


class _HeldPass(_Wrapping):
    """An engine whose passes start only once `release` is set (a pass that runs long:
    a partition of terabytes, a throttled cleaner, a Spark job); `submitted` is set as
    the first is submitted. Its passes run in this process (the module's engine may be
    shut down by an earlier test's `_Wrapping`)."""

    def __init__(self) -> None:
        super().__init__(
            LocalEngine(WorkerSettings(workers=1, dedupe_buffer_size=1 << 22), in_process=True)
        )
        self.submitted, self.release = threading.Event(), threading.Event()

    def submit_clean(self, job: CleanJob) -> Future[CleanResult]:
        outer: Future[CleanResult] = Future()

        def run() -> None:
            self.release.wait()
            inner = self.inner.submit_clean(job)
            inner.add_done_callback(lambda f: _chain(f, outer))

        threading.Thread(target=run, daemon=True).start()
        self.submitted.set()
        return outer


def _chain(source: Future[CleanResult], to: Future[CleanResult]) -> None:
    if (error := source.exception()) is not None:
        to.set_exception(error)
    else:
        to.set_result(source.result())


def _cycle_beside_a_held_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Maintenance, _HeldPass, list[int], TopicPartition, TopicPartition]:
    """A compacted partition `c` whose pass is held, and a delete partition `d` whose
    oldest segment's `retention.ms` falls due 10 s after the cycle's instant."""
    monkeypatch.setattr(cycle, "INTERLEAVE_AFTER_S", 0.0)
    c, d = TopicPartition("c", 0), TopicPartition("d", 0)
    build(tmp_path, c, [records(range(5), T0) * 2, records([0], T0)])
    build(tmp_path, d, [records(range(3), T0 - HOUR + 10_000), records(range(3), T0)])
    cfg = write_config(
        tmp_path,
        {
            "c": {"cleanup.policy": "compact"},
            "d": {"cleanup.policy": "delete", "retention.ms": HOUR},
        },
    )
    now = [T0]
    held = _HeldPass()
    return Maintenance(cfg, held, clock=lambda: now[0]), held, now, c, d


def _wait_for(condition: Any, what: str) -> None:
    # 30 s: on a loaded 2-core machine a cycle's tick has taken more than 10.
    for _ in range(600):
        if condition():
            return
        threading.Event().wait(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.contextmanager
def _cycling(m: Maintenance, held: _HeldPass) -> Iterator[tuple[threading.Thread, list[Any]]]:
    """`m`'s cycle in a thread, its first pass submitted and held until the block ends;
    the cycle's report is in the list once the thread ended."""
    reports: list[Any] = []
    with m:
        cycling = threading.Thread(
            target=lambda: reports.append(m.run_once(threading.Event())), daemon=True
        )
        cycling.start()
        try:
            assert held.submitted.wait(10)
            yield cycling, reports
        finally:
            held.release.set()
            cycling.join(30)


def test_retention_falling_due_beside_a_long_pass_is_not_held_by_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cycle's passes may run for hours: a retention.ms that falls due meanwhile
    deletes its segment then, not once the passes end (nor does a roll wait)."""
    m, held, now, c, d = _cycle_beside_a_held_pass(tmp_path, monkeypatch)
    first = tmp_path / "logs" / str(d) / f"{0:020d}.log"
    with _cycling(m, held) as (cycling, reports):
        threading.Event().wait(0.3)
        assert first.exists()  # not due yet
        now[0] = T0 + 20_000
        _wait_for(lambda: not first.exists(), "the retention deletion beside the pass")
        assert cycling.is_alive()  # the pass is still held
    (report,) = reports
    assert [(o.topic, [x.base_offset for x in o.deletions]) for o in report.retention] == [
        ("d", [0])
    ]
    assert [x.tp for x in report.cleaned] == [c]


def test_what_a_cycle_does_is_told_as_it_happens_and_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`on_news` hears of a deletion made beside a long pass while the pass still runs,
    and of the pass when it ends, each once, with the states they left: the daemon
    sends its events and follows its metrics from it. Before, the events and states of
    a cycle of hours of passes came only at its end."""
    m, held, now, c, d = _cycle_beside_a_held_pass(tmp_path, monkeypatch)
    told: list[CycleNews] = []
    m.on_news = told.append
    with _cycling(m, held) as (cycling, reports):
        now[0] = T0 + 20_000
        _wait_for(lambda: any(n.retention for n in told), "the deletion told")
        assert cycling.is_alive()  # the pass is still held
        assert not any(n.cleaned for n in told)
    (report,) = reports
    assert all(told)  # nothing empty is told
    assert [o for n in told for o in n.retention] == list(report.retention)
    assert [x for n in told for x in n.cleaned] == list(report.cleaned)
    assert [x.tp for x in report.cleaned] == [c]
    assert [o.topic for o in report.retention] == [d.topic]
    # Nor is `c` said to be skipped by the retention step beside its pass, which passes
    # it by as Kafka's cleaner-driven retention does: `clean` printed 'c-0: retention
    # skipped: partition is in-progress', as if a deletion had waited.
    assert [(s.tp, s.phase) for s in report.skipped] == []
    # The states the deletion and the pass left (the report's are from before them):
    # the metrics follow them.
    later = {s.meta.topic_partition: s for n in told for s in n.later_states}
    before = {s.meta.topic_partition: s for s in report.states}
    assert later.keys() == {c, d}
    assert [s.base_offset for s in later[d].meta.segments] == [3]
    assert [s.base_offset for s in before[d].meta.segments] == [0, 3]
    due = (before[d].retention_due_ms, later[d].retention_due_ms)
    assert due == (T0 + 10_000, T0 + HOUR)
    cleaned = (before[c].ltc, later[c].ltc)
    assert [x.first_dirty if x else None for x in cleaned] == [0, report.cleaned[0].end_offset]


def test_rules_falling_due_one_after_another_beside_a_long_pass_are_paced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beside a long pass, steps that took 1 s wait 9 s after they ran before a rule
    that fell due meanwhile runs them again (as the daemon's cycles do), not at once:
    segments expiring one after another kept a core busy with those steps."""
    monkeypatch.setattr(cycle, "INTERLEAVE_AFTER_S", 0.0)
    c, d = TopicPartition("c", 0), TopicPartition("d", 0)
    build(tmp_path, c, [records(range(5), T0) * 2, records([0], T0)])
    build(
        tmp_path,
        d,
        [
            records(range(3), T0 - HOUR + 10_000),
            records(range(3), T0 - HOUR + 12_000),
            records(range(3), T0),
        ],
    )
    cfg = write_config(
        tmp_path,
        {
            "c": {"cleanup.policy": "compact"},
            "d": {"cleanup.policy": "delete", "retention.ms": HOUR},
        },
    )
    now = [T0]
    applied = executor.apply_retention

    def taking_a_second(plog: PartitionLog, *args: Any, **kwargs: Any) -> Any:
        outcome = applied(plog, *args, **kwargs)
        if outcome.deletions:
            now[0] += 1_000
        return outcome

    monkeypatch.setattr(cycle, "apply_retention", taking_a_second)
    first, second = (tmp_path / "logs" / str(d) / f"{base:020d}.log" for base in (0, 3))
    held = _HeldPass()
    with Maintenance(cfg, held, clock=lambda: now[0]) as m:
        cycling = threading.Thread(target=lambda: m.run_once(threading.Event()), daemon=True)
        cycling.start()
        try:
            assert held.submitted.wait(10)
            now[0] = T0 + 10_001
            _wait_for(lambda: now[0] == T0 + 11_001, "the first deletion, which takes 1 s")
            assert not first.exists()
            now[0] = T0 + 20_000  # the second segment is due, 9 s not yet passed
            threading.Event().wait(0.5)
            assert second.exists()
            now[0] = T0 + 20_001
            _wait_for(lambda: not second.exists(), "the second deletion, 9 s after the first")
        finally:
            held.release.set()
            cycling.join(30)


def test_an_interjection_runs_disk_usage_beside_a_long_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device that goes above log.retention.disk.usage.percent while a pass runs on
    (the daemon's probe sees it and calls `interject`) loses its oldest segments then,
    and the cycle's report has those deletions."""
    monkeypatch.setattr(cycle, "INTERLEAVE_AFTER_S", 3600.0)  # only the interjection acts
    c, d = TopicPartition("c", 0), TopicPartition("d", 0)
    build(tmp_path, c, [records(range(5), T0) * 2, records([0], T0)])
    build(tmp_path, d, [records(range(20), T0 - 2 * HOUR), records(range(20), T0)])
    logs = tmp_path / "logs"
    full = [False]

    def used() -> int:
        return sum(p.stat().st_size for p in logs.rglob("*") if p.is_file())

    total = used() * 100 // 40

    def probe(_path: Path) -> DiskSpace:
        return DiskSpace(total, used() + (total // 2 if full[0] else 0))

    cfg = write_config(
        tmp_path,
        {"c": {"cleanup.policy": "compact"}, "d": {"cleanup.policy": "delete"}},
        **{"log.retention.disk.usage.percent": 80},
    )
    first = logs / str(d) / f"{0:020d}.log"
    held = _HeldPass()
    m = Maintenance(cfg, held, clock=lambda: T0, usage_probe=probe)
    with _cycling(m, held) as (cycling, reports):
        full[0] = True
        m.interject()
        _wait_for(lambda: not first.exists(), "the disk-usage deletion beside the pass")
        assert cycling.is_alive()
    (report,) = reports
    assert report.disk_usage is not None
    assert [(x.topic_partition, x.base_offset) for x in report.disk_usage.deletions] == [(d, 0)]
    assert [x.tp for x in report.cleaned] == [c]


def test_a_stop_during_retention_ends_the_step(
    tmp_path: Path, engine: LocalEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop that comes while retention works through thousands of expired partitions
    ends the step after the partition in hand (the daemon's stop waited for all of them,
    gave up after 30 s and left without its checkpoints)."""
    tps = [TopicPartition("d", i) for i in range(3)]
    for tp in tps:
        build(tmp_path, tp, [records(range(3), T0 - 3 * HOUR), records(range(3), T0)])
    cfg = write_config(tmp_path, {"d": {"cleanup.policy": "delete", "retention.ms": HOUR}})
    stop = threading.Event()
    applied = executor.apply_retention

    def then_stop(*args: Any, **kwargs: Any) -> Any:
        stop.set()  # SIGTERM arrives during the first partition's retention
        return applied(*args, **kwargs)

    monkeypatch.setattr(cycle, "apply_retention", then_stop)
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        report = m.run_once(stop)
    assert len(report.retention) == 1
    assert report.aborted
    assert [(s.phase, s.reason) for s in report.skipped if s.tp is None] == [
        ("retention", "stopping")
    ]


def test_retention_checkpoints_a_dir_once_for_all_its_deletions(
    tmp_path: Path, engine: LocalEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retention step writes a dir's checkpoints once, for every partition it
    changed, not once per partition: each write holds every partition of the dir, and
    500 partitions with one expired segment each spent four fifths of their `clean` in
    those writes. A checkpointed start offset that the deletions passed is dropped."""
    tps = [TopicPartition("d", i) for i in range(3)]
    for tp in tps:
        build(tmp_path, tp, [records(range(3), T0 - 3 * HOUR), records(range(3), T0)])
    start = OffsetCheckpointFile(tmp_path / "logs" / LOG_START_OFFSET_CHECKPOINT)
    start.write(dict.fromkeys(tps, 1))
    cfg = write_config(tmp_path, {"d": {"cleanup.policy": "delete", "retention.ms": HOUR}})
    writes: list[set[TopicPartition]] = []
    checkpoint_logs = LogDir.checkpoint_logs

    def counting(log_dir: LogDir, logs: Any) -> None:
        logs = list(logs)
        writes.append({p.topic_partition for p in logs})
        checkpoint_logs(log_dir, logs)

    monkeypatch.setattr(LogDir, "checkpoint_logs", counting)
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        report = m.run_once()
    assert (
        sorted(tp for o in report.retention for tp in [TopicPartition(o.topic, o.partition)]) == tps
    )
    assert writes[0] == set(tps)
    assert all(w == set(tps) for w in writes)
    assert start.read() == {}
    for tp in tps:
        assert PartitionLog.open(tmp_path / "logs" / str(tp), read_only=True).log_start_offset == 3


def test_a_failed_retention_checkpoint_fails_the_step_of_each_partition_it_held(
    tmp_path: Path, engine: LocalEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint write after a dir's deletions fails (a full disk): the deletions
    stand and are reported, each of those partitions' retention step is a failed one,
    and the `.deleted` files are still unlinked when due, not left until the next
    start."""
    tps = [TopicPartition("d", i) for i in range(2)]
    for tp in tps:
        build(tmp_path, tp, [records(range(3), T0 - 3 * HOUR), records(range(3), T0)])
    cfg = write_config(
        tmp_path,
        {"d": {"cleanup.policy": "delete", "retention.ms": HOUR, "file.delete.delay.ms": 0}},
    )

    def full(*_: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(LogDir, "checkpoint_logs", full)
    with Maintenance(cfg, engine, clock=lambda: T0) as m:
        report = m.run_once()
        assert len(report.retention) == 2
        assert sorted((e.tp, e.phase) for e in report.errors) == [(tp, "retention") for tp in tps]
        assert all("No space left" in e.reason for e in report.errors)
        m.run_once()
    for tp in tps:
        assert not list((tmp_path / "logs" / str(tp)).glob("*.deleted"))
        assert PartitionLog.open(tmp_path / "logs" / str(tp), read_only=True).log_start_offset == 3


def test_a_partition_deleted_during_a_cycle_is_gone_not_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A topic deleted while a cycle works on it (a broker renames its dirs `-delete`,
    then removes them) met its deletion: no failed step, no uncleanable mark, and what
    a restart reads is still kept for the other partitions (each was a warning or an
    error, and the gauges of failed steps and uncleanable partitions rose)."""
    c, gone = TopicPartition("c", 0), TopicPartition("c", 1)
    for tp in (c, gone):
        build(tmp_path, tp, [records(range(5), T0 - 2 * HOUR) * 2, records([0], T0 - HOUR)])
    cfg = write_config(
        tmp_path, {"c": {"cleanup.policy": "compact", "max.compaction.lag.ms": HOUR}}
    )
    rolled = maybe_roll

    def deleting(plog: PartitionLog, *args: Any, **kwargs: Any) -> Any:
        if plog.topic_partition == gone and plog.dir.exists():
            doomed = plog.dir.with_name(f"{gone}.0123456789abcdef0123456789abcdef-delete")
            plog.dir.rename(doomed)
            shutil.rmtree(doomed)
        return rolled(plog, *args, **kwargs)

    monkeypatch.setattr(cycle, "maybe_roll", deleting)
    engine = LocalEngine(WorkerSettings(workers=1, dedupe_buffer_size=1 << 22), in_process=True)
    with Maintenance(cfg, engine, clock=lambda: T0) as m, capture_logs() as logs:
        report = m.run_once()
        status = m.status()
        m.keep_known()
    assert (report.errors, report.failed) == ((), ())
    assert not [e for e in logs if e["log_level"] in ("warning", "error")]
    assert [x.tp for x in report.cleaned] == [c]
    assert status.uncleanable.in_dir(str(tmp_path / "logs")) == {}
