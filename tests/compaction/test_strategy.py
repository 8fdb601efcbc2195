"""Tests for KIP-280 strategy resolution, version extraction and the winner rules."""

from __future__ import annotations

import numpy as np
import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.compaction.keyhash import hash_key
from cleanerd.compaction.offset_map import OffsetMap
from cleanerd.compaction.strategy import (
    CompactionStrategy,
    ResolvedStrategy,
    header_versions,
    record_versions,
    resolve_strategy,
    timestamp_versions,
)
from cleanerd.errors import ConfigError, CorruptRecordError

Header = tuple[bytes, bytes | None]


def varint(n: int) -> bytes:
    """Kafka's zig-zag varint."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        b = z & 0x7F
        z >>= 7
        if z:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def header_area(headers: list[Header]) -> bytes:
    """The header bytes of one record (after its header-count varint)."""
    out = bytearray()
    for key, value in headers:
        out += varint(len(key)) + key
        out += varint(-1) if value is None else varint(len(value)) + value
    return bytes(out)


def long_be(v: int) -> bytes:
    return v.to_bytes(8, "big", signed=True)


def versions_of(records: list[list[Header]], name: bytes = b"v") -> list[int | None]:
    """The version of each record under the header strategy, None when absent."""
    areas = [header_area(h) for h in records]
    buf = b"".join(areas)
    ends = np.cumsum([len(a) for a in areas], dtype=np.int64)
    starts = ends - [len(a) for a in areas]
    versions, has = header_versions(
        np.frombuffer(buf, np.uint8), starts, np.array([len(h) for h in records]), name, ends
    )
    return [int(v) if h else None for v, h in zip(versions, has, strict=True)]


# -- resolution ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "header", "expected"),
    [
        ("offset", None, ResolvedStrategy(CompactionStrategy.OFFSET)),
        ("", None, ResolvedStrategy(CompactionStrategy.OFFSET)),
        ("timestamp", "ignored", ResolvedStrategy(CompactionStrategy.TIMESTAMP)),
        ("header", "version", ResolvedStrategy(CompactionStrategy.HEADER, header=b"version")),
        (
            "header",
            "vérsion",
            ResolvedStrategy(CompactionStrategy.HEADER, header="vérsion".encode()),
        ),
    ],
)
def test_resolve(name: str, header: str | None, expected: ResolvedStrategy) -> None:
    """Names resolve to strategies; an empty name means offset; the header key is UTF-8."""
    assert resolve_strategy(name, header) == expected


@pytest.mark.parametrize("header", [None, "", "  "])
def test_header_strategy_without_header_name_falls_back_with_warning(header: str | None) -> None:
    """header with an unset or blank header name compacts by offset and says so."""
    resolved = resolve_strategy("header", header)
    assert resolved.strategy is CompactionStrategy.OFFSET
    assert not resolved.versioned
    assert resolved.warning is not None
    assert "compaction.strategy.header" in resolved.warning


def test_unknown_strategy_is_a_config_error() -> None:
    """An unknown strategy name is refused, naming the key and the value."""
    with pytest.raises(ConfigError, match=r"'Offset' for configuration compaction\.strategy:"):
        resolve_strategy("Offset", None)


# -- header versions ------------------------------------------------------------------------


def test_header_value_is_big_endian_signed_long() -> None:
    """An 8-byte value is read as a big-endian signed long, including negative extremes."""
    values = [0, 1, 258, -1, 2**63 - 1, -(2**63)]
    assert versions_of([[(b"v", long_be(x))] for x in values]) == values


def test_last_occurrence_of_a_duplicated_header_counts() -> None:
    """With the header repeated, the last occurrence gives the version."""
    records: list[list[Header]] = [
        [(b"v", long_be(9)), (b"other", b"x"), (b"v", long_be(3))],
        [(b"v", long_be(9)), (b"v", None)],
        [(b"v", long_be(9)), (b"v", b"1234567")],
        [(b"v", b"123456789"), (b"v", long_be(4))],
    ]
    assert versions_of(records) == [3, None, None, 4]


@pytest.mark.parametrize(
    "value", [None, b"", b"1234567", b"123456789"], ids=["null", "empty", "7-bytes", "9-bytes"]
)
def test_value_that_is_not_8_bytes_counts_as_absent(value: bytes | None) -> None:
    """A null value or one of any length but 8 gives no version."""
    assert versions_of([[(b"v", value)]]) == [None]


def test_header_name_must_match_exactly() -> None:
    """Other header keys, prefixes and extensions of the name, and no headers give none."""
    records: list[list[Header]] = [
        [(b"ver", long_be(1))],
        [(b"version2", long_be(1))],
        [],
        [(b"Version", long_be(1))],
    ]
    assert versions_of(records, b"version") == [None, None, None, None]
    assert versions_of([[(b"version", long_be(7))]], b"version") == [7]


def test_header_versions_of_records_built_by_aiokafka() -> None:
    """Header areas located inside a batch that aiokafka built decode to the right versions."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=0, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    headers = [[("v", long_be(5))], [], [("a", b"x"), ("v", long_be(-2))]]
    for i, h in enumerate(headers):
        builder.append(i, timestamp=1000 + i, key=b"k%d" % i, value=b"value", headers=h)
    batch = bytes(builder.build())
    starts, counts = _locate_headers(batch)
    versions, has = header_versions(np.frombuffer(batch, np.uint8), starts, counts, b"v")
    assert has.tolist() == [True, False, True]
    assert versions[has].tolist() == [5, -2]


