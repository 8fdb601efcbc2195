"""Cleaning logs that hold legacy (magic 0/1) message sets (scenario 61, mixed magic):
kept entries are copied as they are, partly kept ones come out as v2 batches."""

from __future__ import annotations

from aiokafka.record.legacy_records import LegacyRecordBatchBuilder

from cleanerd.records.batch import decode_batch, iter_records
from cleanerd.records.header import Compression
from cleanerd.records.walker import scan_batches
from tests.compaction.conftest import LogBuilder, clean, k


def legacy(records: list[tuple[int, bytes, bytes | None]], *, codec: int) -> bytes:
    """A magic-1 message set; a compressed wrapper carries the last inner offset."""
    builder = LegacyRecordBatchBuilder(magic=1, compression_type=codec, batch_size=1 << 20)
    first = records[0][0]
    for offset, key, value in records:
        builder.append(
            offset - first if codec else offset, timestamp=1000 + offset, key=key, value=value
        )
    data = bytearray(builder.build())
    if codec:
        data[0:8] = records[-1][0].to_bytes(8, "big")  # not covered by the CRC
    return bytes(data)


def test_mixed_magic_keeps_latest_values(log: LogBuilder) -> None:
    """Legacy entries are deduplicated with v2 batches; nothing legacy is written anew."""
    log.segments[-1].batches.append(legacy([(0, k(0), b"a"), (1, k(1), b"b")], codec=0))
    log.segments[-1].batches.append(
        legacy([(2, k(2), b"c"), (3, k(0), b"d"), (4, k(3), b"e")], codec=1)
    )
    log.segments[-1].batches.append(legacy([(5, k(4), b"f")], codec=0))
    log.next_offset = 6
    log.append([(k(1), b"g"), (k(2), b"h")])
    log.roll()
    log.append([(k(9), b"z")])
    d = log.write()
    clean(d)
    values = {}
    magics = []
    for seg in sorted(d.glob("*.log")):
        data = seg.read_bytes()
        for info in scan_batches(data):
            magics.append(info.magic)
            values.update({r.key: (r.offset, r.value) for r in iter_records(data, info)})
    assert values == {
        k(0): (3, b"d"),
        k(1): (6, b"g"),
        k(2): (7, b"h"),
        k(3): (4, b"e"),
        k(4): (5, b"f"),
        k(9): (8, b"z"),
    }
    raw = (d / "00000000000000000000.log").read_bytes()
    first = decode_batch(raw).header
    assert (first.base_offset, first.last_offset, first.compression) == (2, 4, Compression.GZIP)
    assert magics == [2, 1, 2, 2]  # the untouched legacy entry is copied as it was
