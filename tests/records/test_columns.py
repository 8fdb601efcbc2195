"""Tests for cleanerd.records.columns: the compiled columnar decoder agrees with the pure
decoder, handles every codec and legacy data, and names bad bytes."""

from __future__ import annotations

import dataclasses
import mmap
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.errors import CorruptRecordError
from cleanerd.records.batch import decode_batch, encode_batch, iter_records
from cleanerd.records.columns import record_columns, segment_columns
from cleanerd.records.header import RECORD_BATCH_OVERHEAD, Compression, TimestampType, unpack_header
from cleanerd.records.record import Record, RecordHeader
from cleanerd.records.varint import encode_varint
from cleanerd.records.walker import scan_batches
from tests.conftest import KAFKA_REAL
from tests.records.oracles import build_legacy

FIXTURES = KAFKA_REAL


def sample(base: int, n: int, ts: int = 1_000) -> list[Record]:
    """`n` records from offset `base`: keys, a null key, a tombstone, headers."""
    out = []
    for i in range(n):
        key = None if i % 5 == 1 else b"k%d" % (base + i)
        value = None if i % 4 == 3 else b"v" * (i % 7) * 30
        headers = (RecordHeader(f"h{i}", b"x" * i), RecordHeader("n", None)) if i % 3 == 0 else ()
        out.append(Record(base + i, ts + 3 * i - (i % 2) * 5, key, value, headers))
    return out


def decoded(data: bytes) -> list[Record]:
    """Every record of `data` through the pure decoder."""
    return [r for info in scan_batches(data) for r in iter_records(data, info)]


def rows_as_records(data: bytes) -> list[Record]:
    """Every record of `data` rebuilt from segment_columns."""
    cols = segment_columns(data)
    return [
        Record(
            int(cols.offset[i]),
            int(cols.timestamp[i]),
            cols.key(i),
            cols.value(i),
            cols.headers(i),
        )
        for i in range(cols.num_records)
    ]


@pytest.mark.parametrize("codec", list(Compression), ids=lambda c: c.name.lower())
def test_agrees_with_the_pure_decoder(codec: Compression) -> None:
    """Every codec: the columns hold the same offsets, timestamps, keys, values, headers."""
    data = encode_batch(sample(0, 40), base_offset=0, compression=codec) + encode_batch(
        sample(45, 3), base_offset=42, compression=codec, delete_horizon_ms=500
    )
    assert rows_as_records(data) == decoded(data)
    cols = segment_columns(data)
    assert cols.batch_first_record.tolist() == [0, 40]
    assert cols.batch_index.tolist() == [0] * 40 + [1] * 3
    assert (cols.buffer_id == (0 if codec is Compression.NONE else 1)).all()


def test_batch_table_matches_the_headers() -> None:
    """Batch rows carry each header's fields and the records area position."""
    data = encode_batch(
        sample(0, 3), base_offset=0, producer_id=5, producer_epoch=2, base_sequence=9
    ) + encode_batch(sample(10, 2), base_offset=10, compression=Compression.ZSTD)
    cols = segment_columns(data)
    for b, info in enumerate(scan_batches(data)):
        assert cols.batch_header(b) == info.header
        assert cols.records_area_pos[b] == info.position + RECORD_BATCH_OVERHEAD
    assert cols.valid_bytes == len(data)
    assert cols.producer_id.tolist() == [5, -1]


def test_uncompressed_positions_point_into_the_segment() -> None:
    """For uncompressed batches, positions index the segment buffer itself."""
    records = sample(0, 6)
    data = encode_batch(records, base_offset=0)
    cols = segment_columns(data)
    for i, r in enumerate(records):
        p, n = int(cols.key_pos[i]), int(cols.key_len[i])
        assert (None if n < 0 else data[p : p + n]) == r.key
    ends = cols.record_pos + cols.record_size
    assert cols.record_pos[0] == RECORD_BATCH_OVERHEAD
    assert ends[-1] == len(data)
    assert (ends[:-1] == cols.record_pos[1:]).all()


def test_log_append_time_rows_take_the_batch_timestamp() -> None:
    """LogAppendTime batches give every record the batch maxTimestamp."""
    data = encode_batch(
        sample(0, 4), base_offset=0, timestamp_type=TimestampType.LOG_APPEND_TIME, max_timestamp=9
    )
    assert segment_columns(data).timestamp.tolist() == [9, 9, 9, 9]


