"""Tests of cleanerd.records.compiled_codecs: LZ4, snappy and zstd decoded in compiled
code, checked against the codec library (cramjam, zstandard) and data written by several
encoders."""

from __future__ import annotations

import ctypes
import gzip
import struct
import threading
from typing import Any

import cramjam
import lz4.frame
import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.errors import CorruptRecordError
from cleanerd.records import compiled_codecs, zlib_streams
from cleanerd.records.batch import _assemble, encode_batch
from cleanerd.records.columns import segment_columns
from cleanerd.records.compiled_codecs import (
    NEEDS_ROOM,
    OK,
    UNDECODED,
    decompress_areas,
    xxh32,
    zstd_context,
)
from cleanerd.records.compression import (
    LZ4_MAGIC,
    XERIAL_HEADER,
    compress,
    decompress,
    xxhash32,
)
from cleanerd.records.header import RECORD_BATCH_OVERHEAD, Compression, unpack_header
from cleanerd.records.record import Record
from cleanerd.records.zlib_streams import inflating
from tests.tools import run_python

payloads = st.one_of(
    st.binary(max_size=3000),
    st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=20), st.integers(1, 5000)),
)


def kernel(
    frames: list[bytes],
    room: int = 1 << 20,
    codec: Compression = Compression.LZ4,
    dctx: int | None = None,
    native: bool = True,
) -> tuple[int, int, list[bytes]]:
    """(status, area reached, outputs) of one call over `frames` laid end to end (zstd
    with this thread's context unless `dctx` is given; LZ4 blocks through liblz4 unless
    `native` is False)."""
    if dctx is None:
        dctx = zstd_context()
    src = np.frombuffer(b"".join(frames), np.uint8)
    ends = np.cumsum([len(f) for f in frames]).astype(np.int64)
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    dst = np.zeros(room, np.uint8)
    out_start = np.zeros(len(frames), np.int64)
    out_end = np.zeros(len(frames), np.int64)
    codecs = np.full(len(frames), int(codec), np.int64)
    status, reached, _ = (
        int(x)
        for x in decompress_areas(
            src, starts, ends, codecs, dst, 0, out_start, out_end, 0, dctx, inflating(), native
        )
    )
    outputs = [bytes(dst[a:b]) for a, b in zip(out_start[:reached], out_end[:reached], strict=True)]
    return status, reached, outputs


def library(codec: Compression, area: bytes) -> bytes | None:
    """What the codec layer makes of `area`, or None when it refuses it."""
    try:
        return decompress(codec, area)
    except CorruptRecordError:
        return None


def damage(area: bytes, draw: st.DataObject) -> bytes:
    """`area` with one to three bytes changed and up to 8 bytes cut off its end."""
    changed = bytearray(area)
    for _ in range(draw.draw(st.integers(1, 3))):
        changed[draw.draw(st.integers(0, len(changed) - 1))] = draw.draw(st.integers(0, 255))
    return bytes(changed[: draw.draw(st.integers(max(0, len(changed) - 8), len(changed)))])


def check_like_library(codec: Compression, area: bytes, *, native: bool = True) -> None:
    """The kernel either gives what the codec layer gives for `area` or leaves it to it;
    it never takes an area the codec layer refuses. Asked for more room, it gets it, as
    the decoder gives it (a damaged zstd frame may decode to more than the original)."""
    room = 1 << 20
    status, _, outputs = kernel([area], room=room, codec=codec, native=native)
    while status == NEEDS_ROOM and room < 1 << 30:
        room *= 2
        status, _, outputs = kernel([area], room=room, codec=codec, native=native)
    expected = library(codec, area)
    if status == OK and expected is None and codec is Compression.ZSTD:
        # The kernel calls the system's libzstd, the codec layer the zstandard package's
        # own, often a later release: a damaged frame without a checksum that one finds
        # corrupt the other may decode. The kernel must then read it as its library does
        # (a batch's CRC-32C covers its compressed bytes, so a segment's damage is caught
        # before either decoder sees it).
        expected = system_zstd(area, room)
    if status == OK:
        assert expected is not None
        assert outputs == [expected]
    else:
        assert status == UNDECODED


