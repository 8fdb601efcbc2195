"""A partition's producer state and its snapshot file (Kafka's ProducerStateManager and
ProducerSnapshot), so that opening a log reads a snapshot instead of every batch.

For every producer id seen in the log: the epoch, sequence, offset and timestamp of its
last batch, the coordinator epoch of its last transaction marker, and the first offset
of its open transaction (-1 when none). State at offset X covers every batch below X.

Snapshot file `<partition dir>/<X as 20 digits>.snapshot`, big-endian, the format Kafka
reads (version 1)::

    version:int16 (1) | crc:uint32 (CRC-32C of everything after it) | count:int32
    count x [producerId:int64 | epoch:int16 | lastSequence:int32 | lastOffset:int64 |
             offsetDelta:int32 | timestamp:int64 | coordinatorEpoch:int32 |
             currentTxnFirstOffset:int64]

Update rules, per batch with a producer id, in log order (Kafka's ProducerAppendInfo):
a data batch sets epoch, lastSequence (baseSequence + lastOffsetDelta, wrapping at
int32), lastOffset, offsetDelta (lastOffsetDelta) and timestamp (maxTimestamp), and a
transactional one opens a transaction if none is open; an ABORT or COMMIT marker sets
epoch, timestamp and coordinatorEpoch and closes the open transaction. A batch of another
epoch than the entry's first clears lastSequence, lastOffset and offsetDelta (to -1, -1
and 0: Kafka drops a producer's batch metadata on an epoch change), so a marker that bumps
the epoch leaves no last batch. A control batch without a record (a marker a cleaner
emptied) changes nothing. `apply` runs these rules over a walked batch table with Python
per producer, not per batch.

Crash safety: a snapshot is written to a temporary name, fsynced and renamed (then the
dir fsynced), so a reader sees a whole snapshot or none; a damaged one is reported and
ignored, and the state is rebuilt from the log, as Kafka does. Snapshots are written by
the dir's writer only (never in observe mode): at a roll, after a clean and at a clean
shutdown, each at the log end offset; older ones below the log start offset, and all but
the newest `KEEP`, are deleted.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

from cleanerd.errors import CorruptIndexError
from cleanerd.log.files import (
    PRODUCER_SNAPSHOT_FILE_SUFFIX,
    SNAPSHOT_NAMES,
    listing_text,
    offset_from_filename,
    segment_file,
)
from cleanerd.log.fsutil import atomic_write, safe_unlink
from cleanerd.logger import get_logger
from cleanerd.records.columns import marker_coordinator_epochs
from cleanerd.records.control import ControlRecordType, control_types_at
from cleanerd.records.crc32c_library import crc32c
from cleanerd.records.header import COMPRESSION_MASK, INT32_MAX, NO_SEQUENCE, Buffer
from cleanerd.records.walker import BatchTable

HEADER: Final = struct.Struct(">hIi")  # version, crc, entry count
ENTRY: Final = struct.Struct(">qhiqiqiq")
VERSION: Final = 1
_CRC_START: Final = 6
KEEP: Final = 2
NO_TXN: Final = -1

log = get_logger(__name__)


@dataclass(slots=True)
class ProducerEntry:
    """One producer's state (one snapshot entry)."""

    producer_id: int
    epoch: int = -1
    last_sequence: int = NO_SEQUENCE
    last_offset: int = -1
    offset_delta: int = 0
    timestamp: int = -1
    coordinator_epoch: int = -1
    txn_first_offset: int = NO_TXN

    def pack(self) -> bytes:
        return ENTRY.pack(
            self.producer_id,
            self.epoch,
            self.last_sequence,
            self.last_offset,
            self.offset_delta,
            self.timestamp,
            self.coordinator_epoch,
            self.txn_first_offset,
        )


