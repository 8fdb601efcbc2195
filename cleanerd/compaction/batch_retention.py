"""What the cleaner keeps of one batch, and how it writes what it keeps (Kafka's
LogCleaner.checkBatchRetention / shouldRetainRecord and MemoryRecords.filterTo).

Batch level, first match wins:

1. the batch is its producer's last record -> RETAIN_EMPTY (keep at least a 61-byte
   header, so the producer's last sequence survives);
2. the batch ends just before the round's upper bound (its next offset equals the first
   uncleanable offset) -> RETAIN_EMPTY, so the offset slot before the uncleanable part
   (the end of what was cleaned) is never lost, whichever record won (Kafka 3.x rule);
3. its records may be discarded -> DELETE: aborted data; or a marker the transaction
   tracker no longer needs whose delete horizon has passed;
4. otherwise DELETE_EMPTY: keep the retained records, drop the batch if none remain.

Record level (data batches, unless the batch's records are discarded): a record past the
map's latest offset is kept; a keyless record is dropped and counted as invalid; a keyed
record is kept iff its key's winner does not supersede it (offset strategy: no later
offset of the key in the map; other strategies: exactly the winning offset, or a key
absent from the map; the offset map, or the Spark engine's bitmaps, decide) and, if a
tombstone, its batch has no delete horizon yet or the horizon is still in the future.
Control records are always kept unless discarded.

Writing: all records kept and no horizon to stamp or drop -> the batch bytes are copied
as they are. Some kept -> re-encode, stamping `now + delete.retention.ms` as the delete
horizon when a kept record is a tombstone or the batch is a marker the tracker no longer
needs and the batch carries no horizon yet. Unlike Kafka, a horizon that guards nothing
any more (no kept tombstone, not such a marker) is dropped, re-encoding the batch if need
be: a passed horizon left on disk would make the log look due for a delete-horizon pass
forever. None kept -> an empty header if RETAIN_EMPTY, else
nothing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cleanerd._jit import jit

NO_HORIZON = -1
LONG_MAX = 2**63 - 1


class BatchRetention(enum.IntEnum):
    """Kafka's RecordFilter.BatchRetention."""

    DELETE = 0
    DELETE_EMPTY = 1
    RETAIN_EMPTY = 2


class WriteAction(enum.IntEnum):
    """How one source batch appears in the cleaned segment."""

    SKIP = 0
    COPY = 1
    REENCODE = 2
    EMPTY_HEADER = 3


@dataclass(frozen=True, slots=True)
class BatchDecision:
    """The batch-level outcome: retention, whether its records all go regardless of keys,
    and whether it is a marker the transaction tracker no longer needs."""

    retention: BatchRetention
    discard_records: bool
    marker_for_empty_txn: bool


@dataclass(frozen=True, slots=True)
class BatchDecisions:
    """The batch-level outcomes of a segment's batches, as columns."""

    retention: npt.NDArray[np.int8]
    discard_records: npt.NDArray[np.bool_]
    marker_for_empty_txn: npt.NDArray[np.bool_]

    @classmethod
    def plain(cls, next_offsets: npt.NDArray[np.int64], upper_bound_offset: int) -> BatchDecisions:
        """The outcome of batches without producer, transaction or control flag: rule 2
        or DELETE_EMPTY (what `check_batch_retention` gives them)."""
        n = next_offsets.shape[0]
        return decide_batches(
            is_control=np.zeros(n, np.bool_),
            is_last_of_producer=np.zeros(n, np.bool_),
            next_offset=next_offsets,
            upper_bound_offset=upper_bound_offset,
            discardable=np.zeros(n, np.bool_),
            delete_horizon_ms=np.full(n, NO_HORIZON, np.int64),
            now_ms=0,
        )

    def set(self, i: int, d: BatchDecision) -> None:
        """Store the outcome of batch `i`."""
        self.retention[i] = d.retention
        self.discard_records[i] = d.discard_records
        self.marker_for_empty_txn[i] = d.marker_for_empty_txn


def check_batch_retention(
    *,
    is_control: bool,
    is_last_of_producer: bool,
    next_offset: int,
    upper_bound_offset: int,
    discardable: bool,
    delete_horizon_ms: int,
    now_ms: int,
) -> BatchDecision:
    """Rules 1-4 of the module docstring for one batch (`decide_batches` of one row)."""
    d = decide_batches(
        is_control=np.array([is_control]),
        is_last_of_producer=np.array([is_last_of_producer]),
        next_offset=np.array([next_offset], np.int64),
        upper_bound_offset=upper_bound_offset,
        discardable=np.array([discardable]),
        delete_horizon_ms=np.array([delete_horizon_ms], np.int64),
        now_ms=now_ms,
    )
    return BatchDecision(
        BatchRetention(int(d.retention[0])),
        bool(d.discard_records[0]),
        bool(d.marker_for_empty_txn[0]),
    )


