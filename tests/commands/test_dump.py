from __future__ import annotations

import itertools
import struct
from pathlib import Path

import pytest
from aiokafka.record.legacy_records import LegacyRecordBatchBuilder

from cleanerd.commands import dump as dump_module
from cleanerd.commands.dump import DumpOptions, UnsupportedFileError, dump_file
from cleanerd.commands.dump_json import dump_file_json
from cleanerd.errors import CorruptIndexError, CorruptRecordError
from cleanerd.records.batch import encode_batch
from cleanerd.records.control import ControlRecordType, encode_end_txn_marker
from cleanerd.records.header import Compression, TimestampType, compute_crc
from cleanerd.records.record import Record, RecordHeader
from cleanerd.records.walker import batch_windows
from tests.builders import set_base_offset
from tests.records.oracles import build_legacy

SHALLOW = DumpOptions()
DEEP = DumpOptions(deep_iteration=True)
DATA = DumpOptions(print_data_log=True)

FOO_BATCH = (
    "baseOffset: 0 lastOffset: 0 count: 1 baseSequence: 0 lastSequence: 0 producerId: 0 "
    "producerEpoch: 0 partitionLeaderEpoch: 0 isTransactional: false isControl: false "
    "deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: 1726045973899 size: 80 "
    "magic: 2 compresscodec: none crc: 2565609683 isvalid: true"
)
FOO_RECORD = (
    "| offset: 0 CreateTime: 1726045973899 keySize: -1 valueSize: 12 sequence: 0 headerKeys: []"
)
METADATA_FIELDS = (
    "baseSequence: -1 lastSequence: -1 producerId: -1 producerEpoch: -1 "
    "partitionLeaderEpoch: 1 isTransactional: false isControl: false "
    "deleteHorizonMs: OptionalLong.empty"
)


def lines(path: Path, options: DumpOptions = SHALLOW) -> list[str]:
    return list(dump_file(path, options))


def write_segment(tmp_path: Path, *batches: bytes, base_offset: int = 0) -> Path:
    path = tmp_path / f"{base_offset:020d}.log"
    path.write_bytes(b"".join(batches))
    return path


