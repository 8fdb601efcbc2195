"""Tests of the round's transaction tracker (ref 4.10, 4.11)."""

from __future__ import annotations

from cleanerd.compaction.transactions import (
    ABORT,
    COMMIT,
    TransactionTracker,
)
from cleanerd.log.txnindex import AbortedTxn


def test_aborted_data_is_discardable_and_marker_kept_with_index_entry() -> None:
    """Aborted data is discardable; its ABORT marker is kept and re-indexed."""
    txn = AbortedTxn(first_offset=0, producer_id=1, last_offset=2, last_stable_offset=3)
    t = TransactionTracker()
    t.add_aborted([txn])
    assert t.on_data_batch(1, True, 1) is True
    assert t.on_control_batch(1, ABORT, 2) is False
    assert t.drain_cleaned_index() == [txn]
    assert t.drain_cleaned_index() == []


def test_abort_marker_without_observed_data_is_discardable() -> None:
    """An ABORT marker whose data is gone is discardable and drops out of the index."""
    t = TransactionTracker()
    t.add_aborted([AbortedTxn(0, 1, 2, 3)])
    assert t.on_control_batch(1, ABORT, 2) is True
    assert t.drain_cleaned_index() == []


def test_commit_marker_kept_only_while_its_data_was_seen() -> None:
    """A COMMIT marker is needed iff a data batch of its transaction was observed."""
    t = TransactionTracker()
    assert t.on_data_batch(5, True, 0) is False
    assert t.on_control_batch(5, COMMIT, 1) is False
    assert t.on_control_batch(5, COMMIT, 2) is True


def test_other_producers_and_non_transactional_batches_are_not_aborted() -> None:
    """Only transactional batches of the aborting producer are aborted data."""
    t = TransactionTracker()
    t.add_aborted([AbortedTxn(0, 1, 5, 6)])
    assert t.on_data_batch(1, False, 0) is False
    assert t.on_data_batch(2, True, 1) is False
    assert t.on_data_batch(1, True, 2) is True


def test_entry_becomes_ongoing_only_from_its_first_offset() -> None:
    """A batch below an aborted txn's first offset is not aborted."""
    t = TransactionTracker()
    t.add_aborted([AbortedTxn(5, 1, 7, 8)])
    assert t.on_data_batch(1, True, 3) is False
    assert t.on_control_batch(1, COMMIT, 4) is False
    assert t.on_data_batch(1, True, 5) is True


def test_duplicate_entry_from_the_next_segment_does_not_reopen() -> None:
    """An entry queued again for a later segment does not abort the next transaction."""
    txn = AbortedTxn(0, 1, 2, 3)
    t = TransactionTracker()
    t.add_aborted([txn])
    t.on_data_batch(1, True, 0)
    t.on_control_batch(1, ABORT, 2)
    t.add_aborted([txn])
    assert t.on_data_batch(1, True, 4) is False


def test_empty_control_batch_is_discardable_and_unknown_types_kept() -> None:
    """An emptied control batch is discardable; other control types are kept."""
    t = TransactionTracker()
    assert t.on_control_batch(1, None, 0) is True
    assert t.on_control_batch(1, 2, 1) is False
