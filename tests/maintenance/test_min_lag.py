"""min.compaction.lag.ms: no record younger than the lag is ever compacted, record by record."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cleanerd.config import load_config
from cleanerd.engine.local import LocalEngine, WorkerSettings
from cleanerd.log.files import TopicPartition
from cleanerd.log.partition_log import LogConfig, PartitionLog
from cleanerd.maintenance.cycle import Maintenance
from tests.builders import kv

MIN_LAG_MS = 10_000
TP = TopicPartition("t", 0)

Snapshot = dict[int, tuple[bytes | None, bytes | None, int]]


def snapshot(d: Path, state: Path) -> Snapshot:
    """Every record on disk: offset -> (key, value, timestamp)."""
    plog = PartitionLog.open(d, state_dir=state, read_only=True)
    return {r.offset: (r.key, r.value, r.timestamp) for r in plog.records()}


@pytest.fixture(name="engine", scope="module")
def _engine() -> Iterator[LocalEngine]:
    with LocalEngine(WorkerSettings(workers=1, dedupe_buffer_size=1 << 20)) as engine:
        yield engine


step = st.tuples(
    st.integers(min_value=0, max_value=2 * MIN_LAG_MS),  # time that passes
    st.lists(st.integers(min_value=0, max_value=7), min_size=0, max_size=25),  # keys written
)


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(steps=st.lists(step, min_size=3, max_size=10))
def test_nothing_younger_than_min_lag_is_compacted(
    engine: LocalEngine, steps: list[tuple[int, list[int]]]
) -> None:
    """Writes and cycles at injected times: after every cycle each record younger than
    min.compaction.lag.ms is still on disk, unchanged; once everything is older than the
    lag, the superseded records are gone."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        logs, state = root / "logs", root / "state"
        logs.mkdir()
        (root / "c.yaml").write_text(
            yaml.safe_dump(
                {
                    "log.dirs": [str(logs)],
                    "state_dir": str(state),
                    "topics": {
                        "t": {
                            "cleanup.policy": "compact",
                            "segment.bytes": 600,
                            "min.compaction.lag.ms": MIN_LAG_MS,
                            "min.cleanable.dirty.ratio": 0.0,
                        }
                    },
                }
            )
        )
        cfg = load_config(root / "c.yaml")
        log_config = LogConfig(segment_bytes=600)
        producer = PartitionLog.create(logs, TP, state_dir=state, config=log_config)
        latest: dict[bytes, int] = {}
        now = [1_700_000_000_000]
        with Maintenance(cfg, engine, clock=lambda: now[0]) as m:
            for n, (advance, keys) in enumerate(steps):
                now[0] += advance
                for i, key in enumerate(keys):
                    offset, _ = producer.append([kv(f"k{key}", f"v{n}-{i}", timestamp=now[0])])
                    latest[f"k{key}".encode()] = offset
                before = snapshot(logs / str(TP), state)
                m.run_once()
                after = snapshot(logs / str(TP), state)
                young = {o: r for o, r in before.items() if now[0] - r[2] < MIN_LAG_MS}
                assert {o: after.get(o) for o in young} == young
            # Long after the last write, compaction catches up: one record per key is
            # left outside the active segment.
            now[0] += 2 * MIN_LAG_MS
            producer.roll(now[0])
            producer.append([kv("end", "x", timestamp=now[0])])
            now[0] += 2 * MIN_LAG_MS
            m.run_once()
        final = snapshot(logs / str(TP), state)
        assert sorted(o for o, r in final.items() if r[0] != b"end") == sorted(latest.values())