def _locate_headers(batch: bytes) -> tuple[list[int], list[int]]:
    """Walk an uncompressed v2 batch's records to each header area (test-only parser)."""
    starts, counts, pos = [], [], 61
    while pos < len(batch):
        length, pos = _read_varint(batch, pos)
        end = pos + length
        pos += 1  # attributes
        for _ in range(2):  # timestampDelta, offsetDelta
            _, pos = _read_varint(batch, pos)
        for _ in range(2):  # key, value
            n, pos = _read_varint(batch, pos)
            pos += max(n, 0)
        count, pos = _read_varint(batch, pos)
        starts.append(pos)
        counts.append(count)
        pos = end
    return starts, counts


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    raw, shift = 0, 0
    while True:
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos


@pytest.mark.parametrize(
    ("area", "count", "reason", "position"),
    [
        (varint(5) + b"ab", 1, "past the end", 1),
        (varint(1) + b"v" + varint(8) + b"1234", 1, "past the end", 3),
        (varint(1) + b"v", 1, "past the end", 2),
        (varint(-1), 1, "negative header key length", 0),
        (varint(1) + b"v" + varint(-2), 1, "value length below -1", 2),
        (b"\xff\xff\xff\xff\xff\x01", 1, "longer than 5 bytes", 0),
        (b"\x80", 1, "past the end", 0),
        (b"", -1, "negative header count", 0),
        (header_area([(b"v", long_be(1))]), 2, "past the end", 11),
    ],
    ids=[
        "key-truncated", "value-truncated", "value-length-missing", "null-key",
        "bad-value-length", "long-varint", "varint-truncated", "negative-count", "count-too-high",
    ],
)  # fmt: skip
def test_malformed_header_area_raises_with_position(
    area: bytes, count: int, reason: str, position: int
) -> None:
    """Malformed header data raises CorruptRecordError naming the record and byte position."""
    prefix = b"\x00" * 3  # positions are within the buffer, not the header area
    buf = np.frombuffer(prefix + area + b"\x7f\x7f", np.uint8)
    with pytest.raises(CorruptRecordError, match=reason) as info:
        header_versions(
            buf, np.array([0, 3]), np.array([0, count]), b"v", np.array([3, 3 + len(area)])
        )
    assert info.value.position == position + 3
    assert info.value.reason.startswith("record 1:")


def test_header_area_outside_buffer_raises() -> None:
    """A header area that ends past the buffer is refused rather than read; a record with
    no headers (a legacy record has no header area: position -1) has no version."""
    with pytest.raises(CorruptRecordError, match="outside the buffer"):
        header_versions(np.zeros(4, np.uint8), np.array([2]), np.array([1]), b"v", np.array([5]))
    versions, has = header_versions(
        np.zeros(4, np.uint8), np.array([-1]), np.array([0]), b"v", np.array([-1])
    )
    assert (versions.tolist(), has.tolist()) == ([0], [False])


# -- timestamp versions and dispatch ------------------------------------------------------


def test_timestamp_versions_use_batch_max_for_log_append_time() -> None:
    """CreateTime records version by their timestamp, LogAppendTime ones by the batch max."""
    versions, has = timestamp_versions(
        np.array([10, 20, 30]), np.array([99, 99, 50]), np.array([False, True, False])
    )
    assert versions.tolist() == [10, 99, 30]
    assert has.all()


