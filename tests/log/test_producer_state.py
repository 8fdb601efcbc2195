"""Producer snapshots in Kafka's format: read, checked, written."""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import pytest
from structlog.testing import capture_logs

from cleanerd.errors import CorruptIndexError
from cleanerd.log.producer_state import (
    ProducerEntry,
    ProducerState,
    latest_snapshot,
    read_snapshot,
    write_snapshot,
)
from cleanerd.log.txnindex import AbortedTxn
from cleanerd.records.batch import encode_batch
from cleanerd.records.control import ControlRecordType, encode_end_txn_marker
from cleanerd.records.record import Record
from cleanerd.records.walker import walk


def _snapshot(entries: list[tuple[int, int]], *, version: int = 1) -> bytes:
    body = struct.pack(">i", len(entries)) + b"".join(
        struct.pack(">qhiqiqiq", pid, 0, 5, 100, 0, 1000, 0, first) for pid, first in entries
    )
    return struct.pack(">hI", version, crc32c.crc32c(body)) + body


def test_snapshot_ongoing_transactions(tmp_path: Path) -> None:
    """A producer snapshot yields the producers with an open transaction."""
    path = tmp_path / "00000000000000000100.snapshot"
    path.write_bytes(_snapshot([(7, 90), (8, -1)]))
    assert read_snapshot(path).ongoing() == {7: 90}


def test_snapshot_crc_and_version_checked(tmp_path: Path) -> None:
    """A snapshot with a bad CRC or version is CorruptIndexError."""
    path = tmp_path / "00000000000000000007.snapshot"
    data = bytearray(_snapshot([(7, 90)]))
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptIndexError, match="CRC mismatch") as info:
        read_snapshot(path)
    assert str(info.value).startswith(f"corrupt producer snapshot {path}: ")
    path.write_bytes(_snapshot([], version=2))
    with pytest.raises(CorruptIndexError, match="version 2"):
        read_snapshot(path)


def test_a_snapshot_cut_short_says_so(tmp_path: Path) -> None:
    """A snapshot that lost its end is named as cut short, with the size its header
    promises (it was reported as a CRC mismatch, which hid why)."""
    path = tmp_path / "00000000000000000007.snapshot"
    whole = _snapshot([(7, 90), (8, -1)])
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(CorruptIndexError) as info:
        read_snapshot(path)
    assert str(info.value).endswith(
        f"2 entries do not match size {len(whole) // 2}: cut short, {len(whole)} bytes expected"
    )


def test_write_keeps_the_newest_two_and_none_below_the_log_start(tmp_path: Path) -> None:
    for offset in (10, 20, 30, 40):
        write_snapshot(tmp_path, ProducerState(offset, {1: ProducerEntry(1)}), log_start_offset=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "00000000000000000030.snapshot",
        "00000000000000000040.snapshot",
    ]
    write_snapshot(tmp_path, ProducerState(50), log_start_offset=45)
    assert [p.name for p in tmp_path.iterdir()] == ["00000000000000000050.snapshot"]
    assert read_snapshot(tmp_path / "00000000000000000050.snapshot").entries == {}


@pytest.mark.parametrize("live", [False, True])
def test_a_half_written_newest_snapshot_falls_back_and_is_a_warning_unless_live(
    tmp_path: Path, live: bool
) -> None:
    """The newest snapshot cut short: the next older one is read. It is a warning naming
    the file, except beside a live broker (`live`), which writes a snapshot in place at
    a roll: there it may be read half written, and it is logged at debug only. An older
    damaged one is a warning either way."""
    (tmp_path / "00000000000000000050.snapshot").write_bytes(_snapshot([(7, 40)]))
    (tmp_path / "00000000000000000080.snapshot").write_bytes(_snapshot([(8, 70)])[:3])
    with capture_logs() as logs:
        state = latest_snapshot(tmp_path, [50, 80], log_start=0, log_end=90, live=live)
    assert state is not None
    assert state.ongoing() == {7: 40}
    warned = [e["path"] for e in logs if e["log_level"] == "warning"]
    assert warned == ([] if live else [str(tmp_path / "00000000000000000080.snapshot")])
    (tmp_path / "00000000000000000050.snapshot").write_bytes(b"\x00")
    with capture_logs() as logs:
        assert latest_snapshot(tmp_path, [50, 80], log_start=0, log_end=90, live=live) is None
    warned = [e["path"] for e in logs if e["log_level"] == "warning"]
    assert str(tmp_path / "00000000000000000050.snapshot") in warned


def test_the_aborts_of_a_walk_are_those_the_writer_records() -> None:
    """`aborted_in`: each ABORT marker of an open transaction, from its first offset,
    with the last stable offset then (another producer's open transaction, else one past
    the marker); a transaction open before the batches counts from the state; an abort
    with nothing open, a commit and other producers' batches record nothing."""

    def data(offset: int, pid: int) -> bytes:
        record = Record(offset, 0, b"k", b"v")
        return encode_batch(
            [record], base_offset=offset, producer_id=pid, base_sequence=0, is_transactional=True
        )

    def marker(offset: int, pid: int, kind: ControlRecordType) -> bytes:
        record = encode_end_txn_marker(kind, 0, offset=offset, timestamp=0)
        return encode_batch(
            [record], base_offset=offset, producer_id=pid, is_transactional=True, is_control=True
        )

    buf = b"".join(
        [
            data(10, 7),
            data(11, 8),
            marker(12, 7, ControlRecordType.ABORT),
            marker(13, 9, ControlRecordType.ABORT),  # nothing open: no entry
            marker(14, 8, ControlRecordType.COMMIT),
            marker(15, 5, ControlRecordType.ABORT),  # open since offset 3, before the walk
        ]
    )
    state = ProducerState(10, {5: ProducerEntry(5, txn_first_offset=3)})
    table = walk(buf).table
    assert state.aborted_in(table, buf) == [AbortedTxn(10, 7, 12, 3), AbortedTxn(3, 5, 15, 16)]
    state.apply(table, buf)
    assert state.ongoing() == {}
    assert state.aborted_in(table, buf) == []  # rows below the state's offset are applied
