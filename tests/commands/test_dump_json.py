from __future__ import annotations

import base64
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from aiokafka.record.legacy_records import LegacyRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords

from cleanerd.cli import main
from cleanerd.commands import dump as dump_module
from cleanerd.commands.dump import DumpOptions
from cleanerd.commands.dump_json import dump_file_json
from cleanerd.errors import CorruptRecordError
from cleanerd.log.producer_state import ProducerEntry, ProducerState, write_snapshot
from cleanerd.records.batch import encode_batch
from cleanerd.records.control import ControlRecordType, encode_end_txn_marker
from cleanerd.records.header import Compression, TimestampType, compute_crc
from cleanerd.records.record import Record, RecordHeader
from cleanerd.records.walker import walk
from tests.records.oracles import build_legacy

SHALLOW = DumpOptions()
DEEP = DumpOptions(deep_iteration=True)
DATA = DumpOptions(print_data_log=True)

REAL_SEGMENTS = [
    "kraft-combined-logs/foo-0/00000000000000000000.log",
    "kraft-combined-logs/__cluster_metadata-0/00000000000000000000.log",
    "logdir-a/__cluster_metadata-0/00000000000000000001.log",
    "logdir-b/__cluster_metadata-0/00000000000000000000.log",
]
CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


def objects(path: Path, options: DumpOptions = DATA, *, utf8: bool = False) -> list[Any]:
    """The objects as the command prints them: through JSON text and back."""
    return [json.loads(json.dumps(o)) for o in dump_file_json(path, options, utf8=utf8)]


def write_segment(tmp_path: Path, *batches: bytes, base_offset: int = 0) -> Path:
    path = tmp_path / f"{base_offset:020d}.log"
    path.write_bytes(b"".join(batches))
    return path


def independent_reading(data: bytes) -> list[dict[str, Any]]:
    """Every batch and record as aiokafka decodes them (sizes, leader epoch and count from
    the raw header bytes, which aiokafka does not expose)."""
    out = []
    records = MemoryRecords(data)
    position = 0
    while (batch := records.next_batch()) is not None:
        (length,) = struct.unpack_from(">i", data, position + 8)
        (epoch,) = struct.unpack_from(">i", data, position + 12)
        (count,) = struct.unpack_from(">i", data, position + 57)
        out.append(
            {
                "type": "batch",
                "position": position,
                "size": length + 12,
                "magic": batch.magic,
                "base_offset": batch.base_offset,
                "last_offset": batch.base_offset + batch.last_offset_delta,
                "count": count,
                "partition_leader_epoch": epoch,
                "crc": batch.crc,
                "crc_valid": batch.validate_crc(),
                "codec": CODECS[batch.compression_type],
                "timestamp_type": ["CreateTime", "LogAppendTime"][batch.timestamp_type],
                "base_timestamp": batch.first_timestamp,
                "max_timestamp": batch.max_timestamp,
                "producer_id": batch.producer_id,
                "producer_epoch": batch.producer_epoch,
                "base_sequence": batch.base_sequence,
                "transactional": batch.is_transactional,
                "control": batch.is_control_batch,
            }
        )
        out.extend(
            {
                "type": "record",
                "offset": record.offset,
                "timestamp": record.timestamp,
                "key_b64": None if record.key is None else base64.b64encode(record.key).decode(),
                "value_b64": None
                if record.value is None
                else base64.b64encode(record.value).decode(),
                "headers_b64": [
                    [k, None if v is None else base64.b64encode(v).decode()]
                    for k, v in record.headers
                ],
            }
            for record in batch
        )
        position += length + 12
    return out


