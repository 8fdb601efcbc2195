"""Routing between the local and the Spark engine by the dirty range's key count (no
Spark needed: the engines here are fakes)."""

from __future__ import annotations

import shutil
from concurrent.futures import Future
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from cleanerd.compaction.cleaner import CleanerConfig, CleanResult
from cleanerd.compaction.stats import CleanerStats
from cleanerd.config import config_from_data
from cleanerd.engine.base import CleanJob
from cleanerd.engine.routing import (
    AutoEngine,
    KeyEstimate,
    auto_engine,
    choose_engine,
    estimate_keys,
    gee_distinct,
    keys_from_filled_map,
    local_key_capacity,
)
from cleanerd.errors import ConfigError
from cleanerd.log.files import TopicPartition
from tests.compaction.conftest import TP, LogBuilder, k, segment_metas
from tests.engine.owned import own

STATS = CleanerStats(0, 0, 0, 0, 0, 0, 0, 0.0, 0, 0, 0)


class FakeEngine:
    """Resolves every pass at once, ending at `end` (None: the planned end)."""

    def __init__(self, name: str, end: int | None = None) -> None:
        self.name = name
        self.workers = 1
        self.dead_workers = 0
        self.end = end
        self.jobs: list[CleanJob] = []
        self.shut = False
        self.flushes = 0

    def submit_clean(self, job: CleanJob) -> Future[CleanResult]:
        self.jobs.append(job)
        f: Future[CleanResult] = Future()
        end = job.first_uncleanable if self.end is None else self.end
        f.set_result(CleanResult(job.first_dirty, end, STATS, ()))
        return f

    def flush(self) -> None:
        self.flushes += 1

    def abort(self, tp: TopicPartition) -> bool:
        return False

    def shutdown(self, *, abort: bool = False) -> None:
        self.shut = True


def build(tmp_path: Path, keys: int, *, per_batch: int = 50) -> CleanJob:
    log = LogBuilder(tmp_path / "build")
    for start in range(0, keys, per_batch):
        log.append([(k(i), b"v") for i in range(start, min(keys, start + per_batch))])
        log.roll()
    log.append([(k("x"), b"active")])
    d = tmp_path / "logs" / str(TP)
    d.parent.mkdir(parents=True)
    shutil.move(log.write(), d)
    own(d.parent)
    metas = tuple(segment_metas(d))
    return CleanJob(
        log_dir=d.parent,
        state_dir=tmp_path / "state",
        tp=TP,
        segments=metas,
        first_dirty=0,
        first_uncleanable=metas[-1].base_offset,
        now_ms=0,
        config=CleanerConfig(),
    )


def test_capacity_is_one_workers_map() -> None:
    """The capacity follows Kafka's split of the buffer and the entry size."""
    assert local_key_capacity(24_000, 2, 0.9, versioned=False) == 450
    assert local_key_capacity(24_000, 2, 0.9, versioned=True) == 337


def test_gee_estimates_distinct_values() -> None:
    """GEE is exact on a full sample and scales the singletons of a partial one."""
    assert gee_distinct([1, 1, 2, 3], population=7) == 4
    assert gee_distinct([1] * 100, population=10_000) == 1000
    assert gee_distinct([], population=5) == 0


def test_choose_engine() -> None:
    """Spark only above the capacity."""
    assert choose_engine(KeyEstimate(10, "sample"), 10) == "local"
    assert choose_engine(KeyEstimate(11, "sample"), 10) == "spark"


def test_estimate_from_size_and_sample(tmp_path: Path) -> None:
    """A small range is judged by its size; a large one by a sample, within a factor of
    the truth for a log of unique keys."""
    job = build(tmp_path, keys=2000)
    small = estimate_keys(job, capacity=10**9)
    assert small.source == "size"
    assert small.keys > 2000
    sampled = estimate_keys(job, capacity=100, sample_bytes=16_000)
    assert sampled.source == "sample"
    assert 1000 <= sampled.keys <= 4000


def test_auto_engine_routes_big_ranges_and_learns_from_a_filled_map(tmp_path: Path) -> None:
    """Small ranges stay local without creating a Spark engine; a local pass that ended
    early sends the partition's next pass to Spark; flushes reach both engines (the
    Spark one once made); audits run locally."""
    job = build(tmp_path, keys=400)
    local = FakeEngine("local", end=10)
    spark = FakeEngine("spark")
    made: list[FakeEngine] = []

    def factory() -> FakeEngine:
        made.append(spark)
        return spark

    policy = AutoEngine(local, factory, lambda j: 10**6)
    policy.submit_clean(job)
    policy.flush()
    assert (len(local.jobs), made, local.flushes) == (1, [], 1)
    policy.submit_clean(job)  # the first pass filled the map (ended at 10)
    policy.flush()
    assert (len(local.jobs), len(spark.jobs), spark.flushes) == (1, 1, 1)
    assert policy.decisions[TP][1].source == "history"
    tight = AutoEngine(FakeEngine("local"), lambda: spark, lambda j: 50, sample_bytes=4000)
    with capture_logs() as logs:
        tight.submit_clean(job)
    (routed,) = logs  # which engine ran a pass was said nowhere
    assert (routed["event"], routed["log_level"], routed["engine"]) == (
        "clean.routed",
        "info",
        "spark",
    )
    assert (routed["keys_from"], routed["local_capacity"]) == ("sample", 50)
    assert len(spark.jobs) == 2
    assert tight.decisions[TP][0] == "spark"
    assert policy.workers == 2
    policy.shutdown()
    assert local.shut
    assert spark.shut


def test_choose_engine_with_a_threshold_above_the_capacity() -> None:
    """With min_keys_over_capacity 5, Spark only above five maps' worth of keys."""
    assert choose_engine(KeyEstimate(50, "sample"), 10, min_keys_over_capacity=5.0) == "local"
    assert choose_engine(KeyEstimate(51, "sample"), 10, min_keys_over_capacity=5.0) == "spark"


def test_a_filled_map_scales_the_history_estimate(tmp_path: Path) -> None:
    """A local pass whose full map covered a quarter of the range counts 4x the capacity
    (local under a threshold of 5); one that covered an eighth, 8x (Spark)."""
    job = build(tmp_path, keys=400)
    span = job.first_uncleanable - job.first_dirty
    for divisor, where in ((4, "local"), (8, "spark")):
        end = job.first_dirty + span // divisor
        assert keys_from_filled_map(job, end, 100) == 100 * divisor
        policy = AutoEngine(
            FakeEngine("local", end=end),
            lambda: FakeEngine("spark"),
            lambda j: 100,
            sample_bytes=10**9,  # the whole range: exactly 400 keys
            min_keys_over_capacity=5.0,
        )
        policy.submit_clean(job)
        assert policy.decisions[TP] == ("local", KeyEstimate(400, "sample"))
        policy.submit_clean(job)
        assert policy.decisions[TP] == (where, KeyEstimate(100 * divisor, "history"))


def test_min_keys_over_capacity_reaches_the_auto_engine() -> None:
    """engine.spark.min_keys_over_capacity is validated (>= 1, finite) and applied."""
    data = {"log.dirs": ["/nonexistent"], "engine": {"spark": {"min_keys_over_capacity": 5.5}}}
    engine = auto_engine(config_from_data(data))
    engine.shutdown()
    assert engine.min_keys_over_capacity == 5.5
    for bad in (0.5, float("inf")):
        data["engine"] = {"spark": {"min_keys_over_capacity": bad}}
        with pytest.raises(ConfigError, match="min_keys_over_capacity"):
            config_from_data(data)
