"""Tests of the queue of `.deleted` files waiting for their delay."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.log import deletions, fsutil
from cleanerd.log.deletions import PendingDeletions


def test_pending_deletions_wait_for_delay(tmp_path: Path) -> None:
    """Files are unlinked once their delay has passed, or all at once when asked."""
    a, b = tmp_path / "a.deleted", tmp_path / "b.deleted"
    a.write_bytes(b"1")
    b.write_bytes(b"2")
    q = PendingDeletions()
    q.schedule([a], now_ms=0, delay_ms=100)
    q.schedule([b], now_ms=50, delay_ms=100)
    assert q.run_due(99) == []
    assert q.run_due(100) == [a]
    assert not a.exists()
    assert b.exists()
    b.unlink()  # removed by someone else: not an error
    assert q.unlink_all() == []
    assert len(q) == 0


def test_unlink_on_device_frees_only_that_device(tmp_path: Path) -> None:
    """Under disk pressure the files waiting on one device go at once, due or not; the
    others keep waiting."""
    a, b = tmp_path / "a.deleted", tmp_path / "b.deleted"
    a.write_bytes(b"1")
    b.write_bytes(b"2")
    q = PendingDeletions()
    q.schedule([a, b], now_ms=0, delay_ms=60_000)
    device = tmp_path.stat().st_dev
    assert q.unlink_on_device(device + 1, "full") == []
    assert len(q) == 2
    assert q.unlink_on_device(device, "full") == [a, b]
    assert not a.exists()
    assert not b.exists()
    assert len(q) == 0


def test_next_due_is_the_earliest_waiting_file(tmp_path: Path) -> None:
    """The daemon's deadline for the queue: the earliest due time, None when empty."""
    q = PendingDeletions()
    assert q.next_due_ms() is None
    q.schedule([tmp_path / "b.deleted"], now_ms=50, delay_ms=100)
    q.schedule([tmp_path / "a.deleted"], now_ms=0, delay_ms=100)
    assert q.next_due_ms() == 100
    q.run_due(100)
    assert q.next_due_ms() == 150


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.integers(1, 3)), max_size=12))
def test_files_go_in_due_order_and_in_scheduled_order_within_one_due_time(
    batches: list[tuple[int, int, int]],
) -> None:
    """Whatever order the due times come in (a shorter delay, a clock stepped back), the
    queue unlinks in due order, and files due at one time in the order scheduled."""
    with tempfile.TemporaryDirectory() as tmp:
        q = PendingDeletions()
        expected: list[tuple[int, int, Path]] = []
        for now, delay, count in batches:
            paths = []
            for _ in range(count):
                path = Path(tmp) / f"{len(expected)}.deleted"
                path.write_bytes(b"x")
                expected.append((now + delay, len(expected), path))
                paths.append(path)
            q.schedule(paths, now_ms=now, delay_ms=delay)
        assert q.next_due_ms() == (min(e[0] for e in expected) if expected else None)
        assert q.run_due(3) == [p for due, _, p in sorted(expected) if due <= 3]
        assert q.unlink_all() == [p for due, _, p in sorted(expected) if due > 3]


def test_a_big_batch_unlinks_directories_in_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A big batch (a clean of many partitions leaves thousands of files) unlinks the
    files of different directories at the same time: the first unlink of each of two
    directories meet at a barrier, which one thread alone never passes. Files of one
    directory stay in order, and every file (but the one already gone) is reported, in
    the order queued."""
    barrier = threading.Barrier(2, timeout=10)
    order: dict[Path, list[str]] = {}
    real = fsutil.safe_unlink

    def unlink(path: Path | str) -> None:
        path = Path(path)
        seen = order.setdefault(path.parent, [])
        if not seen:
            barrier.wait()
        seen.append(path.name)
        real(path)

    monkeypatch.setattr(deletions, "safe_unlink", unlink)
    paths = []
    for d in ("a-0", "b-0"):
        (tmp_path / d).mkdir()
        for i in range(deletions.UNLINK_IN_THREADS_FROM):
            paths.append(tmp_path / d / f"{i:020d}.log.deleted")
            paths[-1].write_bytes(b"x")
    paths[1].unlink()
    q = PendingDeletions()
    q.schedule(paths, now_ms=0, delay_ms=60_000)
    assert q.unlink_all() == paths[:1] + paths[2:]
    assert not any(p.exists() for p in paths)
    for d in ("a-0", "b-0"):
        names = [p.name for p in paths if p.parent.name == d]
        assert order[tmp_path / d] == names


def test_a_small_batch_unlinks_in_this_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A few files (a retention deletion, one pass's segments) are not worth threads."""
    threads: set[str] = set()
    real = fsutil.safe_unlink

    def unlink(path: Path | str) -> None:
        threads.add(threading.current_thread().name)
        real(path)

    monkeypatch.setattr(deletions, "safe_unlink", unlink)
    paths = [tmp_path / f"{d}-0" / "0.log.deleted" for d in "abc"]
    for path in paths:
        path.parent.mkdir()
        path.write_bytes(b"x")
    q = PendingDeletions()
    q.schedule(paths, now_ms=0, delay_ms=0)
    assert q.run_due(0) == paths
    assert threads == {threading.current_thread().name}
