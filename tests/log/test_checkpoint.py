"""Tests of cleanerd.log.checkpoint: Kafka's checkpoint text files."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from cleanerd.errors import CheckpointError
from cleanerd.log.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    EpochEntry,
    LeaderEpochCheckpointFile,
    OffsetCheckpointFile,
    RootCheckpoints,
)
from cleanerd.log.files import TopicPartition


def test_offset_checkpoint_round_trip(tmp_path: Path) -> None:
    """Written entries read back equal; the text is Kafka's format."""
    f = OffsetCheckpointFile(tmp_path / CLEANER_OFFSET_CHECKPOINT)
    entries = {TopicPartition("b-topic", 1): 99, TopicPartition("a.topic", 0): 1234}
    f.write(entries)
    assert f.read() == entries
    assert f.path.read_text() == "0\n2\na.topic 0 1234\nb-topic 1 99\n"


def test_leader_epoch_round_trip(tmp_path: Path) -> None:
    """Leader-epoch entries keep their order."""
    f = LeaderEpochCheckpointFile(tmp_path / "leader-epoch-checkpoint")
    entries = [EpochEntry(0, 0), EpochEntry(3, 120)]
    f.write(entries)
    assert f.read() == entries
    assert f.path.read_text() == "0\n2\n0 0\n3 120\n"


@pytest.mark.parametrize("text", ["", "0\n", "0"])
def test_empty_or_countless_file_has_no_entries(tmp_path: Path, text: str) -> None:
    """An empty file or one ending after the version line holds no entries."""
    path = tmp_path / "cp"
    path.write_text(text)
    assert OffsetCheckpointFile(path).read() == {}


def test_missing_file_has_no_entries(tmp_path: Path) -> None:
    """A checkpoint that does not exist reads as empty and is not created."""
    assert OffsetCheckpointFile(tmp_path / "absent").read() == {}
    assert not (tmp_path / "absent").exists()


def test_whitespace_runs_separate_fields(tmp_path: Path) -> None:
    """Fields may be separated by any run of whitespace; CRLF line ends are accepted."""
    path = tmp_path / "cp"
    path.write_bytes(b"0\r\n1\r\nt  3\t77\r\n")
    assert OffsetCheckpointFile(path).read() == {TopicPartition("t", 3): 77}


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("1\n0\n", 1, "unrecognised version 1"),
        ("x\n0\n", 1, "version 'x' is not an integer"),
        ("0\nz\n", 2, "entry count 'z' is not an integer"),
        ("0\n1\nt 0\n", 3, "malformed line 't 0'"),
        ("0\n1\nt 0 1 2\n", 3, "malformed line"),
        ("0\n1\nt x 1\n", 3, "malformed line"),
        ("0\n1\nt 0 1.5\n", 3, "malformed line"),
        ("0\n1\n t 0 1\n", 3, "malformed line"),
        ("0\n2\nt 0 1\n\n", 4, "malformed line ''"),
        ("0\n1\nt 99999999999 1\n", 3, "malformed line"),
        ("0\n2\nt 0 1\n", 2, "expected 2 entries but found 1"),
        ("0\n0\nt 0 1\n", 2, "expected 0 entries but found 1"),
    ],
)
def test_malformed_checkpoints_name_file_and_line(
    tmp_path: Path, text: str, line: int, reason: str
) -> None:
    """Version mismatch, malformed lines and count mismatches raise, naming file and line."""
    path = tmp_path / "cp"
    path.write_text(text)
    with pytest.raises(CheckpointError, match=reason) as info:
        OffsetCheckpointFile(path).read()
    assert info.value.line == line
    assert info.value.path == str(path)
    assert str(path) in str(info.value)


def test_malformed_leader_epoch_line(tmp_path: Path) -> None:
    """A leader-epoch line needs exactly two integers."""
    path = tmp_path / "leader-epoch-checkpoint"
    path.write_text("0\n1\n3 4 5\n")
    with pytest.raises(CheckpointError, match="malformed line") as info:
        LeaderEpochCheckpointFile(path).read()
    assert info.value.line == 3


def test_non_utf8_checkpoint(tmp_path: Path) -> None:
    """Bytes that are not UTF-8 raise CheckpointError naming the file."""
    path = tmp_path / "cp"
    path.write_bytes(b"0\n1\n\xff 0 1\n")
    with pytest.raises(CheckpointError, match="not UTF-8"):
        OffsetCheckpointFile(path).read()


def test_write_leaves_no_tmp(tmp_path: Path) -> None:
    """A checkpoint write leaves only the checkpoint file."""
    OffsetCheckpointFile(tmp_path / "cp").write({TopicPartition("t", 0): 1})
    assert [p.name for p in tmp_path.iterdir()] == ["cp"]


def test_crash_before_rename_keeps_old_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure at the rename leaves the previous checkpoint intact and no temp file."""
    f = OffsetCheckpointFile(tmp_path / "cp")
    f.write({TopicPartition("t", 0): 1})

    def crash(self: Path, other: Path) -> Path:
        raise OSError(errno.EIO, "simulated crash")

    monkeypatch.setattr(Path, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        f.write({TopicPartition("t", 0): 2})
    monkeypatch.undo()
    assert f.read() == {TopicPartition("t", 0): 1}
    assert [p.name for p in tmp_path.iterdir()] == ["cp"]


def test_root_checkpoints_read_all_four(tmp_path: Path) -> None:
    """RootCheckpoints reads each root file; absent ones are empty."""
    tp = TopicPartition("t", 0)
    OffsetCheckpointFile(tmp_path / CLEANER_OFFSET_CHECKPOINT).write({tp: 5})
    OffsetCheckpointFile(tmp_path / REPLICATION_OFFSET_CHECKPOINT).write({tp: 9})
    cps = RootCheckpoints.read(tmp_path)
    assert cps.cleaner_offsets == {tp: 5}
    assert cps.high_watermarks == {tp: 9}
    assert cps.log_start_offsets == {}
    assert cps.recovery_points == {}
