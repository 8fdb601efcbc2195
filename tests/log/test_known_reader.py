"""Segment metadata read by another process for the owner (`known_reader.py`) and taken
by the owner's open partitions (`PartitionLog.take_known`): the same metadata the owner
reads itself, the active segment's included, taken only for the very files read, and
nothing read twice."""

from __future__ import annotations

import os
import weakref
from pathlib import Path

import pytest

from cleanerd.log.files import TopicPartition
from cleanerd.log.known_reader import read_dir, read_dirs, warm_dirs
from cleanerd.log.known_segments import KnownSegment, decode
from cleanerd.log.log_dir import LogDir
from cleanerd.log.meta import PartitionMeta, SegmentMeta
from cleanerd.log.partition_log import LogConfig, PartitionLog
from cleanerd.log.segment import LogSegment
from tests.builders import kv

TP = TopicPartition("orders", 0)
OTHER = TopicPartition("orders", 1)
CONFIG = LogConfig(segment_bytes=4 * 1024, index_interval_bytes=512)


def build(root: Path, state: Path, tps: tuple[TopicPartition, ...] = (TP,)) -> None:
    """Many small segments per partition, with timestamps and a tombstone."""
    with LogDir.open(root, state_dir=state) as log_dir:
        for tp in tps:
            plog = log_dir.create_partition(tp, config=CONFIG)
            for i in range(200):
                plog.append([kv(f"k{i % 40}", "v" * 50, timestamp=1_700_000_000_000 + i)])
            plog.append([kv("gone", None, timestamp=1_700_000_001_000)])


def owner_meta(root: Path, state: Path) -> PartitionMeta:
    """What the owner reads itself, from the files alone."""
    with LogDir.open(root, state_dir=state) as log_dir:
        return log_dir.open_partition(TP, config=CONFIG).meta()


def built_and_read(tmp_path: Path) -> tuple[Path, Path, dict[int, KnownSegment]]:
    """The log dir, the state dir, and what a reader read of the partition's segments."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state)
    return root, state, {k.base_offset: k for k in read_dir(str(root / str(TP)))}


def open_unread(log_dir: LogDir) -> PartitionLog:
    return log_dir.open_partition(TP, config=CONFIG, prefetch=False)


def test_the_reader_gives_what_the_owner_reads_for_every_segment(tmp_path: Path) -> None:
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state)
    with LogDir.open(root, state_dir=state) as log_dir:
        plog = log_dir.open_partition(TP, config=CONFIG)
        plog.meta()
        expected = [s.known() for s in plog.segments]
    assert len(expected) > 5

    assert read_dir(str(root / str(TP))) == expected


def test_the_reader_asks_for_every_segment_of_a_dir_before_reading_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cold, a reader waited a disk round trip per segment; each `.log` is advised
    (`LogSegment.prefetch`) before the first is read, so the reads overlap."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state)
    events: list[str] = []
    prefetch, meta = LogSegment.prefetch, LogSegment.meta

    def advised(self: LogSegment, *, indexes: bool = False) -> None:
        events.append("prefetch")
        prefetch(self, indexes=indexes)

    def read(self: LogSegment) -> SegmentMeta:
        events.append("read")
        return meta(self)

    monkeypatch.setattr(LogSegment, "prefetch", advised)
    monkeypatch.setattr(LogSegment, "meta", read)
    found = read_dir(str(root / str(TP)))
    assert len(found) > 5
    assert events == ["prefetch"] * len(found) + ["read"] * len(found)


def test_warming_advises_what_an_open_after_a_crash_reads_and_reads_nothing(
    tmp_path: Path, advised: list[str], walked: list[int]
) -> None:
    """`warm_dirs`: the active segment's `.log` and small index files and the latest
    producer snapshot are advised; no segment is read, no row answered; a partition dir
    that is a link is not followed."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state, (TP, OTHER))
    with LogDir.open(root, state_dir=state) as log_dir:
        plog = log_dir.open_partition(TP, config=CONFIG)
        plog.prepare_clean_shutdown()  # a producer snapshot at the end
        active = plog.active_segment.log_path.name[: -len(".log")]
    snapshot = sorted(p.name for p in (root / str(TP)).glob("*.snapshot"))[-1]
    elsewhere = tmp_path / "elsewhere"
    (root / str(OTHER)).rename(elsewhere)
    (root / str(OTHER)).symlink_to(elsewhere)

    advised.clear()  # the open's own
    walked.clear()
    answer = warm_dirs([str(root / str(TP)), str(root / str(OTHER))])
    assert decode(answer).segments == {}
    # Not the active segment's index files: preallocated, they are not small.
    assert sorted(advised) == [f"{active}.log", snapshot]
    assert walked == []


