"""The files between the Spark engine and its jobs: specs and manifests survive them."""

from __future__ import annotations

from pathlib import Path

from cleanerd.compaction.cleaner import CleanedGroup, CleanerConfig
from cleanerd.compaction.stats import CleanerStats
from cleanerd.compaction.strategy import resolve_strategy
from cleanerd.engine.spark.specs import JobSpec, Manifest, PassOutcome, PassSpec
from cleanerd.log.files import TopicPartition
from cleanerd.log.meta import SegmentMeta


def test_spec_and_manifest_round_trip(tmp_path: Path) -> None:
    """Spec and manifest survive their JSON files unchanged."""
    seg = SegmentMeta(0, 10, 700, 5, 5, 24, 12, 99)
    p = PassSpec(
        log_dir=Path("/x"),
        tp=TopicPartition("a-b", 3),
        segments=(seg,),
        first_dirty=2,
        first_uncleanable=10,
        now_ms=123,
        config=CleanerConfig(strategy=resolve_strategy("header", "vé")),
    )
    spec = JobSpec(passes=(p,), staging=Path("/s"), master="local[2]", conf={"k": "v"})
    spec.write(tmp_path / "spec.json")
    assert JobSpec.read(tmp_path / "spec.json") == spec
    stats = CleanerStats(1, 2, 3, 4, 5, 6, 7, 0.5, 8, 9, 10)
    group = CleanedGroup(0, 10, (0, 5), 3, 300, (7,))
    manifest = Manifest((PassOutcome(10, (group,), stats), PassOutcome(4, error="bad")), 1, 2, 3)
    manifest.write(tmp_path / "m.json")
    assert Manifest.read(tmp_path / "m.json") == manifest
