"""Tests for cleanerd.records.batch: v2 encode/decode, empty batches, known vectors."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.errors import CorruptRecordError
from cleanerd.records.batch import (
    RecordBatch,
    decode_batch,
    empty_batch_of,
    encode_batch,
    encode_batch_like,
    encode_empty_batch,
    iter_records,
)
from cleanerd.records.header import (
    DELETE_HORIZON_MASK,
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    Compression,
    TimestampType,
    compute_crc,
    unpack_header,
)
from cleanerd.records.record import Record, RecordHeader
from cleanerd.records.walker import scan_batches
from tests.conftest import KAFKA_REAL

FIXTURES = KAFKA_REAL

# IBM/sarama's record_test.go vector: one record, key 01020304, value 050607, one header
# (key bytes 08 09 0a, value 0b0c), baseTimestamp 1479847795000, delta 5, maxTimestamp 0,
# producer id/epoch/sequence and leader epoch 0. Its CRC bytes are 84,121,97,253.
SARAMA_RECORDS = bytes([40, 0, 10, 0, 8, 1, 2, 3, 4, 6, 5, 6, 7, 2, 6, 8, 9, 10, 4, 11, 12])
SARAMA_HEADER = struct.pack(
    ">qiibIhiqqqhii", 0, 70, 0, 2, 0x547961FD, 0, 0, 1479847795000, 0, 0, 0, 0, 1
)
SARAMA_BATCH = SARAMA_HEADER + SARAMA_RECORDS
SARAMA_RECORD = Record(
    0, 1479847795005, b"\x01\x02\x03\x04", b"\x05\x06\x07", (RecordHeader("\x08\t\n", b"\x0b\x0c"),)
)
# The same record snappy-compressed by sarama: a raw snappy block, not xerial framing.
SARAMA_SNAPPY = (
    struct.pack(">qiibIhiqqqhii", 0, 72, 0, 2, 0x15009F61, 2, 0, 1479847795000, 0, 0, 0, 0, 1)
    + bytes([21, 80])
    + SARAMA_RECORDS
)
# ... and lz4: a frame with a content checksum and 4 MiB blocks (not Kafka's own settings).
SARAMA_LZ4 = struct.pack(
    ">qiibIhiqqqhii", 0, 89, 0, 2, 0xA94A77C5, 3, 0, 1479847795000, 0, 0, 0, 0, 1
) + bytes(
    [4, 34, 77, 24, 100, 112, 185, 21, 0, 0, 128, *SARAMA_RECORDS, 0, 0, 0, 0, 12, 59, 239, 146]
)


def reencode(b: RecordBatch) -> bytes:
    """Encode `b`'s records with every header field of `b` carried over."""
    h = b.header
    return encode_batch(
        b.records,
        base_offset=h.base_offset,
        last_offset_delta=h.last_offset_delta,
        compression=h.compression,
        timestamp_type=h.timestamp_type,
        max_timestamp=h.max_timestamp,
        producer_id=h.producer_id,
        producer_epoch=h.producer_epoch,
        base_sequence=h.base_sequence,
        partition_leader_epoch=h.partition_leader_epoch,
        is_transactional=h.is_transactional,
        is_control=h.is_control,
        delete_horizon_ms=h.delete_horizon_ms if h.has_delete_horizon else None,
        base_timestamp=h.base_timestamp,
    )


SAMPLE = [
    Record(100, 1_700_000_000_000, b"key-1", b"value-1", (RecordHeader("h", b"x"),)),
    Record(101, 1_699_999_999_990, None, b"unkeyed"),
    Record(
        103, 1_700_000_000_005, b"key-2", None, (RecordHeader("h", None), RecordHeader("h", b""))
    ),
]


def test_sarama_vector_encodes_to_its_bytes() -> None:
    """Encoding sarama's one-record batch gives its exact bytes and CRC."""
    out = encode_batch(
        [SARAMA_RECORD],
        base_offset=0,
        max_timestamp=0,
        producer_id=0,
        producer_epoch=0,
        base_sequence=0,
        partition_leader_epoch=0,
        base_timestamp=1479847795000,
    )
    assert out == SARAMA_BATCH