class TestRealKafkaFiles:
    def test_user_topic_segment(self, kafka_real: Path) -> None:
        """A broker-written segment prints exactly Kafka's batch and record lines."""
        path = kafka_real / "kraft-combined-logs" / "foo-0" / "00000000000000000000.log"
        assert lines(path, DATA) == [
            f"Dumping {path}",
            "Log starting offset: 0",
            FOO_BATCH,
            FOO_RECORD + " payload: Hello World!",
        ]
        assert lines(path, DEEP) == [
            f"Dumping {path}",
            "Log starting offset: 0",
            FOO_BATCH,
            FOO_RECORD,
        ]

    def test_metadata_segment_with_nonzero_base(self, kafka_real: Path) -> None:
        """A segment based at offset 1 with two batches prints positions and offsets."""
        path = kafka_real / "logdir-a" / "__cluster_metadata-0" / "00000000000000000001.log"
        assert lines(path, DEEP) == [
            f"Dumping {path}",
            "Log starting offset: 1",
            f"baseOffset: 1 lastOffset: 1 count: 1 {METADATA_FIELDS} position: 0 "
            "CreateTime: 1726045943832 size: 91 magic: 2 compresscodec: none crc: 2959689084 "
            "isvalid: true",
            "| offset: 1 CreateTime: 1726045943832 keySize: -1 valueSize: 23 sequence: -1 "
            "headerKeys: []",
            f"baseOffset: 2 lastOffset: 3 count: 2 {METADATA_FIELDS} position: 91 "
            "CreateTime: 1726045957397 size: 167 magic: 2 compresscodec: none crc: 204248102 "
            "isvalid: true",
            "| offset: 2 CreateTime: 1726045957397 keySize: -1 valueSize: 25 sequence: -1 "
            "headerKeys: []",
            "| offset: 3 CreateTime: 1726045957397 keySize: -1 valueSize: 65 sequence: -1 "
            "headerKeys: []",
        ]

    def test_bad_crc_prints_the_batch_invalid_then_raises(self, kafka_real: Path) -> None:
        """A flipped byte: the batch line says isvalid: false, then the error names the spot."""
        path = (
            kafka_real / "kraft-combined-logs" / "__cluster_metadata-0" / "00000000000000000000.log"
        )
        data = bytearray(path.read_bytes())
        data[145 + 70] ^= 0xFF  # inside the second batch's records
        path.write_bytes(data)
        output = dump_file(path, DEEP)
        assert [next(output) for _ in range(3)][2].startswith("baseOffset: 1 lastOffset: 4")
        assert len([next(output) for _ in range(4)]) == 4  # the first batch's records
        assert next(output).endswith("crc: 161276315 isvalid: false")
        with pytest.raises(CorruptRecordError) as info:
            next(output)
        assert info.value.path == str(path)
        assert info.value.position == 145
        assert "CRC mismatch" in str(info.value)

    def test_a_damaged_base_offset_ends_the_dump_naming_the_batch(self, kafka_real: Path) -> None:
        """A base offset (which no CRC covers) below the batch before it: the batches
        before it are listed, then the error names the spot."""
        path = (
            kafka_real / "kraft-combined-logs" / "__cluster_metadata-0" / "00000000000000000000.log"
        )
        position = set_base_offset(path, 1, 0)
        output = dump_file(path, SHALLOW)
        assert [next(output) for _ in range(3)][2].startswith("baseOffset: 1 lastOffset: 4")
        with pytest.raises(CorruptRecordError) as info:
            next(output)
        assert info.value.path == str(path)
        assert info.value.position == position
        assert "base offset 0 is not above the previous batch's last offset 4" in str(info.value)

    def test_truncated_tail_is_reported_not_raised(self, kafka_real: Path) -> None:
        """A last batch cut short (a crash mid-append) is Kafka's 'invalid bytes' line."""
        path = (
            kafka_real / "kraft-combined-logs" / "__cluster_metadata-0" / "00000000000000000000.log"
        )
        path.write_bytes(path.read_bytes()[:-10])
        assert lines(path)[-2:] == [
            lines(path)[2],
            "Found 156 invalid bytes at the end of 00000000000000000000.log",
        ]

    def test_a_closed_segment_cut_short_is_damage(self, tmp_path: Path) -> None:
        """Bytes at the end that hold no whole batch (a length past the file) are Kafka's
        'invalid bytes' line in either segment; in one a later segment follows (so no
        append is in flight there: the owner's open calls it damage too) the command
        then raises, naming the file and the position, in text and JSON alike."""
        batch = encode_batch([Record(0, 1000, b"k", b"v")], base_offset=0)
        cut = batch + batch[:-7]  # the second batch's length says more than is left
        closed = write_segment(tmp_path, cut)
        later = encode_batch([Record(5, 1000, b"k", b"v")], base_offset=5)
        active = write_segment(tmp_path, later[:-3], base_offset=5)
        output = dump_file(closed, SHALLOW)
        assert list(itertools.islice(output, 4))[-1] == (
            f"Found {len(batch) - 7} invalid bytes at the end of {closed.name}"
        )
        with pytest.raises(CorruptRecordError) as info:
            next(output)
        assert (info.value.path, info.value.position) == (str(closed), len(batch))
        assert "a later segment follows it" in info.value.reason
        with pytest.raises(CorruptRecordError, match="a later segment follows it"):
            list(dump_file_json(closed, SHALLOW))
        assert (
            lines(active)[-1] == f"Found {len(batch) - 3} invalid bytes at the end of {active.name}"
        )
        assert list(dump_file_json(active, SHALLOW))[-1]["type"] == "invalid_bytes"

    def test_zeros_after_the_last_batch_are_invalid_bytes_as_in_a_preallocated_segment(
        self, tmp_path: Path
    ) -> None:
        """A broker's preallocated active segment (`preallocate`) has zeros after its last
        batch: `Found N invalid bytes`, exit 0, as the owner's open cuts them. It was a
        corrupt batch ("batch size 12 is below the magic 0 minimum 26"), exit 1; in a
        closed segment the zeros are damage, as the owner calls them."""
        batch = encode_batch([Record(0, 1000, b"k", b"v")], base_offset=0)
        active = write_segment(tmp_path, batch + bytes(4096))
        assert lines(active)[-1] == f"Found 4096 invalid bytes at the end of {active.name}"
        assert list(dump_file_json(active, SHALLOW))[-1]["type"] == "invalid_bytes"
        write_segment(
            tmp_path, encode_batch([Record(5, 1000, b"k", b"v")], base_offset=5), base_offset=5
        )
        with pytest.raises(CorruptRecordError, match="a later segment follows it"):
            lines(active)

    def test_a_length_past_the_file_with_valid_batches_after_it_is_damage(
        self, tmp_path: Path
    ) -> None:
        """A batch in the middle of the last segment whose length field runs past the
        file, whole valid batches after it: damage, named at its position, as the owner's
        open calls it, not `Found N invalid bytes` (a crash mid-append leaves nothing
        valid after what it cut short). Before, `dump` exited 0 on it."""
        batches = [encode_batch([Record(n, 1000, b"k", b"v")], base_offset=n) for n in range(3)]
        data = bytearray(b"".join(batches))
        at = len(batches[0])
        data[at + 8 : at + 12] = struct.pack(">i", 0x7FFF0000)
        path = write_segment(tmp_path, bytes(data))
        for dump in (lambda: lines(path), lambda: list(dump_file_json(path, SHALLOW))):
            with pytest.raises(CorruptRecordError) as info:
                dump()
            assert (info.value.path, info.value.position) == (str(path), at)

    def test_offsets_out_of_the_segments_place_end_the_dump_as_the_owner_judges_them(
        self, tmp_path: Path
    ) -> None:
        """A batch whose base offset (no CRC covers it) reaches the next segment's, and
        in the last segment of a partition dir one more than 2^31 - 1 past its base, end
        the listing with an error naming the file and position, in text and JSON, as the
        owner's open and `plan` call them. Before, `dump` listed both as valid and exited
        0: it checked only that offsets ascend."""
        part = tmp_path / "t-0"
        part.mkdir()
        first = encode_batch([Record(0, 1000, b"k", b"v")], base_offset=0)
        reaching = encode_batch([Record(7, 1000, b"k", b"v")], base_offset=7)
        closed = write_segment(part, first, reaching)
        wild = encode_batch([Record(5 + 2**31, 1000, b"k", b"v")], base_offset=5 + 2**31)
        active = write_segment(
            part, encode_batch([Record(5, 1000, b"k", b"v")], base_offset=5), wild, base_offset=5
        )
        for path, why in (
            (closed, "is not below the next segment's base offset 5"),
            (active, "is more than 2147483647 past the segment's base offset 5"),
        ):
            output = dump_file(path, SHALLOW)
            assert len(list(itertools.islice(output, 3))) == 3  # the first batch's line
            with pytest.raises(CorruptRecordError, match=why) as info:
                next(output)
            assert (info.value.path, info.value.position) == (str(path), len(first))
            with pytest.raises(CorruptRecordError, match=why):
                list(dump_file_json(path, SHALLOW))

    def test_garbage_after_a_batch_raises_at_its_position(self, kafka_real: Path) -> None:
        """Bytes that are no batch (magic 7) raise an error naming file and position."""
        path = kafka_real / "kraft-combined-logs" / "foo-0" / "00000000000000000000.log"
        path.write_bytes(path.read_bytes() + struct.pack(">qib", 1, 60, 0) + bytes([7]) * 60)
        output = dump_file(path, SHALLOW)
        assert [next(output) for _ in range(3)][2] == FOO_BATCH
        with pytest.raises(CorruptRecordError) as info:
            next(output)
        assert (info.value.path, info.value.position) == (str(path), 80)
        assert "magic" in info.value.reason


