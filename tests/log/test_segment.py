"""Tests of cleanerd.log.segment: one segment's files, reads, appends and index upkeep."""

from __future__ import annotations

import dataclasses
import gc
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

from cleanerd.errors import CorruptIndexError, CorruptRecordError, FileChangedError, FileStepError
from cleanerd.log import segment as segment_module
from cleanerd.log.index import IndexPastLogError, OffsetIndex, TimeIndex
from cleanerd.log.meta import SegmentMeta
from cleanerd.log.segment import LogSegment
from cleanerd.records.record import Record
from cleanerd.records.walker import scan_batches
from tests.builders import encode_records, kv, write_segment


def _batches(count: int, *, base: int = 0, per_batch: int = 2, ts0: int = 1000) -> list[bytes]:
    out = []
    for n in range(count):
        records = [
            kv(f"k{n}-{i}", "v" * 40, timestamp=ts0 + (n * 7) % 13) for i in range(per_batch)
        ]
        out.append(encode_records(records, base + n * per_batch))
    return out


def _flip_byte(path: Path, at: int) -> None:
    """Invert the byte at `at` of the file (inside the second batch: a CRC mismatch)."""
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def _segment(tmp_path: Path, count: int = 30, interval: int = 200) -> LogSegment:
    return write_segment(tmp_path, 0, _batches(count), index_interval_bytes=interval)


def test_create_append_and_reopen(tmp_path: Path) -> None:
    """Appended batches are read back; a reopened segment has the same size, next offset
    and max timestamp."""
    seg = _segment(tmp_path)
    again = LogSegment(tmp_path, 0, index_interval_bytes=200)
    assert again.size == seg.size == sum(len(b) for b in _batches(30))
    assert again.next_offset == seg.next_offset == 60
    assert again.max_timestamp_so_far == seg.max_timestamp_so_far == 1012
    assert [i.base_offset for i in again.batches()] == list(range(0, 60, 2))


def test_read_by_offset(tmp_path: Path) -> None:
    """Reading from an offset finds the batch holding it via the index and a forward scan."""
    seg = _segment(tmp_path)
    assert seg.offset_index.entries > 0
    for offset in (0, 1, 17, 33, 59):
        info = seg.translate_offset(offset)
        assert info is not None
        assert info.base_offset <= offset <= info.last_offset
    assert seg.translate_offset(60) is None
    assert [r.offset for r in seg.records(41)][:3] == [41, 42, 43]


def test_read_by_position(tmp_path: Path) -> None:
    """read/read_batch return the raw bytes of a batch found by a scan."""
    batches = _batches(3)
    seg = write_segment(tmp_path, 0, batches)
    infos = list(seg.batches())
    assert seg.read_batch(infos[1]) == batches[1]
    assert seg.read(0, 12) == batches[0][:12]


def test_rebuild_equals_incremental(tmp_path: Path) -> None:
    """Rebuilding the indexes from the log gives byte-identical index files to the ones
    written incrementally (including the final time-index entry)."""
    seg = _segment(tmp_path, count=40, interval=150)
    index_bytes = seg.offset_index_path.read_bytes()
    time_bytes = seg.time_index_path.read_bytes()
    assert index_bytes
    assert time_bytes
    seg.rebuild_indexes()
    assert seg.offset_index_path.read_bytes() == index_bytes
    assert seg.time_index_path.read_bytes() == time_bytes


def test_appends_across_reopen_match_rebuild(tmp_path: Path) -> None:
    """Appends continued after reopening (another process) index like one writer would."""
    batches = _batches(20)
    seg = write_segment(tmp_path, 0, batches[:9], index_interval_bytes=150, inactive=False)
    again = LogSegment(tmp_path, 0, index_interval_bytes=150)
    for data in batches[9:]:
        again.append(data, list(scan_batches(data)))
    again.close_for_roll()
    other = tmp_path / "other"
    other.mkdir()
    whole = write_segment(other, 0, batches, index_interval_bytes=150)
    assert seg.offset_index_path.read_bytes() == whole.offset_index_path.read_bytes()
    assert seg.time_index_path.read_bytes() == whole.time_index_path.read_bytes()


