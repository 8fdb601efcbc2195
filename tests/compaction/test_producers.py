"""Tests of producer-state rebuilding from batch headers (ref 4.9 step 2)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.compaction.producers import (
    LastRecord,
    ProducerBatch,
    ProducerColumns,
    ProducerStateBuilder,
    active_producers,
    is_last_batch_of_producer,
    last_records_of_active_producers,
)
from cleanerd.compaction.transactions import ABORT, COMMIT

DAY = 86_400_000


def data(pid: int, last: int, *, epoch: int = 0, ts: int = 0, txn: bool = False) -> ProducerBatch:
    return ProducerBatch(pid, epoch, last, ts, txn, False)


def marker(pid: int, last: int, kind: int | None, *, epoch: int = 0, ts: int = 0) -> ProducerBatch:
    return ProducerBatch(pid, epoch, last, ts, True, True, kind)


def test_last_data_offset_per_producer() -> None:
    """Each producer's last data batch offset and epoch are found."""
    out = last_records_of_active_producers(
        [data(1, 2), data(2, 5), data(1, 7, epoch=0)], now_ms=0, expiration_ms=DAY
    )
    assert out == {1: LastRecord(7, 0), 2: LastRecord(5, 0)}


def test_marker_only_producer_has_no_data_offset() -> None:
    """A producer whose only batch is a marker has no last data offset, only its epoch."""
    out = last_records_of_active_producers(
        [marker(1, 0, COMMIT, epoch=3)], now_ms=0, expiration_ms=DAY
    )
    assert out == {1: LastRecord(None, 3)}


def test_epoch_bump_by_marker_forgets_data_offset() -> None:
    """A marker with a new epoch clears the producer's last data offset."""
    out = last_records_of_active_producers(
        [data(1, 0, txn=True), marker(1, 1, ABORT, epoch=1)], now_ms=0, expiration_ms=DAY
    )
    assert out == {1: LastRecord(None, 1)}


def test_empty_control_batch_counts_as_its_marker() -> None:
    """An emptied marker still sets the producer's epoch, as the marker did."""
    out = last_records_of_active_producers(
        [data(1, 0), marker(1, 1, None, epoch=4)], now_ms=0, expiration_ms=DAY
    )
    assert out == {1: LastRecord(None, 4)}


def test_expiry_spares_open_transactions() -> None:
    """Producers expire after the expiration time unless a transaction is open."""
    out = last_records_of_active_producers(
        [data(1, 0, ts=0), data(2, 1, ts=0, txn=True), data(3, 2, ts=DAY)],
        now_ms=DAY,
        expiration_ms=DAY,
    )
    assert set(out) == {2, 3}


def test_is_last_batch_rules() -> None:
    """A data offset matches by last offset; otherwise a control batch of the epoch."""
    lr = {1: LastRecord(7, 0), 2: LastRecord(None, 3)}
    assert is_last_batch_of_producer(
        lr, producer_id=1, producer_epoch=0, last_offset=7, is_control=False
    )
    assert not is_last_batch_of_producer(
        lr, producer_id=1, producer_epoch=0, last_offset=6, is_control=False
    )
    assert is_last_batch_of_producer(
        lr, producer_id=2, producer_epoch=3, last_offset=9, is_control=True
    )
    assert not is_last_batch_of_producer(
        lr, producer_id=2, producer_epoch=3, last_offset=9, is_control=False
    )
    assert not is_last_batch_of_producer(
        lr, producer_id=9, producer_epoch=0, last_offset=0, is_control=True
    )


@dataclass(slots=True)
class _RefEntry:
    epoch: int
    last_data_offset: int | None
    last_timestamp: int
    txn_open: bool


def _reference_last_records(
    batches: list[ProducerBatch], now_ms: int, expiration_ms: int
) -> dict[int, LastRecord]:
    """The rules of the module docstring, one batch at a time."""
    entries: dict[int, _RefEntry] = {}
    for b in batches:
        entry = entries.get(b.producer_id)
        if b.is_control:
            if b.control_type is not None and b.control_type not in (ABORT, COMMIT):
                continue
            if entry is None:
                entries[b.producer_id] = _RefEntry(b.producer_epoch, None, b.max_timestamp, False)
                continue
            if entry.epoch != b.producer_epoch:
                entry.last_data_offset = None
            entry.epoch, entry.last_timestamp, entry.txn_open = (
                b.producer_epoch,
                b.max_timestamp,
                False,
            )
        elif entry is None:
            entries[b.producer_id] = _RefEntry(
                b.producer_epoch, b.last_offset, b.max_timestamp, b.is_transactional
            )
        else:
            entry.epoch, entry.last_data_offset = b.producer_epoch, b.last_offset
            entry.last_timestamp = b.max_timestamp
            entry.txn_open = entry.txn_open or b.is_transactional
    return {
        pid: LastRecord(e.last_data_offset, e.epoch)
        for pid, e in entries.items()
        if e.txn_open or now_ms - e.last_timestamp < expiration_ms
    }


_BATCH = st.builds(
    lambda pid, epoch, ts, txn, control, kind: (pid, epoch, ts, txn, control, kind),
    st.integers(0, 4),
    st.integers(0, 2),
    st.one_of(st.integers(-1, 20), st.sampled_from([-(2**63), 2**63 - 1])),
    st.booleans(),
    st.booleans(),
    st.sampled_from([None, ABORT, COMMIT, 2, 7, -5]),
)


