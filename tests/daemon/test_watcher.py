"""The log-dir watcher: a bounded polling scan for partitions and segments."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.daemon.watcher import (
    LogDirWatcher,
    PartitionKey,
    WatchedPartition,
    WatchSnapshot,
    diff_snapshots,
)
from cleanerd.log.checkpoint import LOG_START_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleanerd.log.files import TopicPartition, log_file
from cleanerd.log.known_segments import KnownDir
from tests.daemon.conftest import counted_listings


def _segment(log_dir: Path, name: str, base: int, data: bytes = b"") -> Path:
    part = log_dir / name
    part.mkdir(exist_ok=True)
    path = log_file(part, base)
    path.write_bytes(data)
    return path


def _key(log_dir: Path, topic: str, partition: int) -> PartitionKey:
    return PartitionKey(str(log_dir), topic, partition)


def _bump_mtime(path: Path) -> None:
    st_ = path.stat()
    os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns + 1_000_000))


def test_first_scan_reports_every_partition_and_skips_non_partitions(tmp_path: Path) -> None:
    """The first scan adds each `<topic>-<partition>` dir; `-delete` dirs, files and
    other names are not partitions."""
    _segment(tmp_path, "orders-0", 0)
    _segment(tmp_path, "orders-0", 100)
    _segment(tmp_path, "my.topic-12", 0)
    (tmp_path / "orders-1.0123456789abcdef0123456789abcdef-delete").mkdir()
    (tmp_path / "lost+found").mkdir()
    (tmp_path / "cleaner-offset-checkpoint").write_text("0\n0\n")
    w = LogDirWatcher([tmp_path])
    delta = w.scan()
    assert delta.added_partitions == (
        _key(tmp_path, "my.topic", 12),
        _key(tmp_path, "orders", 0),
    )
    assert w.snapshot.partitions[_key(tmp_path, "orders", 0)].segments == (0, 100)
    assert w.snapshot.topic_partitions() == {
        TopicPartition("orders", 0),
        TopicPartition("my.topic", 12),
    }


def test_second_scan_of_an_idle_log_dir_reports_nothing(tmp_path: Path) -> None:
    """Nothing changed on disk: the delta is empty."""
    _segment(tmp_path, "orders-0", 0, b"x" * 10)
    w = LogDirWatcher([tmp_path])
    w.scan()
    (before,) = w.snapshot.partitions.values()
    delta = w.scan()
    assert not delta.changed
    assert next(iter(w.snapshot.partitions.values())) is before  # kept, not rebuilt


def test_a_written_log_start_offset_checkpoint_is_reported(tmp_path: Path) -> None:
    """Writing `log-start-offset-checkpoint` (replaced by a rename, as Kafka and
    cleanerd write it) is a change of the log dir; an idle one is not."""
    _segment(tmp_path, "orders-0", 0, b"x" * 10)
    checkpoint = OffsetCheckpointFile(tmp_path / LOG_START_OFFSET_CHECKPOINT)
    w = LogDirWatcher([tmp_path])
    w.scan()
    checkpoint.write({TopicPartition("orders", 0): 5})
    assert w.scan().start_offsets == (str(tmp_path),)
    assert not w.scan().changed
    checkpoint.write({TopicPartition("orders", 0): 6})
    assert w.scan().changed


def test_append_to_the_active_segment_is_reported(tmp_path: Path) -> None:
    """A larger active `.log` makes the partition `appended`, with no segment change."""
    _segment(tmp_path, "orders-0", 0)
    active = _segment(tmp_path, "orders-0", 5, b"a")
    w = LogDirWatcher([tmp_path])
    w.scan()
    with open(active, "ab") as f:
        f.write(b"more")
    delta = w.scan()
    assert delta.appended == (_key(tmp_path, "orders", 0),)
    assert delta.partitions() == {_key(tmp_path, "orders", 0)}
    assert not delta.added_segments


def test_new_and_removed_segments_are_reported(tmp_path: Path) -> None:
    """A roll adds a segment; retention removes one; both name the base offsets."""
    first = _segment(tmp_path, "orders-0", 0)
    _segment(tmp_path, "orders-0", 10)
    w = LogDirWatcher([tmp_path])
    w.scan()
    first.unlink()
    _segment(tmp_path, "orders-0", 20)
    _bump_mtime(tmp_path / "orders-0")  # coarse-mtime filesystems: make the change visible
    delta = w.scan()
    key = _key(tmp_path, "orders", 0)
    assert delta.added_segments == ((key, 20),)
    assert delta.removed_segments == ((key, 0),)
    assert delta.partitions() == {key}


def test_removed_partition_is_reported(tmp_path: Path) -> None:
    """A partition dir that is gone is `removed`."""
    path = _segment(tmp_path, "orders-3", 0)
    w = LogDirWatcher([tmp_path])
    w.scan()
    path.unlink()
    path.parent.rmdir()
    delta = w.scan()
    assert delta.removed_partitions == (_key(tmp_path, "orders", 3),)
    assert w.snapshot.partitions == {}


def test_unchanged_partition_dirs_are_not_listed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle partition costs stats only: its dir is listed on the first scan only."""
    for i in range(5):
        _segment(tmp_path, f"t-{i}", 0)
    listed = counted_listings(monkeypatch)
    w = LogDirWatcher([tmp_path])
    w.scan()
    assert len(listed) == 5
    w.scan()
    w.scan()
    assert len(listed) == 5