@pytest.mark.parametrize(
    "data", [SARAMA_BATCH, SARAMA_SNAPPY, SARAMA_LZ4], ids=["none", "raw-snappy", "lz4"]
)
def test_sarama_vectors_decode(data: bytes) -> None:
    """sarama's batches (including raw snappy and a checksummed lz4 frame) decode."""
    batch = decode_batch(data)
    assert batch.records == (SARAMA_RECORD,)
    if batch.header.compression is Compression.NONE:
        assert reencode(batch) == data


def test_empty_batch_is_61_bytes_with_kafka_fields() -> None:
    """The retained empty header has no records, baseTimestamp -1 and no horizon bit."""
    data = encode_empty_batch(
        base_offset=42,
        last_offset_delta=7,
        max_timestamp=1234,
        producer_id=9,
        producer_epoch=3,
        base_sequence=11,
        partition_leader_epoch=5,
        timestamp_type=TimestampType.LOG_APPEND_TIME,
        is_transactional=True,
        is_control=True,
    )
    assert len(data) == RECORD_BATCH_OVERHEAD == 61
    h = unpack_header(data)
    assert (h.base_offset, h.last_offset, h.batch_length) == (42, 49, 49)
    assert (h.base_timestamp, h.max_timestamp, h.records_count) == (-1, 1234, 0)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (9, 3, 11)
    assert h.partition_leader_epoch == 5
    assert h.is_transactional
    assert h.is_control
    assert not h.has_delete_horizon
    assert h.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert h.compression is Compression.NONE
    assert h.crc == compute_crc(data)
    assert decode_batch(data).records == ()


def test_sarama_empty_batch_crc() -> None:
    """An empty batch with all-zero fields has sarama's CRC bytes 89,95,183,221."""
    data = encode_empty_batch(
        base_offset=0,
        last_offset_delta=0,
        max_timestamp=0,
        producer_id=0,
        producer_epoch=0,
        base_sequence=0,
        partition_leader_epoch=0,
    )
    # writeEmptyHeader stores baseTimestamp -1; sarama's vector has 0 there, so patch it.
    patched = bytearray(data)
    struct.pack_into(">q", patched, 27, 0)
    assert compute_crc(patched) == int.from_bytes(bytes([89, 95, 183, 221]), "big")


def test_empty_batch_of_keeps_the_original_fields() -> None:
    """empty_batch_of keeps offsets, producer state, flags and max timestamp; drops the rest."""
    original = encode_batch(
        SAMPLE,
        base_offset=100,
        last_offset_delta=9,
        compression=Compression.ZSTD,
        producer_id=77,
        producer_epoch=2,
        base_sequence=40,
        partition_leader_epoch=6,
        is_transactional=True,
        delete_horizon_ms=5,
    )
    h = unpack_header(empty_batch_of(unpack_header(original)))
    assert (h.base_offset, h.last_offset_delta, h.max_timestamp) == (100, 9, 1_700_000_000_005)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (77, 2, 40)
    assert h.partition_leader_epoch == 6
    assert h.is_transactional
    assert not h.has_delete_horizon
    assert h.compression is Compression.NONE


@pytest.mark.parametrize("codec", list(Compression), ids=lambda c: c.name.lower())
def test_round_trip_every_codec(codec: Compression) -> None:
    """Records with headers, null keys and tombstones survive encode/decode for every codec."""
    data = encode_batch(SAMPLE, base_offset=100, compression=codec, producer_id=5, base_sequence=0)
    batch = decode_batch(data)
    assert batch.records == tuple(SAMPLE)
    h = batch.header
    assert (h.base_offset, h.last_offset_delta, h.records_count) == (100, 3, 3)
    assert h.compression is codec
    assert h.base_timestamp == SAMPLE[0].timestamp
    assert h.max_timestamp == 1_700_000_000_005
    assert reencode(batch) == data


