"""Tests of `cleanerd.records.compiled_encoders`: the areas a pass rewrites, compressed
in one compiled call, in the framing the codec layer writes."""

from __future__ import annotations

import gzip
import itertools
from unittest import mock

import lz4.frame
import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.records import compiled_codecs, compiled_encoders, zlib_streams
from cleanerd.records.compiled_encoders import LZ4_HEADER, compress_areas
from cleanerd.records.compression import compress, decompress
from cleanerd.records.header import Compression

ZSTD, LZ4, GZIP = int(Compression.ZSTD), int(Compression.LZ4), int(Compression.GZIP)


def _areas(sizes: list[int], noise: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Areas of `sizes` bytes back to back, compressible text with `noise` bytes in a
    hundred random (incompressible), with their bounds."""
    ends = np.cumsum(np.array(sizes, np.int64))
    starts = ends - np.array(sizes, np.int64)
    total = int(ends[-1])
    text = b"".join(b"key%07d value %d " % (i, i % 7) for i in range(total // 16 + 1))
    data = np.frombuffer(text[:total], np.uint8).copy()
    rng = np.random.default_rng(total)
    mixed = rng.random(total) < noise / 100
    data[mixed] = rng.integers(0, 256, int(mixed.sum()), dtype=np.uint8)
    return data, starts, ends


def _frames(blob: np.ndarray, lengths: np.ndarray) -> list[bytes]:
    assert int(lengths.sum()) == len(blob)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return [blob[a:b].tobytes() for a, b in itertools.pairwise(bounds)]


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([ZSTD, LZ4, GZIP]),
    st.lists(st.integers(min_value=0, max_value=150_000), min_size=1, max_size=12),
    st.integers(min_value=0, max_value=100),
)
def test_areas_compress_in_one_call_to_frames_every_reader_reads(
    codec: int, sizes: list[int], noise: int
) -> None:
    """Every area of an all-zstd, all-LZ4 or all-gzip list is one frame, from one
    compiled call (a codec layer call would fail), the frames back to back; each decodes
    to its area through the codec layer and an independent library, and a gzip stream is
    the codec layer's byte for byte (the same zlib, the same settings). Areas span
    several 64 KiB LZ4 blocks, and random bytes make blocks that LZ4 stores whole."""
    src, starts, ends = _areas(sizes, noise)
    codecs = np.full(len(sizes), codec, np.int64)
    with mock.patch.object(compiled_encoders, "compress", None):
        blob, lengths = compress_areas(src, starts, ends, codecs)
    for frame, begin, end in zip(_frames(blob, lengths), starts, ends, strict=True):
        area = src[begin:end].tobytes()
        assert decompress(Compression(codec), frame) == area
        if codec == ZSTD:
            assert zstandard.ZstdDecompressor().decompress(frame) == area
        elif codec == GZIP:
            assert gzip.decompress(frame) == area
            assert frame == compress(Compression.GZIP, area)
        else:
            assert frame[: len(LZ4_HEADER)] == LZ4_HEADER.tobytes()
            assert frame[-4:] == bytes(4)
            assert lz4.frame.decompress(frame) == area


def test_an_lz4_block_that_does_not_shrink_is_stored_whole() -> None:
    """Random bytes are stored uncompressed (the size word's high bit set), as the codec
    layer stores them: the frame is the codec layer's byte for byte."""
    src = np.random.default_rng(7).integers(0, 256, 70_000, dtype=np.uint8)
    starts, ends = np.array([0], np.int64), np.array([70_000], np.int64)
    blob, _ = compress_areas(src, starts, ends, np.array([LZ4], np.int64))
    assert blob.tobytes() == compress(Compression.LZ4, src.tobytes())


@pytest.mark.parametrize("missing", ["", "libzstd", "liblz4", "zlib"])
def test_other_codecs_and_missing_libraries_go_through_the_codec_layer(
    missing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A list that is not all of one compiled codec, or whose library is not loaded, is
    compressed by the codec layer, area by area, in the same framing."""
    src, starts, ends = _areas([500, 0, 1200, 90])
    codecs = np.array([ZSTD, LZ4, int(Compression.GZIP), int(Compression.SNAPPY)], np.int64)
    if missing == "libzstd":
        monkeypatch.setattr(compiled_codecs, "zstd_compression_context", lambda: 0)
        codecs[:] = ZSTD
    elif missing == "liblz4":
        monkeypatch.setattr(compiled_codecs, "lz4_library", lambda: None)
        codecs[:] = LZ4
    elif missing == "zlib":
        monkeypatch.setattr(zlib_streams, "deflating", lambda: None)
        codecs[:] = GZIP
    blob, lengths = compress_areas(src, starts, ends, codecs)
    for frame, codec, begin, end in zip(_frames(blob, lengths), codecs, starts, ends, strict=True):
        assert frame == compress(Compression(int(codec)), src[begin:end].tobytes())
