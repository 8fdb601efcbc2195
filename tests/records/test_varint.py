"""Tests for cleanerd.records.varint: zig-zag varint/varlong vectors, bounds, round trips."""

from __future__ import annotations

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.errors import CorruptRecordError
from cleanerd.records.varint import (
    decode_varint,
    decode_varlong,
    encode_varint,
    encode_varlong,
    size_of_varint,
)

VARINT_VECTORS = [
    (0, "00"),
    (-1, "01"),
    (1, "02"),
    (-2, "03"),
    (63, "7e"),
    (-64, "7f"),
    (64, "8001"),
    (-65, "8101"),
    (300, "d804"),
    (2**31 - 1, "feffffff0f"),
    (-(2**31), "ffffffff0f"),
]
VARLONG_VECTORS = [
    *VARINT_VECTORS,
    (2**31, "8080808010"),
    (2**63 - 1, "feffffffffffffffff01"),
    (-(2**63), "ffffffffffffffffff01"),
]


@pytest.mark.parametrize(("value", "hexed"), VARINT_VECTORS)
def test_varint_vectors(value: int, hexed: str) -> None:
    """Known zig-zag varint encodings, both directions."""
    assert encode_varint(value).hex() == hexed
    assert decode_varint(bytes.fromhex(hexed), 0) == (value, len(hexed) // 2)
    assert size_of_varint(value) == len(hexed) // 2


@pytest.mark.parametrize(("value", "hexed"), VARLONG_VECTORS)
def test_varlong_vectors(value: int, hexed: str) -> None:
    """Known zig-zag varlong encodings, both directions."""
    assert encode_varlong(value).hex() == hexed
    assert decode_varlong(bytes.fromhex(hexed), 0) == (value, len(hexed) // 2)


def test_crc32c_vectors() -> None:
    """CRC-32C (Castagnoli) known values: empty, "a", the standard check string."""
    assert crc32c.crc32c(b"") == 0
    assert crc32c.crc32c(b"a") == 0xC1D04330
    assert crc32c.crc32c(b"123456789") == 0xE3069283


@pytest.mark.parametrize(
    ("hexed", "decoder", "message"),
    [
        ("808080808000", decode_varint, "longer than 5 bytes"),
        ("ffffffff1f", decode_varint, "does not fit in an int32"),
        ("80", decode_varint, "runs past the end"),
        ("8080808080808080808000", decode_varlong, "longer than 10 bytes"),
        ("ffffffffffffffffff03", decode_varlong, "does not fit in an int64"),
        ("", decode_varlong, "runs past the end"),
    ],
)
def test_bad_varints(hexed: str, decoder: object, message: str) -> None:
    """Over-long, overflowing or truncated varints are corrupt, at their start position."""
    data = b"\x00\x00" + bytes.fromhex(hexed)
    with pytest.raises(CorruptRecordError, match=message) as info:
        decoder(data, 2)  # type: ignore[operator]
    assert info.value.position == 2


def test_decode_stops_at_end() -> None:
    """`end` bounds the read even when the buffer continues."""
    with pytest.raises(CorruptRecordError):
        decode_varint(bytes.fromhex("d804"), 0, 1)


@pytest.mark.parametrize(("encode", "bits"), [(encode_varint, 32), (encode_varlong, 64)])
def test_out_of_range_values_are_refused(encode: object, bits: int) -> None:
    """Values outside int32/int64 cannot be encoded."""
    for value in (2 ** (bits - 1), -(2 ** (bits - 1)) - 1):
        with pytest.raises(ValueError, match="does not fit"):
            encode(value)  # type: ignore[operator]


@settings(deadline=None, max_examples=300)
@given(st.integers(-(2**31), 2**31 - 1), st.binary(max_size=4))
def test_varint_round_trip(value: int, tail: bytes) -> None:
    """Every int32 round-trips and the decoder returns the position after it."""
    data = encode_varint(value) + tail
    assert decode_varint(data, 0) == (value, len(data) - len(tail))


@settings(deadline=None, max_examples=300)
@given(st.integers(-(2**63), 2**63 - 1))
def test_varlong_round_trip(value: int) -> None:
    """Every int64 round-trips through the varlong encoding."""
    data = encode_varlong(value)
    assert len(data) <= 10
    assert decode_varlong(data, 0) == (value, len(data))
