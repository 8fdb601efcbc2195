"""Tests of `cleanerd plan`: the per-partition cycle plan, pure and end to end."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from cleanerd.cli import main
from cleanerd.commands.plan import render_text
from cleanerd.config import BrokerConfig, Config
from cleanerd.log.files import TopicPartition
from cleanerd.log.log_dir import LogDir
from cleanerd.log.meta import PartitionMeta, SegmentMeta
from cleanerd.log.roll import SegmentAge
from cleanerd.log.segment import LogSegment
from cleanerd.log.topic_config import TopicConfig
from cleanerd.maintenance.plan import PlanInput, gather, plan_cycle, plan_partition
from cleanerd.retention.disk_usage import DeviceUsage
from cleanerd.retention.policy import DeletionReason, RetentionRoll
from tests.builders import build_log, kv
from tests.holders import HOLD_BROKER_LOCK, HOLD_OWNER_LOCK, held_by_other_process

MIN = 60_000
HOUR = 60 * MIN
T0 = 1_700_000_000_000


def topic(**overrides: Any) -> TopicConfig:
    base = dataclasses.replace(
        BrokerConfig().topic_defaults(), cleanup_policy=("compact",), max_compaction_lag_ms=HOUR
    )
    return dataclasses.replace(base, **overrides)


def seg(base: int, ts: int, size: int = 100) -> SegmentMeta:
    return SegmentMeta(base, base + 10, size, ts, ts, 0, 0, ts)


def meta(topic_name: str, stamps: list[int], *, log_dir: str = "/logs") -> PartitionMeta:
    segments = tuple(seg(10 * i, ts) for i, ts in enumerate(stamps))
    return PartitionMeta(
        topic=topic_name,
        partition=0,
        log_dir=log_dir,
        segments=segments,
        log_start_offset=0,
        log_end_offset=segments[-1].next_offset,
        high_watermark=None,
        first_unstable_offset=None,
    )


def test_due_roll_opens_the_idle_segment_to_compaction() -> None:
    """An idle partition whose only data sits in an overdue active segment: the plan rolls
    it, and the rolled segment becomes cleanable and eligible by max lag."""
    m = meta("idle", [T0 - 2 * HOUR, T0 - 90 * MIN])
    inp = PlanInput(
        m,
        topic(min_cleanable_dirty_ratio=1.0),
        checkpoint=10,
        age=SegmentAge(T0 - 90 * MIN, T0 - 90 * MIN),
    )
    plan, after = plan_partition(inp, now_ms=T0)
    assert plan.roll is not None
    assert plan.roll.decision is not None
    assert plan.roll.decision.reason.value == "max.compaction.lag.ms"
    assert [s.base_offset for s in after.segments] == [0, 10, 20]
    c = plan.compaction
    assert c is not None
    assert (c.ltc.first_dirty, c.ltc.first_uncleanable) == (10, 20)
    assert c.eligible is not None
    assert c.eligible.value == "max.compaction.lag.ms"
    assert c.ltc.compaction_delay_ms == 30 * MIN
    assert c.blocked_by == ("last.stable.offset", "active.segment")
    not_yet, _ = plan_partition(inp, now_ms=T0 - 31 * MIN)
    assert not_yet.roll is not None
    assert not_yet.roll.decision is None
    assert not_yet.roll.due_at_ms == T0 - 30 * MIN
    assert not_yet.compaction is not None
    assert not_yet.compaction.eligible is None


def test_retention_plan_rolls_first_and_moves_the_start() -> None:
    """When retention would take every segment, the plan rolls first and every old segment
    goes; the log start offset moves to the log end offset."""
    m = meta("old", [T0 - 9 * HOUR, T0 - 8 * HOUR])
    cfg = topic(cleanup_policy=("delete",), retention_ms=HOUR, segment_ms=100 * HOUR)
    plan, after = plan_partition(PlanInput(m, cfg, None, SegmentAge(T0, T0)), now_ms=T0)
    assert plan.roll is not None
    assert plan.roll.decision is None
    assert plan.retention_roll == RetentionRoll(10, DeletionReason.RETENTION_MS)
    assert [d.base_offset for d in plan.retention.deletions] == [0, 10]
    assert plan.retention.log_start_offset == 20
    assert [s.base_offset for s in after.segments] == [20]
    assert plan.compaction is None


def test_cycle_orders_overdue_first_and_plans_disk_usage() -> None:
    """Eligible partitions are ranked overdue first, then by dirtiness; KIP-61 is planned
    over the post-retention snapshots of each device, sparing protected topics, and the
    clean step after it: what it deleted is not cleaned."""
    overdue = PlanInput(meta("late", [T0 - 3 * HOUR, T0]), topic(), None, SegmentAge(T0, T0))
    age = SegmentAge(T0, T0)
    dirty = PlanInput(
        meta("dirty", [T0 - 5 * MIN, T0]), topic(max_compaction_lag_ms=10 * HOUR), None, age
    )
    spared = PlanInput(
        meta("vip", [T0 - 99 * HOUR, T0]), topic(cleanup_policy=("delete",)), None, age
    )
    below = plan_cycle([dirty, overdue, spared], now_ms=T0)
    assert {p.topic: p.order for p in below.partitions} == {"late": 1, "dirty": 2, "vip": None}
    cycle = plan_cycle(
        [dirty, overdue, spared],
        now_ms=T0,
        devices=[DeviceUsage(7, 1000, 900, 50)],
        device_of_dir={"/logs": 7},
        protects=lambda t: t == "vip",
    )
    assert [(str(d.topic_partition), d.base_offset) for d in cycle.disk_deletions] == [
        ("late-0", 0),
        ("dirty-0", 0),
    ]
    assert cycle.disk_outcomes[0].above_threshold
    # Their one closed segment deleted, neither is left anything to clean.
    assert {p.topic: p.order for p in cycle.partitions} == {
        "late": None,
        "dirty": None,
        "vip": None,
    }


def test_disk_usage_deletes_nothing_where_the_owner_has_no_kip61() -> None:
    """Two log dirs on one device above its threshold, the older data in one a broker
    holds: its bytes count, but only the other dir's segments are planned for deletion,
    as the cycle deletes (a broker has no KIP-61 step). The plan listed the broker's."""
    age = SegmentAge(T0, T0)
    broker = PlanInput(meta("old", [T0 - 9 * HOUR, T0], log_dir="/broker"), topic(), None, age)
    own = PlanInput(meta("new", [T0 - 2 * HOUR, T0], log_dir="/own"), topic(), None, age)
    cycle = plan_cycle(
        [broker, own],
        now_ms=T0,
        devices=[DeviceUsage(7, 1000, 900, 50)],
        device_of_dir={"/broker": 7, "/own": 7},
        no_disk_usage={"/broker"},
    )
    assert [(str(d.topic_partition), d.log_dir) for d in cycle.disk_deletions] == [
        ("new-0", "/own")
    ]
    assert cycle.disk_outcomes[0].above_threshold