def _batches(rows: list[tuple[int, int, int, bool, bool, int | None]]) -> list[ProducerBatch]:
    return [
        ProducerBatch(pid, epoch, offset, ts, txn or control, control, kind if control else None)
        for offset, (pid, epoch, ts, txn, control, kind) in enumerate(rows)
    ]


@given(st.lists(_BATCH, max_size=40), st.integers(0, 30), st.sampled_from([0, 5, 20, 2**63 - 1]))
@settings(max_examples=300, deadline=None)
def test_kernel_matches_the_rules_batch_by_batch(
    rows: list[tuple[int, int, int, bool, bool, int | None]], now_ms: int, expiration_ms: int
) -> None:
    """The compiled fold gives what applying the rules one batch at a time gives, and the
    columnar last-batch check agrees with Kafka's rule asked batch by batch."""
    batches = _batches(rows)
    expected = _reference_last_records(batches, now_ms, expiration_ms)
    columns = ProducerColumns.of(batches)
    active = active_producers(columns, now_ms=now_ms, expiration_ms=expiration_ms)
    assert active.as_dict() == expected
    assert active.producer_id.tolist() == sorted(expected)
    probe_pids = columns.producer_id.copy()
    probe_pids[::3] += 2  # some producers the state may not hold
    mask = active.last_batch_mask(
        probe_pids, columns.producer_epoch, columns.last_offset, columns.is_control
    )
    for i, b in enumerate(batches):
        last = expected.get(int(probe_pids[i]))
        if last is None:
            want = False
        elif last.last_data_offset is not None:
            want = b.last_offset == last.last_data_offset
        else:
            want = b.is_control and b.producer_epoch == last.producer_epoch
        assert bool(mask[i]) == want


@given(
    st.lists(_BATCH, max_size=40),
    st.lists(st.integers(0, 40), max_size=6),
    st.integers(1, 8),
    st.integers(0, 30),
    st.sampled_from([0, 5, 20, 2**63 - 1]),
)
@settings(max_examples=300, deadline=None)
def test_folding_the_log_in_parts_gives_the_one_fold(
    rows: list[tuple[int, int, int, bool, bool, int | None]],
    cuts: list[int],
    fold_rows: int,
    now_ms: int,
    expiration_ms: int,
) -> None:
    """The builder, given the log in any parts and folding them into one batch per
    producer whenever it holds `fold_rows` batches, ends with the rules' result."""
    batches = _batches(rows)
    builder = ProducerStateBuilder(fold_rows=fold_rows)
    bounds = [0, *sorted(min(c, len(batches)) for c in cuts), len(batches)]
    for a, b in itertools.pairwise(bounds):
        builder.add(ProducerColumns.of(batches[a:b]))
    active = builder.result(now_ms=now_ms, expiration_ms=expiration_ms)
    assert active.as_dict() == _reference_last_records(batches, now_ms, expiration_ms)


def test_the_builder_holds_a_row_per_producer_not_per_batch() -> None:
    """However long the log, what the builder holds is bounded by its producers plus
    `fold_rows` batches."""
    builder = ProducerStateBuilder(fold_rows=100)
    for part in range(50):
        builder.add(ProducerColumns.of([data(n % 3, part * 40 + n) for n in range(40)]))
        assert sum(p.producer_id.size for p in builder._parts) < 100 + 40
    active = builder.result(now_ms=0, expiration_ms=DAY)
    assert active.as_dict() == {
        0: LastRecord(1999, 0),
        1: LastRecord(1997, 0),
        2: LastRecord(1998, 0),
    }


def test_no_producers() -> None:
    """An empty log has no active producers and no batch is any producer's last."""
    active = active_producers(ProducerColumns.of([]), now_ms=0, expiration_ms=DAY)
    assert active.as_dict() == {}
    pid = np.array([1], np.int64)
    assert not active.last_batch_mask(pid, pid, pid, np.array([True])).any()


def test_active_producers_do_not_keep_a_row_per_batch() -> None:
    """The result owns its rows, one per producer: a view would keep the fold's table (a
    row per batch of the log, 24 bytes each: 144 MB for a 1 GiB segment of 1-record
    batches) alive for the whole pass. One producer is the case a view slipped through."""
    for producers in (1, 2):
        batches = [data(n % producers, n) for n in range(1000)]
        out = active_producers(ProducerColumns.of(batches), now_ms=0, expiration_ms=DAY)
        assert out.producer_id.tolist() == list(range(producers))
        for column in (out.producer_id, out.producer_epoch, out.last_data_offset):
            assert column.base is None, "a view of a bigger array"
            assert column.nbytes == 8 * producers


def test_many_producers_are_not_folded_again_at_every_part() -> None:
    """With more producers than `fold_rows`, the builder folds again only once the new
    batches are as many as the producers it holds, not at every part added."""
    builder = ProducerStateBuilder(fold_rows=10)
    folds = 0
    for part in range(40):
        before = len(builder._parts)
        builder.add(ProducerColumns.of([data(part * 50 + n, part * 50 + n) for n in range(50)]))
        folds += len(builder._parts) < before + 1
    assert folds < 8
    active = builder.result(now_ms=0, expiration_ms=DAY)
    assert len(active.producer_id) == 2000