def decide_batches(
    *,
    is_control: npt.NDArray[np.bool_],
    is_last_of_producer: npt.NDArray[np.bool_],
    next_offset: npt.NDArray[np.int64],
    upper_bound_offset: int,
    discardable: npt.NDArray[np.bool_],
    delete_horizon_ms: npt.NDArray[np.int64],
    now_ms: int,
) -> BatchDecisions:
    """Rules 1-4 of the module docstring, per batch of a segment: `discardable` is the
    transaction tracker's verdict and `delete_horizon_ms` the batch's horizon or
    NO_HORIZON."""
    passed = (delete_horizon_ms != NO_HORIZON) & (delete_horizon_ms <= now_ms)
    discard = discardable & (~is_control | passed)
    retention = np.where(discard, BatchRetention.DELETE, BatchRetention.DELETE_EMPTY)
    retained = is_last_of_producer | (next_offset == upper_bound_offset)
    retention[retained] = BatchRetention.RETAIN_EMPTY
    return BatchDecisions(retention.astype(np.int8), discard, is_control & discardable)


def plan_batch_writes(
    decisions: BatchDecisions,
    *,
    kept: npt.NDArray[np.int64],
    total: npt.NDArray[np.int64],
    kept_tombstone: npt.NDArray[np.bool_],
    delete_horizon_ms: npt.NDArray[np.int64],
    now_ms: int,
    delete_retention_ms: int,
) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.int64]]:
    """Per v2 batch, of which `kept` of `total` records survive: the WriteAction and the
    delete horizon to encode (the batch's own, or a new one when it needs one)."""
    retention = decisions.retention
    guards = kept_tombstone | decisions.marker_for_empty_txn
    need_horizon = guards & (delete_horizon_ms == NO_HORIZON)
    # Kafka re-encodes with the batch's old horizon even when no tombstone or marker is
    # left for it to guard; that stale passed horizon would keep the log eligible for
    # horizon passes that can remove nothing (cleanable.eligibility), so it is dropped.
    stale = ~guards & (delete_horizon_ms != NO_HORIZON)
    action = np.full(kept.shape, WriteAction.REENCODE, dtype=np.int8)
    action[(kept == total) & ~need_horizon & ~stale] = WriteAction.COPY
    action[kept == 0] = WriteAction.SKIP
    action[(kept == 0) & (retention == BatchRetention.RETAIN_EMPTY)] = WriteAction.EMPTY_HEADER
    action[retention == BatchRetention.DELETE] = WriteAction.SKIP
    # Java's long arithmetic would wrap here; a horizon past the end of time is "never".
    fresh = min(now_ms + delete_retention_ms, LONG_MAX)
    kept_horizon = np.where(stale, NO_HORIZON, delete_horizon_ms)
    horizon = np.where(need_horizon, fresh, kept_horizon).astype(np.int64)
    return action, horizon


@jit
def _keep_records(
    rec_batch: npt.NDArray[np.int64],
    rec_offset: npt.NDArray[np.int64],
    rec_key_len: npt.NDArray[np.int32],
    rec_value_len: npt.NDArray[np.int32],
    rec_survives: npt.NDArray[np.bool_],
    batch_discard: npt.NDArray[np.bool_],
    batch_is_control: npt.NDArray[np.bool_],
    batch_retain_deletes: npt.NDArray[np.bool_],
    latest_offset: int,
    keep: npt.NDArray[np.bool_],
) -> int:
    invalid = 0
    for i in range(rec_offset.shape[0]):
        b = rec_batch[i]
        if batch_discard[b]:
            keep[i] = False
        elif batch_is_control[b] or rec_offset[i] > latest_offset:
            keep[i] = True
        elif rec_key_len[i] < 0:
            keep[i] = False
            invalid += 1
        else:
            keep[i] = rec_survives[i] and (rec_value_len[i] >= 0 or batch_retain_deletes[b])
    return invalid


def keep_records(
    *,
    rec_batch: npt.NDArray[np.int64],
    rec_offset: npt.NDArray[np.int64],
    rec_key_len: npt.NDArray[np.int32],
    rec_value_len: npt.NDArray[np.int32],
    rec_survives: npt.NDArray[np.bool_],
    batch_discard: npt.NDArray[np.bool_],
    batch_is_control: npt.NDArray[np.bool_],
    batch_retain_deletes: npt.NDArray[np.bool_],
    latest_offset: int,
) -> tuple[npt.NDArray[np.bool_], int]:
    """The record-level rule over one segment's records: (keep mask, invalid count).

    `rec_batch` maps each record to its batch's row in the per-batch arrays; key and
    value lengths are -1 for null; `rec_survives` is, for a keyed record, whether its key
    has no winner that supersedes it (the offset map's `keep_mask`: the strategy's rule),
    and is not read for the others; `batch_retain_deletes` is whether the batch's
    tombstones are still within their horizon; `latest_offset` is the last offset the
    map covers.
    """
    keep = np.empty(rec_offset.shape[0], dtype=np.bool_)
    invalid = _keep_records(
        rec_batch,
        rec_offset,
        rec_key_len,
        rec_value_len,
        rec_survives,
        batch_discard,
        batch_is_control,
        batch_retain_deletes,
        latest_offset,
        keep,
    )
    return keep, int(invalid)