class TestRealKafkaFiles:
    @pytest.mark.parametrize("name", REAL_SEGMENTS)
    def test_every_field_matches_an_independent_reader(self, kafka_real: Path, name: str) -> None:
        """Each broker-written segment: every batch and record field aiokafka decodes is
        printed with the same value, in the same order."""
        path = kafka_real / name
        printed = objects(path)
        expected = independent_reading(path.read_bytes())
        assert len(printed) == len(expected)
        for obj, want in zip(printed, expected, strict=True):
            assert obj["file"] == str(path)
            assert {k: obj[k] for k in want} == want

    def test_user_topic_segment_in_full(self, kafka_real: Path) -> None:
        """The one-record user segment, every field spelled out (base64 and --utf8)."""
        path = kafka_real / "kraft-combined-logs" / "foo-0" / "00000000000000000000.log"
        batch = {
            "type": "batch",
            "file": str(path),
            "position": 0,
            "size": 80,
            "magic": 2,
            "base_offset": 0,
            "last_offset": 0,
            "count": 1,
            "partition_leader_epoch": 0,
            "crc": 2565609683,
            "crc_valid": True,
            "codec": "none",
            "timestamp_type": "CreateTime",
            "base_timestamp": 1726045973899,
            "max_timestamp": 1726045973899,
            "producer_id": 0,
            "producer_epoch": 0,
            "base_sequence": 0,
            "last_sequence": 0,
            "transactional": False,
            "control": False,
            "control_type": None,
            "delete_horizon_ms": None,
            "error": None,
        }
        record = {
            "type": "record",
            "file": str(path),
            "offset": 0,
            "timestamp": 1726045973899,
            "size": 19,
            "key_size": -1,
            "value_size": 12,
            "sequence": 0,
            "header_keys": [],
            "control_type": None,
        }
        assert objects(path, SHALLOW) == [batch]
        assert objects(path, DEEP) == [batch, record]
        assert objects(path, DATA) == [
            batch,
            record | {"key_b64": None, "value_b64": "SGVsbG8gV29ybGQh", "headers_b64": []},
        ]
        assert objects(path, DATA, utf8=True)[1] == record | {
            "key": None,
            "value": "Hello World!",
            "headers": [],
        }

    def test_bad_crc_is_shown_and_the_listing_goes_on(self, kafka_real: Path) -> None:
        """A flipped byte in the second of two batches: that batch is printed with
        crc_valid false and an error and without records; the first batch's records are
        all there; the file then raises naming the bad batch (no crash before that)."""
        path = (
            kafka_real / "kraft-combined-logs" / "__cluster_metadata-0" / "00000000000000000000.log"
        )
        data = bytearray(path.read_bytes())
        data[145 + 70] ^= 0xFF  # inside the second batch's records
        path.write_bytes(data)
        listing = dump_file_json(path, DATA)
        printed = [next(listing) for _ in range(6)]
        with pytest.raises(CorruptRecordError) as info:
            next(listing)
        assert [o["type"] for o in printed] == ["batch"] + ["record"] * 4 + ["batch"]
        assert printed[0]["crc_valid"] is True
        assert printed[0]["error"] is None
        bad = printed[5]
        assert (bad["position"], bad["base_offset"], bad["crc_valid"]) == (145, 34, False)
        assert "CRC mismatch" in bad["error"]
        assert (info.value.path, info.value.position) == (str(path), 145)
        assert "CRC mismatch" in str(info.value)
        assert "invalid, the first" not in str(info.value)  # one: said as it is

    def test_truncated_tail_is_an_invalid_bytes_object(self, kafka_real: Path) -> None:
        """A last batch cut short is reported in-band, as Kafka's 'invalid bytes' line."""
        path = (
            kafka_real / "kraft-combined-logs" / "__cluster_metadata-0" / "00000000000000000000.log"
        )
        path.write_bytes(path.read_bytes()[:-10])
        printed = objects(path, SHALLOW)
        assert [o["type"] for o in printed] == ["batch", "invalid_bytes"]
        assert printed[1] == {
            "type": "invalid_bytes",
            "file": str(path),
            "position": 145,
            "size": 156,
        }


