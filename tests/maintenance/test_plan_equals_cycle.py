"""Property: what `cleanerd plan --json --now-ms T` lists is exactly what the next cycle at
T (`cleanerd clean --now-ms T`) does, over random log dirs and topic configs.

Each example builds one log dir of a few partitions (random segments, keys, tombstones,
record ages, a log start offset raised by a checkpoint), a config with random time,
size and compaction settings, then plans it (`gather` + `plan_cycle`, as `plan` does)
and runs one cycle over it (`Maintenance.run_once`, as `clean` does) at the same
instant. The rolls, the deletions (reasons, sizes) and the partitions cleaned, in their
order, must be the same, under the names both JSON documents share.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cleanerd.config import load_config
from cleanerd.engine.local import LocalEngine, WorkerSettings
from cleanerd.log.checkpoint import LOG_START_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleanerd.log.files import TopicPartition
from cleanerd.maintenance.cycle import Maintenance
from cleanerd.maintenance.plan import cycle_json, gather, plan_cycle
from cleanerd.records.record import Record
from tests.builders import build_log, kv
from tests.holders import HOLD_OWNER_LOCK, held_by_other_process

MIN = 60_000
HOUR = 60 * MIN
NOW = 1_900_000_000_000
"""The instant of the plan and the cycle (records are dated relative to it)."""

POLICIES = [["compact"], ["delete"], ["compact", "delete"]]

topic_configs = st.fixed_dictionaries(
    {
        "cleanup.policy": st.sampled_from(POLICIES),
        "retention.ms": st.sampled_from([-1, HOUR, 3 * HOUR]),
        "retention.bytes": st.sampled_from([-1, 150, 400]),
        "segment.ms": st.sampled_from([30 * MIN, 7 * 24 * HOUR]),
        "max.compaction.lag.ms": st.sampled_from([HOUR, 2**63 - 1]),
        "min.compaction.lag.ms": st.sampled_from([0, 30 * MIN]),
        "min.cleanable.dirty.ratio": st.sampled_from([0.1, 0.5, 0.99]),
        "segment.jitter.ms": st.just(0),
    }
)

records = st.builds(
    lambda key, tombstone, age_min: kv(
        f"k{key}", None if tombstone else f"v{age_min}", timestamp=NOW - age_min * MIN
    ),
    st.integers(0, 5),
    st.booleans(),
    st.integers(-5, 300),  # a few in the future, most up to five hours old
)
segments = st.lists(st.lists(st.lists(records, min_size=1, max_size=3), min_size=1, max_size=3))
partitions = st.lists(
    st.tuples(topic_configs, segments.filter(bool), st.integers(0, 3)), min_size=1, max_size=4
)


@pytest.fixture(name="engine", scope="module")
def _engine() -> Iterator[LocalEngine]:
    with LocalEngine(WorkerSettings(workers=1, dedupe_buffer_size=4 * 1024 * 1024)) as engine:
        yield engine


def _build(root: Path, parts: list[tuple[dict[str, Any], list[list[list[Record]]], int]]) -> Path:
    """The log dir and config of one example; file mtimes are those of their newest
    record (as a producer writing then would leave them)."""
    logs, state = root / "logs", root / "state"
    topics: dict[str, dict[str, Any]] = {}
    starts: dict[TopicPartition, int] = {}
    for n, (topic, segs, start) in enumerate(parts):
        tp = TopicPartition(f"t{n}", 0)
        topics[tp.topic] = topic
        plog = build_log(logs, segs, state_dir=state, tp=tp)
        if start:
            starts[tp] = min(start, plog.log_end_offset)
        for f in (logs / str(tp)).iterdir():
            newest = max((r.timestamp for seg in segs for b in seg for r in b), default=NOW)
            os.utime(f, ns=(newest * 1_000_000, newest * 1_000_000))
    if starts:
        OffsetCheckpointFile(logs / LOG_START_OFFSET_CHECKPOINT).write(starts)
    doc = {
        "log.dirs": [str(logs)],
        "state_dir": str(state),
        "log.cleaner.dedupe.buffer.size": 4 * 1024 * 1024,
        "log.retention.disk.usage.percent": 100,
        "topics": topics,
    }
    path = root / "cleanerd.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(parts=partitions)
def test_plan_lists_exactly_what_the_next_cycle_does(
    engine: LocalEngine, parts: list[tuple[dict[str, Any], list[list[list[Record]]], int]]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(_build(Path(tmp), parts))
        gathered = gather(cfg, now_ms=NOW)
        assert gathered.errors == []
        plan = cycle_json(
            plan_cycle(
                gathered.inputs,
                now_ms=NOW,
                cleaner_enabled=cfg.log_cleaner_enable,
                min_roll_interval_ms=cfg.rolls.min_interval_ms,
            )
        )
        with Maintenance(cfg, engine, clock=lambda: NOW) as m:
            done = m.run_once().to_json()
    assert done["errors"] == []
    assert plan["rolled"] == done["rolled"]
    assert plan["deleted"] == done["deleted"]
    assert [f"{c['topic']}-{c['partition']}" for c in done["cleaned"]] == plan["cleaning_order"]


def _config_above(
    tmp_path: Path, dev: Path, logs: Path, margin: int, topics: dict[str, dict[str, Any]]
) -> Path:
    """The config of `logs`, whose KIP-61 threshold is `margin` bytes below the usage of
    the device `dev` now (at most 100%: a negative margin can turn the rule off)."""
    from cleanerd.retention.disk import psutil_space

    space = psutil_space(dev)
    doc = {
        "log.dirs": [str(logs)],
        "state_dir": str(tmp_path / "state"),
        "log.retention.disk.usage.percent": min(
            100, int(100 * (space.used_bytes - margin) / space.total_bytes)
        ),
        "topics": topics,
    }
    path = tmp_path / "cleanerd.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _run_json(
    command: str, config: Path, capsys: pytest.CaptureFixture[str], *, status: int
) -> dict[str, Any]:
    """`cleanerd COMMAND --json` at NOW, in process: its document, once its exit status
    is `status`."""
    from cleanerd.cli import main

    code = main([command, "-c", str(config), "--json", "--now-ms", str(NOW)])
    out = capsys.readouterr()
    assert code == status, out.err
    doc: dict[str, Any] = json.loads(out.out)
    return doc


def test_plan_predicts_disk_usage_after_what_the_cycle_frees_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a real tmpfs above its KIP-61 threshold, where retention deletes segments in
    the same cycle and a `.deleted` file is left over from an earlier one, `plan` lists
    exactly the segments the cycle deletes for disk usage: the cycle measures after the
    open removed the leftover and the retention deletions were unlinked. The plan
    measured before both, and listed more."""
    from tests.tools import tmpfs

    with tmpfs(tmp_path / "dev", "8m") as dev:
        logs = dev / "logs"
        value = "x" * 15_000
        for topic, n in (("ev", 0), ("ev", 1), ("cp", 0)):
            segments = [
                [[kv(f"{topic}{n}-{s}-{i}", value, timestamp=NOW - (20 - s - 4 * n) * HOUR)]
                 for i in range(20)]
                for s in range(5)
            ]  # fmt: skip
            build_log(logs, segments, state_dir=tmp_path / "state", tp=TopicPartition(topic, n))
        leftover = logs / "cp-0" / "00000000000000099999.log.deleted"
        leftover.write_bytes(os.urandom(600_000))
        # Above the threshold by more than the leftover and retention free first.
        topics = {
            "ev": {"cleanup.policy": "delete", "retention.bytes": 700_000},
            "cp": {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 1.0},
        }
        config = _config_above(tmp_path, dev, logs, 3_200_000, topics)

        def run(command: str) -> dict[str, Any]:
            return _run_json(command, config, capsys, status=0)

        def disk(doc: dict[str, Any]) -> list[tuple[str, int, int]]:
            return [
                (d["topic"], d["partition"], d["base_offset"])
                for d in doc["deleted"]
                if d["reason"] == "disk.usage"
            ]

        capsys.readouterr()  # what building the log printed
        plan, done = run("plan"), run("clean")
        assert not leftover.exists()
        assert [d for d in done["deleted"] if d["reason"] == "retention.bytes"]
        assert disk(done)
        assert disk(plan) == disk(done)


