"""Tests of `cleanerd clean` end to end on a real log dir."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cleanerd.cli import main
from cleanerd.log.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from tests.compaction.conftest import TP, LogBuilder, k, view

NOW = 1_700_000_000_000


def write_config(tmp_path: Path, **topic: object) -> Path:
    cfg = {
        "log.dirs": [str(tmp_path / "logs")],
        "state_dir": str(tmp_path / "state"),
        "topics": {
            "t": {"cleanup.policy": "compact", **topic},
            "other": {"cleanup.policy": "delete"},
        },
    }
    path = tmp_path / "cleanerd.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def build(tmp_path: Path) -> Path:
    log = LogBuilder(tmp_path / "logs")
    for i in range(30):
        log.append([(k(i % 3), k(i))], timestamps=[NOW - 10_000])
        if i % 10 == 9:
            log.roll()
    log.append([(k(0), None)], timestamps=[NOW])
    log.roll()
    log.append([(k(9), b"active")], timestamps=[NOW])
    return log.write()


def test_clean_compacts_prints_stats_and_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`clean` runs a pass, prints Kafka's stats block, moves the checkpoint, unlinks old files."""
    d = build(tmp_path)
    assert main(["clean", "-c", str(write_config(tmp_path)), "--now-ms", str(NOW)]) == 0
    out = capsys.readouterr().out
    assert "Log cleaner thread 0 cleaned log t-0 (dirty section = [0, 31])" in out
    assert "1 cleaning passes, 0 partitions uncleanable" in out
    v = view(d)
    assert v.keys == [k(1), k(2), k(9)]
    checkpoint = OffsetCheckpointFile(tmp_path / "logs" / CLEANER_OFFSET_CHECKPOINT).read()
    assert checkpoint == {TP: 31}
    assert not [p for p in d.iterdir() if p.name.endswith(".deleted")]


def test_clean_removes_tombstone_after_horizon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A later run past delete.retention.ms removes the stamped tombstone (horizon rule)."""
    d = build(tmp_path)
    cfg = str(write_config(tmp_path, **{"delete.retention.ms": 1000}))
    main(["clean", "-c", cfg, "--now-ms", str(NOW)])
    assert 30 in view(d).last_offsets
    assert main(["clean", "-c", cfg, "--now-ms", str(NOW + 1001)]) == 0
    assert "dirty section = [31, 31]" in capsys.readouterr().out
    batches = view(d)
    assert batches.keys == [k(1), k(2), k(9)]
    assert (30, 30) in zip(batches.bases, batches.last_offsets, strict=True)  # kept empty


def test_clean_skips_ineligible_and_other_topics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ratio of 1.0 is never exceeded: nothing is cleaned."""
    d = build(tmp_path)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    cfg = write_config(tmp_path, **{"min.cleanable.dirty.ratio": 1.0})
    assert main(["clean", "-c", str(cfg), "--now-ms", str(NOW)]) == 0
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before
    assert "0 cleaning passes" in capsys.readouterr().out


def test_corrupt_segment_marks_partition_uncleanable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A corrupt batch in the range to clean: exit 1, reason printed, files unchanged."""
    d = build(tmp_path)
    seg = d / "00000000000000000010.log"
    data = bytearray(seg.read_bytes())
    data[100] ^= 0xFF
    seg.write_bytes(bytes(data))
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    assert main(["clean", "-c", str(write_config(tmp_path)), "--now-ms", str(NOW)]) == 1
    out = capsys.readouterr().out
    assert "t-0: uncleanable:" in out
    assert "00000000000000000010.log" in out
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before