def test_real_broker_files() -> None:
    """The broker-written fixtures decode to the pure decoder's records."""
    for path in FIXTURES.rglob("*.log"):
        data = path.read_bytes()
        assert rows_as_records(data) == decoded(data)


def test_reads_an_mmap_with_start_and_end(tmp_path: Path) -> None:
    """An mmap of a segment works, and start/end select whole batches."""
    first = encode_batch(sample(0, 3), base_offset=0)
    second = encode_batch(sample(3, 3), base_offset=3, compression=Compression.LZ4)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(first + second + first)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        cols = segment_columns(m, start=len(first), end=len(first) + len(second))
        assert cols.offset.tolist() == [3, 4, 5]
        assert cols.batch_position.tolist() == [len(first)]
        del cols


def test_empty_input() -> None:
    """No bytes, no rows."""
    cols = segment_columns(b"")
    assert (cols.num_batches, cols.num_records, cols.valid_bytes) == (0, 0, 0)


def test_empty_batches_have_no_rows() -> None:
    """Retained empty batches appear in the batch table only."""
    from cleanerd.records.batch import encode_empty_batch

    data = encode_empty_batch(base_offset=0, last_offset_delta=4, max_timestamp=1) + encode_batch(
        sample(5, 2), base_offset=5
    )
    cols = segment_columns(data)
    assert cols.records_count.tolist() == [0, 2]
    assert cols.batch_first_record.tolist() == [0, 0]
    assert cols.offset.tolist() == [5, 6]


@pytest.mark.parametrize(
    ("library", "magic", "codec"),
    [
        ("aiokafka", 1, 0),
        ("aiokafka", 1, 2),
        ("kafka-python", 0, 1),
        ("kafka-python", 0, 3),
        ("aiokafka", 0, 0),
    ],
)
def test_legacy_entries_mixed_with_v2(library: str, magic: int, codec: int) -> None:
    """Legacy messages and wrappers become rows like v2 records, in file order."""
    legacy = build_legacy(library, magic, codec, sample(10, 4))
    data = (
        encode_batch(sample(0, 10), base_offset=0)
        + legacy
        + encode_batch(sample(14, 3), base_offset=14, compression=Compression.GZIP)
    )
    got = rows_as_records(data)
    want = decoded(data)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in got] == [
        (r.offset, r.timestamp, r.key, r.value) for r in want
    ]
    cols = segment_columns(data)
    legacy_rows = np.flatnonzero(cols.batch_magic != 2)
    assert cols.base_offset[legacy_rows[0]] == 10
    assert (cols.header_count[10:14] == 0).all()


def test_record_columns_over_concatenated_areas() -> None:
    """record_columns decodes several records areas back to back, with deltas."""
    a = encode_batch(sample(0, 5), base_offset=0)[RECORD_BATCH_OVERHEAD:]
    b = encode_batch(sample(20, 4, ts=50), base_offset=18)[RECORD_BATCH_OVERHEAD:]
    cols = record_columns(a + b)
    assert len(cols) == 9
    assert cols.offset_delta.tolist() == [0, 1, 2, 3, 4, 2, 3, 4, 5]
    assert cols.timestamp_delta.tolist()[:3] == [0, -2, 6]
    assert cols.key_len.tolist()[:2] == [2, -1]
    assert record_columns(a + b, start=len(a)).record_pos.tolist()[0] == len(a)


def test_record_columns_count_mismatch() -> None:
    """A declared record count that disagrees with the area is corrupt."""
    area = encode_batch(sample(0, 5), base_offset=0)[RECORD_BATCH_OVERHEAD:]
    with pytest.raises(CorruptRecordError, match="holds 5 records, 6 declared"):
        record_columns(area, count=6)