def test_plan_predicts_what_retention_and_disk_usage_delete_around_a_damaged_segment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a real tmpfs above its KIP-61 threshold, a `delete` and a `compact,delete`
    partition whose third segment has a bad CRC in its first batch: `plan` lists exactly
    the deletions the cycle makes, by retention.ms and by disk usage, in these partitions
    (the segments before the damage) and in a healthy one, and that the compacted one's
    retention is skipped (it is uncleanable; disk usage still takes its segments before
    the damage); both exit 1 and name the damaged files."""
    from tests.tools import tmpfs

    with tmpfs(tmp_path / "dev", "8m") as dev:
        logs = dev / "logs"
        value = "x" * 15_000
        for topic, age in (("bad", 30), ("good", 20), ("cd", 29)):
            segments = [
                [[kv(f"{topic}-{s}-{i}", value, timestamp=NOW - (age - 2 * s) * HOUR)]
                 for i in range(15)]
                for s in range(6)
            ]  # fmt: skip
            build_log(logs, segments, state_dir=tmp_path / "state", tp=TopicPartition(topic, 0))
            for f in (logs / f"{topic}-0").iterdir():
                base = int(f.name.split(".")[0]) // 15
                stamp = (NOW - (age - 2 * base) * HOUR) * 1_000_000
                os.utime(f, ns=(stamp, stamp))
        damaged = logs / "bad-0" / "00000000000000000030.log"
        compacted = logs / "cd-0" / "00000000000000000030.log"
        for path in (damaged, compacted):
            stat = path.stat()
            data = bytearray(path.read_bytes())
            data[65] ^= 0xFF
            path.write_bytes(bytes(data))
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        topics = {
            "bad": {"cleanup.policy": "delete", "retention.ms": 25 * HOUR},
            "good": {"cleanup.policy": "delete", "retention.ms": 25 * HOUR},
            "cd": {"cleanup.policy": "compact,delete", "retention.ms": 25 * HOUR},
        }
        config = _config_above(tmp_path, dev, logs, 1_000_000, topics)

        def run(command: str) -> dict[str, Any]:
            doc = _run_json(command, config, capsys, status=1)
            reasons = {u["topic"]: u["reason"] for u in doc["unreadable"]}
            assert sorted(reasons) == ["bad", "cd"]
            assert str(damaged) in reasons["bad"]
            assert str(compacted) in reasons["cd"]
            return doc

        def deleted(doc: dict[str, Any]) -> list[tuple[str, int, str]]:
            return [(d["topic"], d["base_offset"], d["reason"]) for d in doc["deleted"]]

        capsys.readouterr()  # what building the log printed
        plan, done = run("plan"), run("clean")
        # The damaged segment (26 hours old) stops retention.ms and disk usage in its
        # partition; the device is freed from the others.
        assert deleted(done) == [
            ("bad", 0, "retention.ms"),
            ("bad", 15, "retention.ms"),
            ("cd", 0, "disk.usage"),
            ("cd", 15, "disk.usage"),
            ("good", 0, "disk.usage"),
        ]
        assert deleted(plan) == deleted(done)
        assert plan["skipped"] == done["skipped"]
        assert [(s["topic"], s["phase"]) for s in done["skipped"]] == [("cd", "retention")]
        assert damaged.exists()
        assert compacted.exists()


def test_plan_predicts_the_disk_usage_deletions_of_tiny_segments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a real tmpfs (4 KiB blocks) above its KIP-61 threshold, partitions of one-record
    segments (a quiet topic's shape): each deletion frees whole blocks, not the hundred
    or so bytes of its files, and `plan` lists exactly the deletions the cycle makes.
    Before, it counted the files' sizes and listed every segment."""
    from tests.tools import tmpfs

    with tmpfs(tmp_path / "dev", "4m") as dev:
        logs = dev / "logs"
        for n in range(3):
            segments = [
                [[kv(f"k{s}", "v", timestamp=NOW - (50 - s - n) * HOUR)]] for s in range(12)
            ]
            build_log(logs, segments, state_dir=tmp_path / "state", tp=TopicPartition("q", n))
        topics = {"q": {"cleanup.policy": "delete"}}
        capsys.readouterr()  # what building the log printed
        # A first clean writes the dir's checkpoints, as on any host cleanerd maintains:
        # the blocks of new files are not in the plan's measure.
        _run_json("clean", _config_above(tmp_path, dev, logs, -(2**40), topics), capsys, status=0)
        config = _config_above(tmp_path, dev, logs, 5 * 2 * 4096, topics)
        plan = _run_json("plan", config, capsys, status=0)
        done = _run_json("clean", config, capsys, status=0)
    assert len(done["deleted"]) >= 5
    assert plan["deleted"] == done["deleted"]
    # A one-record segment has no offset-index entry: a `.log` and a `.timeindex` block.
    assert {d["freed_bytes"] for d in done["deleted"]} == {2 * 4096}


