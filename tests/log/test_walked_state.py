"""State the log layer derives from walked batch tables (open transactions, index
entries) equals the batch-at-a-time rules it replaces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.log.index import IndexBuilder, OffsetIndex, TimeIndex
from cleanerd.log.partition_log import _apply_txn_batch, _apply_txn_rows
from cleanerd.records.batch import encode_batch
from cleanerd.records.record import Record
from cleanerd.records.walker import walk

BATCH = st.tuples(st.integers(-1, 3), st.booleans(), st.booleans())  # pid, txn, control


@settings(max_examples=120, deadline=None)
@given(st.lists(BATCH, max_size=25), st.dictionaries(st.integers(0, 3), st.integers(0, 5)))
def test_open_transactions_from_a_table_match_batch_by_batch(
    specs: list[tuple[int, bool, bool]], before: dict[int, int]
) -> None:
    data = b"".join(
        encode_batch(
            [Record(offset=100 + i, timestamp=i, key=b"k", value=b"v")],
            base_offset=100 + i,
            producer_id=pid,
            producer_epoch=0 if pid >= 0 else -1,
            is_transactional=txn,
            is_control=control,
        )
        for i, (pid, txn, control) in enumerate(specs)
    )
    table = walk(data).table
    expected = dict(before)
    for info in table.infos():
        _apply_txn_batch(expected, info)
    got = dict(before)
    _apply_txn_rows(got, table, 0)
    assert got == expected


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(61, 3000), st.integers(-1, 50)), max_size=60),
    st.integers(0, 4096),
)
def test_index_entries_from_a_table_match_batch_by_batch(
    batches: list[tuple[int, int]], interval: int
) -> None:
    sizes = np.array([s for s, _ in batches], np.int64)
    position = (np.cumsum(sizes) - sizes).astype(np.int64)
    last = np.arange(len(batches), dtype=np.int64) * 2 + 1
    ts = np.array([t for _, t in batches], np.int64)

    def builder() -> IndexBuilder:
        d = Path("/nonexistent")
        return IndexBuilder(OffsetIndex(d / "a", 0), TimeIndex(d / "b", 0), interval)

    one, bulk = builder(), builder()
    for p, s, lo, t in zip(
        position.tolist(), sizes.tolist(), last.tolist(), ts.tolist(), strict=True
    ):
        one.add_batch(p, s, lo, t)
    bulk.add_batches(position, sizes, last, ts)
    for index in ("offset_index", "time_index"):
        a, b = getattr(one, index), getattr(bulk, index)
        assert [a.entry_at(n) for n in range(a.entries)] == [
            b.entry_at(n) for n in range(b.entries)
        ]
    assert (one.max_timestamp, one.offset_of_max_timestamp, one.bytes_since_last_entry) == (
        bulk.max_timestamp,
        bulk.offset_of_max_timestamp,
        bulk.bytes_since_last_entry,
    )