def patched(data: bytes, at: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


def test_errors_name_the_batch_like_the_scan() -> None:
    """CRC, truncation and magic errors report the batch position and scan's message."""
    first = encode_batch(sample(0, 3), base_offset=0)
    second = encode_batch(sample(3, 3), base_offset=3)
    data = first + second
    flipped = patched(data, len(first) + 70, ">B", data[len(first) + 70] ^ 1)
    for bad, message, position in [
        (flipped, "CRC mismatch", len(first)),
        (data[:-5], "runs past the end", len(first)),
        (patched(data, len(first) + 16, ">b", 9), "unexpected magic 9", len(first)),
        (data + b"\x00" * 5, "incomplete batch header", len(data)),
    ]:
        with pytest.raises(CorruptRecordError, match=message) as info:
            segment_columns(bad)
        assert info.value.position == position


def test_malformed_record_names_its_byte() -> None:
    """A bad key length in an uncompressed batch is reported at the record's position,
    with the offset its batch's header names, as a batch the walk refuses is."""
    data = encode_batch(sample(500, 2), base_offset=500) + encode_batch(
        sample(502, 3), base_offset=502
    )
    cols = segment_columns(data)
    second = int(cols.record_pos[3])
    key_len_at = int(cols.key_pos[3]) - 1  # the second record has a null key: 1-byte length
    bad = patched(data, key_len_at, ">B", encode_varint(100)[0])
    with pytest.raises(CorruptRecordError, match="key length") as info:
        segment_columns(bad, verify_crc=False)
    assert info.value.position == second
    assert info.value.reason.endswith("(its header names offset 502)")


def test_malformed_compressed_record_names_batch_and_inner_byte() -> None:
    """Inside compressed data the batch position and the decompressed byte are named."""
    from cleanerd.records.batch import _assemble
    from cleanerd.records.compression import compress

    good = encode_batch(sample(0, 1), base_offset=0)
    area = compress(Compression.SNAPPY, bytes([8, 0, 0, 0, 0x7E, 1, 2, 3, 4]))
    bad_header = dataclasses.replace(
        unpack_header(good), base_offset=1, attributes=int(Compression.SNAPPY)
    )
    data = good + _assemble(bad_header, area)
    with pytest.raises(
        CorruptRecordError,
        match=r"key length .*byte 0 of the decompressed records\) \(its header names offset 1\)$",
    ) as info:
        segment_columns(data)
    assert info.value.position == len(good)


def test_impossible_record_count_is_refused_before_allocating() -> None:
    """recordsCount far beyond what the bytes can hold is corrupt (no huge allocation)."""
    data = encode_batch(sample(0, 2), base_offset=0, last_offset_delta=2**31 - 2)
    bad = patched(data, 57, ">i", 2**31 - 1)
    with pytest.raises(CorruptRecordError, match=r"cannot fit .*names offset 0"):
        segment_columns(bad, verify_crc=False)


def test_trailing_bytes_in_a_batch() -> None:
    """A records area with bytes after the declared records is corrupt."""
    data = encode_batch(sample(0, 3), base_offset=0)
    with pytest.raises(CorruptRecordError, match="bytes follow the last record"):
        segment_columns(patched(data, 57, ">i", 2), verify_crc=False)


batch_specs = st.tuples(
    st.integers(1, 30),  # records
    st.sampled_from(list(Compression)),
    st.sampled_from([None, 2_000_000]),  # delete horizon
    st.sampled_from(list(TimestampType)),
    st.integers(0, 3),  # gap after the batch
)


@settings(deadline=None, max_examples=40)
@given(st.lists(batch_specs, min_size=1, max_size=6), st.randoms(use_true_random=False))
def test_columns_agree_with_pure_decoder_on_random_segments(
    specs: list[tuple[int, Compression, int | None, TimestampType, int]], rnd: object
) -> None:
    """Random segments of every codec decode identically in both decoders."""
    parts = []
    offset = 0
    for n, codec, horizon, ts_type, gap in specs:
        records = sample(offset, n, ts=1_000 + offset)
        parts.append(
            encode_batch(
                records,
                base_offset=offset,
                compression=codec,
                delete_horizon_ms=horizon,
                timestamp_type=ts_type,
            )
        )
        offset += n + gap
    data = b"".join(parts)
    assert rows_as_records(data) == decoded(data)
    assert [r for i in scan_batches(data) for r in decode_batch(data, i.position).records] == (
        decoded(data)
    )


extreme_records = st.lists(
    st.tuples(
        st.integers(-(2**61), 2**61),
        st.none() | st.binary(max_size=300),
        st.none() | st.binary(max_size=300),
        st.lists(
            st.builds(RecordHeader, st.text(max_size=5), st.none() | st.binary(max_size=9)),
            max_size=3,
        ),
    ),
    min_size=1,
    max_size=8,
)


@settings(deadline=None, max_examples=60)
@given(
    extreme_records,
    st.sampled_from(list(Compression)),
    st.none() | st.integers(-(2**61), 2**61),
    st.integers(0, 2**62),
)
def test_extreme_varints_agree(
    bodies: list[tuple[int, bytes | None, bytes | None, list[RecordHeader]]],
    codec: Compression,
    horizon: int | None,
    base: int,
) -> None:
    """Long varlong timestamp deltas, big lengths and odd headers decode alike."""
    records = [
        Record(base + 7 * i, ts, key, value, tuple(headers))
        for i, (ts, key, value, headers) in enumerate(bodies)
    ]
    data = encode_batch(records, base_offset=base, compression=codec, delete_horizon_ms=horizon)
    assert rows_as_records(data) == decoded(data) == records


@pytest.mark.parametrize("codec", [c for c in Compression if c is not Compression.NONE])
def test_side_buffer_grows_for_highly_compressed_batches(codec: Compression) -> None:
    """Batches that expand far beyond the initial side buffer still decode in full."""
    records = [Record(i, i, b"k%d" % i, bytes([i]) * 150_000) for i in range(4)]
    data = encode_batch(records[:2], base_offset=0, compression=codec) + encode_batch(
        records[2:], base_offset=2, compression=codec
    )
    cols = segment_columns(data)
    assert len(cols.side) > 600_000 > 10 * len(data)
    assert [cols.value(i) for i in range(4)] == [r.value for r in records]


def _one_record_batches(count: int, codec: Compression) -> list[bytes]:
    return [_one_record_batch(i, codec) for i in range(count)]


def _one_record_batch(i: int, codec: Compression = Compression.NONE) -> bytes:
    record = Record(i, 1_000 + i, b"k%d" % i, b"v" * 30)
    return encode_batch([record], base_offset=i, compression=codec)


def _with_area(batch: bytes, area: bytes) -> bytes:
    from cleanerd.records.batch import _assemble

    return _assemble(unpack_header(batch), area)


def test_zstd_batches_of_every_writer_decode_through_one_context(
    codec_calls: list[str],
) -> None:
    """One-record zstd batches: frames with their content size (librdkafka, the Python
    clients, cleanerd), frames without it (Kafka's Java client streams them), and a
    batch of two frames. All decode, and only the two-frame batch needs the codec
    library's own call."""
    import zstandard

    batches = _one_record_batches(200, Compression.ZSTD)
    unsized = zstandard.ZstdCompressor(write_content_size=False)
    area = _one_record_batch(50)[RECORD_BATCH_OVERHEAD:]
    batches[50] = _with_area(batches[50], unsized.compress(area))
    area = _one_record_batch(120)[RECORD_BATCH_OVERHEAD:]
    two = b"".join(zstandard.ZstdCompressor().compress(a) for a in (area[:10], area[10:]))
    batches[120] = _with_area(batches[120], two)
    cols = segment_columns(b"".join(batches))
    assert cols.offset.tolist() == list(range(200))
    assert [cols.key(i) for i in (0, 50, 120, 199)] == [b"k0", b"k50", b"k120", b"k199"]
    assert codec_calls.count("decompress_into") == 1


def test_a_cut_zstd_frame_is_named_at_its_batch() -> None:
    """A zstd frame cut short among good ones: its batch is named, with the library's
    reason, and nothing after it is read as records."""
    batches = _one_record_batches(5, Compression.ZSTD)
    area = batches[3][RECORD_BATCH_OVERHEAD:]
    batches[3] = _with_area(batches[3], area[:-3])
    with pytest.raises(CorruptRecordError, match="cannot decompress zstd data") as info:
        segment_columns(b"".join(batches), verify_crc=False)
    assert info.value.position == sum(map(len, batches[:3]))


@pytest.mark.parametrize(
    "codec", [Compression.GZIP, Compression.SNAPPY, Compression.ZSTD], ids=lambda c: c.name
)
def test_one_record_batches_are_decompressed_a_run_at_a_time(
    codec: Compression, codec_calls: list[str]
) -> None:
    """A segment of one-record batches needs no call per batch into the codec layer; a
    gzip batch of two members (Java's reader takes them) goes the general way."""
    import gzip

    batches = _one_record_batches(300, codec)
    expected_calls = 0
    if codec is Compression.GZIP:
        area = _one_record_batch(7)[RECORD_BATCH_OVERHEAD:]
        batches[7] = _with_area(batches[7], gzip.compress(area[:9]) + gzip.compress(area[9:]))
        expected_calls = 1
    cols = segment_columns(b"".join(batches))
    assert cols.offset.tolist() == list(range(300))
    assert [cols.key(i) for i in (0, 7, 299)] == [b"k0", b"k7", b"k299"]
    assert codec_calls.count("decompress_into") == expected_calls