def test_record_versions_dispatch() -> None:
    """record_versions gives None for offset and the strategy's columns otherwise."""
    area = header_area([(b"v", long_be(6))])
    columns = {
        "timestamps": np.array([1]),
        "batch_max_timestamps": np.array([2]),
        "log_append_time": np.array([True]),
        "buf": np.frombuffer(area, np.uint8),
        "headers_pos": np.array([0]),
        "header_count": np.array([1]),
    }
    assert record_versions(resolve_strategy("offset", None), **columns) is None
    by_time = record_versions(resolve_strategy("timestamp", None), **columns)
    assert by_time is not None
    assert by_time[0].tolist() == [2]
    by_header = record_versions(resolve_strategy("header", "v"), **columns)
    assert by_header is not None
    assert by_header[0].tolist() == [6]
    with pytest.raises(ValueError, match="timestamp strategy needs"):
        record_versions(resolve_strategy("timestamp", None), buf=columns["buf"])
    with pytest.raises(ValueError, match="header strategy needs"):
        record_versions(resolve_strategy("header", "v"), timestamps=columns["timestamps"])


# -- the KIP-280 winner rules, end to end through the offset map ----------------------------


def winner(records: list[list[Header]], strategy: str = "header") -> int:
    """The offset of the surviving record when records 0..n-1 share one key."""
    resolved = resolve_strategy(strategy, "v")
    offset_map = OffsetMap(1 << 12, strategy=resolved.strategy)
    n = len(records)
    hashes = np.array([hash_key(b"key")] * n, dtype=np.uint64)
    offsets = np.arange(n)
    areas = [header_area(h) for h in records]
    ends = np.cumsum([len(a) for a in areas])
    columns = record_versions(
        resolved,
        buf=np.frombuffer(b"".join(areas), np.uint8),
        headers_pos=ends - [len(a) for a in areas],
        header_count=np.array([len(h) for h in records]),
        headers_end=ends,
    )
    versions, has = columns if columns is not None else (None, None)
    assert offset_map.put_many(hashes, offsets, versions, has) == n
    kept = np.flatnonzero(offset_map.keep_mask(hashes, offsets))
    assert kept.size == 1
    return int(kept[0])


def v(x: int) -> list[Header]:
    return [(b"v", long_be(x))]


def test_highest_version_wins() -> None:
    """The record with the highest header version survives, whatever its offset."""
    assert winner([v(1), v(7), v(3)]) == 1
    assert winner([v(-5), v(-9)]) == 0


def test_equal_versions_keep_highest_offset() -> None:
    """Among equal versions the highest offset survives."""
    assert winner([v(7), v(7), v(2)]) == 1


def test_record_with_header_beats_record_without() -> None:
    """A record with a usable header beats later records without one, even with version -1."""
    assert winner([v(-1), [], [(b"v", b"short")], [(b"v", None)]]) == 0
    assert winner([[], v(0), []]) == 1


def test_neither_with_header_keeps_highest_offset() -> None:
    """Without any usable header the highest offset survives, as with the offset strategy."""
    assert winner([[], [(b"other", long_be(9))], [(b"v", b"1234567")]]) == 2


def test_fallback_strategy_keeps_highest_offset() -> None:
    """The header strategy with no header name behaves as offset: the newest record wins."""
    resolved = resolve_strategy("header", "")
    offset_map = OffsetMap(1 << 12, strategy=resolved.strategy)
    hashes = np.array([hash_key(b"key")] * 3, dtype=np.uint64)
    offset_map.put_many(hashes, np.arange(3))
    assert offset_map.keep_mask(hashes, np.arange(3)).tolist() == [False, False, True]


@settings(deadline=None, max_examples=100)
@given(st.lists(st.one_of(st.none(), st.integers(-3, 3)), min_size=1, max_size=12))
def test_header_winner_matches_the_rules(raw: list[int | None]) -> None:
    """For any run of one key's records the survivor is the KIP-280 winner."""
    records = [[] if x is None else v(x) for x in raw]
    with_version = [(x, i) for i, x in enumerate(raw) if x is not None]
    expected = max(with_version)[1] if with_version else len(raw) - 1
    assert winner(records) == expected
