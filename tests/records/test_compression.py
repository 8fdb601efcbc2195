"""Tests for cleanerd.records.compression: Kafka's framings for each codec, and errors."""

from __future__ import annotations

import gzip
import os
import struct

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.errors import CorruptRecordError
from cleanerd.records.compression import (
    LZ4_MAGIC,
    XERIAL_HEADER,
    compress,
    decompress,
    xxhash32,
)
from cleanerd.records.header import Compression

PAYLOADS = {
    "empty": b"",
    "small": b"hello kafka",
    "blocks": (os.urandom(50_000) + b"z" * 100_000) * 2,  # several 32/64 KiB blocks
    "random": os.urandom(70_000),  # incompressible: LZ4 stores the first block raw
}


@pytest.mark.parametrize("codec", list(Compression), ids=lambda c: c.name.lower())
@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_round_trip(codec: Compression, name: str) -> None:
    """Every codec decompresses what it compressed."""
    assert decompress(codec, compress(codec, PAYLOADS[name])) == PAYLOADS[name]


def test_xxhash32_vectors() -> None:
    """XXH32 of published inputs (used for the LZ4 header checksum)."""
    assert xxhash32(b"") == 0x02CC5D05
    assert xxhash32(b"a") == 0x550D7456
    assert xxhash32(b"abcdefghijklmnopqrstuvwxyz0123456789") == 0x42AE804D


def test_snappy_writes_xerial_framing_in_32k_blocks() -> None:
    """Snappy output is snappy-java's stream: magic, version 1, compat 1, 32 KiB blocks."""
    data = PAYLOADS["blocks"]
    out = compress(Compression.SNAPPY, data)
    assert out[:16] == b"\x82SNAPPY\x00" + b"\x00\x00\x00\x01" * 2 == XERIAL_HEADER
    pos, raw = 16, []
    while pos < len(out):
        (n,) = struct.unpack_from(">i", out, pos)
        block = bytes(cramjam.snappy.decompress_raw(out[pos + 4 : pos + 4 + n]))
        assert len(block) <= 32 * 1024
        raw.append(block)
        pos += 4 + n
    assert b"".join(raw) == data
    assert all(len(b) == 32 * 1024 for b in raw[:-1])


def test_snappy_reads_a_raw_block() -> None:
    """A plain raw snappy block (no xerial header) also decompresses."""
    raw = bytes(cramjam.snappy.compress_raw(b"abc" * 1000))
    assert decompress(Compression.SNAPPY, raw) == b"abc" * 1000


@pytest.mark.parametrize("name", ["blocks", "random"])
def test_lz4_writes_kafka_frames(name: str) -> None:
    """LZ4 output: frame magic, FLG 0x60 (independent blocks, no checksums), BD 64 KiB,
    header checksum, blocks that each decompress alone, end mark."""
    data = PAYLOADS[name]
    out = compress(Compression.LZ4, data)
    assert out[:4] == LZ4_MAGIC
    assert out[4:6] == b"\x60\x40"
    assert out[6] == (xxhash32(b"\x60\x40") >> 8) & 0xFF
    pos, raw = 7, []
    while True:
        (n,) = struct.unpack_from("<I", out, pos)
        pos += 4
        if n == 0:
            break
        size = n & 0x7FFFFFFF
        block = out[pos : pos + size]
        if n & 0x80000000:
            raw.append(block)
        else:
            expected = min(64 * 1024, len(data) - 64 * 1024 * len(raw))
            raw.append(bytes(cramjam.lz4.decompress_block(block, output_len=expected))[:expected])
        pos += size
    assert pos == len(out)
    assert b"".join(raw) == data


def test_lz4_reads_kafkas_legacy_header_checksum() -> None:
    """A frame whose header checksum covers the magic too (Kafka's magic-0 bug) is read."""
    out = bytearray(compress(Compression.LZ4, b"legacy" * 100))
    out[6] = (xxhash32(bytes(out[:6])) >> 8) & 0xFF
    assert decompress(Compression.LZ4, bytes(out)) == b"legacy" * 100


def test_lz4_rejects_a_wrong_header_checksum() -> None:
    """Any other header checksum is corruption."""
    out = bytearray(compress(Compression.LZ4, b"x" * 100))
    out[6] ^= 0x55
    with pytest.raises(CorruptRecordError, match="header checksum"):
        decompress(Compression.LZ4, bytes(out))


def test_lz4_reads_frames_from_the_lz4_library() -> None:
    """Frames written by python-lz4 with checksums and linked blocks are read, and
    python-lz4 reads ours."""
    lz4frame = pytest.importorskip("lz4.frame")
    data = PAYLOADS["blocks"]
    theirs = lz4frame.compress(data, block_linked=True, content_checksum=True, store_size=True)
    assert decompress(Compression.LZ4, theirs) == data
    assert lz4frame.decompress(compress(Compression.LZ4, data)) == data


def test_gzip_is_deterministic_and_reads_concatenated_members() -> None:
    """gzip output does not depend on the clock; concatenated members are read in order."""
    assert compress(Compression.GZIP, b"abc") == compress(Compression.GZIP, b"abc")
    assert gzip.decompress(compress(Compression.GZIP, b"abc")) == b"abc"
    two = gzip.compress(b"first ") + gzip.compress(b"second")
    assert decompress(Compression.GZIP, two) == b"first second"


def test_zstd_reads_the_zstandard_library() -> None:
    """A frame from the zstandard library decompresses, and it reads ours."""
    zstd = pytest.importorskip("zstandard")
    data = PAYLOADS["blocks"]
    assert decompress(Compression.ZSTD, zstd.ZstdCompressor(level=3).compress(data)) == data
    ours = compress(Compression.ZSTD, data)
    assert zstd.ZstdDecompressor().decompress(ours, max_output_size=len(data)) == data


@pytest.mark.parametrize(
    "codec", [c for c in Compression if c is not Compression.NONE], ids=lambda c: c.name.lower()
)
def test_garbage_is_corrupt(codec: Compression) -> None:
    """Bytes that are not a stream of the codec raise CorruptRecordError naming the codec."""
    good = compress(codec, b"payload " * 100)
    with pytest.raises(CorruptRecordError, match="decompress"):
        decompress(codec, good[: len(good) // 2] + b"\xff" * 7)


def test_truncated_xerial_block_is_corrupt() -> None:
    """A xerial block length running past the data is named."""
    out = compress(Compression.SNAPPY, b"abc" * 100)
    with pytest.raises(CorruptRecordError, match="runs past the end"):
        decompress(Compression.SNAPPY, out[:-3])


def test_unknown_codec_id_is_corrupt() -> None:
    """Codec ids 5-7 are not defined by Kafka."""
    with pytest.raises(CorruptRecordError, match="unknown compression codec id 5"):
        decompress(5, b"")


@settings(deadline=None, max_examples=60)
@given(st.binary(max_size=3000), st.sampled_from(list(Compression)))
def test_round_trip_property(data: bytes, codec: Compression) -> None:
    """Arbitrary bytes survive every codec."""
    assert decompress(codec, compress(codec, data)) == data