def test_first_batch_and_largest_timestamp(tmp_path: Path) -> None:
    """The first batch's max timestamp and the largest timestamp come from the batches;
    without timestamps the largest timestamp is the file mtime."""
    seg = write_segment(
        tmp_path,
        0,
        [
            encode_records([kv("a", "1", timestamp=50)], 0),
            encode_records([kv("b", "2", timestamp=90)], 1),
        ],
    )
    assert seg.first_batch_timestamp == 50
    assert seg.largest_timestamp == 90
    other = tmp_path / "o"
    other.mkdir()
    empty = LogSegment.create(other, 7)
    assert empty.first_batch_timestamp is None
    assert empty.next_offset == 7
    no_ts = write_segment(other, 8, [encode_records([kv("a", "1", timestamp=-1)], 8)])
    os.utime(no_ts.log_path, ns=(1_234_000_000, 1_234_000_000))
    assert no_ts.largest_timestamp == 1234


def test_an_index_write_that_fails_defers_its_entries_and_fails_no_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills while an appended batch's index entries are written: the batch is
    in the log (the append succeeded, which a producer is told), the index file is cut
    back to whole entries, and the entries reach it with the next append. The append
    failed after the batch was written: `produce` then said nothing of it was appended."""
    batches = _batches(30)
    seg = write_segment(tmp_path, 0, batches[:10], index_interval_bytes=200, inactive=False)
    real_pwrite = os.pwrite

    def index_full(fd: int, data: bytes, position: int) -> int:
        if Path(f"/proc/self/fd/{fd}").readlink().name.endswith(".index"):
            real_pwrite(fd, bytes(data)[:3], position)  # part of an entry, then full
            raise OSError(28, "No space left on device")
        return real_pwrite(fd, data, position)

    monkeypatch.setattr(os, "pwrite", index_full)
    with capture_logs() as logs:
        for data in batches[10:20]:
            seg.append(data, list(scan_batches(data)))
    monkeypatch.undo()
    assert seg.next_offset == 40
    assert seg.offset_index_path.stat().st_size % 8 == 0
    deferred = [e for e in logs if e["event"] == "segment.index_write_deferred"]
    assert deferred
    assert deferred[0]["path"] == str(seg.offset_index_path)
    assert "No space left on device" in deferred[0]["error"]
    for data in batches[20:]:
        seg.append(data, list(scan_batches(data)))
    (tmp_path / "w").mkdir()
    whole = write_segment(tmp_path / "w", 0, batches, index_interval_bytes=200, inactive=False)
    assert seg.offset_index_path.read_bytes() == whole.offset_index_path.read_bytes()


def test_append_rejects_offsets_below_next(tmp_path: Path) -> None:
    """A batch whose offsets are not after the segment's last offset is refused."""
    seg = write_segment(tmp_path, 0, [encode_records([kv("a", "1")], 0)], inactive=False)
    data = encode_records([kv("b", "2")], 0)
    with pytest.raises(ValueError, match="must be at or after 1"):
        seg.append(data, list(scan_batches(data)))


