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
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Final

from cleanerd.log.txnindex import AbortedTxn

ABORT: Final = 0
COMMIT: Final = 1


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

    def _consume_up_to(self, offset: int) -> None:
        while self._pending and self._pending[0].first_offset <= offset:
            txn = heapq.heappop(self._pending)
            self._ongoing_aborted.setdefault(txn.producer_id, _OngoingAborted(txn))

    def on_data_batch(self, producer_id: int, is_transactional: bool, last_offset: int) -> bool:
        """Record a data batch; True iff it is aborted data (its records may all go)."""
        self._consume_up_to(last_offset)
        if not is_transactional:
            return False
        ongoing = self._ongoing_aborted.get(producer_id)
        if ongoing is not None:
            ongoing.last_observed_batch_offset = last_offset
            return True
        self._ongoing_committed.add(producer_id)
        return False

    def on_control_batch(
        self, producer_id: int, control_type: int | None, last_offset: int
    ) -> bool:
        """Record a control batch (`control_type` None when it holds no record); True iff
        the marker is no longer needed by any remaining batch."""
        self._consume_up_to(last_offset)
        if control_type is None:
            return True
        if control_type == ABORT:
            ongoing = self._ongoing_aborted.pop(producer_id, None)
            if ongoing is not None and ongoing.last_observed_batch_offset is not None:
                self._cleaned_index.append(ongoing.txn)
                return False
            return True
        if control_type == COMMIT:
            if producer_id in self._ongoing_committed:
                self._ongoing_committed.discard(producer_id)
                return False
            return True
        return False

    def drain_cleaned_index(self) -> list[AbortedTxn]:
        """The `.txnindex` entries for the segment just written; resets the list."""
        out, self._cleaned_index = self._cleaned_index, []
        return out