def system_zstd(area: bytes, room: int) -> bytes | None:
    """What the system's libzstd, which the kernel calls, makes of `area` (its one-shot
    ZSTD_decompress into `room` bytes), or None when it refuses it."""
    loaded = compiled_codecs.zstd_library()
    assert loaded is not None
    lib = ctypes.CDLL(loaded._name)  # its own function objects: their types set here
    lib.ZSTD_decompress.restype = ctypes.c_size_t
    lib.ZSTD_decompress.argtypes = [ctypes.c_void_p, ctypes.c_size_t] * 2
    lib.ZSTD_isError.restype = ctypes.c_uint
    lib.ZSTD_isError.argtypes = [ctypes.c_size_t]
    out = ctypes.create_string_buffer(room)
    size = lib.ZSTD_decompress(out, room, area, len(area))
    return None if lib.ZSTD_isError(size) else out.raw[:size]


def legacy_header_checksum(frame: bytes) -> bytes:
    """`frame` with the header checksum Kafka's clients wrote before 0.10 (magic hashed)."""
    end = 6 + (8 if frame[4] & 0x08 else 0)
    return frame[:end] + bytes(((xxhash32(frame[:end]) >> 8) & 0xFF,)) + frame[end + 1 :]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 7))
def test_xxh32_matches_the_reference(data: bytes, start: int) -> None:
    """The compiled XXH32 of bytes at an address, from any position, equals the plain one
    on every length (stripes and tails)."""
    buf = np.frombuffer(bytes(start) + data, np.uint8)
    assert xxh32(buf.ctypes.data, start, len(data)) == xxhash32(data)