def test_failed_write_leaves_no_partial_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If writing a batch fails midway, the log is cut back to its previous size."""
    seg = write_segment(tmp_path, 0, [encode_records([kv("a", "1")], 0)], inactive=False)
    size = seg.size
    data = encode_records([kv("b", "2" * 100)], 1)
    real_pwrite = os.pwrite

    def short_then_fail(fd: int, buf: bytes, pos: int) -> int:
        if pos == size:
            return real_pwrite(fd, bytes(buf)[:10], pos)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwrite", short_then_fail)
    with pytest.raises(FileStepError, match="No space") as info:
        seg.append(data, list(scan_batches(data)))
    assert str(info.value).endswith(f"while appending a batch: {seg.log_path}")
    assert info.value.no_space
    monkeypatch.undo()
    assert seg.log_path.stat().st_size == size


def test_sanity_check_rebuilds_missing_and_inconsistent(tmp_path: Path) -> None:
    """A missing index, or one whose last entry is not on a batch boundary, is rebuilt."""
    seg = _segment(tmp_path)
    good = seg.offset_index_path.read_bytes()
    seg.offset_index_path.unlink()
    assert LogSegment(tmp_path, 0, index_interval_bytes=200).sanity_check()
    assert seg.offset_index_path.read_bytes() == good
    bad = OffsetIndex(seg.offset_index_path, 0)
    bad.append(5, 3)  # position 3 is inside the first batch
    bad.write()
    assert LogSegment(tmp_path, 0, index_interval_bytes=200).sanity_check()
    assert seg.offset_index_path.read_bytes() == good
    assert not LogSegment(tmp_path, 0, index_interval_bytes=200).sanity_check()


def test_sanity_check_reports_index_past_log(tmp_path: Path) -> None:
    """An index pointing past the end of the log raises and changes no file."""
    seg = _segment(tmp_path)
    os.truncate(seg.log_path, seg.size // 3)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(IndexPastLogError, match=r"position \d+, past the end of the log"):
        LogSegment(tmp_path, 0, index_interval_bytes=200).sanity_check()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_time_index_past_log_detected(tmp_path: Path) -> None:
    """A time-index entry naming an offset the log does not hold is reported."""
    seg = write_segment(tmp_path, 0, _batches(2))
    ti = TimeIndex(seg.time_index_path, 0)
    ti.maybe_append(5000, 10)
    ti.write()
    with pytest.raises(IndexPastLogError, match="names offset 10"):
        LogSegment(tmp_path, 0).sanity_check()


def test_corrupt_batch_error_names_file_and_position(tmp_path: Path) -> None:
    """A flipped byte makes reading fail with the file and the batch position."""
    batches = _batches(3)
    seg = write_segment(tmp_path, 0, batches)
    _flip_byte(seg.log_path, len(batches[0]) + 70)
    with pytest.raises(CorruptRecordError, match="CRC mismatch") as info:
        list(LogSegment(tmp_path, 0).batches())
    assert info.value.path == str(seg.log_path)
    assert info.value.position == len(batches[0])


def test_change_suffix_and_delete(tmp_path: Path) -> None:
    """All existing files of a segment are renamed together, then deleted."""
    seg = write_segment(tmp_path, 5, [encode_records([kv("a", "1")], 5)], suffix=".cleaned")
    seg.change_suffix(".swap")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "00000000000000000005.index.swap",
        "00000000000000000005.log.swap",
        "00000000000000000005.timeindex.swap",
    ]
    seg.change_suffix("")
    assert LogSegment(tmp_path, 5).next_offset == 6
    seg.delete_files()
    assert list(tmp_path.iterdir()) == []


def test_meta_snapshot(tmp_path: Path) -> None:
    """meta() reports base, next offset, sizes and timestamps of the segment."""
    seg = _segment(tmp_path, count=10)
    meta = seg.meta()
    assert (meta.base_offset, meta.next_offset, meta.size_bytes) == (0, 20, seg.size)
    assert meta.first_batch_timestamp_ms == 1000
    assert meta.offset_index_bytes == seg.offset_index_path.stat().st_size
    assert meta.time_index_bytes == seg.time_index_path.stat().st_size


def _index_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the index files loaded from now on."""
    loaded: list[str] = []
    for cls in (OffsetIndex, TimeIndex):
        original = cls._load

        def counting(index: OffsetIndex | TimeIndex, original: Any = original) -> None:
            loaded.append(index.path.name)
            original(index)

        monkeypatch.setattr(cls, "_load", counting)
    return loaded


