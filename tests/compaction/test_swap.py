"""Tests of the swap protocol's file order and of the pending-deletion queue."""

from __future__ import annotations

from pathlib import Path

from cleanerd.compaction.swap import FileOps, PendingDeletions, cleaned_files, replace_segments
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
        tmp_path, new_base=0, new_next_offset=15, old_bases=[0, 10, 20], ops=ops
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


def test_pending_deletions_wait_for_delay(tmp_path: Path) -> None:
    """Files are unlinked once their delay has passed, or all at once when asked."""
    a, b = tmp_path / "a.deleted", tmp_path / "b.deleted"
    a.write_bytes(b"1")
    b.write_bytes(b"2")
    q = PendingDeletions(FileOps())
    q.schedule([a], now_ms=0, delay_ms=100)
    q.schedule([b], now_ms=50, delay_ms=100)
    assert q.run_due(99) == []
    assert q.run_due(100) == [a]
    assert not a.exists()
    assert b.exists()
    b.unlink()  # removed by someone else: not an error
    assert q.unlink_all() == []
    assert len(q) == 0
