"""Each active producer's last batch, rebuilt from batch headers (Kafka's
`lastRecordsOfActiveProducers`).

A broker keeps producer state in memory (and in `.snapshot` files); cleanerd rebuilds the
part the cleaner needs as a restarting broker does: from the partition's latest producer
snapshot (`of_snapshot`), then the batch headers after it in offset order, the active
segment's included (from every batch when no snapshot is usable):

- a data batch with a producer id sets that producer's epoch, its last data offset (the
  batch's last offset) and its last timestamp (the batch's maxTimestamp); a transactional
  one opens a transaction if none is open;
- an ABORT or COMMIT marker sets the epoch and the last timestamp and closes the open
  transaction; a new epoch forgets the last data offset (Kafka clears the producer's batch
  metadata on an epoch bump);
- an empty control batch is a marker the cleaner emptied (kept as the producer's last
  record); it counts as the marker it was, since a live broker's producer state still
  holds what that marker set, and losing it would let the next pass drop the header.

A producer expires when it has no open transaction and `now - lastTimestamp >=
producer.id.expiration.ms`. The cleaner keeps, for every producer that has not expired,
the batch holding its last data offset (or, for a producer whose current epoch has only
markers, its control batches of that epoch) as at least an empty header, so that
duplicate detection of a retried batch still works after cleaning.

The rules run in one compiled kernel over the header columns of all the log's batches
with a producer id (`active_producers`): the batches are ordered by producer (stably, so
each producer's stay in offset order) and each producer's run is folded into its final
state. The result is columnar (`ActiveProducers`, sorted by producer id) so that the pass
asks "is this batch its producer's last?" of a whole segment at once; since idempotent
producers (every Kafka client's default) put a producer id on every batch, one Python
step per batch here would cost more than the rest of a pass over small batches.

A pass adds the log segment by segment to a `ProducerStateBuilder`, which folds what it
holds into one row per producer whenever it reaches `FOLD_ROWS` batches: the state of a
producer is always what one batch would leave (see `_as_batches`), so folding in parts
gives what one fold over the whole log gives, and a log of any length is walked in the
memory of its producers plus `FOLD_ROWS` batches.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Final

import numpy as np
from numpy.typing import NDArray

from cleanerd._jit import jit
from cleanerd.compaction.transactions import ABORT, COMMIT
from cleanerd.log.producer_state import ProducerState
from cleanerd.records.control import NO_CONTROL_RECORD
from cleanerd.records.varint import INT64_MAX

NO_OFFSET: Final = -1
"""`ActiveProducers.last_data_offset` of a producer with no data in its current epoch."""


@dataclass(frozen=True, slots=True)
class ProducerBatch:
    """What producer-state rebuilding reads from one batch header (plus a marker's type)."""

    producer_id: int
    producer_epoch: int
    last_offset: int
    max_timestamp: int
    is_transactional: bool
    is_control: bool
    control_type: int | None = None
    """ABORT/COMMIT/... of a control batch's record; None for data or an emptied marker."""


@dataclass(frozen=True, slots=True)
class LastRecord:
    """A producer's last data offset in its current epoch (None if none) and the epoch."""

    last_data_offset: int | None
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class ProducerColumns:
    """Header columns of batches with a producer id, in offset order: producer id and
    epoch, last offset, max timestamp, whether transactional / control, and a control
    batch's type (`NO_CONTROL_RECORD` for an emptied one; not read for data)."""

    producer_id: NDArray[np.int64]
    producer_epoch: NDArray[np.int64]
    last_offset: NDArray[np.int64]
    max_timestamp: NDArray[np.int64]
    is_transactional: NDArray[np.bool_]
    is_control: NDArray[np.bool_]
    control_type: NDArray[np.int64]

    @classmethod
    def of(cls, batches: Iterable[ProducerBatch]) -> ProducerColumns:
        rows = [
            (
                b.producer_id,
                b.producer_epoch,
                b.last_offset,
                b.max_timestamp,
                b.is_transactional,
                b.is_control,
                NO_CONTROL_RECORD if b.control_type is None else b.control_type,
            )
            for b in batches
        ]
        table = np.array(rows, dtype=np.int64).reshape(-1, 7)
        column = [np.ascontiguousarray(table[:, k]) for k in range(7)]
        return cls(
            column[0],
            column[1],
            column[2],
            column[3],
            table[:, 4] != 0,
            table[:, 5] != 0,
            column[6],
        )

    @classmethod
    def concat(cls, parts: list[ProducerColumns]) -> ProducerColumns:
        if not parts:
            return cls.of(())
        return cls(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)))

    @classmethod
    def of_snapshot(cls, state: ProducerState) -> ProducerColumns:
        """One batch per producer of a producer snapshot that leaves it in the snapshot's
        state (see `_as_batches`): folding the log's batches from the snapshot's offset
        on after these gives the state at the log end."""
        entries = [state.entries[pid] for pid in sorted(state.entries)]
        rows = np.array(
            [
                (
                    e.producer_id,
                    e.epoch,
                    e.last_offset if e.last_offset >= 0 else NO_OFFSET,
                    e.timestamp,
                    e.txn_first_offset >= 0,
                )
                for e in entries
            ],
            np.int64,
        ).reshape(-1, _STATE_COLUMNS)
        return _as_batches(rows)

    def from_offset(self, offset: int) -> ProducerColumns:
        """The batches at or above `offset` (a batch boundary)."""
        keep = self.last_offset >= offset
        return ProducerColumns(*(getattr(self, f.name)[keep] for f in fields(self)))