@settings(max_examples=150, deadline=None)
@given(
    payloads,
    st.sampled_from([lz4.frame.BLOCKSIZE_MAX64KB, lz4.frame.BLOCKSIZE_MAX256KB]),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
def test_frames_of_every_shape_decode_as_the_library_does(
    data: bytes,
    block_size: int,
    linked: bool,
    content_sum: bool,
    block_sum: bool,
    sized: bool,
    native: bool,
) -> None:
    """Frames from the `lz4` package with each option, from cleanerd's own Kafka framing,
    from cramjam, and with Kafka's legacy header checksum: all decode to the data, with
    blocks through liblz4 or through the kernel's own block decoder."""
    frames = [
        lz4.frame.compress(
            data,
            block_size=block_size,
            block_linked=linked,
            content_checksum=content_sum,
            block_checksum=block_sum,
            store_size=sized,
        ),
        compress(Compression.LZ4, data),
        bytes(cramjam.lz4.compress(data)),
    ]
    frames.append(legacy_header_checksum(frames[1]))
    status, reached, outputs = kernel(frames, native=native)
    assert (status, reached) == (OK, len(frames))
    assert outputs == [data] * len(frames)


def test_an_output_that_is_not_adjacent_bytes_is_left_to_the_library() -> None:
    """The decoders read and write at addresses, which only one run of adjacent bytes
    has: a strided output is left to the codec library, from its first area, rather
    than written over the bytes between its elements."""
    frame = compress(Compression.LZ4, b"abc" * 100)
    src = np.frombuffer(frame, np.uint8)
    memory = np.zeros(1 << 13, np.uint8)
    ends = np.array([len(frame)], np.int64)
    out = np.zeros(1, np.int64), np.zeros(1, np.int64)
    codecs = np.full(1, int(Compression.LZ4), np.int64)
    args = (src, np.zeros(1, np.int64), ends, codecs, memory[::2], 0, *out, 0, 0)
    assert tuple(int(x) for x in decompress_areas(*args, inflating(), True)) == (UNDECODED, 0, 0)
    assert not memory.any()


def test_linked_blocks_reach_back_into_the_previous_block() -> None:
    """A frame of dependent blocks (matches into the block before) decodes whole."""
    data = bytes(range(256)) * 1200  # repeats across the 64 KiB block boundary
    frame = lz4.frame.compress(data, block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=True)
    assert kernel([frame]) == (OK, 1, [data])


@settings(max_examples=300, deadline=None)
@given(payloads, st.data())
def test_a_damaged_frame_is_never_read_differently_from_the_library(
    data: bytes, draw: st.DataObject
) -> None:
    """Bytes changed anywhere in a frame, or cut off its end; blocks decoded through
    liblz4 or through the kernel's own block decoder."""
    checksum = draw.draw(st.booleans())
    frame = lz4.frame.compress(data, content_checksum=checksum, store_size=False)
    check_like_library(Compression.LZ4, damage(frame, draw), native=draw.draw(st.booleans()))


@pytest.mark.parametrize(
    "codec", [Compression.LZ4, Compression.SNAPPY, Compression.GZIP], ids=lambda c: c.name
)
def test_an_area_larger_than_the_room_asks_for_more(codec: Compression) -> None:
    """The areas before the one that does not fit are kept; that one asks for room."""
    small, big = compress(codec, b"a" * 10), compress(codec, b"b" * 5000)
    assert kernel([small, big], room=1000, codec=codec) == (NEEDS_ROOM, 1, [b"a" * 10])


@pytest.mark.parametrize(
    "change",
    [
        lambda f: f[:4] + bytes((f[4] | 0x01,)) + f[5:],  # a dictionary id
        lambda f: f[:4] + bytes((0x20 | (f[4] & 0x3F),)) + f[5:],  # version 00
        lambda f: f[:6] + bytes((f[6] ^ 0x55,)) + f[7:],  # a wrong header checksum
        lambda f: f + b"\x00",  # bytes after the frame
        lambda f: f[:-4],  # no end mark
    ],
    ids=["dictionary-id", "version", "header-checksum", "trailing-bytes", "no-end-mark"],
)
def test_what_the_kernel_does_not_take_is_left_to_the_library(change: Any) -> None:
    frame = compress(Compression.LZ4, b"kafka " * 50)
    assert kernel([change(frame)])[0] == UNDECODED


def _lz4_batch(records: list[Record], base: int, area: bytes | None = None) -> bytes:
    batch = encode_batch(records, base_offset=base, compression=Compression.LZ4)
    if area is None:
        return batch
    return _assemble(unpack_header(batch), area)


def _records(base: int, n: int) -> list[Record]:
    return [Record(base + i, 1_000 + i, b"k%d" % (base + i), b"v" * 30) for i in range(n)]


def test_a_segment_of_one_record_batches_decodes_whole() -> None:
    """Many 1-record LZ4 batches (a quiet topic), with a zstd and a plain batch among
    them, and one batch in Kafka's legacy framing: every record, in order."""
    batches = [_lz4_batch(_records(i, 1), i) for i in range(300)]
    batches[100] = encode_batch(_records(100, 1), base_offset=100, compression=Compression.ZSTD)
    batches[200] = encode_batch(_records(200, 1), base_offset=200)
    area = legacy_header_checksum(compress(Compression.LZ4, _records_area(250)))
    batches[250] = _lz4_batch(_records(250, 1), 250, area)
    cols = segment_columns(b"".join(batches))
    assert cols.offset.tolist() == list(range(300))
    assert [cols.key(i) for i in (0, 100, 200, 250, 299)] == [
        b"k0",
        b"k100",
        b"k200",
        b"k250",
        b"k299",
    ]


@pytest.mark.parametrize(
    "codec",
    [Compression.LZ4, Compression.SNAPPY, Compression.ZSTD, Compression.GZIP],
    ids=lambda c: c.name,
)
def test_batches_need_no_codec_call(codec: Compression, codec_calls: list[str]) -> None:
    """A segment of LZ4, snappy, zstd or gzip batches is decompressed without a call into
    the codec layer."""
    batches = [encode_batch(_records(i, 1), base_offset=i, compression=codec) for i in range(200)]
    cols = segment_columns(b"".join(batches))
    assert cols.num_records == 200
    assert [cols.key(i) for i in (0, 199)] == [b"k0", b"k199"]
    assert codec_calls == []


def _records_area(base: int) -> bytes:
    """The uncompressed records area of a 1-record batch at `base`."""
    plain = encode_batch(_records(base, 1), base_offset=base)
    return plain[RECORD_BATCH_OVERHEAD:]


def test_the_first_bad_batch_is_the_one_named() -> None:
    """A damaged zstd batch before a damaged LZ4 batch: the zstd one is reported, at its
    position, as the codec library names it."""
    good = [_lz4_batch(_records(i, 1), i) for i in range(3)]
    zstd = encode_batch(_records(3, 1), base_offset=3, compression=Compression.ZSTD)
    bad_zstd = _assemble(unpack_header(zstd), b"\x28\xb5\x2f\xfd garbage")
    bad_lz4 = _lz4_batch(_records(4, 1), 4, LZ4_MAGIC + b"\x60\x40\x00garbage")
    data = b"".join([*good, bad_zstd, bad_lz4])
    with pytest.raises(CorruptRecordError, match="zstd") as info:
        segment_columns(data)
    assert info.value.position == sum(map(len, good))
    data = b"".join([*good, bad_lz4])
    with pytest.raises(CorruptRecordError, match="lz4") as info:
        segment_columns(data)
    assert info.value.position == sum(map(len, good))


@pytest.mark.parametrize(
    "codec", [Compression.LZ4, Compression.ZSTD, Compression.GZIP], ids=lambda c: c.name
)
def test_highly_compressed_frames_grow_the_side_buffer(codec: Compression) -> None:
    """Frames that expand far past the first guess of the room they need."""
    records = [Record(i, i, b"k", bytes([i]) * 200_000) for i in range(3)]
    data = b"".join(encode_batch([r], base_offset=r.offset, compression=codec) for r in records)
    cols = segment_columns(data)
    assert [cols.value(i) for i in range(3)] == [r.value for r in records]


def test_struct_of_a_kafka_frame() -> None:
    """cleanerd's frames are what Kafka's client writes: independent 64 KiB blocks, no
    checksums or size, and the standard header checksum."""
    frame = compress(Compression.LZ4, b"x" * 100)
    magic, flg, bd = struct.unpack_from("<IBB", frame)
    assert (magic, flg, bd) == (0x184D2204, 0x60, 0x40)
    assert frame[6] == (xxhash32(frame[4:6]) >> 8) & 0xFF


def snappy_raw(data: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(data))


@settings(max_examples=150, deadline=None)
@given(payloads, st.integers(1, 40_000))
def test_snappy_of_every_framing_decodes_as_the_library_does(data: bytes, block: int) -> None:
    """Xerial streams from cleanerd's writer, from snappy-java's framing with any block
    size (python-snappy's `hadoop`-style is not Kafka's), and one raw block."""
    xerial = XERIAL_HEADER + b"".join(
        struct.pack(">i", len(c)) + c
        for c in (snappy_raw(data[k : k + block]) for k in range(0, len(data), block))
    )
    areas = [compress(Compression.SNAPPY, data), xerial, snappy_raw(data)]
    status, reached, outputs = kernel(areas, codec=Compression.SNAPPY)
    assert (status, reached) == (OK, len(areas))
    assert outputs == [data] * len(areas)


@settings(max_examples=300, deadline=None)
@given(payloads, st.booleans(), st.data())
def test_a_damaged_snappy_area_is_never_read_differently_from_the_library(
    data: bytes, raw: bool, draw: st.DataObject
) -> None:
    area = snappy_raw(data) if raw else compress(Compression.SNAPPY, data)
    check_like_library(Compression.SNAPPY, damage(area, draw))


def zstd_frames(data: bytes) -> list[bytes]:
    """`data` compressed by cleanerd's writer (cramjam: one-shot, the content size in
    the header), by zstandard without the size but with a checksum, and streamed as
    Kafka's Java producer writes (zstd-jni's output stream: no size, several blocks)."""
    streamed = zstandard.ZstdCompressor(level=1).compressobj()
    parts = [streamed.compress(data[k : k + 1000]) for k in range(0, len(data), 1000)]
    return [
        compress(Compression.ZSTD, data),
        zstandard.ZstdCompressor(level=3, write_content_size=False, write_checksum=True).compress(
            data
        ),
        b"".join([*parts, streamed.flush()]),
    ]


def test_libzstd_is_loaded_here() -> None:
    """This machine (and CI's) has libzstd: the tests below run the compiled path."""
    assert zstd_context() != 0


@settings(max_examples=200, deadline=None)
@given(st.one_of(payloads, st.binary(max_size=1)))
def test_zstd_frames_decode_as_the_library_does(data: bytes) -> None:
    """Empty, 1-byte and larger payloads, with and without content size and checksum."""
    frames = zstd_frames(data)
    status, reached, outputs = kernel(frames, codec=Compression.ZSTD)
    assert (status, reached) == (OK, len(frames))
    assert outputs == [data] * len(frames)
    assert all(zstandard.ZstdDecompressor().decompressobj().decompress(f) == data for f in frames)


@pytest.mark.parametrize("sized", [True, False], ids=["content-size", "no-content-size"])
def test_a_zstd_area_larger_than_the_room_asks_for_more(sized: bool) -> None:
    small = compress(Compression.ZSTD, b"a" * 10)
    big = zstandard.ZstdCompressor(write_content_size=sized).compress(bytes(range(256)) * 20)
    assert kernel([small, big], room=1000, codec=Compression.ZSTD) == (NEEDS_ROOM, 1, [b"a" * 10])
    assert kernel([small, big], room=10_000, codec=Compression.ZSTD)[:2] == (OK, 2)


@pytest.mark.parametrize("sized", [True, False], ids=["content-size", "no-content-size"])
def test_the_room_bound_holds_what_the_densest_frame_decodes_to(sized: bool) -> None:
    """8 MiB of one byte, streamed (RLE blocks of 4 bytes for 128 KiB each, the densest
    zstd writes), gets all the room it asks for, up to what it decodes to."""
    data = b"\x07" * (8 << 20)
    frame = zstandard.ZstdCompressor(write_content_size=sized).compress(data)
    room = 1000
    status, _, outputs = kernel([frame], room=room, codec=Compression.ZSTD)
    while status == NEEDS_ROOM:
        room *= 2
        status, _, outputs = kernel([frame], room=room, codec=Compression.ZSTD)
    assert status == OK
    assert outputs == [data]


def _rle_frame(size: int) -> bytes:
    """A frame with a 1 KiB window and no stated size: one last RLE block of `size`."""
    return bytes.fromhex("28b52ffd0000") + ((size << 3) | 0b011).to_bytes(3, "little") + b"A"


def test_a_block_past_the_block_maximum_is_left_to_the_library() -> None:
    """An RLE block of 2,000 bytes in a frame whose blocks may hold 1 KiB (its window):
    libzstd's one-shot call decodes it, the streaming decoders refuse it, and so the
    kernel leaves it to the library, which refuses it; 1,000 bytes are fine."""
    assert kernel([_rle_frame(2000)], codec=Compression.ZSTD)[0] == UNDECODED
    assert library(Compression.ZSTD, _rle_frame(2000)) is None
    assert kernel([_rle_frame(1000)], codec=Compression.ZSTD) == (OK, 1, [b"A" * 1000])
    assert library(Compression.ZSTD, _rle_frame(1000)) == b"A" * 1000


def test_a_false_content_size_does_not_ask_for_room() -> None:
    """A frame whose header states far more than its blocks hold is damage, not a frame
    that needs room (which the caller would allocate)."""
    frame = compress(Compression.ZSTD, b"x" * 100)
    assert frame[4] == 0x20  # a single segment, the size in one byte
    lying = frame[:4] + b"\xc0\x00" + struct.pack("<Q", 1 << 40) + frame[6:]
    assert kernel([lying], room=1000, codec=Compression.ZSTD)[0] == UNDECODED
    assert library(Compression.ZSTD, lying) is None


def _window_too_large(frame: bytes) -> bytes:
    """`frame` (one single-segment block of literals) with a header that asks for a
    256 MiB window, more than the streaming decoders accept."""
    assert frame[4] == 0x20  # a single segment, the size in one byte
    return frame[:4] + b"\x00\x90" + frame[6:]


@pytest.mark.parametrize(
    "change",
    [
        lambda f: f + f,  # two frames
        lambda f: f + b"\x00",  # bytes after the frame
        lambda f: b"\x50\x2a\x4d\x18" + struct.pack("<I", 3) + b"abc" + f,  # a skippable one
        lambda f: f[:4] + bytes((f[4] | 0x01,)) + b"\x07" + f[5:],  # a dictionary id
        _window_too_large,
        lambda f: f[:-1],  # cut short
        lambda f: b"",
    ],
    ids=["two-frames", "trailing-bytes", "skippable", "dictionary-id", "window", "cut", "empty"],
)
def test_what_the_kernel_does_not_take_in_zstd_is_left_to_the_library(change: Any) -> None:
    frame = compress(Compression.ZSTD, b"kafka " * 40)
    assert kernel([frame], codec=Compression.ZSTD) == (OK, 1, [b"kafka " * 40])
    assert kernel([change(frame)], codec=Compression.ZSTD)[0] == UNDECODED


@settings(max_examples=300, deadline=None)
@given(payloads, st.booleans(), st.data())
def test_a_damaged_zstd_area_is_never_read_differently_from_the_library(
    data: bytes, checksum: bool, draw: st.DataObject
) -> None:
    frame = zstandard.ZstdCompressor(write_checksum=checksum).compress(data)
    check_like_library(Compression.ZSTD, damage(frame, draw))


def test_a_damaged_frame_the_system_libzstd_decodes_is_read_as_it_does() -> None:
    """Found by the property above: a frame of b"\\x00\\x00\\x01" * 2733 with no
    checksum, one byte of its block changed. The zstandard package's libzstd finds it
    corrupt; the system's, which the kernel calls, may decode it (Debian 12's 1.5.4
    does): the kernel then gives what that library gives, never anything else."""
    frame = zstandard.ZstdCompressor(write_checksum=False).compress(b"\x00\x00\x01" * 2733)
    area = frame[:15] + b"\x01" + frame[16:]
    check_like_library(Compression.ZSTD, area)
    status, _, outputs = kernel([area], room=1 << 20, codec=Compression.ZSTD)
    if status == OK:
        assert outputs == [system_zstd(area, 1 << 20)]


def _zstd_batch(records: list[Record], base: int, area: bytes | None = None) -> bytes:
    batch = encode_batch(records, base_offset=base, compression=Compression.ZSTD)
    return batch if area is None else _assemble(unpack_header(batch), area)


# A damaged block that libzstd answers with dstSize_tooSmall whatever the room (found
# by the property above), behind a header stating 256 bytes of content (2 bytes, +256),
# stating none (a 1 KiB window), and stating 2^48 bytes (8 bytes, a 1 KiB window).
_DAMAGED_BLOCK = bytes.fromhex("5d00000c002100000100f9294704")
_OVERFLOWING_ZSTD = [
    bytes.fromhex("28b52ffd600000") + _DAMAGED_BLOCK,
    bytes.fromhex("28b52ffd0000") + _DAMAGED_BLOCK,
    bytes.fromhex("28b52ffdc0000000000000000100") + _DAMAGED_BLOCK,
]


@pytest.mark.parametrize("area", _OVERFLOWING_ZSTD, ids=["stated", "unstated", "huge"])
def test_a_frame_overflowing_what_it_can_hold_is_left_to_the_library(area: bytes) -> None:
    """More room would never do for it: the kernel asks for more only up to what the
    frame can decode to (its stated size, its blocks), then leaves it to the library,
    which refuses it; a batch holding it is reported corrupt at its position (before,
    its caller grew its buffer until memory ran out)."""
    room, asked = 64, 0
    status = NEEDS_ROOM
    while status == NEEDS_ROOM:
        status = kernel([area], room=room, codec=Compression.ZSTD)[0]
        room, asked = 2 * room, asked + 1
        assert room < 1 << 20, "asked for room without end"
    assert status == UNDECODED
    assert library(Compression.ZSTD, area) is None
    good = _zstd_batch(_records(0, 1), 0)
    bad = _zstd_batch(_records(1, 1), 1, area)
    with pytest.raises(CorruptRecordError) as caught:
        segment_columns(good + bad)
    assert caught.value.position == len(good)


def test_a_zstd_area_of_two_frames_is_read_by_the_library(codec_calls: list[str]) -> None:
    """Left to the codec layer, which reads the frames one after the other, as before."""
    area = _records_area(1)
    two = compress(Compression.ZSTD, area[:20]) + compress(Compression.ZSTD, area[20:])
    batches = [_zstd_batch(_records(0, 1), 0), _zstd_batch(_records(1, 1), 1, two)]
    batches.append(_zstd_batch(_records(2, 1), 2))
    cols = segment_columns(b"".join(batches))
    assert [cols.key(i) for i in range(3)] == [b"k0", b"k1", b"k2"]
    assert codec_calls == ["decompress_into"]


def _without_libzstd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled_codecs, "zstd_context", lambda: 0)


