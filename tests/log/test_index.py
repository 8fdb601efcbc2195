"""Tests of cleanerd.log.index: Kafka's offset and time indexes."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.errors import CorruptIndexError
from cleanerd.log.index import (
    IndexBuilder,
    IndexPastLogError,
    OffsetIndex,
    OffsetPosition,
    TimeIndex,
    TimestampOffset,
)


def _offset_index(tmp_path: Path, base: int = 100, max_size: int = 1024) -> OffsetIndex:
    return OffsetIndex(tmp_path / "x.index", base, max_index_size=max_size)


def test_offset_lookup_greatest_entry_at_or_below(tmp_path: Path) -> None:
    """Lookup returns the greatest entry <= target, or (base, 0) when there is none."""
    index = _offset_index(tmp_path)
    for offset, position in [(105, 500), (110, 1000), (120, 2000)]:
        index.append(offset, position)
    assert index.lookup(99) == OffsetPosition(100, 0)
    assert index.lookup(104) == OffsetPosition(100, 0)
    assert index.lookup(105) == OffsetPosition(105, 500)
    assert index.lookup(119) == OffsetPosition(110, 1000)
    assert index.lookup(10**9) == OffsetPosition(120, 2000)


def test_offset_index_file_format(tmp_path: Path) -> None:
    """Entries are relativeOffset:int32 | position:int32 big-endian, file trimmed."""
    index = _offset_index(tmp_path)
    index.append(101, 70)
    index.append(300, 0x01020304)
    index.flush_entries()
    assert index.path.read_bytes() == (
        b"\x00\x00\x00\x01\x00\x00\x00\x46" + b"\x00\x00\x00\xc8\x01\x02\x03\x04"
    )
    again = OffsetIndex.load(index.path, 100)
    assert again.entries == 2
    assert again.lookup(250) == OffsetPosition(101, 70)


def test_offset_append_must_strictly_increase(tmp_path: Path) -> None:
    """Appending an offset not above the last one is an error."""
    index = _offset_index(tmp_path)
    index.append(105, 10)
    with pytest.raises(ValueError, match="no larger than the last offset 105"):
        index.append(105, 20)


def test_offset_must_fit_int32_relative(tmp_path: Path) -> None:
    """Relative offsets must fit an int32 and not be negative."""
    index = _offset_index(tmp_path)
    with pytest.raises(ValueError, match="int32"):
        index.append(100 + 2**31, 10)
    with pytest.raises(ValueError, match="int32"):
        index.append(99, 10)


def test_offset_index_capacity(tmp_path: Path) -> None:
    """max entries = segment.index.bytes // 8; a full index refuses appends."""
    index = _offset_index(tmp_path, max_size=20)
    assert index.max_entries == 2
    index.append(101, 1)
    index.append(102, 2)
    assert index.is_full
    with pytest.raises(ValueError, match="full index"):
        index.append(103, 3)


def test_time_index_full_one_slot_early(tmp_path: Path) -> None:
    """The time index is full at max - 1 entries; the final entry skips the check."""
    index = TimeIndex(tmp_path / "x.timeindex", 0, max_index_size=36)
    assert index.max_entries == 3
    index.maybe_append(10, 1)
    index.maybe_append(20, 2)
    assert index.is_full
    with pytest.raises(ValueError, match="full time index"):
        index.maybe_append(30, 3)
    assert index.maybe_append(30, 3, skip_full_check=True)
    assert index.entries == 3


def test_time_index_only_strictly_greater(tmp_path: Path) -> None:
    """Only a strictly greater timestamp adds an entry; going backwards is an error."""
    index = TimeIndex(tmp_path / "x.timeindex", 0)
    assert not index.maybe_append(-1, 0)  # no timestamp (v0 data) never indexes
    assert index.maybe_append(0, 0)
    assert index.maybe_append(50, 3)
    assert not index.maybe_append(50, 4)
    assert index.entries == 2
    with pytest.raises(ValueError, match="below the last timestamp"):
        index.maybe_append(40, 5)
    with pytest.raises(ValueError, match="below the last offset"):
        index.maybe_append(60, 2)


