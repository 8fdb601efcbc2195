"""Interoperability with independent codecs: aiokafka (C extension) and kafka-python read
what cleanerd writes, and cleanerd reads what they build, for every codec."""

from __future__ import annotations

import struct
from typing import Any

import crc32c
import pytest

from cleanerd.records.batch import decode_batch, encode_batch
from cleanerd.records.columns import segment_columns
from cleanerd.records.control import ControlRecordType, control_type, encode_end_txn_marker
from cleanerd.records.header import CONTROL_MASK, Compression, TimestampType
from cleanerd.records.record import Record, RecordHeader
from cleanerd.records.walker import scan_batches
from tests.records.oracles import DEFAULT_BUILDERS, marker_type, read_with

LIBRARIES = ["aiokafka", "kafka-python"]
CODECS = list(Compression)

BODY = b"compressible payload " * 8
RECORDS = [
    Record(0, 1_700_000_000_000, b"key-0", BODY, (RecordHeader("trace", b"abc"),)),
    Record(1, 1_700_000_000_007, None, BODY),
    Record(2, 1_699_999_999_000, b"key-2", None),  # a tombstone, older timestamp
    Record(
        3,
        1_700_000_000_003,
        b"key-3",
        BODY,
        (RecordHeader("v", b"\x00" * 8), RecordHeader("v", None), RecordHeader("", b"")),
    ),
    Record(4, 1_700_000_000_001, b"", b""),
]


def as_tuples(records: list[Any]) -> list[tuple[Any, ...]]:
    """(offset, timestamp, key, value, headers) of library or cleanerd records."""
    out = []
    for r in records:
        headers = [(h.key, h.value) for h in r.headers] if isinstance(r, Record) else r.headers
        out.append((r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in headers]))
    return out


def library_batch(
    library: str,
    codec: Compression,
    records: list[Record],
    *,
    base_offset: int,
    transactional: bool = False,
) -> bytes:
    """A v2 batch from `library`'s producer builder, with the base offset a broker assigns."""
    producer = (7, 2, 10) if transactional else (-1, -1, -1)
    builder = DEFAULT_BUILDERS[library](2, int(codec), transactional, *producer, 1 << 20)
    for r in records:
        headers = [(h.key, h.value) for h in r.headers]
        builder.append(r.offset - base_offset, r.timestamp, r.key, r.value, headers)
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base_offset)  # the base offset is outside the CRC
    return bytes(data)


def set_control(data: bytes) -> bytes:
    """`data` turned into a control batch (as the broker writes markers), CRC recomputed."""
    out = bytearray(data)
    out[22] |= CONTROL_MASK
    struct.pack_into(">I", out, 17, crc32c.crc32c(memoryview(out)[21:]))
    return bytes(out)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name.lower())
@pytest.mark.parametrize("library", LIBRARIES)
def test_cleanerd_reads_library_batches(library: str, codec: Compression) -> None:
    """Batches built by the library decode in cleanerd with the same content, and the
    columnar decoder agrees."""
    shifted = [Record(r.offset + 500, r.timestamp, r.key, r.value, r.headers) for r in RECORDS]
    data = library_batch(library, codec, shifted, base_offset=500)
    batch = decode_batch(data)
    assert batch.header.compression is codec
    assert batch.records == tuple(shifted)
    assert as_tuples(list(batch.records)) == as_tuples([r for _, r in read_with(library, data)])
    cols = segment_columns(data)
    assert cols.offset.tolist() == [r.offset for r in shifted]
    assert cols.timestamp.tolist() == [r.timestamp for r in shifted]
    assert [cols.key(i) for i in range(cols.num_records)] == [r.key for r in shifted]
    assert [cols.value(i) for i in range(cols.num_records)] == [r.value for r in shifted]


