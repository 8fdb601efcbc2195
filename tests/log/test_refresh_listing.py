"""A partition dir is listed again only when its mtime says an entry changed: a settled
dir (mtime well before the listing) is trusted until it changes, and every change made
through another handle (a roll, a swap, a deletion, a link put in place) is still seen."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cleanerd.log.files import TopicPartition
from cleanerd.log.log_dir import LogDir
from cleanerd.log.partition_log import LogConfig, PartitionLog
from cleanerd.log.recovery import SymlinkRefused
from tests.builders import kv

TP = TopicPartition("orders", 0)
CONFIG = LogConfig(segment_bytes=2048)
HOUR_AGO_NS = 3_600 * 10**9


@pytest.fixture
def listings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The dirs `os.scandir` listed."""
    seen: list[str] = []
    real = os.scandir

    def counting(path: str | os.PathLike[str]) -> os._ScandirIterator[str]:
        seen.append(str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", counting)
    return seen


def settle(path: Path) -> None:
    """Set the dir's mtime an hour back, as a dir nothing changed in lately has it."""
    old = path.stat().st_mtime_ns - HOUR_AGO_NS
    os.utime(path, ns=(old, old))


def writer_and_reader(tmp_path: Path) -> tuple[PartitionLog, PartitionLog]:
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    log_dir = LogDir.open(root, state_dir=state)
    writer = log_dir.create_partition(TP, config=CONFIG)
    for i in range(30):
        writer.append([kv(f"k{i}", "v" * 100)])
    settle(writer.dir)
    reader = LogDir.open(root, observe=True, state_dir=state).open_partition(TP, config=CONFIG)
    return writer, reader


def test_a_settled_dir_is_not_listed_again(tmp_path: Path, listings: list[str]) -> None:
    _, reader = writer_and_reader(tmp_path)
    reader.meta()
    listings.clear()
    for _ in range(3):
        reader.meta()
    assert listings == []


def test_a_new_segment_is_seen(tmp_path: Path, listings: list[str]) -> None:
    writer, reader = writer_and_reader(tmp_path)
    before = len(reader.meta().segments)
    writer.roll(reason="test")
    assert len(reader.meta().segments) == before + 1
    assert listings  # the changed mtime made it list the dir again


def test_a_replaced_and_a_deleted_segment_are_seen(tmp_path: Path) -> None:
    writer, reader = writer_and_reader(tmp_path)
    first = reader.segments[0].log_path
    copy = first.with_name("copy")
    copy.write_bytes(first.read_bytes())
    copy.replace(first)  # a swap: same name, another inode
    assert reader.meta().segments[0].inode == first.stat().st_ino
    writer.refresh()
    writer.delete_segments(writer.segments[:1], reason="test")
    assert reader.meta().segments[0].base_offset == writer.segments[0].base_offset


def test_a_link_put_in_place_is_refused(tmp_path: Path) -> None:
    writer, reader = writer_and_reader(tmp_path)
    reader.meta()
    target = tmp_path / "elsewhere.log"
    target.write_bytes(b"")
    (writer.dir / "00000000000000099999.log").symlink_to(target)
    with pytest.raises(SymlinkRefused):
        reader.meta()


def test_the_first_producer_state_takes_the_snapshots_the_open_listed(
    tmp_path: Path, listings: list[str]
) -> None:
    """The open's listing names the producer snapshots: the first producer state needs
    no second listing of a settled dir; a snapshot written since is found."""
    writer, _ = writer_and_reader(tmp_path)
    writer.take_snapshot()
    settle(writer.dir)
    listings.clear()
    reader = LogDir.open(writer.log_dir, observe=True, state_dir=tmp_path / "state")
    plog = reader.open_partition(TP, config=CONFIG)
    plog.meta()
    assert listings == [str(writer.dir)]  # the open's own
    assert plog.producer_state().offset == writer.log_end_offset

    listings.clear()
    again = reader.open_partition(TP, config=CONFIG)
    (writer.dir / "x").touch()  # the dir changes after the open listed it
    again.producer_state()
    assert listings == [str(writer.dir)] * 2  # the open's, and the snapshots' again