class ProducerState:
    """Producer id -> entry, at `offset` (every batch below it applied)."""

    def __init__(self, offset: int = 0, entries: dict[int, ProducerEntry] | None = None) -> None:
        self.offset = offset
        self.entries: dict[int, ProducerEntry] = {} if entries is None else entries

    def ongoing(self) -> dict[int, int]:
        """Open transactions: producer id -> first offset."""
        return {
            pid: e.txn_first_offset for pid, e in self.entries.items() if e.txn_first_offset >= 0
        }

    # -- the update rules -------------------------------------------------------------------

    def apply(self, table: BatchTable, buf: Buffer) -> None:
        """Apply every row of `table` (batches walked in `buf`, in log order) whose base
        offset is at or above `offset`; `offset` then moves past the last row."""
        if not len(table):
            return
        last_offsets = table.last_offset
        is_control = table.is_control
        rows = self._updating_rows(table, is_control, buf)
        self.offset = max(self.offset, int(last_offsets[-1]) + 1)
        if not len(rows):
            return
        order = rows[np.argsort(table.producer_id[rows], kind="stable")]
        pids = table.producer_id[order]
        control = is_control[order]
        txn = table.is_transactional[order]
        epoch = table.producer_epoch[order]
        index = np.arange(len(order))
        starts = np.flatnonzero(np.r_[True, pids[1:] != pids[:-1]])
        group = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(order)]))
        last_row = order[np.r_[starts[1:], len(order)] - 1]
        last_marker = np.maximum.reduceat(np.where(control, index, -1), starts)
        last_data = np.maximum.reduceat(np.where(~control, index, -1), starts)
        opening = txn & ~control & (index > last_marker[group])
        first_open = np.minimum.reduceat(np.where(opening, index, len(order)), starts)
        # An epoch change (after the group's last data batch, so only markers can
        # bring one) clears what the last data batch set, as Kafka's
        # ProducerStateEntry.maybeUpdateProducerEpoch drops its batch metadata.
        changed = np.r_[False, epoch[1:] != epoch[:-1]]
        changed[starts] = False
        bumped = np.logical_or.reduceat(changed & (index > last_data[group]), starts)
        epochs = self._marker_epochs(table, order, last_marker, buf)
        for g, start in enumerate(starts.tolist()):
            pid = int(pids[start])
            entry = self.entries.get(pid) or ProducerEntry(pid)
            row = int(last_row[g])
            if last_data[g] >= 0:
                d = int(order[last_data[g]])
                entry.last_sequence = _last_sequence(
                    int(table.base_sequence[d]), int(table.last_offset_delta[d])
                )
                entry.last_offset = int(last_offsets[d])
                entry.offset_delta = int(table.last_offset_delta[d])
            if bumped[g] or (last_data[g] < 0 and entry.epoch != int(epoch[start])):
                entry.last_sequence, entry.last_offset, entry.offset_delta = NO_SEQUENCE, -1, 0
            entry.epoch = int(table.producer_epoch[row])
            entry.timestamp = int(table.max_timestamp[row])
            if last_marker[g] >= 0:
                entry.coordinator_epoch = int(epochs[g])
                entry.txn_first_offset = NO_TXN
            if first_open[g] < len(order) and entry.txn_first_offset < 0:
                entry.txn_first_offset = int(table.base_offset[order[first_open[g]]])
            self.entries[pid] = entry

    def _updating_rows(self, table: BatchTable, is_control: np.ndarray, buf: Buffer) -> np.ndarray:
        """The rows at or above `offset` that change producer state: data batches with a
        producer id, and ABORT or COMMIT markers. Kafka's loader skips a control batch
        without a record (a marker its cleaner emptied); it fails on other control types,
        which this reader skips instead, so that such a log still opens."""
        rows = np.flatnonzero((table.producer_id >= 0) & (table.base_offset >= self.offset))
        control = is_control[rows]
        if not control.any():
            return rows
        at = rows[control]
        types = control_types_at(
            buf,
            table.position[at],
            table.size[at],
            table.attributes[at].astype(np.int64),
            table.records_count[at].astype(np.int64),
        )
        keep = np.ones(len(rows), np.bool_)
        keep[np.flatnonzero(control)] = (types == ControlRecordType.ABORT) | (
            types == ControlRecordType.COMMIT
        )
        return rows[keep]

    @staticmethod
    def _marker_epochs(
        table: BatchTable, order: np.ndarray, last_marker: np.ndarray, buf: Buffer
    ) -> np.ndarray:
        """The coordinator epoch of each group's last marker (-1 where it has none)."""
        epochs = np.full(len(last_marker), -1, np.int32)
        has = np.flatnonzero(last_marker >= 0)
        if not len(has):  # no marker: spares a process loading the kernel
            return epochs
        rows = order[last_marker[has]]
        plain = (table.attributes[rows] & COMPRESSION_MASK) == 0
        epochs[has[plain]] = marker_coordinator_epochs(
            buf, table.position[rows[plain]], table.size[rows[plain]]
        )
        return epochs

    # -- the snapshot file ------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        body = struct.pack(">i", len(self.entries)) + b"".join(
            self.entries[pid].pack() for pid in sorted(self.entries)
        )
        return struct.pack(">hI", VERSION, crc32c(body)) + body

    @classmethod
    def from_bytes(cls, data: bytes, offset: int, path: Path) -> ProducerState:
        """Parse a snapshot; CorruptIndexError names `path` for a wrong version, size or
        CRC."""
        if len(data) < HEADER.size:
            raise CorruptIndexError(f"only {len(data)} bytes, no snapshot header", path=path)
        version, crc, count = HEADER.unpack_from(data)
        if version != VERSION:
            raise CorruptIndexError(f"unsupported snapshot version {version}", path=path)
        computed = crc32c(memoryview(data)[_CRC_START:])
        if computed != crc:
            raise CorruptIndexError(f"CRC mismatch: stored {crc}, computed {computed}", path=path)
        if count < 0 or len(data) != HEADER.size + count * ENTRY.size:
            raise CorruptIndexError(f"{count} entries do not match size {len(data)}", path=path)
        entries = {}
        for fields in ENTRY.iter_unpack(memoryview(data)[HEADER.size :]):
            entries[fields[0]] = ProducerEntry(*fields)
        return cls(offset, entries)


