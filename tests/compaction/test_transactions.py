"""Tests of the round's transaction tracker (ref 4.10, 4.11)."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.compaction.transactions import (
    ABORT,
    COMMIT,
    TransactionTracker,
)
from cleanerd.log.txnindex import AbortedTxn
from cleanerd.records.control import NO_CONTROL_RECORD


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


class _ReferenceTracker:
    """The module docstring's rules, one batch at a time, in plain Python."""

    def __init__(self) -> None:
        self.pending: list[AbortedTxn] = []
        self.seen: set[tuple[int, int]] = set()
        self.aborted: dict[int, tuple[AbortedTxn, int | None]] = {}
        self.committed: set[int] = set()
        self.cleaned: list[AbortedTxn] = []

    def add_aborted(self, entries: list[AbortedTxn]) -> None:
        for txn in entries:
            if (txn.producer_id, txn.first_offset) not in self.seen:
                self.seen.add((txn.producer_id, txn.first_offset))
                self.pending.append(txn)
        self.pending.sort()

    def batch(self, pid: int, control: bool, txn: bool, kind: int | None, last: int) -> bool:
        while self.pending and self.pending[0].first_offset <= last:
            t = self.pending.pop(0)
            self.aborted.setdefault(t.producer_id, (t, None))
        if not control:
            if not txn:
                return False
            if pid in self.aborted:
                self.aborted[pid] = (self.aborted[pid][0], last)
                return True
            self.committed.add(pid)
            return False
        if kind is None:
            return True
        if kind == ABORT:
            entry = self.aborted.pop(pid, None)
            if entry is not None and entry[1] is not None:
                self.cleaned.append(entry[0])
                return False
            return True
        if kind == COMMIT:
            if pid in self.committed:
                self.committed.discard(pid)
                return False
            return True
        return False


# A step: ("txns", entries) or ("run", batches), a batch being (pid, control, txn,
# control type or None, offset gap)
_TXN = st.builds(
    lambda pid, first, length: AbortedTxn(first, pid, first + length, first + length + 1),
    st.integers(0, 3),
    st.integers(0, 40),
    st.integers(0, 5),
)
_BATCH = st.tuples(
    st.integers(0, 3),
    st.booleans(),
    st.booleans(),
    st.sampled_from([None, ABORT, COMMIT, 2, 9]),
    st.integers(0, 3),
)
_STEP = st.one_of(
    st.tuples(st.just("txns"), st.lists(_TXN, max_size=4)),
    st.tuples(st.just("run"), st.lists(_BATCH, max_size=10)),
)


@given(st.lists(_STEP, max_size=10))
@settings(max_examples=300, deadline=None)
def test_runs_of_batches_match_the_rules_batch_by_batch(
    steps: list[tuple[str, list[Any]]],
) -> None:
    """Runs of batches given to the kernel get the verdicts, and leave the `.txnindex`
    entries, that the rules give one batch at a time; the state carries across runs."""
    t, ref = TransactionTracker(), _ReferenceTracker()
    offset = 0
    for kind, items in steps:
        if kind == "txns":
            t.add_aborted(items)
            ref.add_aborted(items)
            continue
        rows = []
        for pid, control, txn, ctype, gap in items:
            offset += gap
            rows.append((pid, control, txn, ctype if control else None, offset))
        got = t.on_batches(
            producer_id=np.array([r[0] for r in rows], np.int64),
            is_control=np.array([r[1] for r in rows], np.bool_),
            is_transactional=np.array([r[2] for r in rows], np.bool_),
            control_type=np.array(
                [NO_CONTROL_RECORD if r[3] is None else r[3] for r in rows], np.int64
            ),
            last_offset=np.array([r[4] for r in rows], np.int64),
        )
        assert got.tolist() == [ref.batch(*r) for r in rows]
        assert t.drain_cleaned_index() == ref.cleaned
        ref.cleaned = []
