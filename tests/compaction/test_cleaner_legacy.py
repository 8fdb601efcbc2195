"""Cleaning logs that hold legacy (magic 0/1) message sets (scenario 61, mixed magic):
kept entries are copied as they are, partly kept ones come out as v2 batches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from aiokafka.record.legacy_records import LegacyRecordBatchBuilder

from cleanerd.commands.dump import DumpOptions, dump_file
from cleanerd.compaction import cleaner
from cleanerd.compaction.cleaner import CleanerConfig
from cleanerd.compaction.strategy import resolve_strategy
from cleanerd.log.files import log_file
from cleanerd.log.partition_log import PartitionLog
from cleanerd.records.batch import decode_batch, iter_records
from cleanerd.records.header import Compression
from cleanerd.records.walker import ANY_OFFSETS, Window, scan_batches
from tests.compaction.conftest import LogBuilder, _Segment, clean, k


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


def test_a_legacy_entry_in_a_mixed_window_is_rewritten_with_its_values(
    log: LogBuilder,
) -> None:
    """A window that starts mid-segment and mixes compressed and plain batches has its
    records joined in a copy of its own bytes: a plain legacy entry rewritten as v2 reads
    its value there, not at its position in the segment."""
    log.append([(k(100), b"x" * 50)])
    log.append([(k(101), b"y")], codec=Compression.GZIP)
    log.segments[-1].batches.append(legacy([(2, k(1), b"BBBB")], codec=0))
    log.next_offset = 3
    log.roll()
    d = log.write()
    path = d / f"{0:020d}.log"
    raw = path.read_bytes()
    window = Window(list(scan_batches(raw))[1].position, len(raw), ANY_OFFSETS)
    c = cleaner._read_columns(raw, window, path, verify_crc=True)
    assert c.joined.copied
    assert c.joined.segment_shift == -window[0]
    batch, _ = cleaner._legacy_as_v2(c, c.batches - 1, np.array([c.records - 1]))
    assert [(r.key, r.value) for r in decode_batch(batch).records] == [(k(1), b"BBBB")]


def test_the_header_strategy_reads_legacy_records_as_unversioned(log: LogBuilder) -> None:
    """Legacy records carry no headers: under the header strategy they have no version
    (the offset decides among them), instead of failing the pass."""
    log.segments[-1].batches.append(legacy([(0, k(0), b"old"), (1, k(1), b"b")], codec=0))
    log.next_offset = 2
    log.append([(k(0), b"new")])
    log.roll()
    d = log.write()
    config = CleanerConfig(segment_bytes=1 << 20, strategy=resolve_strategy("header", "v"))
    clean(d, config=config)
    values = {}
    for seg in sorted(d.glob("*.log")):
        data = seg.read_bytes()
        for info in scan_batches(data):
            values.update({r.key: r.value for r in iter_records(data, info)})
    assert values == {k(0): b"new", k(1): b"b"}


def test_a_wrapper_rolled_at_its_own_offset_cleans_again_and_again(
    log: LogBuilder, tmp_path: Path
) -> None:
    """Kafka 2.x rolled a legacy compressed append at the wrapper's offset (its last
    inner one), so segment 6 holds inner offsets 4..6. Partly kept, the wrapper becomes
    a v2 batch starting at 4, below the segment's base: sound, as Kafka's loader judges a
    batch by its last offset. The offset checks refused cleanerd's own output, so the
    partition could never be opened in full, cleaned or dumped again."""
    log.segments = [_Segment(6)]
    wrapper = legacy([(4, k(0), b"a"), (5, k(1), b"b"), (6, k(2), b"c")], codec=1)
    log.segments[-1].batches.append(wrapper)
    log.next_offset = 7
    log.append([(k(1), b"B")])
    log.roll()
    log.append([(k(9), b"z")])
    d = log.write()
    clean(d)
    first = next(scan_batches(log_file(d, 6).read_bytes()))
    assert (first.magic, first.base_offset, first.last_offset) == (2, 4, 6)
    clean(d)
    assert list(dump_file(log_file(d, 6), DumpOptions()))
    plog = PartitionLog.open(d, state_dir=tmp_path / "state", full_check=True)
    assert plog.corrupt is None
    assert plog.meta().damage is None


def test_a_legacy_tombstone_kept_whole_is_copied_as_it_was(log: LogBuilder) -> None:
    """A legacy entry that keeps its tombstone is copied byte for byte: it has no delete
    horizon to stamp (its tombstones go by the segment's mtime, Kafka's rule below magic
    2). It was rewritten as a v2 batch, which a later pass then stamped and removed on
    v2 timing."""
    tombstone = legacy([(0, k(0), None)], codec=0)
    log.segments[-1].batches.append(tombstone)
    log.segments[-1].batches.append(legacy([(1, k(1), b"b")], codec=0))
    log.next_offset = 2
    log.roll()
    log.append([(k(9), b"z")])
    d = log.write()
    clean(d)
    raw = (d / "00000000000000000000.log").read_bytes()
    infos = list(scan_batches(raw))
    assert [i.magic for i in infos] == [1, 1]
    assert raw[: len(tombstone)] == tombstone