def _last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    """Kafka's DefaultRecordBatch.lastSequence: wraps past int32 max to 0."""
    if base_sequence == NO_SEQUENCE:
        return NO_SEQUENCE
    return (base_sequence + last_offset_delta) % (INT32_MAX + 1)


def snapshot_path(partition_dir: Path, offset: int) -> Path:
    return segment_file(partition_dir, offset, PRODUCER_SNAPSHOT_FILE_SUFFIX, "")


def snapshot_offsets(partition_dir: Path) -> list[int]:
    """Offsets of the well-named snapshot files in the dir, ascending."""
    with os.scandir(partition_dir) as entries:
        return snapshot_offsets_in([e.name for e in entries])


def snapshot_offsets_in(names: Iterable[str]) -> list[int]:
    """Offsets of the well-named snapshot files among `names` (a listing), ascending."""
    return sorted(map(int, SNAPSHOT_NAMES.findall(listing_text(names))))


def read_snapshot(path: Path) -> ProducerState:
    """The state in snapshot file `path` (CorruptIndexError names it if damaged)."""
    return ProducerState.from_bytes(path.read_bytes(), offset_from_filename(path.name), path)


def latest_snapshot(
    partition_dir: Path,
    offsets: Iterable[int],
    *,
    log_start: int,
    log_end: int,
    live: bool = False,
) -> ProducerState | None:
    """The state in the newest readable snapshot among `offsets` (the dir's, ascending)
    that lies within [`log_start`, `log_end`], or None. One outside that range is of
    batches the log no longer holds (or never held); a damaged one is logged, naming the
    file, and the next older one tried, as Kafka's loader does. With `live` (a dir a
    broker writes) the newest one is logged at debug: Kafka writes a snapshot in place
    at a roll, so it may be read half written."""
    newest = True
    for offset in reversed(list(offsets)):
        if not log_start <= offset <= log_end:
            continue
        path = snapshot_path(partition_dir, offset)
        try:
            return read_snapshot(path)
        except (CorruptIndexError, OSError) as exc:
            logged = log.debug if live and newest else log.warning
            logged("producer_snapshot.unreadable", path=str(path), error=str(exc))
        newest = False
    return None


def write_snapshot(partition_dir: Path, state: ProducerState, *, log_start_offset: int) -> Path:
    """Write `state` as `<state.offset>.snapshot` (atomically), then delete snapshots
    below `log_start_offset` and all but the newest `KEEP`."""
    path = snapshot_path(partition_dir, state.offset)
    atomic_write(path, state.to_bytes())
    offsets = snapshot_offsets(partition_dir)
    for offset in offsets[:-KEEP] + [o for o in offsets[-KEEP:] if o < log_start_offset]:
        if offset != state.offset:
            safe_unlink(snapshot_path(partition_dir, offset))
    return path