class TestBatchKinds:
    def test_keys_headers_tombstones_and_sequences(self, tmp_path: Path) -> None:
        """Record lines carry key/value sizes, header keys, sequences and the data."""
        records = [
            Record(5, 1000, b"k1", b"v1", (RecordHeader("a", b"1"), RecordHeader("b", None))),
            Record(6, 1001, b"k2", None),
            Record(7, 1002, None, b"\xff"),
        ]
        batch = encode_batch(
            records, base_offset=5, producer_id=9, producer_epoch=2, base_sequence=2**31 - 2
        )
        path = write_segment(tmp_path, batch, base_offset=5)
        assert lines(path, DATA)[2:] == [
            "baseOffset: 5 lastOffset: 7 count: 3 baseSequence: 2147483646 lastSequence: 0 "
            "producerId: 9 producerEpoch: 2 partitionLeaderEpoch: -1 isTransactional: false "
            "isControl: false deleteHorizonMs: OptionalLong.empty position: 0 "
            f"CreateTime: 1002 size: {len(batch)} magic: 2 compresscodec: none "
            f"crc: {int.from_bytes(batch[17:21], 'big')} isvalid: true",
            "| offset: 5 CreateTime: 1000 keySize: 2 valueSize: 2 sequence: 2147483646 "
            "headerKeys: [a,b] key: k1 payload: v1",
            "| offset: 6 CreateTime: 1001 keySize: 2 valueSize: -1 sequence: 2147483647 "
            "headerKeys: [] key: k2",
            "| offset: 7 CreateTime: 1002 keySize: -1 valueSize: 1 sequence: 0 "
            "headerKeys: [] payload: \ufffd",
        ]

    def test_commit_marker_and_delete_horizon(self, tmp_path: Path) -> None:
        """Control records print endTxnMarker; a delete horizon prints OptionalLong[ms]."""
        marker = encode_batch(
            [encode_end_txn_marker(ControlRecordType.COMMIT, 7, offset=0, timestamp=50)],
            base_offset=0,
            producer_id=3,
            producer_epoch=1,
            is_transactional=True,
            is_control=True,
        )
        tombstone = encode_batch(
            [Record(1, 60, b"k", None)], base_offset=1, delete_horizon_ms=86_400_060
        )
        out = lines(write_segment(tmp_path, marker, tombstone), DATA)
        assert "isTransactional: true isControl: true deleteHorizonMs: OptionalLong.empty" in out[2]
        assert out[3] == (
            "| offset: 0 CreateTime: 50 keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] "
            "endTxnMarker: COMMIT coordinatorEpoch: 7"
        )
        assert "deleteHorizonMs: OptionalLong[86400060] position: " in out[4]
        assert out[5].endswith("headerKeys: [] key: k")

    @pytest.mark.parametrize("codec", list(Compression))
    def test_codec_and_log_append_time(self, tmp_path: Path, codec: Compression) -> None:
        """compresscodec uses Kafka's lowercase names; LogAppendTime names the timestamps."""
        batch = encode_batch(
            [Record(0, 10, b"k", b"v" * 100), Record(1, 20, b"k", b"w")],
            base_offset=0,
            compression=codec,
            timestamp_type=TimestampType.LOG_APPEND_TIME,
            max_timestamp=99,
        )
        out = lines(write_segment(tmp_path, batch), DEEP)
        assert (
            f"LogAppendTime: 99 size: {len(batch)} magic: 2 compresscodec: {codec.name.lower()} "
            in out[2]
        )
        assert out[3].startswith("| offset: 0 LogAppendTime: 99 keySize: 1 valueSize: 100 ")

    def test_unknown_codec_is_corruption(self, tmp_path: Path) -> None:
        """A codec id Kafka does not define (with a matching CRC) is reported, not crashed on."""
        batch = bytearray(encode_batch([Record(0, 1, b"k", b"v")], base_offset=0))
        batch[22] |= 7  # the low byte of the attributes: codec id 7
        batch[17:21] = compute_crc(batch).to_bytes(4, "big")
        path = write_segment(tmp_path, bytes(batch))
        output = dump_file(path, DEEP)
        assert [next(output) for _ in range(3)][2].endswith(
            f"compresscodec: unknown(7) crc: {compute_crc(batch)} isvalid: false"
        )
        with pytest.raises(CorruptRecordError, match="unknown compression codec id 7") as info:
            next(output)
        assert (info.value.path, info.value.position) == (str(path), 0)

    def test_legacy_message_set(self, tmp_path: Path) -> None:
        """Magic 1 entries print Kafka's legacy batch line and per-record crc."""
        builder = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
        meta = builder.append(0, timestamp=1000, key=b"k", value=b"v")
        data = bytes(builder.build())
        out = lines(write_segment(tmp_path, data), DATA)
        assert out[2:] == [
            f"offset: 0 position: 0 CreateTime: 1000 size: {len(data)} magic: 1 "
            f"compresscodec: none crc: {meta.crc} isvalid: true",
            f"| offset: 0 CreateTime: 1000 keySize: 1 valueSize: 1 isValid: true crc: {meta.crc} "
            "key: k payload: v",
        ]


