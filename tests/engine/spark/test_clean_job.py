"""The Spark clean job's pure parts: the reduce rule against the offset map, the bitmaps
and the per-segment transaction check."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.compaction.cleaner import CleanerConfig
from cleanerd.compaction.keyhash import hash_key
from cleanerd.compaction.offset_map import OffsetMap
from cleanerd.compaction.strategy import CompactionStrategy, resolve_strategy
from cleanerd.engine.spark import clean_job
from cleanerd.engine.spark.clean_job import (
    SegmentTask,
    SupersededBitmaps,
    aborted_batches,
    bitmap_path,
    read_bitmap,
    segment_rows,
    segment_tasks,
    superseded_rows,
    write_bitmap,
)
from cleanerd.engine.spark.specs import JobSpec, Manifest, PassSpec
from cleanerd.errors import CleanerdError, CorruptIndexError, CorruptRecordError, FileStepError
from cleanerd.log.txnindex import AbortedTxn
from cleanerd.records.batch import encode_batch
from cleanerd.records.columns import segment_columns
from cleanerd.records.control import ControlRecordType, encode_end_txn_marker
from cleanerd.records.record import Record
from cleanerd.records.walker import OffsetRange
from tests.builders import set_base_offset
from tests.compaction.conftest import TP, LogBuilder, k, segment_metas

row_st = st.tuples(
    st.integers(0, 5),  # key
    st.booleans(),  # has version
    st.integers(-2, 2),  # version
    st.booleans(),  # mappable (not aborted)
)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(row_st, min_size=1, max_size=40),
    split=st.integers(0, 40),
    strategy=st.sampled_from(list(CompactionStrategy)),
)
def test_reduce_supersedes_what_the_offset_map_drops(
    rows: list[tuple[int, bool, int, bool]], split: int, strategy: CompactionStrategy
) -> None:
    """A row is superseded by the shuffle's rule iff the local map (put, then update from
    the clean section) does not keep it."""
    versioned = strategy is not CompactionStrategy.OFFSET
    n = len(rows)
    first_dirty = min(split, n)
    hashes = np.array([hash_key(str(r[0]).encode()) for r in rows], dtype=np.uint64)
    offsets = np.arange(n, dtype=np.int64) * 2
    has = np.array([r[1] and versioned for r in rows], np.bool_)
    version = np.array([r[2] if versioned else 0 for r in rows], np.int64)
    dirty = np.arange(n) >= first_dirty
    cand = dirty & np.array([r[3] for r in rows], np.bool_)
    upd = ~dirty if versioned else np.zeros(n, np.bool_)
    m = OffsetMap(1 << 16, strategy=strategy)
    c = np.flatnonzero(cand)
    m.put_many(
        hashes[c], offsets[c], version[c] if versioned else None, has[c] if versioned else None
    )
    if versioned:
        u = np.flatnonzero(upd)
        m.update_existing_many(hashes[u], offsets[u], version[u], has[u])
    expected = np.flatnonzero(~m.keep_mask(hashes, offsets))
    cols: dict[str, np.ndarray] = {
        "pass": np.zeros(n, np.int32),
        "seg": np.zeros(n, np.int64),
        "krow": np.arange(n, dtype=np.int64),
        "hi": hashes[:, 0].view(np.int64),
        "lo": hashes[:, 1].view(np.int64),
        "offset": offsets,
        "has": has,
        "version": version,
        "cand": cand,
        "upd": upd,
    }
    got = superseded_rows(cols, np.array([versioned]))
    assert sorted(got["krow"].tolist()) == expected.tolist()


def test_a_staging_write_that_fails_names_its_file_and_step(tmp_path: Path) -> None:
    """A bitmap or a job document the staging dir cannot take (a full disk; here a
    file where its dir should be) fails naming the file and the step, as every other
    file operation of a pass does. Before, the job's error was the bare
    `[Errno 28] No space left on device`."""
    (tmp_path / "pass-0").write_text("not a dir")
    path = bitmap_path(tmp_path, 0, 100)
    with pytest.raises(FileStepError) as info:
        write_bitmap(path, np.array([1], np.int64))
    assert info.value.path == str(path)
    assert "while staging a segment's superseded-record bitmap" in str(info.value)
    spec = tmp_path / "pass-0" / "spec.json"
    with pytest.raises(FileStepError, match=r"while staging the Spark job's spec\.json"):
        Manifest(outcomes=()).write(spec)


def test_bitmap_round_trip_and_oracle(tmp_path: Path) -> None:
    """Staged bits read back; the oracle keeps every keyed record but the superseded,
    and refuses a bitmap longer than the segment's keyed records."""
    path = bitmap_path(tmp_path, 0, 100)
    assert write_bitmap(path, np.array([1, 4, 9], np.int64)) == 10
    assert np.flatnonzero(read_bitmap(path)).tolist() == [1, 4, 9]
    oracle = SupersededBitmaps(tmp_path, 0, end_offset=50)
    assert oracle.latest_offset == 49

    def no_hashes() -> np.ndarray:
        raise AssertionError("the bitmaps need no hashes")

    keep = oracle.keep_keyed(100, 0, np.arange(12, dtype=np.int64), no_hashes, final=True)
    assert np.flatnonzero(~keep).tolist() == [1, 4, 9]
    assert oracle.keep_keyed(7, 0, np.arange(3, dtype=np.int64), no_hashes, final=True).all()
    # A segment copied in windows: each gets its part of the bitmap.
    parts = [
        oracle.keep_keyed(100, 0, np.arange(4, dtype=np.int64), no_hashes, final=False),
        oracle.keep_keyed(100, 4, np.arange(4, dtype=np.int64), no_hashes, final=False),
        oracle.keep_keyed(100, 8, np.arange(4, dtype=np.int64), no_hashes, final=True),
    ]
    assert np.flatnonzero(~np.concatenate(parts)).tolist() == [1, 4, 9]
    assert oracle.keep_keyed(100, 0, np.arange(5, dtype=np.int64), no_hashes, final=False).any()
    with pytest.raises(CleanerdError, match="changed since the job read it"):
        oracle.keep_keyed(100, 0, np.arange(5, dtype=np.int64), no_hashes, final=True)
    with pytest.raises(CleanerdError, match="changed since the job read it"):
        oracle.keep_keyed(100, 4, np.arange(4, dtype=np.int64), no_hashes, final=True)


