"""The transaction tracker of one cleaning round (Kafka's CleanedTransactionMetadata).

A partition's aborted transactions are known from its `.txnindex` files: one 34-byte entry
per aborted transaction (producer id, first data offset, offset of the ABORT marker, LSO at
abort time). The cleaner walks the batches of the log in offset order and asks, per batch,
whether it may be discarded:

- Before each batch, every aborted-transaction entry whose first offset is at or below the
  batch's last offset becomes "ongoing aborted" for its producer.
- A transactional data batch of a producer with an ongoing aborted transaction is aborted
  data (discardable); the entry remembers that a batch of it was observed. Any other
  transactional data batch opens (or continues) an ongoing committed transaction.
- An empty control batch was cleaned before: discardable. An ABORT marker ends the
  producer's aborted transaction; it is kept (and its entry goes to the cleaned segment's
  `.txnindex`) iff a data batch of the transaction was observed in this round, since a
  reader needs the marker for as long as any batch of the transaction is still in the log.
  A COMMIT marker is kept iff a data batch of its transaction was observed. Other control
  types are always kept.

"Discardable" for a marker only makes it a candidate: the cleaner stamps a delete horizon
first and removes the marker on a later round at or after the horizon.

One tracker is carried across every group of a round; `drain_cleaned_index` hands out the
entries collected for the segment being written.

`on_batches` asks about a run of batches in one call: a compiled kernel walks them with
the state laid out as arrays over the producers involved (the pending entries in order,
each producer's ongoing aborted entry and last observed offset, its committed flag), and
the state goes back to its Python form after the run, so a call costs Python per producer
and per entry, never per batch. Transactional data in small batches (exactly-once
streams) would otherwise spend most of a pass here. `on_data_batch` and
`on_control_batch` are runs of one batch.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Final

import numpy as np
from numpy.typing import NDArray

from cleanerd._jit import jit
from cleanerd.log.txnindex import AbortedTxn
from cleanerd.records.control import NO_CONTROL_RECORD

ABORT: Final = 0
COMMIT: Final = 1
_NONE: Final = -1


@dataclass(slots=True)
class _OngoingAborted:
    txn: AbortedTxn
    last_observed_batch_offset: int | None = None


@dataclass(slots=True)
class TransactionTracker:
    """Per-round transaction state; see the module docstring for the rules."""

    _pending: list[AbortedTxn] = field(default_factory=list)
    _seen: set[tuple[int, int]] = field(default_factory=set)
    _ongoing_aborted: dict[int, _OngoingAborted] = field(default_factory=dict)
    _ongoing_committed: set[int] = field(default_factory=set)
    _cleaned_index: list[AbortedTxn] = field(default_factory=list)

    def add_aborted(self, entries: list[AbortedTxn]) -> None:
        """Queue aborted transactions found for the next source segment.

        Consecutive segments overlap one transaction that spans them; each entry is queued
        once so a finished transaction cannot be reopened by its duplicate.
        """
        for txn in entries:
            ident = (txn.producer_id, txn.first_offset)
            if ident not in self._seen:
                self._seen.add(ident)
                heapq.heappush(self._pending, txn)

    def on_data_batch(self, producer_id: int, is_transactional: bool, last_offset: int) -> bool:
        """Record a data batch; True iff it is aborted data (its records may all go)."""
        return self._one(producer_id, False, is_transactional, 0, last_offset)

    def on_control_batch(
        self, producer_id: int, control_type: int | None, last_offset: int
    ) -> bool:
        """Record a control batch (`control_type` None when it holds no record); True iff
        the marker is no longer needed by any remaining batch."""
        kind = NO_CONTROL_RECORD if control_type is None else control_type
        return self._one(producer_id, True, True, kind, last_offset)

    def _one(self, pid: int, control: bool, txn: bool, kind: int, last: int) -> bool:
        out = self.on_batches(
            producer_id=np.array([pid], np.int64),
            is_control=np.array([control], np.bool_),
            is_transactional=np.array([txn], np.bool_),
            control_type=np.array([kind], np.int64),
            last_offset=np.array([last], np.int64),
        )
        return bool(out[0])

    def on_batches(
        self,
        *,
        producer_id: NDArray[np.int64],
        is_control: NDArray[np.bool_],
        is_transactional: NDArray[np.bool_],
        control_type: NDArray[np.int64],
        last_offset: NDArray[np.int64],
    ) -> NDArray[np.bool_]:
        """Record batches in offset order (a control batch's `control_type` as
        `control.control_type_column` gives it); per batch: whether it may be discarded
        (`on_data_batch`, `on_control_batch`)."""
        pending = sorted(self._pending)
        ongoing = sorted(self._ongoing_aborted.items())
        table = [o.txn for _, o in ongoing] + pending
        txn_pid = np.array([t.producer_id for t in table], np.int64)
        producers = np.unique(
            np.concatenate([producer_id, txn_pid, np.fromiter(self._ongoing_committed, np.int64)])
        )
        entry = np.full(producers.size, _NONE, np.int64)
        observed = np.zeros(producers.size, np.int64)
        seen = np.zeros(producers.size, np.bool_)
        for row, (pid, o) in enumerate(ongoing):
            u = int(np.searchsorted(producers, pid))
            entry[u] = row
            if o.last_observed_batch_offset is not None:
                observed[u], seen[u] = o.last_observed_batch_offset, True
        committed = np.isin(producers, np.fromiter(self._ongoing_committed, np.int64))
        first = np.array([t.first_offset for t in pending], np.int64)
        cleaned = np.empty(len(table), np.int64)
        out = np.empty(producer_id.size, np.bool_)
        consumed, n_cleaned = (
            int(x)
            for x in _track(
                np.searchsorted(producers, producer_id),
                is_control,
                is_transactional,
                control_type,
                last_offset,
                first,
                np.searchsorted(producers, txn_pid[len(ongoing) :]),
                len(ongoing),
                entry,
                observed,
                seen,
                committed,
                cleaned,
                out,
            )
        )
        self._pending = pending[consumed:]  # sorted, so a heap
        self._ongoing_aborted = {
            int(producers[u]): _OngoingAborted(
                table[int(entry[u])], int(observed[u]) if seen[u] else None
            )
            for u in np.flatnonzero(entry != _NONE).tolist()
        }
        self._ongoing_committed = set(producers[committed].tolist())
        self._cleaned_index += [table[i] for i in cleaned[:n_cleaned].tolist()]
        return out

    def drain_cleaned_index(self) -> list[AbortedTxn]:
        """The `.txnindex` entries for the segment just written; resets the list."""
        out, self._cleaned_index = self._cleaned_index, []
        return out


@jit
def _track(
    producer: NDArray[np.int64],
    is_control: NDArray[np.bool_],
    is_transactional: NDArray[np.bool_],
    control_type: NDArray[np.int64],
    last_offset: NDArray[np.int64],
    pending_first: NDArray[np.int64],
    pending_producer: NDArray[np.int64],
    pending_row: int,
    entry: NDArray[np.int64],
    observed: NDArray[np.int64],
    seen: NDArray[np.bool_],
    committed: NDArray[np.bool_],
    cleaned: NDArray[np.int64],
    out: NDArray[np.bool_],
) -> tuple[int, int]:
    """The tracker's rules over a run of batches. Producers are dense indices; `entry[u]`
    is the table row of producer u's ongoing aborted transaction (-1: none), `observed[u]`
    the last offset of a batch of it seen (if `seen[u]`), `committed[u]` whether u has an
    ongoing committed transaction. The pending entries, in order, are table rows
    `pending_row + k`. Returns (pending entries consumed, rows put in `cleaned`)."""
    k = 0
    n_cleaned = 0
    for i in range(producer.shape[0]):
        while k < pending_first.shape[0] and pending_first[k] <= last_offset[i]:
            v = pending_producer[k]
            if entry[v] == _NONE:
                entry[v] = pending_row + k
                seen[v] = False
            k += 1
        u = producer[i]
        discard = False
        if not is_control[i]:
            if is_transactional[i]:
                if entry[u] != _NONE:
                    observed[u] = last_offset[i]
                    seen[u] = True
                    discard = True
                else:
                    committed[u] = True
        elif control_type[i] == NO_CONTROL_RECORD:
            discard = True
        elif control_type[i] == ABORT:
            discard = entry[u] == _NONE or not seen[u]
            if not discard:
                cleaned[n_cleaned] = entry[u]
                n_cleaned += 1
            entry[u] = _NONE
        elif control_type[i] == COMMIT:
            discard = not committed[u]
            committed[u] = False
        out[i] = discard
    return k, n_cleaned
