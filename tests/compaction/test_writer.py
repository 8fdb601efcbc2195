"""Tests of the cleaned-output writer: Kafka's index rule in bulk, and the continuation
in a new segment at an overflow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.compaction.swap import FileOps
from cleanerd.compaction.writer import CleanedOutput, OutputChunk, OutputLimits
from cleanerd.log.files import offset_index_file, time_index_file, txn_index_file
from cleanerd.log.index import IndexBuilder, OffsetIndex, TimeIndex
from cleanerd.log.txnindex import AbortedTxn

CLEANED = ".cleaned"


def chunk(sizes: list[int], bases: list[int], lasts: list[int], max_ts: list[int]) -> OutputChunk:
    """A chunk of batches filled with a byte pattern (the writer never parses them)."""
    end = np.cumsum(np.array(sizes, dtype=np.int64))
    data = (np.arange(int(end[-1]) if sizes else 0) % 251).astype(np.uint8)
    return OutputChunk(
        data=data,
        end=end,
        base_offset=np.array(bases, dtype=np.int64),
        last_offset=np.array(lasts, dtype=np.int64),
        max_timestamp=np.array(max_ts, dtype=np.int64),
    )


def index_builder_files(
    d: Path, base: int, sizes: list[int], lasts: list[int], max_ts: list[int], interval: int
) -> tuple[bytes, bytes]:
    """The .index and .timeindex bytes IndexBuilder gives the same batches."""
    oi = OffsetIndex(offset_index_file(d, base), base)
    ti = TimeIndex(time_index_file(d, base), base)
    builder = IndexBuilder(oi, ti, interval)
    position = 0
    for size, last, ts in zip(sizes, lasts, max_ts, strict=True):
        builder.add_batch(position, size, last, ts)
        position += size
    builder.finish()
    return oi.to_bytes(), ti.to_bytes()


batches = st.lists(
    st.tuples(
        st.integers(61, 3000),  # size
        st.integers(0, 40),  # offset gap before the batch
        st.integers(0, 20),  # last offset delta
        st.integers(-1, 50),  # max timestamp
    ),
    min_size=1,
    max_size=60,
)


@settings(deadline=None, max_examples=60)
@given(batches=batches, interval=st.integers(0, 5000), cut=st.integers(0, 60))
def test_indexes_match_index_builder(
    tmp_path_factory: pytest.TempPathFactory,
    batches: list[tuple[int, int, int, int]],
    interval: int,
    cut: int,
) -> None:
    """Whatever the chunking, the offset and time indexes are byte for byte those Kafka's
    per-batch rule (IndexBuilder) gives."""
    d = tmp_path_factory.mktemp("w")
    sizes, bases, lasts, max_ts = [], [], [], []
    offset = 100
    for size, gap, delta, ts in batches:
        base = offset + gap
        sizes.append(size)
        bases.append(base)
        lasts.append(base + delta)
        max_ts.append(ts)
        offset = base + delta + 1
    out = CleanedOutput(FileOps(), d, 100, OutputLimits(index_interval_bytes=interval))
    k = min(cut, len(sizes))
    for part in ((0, k), (k, len(sizes))):
        if part[1] > part[0]:
            sl = slice(*part)
            out.append(chunk(sizes[sl], bases[sl], lasts[sl], max_ts[sl]))
    out.finish(mtime_ns=1_000_000_000, aborted=[])
    assert out.bases == (100,)
    ref = d / "ref"
    ref.mkdir()
    want = index_builder_files(ref, 100, sizes, lasts, max_ts, interval)
    got = (
        offset_index_file(d, 100, CLEANED).read_bytes(),
        time_index_file(d, 100, CLEANED).read_bytes(),
    )
    assert got == want
    assert (d / f"{100:020d}.log{CLEANED}").stat().st_size == sum(sizes)


def test_size_overflow_continues_in_a_new_segment(tmp_path: Path) -> None:
    """A batch that would end past the size limit starts a new segment at its base offset;
    the first batch of a segment is taken whatever its size."""
    out = CleanedOutput(FileOps(), tmp_path, 0, OutputLimits(max_segment_bytes=250))
    out.append(chunk([100, 100, 100, 400, 10], [0, 5, 9, 20, 30], [4, 8, 19, 29, 30], [1] * 5))
    out.finish(mtime_ns=1_000_000_000, aborted=[])
    assert out.bases == (0, 9, 20, 30)
    sizes = [(tmp_path / f"{b:020d}.log{CLEANED}").stat().st_size for b in out.bases]
    assert sizes == [200, 100, 400, 10]
    assert out.next_offset == 31
    assert out.size_bytes == 710


def test_offset_range_overflow_continues_in_a_new_segment(tmp_path: Path) -> None:
    """A batch whose last offset lies more than the range above the segment's base
    starts a new segment; relative offsets in its indexes start again from 0."""
    limits = OutputLimits(max_offset_range=2**31 - 1, index_interval_bytes=0)
    out = CleanedOutput(FileOps(), tmp_path, 0, limits)
    far = 2**31 + 5
    out.append(chunk([80, 80, 80], [0, 1, far], [0, 1, far + 2], [3, 4, 5]))
    out.finish(mtime_ns=1_000_000_000, aborted=[])
    assert out.bases == (0, far)
    second = OffsetIndex.load(offset_index_file(tmp_path, far, CLEANED), far)
    assert second.entries == 0  # its only batch is its first: never indexed
    first = OffsetIndex.load(offset_index_file(tmp_path, 0, CLEANED), 0)
    assert (first.entry_at(0).offset, first.entry_at(0).position) == (1, 80)


def test_full_index_continues_in_a_new_segment(tmp_path: Path) -> None:
    """When the offset index is full (segment.index.bytes), the next batch starts a new
    segment, as a full index rolls a segment on append."""
    limits = OutputLimits(max_index_size=36, index_interval_bytes=0)  # 4 offset entries
    out = CleanedOutput(FileOps(), tmp_path, 0, limits)
    n = 7
    out.append(chunk([70] * n, list(range(n)), list(range(n)), [5] * n))
    out.finish(mtime_ns=1_000_000_000, aborted=[])
    assert out.bases == (0, 5)
    sizes = [offset_index_file(tmp_path, b, CLEANED).stat().st_size for b in out.bases]
    assert sizes == [4 * 8, 1 * 8]


def test_aborted_transactions_go_to_their_markers_segment(tmp_path: Path) -> None:
    """Each output segment's `.txnindex` holds the aborted transactions whose ABORT marker
    it holds; a segment without one has no `.txnindex`."""
    out = CleanedOutput(FileOps(), tmp_path, 0, OutputLimits(max_offset_range=10))
    out.append(chunk([70] * 4, [0, 5, 12, 30], [4, 10, 12, 30], [1] * 4))
    early, late = AbortedTxn(0, 7, 10, 11), AbortedTxn(11, 8, 12, 13)
    out.finish(mtime_ns=1_000_000_000, aborted=[early, late])
    assert out.bases == (0, 12, 30)
    assert txn_index_file(tmp_path, 0, CLEANED).read_bytes() == early.to_bytes()
    assert txn_index_file(tmp_path, 12, CLEANED).read_bytes() == late.to_bytes()
    assert not txn_index_file(tmp_path, 30, CLEANED).exists()


def test_finish_sets_mtimes_and_abandon_removes_every_segment(tmp_path: Path) -> None:
    """Finished files take the given mtime; abandoning removes the files of every
    output segment."""
    out = CleanedOutput(FileOps(), tmp_path, 0, OutputLimits(max_segment_bytes=100))
    out.append(chunk([80, 80], [0, 1], [0, 1], [1, 2]))
    out.finish(mtime_ns=1_234_000_000_000, aborted=[])
    logs = sorted(tmp_path.glob("*.log.cleaned"))
    assert len(logs) == 2
    assert {p.stat().st_mtime_ns for p in logs} == {1_234_000_000_000}
    out.abandon()
    assert list(tmp_path.iterdir()) == []
