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
emptied) changes nothing. `apply` runs these rules over a walked batch table: one
compiled pass folds each producer's batches as they come (`_groups_kernel`, producers
found through a hash table: no sort), then Python runs once per producer, not per batch.

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
from numpy.typing import NDArray

from cleanerd._jit import jit
from cleanerd.errors import CorruptIndexError
from cleanerd.log.files import (
    PRODUCER_SNAPSHOT_FILE_SUFFIX,
    SNAPSHOT_NAMES,
    listing_text,
    offset_from_filename,
    segment_file,
)
from cleanerd.log.fsutil import atomic_write, safe_unlink
from cleanerd.log.txnindex import AbortedTxn
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
        groups = _producer_groups(table, rows, is_control)
        epochs = self._marker_epochs(table, groups[:, _LAST_MARKER], buf)
        for g, (pid, first, last, data, marker, opening, bumped) in enumerate(groups.tolist()):
            entry = self.entries.get(pid) or ProducerEntry(pid)
            if data >= 0:
                entry.last_sequence = _last_sequence(
                    int(table.base_sequence[data]), int(table.last_offset_delta[data])
                )
                entry.last_offset = int(last_offsets[data])
                entry.offset_delta = int(table.last_offset_delta[data])
            if bumped or (data < 0 and entry.epoch != int(table.producer_epoch[first])):
                entry.last_sequence, entry.last_offset, entry.offset_delta = NO_SEQUENCE, -1, 0
            entry.epoch = int(table.producer_epoch[last])
            entry.timestamp = int(table.max_timestamp[last])
            if marker >= 0:
                entry.coordinator_epoch = int(epochs[g])
                entry.txn_first_offset = NO_TXN
            if opening >= 0 and entry.txn_first_offset < 0:
                entry.txn_first_offset = int(table.base_offset[opening])
            self.entries[pid] = entry

    def aborted_in(self, table: BatchTable, buf: Buffer) -> list[AbortedTxn]:
        """The aborted transactions whose ABORT markers are among the rows `apply` would
        apply (batches walked in `buf`, in log order), as the writer records them in the
        `.txnindex` of the marker's segment: from the transaction's first offset, with the
        last stable offset then (the first offset of another producer's open transaction,
        or one past the marker). The state is not changed: `apply` follows. Kafka's
        `LogSegment.recover` rebuilds a recovered segment's index so."""
        rows = np.flatnonzero(
            (table.producer_id >= 0) & table.is_transactional & (table.base_offset >= self.offset)
        )
        if not len(rows) or not table.is_control[rows].any():
            return []
        kinds = np.zeros(len(rows), np.int64)  # a data batch
        control = np.flatnonzero(table.is_control[rows])
        types = _control_types(table, rows[control], buf)
        kinds[control] = np.where(
            types == ControlRecordType.ABORT,
            _ABORT,
            np.where(types == ControlRecordType.COMMIT, _COMMIT, _OTHER),
        )
        ongoing = self.ongoing()
        opened = np.fromiter(ongoing, np.int64, len(ongoing))
        pids = np.unique(np.concatenate([table.producer_id[rows], opened]))
        firsts = np.full(len(pids), NO_TXN, np.int64)
        for pid, first in ongoing.items():
            firsts[np.searchsorted(pids, pid)] = first
        out = np.empty((len(control), 4), np.int64)
        count = _aborts_kernel(
            rows, table.producer_id, table.base_offset, table.last_offset, kinds, pids, firsts, out
        )
        return [AbortedTxn(first, pid, last, lso) for pid, first, last, lso in out[:count].tolist()]

    def _updating_rows(self, table: BatchTable, is_control: np.ndarray, buf: Buffer) -> np.ndarray:
        """The rows at or above `offset` that change producer state: data batches with a
        producer id, and ABORT or COMMIT markers. Kafka's loader skips a control batch
        without a record (a marker its cleaner emptied); it fails on other control types,
        which this reader skips instead, so that such a log still opens."""
        rows = np.flatnonzero((table.producer_id >= 0) & (table.base_offset >= self.offset))
        control = is_control[rows]
        if not control.any():
            return rows
        types = _control_types(table, rows[control], buf)
        keep = np.ones(len(rows), np.bool_)
        keep[np.flatnonzero(control)] = (types == ControlRecordType.ABORT) | (
            types == ControlRecordType.COMMIT
        )
        return rows[keep]

    @staticmethod
    def _marker_epochs(table: BatchTable, markers: np.ndarray, buf: Buffer) -> np.ndarray:
        """The coordinator epoch of each group's last marker (row `markers[g]`; -1 where
        the group has none)."""
        epochs = np.full(len(markers), -1, np.int32)
        has = np.flatnonzero(markers >= 0)
        if not len(has):  # no marker: spares a process loading the kernel
            return epochs
        rows = markers[has]
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
        CRC. The size is checked before the CRC, so a file cut short (a copy or a disk
        that lost its end) says so, not only that its CRC fails."""
        if len(data) < HEADER.size:
            raise CorruptIndexError(f"only {len(data)} bytes, no snapshot header", path=path)
        version, crc, count = HEADER.unpack_from(data)
        if version != VERSION:
            raise CorruptIndexError(f"unsupported snapshot version {version}", path=path)
        expected = HEADER.size + count * ENTRY.size
        if count < 0 or len(data) != expected:
            cut = f": cut short, {expected} bytes expected" if len(data) < expected else ""
            raise CorruptIndexError(
                f"{count} entries do not match size {len(data)}{cut}", path=path
            )
        computed = crc32c(memoryview(data)[_CRC_START:])
        if computed != crc:
            raise CorruptIndexError(f"CRC mismatch: stored {crc}, computed {computed}", path=path)
        entries = {}
        for fields in ENTRY.iter_unpack(memoryview(data)[HEADER.size :]):
            entries[fields[0]] = ProducerEntry(*fields)
        return cls(offset, entries)


_GROUP_FIELDS: Final = 7
"""A producer's row of `_producer_groups`: its id, then rows of the table (-1: none)."""
_PID, _FIRST, _LAST, _DATA, _LAST_MARKER, _OPENING, _BUMPED = range(_GROUP_FIELDS)
_GOLDEN: Final = -7046029254386353131  # 0x9E3779B97F4A7C15 as an int64: Fibonacci hashing


