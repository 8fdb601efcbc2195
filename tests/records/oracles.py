"""The independent Kafka record codecs the tests compare against (aiokafka's C extension
and kafka-python), and a test-only builder of legacy (magic 0/1) message sets on top of
their producer-side builders, with offsets assigned the way a broker does."""

from __future__ import annotations

import struct
import warnings
import zlib
from collections.abc import Sequence
from typing import Any

import aiokafka.record.control_record as aiokafka_control
import aiokafka.record.default_records as aiokafka_default
import aiokafka.record.legacy_records as aiokafka_legacy
import aiokafka.record.memory_records as aiokafka_memory

from cleanerd.records.record import Record

with warnings.catch_warnings():
    # kafka-python 3.0 uses a deprecated importlib.resources call while importing.
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka.record.default_records as kafka_python_default
    import kafka.record.legacy_records as kafka_python_legacy
    import kafka.record.memory_records as kafka_python_memory

LEGACY_BUILDERS: dict[str, Any] = {
    "aiokafka": aiokafka_legacy.LegacyRecordBatchBuilder,
    "kafka-python": kafka_python_legacy.LegacyRecordBatchBuilder,
}
DEFAULT_BUILDERS: dict[str, Any] = {
    "aiokafka": aiokafka_default.DefaultRecordBatchBuilder,
    "kafka-python": kafka_python_default.DefaultRecordBatchBuilder,
}
READERS: dict[str, Any] = {
    "aiokafka": aiokafka_memory.MemoryRecords,
    "kafka-python": kafka_python_memory.MemoryRecords,
}


def build_legacy(
    library: str,
    magic: int,
    codec: int,
    records: Sequence[Record],
    *,
    log_append_time: int | None = None,
) -> bytes:
    """A message set holding `records` (consecutive offsets), uncompressed (one message
    per record) or as one compressed wrapper whose offset is the last record's, as a broker
    stores it. `log_append_time` turns a v1 wrapper into a LogAppendTime one."""
    builder = LEGACY_BUILDERS[library](magic, codec, 1 << 24)
    base = records[0].offset
    for i, r in enumerate(records):
        # v1 wrappers hold relative inner offsets; v0 wrappers and plain messages absolute.
        inner = i if (codec and magic == 1) else r.offset
        builder.append(inner, r.timestamp, r.key, r.value)
    data = bytearray(builder.build())
    if codec:
        struct.pack_into(">q", data, 0, base + len(records) - 1)
        if log_append_time is not None:
            data[17] |= 0x08
            struct.pack_into(">q", data, 18, log_append_time)
            struct.pack_into(">I", data, 12, zlib.crc32(memoryview(data)[16:]))
    return bytes(data)


def read_with(library: str, data: bytes) -> list[tuple[Any, Any]]:
    """Every (batch, record) `library`'s reader finds in `data`, each batch CRC-checked."""
    records = READERS[library](data)
    out = []
    while (batch := records.next_batch()) is not None:
        assert batch.validate_crc(), f"{library} finds a bad CRC"
        out += [(batch, r) for r in batch]
    return out


def marker_type(library: str, record: Any) -> int:
    """The control type of a control record as `library` parses it."""
    if library == "aiokafka":
        return int(aiokafka_control.ControlRecord.parse(record.key).type_)
    return int(record.type)
