"""The compiled walker agrees with the per-batch reference checks (`scan.check_batch_at`)
on valid and damaged data, chunked or not, and its CRC-32C agrees with the `crc32c`
package."""

from __future__ import annotations

import itertools

import crc32c
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.compaction.horizon import scan_horizons
from cleanerd.errors import CorruptRecordError
from cleanerd.records import walker
from cleanerd.records.batch import encode_batch
from cleanerd.records.crc import crc32c_of
from cleanerd.records.header import Compression
from cleanerd.records.record import Record
from cleanerd.records.scan import BatchInfo, check_batch_at
from cleanerd.records.walker import Summary, Walker, batch_windows, summarize, walk
from tests.conftest import KAFKA_REAL
from tests.records.oracles import build_legacy


def reference(buf: bytes, verify_crc: bool = True) -> tuple[list[BatchInfo], int, str | None]:
    """One batch at a time in Python: the batches, where the walk stops, and why. Offsets
    must not be negative and must ascend (a legacy entry is judged by its own offset)."""
    infos: list[BatchInfo] = []
    p = 0
    while p < len(buf):
        try:
            info = check_batch_at(buf, p, len(buf), verify_crc=verify_crc)
        except CorruptRecordError as exc:
            return infos, p, str(exc)
        name, first = (
            ("base offset", info.base_offset) if info.magic == 2 else ("offset", info.last_offset)
        )
        why = None
        if first < 0:
            why = f"negative {name} {first}"
        elif infos and first <= (last := infos[-1].last_offset):
            why = f"{name} {first} is not above the previous batch's last offset {last}"
        elif info.last_offset > 2**63 - 1:
            delta = info.last_offset - first
            why = f"base offset {first} + lastOffsetDelta {delta} is past the largest offset"
        if why is not None:
            return infos, p, f"corrupt record batch at position {p}: {why}"
        infos.append(info)
        p += info.size
    return infos, p, None


@st.composite
def segments(draw: st.DrawFn) -> bytes:
    out, offset = [], draw(st.integers(0, 2**40))
    for _ in range(draw(st.integers(0, 12))):
        n = draw(st.integers(1, 5))
        records = [
            Record(
                offset=offset + i,
                timestamp=draw(st.integers(-1, 2**41)),
                key=draw(st.binary(max_size=8)),
                value=draw(st.one_of(st.none(), st.binary(max_size=40))),
            )
            for i in range(n)
        ]
        codec = draw(st.sampled_from([Compression.NONE, Compression.GZIP, Compression.ZSTD]))
        horizon = draw(st.none() | st.integers(0, 2**41))
        out.append(
            encode_batch(records, base_offset=offset, compression=codec, delete_horizon_ms=horizon)
        )
        offset += n + draw(st.integers(0, 3))
    return b"".join(out)


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(segments()))
    if data and draw(st.booleans()):
        at = draw(st.integers(0, len(data) - 1))
        data[at] ^= draw(st.integers(1, 255))
    if data and draw(st.booleans()):
        del data[draw(st.integers(0, len(data) - 1)) :]
    return bytes(data)


def same(
    buf: bytes,
    verify_crc: bool = True,
    rows: int | None = None,
    ramp: bool = False,
    own: bool = False,
) -> None:
    infos, stop, error = reference(buf, verify_crc)
    if rows is None:
        w = walk(buf, verify_crc=verify_crc)
        got, got_stop, got_error = w.table.infos(), w.stop, w.error
    elif own:  # every table kept to the end of the walk, none copied
        walker = Walker(buf, verify_crc=verify_crc, rows=rows, ramp=ramp, own=True)
        chunks = list(walker)
        got = [info for chunk in chunks for info in chunk.infos()]
        got_stop, got_error = walker.stop, walker.error
    else:
        walker = Walker(buf, verify_crc=verify_crc, rows=rows, ramp=ramp)
        got = [info for chunk in walker for info in chunk.infos()]
        got_stop, got_error = walker.stop, walker.error
    assert got == infos
    assert got_stop == stop
    assert (None if got_error is None else str(got_error)) == error


@settings(max_examples=150, deadline=None)
@given(damaged(), st.booleans())
def test_walk_agrees_with_the_reference_checks(buf: bytes, verify_crc: bool) -> None:
    same(buf, verify_crc)


@settings(max_examples=60, deadline=None)
@given(damaged(), st.integers(1, 40), st.booleans(), st.booleans())
def test_chunked_walk_agrees_too(buf: bytes, rows: int, ramp: bool, own: bool) -> None:
    same(buf, rows=rows, ramp=ramp, own=own)


def test_real_broker_segments_walk_like_the_reference() -> None:
    for path in sorted(KAFKA_REAL.rglob("*.log")):
        same(path.read_bytes())