def test_time_lookup(tmp_path: Path) -> None:
    """Time lookup returns the greatest entry with timestamp <= target, or (-1, base)."""
    index = TimeIndex(tmp_path / "x.timeindex", 10)
    index.maybe_append(1000, 12)
    index.maybe_append(2000, 15)
    assert index.lookup(999) == TimestampOffset(-1, 10)
    assert index.lookup(1500) == TimestampOffset(1000, 12)
    assert index.lookup(5000) == TimestampOffset(2000, 15)
    index.flush_entries()
    assert index.path.read_bytes() == (
        (1000).to_bytes(8, "big")
        + (2).to_bytes(4, "big")
        + (2000).to_bytes(8, "big")
        + (5).to_bytes(4, "big")
    )


def test_flush_appends_and_trims(tmp_path: Path) -> None:
    """flush_entries appends only new entries and leaves the file exactly entries x 8."""
    index = _offset_index(tmp_path)
    index.append(101, 10)
    index.flush_entries()
    index.append(102, 20)
    index.flush_entries()
    assert index.path.stat().st_size == 16
    assert OffsetIndex.load(index.path, 100).entry_at(1) == OffsetPosition(102, 20)


def test_preallocated_zero_tail_is_ignored(tmp_path: Path) -> None:
    """A Kafka-preallocated index (zeros after the entries) loads only the real entries
    and is trimmed on the next flush."""
    path = tmp_path / "x.index"
    path.write_bytes((1).to_bytes(4, "big") + (70).to_bytes(4, "big") + bytes(8 * 100))
    index = OffsetIndex.load(path, 0)
    assert index.entries == 1
    assert index.last_entry == OffsetPosition(1, 70)
    index.flush_entries()
    assert path.stat().st_size == 8


def _preallocated(path: Path, entries: list[tuple[int, int]], *, size: int) -> None:
    """A live broker's active offset index: entries written, then the file extended to
    `size` (Java's setLength: a sparse tail)."""
    with path.open("wb") as f:
        for offset, position in entries:
            f.write(offset.to_bytes(4, "big") + position.to_bytes(4, "big"))
        f.truncate(size)


def _pread_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    sizes: list[int] = []
    pread = os.pread

    def counting(fd: int, length: int, position: int) -> bytes:
        sizes.append(length)
        return pread(fd, length, position)

    monkeypatch.setattr(os, "pread", counting)
    return sizes


def test_sparse_preallocated_index_reads_only_its_written_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker's 10 MiB preallocated index with a few entries: the hole after them is
    not read (it reads as zeros), and the entries load as from a whole read."""
    path = tmp_path / "x.index"
    entries = [(i * 10, i * 4096) for i in range(1, 50)]
    _preallocated(path, entries, size=10 * 1024 * 1024)
    whole = OffsetIndex(path, 0)
    whole._strip_preallocated(path.read_bytes())
    sizes = _pread_sizes(monkeypatch)
    index = OffsetIndex.load(path, 0)
    assert (index.entries, index.last_entry) == (49, OffsetPosition(490, 49 * 4096))
    assert (index.entries, index.last_entry) == (whole.entries, whole.last_entry)
    assert max(sizes) < 1024 * 1024


def test_preallocated_index_with_data_after_a_hole_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bytes written after a hole (not a preallocated tail) are still seen: the file is
    read whole, and its last non-zero entry is the last entry."""
    path = tmp_path / "x.index"
    _preallocated(path, [(1, 70)], size=4 * 1024 * 1024)
    with path.open("r+b") as f:
        f.seek(2 * 1024 * 1024)
        f.write((9).to_bytes(4, "big") + (900).to_bytes(4, "big"))
    sizes = _pread_sizes(monkeypatch)
    index = OffsetIndex.load(path, 0)
    assert index.last_entry == OffsetPosition(9, 900)
    assert max(sizes) == 4 * 1024 * 1024