@dataclass(frozen=True, slots=True)
class ActiveProducers:
    """The producers that have not expired, sorted by id: each one's current epoch and
    its last data offset in that epoch (`NO_OFFSET` if none)."""

    producer_id: NDArray[np.int64]
    producer_epoch: NDArray[np.int64]
    last_data_offset: NDArray[np.int64]

    def as_dict(self) -> dict[int, LastRecord]:
        return {
            pid: LastRecord(None if last == NO_OFFSET else last, epoch)
            for pid, epoch, last in zip(
                self.producer_id.tolist(),
                self.producer_epoch.tolist(),
                self.last_data_offset.tolist(),
                strict=True,
            )
        }

    @classmethod
    def of(cls, last_records: dict[int, LastRecord]) -> ActiveProducers:
        pids = sorted(last_records)
        return cls(
            np.array(pids, np.int64),
            np.array([last_records[p].producer_epoch for p in pids], np.int64),
            np.array([_or_none(last_records[p].last_data_offset) for p in pids], np.int64),
        )

    def last_batch_mask(
        self,
        producer_id: NDArray[np.int64],
        producer_epoch: NDArray[np.int64],
        last_offset: NDArray[np.int64],
        is_control: NDArray[np.bool_],
    ) -> NDArray[np.bool_]:
        """Per batch: whether it is its producer's last record (Kafka's
        isBatchLastRecordOfProducer): the producer's last data offset where it has one,
        else any control batch of its current epoch. A batch without producer id, or of
        an expired producer, is not."""
        n = self.producer_id.shape[0]
        at = np.minimum(np.searchsorted(self.producer_id, producer_id), max(n - 1, 0))
        if not n:
            return np.zeros(producer_id.shape[0], np.bool_)
        found = self.producer_id[at] == producer_id
        last = self.last_data_offset[at]
        by_data = (last != NO_OFFSET) & (last_offset == last)
        by_marker = (last == NO_OFFSET) & is_control & (producer_epoch == self.producer_epoch[at])
        mask: NDArray[np.bool_] = found & (by_data | by_marker)
        return mask


def _or_none(offset: int | None) -> int:
    return NO_OFFSET if offset is None else offset


_STATE_COLUMNS: Final = 5  # producer id, epoch, last data offset, last timestamp, txn open


@jit
def _fold_producers(
    order: NDArray[np.int64],
    producer_id: NDArray[np.int64],
    producer_epoch: NDArray[np.int64],
    last_offset: NDArray[np.int64],
    max_timestamp: NDArray[np.int64],
    is_transactional: NDArray[np.bool_],
    is_control: NDArray[np.bool_],
    control_type: NDArray[np.int64],
    out: NDArray[np.int64],
) -> int:
    """Fold each producer's batches (`order`: by producer, offset order within) into its
    final state; `out[k]` = (producer id, epoch, last data offset, last timestamp,
    transaction open) of the k-th producer seen (one whose batches were all markers of
    another kind leaves no state). Returns how many."""
    k = 0
    i = 0
    n = order.shape[0]
    while i < n:
        pid = producer_id[order[i]]
        exists = False
        epoch = np.int64(0)
        last_data = np.int64(NO_OFFSET)
        last_ts = np.int64(0)
        txn_open = False
        while i < n and producer_id[order[i]] == pid:
            b = order[i]
            i += 1
            if is_control[b]:
                t = control_type[b]
                if t != NO_CONTROL_RECORD and t != ABORT and t != COMMIT:
                    continue
                if exists and epoch != producer_epoch[b]:
                    last_data = np.int64(NO_OFFSET)
                exists = True
                epoch = producer_epoch[b]
                last_ts = max_timestamp[b]
                txn_open = False
            else:
                epoch = producer_epoch[b]
                last_data = last_offset[b]
                last_ts = max_timestamp[b]
                txn_open = txn_open or is_transactional[b]
                exists = True
        if exists:
            out[k, 0] = pid
            out[k, 1] = epoch
            out[k, 2] = last_data
            out[k, 3] = last_ts
            out[k, 4] = txn_open
            k += 1
    return k