def test_a_small_segment_without_offset_index_entries_is_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small rolled segment whose offset index is empty (a quiet topic's) gives its
    metadata from one read of the `.log`, loading neither index; the same metadata as
    the usual way, through the indexes and the tail."""
    write_segment(tmp_path, 0, _batches(10), index_interval_bytes=1 << 20)
    usual = LogSegment(tmp_path, 0)
    usual.offset_index  # noqa: B018 - loaded first: the usual way
    expected = usual.meta()
    assert expected.time_index_bytes == TimeIndex.entry.size  # the entry written at roll

    loaded = _index_loads(monkeypatch)
    seg = LogSegment(tmp_path, 0)
    assert seg.meta() == expected
    assert loaded == []
    assert seg.delete_horizon is not None  # the whole walk found them too
    assert seg.delete_horizon == usual.delete_horizon


def test_a_segment_with_offset_index_entries_is_read_through_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With index entries, only the tail after the last one is walked."""
    write_segment(tmp_path, 0, _batches(30), index_interval_bytes=200)
    loaded = _index_loads(monkeypatch)
    seg = LogSegment(tmp_path, 0)
    assert seg.meta().next_offset == 60
    assert sorted(loaded) == ["00000000000000000000.index", "00000000000000000000.timeindex"]


def test_damage_in_a_small_segment_read_once_is_named(tmp_path: Path) -> None:
    """A bad CRC in a segment read whole for its metadata is reported with the file and
    the batch position, as the usual way reports it."""
    batches = _batches(3)
    seg = write_segment(tmp_path, 0, batches, index_interval_bytes=1 << 20)
    _flip_byte(seg.log_path, len(batches[0]) + 70)
    with pytest.raises(CorruptRecordError, match="CRC mismatch") as info:
        LogSegment(tmp_path, 0).meta()
    assert info.value.path == str(seg.log_path)
    assert info.value.position == len(batches[0])


@pytest.mark.parametrize("read_only", [True, False])
@pytest.mark.parametrize(
    "damage",
    [
        pytest.param((-4, 0x80), id="last-entry-before-the-log-start"),
        pytest.param((-1, 0x01), id="last-entry-on-no-batch"),
    ],
)
def test_a_damaged_index_is_read_as_the_owners_open_rebuilds_it(
    tmp_path: Path, read_only: bool, damage: tuple[int, int]
) -> None:
    """An offset index whose last entry is damaged in a way the log can repair (one
    flipped bit): the check raises, and the segment's metadata is read from a rebuilt
    index (written by an owner, in memory read-only), as the owner's open rebuilds it,
    so `plan` predicts what the cycle then does. Before, `meta` raised: the partition
    was unreadable in `plan` and, after a clean shutdown (no open rebuilds then),
    uncleanable in the owner's cycle too. A negative position never reaches the
    compiled walk, which would read before its buffer (it crashed `plan`, `audit` and
    an observing daemon once)."""
    seg = write_segment(tmp_path, 0, _batches(30), index_interval_bytes=200)
    sound = LogSegment(tmp_path, 0, read_only=True)
    meta, records = sound.meta(), list(sound.records(25))
    good = seg.offset_index_path.read_bytes()
    data = bytearray(good)
    at, bit = damage
    data[at] ^= bit
    seg.offset_index_path.write_bytes(bytes(data))
    with pytest.raises((CorruptIndexError, CorruptRecordError)):
        LogSegment(tmp_path, 0, read_only=True).check()
    reopened = LogSegment(tmp_path, 0, read_only=read_only)

    # The rebuild indexes at the segment's own interval, not the writer's.
    def unsized(m: SegmentMeta) -> SegmentMeta:
        return dataclasses.replace(m, offset_index_bytes=0, time_index_bytes=0)

    assert unsized(reopened.meta()) == unsized(meta)
    assert list(reopened.records(25)) == records
    on_disk = seg.offset_index_path.read_bytes()
    assert (on_disk == bytes(data)) is read_only


@pytest.mark.parametrize("read_only", [True, False])
@pytest.mark.parametrize("time_index", ["missing", "emptied"])
def test_a_time_index_without_entries_beside_offset_entries_dates_by_every_batch(
    tmp_path: Path, read_only: bool, time_index: str
) -> None:
    """The largest timestamp is in an early batch, and the `.timeindex` is gone or empty
    (a restore without it, an operator forcing a rebuild, Kafka's loader creating it
    empty) while the offset index has entries: the segment is dated by all its batches
    (the time index rebuilt: written by an owner, in memory read-only). It was dated by
    the batches after the last offset entry alone, hours too old, and retention.ms
    deleted it early (found after a clean shutdown, where the open checks nothing)."""
    early = [kv(f"k{n}", "v" * 40, timestamp=9_000_000 if n == 1 else 1000) for n in range(30)]
    batches = [encode_records([record], n) for n, record in enumerate(early)]
    seg = write_segment(tmp_path, 0, batches, index_interval_bytes=200)
    assert seg.offset_index.entries > 3
    if time_index == "missing":
        seg.time_index_path.unlink()
    else:
        seg.time_index_path.write_bytes(b"")
    with pytest.raises(CorruptIndexError):
        LogSegment(tmp_path, 0, read_only=True).check()
    reopened = LogSegment(tmp_path, 0, read_only=read_only)
    assert reopened.meta().largest_timestamp_ms == 9_000_000
    assert reopened.time_index_path.exists() is (not read_only or time_index == "emptied")
    if not read_only:
        assert TimeIndex.load(seg.time_index_path, 0).last_entry.timestamp == 9_000_000


@pytest.mark.parametrize("kept", [True, False], ids=["kept", "no state dir"])
def test_a_time_index_ahead_of_what_is_known_of_the_log_is_rebuilt_at_the_roll(
    tmp_path: Path, kept: bool
) -> None:
    """After a clean stop, the active segment is taken as it was kept (nothing read), or
    read by its last index entries (no state dir); its time index's last timestamp
    damaged to 2^62: the roll rebuilds the indexes from the log instead of closing the
    segment with that timestamp, which held compaction (and retention) back for good
    while `plan`, reading the kept metadata, predicted the pass."""
    batches = [encode_records([kv(f"k{n}", "v" * 40, timestamp=1000 + n)], n) for n in range(30)]
    write_segment(tmp_path, 0, batches, index_interval_bytes=200, inactive=False)
    read = LogSegment(tmp_path, 0)
    read.meta()
    known = read.known()
    assert known is not None
    index = tmp_path / "00000000000000000000.timeindex"
    data = bytearray(index.read_bytes())
    data[-12:-4] = (1 << 62).to_bytes(8, "big")
    index.write_bytes(bytes(data))
    active = LogSegment(tmp_path, 0, index_interval_bytes=200)
    assert active.seed(known) if kept else active.unread
    with capture_logs() as logs:
        active.close_for_roll()
    assert [e["event"] for e in logs] == ["segment.index_rebuilt"]
    assert LogSegment(tmp_path, 0).meta().largest_timestamp_ms == 1029
    assert TimeIndex.load(index, 0).last_entry.timestamp == 1029


def test_an_active_segment_read_after_a_crash_reads_past_a_cut_time_index(
    tmp_path: Path,
) -> None:
    """The active segment of a dir a crash left (read as growing: `plan`), its time
    index cut mid-entry: its metadata is read from indexes rebuilt in memory, as the
    owner's open rebuilds them, so `plan` no longer calls the partition unreadable
    where `clean` then cleans it; nothing on disk changes."""
    batches = [encode_records([kv(f"k{n}", "v" * 40, timestamp=1000 + n)], n) for n in range(30)]
    write_segment(tmp_path, 0, batches, index_interval_bytes=200, inactive=False)
    index = tmp_path / "00000000000000000000.timeindex"
    cut = index.read_bytes()[:-3]
    index.write_bytes(cut)
    seg = LogSegment(tmp_path, 0, read_only=True)
    seg.growing = True
    meta = seg.meta()
    assert (meta.next_offset, meta.largest_timestamp_ms) == (30, 1029)
    assert index.read_bytes() == cut


@pytest.mark.parametrize("read_only", [True, False])
def test_an_index_out_of_order_is_rebuilt_wherever_its_entries_point(
    tmp_path: Path, read_only: bool
) -> None:
    """An offset index of garbage: entries out of order, the last one past the log's
    end. The owner's cheap check rebuilds it (its order is checked first); reading the
    segment's metadata called it an index past the log (damage: `plan` said unreadable
    where `clean` rebuilt it). An index in order past the end stays damage."""
    batches = [encode_records([kv(f"k{n}", "v" * 40, timestamp=1000 + n)], n) for n in range(30)]
    seg = write_segment(tmp_path, 0, batches, index_interval_bytes=200, inactive=False)
    entries = ((5, 300), (3, 100), (25, 10**9))  # relative offset, position
    seg.offset_index_path.write_bytes(b"".join(struct.pack(">ii", *e) for e in entries))
    reopened = LogSegment(tmp_path, 0, read_only=read_only)
    assert (reopened.meta().next_offset, reopened.meta().largest_timestamp_ms) == (30, 1029)


def test_a_segment_without_timestamps_keeps_its_empty_time_index(tmp_path: Path) -> None:
    """Batches without timestamps (-1) leave the time index empty beside offset
    entries, as Kafka leaves it: nothing to rebuild, and the segment is dated by its
    file's time."""
    batches = [encode_records([kv(f"k{n}", "v" * 40, timestamp=-1)], n) for n in range(30)]
    seg = write_segment(tmp_path, 0, batches, index_interval_bytes=200)
    assert (seg.offset_index.entries > 3, seg.time_index.entries) == (True, 0)
    LogSegment(tmp_path, 0, read_only=True).check()
    with capture_logs() as logs:
        meta = LogSegment(tmp_path, 0).meta()
    assert meta.largest_timestamp_ms == seg.log_path.stat().st_mtime_ns // 1_000_000
    assert logs == []


def test_an_index_entry_outside_the_log_is_never_a_place_to_read_from(tmp_path: Path) -> None:
    """A damaged entry in the middle of the offset index (the last one sound, so the
    cheap check passes): a lookup that lands on it is a CorruptIndexError naming the
    index, not a read before the log's first byte."""
    seg = write_segment(tmp_path, 0, _batches(30), index_interval_bytes=200)
    assert seg.offset_index.entries >= 3
    target = seg.offset_index.entry_at(1)
    data = bytearray(seg.offset_index_path.read_bytes())
    data[8 + 4] |= 0x80  # entry 1's position
    seg.offset_index_path.write_bytes(bytes(data))
    reopened = LogSegment(tmp_path, 0, read_only=True)
    with pytest.raises(CorruptIndexError, match="is outside the log") as info:
        reopened.position_for(target.offset)
    assert info.value.path == str(seg.offset_index_path)


def test_read_only_segment_refuses_writes(tmp_path: Path) -> None:
    """A read-only segment cannot be appended to."""
    write_segment(tmp_path, 0, _batches(1))
    seg = LogSegment(tmp_path, 0, read_only=True)
    data = encode_records([Record(0, 0, b"k", b"v")], 2)
    with pytest.raises(PermissionError, match="read-only"):
        seg.append(data, list(scan_batches(data)))


def test_read_only_segment_replaced_while_read_is_a_changed_file(tmp_path: Path) -> None:
    """Observe mode beside a live broker: a segment listed, then replaced by another
    file under the same name (a cleaned segment renamed over it, here an empty one)
    raises FileChangedError, which the observer skips for the round, not a ValueError
    from mapping the new file."""
    write_segment(tmp_path, 0, _batches(3))
    seg = LogSegment(tmp_path, 0, read_only=True)
    swap = tmp_path / "swap"
    swap.write_bytes(b"")
    swap.rename(seg.log_path)
    with pytest.raises(FileChangedError, match=r"changed while read: .* now another file"):
        seg.meta()


def test_growing_segment_whose_last_index_entry_points_at_a_torn_batch(tmp_path: Path) -> None:
    """A read-only active segment whose last indexed batch is torn (a crash wrote the
    entry but not the whole batch, or the writer cut the file since its index was read)
    is read as an owner's recovery leaves it: the batches before the torn one, walked
    from the start, the time index's last entry (the torn batch's) not believed. Not
    growing (nobody writes it: a dir that stopped cleanly), the same bytes are damage
    naming the log and the torn batch's position."""
    batches = _batches(6)
    write_segment(tmp_path, 0, batches, index_interval_bytes=1)
    with open(tmp_path / "00000000000000000000.log", "r+b") as f:
        f.truncate(sum(map(len, batches)) - 10)  # the last batch, indexed, now torn
    seg = LogSegment(tmp_path, 0, read_only=True)
    seg.growing = True
    meta = seg.meta()
    assert (meta.next_offset, meta.size_bytes) == (10, sum(map(len, batches[:5])))
    assert meta.largest_timestamp_ms == max(1000 + (n * 7) % 13 for n in range(5))
    whole = LogSegment(tmp_path, 0, read_only=True)
    with pytest.raises(CorruptRecordError, match="runs past the end") as raised:
        whole.meta()
    assert (raised.value.path, raised.value.position) == (
        str(tmp_path / "00000000000000000000.log"),
        sum(map(len, batches[:5])),
    )


@pytest.mark.parametrize("appended", [0, 8], ids=["cut", "cut then appended"])
def test_a_live_segment_with_stale_index_entries_after_a_truncation_is_read_whole(
    tmp_path: Path, appended: int
) -> None:
    """Kafka's `truncateTo` (an unclean leader election, a follower's truncation) moves
    the active index's entry count back in the broker's memory only: the entries past
    the new end stay in the preallocated file until appends overwrite them. Read beside
    the broker (growing), the segment is read from its start, the stale entries not
    believed, whether they point past the log's end or, after new appends, into other
    batches; a lookup by offset reads from the start too. Not growing, an entry past the
    log's end is damage, as before (it was for the growing segment too: its partition
    unreadable until the broker's appends overwrote the entries), and one into other
    batches an index the owner's open rebuilds, so it is read as rebuilt."""
    batches = _batches(6)
    write_segment(tmp_path, 0, batches, index_interval_bytes=1)
    log = tmp_path / "00000000000000000000.log"
    kept = b"".join(batches[:2])
    new = _batches(appended, base=4, per_batch=1)  # smaller: the old positions are off
    log.write_bytes(kept + b"".join(new))  # the index still has its 6 entries
    if appended:  # the last stale entry now lies inside the new batches
        assert log.stat().st_size > 5 * len(batches[0])
    seg = LogSegment(tmp_path, 0, read_only=True)
    seg.growing = True
    meta = seg.meta()
    assert (meta.next_offset, meta.size_bytes) == (4 + appended, log.stat().st_size)
    # A read from an offset does not start at a stale entry's position either (the one
    # for offset 7 now lies inside the new batches).
    fresh = LogSegment(tmp_path, 0, read_only=True)
    fresh.growing = True
    assert [b.base_offset for b in fresh.batches(8)] == list(range(8, 4 + appended))
    assert [b.base_offset for b in fresh.batches(2)] == [2, *range(4, 4 + appended)]
    if not appended:
        with pytest.raises(IndexPastLogError):
            LogSegment(tmp_path, 0, read_only=True).meta()
        return
    assert LogSegment(tmp_path, 0, read_only=True).meta().next_offset == 4 + appended


def test_a_live_segment_cut_and_written_past_its_old_end_is_read_again_whole(
    tmp_path: Path,
) -> None:
    """A live segment read, then cut by its broker (Kafka's `truncateTo`) and appended
    to past its old end before it is read again: the same file, grown, is not appends
    only (its old end now lies inside a batch), so it is read again from its start. It
    was a corrupt batch at the old end ("unexpected magic"), which kept the partition
    unreadable in 40% of an observing daemon's cycles under a churning broker."""
    batches = _batches(6)
    write_segment(tmp_path, 0, batches, index_interval_bytes=100_000)
    log = tmp_path / "00000000000000000000.log"
    seg = LogSegment(tmp_path, 0, read_only=True)
    seg.growing = True
    assert seg.meta().next_offset == 12
    old_size = log.stat().st_size
    new = _batches(8, base=4, per_batch=1, ts0=5000)
    log.write_bytes(b"".join(batches[:2]) + b"".join(new))  # the same inode
    assert log.stat().st_size > old_size
    assert seg.refresh()
    meta = seg.meta()
    assert (meta.next_offset, meta.size_bytes) == (12, log.stat().st_size)
    assert meta.largest_timestamp_ms == max(5000 + (n * 7) % 13 for n in range(8))


def _big_unindexed(tmp_path: Path, torn: int) -> tuple[list[bytes], Path]:
    """A segment past the `pread` span (so it is mapped) with no index files, its last
    batch cut short by `torn` bytes."""
    batches = _batches(15_000, per_batch=1)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"".join(batches)[: sum(map(len, batches)) - torn])
    assert path.stat().st_size > segment_module._PREAD_SPAN
    return batches, path


