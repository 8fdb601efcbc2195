"""Control records (the single record of a control batch, attribute bit 5).

Key, big-endian (Kafka's ControlRecordType)::

    version  int16  0
    type     int16  0 ABORT, 1 COMMIT, 2 LEADER_CHANGE, 3 SNAPSHOT_HEADER,
                    4 SNAPSHOT_FOOTER, 5 KRAFT_VERSION, 6 KRAFT_VOTERS

Value of an ABORT or COMMIT marker (Kafka's EndTransactionMarker)::

    version           int16  0
    coordinatorEpoch  int32

Types this code does not know are kept as plain ints so they survive a rewrite. The
key is decoded here only: `control_type` for a decoded `Record`, `control_type_column` for
the control batches of a segment decoded into columns (`columns.SegmentColumns`), which
is how both engines and the audit read them, and `control_types_at` for control batches
found by a header walk (a compiled kernel reads the key of each well-formed uncompressed
marker; anything else is decoded in Python, which raises what `control_type` raises).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import NDArray

from cleanerd._jit import jit
from cleanerd.errors import CorruptRecordError
from cleanerd.records.address import be_i16, bytes_address
from cleanerd.records.batch import decode_batch
from cleanerd.records.columns import SegmentColumns, parse_record
from cleanerd.records.header import COMPRESSION_MASK, CONTROL_MASK, RECORD_BATCH_OVERHEAD, Buffer
from cleanerd.records.record import Record

CONTROL_KEY: Final = struct.Struct(">hh")
END_TXN_VALUE: Final = struct.Struct(">hi")
CONTROL_KEY_VERSION: Final = 0
END_TXN_MARKER_VERSION: Final = 0
NO_CONTROL_RECORD: Final = -(1 << 16)
"""`control_types_at`'s type of a control batch without a record (a marker the cleaner
emptied); outside int16, so never a real type."""
_UNREAD: Final = NO_CONTROL_RECORD - 1
_KEY_SIZE: Final = CONTROL_KEY.size


class ControlRecordType(enum.IntEnum):
    """The type field of a control record key."""

    ABORT = 0
    COMMIT = 1
    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    KRAFT_VERSION = 5
    KRAFT_VOTERS = 6

    @property
    def kafka_name(self) -> str:
        """The name Kafka's tools print (`endTxnMarker: COMMIT`, `SnapshotHeader`, ...)."""
        return _KAFKA_NAMES[self]


_KAFKA_NAMES: Final = {
    ControlRecordType.ABORT: "ABORT",
    ControlRecordType.COMMIT: "COMMIT",
    ControlRecordType.LEADER_CHANGE: "LeaderChange",
    ControlRecordType.SNAPSHOT_HEADER: "SnapshotHeader",
    ControlRecordType.SNAPSHOT_FOOTER: "SnapshotFooter",
    ControlRecordType.KRAFT_VERSION: "KRaftVersion",
    ControlRecordType.KRAFT_VOTERS: "KRaftVoters",
}


@dataclass(frozen=True, slots=True)
class EndTxnMarker:
    """A transaction marker: COMMIT or ABORT, with the coordinator's epoch."""

    type: ControlRecordType
    coordinator_epoch: int


def _key_type(key: bytes | None, where: str, position: int | None) -> ControlRecordType | int:
    """The type in control record key `key` (an int if Kafka added it after us), checked
    as Kafka's ControlRecordType.parse does; CorruptRecordError names `where`."""
    if key is None or len(key) < CONTROL_KEY.size:
        size = "null" if key is None else f"{len(key)} bytes"
        raise CorruptRecordError(f"{where} has a {size} key, 4 bytes needed", position=position)
    version, code = CONTROL_KEY.unpack_from(key)
    if version < 0:
        raise CorruptRecordError(f"{where} has invalid key version {version}", position=position)
    try:
        return ControlRecordType(code)
    except ValueError:
        return int(code)


def control_type(record: Record) -> ControlRecordType | int:
    """The type of the control record `record` (an int if Kafka added it after us).

    Raise CorruptRecordError (position = the record's offset) if the key is malformed."""
    return _key_type(record.key, f"control record at offset {record.offset}", None)