class TestIndexes:
    def test_offset_index_stops_at_preallocated_zeros(self, tmp_path: Path) -> None:
        """`.index` prints offset/position pairs, ignoring a zero-filled tail."""
        path = tmp_path / "00000000000000000100.index"
        path.write_bytes(struct.pack(">iiii", 3, 4200, 9, 8500) + bytes(80))
        assert lines(path) == [
            f"Dumping {path}",
            "offset: 103 position: 4200",
            "offset: 109 position: 8500",
        ]

    def test_empty_offset_index(self, tmp_path: Path) -> None:
        """An index with no entries says so, as Kafka does."""
        path = tmp_path / "00000000000000000000.index"
        path.write_bytes(b"")
        assert lines(path) == [f"Dumping {path}", f"{path} is empty."]

    def test_time_index(self, tmp_path: Path) -> None:
        """`.timeindex` prints timestamp/offset pairs."""
        path = tmp_path / "00000000000000000100.timeindex"
        path.write_bytes(struct.pack(">qiqi", 1000, 3, 2000, 9))
        assert lines(path)[1:] == ["timestamp: 1000 offset: 103", "timestamp: 2000 offset: 109"]

    def test_txn_index(self, tmp_path: Path) -> None:
        """`.txnindex` prints Kafka's aborted-transaction lines."""
        path = tmp_path / "00000000000000000000.txnindex"
        path.write_bytes(struct.pack(">hqqqq", 0, 42, 10, 20, 15))
        assert lines(path)[1:] == [
            "version: 0 producerId: 42 firstOffset: 10 lastOffset: 20 lastStableOffset: 15"
        ]

    def test_index_of_partial_entries_is_corrupt(self, tmp_path: Path) -> None:
        """An index whose size is not whole entries raises an error naming the file."""
        path = tmp_path / "00000000000000000000.index"
        path.write_bytes(bytes(12))
        with pytest.raises(CorruptIndexError, match=str(path)):
            lines(path)