@pytest.mark.parametrize(
    "area",
    [
        b"\x28\xb5\x2f\xfd garbage",
        compress(Compression.ZSTD, _records_area(3))[:-3],
        zstandard.ZstdCompressor(write_checksum=True).compress(_records_area(3))[:-1] + b"\x00",
        _window_too_large(compress(Compression.ZSTD, b"x" * 60)),
    ],
    ids=["garbage", "cut", "checksum", "window"],
)
def test_a_corrupt_zstd_batch_is_reported_as_before(
    area: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same error, at the same position, as the codec layer alone gives."""
    good = [_zstd_batch(_records(i, 1), i) for i in range(3)]
    data = b"".join([*good, _zstd_batch(_records(3, 1), 3, area), _zstd_batch(_records(4, 1), 4)])
    with pytest.raises(CorruptRecordError, match="zstd") as compiled:
        segment_columns(data)
    assert compiled.value.position == sum(map(len, good))
    _without_libzstd(monkeypatch)
    with pytest.raises(CorruptRecordError) as before:
        segment_columns(data)
    assert (str(compiled.value), compiled.value.position) == (
        str(before.value),
        before.value.position,
    )


def test_without_libzstd_zstd_batches_go_through_the_codec_layer(
    codec_calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole run of zstd batches in one call, as before."""
    _without_libzstd(monkeypatch)
    batches = [_zstd_batch(_records(i, 1), i) for i in range(50)]
    cols = segment_columns(b"".join(batches))
    assert cols.offset.tolist() == list(range(50))
    assert [cols.key(i) for i in (0, 49)] == [b"k0", b"k49"]
    assert codec_calls == ["decompress_frames"]
    frame = compress(Compression.ZSTD, b"kafka")
    assert kernel([frame], codec=Compression.ZSTD, dctx=0) == (UNDECODED, 0, [])


def test_a_process_without_libzstd_decodes_zstd_through_the_codec_layer() -> None:
    """No libzstd under any name: no context, the kernels still load (from the on-disk
    cache too: the symbols are bound to stand-ins), and zstd batches are read as before."""
    probe = (
        "import ctypes.util\n"
        "from cleanerd.records import compiled_codecs\n"
        "compiled_codecs.LIBRARY_NAMES[:] = ['libzstd-absent.so.0']\n"
        "ctypes.util.find_library = lambda name: None\n"
        "from cleanerd.records.batch import encode_batch\n"
        "from cleanerd.records.columns import segment_columns\n"
        "from cleanerd.records.header import Compression\n"
        "from cleanerd.records.record import Record\n"
        "data = b''.join(\n"
        "    encode_batch([Record(i, i, b'k%d' % i, b'v')], base_offset=i, compression=c)\n"
        "    for i, c in enumerate([Compression.ZSTD, Compression.LZ4, Compression.ZSTD])\n"
        ")\n"
        "cols = segment_columns(data)\n"
        "print(compiled_codecs.zstd_library(), compiled_codecs.zstd_context())\n"
        "print(*[cols.key(i).decode() for i in range(3)])\n"
    )
    assert run_python(probe).split() == ["None", "0", "k0", "k1", "k2"]


def test_every_thread_decodes_with_its_own_context() -> None:
    """Threads decoding at once (the kernel runs without the GIL) each use their own
    libzstd context, and each reads every record."""
    values = [bytes([i]) * 3000 for i in range(8)]
    segments = [
        b"".join(_zstd_batch([Record(i, i, b"k", values[t] + b"%d" % i)], i) for i in range(300))
        for t in range(len(values))
    ]
    contexts: dict[int, int] = {}
    failures: list[BaseException] = []
    all_made = threading.Barrier(len(values))  # no context freed before all are made

    def decode(t: int) -> None:
        try:
            contexts[t] = zstd_context()
            all_made.wait()
            for _ in range(5):
                cols = segment_columns(segments[t])
                assert [cols.value(i) for i in range(300)] == [
                    values[t] + b"%d" % i for i in range(300)
                ]
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=decode, args=(t,)) for t in range(len(values))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert len(set(contexts.values())) == len(values)
    assert 0 not in contexts.values()


