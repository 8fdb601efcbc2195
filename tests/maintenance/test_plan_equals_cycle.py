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
