"""Tests for cleanerd.records.legacy: reading magic 0/1 message sets, wrappers included."""

from __future__ import annotations

import struct
import zlib

import pytest

from cleanerd.errors import CorruptRecordError
from cleanerd.records.batch import iter_records
from cleanerd.records.compression import compress
from cleanerd.records.header import Compression
from cleanerd.records.legacy import iter_legacy_records, read_legacy_entry
from cleanerd.records.record import Record
from cleanerd.records.walker import scan_batches, walk
from tests.records.oracles import build_legacy, read_with

# Message sets written by Kafka 0.10 brokers (kafka-python's test data): values "123", "",
# "", "123", offsets 0-3, no keys.
V1_SET = bytes.fromhex(
    "0000000000000000000000194786 28c2 0100 0000015e1867abae ffffffff 00000003 313233"
    "0000000000000001000000 16ef98c920 0100 0000015e1867afc0 ffffffff 00000000"
    "0000000000000002000000 165faffb5e 0100 0000015e1867b072 ffffffff 00000000"
    "0000000000000003000000 19a8125720 0100 0000015e1867b803 ffffffff 00000003 313233"
)
V0_SET = bytes.fromhex(
    "0000000000000000 00000011 feb01dbf 00 00 ffffffff 00000003 313233"
    "0000000000000001 0000000e 795748e0 00 00 ffffffff 00000000"
    "0000000000000002 0000000e 795748e0 00 00 ffffffff 00000000"
    "0000000000000003 00000011 feb01dbf 00 00 ffffffff 00000003 313233"
)

RECORDS = [
    Record(100 + i, 1_500_000_000_000 + i, None if i == 2 else b"key-%d" % i, v)
    for i, v in enumerate([b"value" * 30, b"", None, b"x" * 200, b"last"])
]

LIBRARY_CODECS = [
    (lib, magic, codec)
    for lib in ("aiokafka", "kafka-python")
    for magic in (0, 1)
    for codec in (0, 1, 2, 3)
    # aiokafka refuses lz4 for magic 0 (it would need Kafka's broken frame checksum).
    if not (lib == "aiokafka" and magic == 0 and codec == 3)
]


@pytest.mark.parametrize(("data", "magic"), [(V1_SET, 1), (V0_SET, 0)], ids=["v1", "v0"])
def test_broker_message_sets(data: bytes, magic: int) -> None:
    """Kafka 0.10's v0/v1 message sets scan with valid CRCs and read their values."""
    result = walk(data + b"\x00" * 4)
    assert result.valid_bytes == len(data)
    assert result.incomplete_tail
    infos = result.table.infos()
    assert [(i.magic, i.base_offset, i.last_offset) for i in infos] == [
        (magic, n, n) for n in range(4)
    ]
    records = [r for i in infos for r in iter_records(data, i)]
    assert [r.value for r in records] == [b"123", b"", b"", b"123"]
    assert all(r.key is None for r in records)
    if magic == 1:
        assert records[0].timestamp == 1503648000942
        assert infos[0].max_timestamp == 1503648000942
        assert read_legacy_entry(data, 0, len(data), verify_crc=True).crc == 1199974594
    else:
        assert {r.timestamp for r in records} == {-1}
        assert read_legacy_entry(data, 0, len(data), verify_crc=True).crc == -22012481 & 0xFFFFFFFF


@pytest.mark.parametrize(("library", "magic", "codec"), LIBRARY_CODECS)
def test_library_built_sets(library: str, magic: int, codec: int) -> None:
    """Sets from aiokafka's and kafka-python's legacy builders read with broker offsets,
    keys, values and timestamps, as the builder's own library reads them."""
    data = build_legacy(library, magic, codec, RECORDS)
    infos = list(scan_batches(data))
    records = [r for i in infos for r in iter_records(data, i)]
    assert [r.offset for r in records] == [r.offset for r in RECORDS]
    assert [(r.key, r.value) for r in records] == [(r.key, r.value) for r in RECORDS]
    expected_ts = [r.timestamp for r in RECORDS] if magic == 1 else [-1] * len(RECORDS)
    assert [r.timestamp for r in records] == expected_ts
    assert infos[0].base_offset == 100
    assert infos[-1].last_offset == 104
    assert len(infos) == (1 if codec else len(RECORDS))

    oracle = [(r.offset, r.key, r.value) for _, r in read_with(library, data)]
    assert oracle == [(r.offset, r.key, r.value) for r in records]


def test_kafka_python_lz4_v0_uses_the_broken_checksum() -> None:
    """kafka-python's magic-0 lz4 wrapper carries Kafka's legacy frame checksum, and reads."""
    data = build_legacy("kafka-python", 0, 3, RECORDS)
    entry = read_legacy_entry(data, 0, len(data), verify_crc=True)
    assert entry.value is not None
    assert entry.value[6] != compress(Compression.LZ4, b"")[6]  # not the standard checksum
    assert [r.offset for r in iter_legacy_records(data, 0)] == [r.offset for r in RECORDS]


def test_log_append_time_wrapper_sets_inner_timestamps() -> None:
    """Inner records of a LogAppendTime v1 wrapper take the wrapper's timestamp."""
    data = build_legacy("kafka-python", 1, 1, RECORDS, log_append_time=1_600_000_000_000)
    (info,) = scan_batches(data)
    assert info.max_timestamp == 1_600_000_000_000
    assert {r.timestamp for r in iter_records(data, info)} == {1_600_000_000_000}


def test_flipped_byte_fails_the_legacy_crc() -> None:
    """A flipped byte in a legacy message gives a CRC mismatch at its position."""
    data = bytearray(V1_SET)
    data[25 + 26] ^= 0x01  # inside the second message
    with pytest.raises(CorruptRecordError, match="CRC mismatch") as info:
        list(scan_batches(bytes(data)))
    assert info.value.position == 37


def rewrap(data: bytes, value: bytes | None) -> bytes:
    """The v1 wrapper `data` with its value replaced (CRC recomputed)."""
    head = bytearray(data[:26])
    key_len = struct.unpack_from(">i", data, 26)[0]
    body = data[26 : 30 + max(key_len, 0)]
    tail = struct.pack(">i", -1) if value is None else struct.pack(">i", len(value)) + value
    out = head + body + tail
    struct.pack_into(">i", out, 8, len(out) - 12)
    struct.pack_into(">I", out, 12, zlib.crc32(memoryview(out)[16:]))
    return bytes(out)


def test_wrapper_with_null_value_is_corrupt() -> None:
    """A compressed wrapper without a value cannot hold records."""
    data = rewrap(build_legacy("aiokafka", 1, 1, RECORDS), None)
    with pytest.raises(CorruptRecordError, match="null value"):
        list(scan_batches(data))


def test_inner_magic_must_match_the_wrapper() -> None:
    """Inner messages with another magic than their wrapper are corrupt."""
    inner = build_legacy("aiokafka", 0, 0, RECORDS[:1])
    data = rewrap(build_legacy("aiokafka", 1, 1, RECORDS), compress(Compression.GZIP, inner))
    with pytest.raises(CorruptRecordError, match="inner magic 0 differs") as info:
        list(scan_batches(data))
    assert info.value.position == 0


def test_key_length_past_the_message_is_corrupt() -> None:
    """A key length running past its message is named."""
    data = bytearray(V0_SET[:29])
    struct.pack_into(">i", data, 18, 50)
    with pytest.raises(CorruptRecordError, match="key length 50 runs past"):
        read_legacy_entry(bytes(data), 0, len(data), verify_crc=False)