def test_a_bad_crc_stops_the_walk_at_that_batch() -> None:
    """The walk stops at the batch and its error names the batch's position and the
    offset its header holds (what `dump` lists it by)."""
    batches = [
        encode_batch([Record(offset=i, timestamp=i, key=b"k", value=b"v" * 50)], base_offset=i)
        for i in range(3)
    ]
    data = bytearray(b"".join(batches))
    data[len(batches[0]) + 70] ^= 1  # inside the second batch's record
    w = walk(bytes(data))
    assert len(w.table) == 1
    assert w.stop == len(batches[0])
    assert w.error is not None
    assert f"at position {len(batches[0])}: CRC mismatch" in str(w.error)
    assert str(w.error).endswith(" (its header names offset 1)")
    assert not w.incomplete_tail
    assert len(walk(bytes(data), verify_crc=False).table) == 3


def test_a_legacy_entry_failing_its_crc_names_its_offset_too() -> None:
    """A legacy entry's damage names the offset its header holds, as a v2 batch's does."""
    entries = [build_legacy("aiokafka", 1, 0, [Record(i, 1000 + i, b"k", b"v")]) for i in range(3)]
    data = bytearray(b"".join(entries))
    data[len(entries[0]) + len(entries[1]) - 1] ^= 1  # the second entry's value
    w = walk(bytes(data))
    assert w.stop == len(entries[0])
    assert str(w.error).endswith("(its header names offset 1)")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=600), st.data())
def test_compiled_crc32c_matches_the_package(data: bytes, draw: st.DataObject) -> None:
    start = draw.draw(st.integers(0, len(data)))
    end = draw.draw(st.integers(start, len(data)))
    buf = np.frombuffer(data, np.uint8)
    assert crc32c_of(buf, start, end) == crc32c.crc32c(data[start:end])


def test_a_walk_never_starts_before_its_buffer() -> None:
    """The kernels read without bounds checks: a negative start (a damaged index entry's
    position) is refused before any of them runs."""
    buf = encode_batch([Record(offset=0, timestamp=1, key=b"k", value=b"v")], base_offset=0)
    with pytest.raises(ValueError, match="walk start -8 is before the buffer"):
        summarize(buf, start=-8)
    with pytest.raises(ValueError, match="walk start -1 is before the buffer"):
        walk(buf, start=-1)


@settings(max_examples=150, deadline=None)
@given(damaged(), st.booleans(), st.none() | st.integers(0, 6))
def test_summarize_agrees_with_the_table_walk(
    buf: bytes, verify_crc: bool, limit: int | None
) -> None:
    """`summarize` gives the totals of the table walk (and the delete horizons the
    compaction layer's own scan finds), or None exactly where the walk stops early."""
    got = summarize(buf, verify_crc=verify_crc, limit=limit)
    w = walk(buf, verify_crc=verify_crc)
    table = w.table if limit is None else w.table.head(limit)
    if w.error is not None and (limit is None or len(w.table) < limit):
        assert got is None
        return
    stop = w.stop if limit is None or len(w.table) <= limit else int(w.table.position[limit])
    assert got == Summary.of_table(table, stop)
    if limit is None:
        horizon = scan_horizons(0, buf)
        assert got.delete_horizon[1] == horizon.batches
        if horizon.batches:
            assert got.delete_horizon[0] == horizon.earliest_ms


def test_a_walk_to_the_end_takes_whole_chunks_and_a_ramp_starts_small() -> None:
    """A walk to the end fills the whole scratch table each step (one kernel call, not
    one per doubling of a first chunk of 16); `ramp` (for a consumer that may stop after
    the first batches) starts with 16 batches and doubles."""
    buf = b"".join(
        encode_batch([Record(i, 1000 + i, b"key-%d" % i, b"v" * 200)], base_offset=i)
        for i in range(100)
    )
    whole = [len(chunk) for chunk in Walker(buf)]
    ramped = [len(chunk) for chunk in Walker(buf, ramp=True)]
    assert whole == [100]
    assert ramped == [16, 32, 52]