def test_the_text_lists_each_devices_deletions_under_it() -> None:
    """Two devices above their threshold: each device line is followed by its own
    deletions (all of them came after the last device line)."""
    age = SegmentAge(T0, T0)
    first = PlanInput(meta("a", [T0 - 9 * HOUR, T0], log_dir="/d1"), topic(), None, age)
    second = PlanInput(meta("b", [T0 - 8 * HOUR, T0], log_dir="/d2"), topic(), None, age)
    cycle = plan_cycle(
        [first, second],
        now_ms=T0,
        devices=[DeviceUsage(7, 1000, 900, 50), DeviceUsage(8, 1000, 900, 50)],
        device_of_dir={"/d1": 7, "/d2": 8},
    )
    lines = [x.split(":")[0].strip() for x in render_text(cycle, [], {}) if "disk" in x]
    assert lines == ["device 0", "disk.usage", "device 0", "disk.usage"]
    text = "\n".join(render_text(cycle, [], {}))
    assert text.index("a-0 segment 0 in /d1") < text.index("device 0:8") < text.index("b-0 segment")


def test_metadata_log_is_never_planned() -> None:
    """The KRaft metadata log gets no roll, retention or compaction."""
    m = meta("__cluster_metadata", [T0 - 99 * HOUR, T0 - 98 * HOUR])
    plan, _ = plan_partition(
        PlanInput(m, topic(retention_ms=1), None, SegmentAge(T0, T0)), now_ms=T0
    )
    assert plan.roll is None
    assert plan.retention.deletions == ()
    assert plan.compaction is None


# ---------------------------------------------------------------------------------------
# End to end