@pytest.mark.parametrize("indexed", [True, False])
@pytest.mark.parametrize("marker", [False, True])
@pytest.mark.parametrize("policy", ["delete", "compact,delete"])
def test_plan_reads_a_torn_tail_as_the_owners_open_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], policy: str, marker: bool, indexed: bool
) -> None:
    """The active segment's last batch is torn (a bad CRC), with or without its index
    entry written. Without a clean-shutdown marker (a crash) the owner's open cuts that
    batch, so `plan` reads the segment as the cut leaves it (here every segment expired:
    roll, then delete them all); after a clean stop the owner trusts the segment, meets
    the damage, and retention stops before it, as `plan` says (nobody writes the dir:
    the bad tail is no append in flight). Either way `plan` lists exactly the rolls,
    deletions and skips of the cycle. Before, `plan` called the crashed partition
    unreadable, blaming the index, and read the stopped one's unindexed bad tail as an
    append in flight."""
    from cleanerd.log.partition_log import LogConfig

    segments = [
        [[kv(f"k{s}-{i}", "v" * 50, timestamp=NOW - (9 - s) * HOUR)] for i in range(4)]
        for s in range(3)
    ]
    build_log(
        tmp_path / "logs",
        segments,
        state_dir=tmp_path / "state",
        tp=TopicPartition("t", 0),
        config=LogConfig(index_interval_bytes=1 if indexed else 4096),
    )
    config = tmp_path / "cleanerd.yaml"

    def configure(retention_ms: int) -> None:
        topic = {
            "cleanup.policy": policy,
            "retention.ms": retention_ms,
            "min.cleanable.dirty.ratio": 1.0,
            "segment.ms": 10**12,  # no roll of the damaged active segment by a clean stop
        }
        doc = {
            "log.dirs": [str(tmp_path / "logs")],
            "state_dir": str(tmp_path / "state"),
            "topics": {"t": topic},
        }
        config.write_text(yaml.safe_dump(doc))

    capsys.readouterr()  # what building the log printed
    if marker:
        configure(-1)
        _run_json("clean", config, capsys, status=0)  # a clean stop leaves the marker
    active = tmp_path / "logs" / "t-0" / "00000000000000000008.log"
    data = bytearray(active.read_bytes())
    last = 0
    while last + 12 + int.from_bytes(data[last + 8 : last + 12], "big") < len(data):
        last += 12 + int.from_bytes(data[last + 8 : last + 12], "big")
    data[-1] ^= 0xFF
    active.write_bytes(bytes(data))
    configure(HOUR)
    plan = _run_json("plan", config, capsys, status=1 if marker else 0)
    done = _run_json("clean", config, capsys, status=1 if marker else 0)
    assert [u["topic"] for u in plan["unreadable"]] == (["t"] if marker else [])
    for key in ("deleted", "skipped"):
        assert plan[key] == done[key], key
    # (`waited_ms` counts from the wall clock at which each process saw the segment.)
    rolls = [[(r["base_offset"], r["reason"]) for r in doc["rolled"]] for doc in (plan, done)]
    assert rolls[0] == rolls[1]
    if not marker:
        assert [(t["topic"], t["position"]) for t in done["truncated"]] == [("t", last)]
        assert [d["base_offset"] for d in done["deleted"]] == [0, 4, 8]
    elif policy == "delete":
        assert [d["base_offset"] for d in done["deleted"]] == [0, 4]
    else:
        assert done["deleted"] == []


