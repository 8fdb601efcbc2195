"""Tests for cleanerd.records.scan: shallow scans, real broker files, bad input."""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

import pytest

from cleanerd.errors import CorruptRecordError
from cleanerd.records.batch import encode_batch, encode_empty_batch
from cleanerd.records.header import Compression
from cleanerd.records.record import Record
from cleanerd.records.scan import BatchInfo
from cleanerd.records.walker import scan_batches, walk
from tests.conftest import KAFKA_REAL

FIXTURES = KAFKA_REAL

REAL_FILES = {
    "kraft-combined-logs/foo-0/00000000000000000000.log": {0: [0]},
    "kraft-combined-logs/__cluster_metadata-0/00000000000000000000.log": {
        1: [1, 2, 3, 4],
        34: [34, 35],
    },
    "logdir-a/__cluster_metadata-0/00000000000000000001.log": {1: [1], 2: [2, 3]},
    "logdir-b/__cluster_metadata-0/00000000000000000000.log": {0: [0], 1: [1, 2, 3]},
}


def three_batches() -> bytes:
    """Three small v2 batches back to back: offsets 0-1, 2, 3-5."""
    recs = [Record(0, 100, b"a", b"1"), Record(1, 101, b"b", b"2")]
    return (
        encode_batch(recs, base_offset=0)
        + encode_batch([Record(2, 102, b"c", None)], base_offset=2, compression=Compression.GZIP)
        + encode_batch([Record(3, 103, b"d", b"4"), Record(5, 99, None, b"5")], base_offset=3)
    )


@pytest.mark.parametrize("name", sorted(REAL_FILES))
def test_real_broker_files_scan_with_listed_offsets(name: str) -> None:
    """Every batch of the real broker files has a valid CRC and the README's offsets."""
    data = (FIXTURES / name).read_bytes()
    infos = list(scan_batches(data))
    expected = REAL_FILES[name]
    assert [i.base_offset for i in infos] == list(expected)
    assert [i.last_offset for i in infos] == [v[-1] for v in expected.values()]
    assert sum(i.size for i in infos) == len(data)
    assert all(i.magic == 2 and i.header is not None for i in infos)


def test_scan_reports_positions_sizes_and_offsets() -> None:
    """A scan yields each batch's position, size, offsets and max timestamp."""
    data = three_batches()
    infos = list(scan_batches(data))
    assert [(i.base_offset, i.last_offset, i.next_offset) for i in infos] == [
        (0, 1, 2),
        (2, 2, 3),
        (3, 5, 6),
    ]
    assert infos[0].position == 0
    assert infos[1].position == infos[0].size
    assert infos[2].position == infos[0].size + infos[1].size
    assert [i.max_timestamp for i in infos] == [101, 102, 103]


def test_scan_respects_start_and_end() -> None:
    """start/end limit the scan to a byte range; positions stay relative to the buffer."""
    data = three_batches()
    infos = list(scan_batches(data))
    middle = list(scan_batches(data, start=infos[1].position, end=infos[2].position))
    assert middle == [infos[1]]


def test_scan_reads_an_mmap(tmp_path: Path) -> None:
    """A memory-mapped segment file scans like its bytes."""
    path = tmp_path / "00000000000000000000.log"
    data = three_batches()
    path.write_bytes(data)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        infos = list(scan_batches(m))
    assert infos == list(scan_batches(data))


def test_flipped_byte_fails_the_crc_at_that_batch() -> None:
    """A flipped byte inside a batch gives a CRC mismatch naming the batch's position."""
    data = bytearray(three_batches())
    second = list(scan_batches(data))[1]
    data[second.position + 40] ^= 0x01
    with pytest.raises(CorruptRecordError, match="CRC mismatch") as info:
        list(scan_batches(data))
    assert info.value.position == second.position
    assert len(list(scan_batches(data, verify_crc=False))) == 3


def test_flipped_byte_in_the_leader_epoch_is_not_covered_by_the_crc() -> None:
    """partitionLeaderEpoch (bytes 12-15) lies outside the CRC, as in Kafka."""
    data = bytearray(three_batches())
    data[13] ^= 0xFF
    assert len(list(scan_batches(data))) == 3