def control_type_column(sc: SegmentColumns) -> NDArray[np.int64]:
    """Per batch row of the decoded segment `sc`: the type of a control batch's record,
    NO_CONTROL_RECORD for a control batch without a record (or a legacy entry); 0 (not to
    be read) for the other batches. Well-formed markers in the segment's own bytes are
    read by a kernel, the rest one key at a time.

    Raise CorruptRecordError (position = the batch's) if a key is malformed."""
    out = np.zeros(sc.num_batches, np.int64)
    control = np.flatnonzero(sc.attributes & CONTROL_MASK)
    out[control] = NO_CONTROL_RECORD
    rows = control[(sc.batch_magic[control] == 2) & (sc.records_count[control] > 0)]
    types = np.empty(rows.size, np.int64)
    _control_key_types(
        sc.segment,
        sc.batch_position[rows],
        sc.batch_size[rows],
        sc.attributes[rows].astype(np.int64),
        sc.records_count[rows].astype(np.int64),
        types,
    )
    for i in np.flatnonzero(types == _UNREAD).tolist():
        b = int(rows[i])
        key = sc.key(int(sc.batch_first_record[b]))
        types[i] = int(_key_type(key, "control record", int(sc.batch_position[b])))
    out[rows] = types
    return out


def decode_end_txn_marker(record: Record) -> EndTxnMarker:
    """The COMMIT/ABORT marker in `record`; CorruptRecordError if it is not one."""
    kind = control_type(record)
    if kind not in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
        raise CorruptRecordError(
            f"control record at offset {record.offset} is type {kind}, not an end-txn marker"
        )
    value = record.value
    if value is None or len(value) < END_TXN_VALUE.size:
        raise CorruptRecordError(
            f"end-txn marker at offset {record.offset} has a value shorter than 6 bytes"
        )
    version, epoch = END_TXN_VALUE.unpack_from(value)
    if version < 0:
        raise CorruptRecordError(
            f"end-txn marker at offset {record.offset} has invalid version {version}"
        )
    return EndTxnMarker(ControlRecordType(kind), epoch)


def encode_end_txn_marker(
    marker_type: ControlRecordType, coordinator_epoch: int, *, offset: int, timestamp: int
) -> Record:
    """The control record of a COMMIT or ABORT marker at `offset` (put it alone in a batch
    with `is_control=True` and the transaction's producer id and epoch)."""
    if marker_type not in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
        raise ValueError(f"{marker_type!r} is not an end-txn marker type")
    return Record(
        offset,
        timestamp,
        CONTROL_KEY.pack(CONTROL_KEY_VERSION, marker_type),
        END_TXN_VALUE.pack(END_TXN_MARKER_VERSION, coordinator_epoch),
    )


@jit
def _control_key_types(
    buf: NDArray[np.uint8],
    position: NDArray[np.int64],
    size: NDArray[np.int64],
    attributes: NDArray[np.int64],
    records_count: NDArray[np.int64],
    out: NDArray[np.int64],
) -> None:
    """The key type of each control batch's record; NO_CONTROL_RECORD for an empty
    batch, _UNREAD where the batch is compressed or its single record or key is not
    well formed (left to Python)."""
    at = bytes_address(buf)
    for i in range(position.shape[0]):
        if records_count[i] == 0:
            out[i] = NO_CONTROL_RECORD
            continue
        out[i] = _UNREAD
        end = position[i] + size[i]
        if records_count[i] != 1 or attributes[i] & COMPRESSION_MASK != 0:
            continue
        st, _, nxt, _, _, key_pos, key_len, _, _, _, _ = parse_record(
            at, position[i] + RECORD_BATCH_OVERHEAD, end
        )
        if st != 0 or nxt != end or key_len < _KEY_SIZE or be_i16(at, key_pos) < 0:
            continue
        out[i] = be_i16(at, key_pos + 2)


def control_types_at(
    raw: Buffer,
    position: NDArray[np.int64],
    size: NDArray[np.int64],
    attributes: NDArray[np.int64],
    records_count: NDArray[np.int64],
) -> NDArray[np.int64]:
    """The type of each control batch at `position` of `raw` (sizes, attributes and
    record counts from their headers), NO_CONTROL_RECORD for one without a record.
    Raise CorruptRecordError as `control_type` does if a key is malformed."""
    out = np.empty(position.shape[0], np.int64)
    _control_key_types(np.frombuffer(raw, np.uint8), position, size, attributes, records_count, out)
    for i in np.flatnonzero(out == _UNREAD).tolist():
        record = decode_batch(raw, int(position[i]), verify_crc=False).records[0]
        out[i] = int(control_type(record))
    return out
