"""Each active producer's last batch, rebuilt from batch headers (Kafka's
`lastRecordsOfActiveProducers`).

A broker keeps producer state in memory (and in `.snapshot` files); cleanerd rebuilds the
part the cleaner needs from the log itself, walking the batch headers of every segment
in offset order, including the active one:

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
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cleanerd.compaction.transactions import ABORT, COMMIT


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


@dataclass(slots=True)
class _Entry:
    epoch: int
    last_data_offset: int | None
    last_timestamp: int
    txn_open: bool


def _apply(entries: dict[int, _Entry], b: ProducerBatch) -> None:
    entry = entries.get(b.producer_id)
    if b.is_control:
        if b.control_type is not None and b.control_type not in (ABORT, COMMIT):
            return
        if entry is None:
            entries[b.producer_id] = _Entry(b.producer_epoch, None, b.max_timestamp, False)
            return
        if entry.epoch != b.producer_epoch:
            entry.last_data_offset = None
        entry.epoch = b.producer_epoch
        entry.last_timestamp = b.max_timestamp
        entry.txn_open = False
        return
    if entry is None:
        entries[b.producer_id] = _Entry(
            b.producer_epoch, b.last_offset, b.max_timestamp, b.is_transactional
        )
        return
    entry.epoch = b.producer_epoch
    entry.last_data_offset = b.last_offset
    entry.last_timestamp = b.max_timestamp
    entry.txn_open = entry.txn_open or b.is_transactional


def last_records_of_active_producers(
    batches: Iterable[ProducerBatch], *, now_ms: int, expiration_ms: int
) -> dict[int, LastRecord]:
    """Producer id -> its last record, for every producer that has not expired at `now_ms`.

    `batches` are the log's batches in offset order; batches without a producer id must
    not be passed.
    """
    entries: dict[int, _Entry] = {}
    for b in batches:
        _apply(entries, b)
    return {
        pid: LastRecord(e.last_data_offset, e.epoch)
        for pid, e in entries.items()
        if e.txn_open or now_ms - e.last_timestamp < expiration_ms
    }


def is_last_batch_of_producer(
    last_records: dict[int, LastRecord],
    *,
    producer_id: int,
    producer_epoch: int,
    last_offset: int,
    is_control: bool,
) -> bool:
    """Whether a batch is its producer's last record (Kafka's isBatchLastRecordOfProducer)."""
    last = last_records.get(producer_id)
    if last is None:
        return False
    if last.last_data_offset is not None:
        return last_offset == last.last_data_offset
    return is_control and producer_epoch == last.producer_epoch