def _control_types(table: BatchTable, at: np.ndarray, buf: Buffer) -> np.ndarray:
    """The control record type of each control batch at rows `at` of `table`."""
    return control_types_at(
        buf,
        table.position[at],
        table.size[at],
        table.attributes[at].astype(np.int64),
        table.records_count[at].astype(np.int64),
    )


_COMMIT: Final = 1
_ABORT: Final = 2
_OTHER: Final = -1


@jit
def _aborts_kernel(
    rows: NDArray[np.int64],
    producer_id: NDArray[np.int64],
    base_offset: NDArray[np.int64],
    last_offset: NDArray[np.int64],
    kinds: NDArray[np.int64],
    pids: NDArray[np.int64],
    firsts: NDArray[np.int64],
    out: NDArray[np.int64],
) -> int:
    """Sweep the transactional `rows` in log order (`kinds`: 0 data, `_COMMIT`,
    `_ABORT`, `_OTHER`), `firsts` holding the first offset of each producer's open
    transaction (by its index in the sorted `pids`; NO_TXN when none): a data batch opens
    one, a marker closes it, and an abort of an open one is written to `out` as (producer
    id, first offset, marker offset, last stable offset). Returns the aborts written."""
    count = 0
    for i in range(rows.shape[0]):
        r = rows[i]
        p = np.searchsorted(pids, producer_id[r])
        kind = kinds[i]
        if kind == 0:
            if firsts[p] < 0:
                firsts[p] = base_offset[r]
        elif kind != _OTHER and firsts[p] >= 0:
            if kind == _ABORT:
                lso = last_offset[r] + 1
                for q in range(firsts.shape[0]):
                    if q != p and 0 <= firsts[q] < lso:
                        lso = firsts[q]
                out[count, 0] = producer_id[r]
                out[count, 1] = firsts[p]
                out[count, 2] = last_offset[r]
                out[count, 3] = lso
                count += 1
            firsts[p] = NO_TXN
    return count