def test_missing_log_dir_is_reported_as_unreadable(tmp_path: Path) -> None:
    """A log dir that cannot be listed is named; the other dirs are still scanned."""
    (tmp_path / "a").mkdir()
    _segment(tmp_path / "a", "orders-0", 0)
    w = LogDirWatcher([tmp_path / "a", tmp_path / "missing"])
    delta = w.scan()
    assert w.snapshot.unreadable_log_dirs == (str(tmp_path / "missing"),)
    assert delta.added_partitions == (_key(tmp_path / "a", "orders", 0),)


def test_interval_keeps_the_scan_cpu_share_under_max_duty(tmp_path: Path) -> None:
    """A scan that costs c seconds of CPU is followed by at least c / max_duty seconds."""
    ticks = itertools.count()
    costs = iter([0.0, 0.02, 1.0, 1.0001])

    def clock() -> float:
        next(ticks)
        return next(costs)

    w = LogDirWatcher([tmp_path], max_duty=0.01, min_interval_s=0.5, cpu_clock=clock)
    w.scan()
    assert w.last_scan_cpu_s == pytest.approx(0.02)
    assert w.next_interval_s == pytest.approx(2.0)
    w.scan()
    assert w.next_interval_s == pytest.approx(0.5)  # a cheap scan: the floor applies


def test_max_duty_must_be_a_share() -> None:
    """A duty cycle outside (0, 1] is a programming error."""
    with pytest.raises(ValueError, match="max_duty"):
        LogDirWatcher([], max_duty=0)


_partition = st.builds(
    WatchedPartition,
    dir_inode=st.just(1),
    dir_mtime_ns=st.integers(0, 3),
    segments=st.lists(st.integers(0, 6), unique=True, max_size=4).map(lambda s: tuple(sorted(s))),
    active_size=st.integers(0, 2),
    active_mtime_ns=st.just(0),
)
_snapshot = st.dictionaries(
    st.sampled_from([PartitionKey("/d", "t", p) for p in range(4)]),
    _partition,
    max_size=4,
).map(lambda m: WatchSnapshot(m))


@settings(deadline=None, max_examples=200)
@given(old=_snapshot, new=_snapshot)
def test_delta_replayed_on_the_old_snapshot_gives_the_new_one(
    old: WatchSnapshot, new: WatchSnapshot
) -> None:
    """Partitions and segments of `old` plus the delta's additions minus its removals are
    exactly those of `new`."""
    delta = diff_snapshots(old, new)
    keys = (set(old.partitions) | set(delta.added_partitions)) - set(delta.removed_partitions)
    assert keys == set(new.partitions)
    segments = {(k, b) for k, p in old.partitions.items() for b in p.segments if k in keys}
    segments |= {(k, b) for k in delta.added_partitions for b in new.partitions[k].segments}
    segments |= set(delta.added_segments)
    segments -= set(delta.removed_segments)
    assert segments == {(k, b) for k, p in new.partitions.items() for b in p.segments}
    if old == new:
        assert not delta.changed


def test_a_seeded_first_scan_lists_only_dirs_changed_since(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seeded with what a clean stop kept (`KnownDir`), the first scan lists only the dirs
    whose stamp moved, and sees what an unseeded scan sees."""
    for i in range(3):
        _segment(tmp_path, f"t-{i}", 0, b"x")
    fresh = LogDirWatcher([tmp_path])
    fresh.scan()
    kept = {}
    for key, state in fresh.snapshot.partitions.items():
        kept[f"{key.topic}-{key.partition}"] = KnownDir(
            state.dir_inode,
            state.dir_mtime_ns,
            state.segments,
            state.active_size,
            state.active_mtime_ns,
        )
    _segment(tmp_path, "t-1", 5)  # a new segment since the stop
    listed = counted_listings(monkeypatch)
    w = LogDirWatcher([tmp_path])
    w.seed({str(tmp_path): kept})
    w.scan()
    assert listed == [str(tmp_path / "t-1")]
    fresh.scan()
    assert w.snapshot.partitions == fresh.snapshot.partitions