def test_delete_horizon_is_the_base_timestamp() -> None:
    """With a delete horizon, baseTimestamp holds it, bit 6 is set, timestamps survive."""
    data = encode_batch(SAMPLE, base_offset=100, delete_horizon_ms=1_800_000_000_000)
    h = unpack_header(data)
    assert h.attributes & DELETE_HORIZON_MASK
    assert h.delete_horizon_ms == h.base_timestamp == 1_800_000_000_000
    assert decode_batch(data).records == tuple(SAMPLE)


def test_log_append_time_records_take_the_max_timestamp() -> None:
    """In a LogAppendTime batch every record reads the batch maxTimestamp."""
    data = encode_batch(
        SAMPLE, base_offset=100, timestamp_type=TimestampType.LOG_APPEND_TIME, max_timestamp=42
    )
    assert {r.timestamp for r in decode_batch(data).records} == {42}


def test_encode_batch_like_follows_filter_to() -> None:
    """Re-encoding kept records keeps the header fields and recomputes max timestamp."""
    original = encode_batch(
        SAMPLE,
        base_offset=100,
        compression=Compression.LZ4,
        producer_id=3,
        producer_epoch=1,
        base_sequence=10,
        partition_leader_epoch=4,
        is_transactional=True,
    )
    kept = [SAMPLE[1]]
    out = decode_batch(encode_batch_like(unpack_header(original), kept, delete_horizon_ms=None))
    h = out.header
    assert out.records == tuple(kept)
    assert (h.base_offset, h.last_offset_delta, h.compression) == (100, 3, Compression.LZ4)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (3, 1, 10)
    assert h.partition_leader_epoch == 4
    assert h.is_transactional
    assert h.max_timestamp == h.base_timestamp == SAMPLE[1].timestamp


def test_real_broker_batches_reencode_byte_for_byte() -> None:
    """Every batch of the real broker files re-encodes to its exact bytes."""
    for path in FIXTURES.rglob("*.log"):
        data = path.read_bytes()
        for info in scan_batches(data):
            batch = decode_batch(data, info.position)
            assert reencode(batch) == data[info.position : info.position + info.size]
            assert list(iter_records(data, info)) == list(batch.records)


def test_real_foo_record() -> None:
    """The user-topic fixture holds one unkeyed `Hello World!` at CreateTime 1726045973899."""
    data = (FIXTURES / "kraft-combined-logs/foo-0/00000000000000000000.log").read_bytes()
    (record,) = decode_batch(data).records
    assert record == Record(0, 1726045973899, None, b"Hello World!")


@pytest.mark.parametrize(
    ("records", "kwargs", "message"),
    [
        ([], {}, "at least one record"),
        ([Record(5, 0, b"k", b"v")], {"base_offset": 6}, "must increase"),
        ([Record(5, 0, b"k", b"v"), Record(5, 0, b"k", b"v")], {"base_offset": 0}, "must increase"),
        ([Record(5, 0, b"k", b"v")], {"base_offset": 0, "last_offset_delta": 4}, "out of range"),
        ([Record(2**31 + 1, 0, b"k", b"v")], {"base_offset": 0}, "too far"),
    ],
)
def test_encode_rejects_bad_input(
    records: list[Record], kwargs: dict[str, int], message: str
) -> None:
    """encode_batch refuses records it could not encode faithfully."""
    kwargs.setdefault("base_offset", 0)
    with pytest.raises(ValueError, match=message):
        encode_batch(records, **kwargs)  # type: ignore[arg-type]


def corrupt(data: bytes, at: int, value: int) -> bytes:
    """`data` with byte `at` set to `value` (CRC not updated: decode with verify_crc=False)."""
    out = bytearray(data)
    out[at] = value
    return bytes(out)


def test_record_length_past_the_batch_is_named() -> None:
    """A record length running past the batch names the record's byte position."""
    data = encode_batch([Record(0, 0, b"k", b"v")], base_offset=0)
    bad = corrupt(data, 61, 0x7E)  # length varint 63
    with pytest.raises(CorruptRecordError, match="record length 63 runs past") as info:
        decode_batch(bad, verify_crc=False)
    assert info.value.position == 61