@settings(max_examples=300, deadline=None)
@given(payloads, st.data())
def test_gzip_members_decode_as_the_library_does_whole_or_damaged(
    data: bytes, draw: st.DataObject
) -> None:
    """A gzip member (the codec layer's, or another level's) decodes as the codec layer
    decodes it; with bytes changed or cut, the kernel gives the same or leaves it to the
    library (zlib checks the member's CRC-32 and length)."""
    level = draw.draw(st.sampled_from([1, 6, 9]))
    member = gzip.compress(data, compresslevel=level, mtime=0)
    status, _, outputs = kernel([member], room=len(data) + 1, codec=Compression.GZIP)
    assert (status, outputs) == (OK, [data])
    check_like_library(Compression.GZIP, damage(member, draw))


def test_two_gzip_members_or_bytes_after_one_are_left_to_the_library() -> None:
    """An area of two members (which the codec layer reads as one stream) or with bytes
    after its member is not taken by the kernel."""
    one = gzip.compress(b"first", mtime=0)
    for area in (one + gzip.compress(b"second", mtime=0), one + b"\x00"):
        status, reached, _ = kernel([area], room=1 << 16, codec=Compression.GZIP)
        assert (status, reached) == (UNDECODED, 0)


def test_without_zlib_gzip_batches_go_through_the_codec_layer(
    codec_calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no zlib to call, gzip batches decode through the codec layer, as before."""
    monkeypatch.setattr(zlib_streams, "inflating", lambda: None)
    batches = [
        encode_batch(_records(i, 1), base_offset=i, compression=Compression.GZIP) for i in range(20)
    ]
    cols = segment_columns(b"".join(batches))
    assert [cols.key(i) for i in (0, 19)] == [b"k0", b"k19"]
    assert codec_calls == ["decompress_frames"]
