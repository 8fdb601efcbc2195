"""Tests of cleanerd.compaction.horizon: earliest delete horizon per segment, cached."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.compaction.horizon import HorizonCache, SegmentHorizon, horizon_due, scan_horizons
from cleanerd.log.partition_log import PartitionLog
from cleanerd.records.batch import encode_batch
from cleanerd.records.header import Compression
from cleanerd.records.record import Record
from tests.builders import write_segment

NOW = 1_700_000_000_000


def batch(
    offset: int,
    horizon: int | None,
    *,
    tombstone: bool = True,
    codec: Compression = Compression.NONE,
) -> bytes:
    record = Record(offset, NOW - 5, b"k", None if tombstone else b"v")
    return encode_batch([record], base_offset=offset, delete_horizon_ms=horizon, compression=codec)


def partition(tmp_path: Path, horizons: list[list[int | None]]) -> PartitionLog:
    """Segments of one-record batches with the given horizons (None: no horizon); the
    last segment is active."""
    d = tmp_path / "logs" / "t-0"
    d.mkdir(parents=True)
    offset = 0
    for n, seg in enumerate(horizons):
        data = []
        base = offset
        for h in seg:
            data.append(batch(offset, h))
            offset += 1
        write_segment(d, base, data, inactive=n + 1 < len(horizons))
    return PartitionLog.open(d, read_only=True)


def test_no_horizon_in_plain_batches() -> None:
    """Batches without bit 6 carry no horizon, whatever their baseTimestamp."""
    assert scan_horizons(0, batch(0, None) + batch(1, None)) == SegmentHorizon(0, None, 0)
    assert scan_horizons(7, b"") == SegmentHorizon(7, None, 0)


def test_earliest_horizon_over_codecs_and_torn_tail() -> None:
    """The earliest horizon of any batch counts, compressed or not; an incomplete batch at
    the end stops the scan without error."""
    data = batch(0, NOW + 50) + batch(1, None) + batch(2, NOW - 20, codec=Compression.ZSTD)
    data += batch(3, NOW + 10, tombstone=False)
    torn = batch(4, NOW - 999)[:30]
    assert scan_horizons(0, data + torn) == SegmentHorizon(0, NOW - 20, 3)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(-(2**40), 2**40)), min_size=1, max_size=30))
def test_earliest_is_the_minimum(horizons: list[int | None]) -> None:
    """The scan's answer is the minimum horizon and the count of batches that have one."""
    data = b"".join(batch(i, h) for i, h in enumerate(horizons))
    present = [h for h in horizons if h is not None]
    expected = SegmentHorizon(0, min(present) if present else None, len(present))
    assert scan_horizons(0, data) == expected


def test_horizon_due_respects_end_offset() -> None:
    """A passed horizon counts only in segments below the end offset, at or after it."""
    hs = [SegmentHorizon(0, None, 0), SegmentHorizon(10, NOW, 1)]
    assert horizon_due(hs, now_ms=NOW)
    assert not horizon_due(hs, now_ms=NOW - 1)
    assert not horizon_due(hs, now_ms=NOW, end_offset=10)
    assert horizon_due(hs, now_ms=NOW, end_offset=11)


def test_cache_scans_inactive_segments_once(tmp_path: Path) -> None:
    """Non-active segments are scanned once; the active segment never; a due horizon in
    it does not count."""
    plog = partition(tmp_path, [[None, NOW + 100], [NOW - 1], [NOW - 50]])
    cache = HorizonCache()
    first = cache.partition(plog)
    assert [h.earliest_ms for h in first] == [NOW + 100, NOW - 1]
    assert cache.scans == 2
    assert cache.partition(plog) == first
    assert cache.scans == 2
    assert cache.horizon_due(plog, now_ms=NOW)
    assert not cache.horizon_due(plog, now_ms=NOW, end_offset=2)
    assert not cache.horizon_due(plog, now_ms=NOW - 2)


def test_cache_rescans_a_replaced_segment(tmp_path: Path) -> None:
    """A segment replaced by a swap (new inode, same base) is scanned again."""
    plog = partition(tmp_path, [[NOW - 1], [None], [None]])
    cache = HorizonCache()
    assert cache.horizon_due(plog, now_ms=NOW)
    log0 = plog.segments[0].log_path
    replacement = log0.with_name("replacement")
    replacement.write_bytes(batch(0, None))
    replacement.replace(log0)
    plog.refresh()
    assert not cache.horizon_due(plog, now_ms=NOW)
    assert cache.scans == 3


def test_a_segment_read_whole_for_its_metadata_needs_no_scan(tmp_path: Path) -> None:
    """Reading a small segment's metadata walks all of it (no index entry to start
    from), which finds its horizons too: the cache scans nothing, and answers the same."""
    plog = partition(tmp_path, [[None, NOW + 100], [NOW - 1], [NOW - 50]])
    plog.meta()
    cache = HorizonCache()
    assert [h.earliest_ms for h in cache.partition(plog)] == [NOW + 100, NOW - 1]
    assert [h.batches for h in cache.partition(plog)] == [1, 1]
    assert cache.scans == 0


def test_the_producer_state_walk_finds_the_horizons(tmp_path: Path) -> None:
    """Opening a log with no producer snapshot walks every batch for its producer
    state; that walk finds the horizons too, so the cache scans nothing and answers as
    a scan of each segment does."""
    plog = partition(tmp_path, [[None, NOW + 100, NOW + 7], [None], [NOW - 1], [NOW - 50]])
    plog.producer_state()
    cache = HorizonCache()
    found = cache.partition(plog)
    assert cache.scans == 0
    scanned = []
    for segment in plog.segments[:-1]:
        with segment.open_buffer() as buf:
            scanned.append(scan_horizons(segment.base_offset, buf))
    assert found == tuple(scanned)
    assert [(h.earliest_ms, h.batches) for h in found] == [(NOW + 7, 2), (None, 0), (NOW - 1, 1)]