def test_preallocated_index_trimmed_while_read_loads_its_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live broker trims an active segment's preallocated time index when it rolls
    it, maybe while an observer reads it: the read then ends part-way into the zero
    tail, at a size that is no whole number of entries. The real entries load."""
    path = tmp_path / "x.timeindex"
    entries = [(1_000 + i, i) for i in range(3)]
    content = b"".join(t.to_bytes(8, "big") + o.to_bytes(4, "big") for t, o in entries)
    path.write_bytes(content + bytes(12 * 20_000))
    read_bytes = Path.read_bytes

    def trimmed_mid_read(self: Path) -> bytes:
        raw = read_bytes(self)
        if self == path:
            os.truncate(path, len(content))  # the broker's trim, during the read
            return raw[:131_072]  # 131072 = 12 x 10922 + 8
        return raw

    monkeypatch.setattr(Path, "read_bytes", trimmed_mid_read)
    index = TimeIndex.load(path, 0)
    assert index.entries == 3
    assert index.last_entry == TimestampOffset(1_002, 2)


def test_single_zero_time_entry_is_real(tmp_path: Path) -> None:
    """A one-entry time index (timestamp 0 at the base offset) is a real entry."""
    path = tmp_path / "x.timeindex"
    path.write_bytes(bytes(12))
    assert TimeIndex.load(path, 5).last_entry == TimestampOffset(0, 5)
    path.write_bytes(bytes(24))
    assert TimeIndex.load(path, 5).entries == 0


def test_size_not_multiple_of_entry_is_corrupt(tmp_path: Path) -> None:
    """A file whose size is not a whole number of entries raises CorruptIndexError."""
    path = tmp_path / "x.index"
    path.write_bytes(b"\x00" * 9)
    with pytest.raises(CorruptIndexError, match="not a multiple of the entry size 8"):
        OffsetIndex.load(path, 0)


@pytest.mark.parametrize("kind", [OffsetIndex, TimeIndex])
def test_a_dir_where_the_index_file_is_is_an_error_naming_it(
    tmp_path: Path, kind: type[OffsetIndex | TimeIndex]
) -> None:
    """A dir standing where an index file is: the error names the path (the read of a
    dir failed with a bare "[Errno 21] Is a directory")."""
    path = tmp_path / "00000000000000000000.index"
    path.mkdir()
    with pytest.raises(IsADirectoryError, match="a directory stands where the index file is") as e:
        kind.load(path, 0)
    assert e.value.filename == str(path)


def test_sanity_check_catches_disorder_and_past_log(tmp_path: Path) -> None:
    """Non-increasing entries are corrupt; an entry past the log is IndexPastLogError."""
    path = tmp_path / "x.index"
    entries = [(5, 100), (3, 200)]
    path.write_bytes(b"".join(r.to_bytes(4, "big") + p.to_bytes(4, "big") for r, p in entries))
    with pytest.raises(CorruptIndexError, match="entry 1 has offset 3, not above entry 0's 5"):
        OffsetIndex.load(path, 0).sanity_check()
    good = OffsetIndex(tmp_path / "y.index", 0)
    good.append(5, 100)
    good.check_within(101, tmp_path / "y.log")
    with pytest.raises(IndexPastLogError, match="points to position 100, past the end") as e:
        good.check_within(100, tmp_path / "y.log")
    assert f"of the log {tmp_path / 'y.log'} (100 bytes): the log was cut short" in str(e.value)


def test_time_sanity_check(tmp_path: Path) -> None:
    """Time index timestamps must strictly increase."""
    path = tmp_path / "x.timeindex"
    entries = [(50, 1), (50, 2)]
    path.write_bytes(b"".join(t.to_bytes(8, "big") + r.to_bytes(4, "big") for t, r in entries))
    with pytest.raises(CorruptIndexError, match="timestamp"):
        TimeIndex.load(path, 0).sanity_check()


def _builder(tmp_path: Path, interval: int) -> IndexBuilder:
    oi = OffsetIndex(tmp_path / "b.index", 0)
    ti = TimeIndex(tmp_path / "b.timeindex", 0)
    return IndexBuilder(oi, ti, interval)


def test_first_batch_never_indexed_and_more_than_interval(tmp_path: Path) -> None:
    """An entry needs MORE than interval bytes since the last one, counted before the
    batch; the first batch never gets an entry, even with interval 0."""
    builder = _builder(tmp_path, 100)
    # batches of 50 bytes: counter before each batch is 0, 50, 100, 150 -> entry at #3
    for n in range(6):
        builder.add_batch(n * 50, 50, n, 1000 + n)
    assert [builder.offset_index.entry_at(i) for i in range(builder.offset_index.entries)] == [
        OffsetPosition(3, 150)
    ]
    zero = _builder(tmp_path, 0)  # in memory only: the files are never written
    zero.add_batch(0, 10, 0, 5)
    assert zero.offset_index.entries == 0
    zero.add_batch(10, 10, 1, 5)
    assert zero.offset_index.entries == 1


def test_time_entry_is_max_so_far_and_its_offset(tmp_path: Path) -> None:
    """A time entry holds the max timestamp so far and the last offset of the earliest
    batch holding it; finish() adds the final max-timestamp entry."""
    builder = _builder(tmp_path, 0)
    builder.add_batch(0, 10, 4, 500)  # offsets 0..4, max ts 500
    builder.add_batch(10, 10, 9, 300)  # entry: (500, 4)
    builder.add_batch(20, 10, 14, 500)  # equal ts: no new time entry
    builder.add_batch(30, 10, 19, 700)  # entry: (700, 19)
    builder.add_batch(40, 10, 24, 900)  # entry: (900, 24)
    builder.add_batch(50, 10, 29, 950)  # counter 10 > 0: entry (950, 29)
    ti = builder.time_index
    assert [ti.entry_at(i) for i in range(ti.entries)] == [
        TimestampOffset(500, 4),
        TimestampOffset(700, 19),
        TimestampOffset(900, 24),
        TimestampOffset(950, 29),
    ]
    builder.finish()
    assert ti.entries == 4  # the max is already there


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(61, 400), min_size=1, max_size=60),
    interval=st.integers(0, 1500),
)
def test_lookup_finds_a_position_at_or_before_every_batch(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], interval: int
) -> None:
    """For every offset, the lookup position is a batch start at or before the batch
    holding that offset (so a forward scan finds it)."""
    d = tmp_path_factory.mktemp("idx")
    builder = IndexBuilder(OffsetIndex(d / "i", 0), TimeIndex(d / "t", 0), interval)
    positions, position = [], 0
    for n, size in enumerate(sizes):
        builder.add_batch(position, size, 2 * n + 1, n)
        positions.append(position)
        position += size
    for n, start in enumerate(positions):
        for offset in (2 * n, 2 * n + 1):
            found = builder.offset_index.lookup(offset)
            assert found.position in positions
            assert found.position <= start


def _builders(d: Path, interval: int, max_size: int) -> tuple[IndexBuilder, IndexBuilder]:
    return tuple(  # type: ignore[return-value]
        IndexBuilder(
            OffsetIndex(d / f"{n}.index", 10, max_index_size=max_size),
            TimeIndex(d / f"{n}.timeindex", 10, max_index_size=max_size),
            interval,
        )
        for n in range(2)
    )


@settings(max_examples=80, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(1, 300), st.integers(1, 5), st.integers(-1, 60)),
        min_size=1,
        max_size=80,
    ),
    cuts=st.lists(st.integers(0, 80), max_size=4),
    interval=st.integers(0, 700),
    max_size=st.sampled_from([48, 96, 10 * 1024]),
)
def test_add_batches_as_columns_is_add_batch_row_by_row(
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[tuple[int, int, int]],
    cuts: list[int],
    interval: int,
    max_size: int,
) -> None:
    """The columnar path (the compiled rule, entries appended as columns, in chunks as a
    walk hands them over) writes the same two files as one `add_batch` per batch, and
    raises where it does (a full index)."""
    d = tmp_path_factory.mktemp("cols")
    by_row, by_columns = _builders(d, interval, max_size)
    position, last = 0, 9
    table = []
    for size, records, ts in rows:
        last += records
        table.append((position, size, last, ts))
        position += size
    row_error = column_error = None
    try:
        for row in table:
            by_row.add_batch(*row)
        by_row.finish()
    except ValueError as exc:
        row_error = exc
    try:
        bounds = sorted({0, len(table), *(c for c in cuts if c <= len(table))})
        for lo, hi in itertools.pairwise(bounds):
            columns = np.array(table[lo:hi], dtype=np.int64).T
            by_columns.add_batches(*columns)
        by_columns.finish()
    except ValueError as exc:
        column_error = exc
    assert (row_error is None) == (column_error is None), (row_error, column_error)
    if row_error is None:
        for a, b in (
            (by_row.offset_index, by_columns.offset_index),
            (by_row.time_index, by_columns.time_index),
        ):
            assert a.to_bytes() == b.to_bytes()
            assert a.last_entry == b.last_entry
        assert by_row.bytes_since_last_entry == by_columns.bytes_since_last_entry
        by_columns.offset_index.write()
        by_columns.time_index.write()
        assert OffsetIndex.load(d / "1.index", 10).to_bytes() == by_row.offset_index.to_bytes()


def test_append_many_refuses_what_append_refuses(tmp_path: Path) -> None:
    """Rows out of order, rows past the capacity and offsets beyond int32 of the base
    are refused as a whole: nothing is added."""
    oi = _offset_index(tmp_path, base=100, max_size=8 * 4)
    oi.append(105, 10)
    cases = [
        ([105, 106], "no larger"),  # not above the last entry
        ([107, 109, 108], "no larger"),  # out of order within
        ([106, 107, 108, 109], "full index"),  # 1 + 4 > 4 entries
        ([106, 100 + 2**31], "int32"),
    ]
    for offsets, message in cases:
        column = np.array(offsets, dtype=np.int64)
        with pytest.raises(ValueError, match=message):
            oi.append_many(column, column)
        assert oi.entries == 1
    oi.append_many(np.array([106, 108], np.int64), np.array([20, 30], np.int64))
    assert [oi.entry_at(n) for n in range(3)] == [
        OffsetPosition(105, 10),
        OffsetPosition(106, 20),
        OffsetPosition(108, 30),
    ]


def test_append_increasing_keeps_only_new_maxima(tmp_path: Path) -> None:
    """Each row is kept when its timestamp is above the one before it (and the last
    entry); a row below the last entry is refused, as `maybe_append` refuses it."""
    ti = TimeIndex(tmp_path / "t.timeindex", 0)
    ti.maybe_append(100, 3)
    ti.append_increasing(np.array([100, 150, 150, 200], np.int64), np.array([3, 7, 7, 9], np.int64))
    assert [ti.entry_at(n) for n in range(ti.entries)] == [
        TimestampOffset(100, 3),
        TimestampOffset(150, 7),
        TimestampOffset(200, 9),
    ]
    with pytest.raises(ValueError, match="below the last"):
        ti.append_increasing(np.array([250], np.int64), np.array([8], np.int64))
    assert ti.entries == 3


def test_append_increasing_fills_a_time_index_as_maybe_append_does(tmp_path: Path) -> None:
    """A 48-byte time index is full at 3 of its 4 slots: three new rows fit (the check
    before the third sees two entries), a fourth is refused, and nothing is added."""
    for rows, fits in ((3, True), (4, False)):
        ti = TimeIndex(tmp_path / f"{rows}.timeindex", 0, max_index_size=48)
        column = np.arange(1, rows + 1, dtype=np.int64)
        if fits:
            ti.append_increasing(column, column)
            assert ti.entries == rows
        else:
            with pytest.raises(ValueError, match="full time index"):
                ti.append_increasing(column, column)
            assert ti.entries == 0
