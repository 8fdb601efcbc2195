"""Tests of cleanerd.log.checkpoint: Kafka's checkpoint text files."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.errors import CheckpointError
from cleanerd.log import checkpoint
from cleanerd.log.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    EpochEntry,
    LeaderEpochCheckpointFile,
    OffsetCheckpointFile,
    RootCheckpoints,
    _fast_offsets,
    _parse_offset_entry,
    format_offsets,
    read_checkpoint,
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


_TOPICS = st.text(alphabet="ab.-_Z9", min_size=1, max_size=6)
_OFFSETS = st.dictionaries(
    st.builds(TopicPartition, _TOPICS, st.integers(0, 2**31 - 1)),
    st.integers(-(2**63), 2**63 - 1),
    max_size=20,
)


@settings(max_examples=200, deadline=None)
@given(offsets=_OFFSETS)
def test_written_checkpoints_take_the_whole_text_parse(
    tmp_path_factory: pytest.TempPathFactory, offsets: dict[TopicPartition, int]
) -> None:
    """What cleanerd writes is read back equal, by the whole-text parse whenever its
    numbers are short enough (the line-by-line reader otherwise), and both readers agree."""
    path = tmp_path_factory.mktemp("cp") / CLEANER_OFFSET_CHECKPOINT
    OffsetCheckpointFile(path).write(offsets)
    text = path.read_text()
    assert path.read_bytes() == format_offsets(offsets)
    assert OffsetCheckpointFile(path).read() == offsets
    assert dict(read_checkpoint(path, _parse_offset_entry)) == offsets
    short = all(tp.partition < 10**9 and abs(o) < 10**18 for tp, o in offsets.items())
    assert (_fast_offsets(text) == offsets) if short else (_fast_offsets(text) is None)


_LINE = st.tuples(
    st.sampled_from(["t", "a.b", "x-y_1", "t\u00e9", "", "+", "t t"]),
    st.sampled_from(["0", "7", "007", "-1", "+2", "2147483647", "2147483648", "x"]),
    st.sampled_from(["0", "-1", "+5", "1.5", "9223372036854775807", "9" * 19, "-0"]),
    st.sampled_from([" ", "  ", "\t"]),
)


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(_LINE, max_size=5),
    count_delta=st.sampled_from([0, 0, 0, 1, -1]),
    end=st.sampled_from(["\n", "\r\n", ""]),
)
def test_both_readers_agree_on_any_text(
    tmp_path_factory: pytest.TempPathFactory,
    lines: list[tuple[str, str, str, str]],
    count_delta: int,
    end: str,
) -> None:
    """On odd text (signs, leading zeros, out-of-range numbers, tabs, CRLF, a missing last
    line end, a wrong count), the whole-text parse either declines or gives exactly what
    the line-by-line reader gives; a file the latter rejects, the former declines."""
    body = [f"{t}{sep}{p}{sep}{o}" for t, p, o, sep in lines]
    text = f"0\n{len(body) + count_delta}\n" + "\n".join(body) + (end if body else "")
    path = tmp_path_factory.mktemp("cp") / "cp"
    path.write_text(text, newline="")
    try:
        expected: dict[TopicPartition, int] | None = dict(
            read_checkpoint(path, _parse_offset_entry)
        )
    except CheckpointError:
        expected = None
    fast = _fast_offsets(text)
    assert fast is None or fast == expected
    if expected is None:
        with pytest.raises(CheckpointError):
            OffsetCheckpointFile(path).read()
    else:
        assert OffsetCheckpointFile(path).read() == expected


def test_a_written_checkpoint_is_not_read_line_by_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint of cleanerd's or Kafka's shape is read without the per-line reader
    (the cleaner reads one with an entry per compacted partition at every pass)."""
    path = tmp_path / CLEANER_OFFSET_CHECKPOINT
    offsets = {TopicPartition("orders", n): 10 * n for n in range(1000)}
    path.write_bytes(format_offsets(offsets))

    def line_by_line(*args: object) -> None:
        raise AssertionError("read line by line")

    monkeypatch.setattr("cleanerd.log.checkpoint.read_checkpoint", line_by_line)
    assert OffsetCheckpointFile(path).read() == offsets


def _partition_dirs(root: Path, *names: str) -> None:
    for name in names:
        (root / name).mkdir()


def test_rewrite_keeps_the_file_order_and_drops_gone_partitions(tmp_path: Path) -> None:
    """The cleaner's update after a pass: entries keep the order they have in the file
    (Kafka writes them unsorted), a new partition's goes last, and entries whose
    partition dir is gone are dropped, as Kafka does. What is read back is what was
    written, from this process's cache and from the file alike."""
    _partition_dirs(tmp_path, "b-1", "a-0", "c-2", "d-3")
    path = tmp_path / CLEANER_OFFSET_CHECKPOINT
    path.write_text("0\n4\nb 1 10\ngone 0 5\na 0 20\nc 2 30\n")
    f = OffsetCheckpointFile(path)
    f.rewrite(TopicPartition("a", 0), 25)
    assert path.read_text() == "0\n3\nb 1 10\na 0 25\nc 2 30\n"
    f.rewrite(TopicPartition("d", 3), 7)
    assert path.read_text() == "0\n4\nb 1 10\na 0 25\nc 2 30\nd 3 7\n"
    expected = {
        TopicPartition("b", 1): 10,
        TopicPartition("a", 0): 25,
        TopicPartition("c", 2): 30,
        TopicPartition("d", 3): 7,
    }
    assert f.read() == expected
    (tmp_path / "b-1").rmdir()
    f.rewrite(TopicPartition("c", 2), 31)
    del expected[TopicPartition("b", 1)]
    expected[TopicPartition("c", 2)] = 31
    assert f.read() == expected
    checkpoint._PARSED.clear()
    assert OffsetCheckpointFile(path).read() == expected


def test_rewrite_reads_a_file_another_process_replaced(tmp_path: Path) -> None:
    """The kept lines belong to one file identity: after another writer (a worker
    process, an operator) replaced the file, a rewrite starts from the new file."""
    _partition_dirs(tmp_path, "a-0", "b-0")
    path = tmp_path / CLEANER_OFFSET_CHECKPOINT
    f = OffsetCheckpointFile(path)
    f.rewrite(TopicPartition("a", 0), 1)
    tmp = path.with_name("other")
    tmp.write_text("0\n2\na 0 5\nb 0 6\n")
    tmp.replace(path)  # a new inode, as every writer's atomic replace makes
    f.rewrite(TopicPartition("a", 0), 9)
    assert path.read_text() == "0\n2\na 0 9\nb 0 6\n"


def test_a_failed_rewrite_changes_nothing(tmp_path: Path) -> None:
    """When the write fails (ENOSPC, say), the file and what this process knows of it
    stay as they were: the next rewrite does not carry the failed entry."""
    _partition_dirs(tmp_path, "a-0", "b-0")
    path = tmp_path / CLEANER_OFFSET_CHECKPOINT
    f = OffsetCheckpointFile(path)
    f.rewrite(TopicPartition("a", 0), 1)

    def full(path: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    with pytest.raises(OSError, match="No space"):
        f.rewrite(TopicPartition("a", 0), 2, write=full)
    assert f.read() == {TopicPartition("a", 0): 1}
    f.rewrite(TopicPartition("b", 0), 3)
    assert path.read_text() == "0\n2\na 0 1\nb 0 3\n"
