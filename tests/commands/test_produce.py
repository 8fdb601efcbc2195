from __future__ import annotations

import base64
import errno
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.commands.produce import (
    Appended,
    ProduceInputError,
    ProduceWriteError,
    open_for_append,
    parse_record,
    produce,
)
from cleanerd.config import Config, config_from_data
from cleanerd.errors import CleanerdError
from cleanerd.log.files import TopicPartition
from cleanerd.log.partition_log import PartitionLog
from cleanerd.records.header import Compression
from cleanerd.records.record import Record, RecordHeader
from cleanerd.records.walker import scan_batches
from tests.holders import HOLD_BROKER_LOCK, HOLD_OWNER_LOCK, held_by_other_process
from tests.paths import REPO

NOW = 1_700_000_000_000


def open_log(root: Path) -> PartitionLog:
    (root / "data").mkdir()
    return PartitionLog.create(root / "data", TopicPartition("t", 0), state_dir=root / "state")


def run(log: PartitionLog, lines: list[str], batch_size: int = 100) -> list[Appended]:
    return list(
        produce(lines, log, batch_size=batch_size, compression=Compression.NONE, now_ms=NOW)
    )


def batches_on_disk(log: PartitionLog) -> list[tuple[int, int, Compression]]:
    found = []
    for segment in log.segments:
        for info in scan_batches(segment.log_path.read_bytes()):
            assert info.header is not None
            found.append((info.base_offset, info.last_offset, info.header.compression))
    return found


class TestParseRecord:
    def test_text_fields_headers_and_timestamp(self) -> None:
        """Strings become UTF-8 bytes; header pairs keep order and repeats."""
        record = parse_record(
            '{"key": "k\\u00e9", "value": "v", "timestamp": 7,'
            ' "headers": [["h", "1"], ["h", null]]}',
            now_ms=NOW,
        )
        assert record == Record(
            0, 7, "ké".encode(), b"v", (RecordHeader("h", b"1"), RecordHeader("h", None))
        )

    def test_defaults_and_tombstone(self) -> None:
        """No key means a null key, no timestamp means now; a null value is a tombstone."""
        record = parse_record('{"value": null, "headers": {"a": "b"}}', now_ms=NOW)
        assert record == Record(0, NOW, None, None, (RecordHeader("a", b"b"),))
        assert record.is_tombstone

    def test_base64_fields(self) -> None:
        """key_b64/value_b64 carry arbitrary bytes."""
        line = json.dumps({"key_b64": "AAE=", "value_b64": base64.b64encode(b"\xff").decode()})
        record = parse_record(line, now_ms=NOW)
        assert (record.key, record.value) == (b"\x00\x01", b"\xff")

    def test_base64_header_values(self) -> None:
        """headers_b64 carries header values of any bytes (a header strategy's binary
        version), in either shape, as `dump --json` prints them."""
        version = (2**63 - 1).to_bytes(8, "big")
        for headers in (
            {"version": base64.b64encode(version).decode(), "n": None},
            [["version", base64.b64encode(version).decode()], ["n", None]],
        ):
            line = json.dumps({"value": "v", "headers_b64": headers})
            record = parse_record(line, now_ms=NOW)
            assert record.headers == (RecordHeader("version", version), RecordHeader("n", None))

    @pytest.mark.parametrize(
        ("line", "reason"),
        [
            ('{"key": "a", "value": ', "invalid JSON: Expecting value (column 23)"),
            (
                '{"value": "v", "headers": {}, "headers_b64": {}}',
                'give "headers" or "headers_b64", not both',
            ),
            (
                '{"value": "v", "headers_b64": {"h": "***"}}',
                "header 'h' value is not valid base64",
            ),
            ('{"value": "v", "headers_b64": 5}', '"headers_b64" must be an object or a list'),
            ("[1, 2]", "expected a JSON object, got an array"),
            ('{"value": "v", "vaule": 1}', "unknown field vaule;"),
            ('{"value": "v", "a": 1, "b": 2}', "unknown fields a, b;"),
            ('{"key": "a"}', '"value" is missing (use null for a tombstone)'),
            ('{"key": "a", "key_b64": "YQ==", "value": null}', 'give "key" or "key_b64", not both'),
            ('{"value_b64": "***"}', '"value_b64" is not valid base64'),
            ('{"value": 5}', '"value" must be a string or null (use "value_b64" for bytes)'),
            (
                '{"value": "v", "headers": [["h"]]}',
                'header ["h"] is not a [string, string or null]',
            ),
            ('{"value": "v", "headers": {"h": 1}}', "header 'h' value must be a string or null"),
            ('{"value": "v", "headers": "h"}', '"headers" must be an object or a list'),
            ('{"value": "v", "timestamp": -5}', '"timestamp" must be a non-negative integer'),
            ('{"value": "v", "timestamp": true}', '"timestamp" must be a non-negative integer'),
            ('{"value": "\\ud800"}', "value is not valid Unicode text"),
        ],
    )
    def test_bad_lines_say_why(self, line: str, reason: str) -> None:
        """Each malformed line is refused with the reason."""
        with pytest.raises(ValueError, match="^" + re.escape(reason)):
            parse_record(line, now_ms=NOW)


