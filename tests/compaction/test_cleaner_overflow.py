"""Offset and size overflow of a cleaned segment (ref 4.17, KAFKA-20036; scenario 36's
input): the output continues in a new segment, the partition stays cleanable."""

from __future__ import annotations

from pathlib import Path

from cleanerd.compaction.cleaner import CleanerConfig
from cleanerd.log.files import log_file
from cleanerd.log.recovery import SegmentOptions, recover_partition
from cleanerd.log.txnindex import AbortedTxn
from cleanerd.records.walker import scan_batches
from tests.compaction.conftest import (
    LONG_MAX,
    LogBuilder,
    aborted_txns,
    clean,
    k,
    segment_metas,
    view,
)

INT32_MAX = 2**31 - 1


def config(
    interval: int = 1, *, max_bytes: int = INT32_MAX, max_range: int = INT32_MAX
) -> CleanerConfig:
    return CleanerConfig(
        segment_bytes=4096,
        producer_id_expiration_ms=LONG_MAX,
        index_interval_bytes=interval,
        max_cleaned_segment_bytes=max_bytes,
        max_cleaned_offset_range=max_range,
    )


def check_recovers_unchanged(d: Path, interval: int = 1) -> None:
    """Kafka's full recovery finds every segment and index consistent."""
    _, report = recover_partition(
        d, SegmentOptions(interval, 10 * 1024 * 1024), recover=True, full_check=True
    )
    assert report.errors == []
    assert report.rebuilt_indexes == []


def two_one_record_segments(root: Path) -> Path:
    log = LogBuilder(root, index_interval=1)
    log.append([(k(0), k(0))])
    log.roll()
    log.append([(k(1), k(1))])
    log.roll()
    return log.write()


def test_cleaned_segment_size_overflow(tmp_path: Path) -> None:
    """Kafka's testCleanedSegmentSizeOverflow: with room for one batch, two one-record
    source segments become two cleaned segments; the segment count is unchanged and
    keys 0 and 1 both stay."""
    d = two_one_record_segments(tmp_path / "logs")
    batch = segment_metas(d)[0].size_bytes
    before = len(segment_metas(d))
    result = clean(d, config=config(max_bytes=batch + 1))
    assert [m.base_offset for m in segment_metas(d)] == [0, 1, 2]
    assert len(segment_metas(d)) == before
    assert view(d).keys == [k(0), k(1)]
    assert result.end_offset == 2
    check_recovers_unchanged(d)


def test_cleaned_segment_offset_overflow(tmp_path: Path) -> None:
    """Kafka's testCleanedSegmentOffsetOverflow: with an offset range of 0 the second
    record overflows the first cleaned segment and starts another."""
    d = two_one_record_segments(tmp_path / "logs")
    before = len(segment_metas(d))
    clean(d, config=config(max_range=0))
    assert len(segment_metas(d)) == before
    assert view(d).keys == [k(0), k(1)]
    check_recovers_unchanged(d)


def test_36_source_segment_with_offset_overflow_is_cleaned(tmp_path: Path) -> None:
    """Scenario 36 (trunk): a legacy segment holding an offset more than 2^31-1 above
    its base is cleaned into two segments, superseded keys removed, relative offsets
    valid; the next pass cleans across them instead of the partition being marked."""
    far = 2**31 + 5
    sparse = 1 << 20  # no index entry: the source index cannot hold the far offset
    log = LogBuilder(tmp_path / "logs", index_interval=sparse)
    log.append([(k(0), b"a"), (k(1), b"b")], timestamps=[5000, 5001])
    log.append([(k(0), b"c")], offset=far, timestamps=[1000])
    log.append([(k(2), b"d")], timestamps=[1001])
    log.roll()
    log.append([(k(1), b"e")])
    log.roll()
    log.append([(k(3), b"f")])
    d = log.write()
    first = clean(d, config=config(sparse), first_uncleanable=far + 2)
    assert [m.base_offset for m in segment_metas(d)] == [0, far, far + 2, far + 3]
    assert view(d).keys == [k(1), k(0), k(2), k(1), k(3)]
    for base in (0, far):
        for info in scan_batches(log_file(d, base).read_bytes()):
            assert 0 <= info.last_offset - base <= INT32_MAX
    check_recovers_unchanged(d, sparse)
    clean(d, config=config(sparse), first_dirty=first.end_offset)
    assert view(d).keys == [k(0), k(2), k(1), k(3)]
    check_recovers_unchanged(d, sparse)


def test_split_output_keeps_each_markers_txnindex(tmp_path: Path) -> None:
    """Aborted transactions whose markers land in different output segments are indexed
    in their own segment's `.txnindex`."""
    log = LogBuilder(tmp_path / "logs", index_interval=1)
    log.append([(k(1), b"x")], pid=1, txn=True)
    log.append([(k(9), b"keep")])
    log.abort(1)
    log.append([(k(2), b"y")], pid=2, txn=True)
    log.abort(2)
    log.roll()
    log.append([(k(3), b"z")])
    d = log.write()
    clean(d, config=config(max_range=2))
    bases = [m.base_offset for m in segment_metas(d)]
    assert bases == [0, 3, 5]
    assert aborted_txns(d) == [AbortedTxn(0, 1, 2, 3), AbortedTxn(3, 2, 4, 5)]
    check_recovers_unchanged(d)


def test_stale_cleaned_files_of_a_dead_pass_are_removed(tmp_path: Path) -> None:
    """`.cleaned` files a pass left when it died (here at a split base no segment has)
    are removed by the next pass before it writes, so no later crash recovery mistakes
    a finished swap for an unfinished one."""
    d = two_one_record_segments(tmp_path / "logs")
    stale = d / f"{7:020d}.log.cleaned"
    stale.write_bytes(b"left by a killed pass")
    clean(d, config=config())
    assert not list(d.glob("*.cleaned"))
    assert view(d).keys == [k(0), k(1)]
