"""Tests of producer-state rebuilding from batch headers (ref 4.9 step 2)."""

from __future__ import annotations

from cleanerd.compaction.producers import (
    LastRecord,
    ProducerBatch,
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