def test_records_count_larger_than_the_records() -> None:
    """A batch declaring more records than it holds is corrupt."""
    data = bytearray(encode_batch([Record(0, 0, b"k", b"v")], base_offset=0, last_offset_delta=3))
    struct.pack_into(">i", data, 57, 2)
    with pytest.raises(CorruptRecordError, match="declares 2 records but holds only 1"):
        decode_batch(bytes(data), verify_crc=False)


def test_trailing_bytes_after_the_records() -> None:
    """Bytes after the declared records are corrupt (Kafka: incorrect declared batch size)."""
    data = bytearray(
        encode_batch([Record(0, 0, b"k", b"v"), Record(1, 0, b"k", b"v")], base_offset=0)
    )
    struct.pack_into(">i", data, 57, 1)
    with pytest.raises(CorruptRecordError, match="bytes follow the last of 1 records"):
        decode_batch(bytes(data), verify_crc=False)


def test_bad_key_length_in_a_compressed_batch_names_the_batch() -> None:
    """A malformed record inside compressed data names the batch and the inner byte."""
    h = BatchHeader(7, 0, -1, 2, 0, int(Compression.GZIP), 0, 0, 0, -1, -1, -1, 1)
    from cleanerd.records.batch import _assemble
    from cleanerd.records.compression import compress

    area = compress(Compression.GZIP, bytes([8, 0, 0, 0, 0x7E, 1, 2, 3, 4]))
    prefix = b"\x00" * 100
    data = prefix + _assemble(h, area)
    with pytest.raises(CorruptRecordError, match=r"key length 63 .* decompressed") as info:
        decode_batch(data, 100)
    assert info.value.position == 100


def test_undecompressable_batch_is_corrupt() -> None:
    """Garbage in a compressed records area gives CorruptRecordError at the batch."""
    data = encode_batch(SAMPLE, base_offset=0, compression=Compression.ZSTD)
    bad = data[:61] + b"\x00" * (len(data) - 61)
    with pytest.raises(CorruptRecordError, match="cannot decompress zstd") as info:
        decode_batch(bad, verify_crc=False)
    assert info.value.position == 0


header_keys = st.text(max_size=8)
maybe_bytes = st.none() | st.binary(max_size=40)
record_bodies = st.tuples(
    st.integers(-(2**40), 2**40),
    maybe_bytes,
    maybe_bytes,
    st.lists(st.builds(RecordHeader, header_keys, maybe_bytes), max_size=3).map(tuple),
)


@st.composite
def record_lists(draw: st.DrawFn) -> tuple[int, list[Record]]:
    base = draw(st.integers(0, 2**62))
    gaps = draw(st.lists(st.integers(1, 1000), min_size=1, max_size=12))
    bodies = draw(st.lists(record_bodies, min_size=len(gaps), max_size=len(gaps)))
    records = []
    offset = base + gaps[0] - 1
    for i, (ts, key, value, headers) in enumerate(bodies):
        if i:
            offset += gaps[i]
        records.append(Record(offset, 1_700_000_000_000 + ts, key, value, headers))
    return base, records


@settings(deadline=None, max_examples=150)
@given(
    data=record_lists(),
    codec=st.sampled_from(list(Compression)),
    horizon=st.none() | st.integers(0, 2**41),
    extra=st.integers(0, 5),
)
def test_round_trip_property(
    data: tuple[int, list[Record]], codec: Compression, horizon: int | None, extra: int
) -> None:
    """Arbitrary records round-trip through encode/decode for every codec; uncompressed
    batches re-encode to their exact bytes."""
    base, records = data
    last_delta = records[-1].offset - base + extra
    out = encode_batch(
        records,
        base_offset=base,
        compression=codec,
        last_offset_delta=last_delta,
        delete_horizon_ms=horizon,
    )
    batch = decode_batch(out)
    assert batch.records == tuple(records)
    assert batch.header.last_offset_delta == last_delta
    assert reencode(batch) == out