@pytest.mark.parametrize("library", LIBRARIES)
def test_cleanerd_reads_library_transactional_and_control_batches(library: str) -> None:
    """A transactional batch and a COMMIT marker built from the library's output decode
    with producer fields, flags and the marker type."""
    data = library_batch(library, Compression.GZIP, RECORDS[:2], base_offset=0, transactional=True)
    marker = encode_end_txn_marker(ControlRecordType.COMMIT, 5, offset=2, timestamp=1)
    control = set_control(library_batch(library, Compression.NONE, [marker], base_offset=2))
    segment = data + control
    first, second = (decode_batch(segment, i.position) for i in scan_batches(segment))
    assert first.header.is_transactional
    assert (first.header.producer_id, first.header.producer_epoch) == (7, 2)
    assert first.header.base_sequence == 10
    assert first.records == tuple(RECORDS[:2])
    assert second.header.is_control
    assert control_type(second.records[0]) is ControlRecordType.COMMIT
    ((theirs_batch, theirs_record),) = read_with(library, control)
    assert theirs_batch.is_control_batch
    assert marker_type(library, theirs_record) == ControlRecordType.COMMIT


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name.lower())
@pytest.mark.parametrize("library", LIBRARIES)
def test_library_reads_cleanerd_batches(library: str, codec: Compression) -> None:
    """Batches cleanerd encodes pass the library's CRC check and read back identically,
    with producer fields and a delete horizon set."""
    records = [Record(r.offset + 10, r.timestamp, r.key, r.value, r.headers) for r in RECORDS]
    data = encode_batch(
        records,
        base_offset=10,
        last_offset_delta=6,
        compression=codec,
        producer_id=99,
        producer_epoch=3,
        base_sequence=40,
        partition_leader_epoch=8,
        is_transactional=True,
        delete_horizon_ms=1_800_000_000_000,
    )
    seen = read_with(library, data)
    assert as_tuples([r for _, r in seen]) == as_tuples(records)
    batch = seen[0][0]
    assert batch.compression_type == int(codec)
    assert batch.is_transactional
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (99, 3, 40)
    assert batch.next_offset == 17


@pytest.mark.parametrize("library", LIBRARIES)
def test_library_reads_cleanerd_markers_and_log_append_time(library: str) -> None:
    """cleanerd's control batches are markers to the library; LogAppendTime batches read
    with the batch timestamp."""
    marker = encode_end_txn_marker(ControlRecordType.ABORT, 4, offset=30, timestamp=5)
    control = encode_batch(
        [marker],
        base_offset=30,
        producer_id=1,
        producer_epoch=0,
        is_transactional=True,
        is_control=True,
    )
    ((batch, record),) = read_with(library, control)
    assert batch.is_control_batch
    assert marker_type(library, record) == ControlRecordType.ABORT
    log_append = encode_batch(
        RECORDS, base_offset=0, timestamp_type=TimestampType.LOG_APPEND_TIME, max_timestamp=77
    )
    assert {r.timestamp for _, r in read_with(library, log_append)} == {77}


def test_mixed_segment_of_both_libraries_and_cleanerd() -> None:
    """One segment of batches from all three writers scans, decodes and columns alike."""
    parts = []
    offset = 0
    for i, codec in enumerate(CODECS):
        shifted = [
            Record(r.offset + offset, r.timestamp, r.key, r.value, r.headers) for r in RECORDS
        ]
        if i % 3 == 2:
            parts.append(encode_batch(shifted, base_offset=offset, compression=codec))
        else:
            parts.append(library_batch(LIBRARIES[i % 3], codec, shifted, base_offset=offset))
        offset += len(RECORDS)
    segment = b"".join(parts)
    infos = list(scan_batches(segment))
    decoded = [r for i in infos for r in decode_batch(segment, i.position).records]
    cols = segment_columns(segment)
    assert cols.offset.tolist() == [r.offset for r in decoded] == list(range(offset))
    assert [cols.headers(i) for i in range(cols.num_records)] == [r.headers for r in decoded]