class TestBatchKinds:
    def test_keys_headers_tombstones_and_encodings(self, tmp_path: Path) -> None:
        """Keys, values and header values in base64 by default; with --utf8 as text where
        valid and base64 where not; null stays null; sequences wrap at 2^31."""
        records = [
            Record(5, 1000, b"k1", b"v1", (RecordHeader("a", b"1"), RecordHeader("b", None))),
            Record(6, 1001, b"k2", None),
            Record(7, 1002, None, b"\xff", (RecordHeader("c", b"\xfe"),)),
        ]
        batch = encode_batch(
            records, base_offset=5, producer_id=9, producer_epoch=2, base_sequence=2**31 - 2
        )
        path = write_segment(tmp_path, batch, base_offset=5)
        plain = objects(path)
        assert plain[0]["last_sequence"] == 0
        assert [o["sequence"] for o in plain[1:]] == [2**31 - 2, 2**31 - 1, 0]
        assert [o["header_keys"] for o in plain[1:]] == [["a", "b"], [], ["c"]]
        assert [(o["key_b64"], o["value_b64"], o["headers_b64"]) for o in plain[1:]] == [
            ("azE=", "djE=", [["a", "MQ=="], ["b", None]]),
            ("azI=", None, []),
            (None, "/w==", [["c", "/g=="]]),
        ]
        text = objects(path, utf8=True)[1:]
        assert (text[0]["key"], text[0]["value"]) == ("k1", "v1")
        assert text[0]["headers"] == [["a", "1"], ["b", None]]
        assert (text[1]["key"], text[1]["value"]) == ("k2", None)
        assert (text[2]["key"], text[2]["value_b64"], text[2]["headers_b64"]) == (
            None,
            "/w==",
            [["c", "/g=="]],
        )
        assert "value" not in text[2]
        assert "headers" not in text[2]

    def test_commit_marker_and_delete_horizon(self, tmp_path: Path) -> None:
        """A marker batch and record name the control type and coordinator epoch; a
        delete horizon is printed in ms, null when unset."""
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
        printed = objects(write_segment(tmp_path, marker, tombstone))
        batch, record = printed[0], printed[1]
        assert (batch["transactional"], batch["control"], batch["control_type"]) == (
            True,
            True,
            "COMMIT",
        )
        assert (record["control_type"], record["coordinator_epoch"]) == ("COMMIT", 7)
        assert batch["delete_horizon_ms"] is None
        assert printed[2]["delete_horizon_ms"] == 86_400_060
        assert printed[2]["control_type"] is None

    @pytest.mark.parametrize("codec", list(Compression))
    def test_codec_and_log_append_time(self, tmp_path: Path, codec: Compression) -> None:
        """Compressed batches decode through the columns; LogAppendTime records carry the
        batch's max timestamp."""
        batch = encode_batch(
            [Record(0, 10, b"k", b"v" * 100), Record(1, 20, b"k", b"w")],
            base_offset=0,
            compression=codec,
            timestamp_type=TimestampType.LOG_APPEND_TIME,
            max_timestamp=99,
        )
        path = write_segment(tmp_path, batch)
        for obj, want in zip(objects(path), independent_reading(batch), strict=True):
            assert {k: obj[k] for k in want} == want
        printed = objects(path, utf8=True)
        assert (printed[0]["codec"], printed[0]["timestamp_type"]) == (
            codec.name.lower(),
            "LogAppendTime",
        )
        assert [(o["offset"], o["timestamp"], o["value"]) for o in printed[1:]] == [
            (0, 99, "v" * 100),
            (1, 99, "w"),
        ]

    def test_records_that_do_not_decode_in_a_batch_with_a_good_crc(self, tmp_path: Path) -> None:
        """A batch whose CRC matches but whose record lengths lie: printed with the
        decoder's error and no records; the next batch and its records still follow."""
        bad = bytearray(encode_batch([Record(0, 1, b"k", b"v")], base_offset=0))
        bad[61] = 0x7E  # the first record's length varint: 63 bytes, past the batch end
        bad[17:21] = compute_crc(bad).to_bytes(4, "big")
        good = encode_batch([Record(1, 2, b"k", b"w")], base_offset=1)
        path = write_segment(tmp_path, bytes(bad), good)
        listing = dump_file_json(path, DATA, utf8=True)
        printed = [next(listing) for _ in range(3)]
        with pytest.raises(CorruptRecordError, match="runs past the end"):
            next(listing)
        assert [o["type"] for o in printed] == ["batch", "batch", "record"]
        assert printed[0]["crc_valid"] is True
        assert "runs past the end" in printed[0]["error"]
        assert (printed[2]["offset"], printed[2]["value"]) == (1, "w")

    def test_legacy_message_set(self, tmp_path: Path) -> None:
        """A magic 1 entry: its CRC checked, its count from the decoded messages, the
        fields v2 alone has null."""
        builder = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
        meta = builder.append(0, timestamp=1000, key=b"k", value=b"v")
        data = bytes(builder.build())
        batch, record = objects(write_segment(tmp_path, data), utf8=True)
        assert (batch["magic"], batch["crc"], batch["crc_valid"], batch["count"]) == (
            1,
            meta.crc,
            True,
            1,
        )
        assert batch["producer_id"] is None
        assert batch["base_timestamp"] is None
        assert (record["offset"], record["timestamp"], record["key"], record["value"]) == (
            0,
            1000,
            "k",
            "v",
        )
        assert record["sequence"] == -1