def _fold(batches: ProducerColumns) -> NDArray[np.int64]:
    """Each producer's state after `batches` (rows of `_fold_producers`, by producer id)."""
    order = np.argsort(batches.producer_id, kind="stable").astype(np.int64)
    out = np.empty((order.shape[0], _STATE_COLUMNS), np.int64)
    k = int(
        _fold_producers(
            order,
            batches.producer_id,
            batches.producer_epoch,
            batches.last_offset,
            batches.max_timestamp,
            batches.is_transactional,
            batches.is_control,
            batches.control_type,
            out,
        )
    )
    # A copy: a view would keep `out`, a row per batch folded, alive.
    return out[:k].copy()


def _as_batches(state: NDArray[np.int64]) -> ProducerColumns:
    """One batch per producer that leaves it in `state`: a data batch at its last data
    offset (transactional when its transaction is open; a marker after it in the same
    epoch changed only what the row holds anyway), or, for a producer whose epoch has no
    data, a COMMIT marker of that epoch. Folding later batches after these gives what
    folding them after the batches `state` came from gives."""
    no_data = (state[:, 2] == NO_OFFSET) & (state[:, 4] == 0)
    return ProducerColumns(
        producer_id=np.ascontiguousarray(state[:, 0]),
        producer_epoch=np.ascontiguousarray(state[:, 1]),
        last_offset=np.ascontiguousarray(state[:, 2]),
        max_timestamp=np.ascontiguousarray(state[:, 3]),
        is_transactional=state[:, 4] != 0,
        is_control=no_data,
        control_type=np.where(no_data, COMMIT, NO_CONTROL_RECORD).astype(np.int64),
    )


FOLD_ROWS: Final = 1 << 20
"""Batches `ProducerStateBuilder` holds before it folds them into one row per producer."""


class ProducerStateBuilder:
    """`active_producers` over a log added in parts (offset order), in bounded memory:
    whenever the parts hold `fold_rows` batches they are folded into one batch per
    producer (`_as_batches`), so a log of any length costs its producers plus
    `fold_rows` rows, not a row per batch."""

    def __init__(self, *, fold_rows: int | None = None) -> None:
        self._fold_rows = FOLD_ROWS if fold_rows is None else fold_rows
        self._parts: list[ProducerColumns] = []
        self._rows = 0
        self._next_fold = self._fold_rows

    def add(self, batches: ProducerColumns) -> None:
        """The next batches of the log (with a producer id, in offset order)."""
        self._parts.append(batches)
        self._rows += batches.producer_id.shape[0]
        if self._rows >= self._next_fold and len(self._parts) > 1:
            self._parts = [_as_batches(_fold(ProducerColumns.concat(self._parts)))]
            self._rows = self._parts[0].producer_id.shape[0]
            # A log of many producers (a new id per client restart) folds again only
            # once as many batches came as it has producers: not at every part.
            self._next_fold = max(self._fold_rows, 2 * self._rows)

    def result(self, *, now_ms: int, expiration_ms: int) -> ActiveProducers:
        return active_producers(
            ProducerColumns.concat(self._parts), now_ms=now_ms, expiration_ms=expiration_ms
        )


def active_producers(
    batches: ProducerColumns, *, now_ms: int, expiration_ms: int
) -> ActiveProducers:
    """Every producer that has not expired at `now_ms`, with its last record (see the
    module docstring). `batches` are the log's batches with a producer id."""
    state = _fold(batches)
    last_ts, txn_open = state[:, 3], state[:, 4] != 0
    # now - last < expiration, where now - last may not fit in an int64 (a corrupt
    # timestamp far in the past: then it is long expired); now_ms is a clock, >= 0.
    oldest = now_ms - INT64_MAX
    recent = (last_ts >= oldest) & (now_ms - np.maximum(last_ts, oldest) < expiration_ms)
    live = state[txn_open | recent]
    return ActiveProducers(*(live[:, j].copy() for j in range(3)))


def last_records_of_active_producers(
    batches: Iterable[ProducerBatch], *, now_ms: int, expiration_ms: int
) -> dict[int, LastRecord]:
    """Producer id -> its last record, for every producer that has not expired at `now_ms`.

    `batches` are the log's batches in offset order; batches without a producer id must
    not be passed.
    """
    columns = ProducerColumns.of(batches)
    return active_producers(columns, now_ms=now_ms, expiration_ms=expiration_ms).as_dict()


def is_last_batch_of_producer(
    last_records: dict[int, LastRecord],
    *,
    producer_id: int,
    producer_epoch: int,
    last_offset: int,
    is_control: bool,
) -> bool:
    """Whether a batch is its producer's last record (Kafka's isBatchLastRecordOfProducer)."""
    mask = ActiveProducers.of(last_records).last_batch_mask(
        np.array([producer_id], np.int64),
        np.array([producer_epoch], np.int64),
        np.array([last_offset], np.int64),
        np.array([is_control], np.bool_),
    )
    return bool(mask[0])