@settings(max_examples=150, deadline=None)
@given(damaged(), st.integers(1, 400))
def test_batch_windows_cut_a_segment_at_batch_boundaries(buf: bytes, max_bytes: int) -> None:
    """The windows cover the segment in order, each at most `max_bytes` unless it is one
    batch; they start at batch boundaries, so each decodes alone, and walking them one
    after the other finds every batch and stops where one walk stops, with its error
    (a damaged batch whose length is sound is found in its window)."""
    windows = batch_windows(buf, max_bytes)
    assert windows[0][0] == 0
    assert windows[-1][1] == len(buf)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(windows))
    infos, stop, error = reference(buf)
    got: list[BatchInfo] = []
    for start, end, offsets in windows:
        w = walk(buf, start=start, end=end, offsets=offsets)
        got += w.table.infos()
        if w.error is not None or end == len(buf):
            assert w.stop == stop
            assert (None if w.error is None else str(w.error)) == error
            break
        assert w.stop == end  # the next window starts at a batch boundary
        assert end - start <= max_bytes or len(w.table) == 1
    assert got == infos
    if len(buf) <= max_bytes:
        assert windows == [(0, len(buf), walker.ANY_OFFSETS)]


def test_a_walk_keeps_only_the_rows_of_its_batches() -> None:
    """A walk's table is sized for small batches; one of big batches is copied down to
    its rows, so that a kept table (a pass's cached window) holds no unused capacity."""
    buf = b"".join(
        encode_batch(
            [Record(100 * b + i, 1000, b"key-%d" % i, b"v" * 100) for i in range(100)],
            base_offset=100 * b,
        )
        for b in range(10)
    )
    table = walk(buf).table
    assert len(table) == 10
    for column in table.arrays():
        owner = column if column.base is None else column.base
        assert owner.shape == (10,)


def test_batch_windows_are_found_as_they_are_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller decoding the first windows does not wait for the hop over the whole
    segment: each window's end is found when the window is first asked for."""
    buf = b"".join(
        encode_batch([Record(i, 1000 + i, b"key-%d" % i, b"v" * 200)], base_offset=i)
        for i in range(100)
    )
    expected = batch_windows(buf, 1000)
    hops: list[int] = []
    next_cut = walker._next_cut

    def counted(data: np.ndarray, run: int, max_bytes: int) -> tuple[int, int]:
        hops.append(run)
        cut, last = next_cut(data, run, max_bytes)
        return int(cut), int(last)

    monkeypatch.setattr(walker, "_next_cut", counted)
    windows = walker.BatchWindows(buf, 1000)
    assert windows.get(0) == (0, 825, walker.ANY_OFFSETS)  # three 275-byte batches
    assert hops == [0]
    assert windows.get(1) == (825, 1650, walker.OffsetRange(3, after_batch=True))
    assert hops == [0, 825]
    assert list(windows) == expected
    assert len(expected) == len(hops) == 34  # the last hop found no cut
    assert windows.get(34) is None


def _numbered(base: int, batches: int, per_batch: int = 1) -> bytes:
    return b"".join(
        encode_batch(
            [Record(o, 1000, b"k", b"v") for o in range(at, at + per_batch)], base_offset=at
        )
        for at in range(base, base + batches * per_batch, per_batch)
    )


def _with_base(buf: bytes, batch: int, value: int) -> tuple[bytes, int]:
    """`buf` with the base offset of its `batch`-th batch set to `value` (no CRC covers
    it), and that batch's position."""
    data = bytearray(buf)
    position = int(walk(buf).table.position[batch])
    data[position : position + 8] = value.to_bytes(8, "big", signed=True)
    return bytes(data), position


@pytest.mark.parametrize(
    ("batch", "value", "offsets", "reason"),
    [
        (2, -5, walker.ANY_OFFSETS, "negative base offset -5"),
        (
            2,
            101,
            walker.ANY_OFFSETS,
            "base offset 101 is not above the previous batch's last offset 101",
        ),
        (
            0,
            99,
            walker.OffsetRange.of_segment(100),
            "last offset 99 is below the segment's base offset 100",
        ),
        (
            4,
            100 + 2**31,
            walker.OffsetRange.of_segment(100),
            "last offset 2147483748 is more than 2147483647 past the segment's base offset 100",
        ),
        (
            4,
            110,
            walker.OffsetRange.of_segment(100, 105),
            "last offset 110 is not below the next segment's base offset 105",
        ),
    ],
)
def test_a_base_offset_outside_the_walks_range_stops_it(
    batch: int, value: int, offsets: walker.OffsetRange, reason: str
) -> None:
    """No CRC covers a batch's base offset: a walk refuses one that is negative, does not
    ascend, or leaves its segment's range, naming the batch; every walk agrees (one
    table, chunks, the summary, windows of one batch)."""
    buf, position = _with_base(_numbered(100, 5), batch, value)
    w = walk(buf, offsets=offsets)
    assert isinstance(w.error, walker.BadOffsetError)
    assert str(w.error) == f"corrupt record batch at position {position}: {reason}"
    assert (len(w.table), w.stop) == (batch, position)
    assert summarize(buf, offsets=offsets) is None
    chunked = Walker(buf, rows=1, offsets=offsets)
    assert sum(len(chunk) for chunk in chunked) == batch
    assert str(chunked.error) == str(w.error)
    for start, end, window in batch_windows(buf, 1, offsets):  # a batch a window
        error = walk(buf, start=start, end=end, offsets=window).error
        if error is not None:
            assert (start, str(error)) == (position, str(w.error))
            break
    else:
        raise AssertionError("no window refused the batch")