class TestIndexes:
    def test_offset_time_and_txn_index_entries(self, tmp_path: Path) -> None:
        """One object per entry; a preallocated zero tail is not listed."""
        index = tmp_path / "00000000000000000100.index"
        index.write_bytes(struct.pack(">iiii", 3, 4200, 9, 8500) + bytes(80))
        times = tmp_path / "00000000000000000100.timeindex"
        times.write_bytes(struct.pack(">qiqi", 1000, 3, 2000, 9))
        txns = tmp_path / "00000000000000000000.txnindex"
        txns.write_bytes(struct.pack(">hqqqq", 0, 42, 10, 20, 15))
        assert objects(index) == [
            {"type": "offset_index_entry", "file": str(index), "offset": 103, "position": 4200},
            {"type": "offset_index_entry", "file": str(index), "offset": 109, "position": 8500},
        ]
        assert [(o["timestamp"], o["offset"]) for o in objects(times)] == [(1000, 103), (2000, 109)]
        assert objects(txns) == [
            {
                "type": "txn_index_entry",
                "file": str(txns),
                "version": 0,
                "producer_id": 42,
                "first_offset": 10,
                "last_offset": 20,
                "last_stable_offset": 15,
            }
        ]


class TestCommand:
    def test_prints_one_json_object_a_line_and_exits_1_on_a_bad_batch(
        self, kafka_real: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The whole listing reaches stdout as JSON lines, the error goes to stderr."""
        path = (
            kafka_real / "kraft-combined-logs" / "__cluster_metadata-0" / "00000000000000000000.log"
        )
        data = bytearray(path.read_bytes())
        data[145 + 70] ^= 0xFF
        path.write_bytes(data)
        assert main(["dump", "--json", "--deep-iteration", str(path)]) == 1
        out, err = capsys.readouterr()
        printed = [json.loads(line) for line in out.splitlines()]
        assert [o["type"] for o in printed] == ["batch"] + ["record"] * 4 + ["batch"]
        assert printed[-1]["crc_valid"] is False
        assert str(path) in err
        assert "position 145" in err

    def test_utf8_needs_json(self, kafka_real: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """--utf8 alone is a usage error, not silently ignored."""
        path = kafka_real / "kraft-combined-logs" / "foo-0" / "00000000000000000000.log"
        assert main(["dump", "--utf8", str(path)]) == 2
        assert "--utf8 applies to --json" in capsys.readouterr().err


def test_a_producer_snapshot_dumps_one_entry_per_producer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A snapshot cleanerd writes (Kafka's format) dumps as text and as JSON, one line
    per producer, with the fields Kafka's DumpLogSegments prints."""
    state = ProducerState(
        42,
        {
            7: ProducerEntry(7, 1, 9, 40, 2, 1_700_000_000_000, 3, 38),
            5: ProducerEntry(5, 0, -1, 12, 0, 1_600_000_000_000, -1, -1),
        },
    )
    path = write_snapshot(tmp_path, state, log_start_offset=0)
    assert main(["dump", str(path)]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[1:] == [
        "producerId: 5 producerEpoch: 0 coordinatorEpoch: -1 currentTxnFirstOffset: None "
        "lastTimestamp: 1600000000000 lastSequence: -1 lastOffset: 12 offsetDelta: 0",
        "producerId: 7 producerEpoch: 1 coordinatorEpoch: 3 currentTxnFirstOffset: 38 "
        "lastTimestamp: 1700000000000 lastSequence: 9 lastOffset: 40 offsetDelta: 2",
    ]
    assert main(["dump", "--json", str(path)]) == 0
    objects = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [o["producer_id"] for o in objects] == [5, 7]
    assert objects[1] == {
        "type": "producer_snapshot_entry",
        "file": str(path),
        "producer_id": 7,
        "producer_epoch": 1,
        "coordinator_epoch": 3,
        "current_txn_first_offset": 38,
        "last_timestamp": 1_700_000_000_000,
        "last_sequence": 9,
        "last_offset": 40,
        "offset_delta": 2,
    }
    damaged = bytearray(path.read_bytes())
    damaged[-1] ^= 1
    path.write_bytes(bytes(damaged))
    assert main(["dump", "--json", str(path)]) == 1
    assert "CRC mismatch" in capsys.readouterr().err


def mixed_segment(tmp_path: Path) -> tuple[Path, list[int]]:
    """Forty batches of every kind (plain and compressed, a legacy entry, a commit marker,
    a tombstone) with a bad CRC in the 12th and the 31st and a cut last batch; and where
    each batch starts."""
    batches = []
    for i in range(40):
        if i == 20:
            marker = encode_end_txn_marker(ControlRecordType.COMMIT, 7, offset=i, timestamp=1)
            batches.append(
                encode_batch(
                    [marker],
                    base_offset=i,
                    producer_id=9,
                    producer_epoch=0,
                    is_transactional=True,
                    is_control=True,
                )
            )
            continue
        if i == 25:
            batches.append(build_legacy("aiokafka", 1, 0, [Record(i, 1000 + i, b"legacy", b"v")]))
            continue
        codec = Compression.LZ4 if i % 3 == 0 else Compression.NONE
        value = None if i == 7 else b"v%d" % i
        record = Record(i, 1000 + i, b"k%d" % (i % 5), value)
        batches.append(encode_batch([record], base_offset=i, compression=codec))
    starts = [sum(len(b) for b in batches[:i]) for i in range(len(batches))]
    data = bytearray(b"".join(batches))
    for bad in (11, 30):
        data[starts[bad] + 40] ^= 0xFF  # a header byte the CRC covers
    path = write_segment(tmp_path, bytes(data[:-5]))
    return path, starts


def test_a_log_is_listed_a_window_at_a_time_as_it_is_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With windows of about three batches, the objects (bad batches and the cut tail
    too) and the final error are those of one window over the whole file, and no window
    held more than its share of the batches as Python objects."""
    path, starts = mixed_segment(tmp_path)

    def listing() -> tuple[list[Any], str]:
        printed: list[Any] = []
        objects = dump_file_json(path, DATA)
        with pytest.raises(CorruptRecordError) as info:
            printed.extend(json.loads(json.dumps(o)) for o in objects)
        return printed, f"{info.value} @ {info.value.position}"

    whole = listing()
    windows: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        found = walk(*args, **kwargs)
        windows.append(len(found.table))
        return found

    monkeypatch.setattr(dump_module, "walk", counted)
    monkeypatch.setattr(dump_module, "DECODE_WINDOW_BYTES", 3 * (starts[1] - starts[0]))
    assert listing() == whole
    assert len(windows) > 10
    assert max(windows) <= 4
    printed, error = whole
    assert [o["position"] for o in printed if o["type"] == "batch"] == starts[:-1]
    assert printed[-1]["type"] == "invalid_bytes"
    assert [o["base_offset"] for o in printed if o.get("error")] == [11, 30]
    assert "2 batches are invalid, the first: CRC mismatch" in error
    assert error.endswith(f"@ {starts[11]}")
