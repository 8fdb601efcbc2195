"""Tests of cleanerd.log.txnindex: the aborted-transaction index and producer snapshots."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from cleanerd.errors import CorruptIndexError
from cleanerd.log.txnindex import AbortedTxn, TransactionIndex


def test_round_trip_and_format(tmp_path: Path) -> None:
    """Entries are 34 big-endian bytes (version 0, pid, first, last, LSO) and read back."""
    path = tmp_path / "00000000000000000000.txnindex"
    index = TransactionIndex(path, 0)
    index.append(AbortedTxn(first_offset=8, producer_id=1, last_offset=10, last_stable_offset=11))
    index.append(AbortedTxn(11, 2, 16, 17))
    assert path.read_bytes()[:34] == struct.pack(">hqqqq", 0, 1, 8, 10, 11)
    assert TransactionIndex.load(path, 0).entries == index.entries


def test_no_file_until_first_entry(tmp_path: Path) -> None:
    """An index without entries has no file; loading an absent file gives no entries."""
    path = tmp_path / "x.txnindex"
    index = TransactionIndex.load(path, 0)
    assert index.entries == []
    index.write()
    assert not path.exists()


def test_last_offsets_must_increase(tmp_path: Path) -> None:
    """Appending an entry whose marker is not after the previous one is an error."""
    index = TransactionIndex(tmp_path / "x.txnindex", 0)
    index.append(AbortedTxn(0, 1, 5, 6))
    with pytest.raises(ValueError, match="not above the current last offset 5"):
        index.append(AbortedTxn(1, 2, 5, 6))


def test_range_lookup() -> None:
    """Entries with last >= from and first < to are returned; an entry whose LSO reaches
    the bound completes the search."""
    index = TransactionIndex(
        Path("unused"),
        0,
        [AbortedTxn(0, 1, 3, 4), AbortedTxn(5, 2, 8, 9), AbortedTxn(12, 3, 20, 30)],
    )
    result = index.collect_aborted(4, 40)
    assert result.aborted == [AbortedTxn(5, 2, 8, 9), AbortedTxn(12, 3, 20, 30)]
    assert not result.is_complete
    result = index.collect_aborted(0, 6)
    assert result.aborted == [AbortedTxn(0, 1, 3, 4), AbortedTxn(5, 2, 8, 9)]
    assert result.is_complete  # the second entry's LSO 9 >= 6
    assert index.collect_aborted(21, 40).aborted == []


def test_bad_version_and_truncated_entry(tmp_path: Path) -> None:
    """A wrong entry version or a partial entry is CorruptIndexError naming the position."""
    path = tmp_path / "x.txnindex"
    path.write_bytes(struct.pack(">hqqqq", 0, 1, 0, 1, 2) + struct.pack(">hqqqq", 1, 1, 2, 3, 4))
    with pytest.raises(CorruptIndexError, match="unexpected entry version 1 at position 34"):
        TransactionIndex.load(path, 0)
    path.write_bytes(struct.pack(">hqqqq", 0, 1, 0, 1, 2) + b"\x00" * 5)
    with pytest.raises(CorruptIndexError, match="truncated entry at position 34"):
        TransactionIndex.load(path, 0)


def test_sanity_check_marker_below_base(tmp_path: Path) -> None:
    """An entry whose marker lies below the segment's base offset is corrupt."""
    index = TransactionIndex(tmp_path / "x.txnindex", 100, [AbortedTxn(10, 1, 50, 51)])
    with pytest.raises(CorruptIndexError, match="below the base offset 100"):
        index.sanity_check()


def test_truncate_to(tmp_path: Path) -> None:
    """truncate_to drops entries whose marker is at or after the offset, on disk too."""
    path = tmp_path / "x.txnindex"
    index = TransactionIndex(path, 0)
    index.append(AbortedTxn(0, 1, 3, 4))
    index.append(AbortedTxn(4, 1, 9, 10))
    index.truncate_to(9)
    assert TransactionIndex.load(path, 0).entries == [AbortedTxn(0, 1, 3, 4)]