def test_a_big_segment_read_whole_keeps_no_batch_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segment whose indexes are missing is read whole for its metadata, in one walk
    that keeps no table (72 bytes a batch: 425 MB for a 1 GiB segment of 1-record
    batches); a live broker's torn last batch ends it, with its totals just before."""
    monkeypatch.setattr(segment_module, "walk", _no_table_walk)
    batches, _ = _big_unindexed(tmp_path, torn=0)
    meta = LogSegment(tmp_path, 0, read_only=True).meta()
    assert meta.next_offset == len(batches)
    _, path = _big_unindexed(tmp_path, torn=7)
    seg = LogSegment(tmp_path, 0, read_only=True)
    seg.growing = True
    assert seg.meta().next_offset == len(batches) - 1
    assert seg.size == path.stat().st_size - (len(batches[-1]) - 7)


def test_a_torn_big_segment_not_growing_is_corrupt_at_its_last_batch(tmp_path: Path) -> None:
    """The same cut in a segment no writer is appending to is reported at its byte."""
    batches, path = _big_unindexed(tmp_path, torn=7)
    with pytest.raises(CorruptRecordError) as info:
        LogSegment(tmp_path, 0, read_only=True).meta()
    assert info.value.path == str(path)
    assert info.value.position == sum(map(len, batches[:-1]))


def _no_table_walk(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a walk that keeps a table")


def test_a_view_only_a_reference_cycle_holds_does_not_fail_the_read(tmp_path: Path) -> None:
    """A view of the mapping left in a reference cycle (as numba leaves the arguments of
    the call that compiled a kernel, on a first run with an empty cache) is collected
    when the block ends, instead of the close raising BufferError."""
    _big_unindexed(tmp_path, torn=0)
    seg = LogSegment(tmp_path, 0, read_only=True)
    gc.disable()
    try:
        with seg.open_buffer() as buf:
            cycle: list[Any] = [np.frombuffer(buf, np.uint8)]
            cycle.append(cycle)
            del cycle
    finally:
        gc.enable()