def test_a_reader_holds_one_segment_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checked segment holds its indexes' entries (megabytes for a big segment): a
    reader drops each once read, so it holds one segment's, not its partition's."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state)
    checked: list[weakref.ref[LogSegment]] = []
    check = LogSegment.check

    def checking(self: LogSegment) -> None:
        assert [ref for ref in checked if ref() is not None] == []
        checked.append(weakref.ref(self))
        check(self)

    monkeypatch.setattr(LogSegment, "check", checking)
    assert len(read_dir(str(root / str(TP)), check=True)) == len(checked) > 5


def test_read_dirs_answers_in_the_known_segments_format_by_dir_name(tmp_path: Path) -> None:
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state, (TP, OTHER))
    paths = [str(root / str(TP)), str(root / str(OTHER)), str(root / "orders-9")]

    kept = decode(read_dirs(paths)).segments

    assert set(kept) == {str(TP), str(OTHER), "orders-9"}
    assert kept["orders-9"] == {}  # no such dir: nothing read, the owner says why
    assert list(kept[str(TP)].values()) == read_dir(paths[0])


def test_a_segment_the_reader_cannot_read_gets_no_row(tmp_path: Path) -> None:
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state)
    part = root / str(TP)
    bases = sorted(int(p.name.split(".")[0]) for p in part.glob("*.log"))
    corrupt = part / f"{bases[1]:020d}.log"
    data = bytearray(corrupt.read_bytes())
    data[70] ^= 0xFF  # inside the first batch's records: its CRC no longer matches
    corrupt.write_bytes(bytes(data))
    (part / f"{bases[2]:020d}.index").unlink()  # the owner's open creates it

    found = {k.base_offset for k in read_dir(str(part))}

    assert bases[1] not in found
    assert bases[2] not in found
    assert bases[0] in found
    assert set(bases[3:-1]) <= found


def test_the_owner_takes_what_was_read_and_reads_none_of_those_segments(
    tmp_path: Path, walked: list[int]
) -> None:
    root, state, rows = built_and_read(tmp_path)
    expected = owner_meta(root, state)

    with LogDir.open(root, state_dir=state) as log_dir:
        plog = open_unread(log_dir)
        walked.clear()
        assert plog.take_known(rows) == len(expected.segments)
        assert plog.meta() == expected
        # Only the active segment's end is read (less than any other segment).
        assert sum(walked) < min(s.size for s in plog.segments[:-1])
        assert plog.take_known(rows) == 0  # nothing is taken twice


def test_a_segment_changed_since_it_was_read_is_read_anew(tmp_path: Path) -> None:
    root, state, rows = built_and_read(tmp_path)
    # One segment replaced after the read by a copy with another mtime and inode.
    victim = sorted((root / str(TP)).glob("*.log"))[2]
    copy = victim.with_name(victim.name + ".copy")
    copy.write_bytes(victim.read_bytes())
    os.utime(copy, ns=(1_000_000_000, 1_000_000_000))
    copy.replace(victim)
    expected = owner_meta(root, tmp_path / "elsewhere")

    with LogDir.open(root, state_dir=state) as log_dir:
        plog = open_unread(log_dir)
        assert plog.take_known(rows) == len(expected.segments) - 1
        meta = plog.meta()
    assert meta == expected
    assert meta.segments[2].last_modified_ms == 1_000


def test_a_segment_whose_index_the_open_rebuilt_is_read_anew(tmp_path: Path) -> None:
    root, state, rows = built_and_read(tmp_path)
    index = sorted((root / str(TP)).glob("*.index"))[3]
    index.write_bytes(b"\x00" * 5)  # not a whole entry: the open rebuilds it

    with LogDir.open(root, state_dir=state) as log_dir:
        plog = open_unread(log_dir)
        assert plog.recovery_report.rebuilt_indexes == [str(index.with_suffix(".log"))]
        assert plog.take_known(rows) == len(rows) - 1
        meta = plog.meta()
    assert meta == owner_meta(root, tmp_path / "elsewhere")