def test_the_largest_offset_is_still_an_offset() -> None:
    """A batch may end at the largest offset; one more record would be past it."""
    top = 2**63 - 1
    assert walk(_numbered(top - 1, 1, per_batch=2)).error is None
    buf, _ = _with_base(_numbered(0, 1, per_batch=2), 0, top)
    error = walk(buf).error
    assert error is not None
    assert f"base offset {top} + lastOffsetDelta 1 is past the largest offset" in str(error)


def test_a_segments_range_holds_exactly_its_offsets() -> None:
    """[base offset, next segment's base offset): its bounds are offsets it may hold."""
    buf = _numbered(100, 5)
    assert walk(buf, offsets=walker.OffsetRange.of_segment(100, 105)).error is None
    assert walk(buf, offsets=walker.OffsetRange.of_segment(101, 105)).error is not None
    assert walk(buf, offsets=walker.OffsetRange.of_segment(100, 104)).error is not None


def test_windows_narrow_the_range_to_what_follows_the_window_before() -> None:
    buf = _numbered(100, 4, per_batch=3)
    size = len(buf) // 4
    windows = batch_windows(buf, size, walker.OffsetRange.of_segment(100, 200))
    assert [w.offsets for w in windows] == [
        walker.OffsetRange(0, 100, 199),
        walker.OffsetRange(103, 100, 199, after_batch=True),
        walker.OffsetRange(106, 100, 199, after_batch=True),
        walker.OffsetRange(109, 100, 199, after_batch=True),
    ]


def test_a_batch_is_in_its_segment_by_its_last_offset() -> None:
    """Kafka's loader judges a batch by its last offset: a v2 batch starting below its
    segment's base but ending in it (a legacy compressed wrapper, rolled at its own
    offset, cleaned into a v2 batch) is sound; one ending below the base is not."""
    buf = _numbered(4, 1, per_batch=3) + _numbered(7, 2)  # offsets 4..6, 7, 8
    segment = walker.OffsetRange.of_segment(6, 9)
    assert walk(buf, offsets=segment).error is None
    assert summarize(buf, offsets=segment) is not None
    error = walk(buf, offsets=walker.OffsetRange.of_segment(7, 9)).error
    assert str(error) == (
        "corrupt record batch at position 0: last offset 6 is below the segment's base offset 7"
    )


def test_nothing_follows_a_batch_at_the_largest_offset() -> None:
    """A batch ending at the largest offset leaves no offset for another: the next one
    is refused by every walk (its `last + 1` had wrapped to a negative bound), and
    windows cut after it do not overflow."""
    buf = _numbered(2**63 - 1, 1) + _numbered(5, 1)
    whole = walk(buf)
    assert isinstance(whole.error, walker.BadOffsetError)
    assert "base offset 5 follows a batch that ends at the largest offset" in str(whole.error)
    chunked = Walker(buf, rows=1)
    list(chunked)
    assert str(chunked.error) == str(whole.error)
    assert summarize(buf) is None
    errors = [walk(buf, start=a, end=b, offsets=o).error for a, b, o in batch_windows(buf, 1)]
    assert str(errors[1]) == str(whole.error)


def test_a_legacy_entry_is_judged_by_its_crc_before_its_offset() -> None:
    """A legacy entry whose offset and content are both damaged (as a torn last entry
    is) fails its CRC, as the reference walk says and as a v2 batch's does: the walk
    checked its offset first, so log recovery took a torn entry for damage to report
    rather than a tail to cut. One whose CRC holds is still refused for its offset."""
    entries = [build_legacy("aiokafka", 1, 0, [Record(i, 1000 + i, b"k", b"v")]) for i in range(3)]
    buf = bytearray(b"".join(entries))
    last = len(entries[0]) * 2
    buf[last : last + 8] = (0).to_bytes(8, "big")  # offset 0 again: not above 1
    offset_only = bytes(buf)
    buf[last + len(entries[2]) - 1] ^= 0xFF  # and the value torn
    both = bytes(buf)
    for damaged, kind in ((both, "CRC"), (offset_only, "offset")):
        w = walk(damaged)
        assert (len(w.table), w.stop) == (2, last)
        assert str(w.error) == reference(damaged)[2]
        assert isinstance(w.error, walker.BadOffsetError) == (kind == "offset")
    assert "CRC" in str(walk(both).error)