@pytest.mark.parametrize(
    "name", ["leader-epoch-checkpoint", "00000000000000000000.log.deleted", "abc.log"]
)
def test_unsupported_files_raise_before_any_line(tmp_path: Path, name: str) -> None:
    """Files dump cannot list are refused up front, with the reason."""
    path = tmp_path / name
    path.write_bytes(b"")
    with pytest.raises(UnsupportedFileError, match="cannot dump"):
        next(dump_file(path, SHALLOW))


@pytest.mark.parametrize("name", ["nope.log", "00000000000000000000.log"])
def test_a_missing_file_is_said_to_be_missing(tmp_path: Path, name: str) -> None:
    """A file that is not there is said so, whatever its name (a name without a base
    offset got "its name must start with the segment's base offset")."""
    with pytest.raises(FileNotFoundError, match=str(tmp_path / name)):
        next(dump_file(tmp_path / name, SHALLOW))


@pytest.mark.parametrize("bad_crc", [False, True])
def test_a_log_is_listed_a_window_at_a_time_as_it_is_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad_crc: bool
) -> None:
    """With windows of about three batches, the lines (records, a legacy entry, a bad
    batch's line and no records, the cut tail's line, then the bad batch's error) are
    those of one window over the whole file."""
    batches = []
    for i in range(30):
        if i == 17:
            batches.append(build_legacy("aiokafka", 1, 0, [Record(i, 1000 + i, b"legacy", b"v")]))
            continue
        codec = Compression.ZSTD if i % 4 == 0 else Compression.NONE
        batches.append(
            encode_batch([Record(i, 1000 + i, b"k", b"v%d" % i)], base_offset=i, compression=codec)
        )
    data = bytearray(b"".join(batches))
    bad = sum(len(b) for b in batches[:22])
    if bad_crc:
        data[bad + 40] ^= 0xFF
    path = write_segment(tmp_path, bytes(data[:-7]))

    def listing() -> tuple[list[str], str | None]:
        out: list[str] = []
        try:
            out.extend(dump_file(path, DATA))
        except CorruptRecordError as e:
            return out, f"{e} @ {e.position}"
        return out, None

    whole = listing()
    window = 3 * len(batches[1])
    monkeypatch.setattr(dump_module, "DECODE_WINDOW_BYTES", window)
    assert len(batch_windows(bytes(data), window)) > 8
    assert listing() == whole
    printed, error = whole
    assert printed[-1] == f"Found {len(batches[-1]) - 7} invalid bytes at the end of {path.name}"
    assert sum(line.startswith("baseOffset: ") for line in printed) == 28
    invalid = [line for line in printed if line.endswith("isvalid: false")]
    if bad_crc:  # its line, no record lines, then the listing goes on to the end
        assert len(invalid) == 1
        assert invalid[0].startswith("baseOffset: 22 ")
        assert f" position: {bad} " in invalid[0]
        after = printed[printed.index(invalid[0]) + 1]
        assert after.startswith("baseOffset: 23 ")
        assert error is not None
        assert error.endswith(f"@ {bad}")
    else:
        assert not invalid
        assert error is None