def _segment(batches: list[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(batches), np.uint8)


def test_missing_abort_marker_is_a_corrupt_index() -> None:
    """An aborted transaction ending in a segment without its ABORT marker there fails
    the segment: one tracker per segment would otherwise misjudge its data."""
    data = encode_batch(
        [Record(0, 1, b"k", b"v")], base_offset=0, producer_id=5, is_transactional=True
    )
    marker = encode_batch(
        [encode_end_txn_marker(ControlRecordType.ABORT, 0, offset=1, timestamp=1)],
        base_offset=1,
        producer_id=5,
        is_transactional=True,
        is_control=True,
    )
    strategy = resolve_strategy("offset", None)
    txn = AbortedTxn(0, 5, 1, 2)
    task = SegmentTask(0, "/p/0.log", 0, 2, 0, 2, strategy, (txn,), OffsetRange.of_segment(0, 2))
    sc = segment_columns(_segment([data, marker]))
    assert aborted_batches(sc, task).tolist() == [True, False]
    with pytest.raises(CorruptIndexError, match="no ABORT marker at 1"):
        aborted_batches(segment_columns(_segment([data])), task)


def _txn_segment() -> tuple[bytes, SegmentTask]:
    """Keyed and keyless records, an aborted transaction of producer 5 whose ABORT
    marker comes batches later, and a task whose dirty range starts inside it."""
    batches, offset = [], 0
    for i in range(12):
        txn = i in (2, 5)
        key = None if i % 4 == 3 else b"k%d" % (i % 5)
        batches.append(
            encode_batch(
                [Record(offset, 1, key, b"v%d" % i), Record(offset + 1, 1, b"x", None)],
                base_offset=offset,
                producer_id=5 if txn else -1,
                is_transactional=txn,
            )
        )
        offset += 2
    batches.append(
        encode_batch(
            [encode_end_txn_marker(ControlRecordType.ABORT, 0, offset=offset, timestamp=1)],
            base_offset=offset,
            producer_id=5,
            is_transactional=True,
            is_control=True,
        )
    )
    strategy = resolve_strategy("offset", None)
    task = SegmentTask(
        0,
        "/p/0.log",
        0,
        offset + 1,
        3,
        offset + 1,
        strategy,
        (AbortedTxn(4, 5, offset, offset + 1),),
        OffsetRange.of_segment(0, offset + 1),
    )
    return b"".join(batches), task


def test_segment_rows_in_windows_are_the_rows_of_one_decode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Decoded a few batches at a time, a segment gives the very rows of one decode:
    keyed-record ranks run on across windows, and the aborted transaction's data is
    found although its marker is in a later window."""
    raw, task = _txn_segment()
    whole = segment_rows(task, raw)
    assert whole["cand"].sum() < whole["cand"].size  # the aborted data is no candidate
    monkeypatch.setattr(clean_job, "DECODE_WINDOW_BYTES", 150)
    windowed = segment_rows(task, raw)
    assert whole.keys() == windowed.keys()
    for name in whole:
        np.testing.assert_array_equal(windowed[name], whole[name], err_msg=name)


def test_aborted_data_below_the_dirty_range_contends_with_no_winner() -> None:
    """Below the dirty range, the timestamp strategy's contenders (`upd`) are the keyed
    records of data that is not aborted, as in the local pass; aborted ones contended
    and could beat (and delete) their key's live record."""
    raw, task = _txn_segment()
    below = replace(task, first_dirty=task.upper, strategy=resolve_strategy("timestamp", None))
    rows = segment_rows(below, raw)
    aborted = np.isin(rows["offset"], [4, 5, 10, 11])  # batches 2 and 5, producer 5
    assert aborted.any()
    assert rows["upd"].tolist() == (~aborted).tolist()
    assert not rows["cand"].any()


def test_a_missing_abort_marker_fails_a_segment_read_in_windows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The marker check is made once the last window is read."""
    raw, task = _txn_segment()
    table = segment_columns(raw)
    cut = int(table.batch_position[-1])  # drop the ABORT marker
    monkeypatch.setattr(clean_job, "DECODE_WINDOW_BYTES", 150)
    with pytest.raises(CorruptIndexError, match="no ABORT marker"):
        segment_rows(task, raw[:cut])


@pytest.mark.parametrize("window_bytes", [1 << 20, 1])
def test_an_executor_refuses_a_base_offset_out_of_its_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window_bytes: int
) -> None:
    """The job decodes each segment against the offsets it may hold, as the local pass
    does: a base offset no CRC covers, reaching the next segment's, fails the task with
    the file and position (it was cleaned as if sound), in one window or many."""
    log = LogBuilder(tmp_path / "logs")
    for i in range(30):
        log.append([(k(i % 4), b"v")])
        if i % 10 == 9:
            log.roll()
    d = log.write()
    seg = d / f"{10:020d}.log"
    position = set_base_offset(seg, -1, 20)
    metas = tuple(segment_metas(d))
    spec = PassSpec(
        log_dir=d.parent,
        tp=TP,
        segments=metas,
        first_dirty=0,
        first_uncleanable=metas[-1].base_offset,
        now_ms=1,
        config=CleanerConfig(),
    )
    (task,) = [t for t in segment_tasks(JobSpec((spec,), tmp_path)) if t.base == 10]
    assert task.offsets == OffsetRange(0, 10, 19)
    monkeypatch.setattr(clean_job, "DECODE_WINDOW_BYTES", window_bytes)
    with pytest.raises(CorruptRecordError) as caught:
        segment_rows(task, seg.read_bytes())
    assert str(caught.value) == (
        f"corrupt record batch in {seg} at position {position}: "
        "last offset 20 is not below the next segment's base offset 20"
    )