def test_plan_finds_a_passed_horizon_in_the_segment_the_cycle_rolls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The active segment, due to roll, holds a tombstone whose delete horizon (stamped
    by an earlier pass) has passed: the cycle rolls it, then finds the horizon due and
    cleans, and `plan` says so, also beside a daemon that holds the dir. Before, `plan`
    read horizons of the closed segments only and predicted the roll but no pass."""
    from cleanerd.log.partition_log import PartitionLog
    from cleanerd.records.batch import encode_batch

    old = NOW - 10 * 24 * HOUR
    (tmp_path / "logs").mkdir()
    plog = PartitionLog.create(
        tmp_path / "logs", TopicPartition("t", 0), state_dir=tmp_path / "state"
    )
    plog.append_batches(encode_batch([Record(0, old, b"k0", b"v0")], base_offset=0))
    stamped = encode_batch(
        [Record(1, old + 1, b"k0", None)], base_offset=1, delete_horizon_ms=NOW - 1000
    )
    plog.append_batches(stamped)
    plog.append_batches(encode_batch([Record(2, old + 2, b"k1", b"v2")], base_offset=2))
    plog.flush()
    config = tmp_path / "cleanerd.yaml"
    topic = {
        "cleanup.policy": "compact",
        "segment.ms": 24 * HOUR,
        "min.cleanable.dirty.ratio": 1.0,
        "delete.retention.ms": MIN,
    }
    doc = {
        "log.dirs": [str(tmp_path / "logs")],
        "state_dir": str(tmp_path / "state"),
        "rolls": {"min_interval_ms": 0},
        "topics": {"t": topic},
    }
    config.write_text(yaml.safe_dump(doc))
    capsys.readouterr()
    # Beside a cleanerd daemon holding the dir, `plan` says what that daemon's cycle does.
    with held_by_other_process(HOLD_OWNER_LOCK, tmp_path / "logs", tmp_path / "state"):
        beside = _run_json("plan", config, capsys, status=0)
    plan = _run_json("plan", config, capsys, status=0)
    done = _run_json("clean", config, capsys, status=0)
    assert [(r["base_offset"], r["reason"]) for r in done["rolled"]] == [(0, "segment.ms")]
    assert [(c["reason"], c["end_offset"]) for c in done["cleaned"]] == [("delete.retention.ms", 3)]
    assert plan["cleaning_order"] == ["t-0"]
    assert beside["observed"] != []
    assert beside["cleaning_order"] == ["t-0"]


def test_plan_cleans_nothing_the_disk_usage_step_deleted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a real tmpfs far above its KIP-61 threshold, the disk usage step deletes every
    closed segment of a dirty compacted partition; the clean step comes after it, so
    the cycle has nothing left to clean, and `plan` lists no pass either. Before, `plan`
    planned the pass over the snapshot retention left, before the disk usage step."""
    from tests.tools import tmpfs

    with tmpfs(tmp_path / "dev", "4m") as dev:
        logs = dev / "logs"
        segments = [[[kv(f"k{s % 2}", "v", timestamp=NOW - (50 - s) * HOUR)]] for s in range(8)]
        build_log(logs, segments, state_dir=tmp_path / "state", tp=TopicPartition("c", 0))
        (dev / "other-files").write_bytes(os.urandom(1 << 20))
        capsys.readouterr()  # what building the log printed
        kept = {"c": {"cleanup.policy": "delete"}}
        _run_json("clean", _config_above(tmp_path, dev, logs, -(2**40), kept), capsys, status=0)
        topics = {"c": {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.0}}
        config = _config_above(tmp_path, dev, logs, 500_000, topics)
        plan = _run_json("plan", config, capsys, status=0)
        done = _run_json("clean", config, capsys, status=0)
    assert [d["base_offset"] for d in done["deleted"]] == list(range(8))
    assert plan["deleted"] == done["deleted"]
    assert done["cleaned"] == []
    assert plan["cleaning_order"] == []