def config_file(tmp_path: Path, log_dirs: list[Path]) -> Path:
    cfg = {
        "log.dirs": [str(p) for p in log_dirs],
        "state_dir": str(tmp_path / "state"),
        "log.retention.disk.usage.percent": 99,
        "topics": {
            "users": {"cleanup.policy": "compact", "max.compaction.lag.ms": HOUR},
            "events": {"cleanup.policy": "delete", "retention.ms": HOUR},
        },
    }
    path = tmp_path / "cleanerd.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def build(tmp_path: Path, now: int) -> Path:
    logs = tmp_path / "logs"
    state = tmp_path / "state"
    old = now - 3 * HOUR
    build_log(
        logs,
        [
            [[kv("a", "1", timestamp=old)], [kv("a", "2", timestamp=old)]],
            [[kv("b", "1", timestamp=old)]],
        ],
        state_dir=state,
        tp=TopicPartition("users", 0),
    )
    build_log(
        logs,
        [[[kv(None, "e", timestamp=old)]], [[kv(None, "f", timestamp=now)]]],
        state_dir=state,
        tp=TopicPartition("events", 0),
    )
    return logs


def snapshot(root: Path) -> list[tuple[str, int, int]]:
    return sorted(
        (str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()
    )


def test_plan_text_and_json_change_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`plan` prints each partition's roll, retention and compaction verdicts, as text and
    JSON, and modifies no file, even while another LogDir owns the dir."""
    now = time.time_ns() // 1_000_000 + 2 * HOUR
    logs = build(tmp_path, now)
    path = config_file(tmp_path, [logs])
    with LogDir.open(logs, state_dir=tmp_path / "state"):
        before = snapshot(tmp_path)
        assert main(["plan", "-c", str(path), "--now-ms", str(now)]) == 0
        text = capsys.readouterr().out
        assert main(["plan", "-c", str(path), "--now-ms", str(now), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert snapshot(tmp_path) == before
    assert "users-0 in" in text
    assert "roll: due now (max.compaction.lag.ms" in text
    assert "retention: delete retention.ms: 1" in text
    assert "compaction: eligible (min.cleanable.dirty.ratio), order 1" in text
    parts = {p["topic"]: p for p in doc["partitions"]}
    users = parts["users"]
    assert users["roll"]["due"]
    assert users["compaction"]["first_uncleanable_offset"] == 3
    assert users["compaction"]["blocked_by"] == ["last.stable.offset", "active.segment"]
    assert users["compaction"]["overdue_ms"] == 2 * HOUR
    assert parts["events"]["retention"]["deletions"][0]["reason"] == "retention.ms"
    assert doc["cleaning_order"] == ["users-0"]
    assert doc["devices"][0]["threshold_percent"] == 99
    assert doc["errors"] == []


def test_plan_reports_unreadable_log_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing log dir is named on stderr, in check-config's words with its key, and
    the exit status is 1; the others are planned."""
    logs = build(tmp_path, T0)
    missing = tmp_path / "missing"
    path = config_file(tmp_path, [logs, missing])
    assert main(["plan", "-c", str(path), "--now-ms", str(T0)]) == 1
    captured = capsys.readouterr()
    assert "users-0 in" in captured.out
    assert (
        f"{missing}: offline, not read: log.dirs[1]: {str(missing)!r} does not exist "
        "(cleanerd does not create log dirs" in captured.err
    )


def test_plan_names_a_log_dir_with_a_malformed_root_checkpoint_as_offline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A log dir whose `recovery-point-offset-checkpoint` is malformed is offline, as
    for a cycle: named with the file on stderr, exit status 1, the other dir planned."""
    logs = build(tmp_path, T0)
    broken = tmp_path / "broken"
    shutil.copytree(logs, broken)
    (broken / "recovery-point-offset-checkpoint").write_text("0\ntwo\n")
    path = config_file(tmp_path, [logs, broken])
    assert main(["plan", "-c", str(path), "--now-ms", str(T0)]) == 1
    captured = capsys.readouterr()
    assert f"users-0 in {logs}" in captured.out
    assert f"users-0 in {broken}" not in captured.out
    bad = broken / "recovery-point-offset-checkpoint"
    why = f"malformed checkpoint file {bad} line 2: entry count 'two' is not an integer"
    assert f"{broken}: offline, not read: {why}" in captured.err


def test_a_partition_deleted_while_plan_reads_is_gone_not_unreadable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker deleting a topic renames its partition dirs (`<tp>.<id>-delete`), then
    removes them. Deleted between plan's listing and its read, a partition is gone: left
    out, exit status 0. It was "unreadable" (No such file or directory), exit 1."""
    logs = build(tmp_path, T0)
    path = config_file(tmp_path, [logs])
    listed = LogDir.partitions

    def deleting(self: LogDir) -> dict[TopicPartition, Path]:
        found = listed(self)
        if (self.path / "users-0").exists():
            (self.path / "users-0").rename(self.path / f"users-0.{'ab' * 16}-delete")
        return found

    monkeypatch.setattr(LogDir, "partitions", deleting)
    capsys.readouterr()  # the builder's log lines
    assert main(["plan", "-c", str(path), "--now-ms", str(T0), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert [p["topic"] for p in planned["partitions"]] == ["events"]
    assert planned["unreadable"] == []


def test_plan_json_lists_what_clean_then_does_under_the_same_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`plan --json --now-ms T` and `clean --json --now-ms T` share one schema: the rolls
    and deletions plan lists are exactly the ones clean reports, field for field."""
    now = time.time_ns() // 1_000_000 + 2 * HOUR
    logs = build(tmp_path, now)
    path = config_file(tmp_path, [logs])
    capsys.readouterr()  # the builder's log lines
    assert main(["plan", "-c", str(path), "--now-ms", str(now), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert main(["clean", "-c", str(path), "--now-ms", str(now), "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert planned["rolled"] == done["rolled"] != []
    assert planned["deleted"] == done["deleted"] != []
    assert [c["topic"] + "-" + str(c["partition"]) for c in done["cleaned"]] == planned[
        "cleaning_order"
    ]


def test_segment_deleted_by_a_live_broker_while_read_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`plan` beside a live broker: the oldest segment is deleted (retention) just as it
    is read; the partition is listed and read again, no error, the segment is gone from
    the plan's input."""
    logs, state = tmp_path / "logs", tmp_path / "state"
    tp = TopicPartition("users", 0)
    build_log(
        logs,
        [[[kv("a", "1")]], [[kv("a", "2")]], [[kv("b", "1")]]],
        state_dir=state,
        tp=tp,
    )
    cfg = Config.model_validate({"log.dirs": [str(logs)], "state_dir": str(state)})
    read = LogSegment.meta
    deleted: list[int] = []

    def broker_deletes_oldest(segment: LogSegment) -> SegmentMeta:
        if not deleted and segment.base_offset == 0:
            deleted.append(segment.base_offset)
            for path in segment.paths:
                path.unlink(missing_ok=True)
        return read(segment)

    monkeypatch.setattr(LogSegment, "meta", broker_deletes_oldest)
    gathered = gather(cfg, now_ms=T0)
    assert deleted == [0]
    assert gathered.errors == []
    (only,) = gathered.inputs
    assert [s.base_offset for s in only.meta.segments] == [1, 2]


@pytest.mark.parametrize(
    ("hold", "mode", "deletes"),
    [
        (None, "owner", True),
        (HOLD_BROKER_LOCK, "owner", False),
        (HOLD_OWNER_LOCK, "owner", True),
        (None, "observe", False),
    ],
)
def test_kip61_is_planned_only_where_the_owner_has_it(
    tmp_path: Path, hold: str | None, mode: str, deletes: bool
) -> None:
    """A log dir a broker holds, or every dir in `mode: observe`, gets no KIP-61
    deletions in the plan (its owner has no such step); one another cleanerd owns does,
    its cycle deleting as this config would."""
    logs, state = tmp_path / "logs", tmp_path / "state"
    build_log(logs, [[[kv("a", "1")]]], state_dir=state, tp=TopicPartition("users", 0))
    cfg = Config.model_validate({"log.dirs": [str(logs)], "state_dir": str(state), "mode": mode})
    holding = held_by_other_process(hold, logs, state) if hold else contextlib.nullcontext()
    with holding:
        gathered = gather(cfg, now_ms=T0)
    assert (str(logs) not in gathered.no_disk_usage) == deletes


@pytest.mark.parametrize(("hold", "rolls"), [(HOLD_BROKER_LOCK, False), (HOLD_OWNER_LOCK, True)])
def test_a_brokers_idle_partition_is_planned_without_the_roll_it_never_makes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], hold: str, rolls: bool
) -> None:
    """A broker rolls only when it appends: the overdue active segment of an idle
    partition in its dir stays as it is, so `plan` plans nothing past that roll (no
    cleanable range, Kafka's delay 0), as the daemon's gauges have it. It planned the
    roll a cleanerd cycle makes, and a pass over the segment. A dir another cleanerd
    owns is still planned with its roll."""
    logs, state = tmp_path / "logs", tmp_path / "state"
    old = T0 - 30 * MIN  # past the minimum roll interval too
    batches = [[[kv(f"k{i % 2}", f"v{i}", timestamp=old + i)] for i in range(6)]]  # active only
    build_log(logs, batches, state_dir=state, tp=TopicPartition("cfg", 0))
    cfg = {
        "log.dirs": [str(logs)],
        "state_dir": str(state),
        "topics": {"cfg": {"cleanup.policy": "compact", "max.compaction.lag.ms": MIN}},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with held_by_other_process(hold, logs, state):
        assert main(["plan", "-c", str(path), "--now-ms", str(T0)]) == 0
        text = capsys.readouterr().out
        assert main(["plan", "-c", str(path), "--now-ms", str(T0), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
    (p,) = doc["partitions"]
    assert p["roll"]["due"]
    assert p["roll"]["at_next_append"] is not rolls
    assert bool(doc["rolled"]) is rolls
    assert (p["compaction"]["cleanable_bytes"] > 0) is rolls
    assert (p["compaction"]["kafka_overdue_ms"] > 0) is rolls
    assert ("roll: due at the broker's next append (max.compaction.lag.ms" in text) is not rolls


def test_a_brokers_roll_is_held_by_no_minimum_interval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A broker's partition that rolled a second ago, whose active segment's first batch
    is past `max.compaction.lag.ms`: the broker rolls it at its next append (Kafka's
    `LogSegment.shouldRoll` keeps no minimum interval), and `plan` says so. It held the
    roll by cleanerd's own `rolls.min_interval_ms`, a rule of cleanerd's rolls only."""
    logs, state = tmp_path / "logs", tmp_path / "state"
    old = T0 - 5 * MIN
    segments = [
        [[kv("a", "1", timestamp=old)], [kv("a", "2", timestamp=old)]],
        [[kv("a", "3", timestamp=old)], [kv("b", "4", timestamp=old)]],
    ]
    build_log(logs, segments, state_dir=state, tp=TopicPartition("cfg", 0))
    for f in (logs / "cfg-0").iterdir():
        os.utime(f, ns=((T0 - 1_000) * 1_000_000,) * 2)  # the roll a second ago
    path = tmp_path / "c.yaml"
    topics = {"cfg": {"cleanup.policy": "compact", "max.compaction.lag.ms": MIN}}
    path.write_text(
        yaml.safe_dump({"log.dirs": [str(logs)], "state_dir": str(state), "topics": topics})
    )
    with held_by_other_process(HOLD_BROKER_LOCK, logs, state):
        assert main(["plan", "-c", str(path), "--now-ms", str(T0)]) == 0
        text = capsys.readouterr().out
    assert "roll: due at the broker's next append (max.compaction.lag.ms" in text, text


def test_a_root_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    """A root checkpoint that cannot be read (a dir where the file should be, here) is
    named in the error, not only the log dir and the reason."""
    logs, state = tmp_path / "logs", tmp_path / "state"
    build_log(logs, [[[kv("a", "1")]]], state_dir=state, tp=TopicPartition("users", 0))
    (logs / "recovery-point-offset-checkpoint").mkdir()
    cfg = Config.model_validate({"log.dirs": [str(logs)], "state_dir": str(state)})
    (error,) = gather(cfg, now_ms=T0).errors
    assert error == (
        f"{logs}: offline, not read: {logs / 'recovery-point-offset-checkpoint'}: Is a directory"
    )


def test_a_roll_for_retention_is_said_on_the_roll_line_by_its_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """When retention takes every segment, the roll line says the active segment rolls
    now, for that rule (it said "not yet; segment.ms rolls it at ..." right above
    "retention: roll first"), the JSON names the same rule as `clean` does, and the
    deletions are counted in segments."""
    now = time.time_ns() // 1_000_000
    old = now - 3 * HOUR
    logs = tmp_path / "logs"
    build_log(
        logs,
        [[[kv(None, "e", timestamp=old)]], [[kv(None, "f", timestamp=old)]]],
        state_dir=tmp_path / "state",
        tp=TopicPartition("events", 0),
    )
    path = config_file(tmp_path, [logs])
    assert main(["plan", "-c", str(path), "--now-ms", str(now)]) == 0
    text = capsys.readouterr().out
    assert main(["plan", "-c", str(path), "--now-ms", str(now), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "roll: due now (retention.ms: retention takes every segment)" in text
    assert "retention: roll first, then delete retention.ms: 2 segments (" in text
    assert [(r["base_offset"], r["reason"]) for r in doc["rolled"]] == [(1, "retention.ms")]