def test_the_listing_goes_on_past_invalid_batches_and_counts_them(tmp_path: Path) -> None:
    """Two batches with bad CRCs in the middle of a segment: every batch gets its line
    (the bad ones `isvalid: false`, without records), as Kafka's tool lists them, and the
    file ends with one error that counts them and names the first."""
    batches = [
        encode_batch([Record(i, 1000 + i, b"k", b"v%d" % i)], base_offset=i) for i in range(6)
    ]
    data = bytearray(b"".join(batches))
    positions = [sum(len(b) for b in batches[:i]) for i in (2, 4)]
    for p in positions:
        data[p + 70] ^= 0xFF
    path = write_segment(tmp_path, bytes(data))
    printed: list[str] = []
    with pytest.raises(CorruptRecordError) as info:
        printed.extend(dump_file(path, DEEP))
    lines = [line for line in printed if line.startswith("baseOffset: ")]
    assert [line.split()[1] for line in lines] == ["0", "1", "2", "3", "4", "5"]
    assert [line.endswith("isvalid: false") for line in lines] == [0, 0, 1, 0, 1, 0]
    assert sum(line.startswith("| offset: ") for line in printed) == 4
    assert str(info.value).startswith(
        f"corrupt record batch in {path} at position {positions[0]}: "
        "2 batches are invalid, the first: CRC mismatch"
    )


def test_bytes_that_stop_the_listing_are_said_with_the_invalid_batches_before_them(
    tmp_path: Path,
) -> None:
    """A bad CRC at the third batch, then a base offset out of order at the fifth, which
    ends the listing: the error names the fifth and says the third was invalid (that
    was lost: only the fifth was named)."""
    batches = [
        encode_batch([Record(i, 1000 + i, b"k", b"v%d" % i)], base_offset=i) for i in range(6)
    ]
    data = bytearray(b"".join(batches))
    bad_crc, stop = (sum(len(b) for b in batches[:i]) for i in (2, 4))
    data[bad_crc + 70] ^= 0xFF
    data[stop : stop + 8] = (1).to_bytes(8, "big")
    path = write_segment(tmp_path, bytes(data))
    for listing in (
        lambda: list(dump_file(path, SHALLOW)),
        lambda: list(dump_file_json(path, SHALLOW, utf8=False)),
    ):
        with pytest.raises(CorruptRecordError) as info:
            listing()
        assert info.value.position == stop
        assert str(info.value).startswith(
            f"corrupt record batch in {path} at position {stop}: base offset 1 is not above "
            "the previous batch's last offset 3; a batch before them is invalid, at position "
            f"{bad_crc}: CRC mismatch"
        )
