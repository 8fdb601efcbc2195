"""Tests for cleanerd.records.control: control record types and end-txn markers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from cleanerd.errors import CorruptRecordError
from cleanerd.records.batch import decode_batch, empty_batch_of, encode_batch
from cleanerd.records.columns import segment_columns
from cleanerd.records.control import (
    CONTROL_KEY,
    NO_CONTROL_RECORD,
    ControlRecordType,
    EndTxnMarker,
    control_type,
    control_type_column,
    control_types_at,
    decode_end_txn_marker,
    encode_end_txn_marker,
)
from cleanerd.records.header import Compression, unpack_header
from cleanerd.records.record import Record

# kafka-python's single-record ABORT control batch test vector: key version 0 type 0, the
# value an opaque 22-byte string. Its stored CRC does not match (kafka-python never checks
# it), so it doubles as a CRC-failure case.
KAFKA_PYTHON_ABORT_BATCH = (
    bytes.fromhex(
        "0000000000000000000000520000000002"
        "6597ffd0"
        "0020"
        "00000000"
        "000000000098967f"
        "000000000098967f"
        "ffffffffffffffff"
        "ffff"
        "ffffffff"
        "00000001"
        "40"
        "00"
        "00"
        "00"
        "08"
        "00000000"
        "2c"
    )
    + b"opaque-control-message"
    + b"\x00"
)


def test_kafka_display_names() -> None:
    """Types carry the names Kafka's dump tool prints."""
    assert [t.kafka_name for t in ControlRecordType] == [
        "ABORT",
        "COMMIT",
        "LeaderChange",
        "SnapshotHeader",
        "SnapshotFooter",
        "KRaftVersion",
        "KRaftVoters",
    ]
    assert [int(t) for t in ControlRecordType] == list(range(7))


@pytest.mark.parametrize("kind", [ControlRecordType.ABORT, ControlRecordType.COMMIT])
def test_marker_round_trip(kind: ControlRecordType) -> None:
    """An encoded marker has Kafka's key/value bytes and decodes back."""
    record = encode_end_txn_marker(kind, 17, offset=9, timestamp=1234)
    assert record.key == b"\x00\x00\x00" + bytes([int(kind)])
    assert record.value == b"\x00\x00\x00\x00\x00\x11"
    assert control_type(record) is kind
    assert decode_end_txn_marker(record) == EndTxnMarker(kind, 17)


def test_marker_in_a_control_batch() -> None:
    """A COMMIT marker written as a control batch reads back as one."""
    marker = encode_end_txn_marker(ControlRecordType.COMMIT, 3, offset=50, timestamp=7)
    data = encode_batch(
        [marker],
        base_offset=50,
        producer_id=4,
        producer_epoch=1,
        is_transactional=True,
        is_control=True,
    )
    batch = decode_batch(data)
    assert batch.header.is_control
    assert decode_end_txn_marker(batch.records[0]) == EndTxnMarker(ControlRecordType.COMMIT, 3)


def test_kafka_python_abort_batch() -> None:
    """kafka-python's control batch vector fails its CRC, and otherwise reads as ABORT."""
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        decode_batch(KAFKA_PYTHON_ABORT_BATCH)
    batch = decode_batch(KAFKA_PYTHON_ABORT_BATCH, verify_crc=False)
    assert batch.header.is_control
    assert batch.header.base_timestamp == 9_999_999
    (record,) = batch.records
    assert control_type(record) is ControlRecordType.ABORT


def test_unknown_types_survive_as_ints() -> None:
    """A type Kafka adds later is returned as its number, not refused."""
    assert control_type(Record(0, 0, b"\x00\x00\x00\x2a", b"")) == 42


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (None, b"", "null key"),
        (b"\x00\x00\x01", b"", "3 bytes key"),
        (b"\xff\xff\x00\x00", b"\x00" * 6, "invalid key version"),
        (b"\x00\x00\x00\x00", b"\x00\x00\x00", "shorter than 6 bytes"),
        (b"\x00\x00\x00\x00", b"\xff\xff\x00\x00\x00\x00", "invalid version"),
        (b"\x00\x00\x00\x03", b"\x00" * 6, "not an end-txn marker"),
    ],
)
def test_malformed_control_records(key: bytes | None, value: bytes, message: str) -> None:
    """Malformed control keys or marker values are corrupt, naming the offset."""
    with pytest.raises(CorruptRecordError, match=message) as info:
        decode_end_txn_marker(Record(77, 0, key, value))
    assert "offset 77" in str(info.value)