class TestProduce:
    def test_records_are_grouped_into_batches(self, tmp_path: Path) -> None:
        """batch_size records per batch, the remainder in a last batch; offsets continue."""
        log = open_log(tmp_path)
        lines = [json.dumps({"key": f"k{i}", "value": str(i)}) for i in range(7)]
        assert run(log, lines, batch_size=3) == [Appended(0, 2), Appended(3, 5), Appended(6, 6)]
        assert run(log, lines[:2], batch_size=3) == [Appended(7, 8)]
        assert batches_on_disk(log) == [
            (0, 2, Compression.NONE),
            (3, 5, Compression.NONE),
            (6, 6, Compression.NONE),
            (7, 8, Compression.NONE),
        ]

    def test_blank_lines_are_skipped(self, tmp_path: Path) -> None:
        """Empty lines (a trailing newline, spacing) are not records."""
        assert run(open_log(tmp_path), ['{"value": "a"}', "", "  ", '{"value": "b"}']) == [
            Appended(0, 1)
        ]

    def test_bad_line_keeps_what_came_before(self, tmp_path: Path) -> None:
        """On a bad line the records before it are appended, none after, and the error says so."""
        log = open_log(tmp_path)
        lines = ['{"value": "a"}', '{"value": "b"}', '{"value": "c"}', "oops", '{"value": "d"}']
        output = produce(lines, log, batch_size=2, compression=Compression.NONE, now_ms=NOW)
        assert [next(output), next(output)] == [Appended(0, 1), Appended(2, 2)]
        with pytest.raises(ProduceInputError) as info:
            next(output)
        assert info.value.line_number == 4
        assert str(info.value) == (
            "line 4: invalid JSON: Expecting value (column 1); the 3 records before it were "
            "appended (offsets 0..2), nothing from line 4 on"
        )
        assert log.log_end_offset == 3

    def test_a_failed_append_says_what_was_appended_and_leaves_no_part(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A full disk at the third batch: the two before it stay, nothing of it is left,
        and the error names the line its batch began at, the file and what was appended
        (it said only "No space left on device")."""
        log = open_log(tmp_path)
        real, writes = os.pwrite, []

        def full_at_the_third(fd: int, data: bytes | memoryview, position: int) -> int:
            writes.append(position)
            if len(writes) == 3:
                real(fd, bytes(data)[:10], position)  # a part, then the disk is full
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd, data, position)

        monkeypatch.setattr(os, "pwrite", full_at_the_third)
        lines = [json.dumps({"value": v}) for v in "abcdef"]
        output = produce(lines, log, batch_size=2, compression=Compression.NONE, now_ms=NOW)
        assert [next(output), next(output)] == [Appended(0, 1), Appended(2, 3)]
        with pytest.raises(ProduceWriteError) as info:
            next(output)
        segment = log.dir / "00000000000000000000.log"
        assert str(info.value) == (
            f"line 5: No space left on device (ENOSPC) while appending a batch: {segment}; "
            "the 4 records before it were appended (offsets 0..3), nothing from line 5 on"
        )
        monkeypatch.undo()
        assert log.log_end_offset == 4
        assert batches_on_disk(log) == [(0, 1, Compression.NONE), (2, 3, Compression.NONE)]

    def test_bad_first_line_appends_nothing(self, tmp_path: Path) -> None:
        """A bad first line leaves the log empty and says nothing was appended."""
        log = open_log(tmp_path)
        with pytest.raises(ProduceInputError, match=r"line 1: .*; nothing was appended"):
            run(log, ["{}", '{"value": "a"}'])
        assert log.log_end_offset == 0

    @pytest.mark.parametrize("codec", list(Compression))
    def test_batches_use_the_codec(self, tmp_path: Path, codec: Compression) -> None:
        """Every batch is written with the requested compression codec."""
        log = open_log(tmp_path)
        lines = [json.dumps({"key": "k", "value": "x" * 50})] * 3
        list(produce(lines, log, batch_size=2, compression=codec, now_ms=NOW))
        assert batches_on_disk(log) == [(0, 1, codec), (2, 2, codec)]

    @settings(deadline=None, max_examples=25)
    @given(
        records=st.lists(
            st.tuples(st.none() | st.binary(max_size=20), st.none() | st.binary(max_size=20)),
            min_size=1,
            max_size=12,
        ),
        batch_size=st.integers(min_value=1, max_value=5),
    )
    def test_round_trip(
        self, records: list[tuple[bytes | None, bytes | None]], batch_size: int
    ) -> None:
        """Whatever keys and values go in come back out of the log, in order."""
        lines = [
            json.dumps({"key_b64": _b64(key), "value_b64": _b64(value), "timestamp": i})
            for i, (key, value) in enumerate(records)
        ]
        with tempfile.TemporaryDirectory() as root:
            log = open_log(Path(root))
            run(log, lines, batch_size=batch_size)
            read = [(r.offset, r.timestamp, r.key, r.value) for r in log.records()]
        assert read == [(i, i, key, value) for i, (key, value) in enumerate(records)]


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


class TestOpenForAppend:
    def config(self, root: Path, mode: str = "owner") -> Config:
        return config_from_data(
            {"log.dirs": [str(root / "data")], "state_dir": str(root / "state"), "mode": mode}
        )

    def test_creates_the_partition(self, tmp_path: Path) -> None:
        """A fresh partition dir is created with the topic's settings."""
        (tmp_path / "data").mkdir()
        with open_for_append(self.config(tmp_path), "orders-2") as log:
            assert log.dir == tmp_path / "data" / "orders-2"
            assert log.log_end_offset == 0

    def test_records_hours_apart_are_split_by_the_topics_segment_ms(self, tmp_path: Path) -> None:
        """The topic's `segment.ms` and `rolls.min_interval_ms` reach the appends: records
        written at once with timestamps 30 minutes apart roll a one-hour segment as a
        broker's appends would."""
        (tmp_path / "data").mkdir()
        config = config_from_data(
            {
                "log.dirs": [str(tmp_path / "data")],
                "state_dir": str(tmp_path / "state"),
                "rolls": {"min_interval_ms": 0},
                "topics": {"orders": {"segment.ms": 3_600_000}},
            }
        )
        t0 = 1_700_000_000_000
        lines = [json.dumps({"value": "v", "timestamp": t0 + i * 1_800_000}) for i in range(10)]
        with open_for_append(config, "orders-0") as log:
            run(log, lines, batch_size=1)
            assert [s.base_offset for s in log.segments] == [0, 3, 6, 9]

    def test_refused_when_a_broker_holds_the_log_dir(self, tmp_path: Path) -> None:
        """A `.lock` held by a non-cleanerd process (a broker) means no writes."""
        (tmp_path / "data").mkdir()
        with (
            held_by_other_process(HOLD_BROKER_LOCK, tmp_path / "data"),
            pytest.raises(CleanerdError, match="a running Kafka broker"),
            open_for_append(self.config(tmp_path), "orders-0"),
        ):
            pass
        assert not (tmp_path / "data" / "orders-0").exists()

    def test_refused_beside_a_daemon_of_another_state_dir_naming_it(self, tmp_path: Path) -> None:
        """A cleanerd daemon of another state dir (here its command line says
        `cleanerd run`) holds the log dir: no writes, and the refusal says what holds it,
        as the daemon's start does; it called it a Kafka broker."""
        (tmp_path / "data").mkdir()
        with (
            held_by_other_process(
                HOLD_BROKER_LOCK, tmp_path / "data", Path("cleanerd"), Path("run")
            ),
            pytest.raises(CleanerdError, match=r"\(`cleanerd run`, of another state_dir\)"),
            open_for_append(self.config(tmp_path), "orders-0"),
        ):
            pass
        assert not (tmp_path / "data" / "orders-0").exists()

    def test_shared_with_the_owning_daemon(self, tmp_path: Path) -> None:
        """While a cleanerd owner holds the log dir, produce appends alongside it."""
        (tmp_path / "data").mkdir()
        with (
            held_by_other_process(HOLD_OWNER_LOCK, tmp_path / "data", tmp_path / "state"),
            open_for_append(self.config(tmp_path), "orders-0") as log,
        ):
            assert run(log, ['{"value": "a"}']) == [Appended(0, 0)]

    @pytest.mark.parametrize(
        ("partition", "mode", "message"),
        [
            ("__cluster_metadata-0", "owner", "__cluster_metadata is the KRaft metadata log"),
            ("orders", "owner", "'orders' is not a <topic>-<partition> dir name"),
            ("bad topic-0", "owner", "'bad topic' is no legal Kafka topic name"),
            ("a/b-0", "owner", "'a/b' is no legal Kafka topic name"),
            ("..-0", "owner", "'..' is no legal Kafka topic name"),
            ("orders-0", "observe", "mode is observe"),
        ],
    )
    def test_refusals(self, tmp_path: Path, partition: str, mode: str, message: str) -> None:
        """The metadata log, bad names and observe mode are refused before any write."""
        with (
            pytest.raises(CleanerdError, match=re.escape(message)),
            open_for_append(self.config(tmp_path, mode), partition),
        ):
            pass
        assert not (tmp_path / "data").exists()


def test_a_produce_process_logs_in_the_configured_format_on_stderr(tmp_path: Path) -> None:
    """`cleanerd produce` logs to stderr in `logging.format` (JSON here), as the other
    commands do, and stdout holds only its offsets lines; it logged in the console
    format whatever the config said."""
    data = tmp_path / "data"
    data.mkdir()
    (data / ".kafka_cleanshutdown").write_text('{"version":0,"brokerEpoch":-1}')  # logged
    config = tmp_path / "cleanerd.yaml"
    config.write_text(
        f"log.dirs: [{data}]\nstate_dir: {tmp_path / 'state'}\nlogging: {{format: json}}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "cleanerd", "produce", "-c", str(config), "t-0"],
        input='{"key": "k", "value": "v"}\n',
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "t-0: offsets 0..0\n"
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert "log_dir.clean_shutdown_found" in [line["event"] for line in lines]