def test_wrong_magic_is_named() -> None:
    """A batch whose magic byte is not 0, 1 or 2 is corrupt with the magic in the message."""
    data = bytearray(three_batches())
    third = list(scan_batches(data))[2]
    data[third.position + 16] = 7
    with pytest.raises(CorruptRecordError, match="unexpected magic 7") as info:
        list(scan_batches(data))
    assert info.value.position == third.position


def test_length_past_the_end() -> None:
    """A declared size running past the data names the size and the bytes left."""
    data = bytearray(three_batches())
    infos = list(scan_batches(data))
    last = infos[2]
    struct.pack_into(">i", data, last.position + 8, 10_000)
    left = len(data) - last.position
    with pytest.raises(
        CorruptRecordError, match=rf"batch size 10012 runs past .*\({left} bytes left\)"
    ):
        list(scan_batches(data))


def test_truncated_batch_is_an_incomplete_tail() -> None:
    """A batch cut short (a crash mid-append) ends the valid prefix as an incomplete tail."""
    data = three_batches()
    infos = list(scan_batches(data))
    cut = data[: infos[2].position + 30]
    result = walk(cut)
    assert result.table.infos() == infos[:2]
    assert result.valid_bytes == infos[2].position
    assert result.incomplete_tail
    assert result.error is not None
    assert result.error.position == infos[2].position
    with pytest.raises(CorruptRecordError, match="runs past the end"):
        list(scan_batches(cut))


def test_a_few_trailing_bytes_are_an_incomplete_tail() -> None:
    """Fewer than 17 trailing bytes cannot hold a batch header: an incomplete tail."""
    data = three_batches() + b"\x00" * 10
    result = walk(data)
    assert len(result.table) == 3
    assert result.valid_bytes == len(data) - 10
    assert result.incomplete_tail


def test_garbage_is_corruption_not_an_incomplete_tail() -> None:
    """Garbage after valid batches is reported as an error, not as a truncated batch."""
    data = three_batches() + b"\x00" * 8 + b"\x00\x00\x00\x40" + b"\xee" * 80
    result = walk(data)
    assert len(result.table) == 3
    assert not result.incomplete_tail
    assert result.error is not None
    assert "unexpected magic" in result.error.reason


def test_size_below_the_v2_header_is_corrupt() -> None:
    """A v2 batch claiming fewer than 61 bytes is corrupt, not a short tail."""
    data = bytearray(encode_empty_batch(base_offset=0, last_offset_delta=0, max_timestamp=1))
    struct.pack_into(">i", data, 8, 20)
    result = walk(bytes(data))
    assert not result.incomplete_tail
    assert result.error is not None
    assert "below" in result.error.reason


def test_clean_buffer_has_no_error() -> None:
    """A buffer of whole valid batches scans to its end with no error."""
    data = three_batches()
    result = walk(data, start=0)
    assert len(result.table) == 3
    assert result.valid_bytes == len(data)
    assert result.error is None
    assert not result.incomplete_tail


def test_valid_prefix_counts_bytes_from_start() -> None:
    """valid_bytes counts from `start`, not from the beginning of the buffer."""
    data = three_batches()
    first = next(scan_batches(data))
    result = walk(data, start=first.size)
    assert result.valid_bytes == len(data) - first.size
    assert [b.base_offset for b in result.table.infos()] == [2, 3]


def test_record_count_beyond_offset_range_is_corrupt() -> None:
    """recordsCount above lastOffsetDelta + 1 means duplicate offsets: corrupt."""
    data = bytearray(encode_batch([Record(0, 1, b"k", b"v")], base_offset=0))
    struct.pack_into(">i", data, 57, 5)
    with pytest.raises(CorruptRecordError, match="recordsCount 5"):
        list(scan_batches(data, verify_crc=False))


def test_batch_info_next_offset() -> None:
    """next_offset is one past last_offset."""
    info = BatchInfo(0, 61, 2, 10, 14, -1, None)
    assert info.next_offset == 15