def _producer_groups(table: BatchTable, rows: np.ndarray, is_control: np.ndarray) -> np.ndarray:
    """What `rows` (the updating rows of `table`, in log order) leave for each producer,
    one row per producer id in ascending order (see `_groups_kernel`)."""
    n = len(rows)
    capacity = 1 << max(4, (2 * n - 1).bit_length())  # at most half full
    slots = np.full(capacity, -1, np.int64)
    groups = np.empty((n, _GROUP_FIELDS), np.int64)
    count = _groups_kernel(
        rows.astype(np.int64, copy=False),
        table.producer_id,
        table.producer_epoch,
        is_control,
        table.is_transactional,
        slots,
        groups,
    )
    found = groups[:count]
    return found[np.argsort(found[:, _PID], kind="stable")]


@jit
def _groups_kernel(
    rows: NDArray[np.int64],
    producer_id: NDArray[np.int64],
    producer_epoch: NDArray[np.int16],
    is_control: NDArray[np.bool_],
    is_transactional: NDArray[np.bool_],
    slots: NDArray[np.int64],
    groups: NDArray[np.int64],
) -> int:
    """One pass over `rows` in log order, each producer's rows folded as they come (its
    group found through `slots`, an open-addressing table of group numbers, all -1, its
    size a power of two above twice the rows): into `groups[g]`, the producer id, its
    first and last rows, its last data batch, its last marker, the first transactional
    data batch after that marker (the open transaction), and whether a batch after its
    last data batch changed the epoch (Kafka then drops that batch's metadata). Returns
    how many producers."""
    mask = slots.shape[0] - 1
    count = 0
    for i in range(rows.shape[0]):
        r = rows[i]
        pid = producer_id[r]
        s = ((pid * _GOLDEN) >> 20) & mask
        while slots[s] >= 0 and groups[slots[s], _PID] != pid:
            s = (s + 1) & mask
        g = slots[s]
        if g < 0:
            g = count
            count += 1
            slots[s] = g
            groups[g, _PID] = pid
            groups[g, _FIRST] = r
            groups[g, _DATA] = -1
            groups[g, _LAST_MARKER] = -1
            groups[g, _OPENING] = -1
            groups[g, _BUMPED] = 0
        elif is_control[r] and producer_epoch[r] != producer_epoch[groups[g, _LAST]]:
            groups[g, _BUMPED] = 1
        if is_control[r]:
            groups[g, _LAST_MARKER] = r
            groups[g, _OPENING] = -1
        else:
            groups[g, _DATA] = r
            groups[g, _BUMPED] = 0
            if is_transactional[r] and groups[g, _OPENING] < 0:
                groups[g, _OPENING] = r
        groups[g, _LAST] = r
    return count


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


def write_snapshot(
    partition_dir: Path,
    state: ProducerState,
    *,
    log_start_offset: int,
    like: Path | None = None,
) -> Path:
    """Write `state` as `<state.offset>.snapshot` (atomically, with the bits and group of
    `like`, a segment of the partition), then delete snapshots below `log_start_offset`
    and all but the newest `KEEP`."""
    path = snapshot_path(partition_dir, state.offset)
    atomic_write(path, state.to_bytes(), like=like)
    offsets = snapshot_offsets(partition_dir)
    for offset in offsets[:-KEEP] + [o for o in offsets[-KEEP:] if o < log_start_offset]:
        if offset != state.offset:
            safe_unlink(snapshot_path(partition_dir, offset))
    return path
