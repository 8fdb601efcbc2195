"""Tests of the swap protocol's file order."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cleanerd.compaction.swap import (
    FileOps,
    cleaned_files,
    remove_stale_cleaned,
    replace_segments,
)
from cleanerd.log.files import log_file, segment_file
from tests.compaction.crashing_ops import CrashingOps


def seg(d: Path, base: int, *, suffix: str = "", content: bytes = b"x") -> None:
    for kind in (".log", ".index", ".timeindex"):
        segment_file(d, base, kind, suffix).write_bytes(content)


def test_replace_order_and_result(tmp_path: Path) -> None:
    """.cleaned -> .swap, old -> .deleted (uncovered first), .swap -> final, dir fsyncs."""
    for base in (0, 10, 20):
        seg(tmp_path, base, content=b"old")
    seg(tmp_path, 0, suffix=".cleaned", content=b"new")
    ops = CrashingOps()
    deleted = replace_segments(
        tmp_path, new_bases=[0], new_next_offset=15, old_bases=[0, 10, 20], ops=ops
    )
    renames = [t for t in ops.trace if t.startswith("rename")]
    assert renames[0] == "rename 00000000000000000000.log.cleaned -> 00000000000000000000.log.swap"
    first_deleted = next(t for t in renames if ".deleted" in t)
    assert first_deleted.startswith("rename 00000000000000000020.log ")
    assert ops.trace.count("fsync_dir") == 3
    assert log_file(tmp_path, 0).read_bytes() == b"new"
    assert not log_file(tmp_path, 10).exists()
    assert sorted(p.name for p in deleted) == sorted(
        f"{b:020d}{k}.deleted" for b in (0, 10, 20) for k in (".log", ".index", ".timeindex")
    )
    assert not any(p.exists() for p in cleaned_files(tmp_path, 0))


def test_a_swap_looks_only_at_its_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A swap holds the partition's lock: it asks about the names of its own group, never
    reads the whole dir, whose thousands of segments (tens of ms per listing) would
    otherwise be paid at every group of a pass."""
    for base in range(0, 20_000, 10):
        seg(tmp_path, base, content=b"old")
    seg(tmp_path, 0, suffix=".cleaned", content=b"new")

    def refused(*_: object) -> None:
        raise AssertionError("the swap listed the partition dir")

    monkeypatch.setattr(os, "listdir", refused)
    monkeypatch.setattr(os, "scandir", refused)
    replace_segments(
        tmp_path, new_bases=[0], new_next_offset=15, old_bases=[0, 10], ops=CrashingOps()
    )
    monkeypatch.undo()
    assert log_file(tmp_path, 0).read_bytes() == b"new"
    assert not log_file(tmp_path, 10).exists()
    assert log_file(tmp_path, 20).read_bytes() == b"old"


def test_replace_with_several_new_segments(tmp_path: Path) -> None:
    """An output split in two is swapped as one: `.cleaned` -> `.swap` highest base
    first, every old segment `.deleted` (a same-base one too), both new segments final."""
    for base in (0, 10, 20):
        seg(tmp_path, base, content=b"old")
    seg(tmp_path, 0, suffix=".cleaned", content=b"new0")
    seg(tmp_path, 12, suffix=".cleaned", content=b"new12")
    ops = CrashingOps()
    deleted = replace_segments(
        tmp_path, new_bases=[0, 12], new_next_offset=25, old_bases=[0, 10, 20], ops=ops
    )
    renames = [t for t in ops.trace if t.startswith("rename")]
    assert renames[0] == "rename 00000000000000000012.log.cleaned -> 00000000000000000012.log.swap"
    assert renames[3].startswith("rename 00000000000000000000.log.cleaned")
    assert log_file(tmp_path, 0).read_bytes() == b"new0"
    assert log_file(tmp_path, 12).read_bytes() == b"new12"
    assert not log_file(tmp_path, 10).exists()
    assert not log_file(tmp_path, 20).exists()
    assert len(deleted) == 9
    assert not list(tmp_path.glob("*.cleaned"))
    assert not list(tmp_path.glob("*.swap"))


def test_remove_stale_cleaned(tmp_path: Path) -> None:
    """Every `.cleaned` segment file of the dir goes, whatever its base; nothing else
    does, not even a file whose name is not a segment file's (an operator's)."""
    seg(tmp_path, 0)
    seg(tmp_path, 7, suffix=".cleaned")
    seg(tmp_path, 9, suffix=".cleaned")
    (tmp_path / "orders.log.cleaned").write_bytes(b"keep")
    gone = remove_stale_cleaned(tmp_path, FileOps())
    assert len(gone) == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*(f"{0:020d}{k}" for k in (".log", ".index", ".timeindex")), "orders.log.cleaned"]
    )