def test_encode_refuses_non_marker_types() -> None:
    """Only ABORT and COMMIT are end-txn markers."""
    with pytest.raises(ValueError, match="not an end-txn marker"):
        encode_end_txn_marker(ControlRecordType.LEADER_CHANGE, 0, offset=0, timestamp=0)


def _control_batch(kind: str, key: bytes | None, compression: Compression, at: int) -> bytes:
    """A control batch at offset `at`: one record with `key`, or emptied."""
    data = encode_batch(
        [Record(at, 5, key, b"\x00\x00\x00\x00\x00\x01")],
        base_offset=at,
        producer_id=3,
        producer_epoch=0,
        is_transactional=True,
        is_control=True,
        compression=compression,
    )
    return empty_batch_of(unpack_header(data)) if kind == "empty" else data


_KEYS = st.one_of(
    st.none(),
    st.binary(max_size=6),
    st.tuples(st.integers(-2, 3), st.integers(-(2**15), 2**15 - 1)).map(
        lambda t: CONTROL_KEY.pack(*t)
    ),
)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["record", "empty"]),
            _KEYS,
            st.sampled_from([Compression.NONE, Compression.NONE, Compression.ZSTD]),
        ),
        min_size=1,
        max_size=8,
    )
)
@settings(max_examples=200, deadline=None)
def test_control_types_at_reads_what_control_type_reads(
    batches: list[tuple[str, bytes | None, Compression]],
) -> None:
    """The kernel's type of every control batch is `control_type` of its decoded record
    (NO_CONTROL_RECORD for an emptied one), and a malformed key raises the same error."""
    raw = b"".join(_control_batch(k, key, c, i) for i, (k, key, c) in enumerate(batches))
    heads, p = [], 0
    while p < len(raw):
        heads.append(unpack_header(raw, p))
        p += heads[-1].size_in_bytes

    def column(name: str) -> NDArray[np.int64]:
        return np.array([getattr(h, name) for h in heads], np.int64)

    expected: list[int] = []
    error: str | None = None
    for h in heads:
        if h.records_count == 0:
            expected.append(NO_CONTROL_RECORD)
            continue
        try:
            expected.append(int(control_type(decode_batch(raw, h.position).records[0])))
        except CorruptRecordError as exc:
            error = str(exc)
            break
    args = (column("position"), column("size_in_bytes"), column("attributes"))
    if error is not None:
        with pytest.raises(CorruptRecordError) as info:
            control_types_at(raw, *args, column("records_count"))
        assert str(info.value) == error
        return
    assert control_types_at(raw, *args, column("records_count")).tolist() == expected


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["record", "empty", "data"]),
            _KEYS,
            st.sampled_from([Compression.NONE, Compression.NONE, Compression.LZ4]),
        ),
        min_size=1,
        max_size=8,
    )
)
@settings(max_examples=200, deadline=None)
def test_control_type_column_of_a_decoded_segment(
    batches: list[tuple[str, bytes | None, Compression]],
) -> None:
    """Per batch of a decoded segment: a control batch's key type (NO_CONTROL_RECORD when
    emptied), 0 for data; a malformed key is corrupt at its batch's position."""
    parts = []
    for i, (kind, key, codec) in enumerate(batches):
        if kind == "data":
            parts.append(encode_batch([Record(i, 5, key, b"v")], base_offset=i, compression=codec))
        else:
            parts.append(_control_batch(kind, key, codec, i))
    sc = segment_columns(b"".join(parts))
    expected: list[int] = []
    bad: int | None = None
    for i, (kind, key, _) in enumerate(batches):
        if kind == "data":
            expected.append(0)
        elif kind == "empty":
            expected.append(NO_CONTROL_RECORD)
        elif key is None or len(key) < 4 or CONTROL_KEY.unpack_from(key)[0] < 0:
            bad = int(sc.batch_position[i])
            break
        else:
            expected.append(CONTROL_KEY.unpack_from(key)[1])
    if bad is not None:
        with pytest.raises(CorruptRecordError, match="control record has") as info:
            control_type_column(sc)
        assert info.value.position == bad
        return
    assert control_type_column(sc).tolist() == expected
