"""Tests of `cleanerd audit` end to end: violations, exit status, and a clean that fixes them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cleanerd.cli import main
from cleanerd.commands.audit import CLEAN_TIME_ALLOWANCE_MS, _total_segments, render_text
from cleanerd.compaction.audit import ROW_BYTES, AuditResult, PartitionAudit, audit_partition
from cleanerd.config import load_config
from cleanerd.log.files import TopicPartition
from cleanerd.log.log_dir import LogDir
from cleanerd.log.partition_log import PartitionLog
from cleanerd.records.walker import walk
from tests.builders import build_log, kv
from tests.compaction.conftest import LogBuilder, k
from tests.paths import REPO

NOW = 1_700_000_000_000
MIN = 60_000


def config_file(tmp_path: Path, **extra: object) -> Path:
    cfg = {
        "log.dirs": [str(tmp_path / "logs")],
        "state_dir": str(tmp_path / "state"),
        "log.cleaner.backoff.ms": 1000,
        "topics": {
            "t": {"cleanup.policy": "compact", "max.compaction.lag.ms": 10 * MIN},
            "other": {"cleanup.policy": "delete"},
        },
        **extra,
    }
    path = tmp_path / "cleanerd.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def build(tmp_path: Path) -> Path:
    """t-0: two old segments of duplicates, then a fresh active segment; other-0: a
    delete-policy partition of duplicates (its retention deadline alone is audited)."""
    log = LogBuilder(tmp_path / "logs")
    for i in range(20):
        log.append([(k(i % 4), k(i))], timestamps=[NOW - 60 * MIN + i])
        if i % 10 == 9:
            log.roll()
    log.append([(k(9), b"fresh")], timestamps=[NOW])
    dups = [[[kv("same", str(i), timestamp=NOW - 60 * MIN)] for i in range(5)]]
    build_log(tmp_path / "logs", dups, state_dir=tmp_path / "state", tp=TopicPartition("other", 0))
    return log.write()


def test_violations_exit_1_then_clean_fixes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Old superseded values are violations (exit 1); after `cleanerd clean` removes them
    the same audit passes (exit 0)."""
    build(tmp_path)
    path = str(config_file(tmp_path))
    assert main(["audit", "-c", path, "--now-ms", str(NOW), "--max-listed", "5"]) == 1
    out = capsys.readouterr().out
    assert "t-0 in" in out
    assert "16 superseded" in out
    assert "16 deadline violations (max.compaction.lag.ms 600000 + slack" in out
    assert out.count("  violation: offset") == 5
    assert "... and 11 more" in out
    (other,) = [line for line in out.splitlines() if line.startswith("other-0 in")]
    assert "(retention.ms 604800000): 1 segment, none past retention.ms; 0 retention" in other
    assert main(["clean", "-c", path, "--now-ms", str(NOW)]) == 0
    capsys.readouterr()
    assert main(["audit", "-c", path, "--now-ms", str(NOW)]) == 0
    assert "0 deadline violations" in capsys.readouterr().out


def test_records_without_a_key_are_counted_and_the_next_clean_drops_as_many(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Keyless records of a compacted partition are no candidates, but the audit counts
    them, with the first one's offset, because a pass drops them: `clean` then drops
    exactly as many (Kafka's invalid messages), and the audit after it finds none."""
    log = LogBuilder(tmp_path / "logs")
    for i in range(12):
        key = None if i % 4 == 1 else k(i % 3)
        log.append([(key, k(i))], timestamps=[NOW - 60 * MIN + i])
        if i % 6 == 5:
            log.roll()
    log.append([(k(9), b"fresh")], timestamps=[NOW])
    log.write()
    path = str(config_file(tmp_path))
    main(["audit", "-c", path, "--now-ms", str(NOW), "--json"])
    (audited,) = json.loads(capsys.readouterr().out)["partitions"]
    assert (audited["keyless_records"], audited["first_keyless_offset"]) == (3, 1)
    assert audited["records"] == 10  # the keyed ones
    main(["audit", "-c", path, "--now-ms", str(NOW)])
    assert "3 records without a key, the first at offset 1" in capsys.readouterr().out
    main(["clean", "-c", path, "--now-ms", str(NOW), "--json"])
    (cleaned,) = json.loads(capsys.readouterr().out)["cleaned"]
    assert cleaned["stats"]["invalid_messages_read"] == 3
    main(["audit", "-c", path, "--now-ms", str(NOW), "--json"])
    (after,) = json.loads(capsys.readouterr().out)["partitions"]
    assert (after["keyless_records"], after["first_keyless_offset"]) == (0, None)


def test_json_and_default_slack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json reports every partition with its numbers; the default slack is the backoff
    plus the clean-time allowance, and a larger --slack-ms excuses the lateness."""
    build(tmp_path)
    path = str(config_file(tmp_path))
    assert main(["audit", "-c", path, "--now-ms", str(NOW), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["slack_ms"] == 1000 + CLEAN_TIME_ALLOWANCE_MS
    (part,) = doc["partitions"]
    assert (part["topic"], part["superseded"], part["violations"]) == ("t", 16, 16)
    assert len(part["listed_violations"]) == 16
    assert part["oldest_superseded_age_ms"] == 60 * MIN - 4
    assert main(["audit", "-c", path, "--now-ms", str(NOW), "--slack-ms", str(60 * MIN)]) == 0


def test_unreadable_partition_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A corrupt segment cannot be audited: it is named and the exit status is 1."""
    d = build(tmp_path)
    first = d / "00000000000000000000.log"
    data = bytearray(first.read_bytes())
    data[-2] ^= 0x55
    first.write_bytes(bytes(data))
    assert main(["audit", "-c", str(config_file(tmp_path)), "--now-ms", str(NOW)]) == 1
    assert "not audited" in capsys.readouterr().out


def test_a_log_dir_with_a_malformed_root_checkpoint_is_named_and_the_others_audited(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A log dir whose root checkpoint is malformed cannot be audited: it is named with
    the file, the exit status is 1, and the other log dir is audited all the same."""
    build(tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(tmp_path / "logs", broken)
    (broken / "log-start-offset-checkpoint").write_text("7\n")
    cfg = yaml.safe_load(config_file(tmp_path).read_text())
    cfg["log.dirs"].append(str(broken))
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["audit", "-c", str(path), "--now-ms", str(NOW)]) == 1
    captured = capsys.readouterr()
    assert f"t-0 in {tmp_path / 'logs'}" in captured.out
    assert f"{broken}: offline, not read: malformed checkpoint file" in captured.err
    assert "unrecognised version 7" in captured.err


@pytest.mark.parametrize("when", ["before its open", "during its read"])
def test_a_partition_deleted_while_audited_is_gone_not_an_error(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    when: str,
) -> None:
    """A broker deleting a topic renames its partition dirs (`<tp>.<id>-delete`), then
    removes them. Deleted after audit's listing, before or while it is read, a
    partition is gone: left out, exit status 0. It was an error (No such file or
    directory), exit 1."""
    build(tmp_path)
    partition = tmp_path / "logs" / "t-0"
    second = TopicPartition("t", 1)
    build_log(
        tmp_path / "logs", [[[kv("k", "v", timestamp=NOW)]]], state_dir=tmp_path / "s", tp=second
    )

    def delete() -> None:
        partition.rename(partition.with_name(f"t-0.{'ab' * 16}-delete"))

    if when == "before its open":
        listed = LogDir.partitions

        def deleting(self: LogDir) -> dict[TopicPartition, Path]:
            found = listed(self)
            delete()
            return found

        monkeypatch.setattr(LogDir, "partitions", deleting)
    else:
        audited = audit_partition

        def deleting_read(plog: PartitionLog, *args: Any, **kwargs: Any) -> PartitionAudit:
            if plog.dir == partition:
                delete()
            return audited(plog, *args, **kwargs)

        monkeypatch.setattr("cleanerd.commands.audit.audit_partition", deleting_read)
    assert main(["audit", "-c", str(config_file(tmp_path)), "--now-ms", str(NOW), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(a["topic"], a["partition"]) for a in report["partitions"]] == [("t", 1)]


def test_a_segment_swapped_between_the_listing_and_the_open_is_opened_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live broker's compaction renames a segment away (`.deleted`) between audit's
    listing of the partition and its open: the open is tried again on the new listing
    and the partition audited (its deadline violations give the exit status). It was
    an error, and the partition not audited."""
    build(tmp_path)
    opened = LogDir.open_partition
    calls: list[TopicPartition] = []

    def swapped_once(self: LogDir, tp: TopicPartition, **kwargs: Any) -> PartitionLog:
        calls.append(tp)
        if calls.count(tp) == 1:
            raise FileNotFoundError(2, "No such file or directory", str(self.path / str(tp)))
        return opened(self, tp, **kwargs)

    monkeypatch.setattr(LogDir, "open_partition", swapped_once)
    main(["audit", "-c", str(config_file(tmp_path)), "--now-ms", str(NOW), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["errors"] == []
    assert [(a["topic"], a["partition"], a["error"]) for a in report["partitions"]] == [
        ("t", 0, None)
    ]
    assert [tp for tp in calls if tp.topic == "t"] == [TopicPartition("t", 0)] * 2


def test_a_bad_batch_in_a_mapped_segment_is_reported_and_the_others_audited(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad CRC in a segment big enough to be mapped (not read with one `pread`) names
    the file and position, and the other partitions are still audited: the mapping
    could not be closed while the error's traceback held views of it, and the audit
    ended in a traceback with no report at all."""
    log = LogBuilder(tmp_path / "logs")
    for i in range(3000):  # 3000 batches of some 140 bytes: past one pread's span
        log.append([(k(i % 50), b"v" * 100)], timestamps=[NOW - 60 * MIN])
    log.roll()
    log.append([(k(0), b"fresh")], timestamps=[NOW])
    d = log.write()
    good = LogBuilder(tmp_path / "logs")
    good.dir = tmp_path / "logs" / "u-0"
    good.dir.mkdir()
    good.append([(k(1), b"1")])
    good.write()
    first = d / "00000000000000000000.log"
    data = bytearray(first.read_bytes())
    assert len(data) > 1 << 18
    middle = int(walk(bytes(data)).table.position[1500])
    data[middle + 100] ^= 0x55  # inside the batch's CRC-covered bytes
    first.write_bytes(bytes(data))
    config = config_file(
        tmp_path, topics={"t": {"cleanup.policy": "compact"}, "u": {"cleanup.policy": "compact"}}
    )
    assert main(["audit", "-c", str(config), "--now-ms", str(NOW)]) == 1
    out = capsys.readouterr().out
    assert f"not audited: corrupt record batch in {first} at position " in out
    assert "u-0 in " in out
    # Counted apart from the partitions audited (it said "2 partitions audited").
    assert "1 partition audited, 1 not audited, 0 deadline violations" in out
    assert main(["audit", "-c", str(config), "--now-ms", str(NOW), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    (error,) = doc["errors"]  # as `plan --json` lists what it could not read
    assert error.startswith(f"{d}: not audited: corrupt record batch in {first} at position ")
    bad, ok = sorted(doc["partitions"], key=lambda a: a["topic"])
    assert set(bad) == set(ok)  # one shape: the figures of the one not audited are null
    assert (bad["records"], bad["violations"], ok["records"]) == (None, None, 1)


def _audit(
    tombstones: int = 1,
    markers: int = 0,
    marker_overdue_ms: int | None = None,
    oldest_ms: int | None = None,
) -> PartitionAudit:
    result = AuditResult(
        records=1,
        keys=1,
        superseded=0,
        superseded_bytes=0,
        superseded_unknown_age=0,
        oldest_superseded_age_ms=oldest_ms,
        violations=1,
        listed_violations=(),
        tombstones=1,
        tombstones_past_horizon=tombstones,
        oldest_tombstone_overdue_ms=500,
        markers_past_horizon=markers,
        oldest_marker_overdue_ms=marker_overdue_ms,
    )
    return PartitionAudit("logs", "t", 0, "offset", NOW, 10 * MIN, 1000, result)


def test_text_counts_are_singular_for_one_and_absent_parts_are_not_printed() -> None:
    """ "1 record, 1 key ... 1 deadline violation"; a horizon line names only what has
    passed it: no "0 markers (oldest by None ms)"."""
    lines = render_text(_audit())
    assert "1 record, 1 key, 0 superseded" in lines[0]
    assert "; 1 deadline violation (max.compaction.lag.ms" in lines[0]
    assert lines[1] == "  past their delete horizon: 1 tombstone (oldest by 500 ms)"
    both = render_text(_audit(tombstones=2, markers=1, marker_overdue_ms=7))
    assert both[1] == (
        "  past their delete horizon: 2 tombstones (oldest by 500 ms), 1 marker (oldest by 7 ms)"
    )
    assert all("None" not in line for line in render_text(_audit()) + both)


def test_records_superseded_from_the_future_are_said_so_not_given_a_negative_age() -> None:
    """Every superseded record superseded by one timestamped ahead of the clock: its age
    would be negative ("oldest -743427 ms"); the line says how far in the future."""
    assert ", oldest 5 ms;" in render_text(_audit(oldest_ms=5))[0]
    line = render_text(_audit(oldest_ms=-743_427))[0]
    assert ", superseded by records timestamped at least 743427 ms in the future;" in line
    assert "-743427" not in line


def test_summary_line_is_singular_for_one_partition(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One audited partition is "1 partition audited" (other-0 keeps its data forever:
    no retention deadline to audit)."""
    build(tmp_path)
    topics = {
        "t": {"cleanup.policy": "compact", "max.compaction.lag.ms": 10 * MIN},
        "other": {"cleanup.policy": "delete", "retention.ms": -1},
    }
    main(["audit", "-c", str(config_file(tmp_path, topics=topics)), "--now-ms", str(NOW)])
    assert "\n1 partition audited, 16 deadline violations\n" in capsys.readouterr().out


def test_progress_total_counts_the_compacted_partitions_segments(tmp_path: Path) -> None:
    """The progress bar's total: the `.log` files of compacted partitions only (not a
    delete-policy topic's, the metadata log's, a `-delete` dir's or a stray file's)."""
    d = build(tmp_path)
    logs = d.parent
    for name in ("__cluster_metadata-0", "t-1.0123456789abcdef0123456789abcdef-delete"):
        (logs / name).mkdir()
        (logs / name / "00000000000000000000.log").write_bytes(b"x" * 10)
    (logs / "t-2").write_text("a file, not a partition dir")
    expected = sorted(d.glob("*.log"))
    assert len(expected) == 3
    total = _total_segments(load_config(config_file(tmp_path)))
    assert total == (3, sum(p.stat().st_size for p in expected))


def run_audit(*argv: str) -> tuple[int, str, str]:
    """`cleanerd audit ARGV` as a whole process: (exit status, stdout, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "cleanerd", "audit", *argv]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    return done.returncode, done.stdout, done.stderr


def test_a_partition_over_memory_mb_is_audited_in_buckets_and_logged_to_stderr(
    tmp_path: Path,
) -> None:
    """A partition of more candidate rows than `--memory-mb` holds is audited in key
    buckets; the line saying so goes to stderr (with `--json`, stdout holds the report
    alone), and the report is the report of the partition read at once."""
    log = LogBuilder(tmp_path / "logs")
    rows = 1 + (1 << 20) // ROW_BYTES  # one more than a budget of 1 MB holds
    for start in range(0, rows, 2000):
        batch = [(k(f"key{i % 3000}"), b"v") for i in range(start, min(rows, start + 2000))]
        log.append(batch, timestamps=[NOW - 60 * MIN] * len(batch))
    log.write()
    path = str(config_file(tmp_path))
    status, out, err = run_audit("-c", path, "--now-ms", str(NOW), "--json", "--memory-mb", "1")
    whole_status, whole_out, whole_err = run_audit("-c", path, "--now-ms", str(NOW), "--json")
    assert (status, whole_status) == (1, 1)
    assert "audit.in_buckets" in err
    assert "audit.in_buckets" not in whole_err
    doc = json.loads(out)
    assert doc == json.loads(whole_out)
    assert doc["partitions"][0]["records"] == rows
    assert doc["partitions"][0]["keys"] == 3000


def test_memory_mb_is_refused_with_the_spark_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--memory-mb` bounds the local scan; with `--engine spark` it is a usage error, not
    an option silently ignored."""
    build(tmp_path)
    path = str(config_file(tmp_path))
    argv = ["audit", "-c", path, "--engine", "spark", "--memory-mb", "64"]
    assert main(argv) == 2
    assert "--memory-mb bounds the local scan only" in capsys.readouterr().err


def build_expiring(tmp_path: Path, *, first_ts: int = NOW - 3 * 60 * MIN) -> Path:
    """events-0 (`delete`, retention.ms one hour): three one-batch segments whose records
    are `first_ts`, 2 hours and 90 minutes old, then an active segment written now.
    The config file's path."""
    timed = [first_ts, NOW - 120 * MIN, NOW - 90 * MIN, NOW]
    build_log(
        tmp_path / "logs",
        [[[kv("k", str(i), timestamp=ts)]] for i, ts in enumerate(timed)],
        state_dir=tmp_path / "state",
        tp=TopicPartition("events", 0),
    )
    topics = {"events": {"cleanup.policy": "delete", "retention.ms": 60 * MIN}}
    return config_file(tmp_path, topics=topics)


def test_data_past_retention_ms_is_a_violation_until_clean_deletes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Segments past their retention deadline (largest timestamp + retention.ms) by more
    than the slack are retention violations, exit status 1, and due: the rules delete
    them at the next check. After `cleanerd clean` ran them, the audit passes."""
    path = str(build_expiring(tmp_path))
    argv = ["audit", "-c", path, "--now-ms", str(NOW), "--slack-ms", str(45 * MIN)]
    capsys.readouterr()  # the build's log lines
    assert main([*argv, "--max-listed", "1"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("events-0 in ")
    assert out[0].endswith(
        "(retention.ms 3600000): 4 segments, 3 past retention.ms (210 bytes), the most overdue "
        "by 7200000 ms; 2 retention violations (retention.ms 3600000 + slack 2700000 ms)"
    )
    assert out[1:] == [
        "  due: retention, run now, deletes 3 segments past retention.ms (no retention check "
        "has deleted them since their deadline)",
        "  violation: segment 0 (70 bytes), largest timestamp "
        f"{NOW - 180 * MIN}, past retention.ms by 7200000 ms",
        "  ... and 1 more",
        "1 partition audited, 0 deadline violations, 2 retention violations",
    ]
    assert main(["clean", "-c", path, "--now-ms", str(NOW)]) == 0
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["retention_slack_ms"], doc["retention_violations"]) == (45 * MIN, 0)
    (events,) = doc["retention"]
    assert (events["segments"], events["past_retention"], events["hold"]) == (1, 0, None)


def test_a_future_timestamp_keeping_expired_data_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A first segment stamped a day ahead stops Kafka's retention walk: the older
    segments after it stay past their deadline through every clean, and the audit says
    what keeps them. The default slack is log.retention.check.interval.ms plus the
    clean-time allowance."""
    path = str(build_expiring(tmp_path, first_ts=NOW + 24 * 60 * MIN))
    argv = ["audit", "-c", path, "--now-ms", str(NOW + 60 * MIN)]
    main(["clean", "-c", path, "--now-ms", str(NOW + 60 * MIN)])
    capsys.readouterr()
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "  kept: retention stops at segment 0, whose largest timestamp is 82800000 ms in " in out
    assert "; 2 retention violations (retention.ms 3600000 + slack 600000 ms)" in out
    assert main([*argv, "--json"]) == 1
    (events,) = json.loads(capsys.readouterr().out)["retention"]
    assert events["hold"] == {
        "base_offset": 0,
        "reason": "future timestamp",
        "largest_timestamp_ms": NOW + 24 * 60 * MIN,
        "size_bytes": 70,
        "end_offset": 1,
        "high_watermark": 4,
        "damage": None,
    }
    assert [v["base_offset"] for v in events["listed"]] == [1, 2]


def test_a_damaged_segment_is_named_with_its_damage_and_fails_the_audit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A segment whose batch fails its CRC cannot be dated: the report names it with the
    damage (file and position), says that retention stops at it, counts it in the
    summary and in `--json`'s errors, and exits 1. It said only "damaged segments 1",
    under a summary of no violations. A run with no compacted partition draws no
    progress line (it drew "0/0 segments")."""
    path = str(build_expiring(tmp_path))
    damaged = tmp_path / "logs" / "events-0" / "00000000000000000001.log"
    data = bytearray(damaged.read_bytes())
    data[-3] ^= 0xFF  # a value byte: only the CRC tells
    damaged.write_bytes(bytes(data))
    capsys.readouterr()
    argv = ["audit", "-c", path, "--now-ms", str(NOW), "--slack-ms", "0"]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    crc = f"corrupt record batch in {damaged} at position 0: CRC mismatch"
    assert f"  kept: retention stops at segment 1, which is damaged: {crc}" in out
    assert f"  not dated: segment 1 is damaged, nothing is proved about it: {crc}" in out
    assert out.endswith(
        "1 partition audited, 1 damaged segment not dated, 0 deadline violations, "
        "2 retention violations\n"
    )
    assert err == ""
    assert main([*argv, "--json"]) == 1
    (error,) = json.loads(capsys.readouterr().out)["errors"]
    assert error.startswith(f"{damaged.parent}: segment 1 not dated: {crc}")


def test_segment_files_pending_deletion_are_reported_and_stuck_ones_fail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A `.log` renamed `.deleted` still holds its bytes until the deleter removes it,
    `file.delete.delay.ms` after the rename (its ctime): the audit reports it as pending
    deletion, and once it is pending longer than that delay plus the slack, as a stuck
    deletion (exit 1). Such files were not counted at all."""
    path = str(build_expiring(tmp_path))
    log = tmp_path / "logs" / "events-0" / "00000000000000000000.log"
    deleted = log.with_name(log.name + ".deleted")
    log.rename(deleted)
    renamed_ms = deleted.stat().st_ctime_ns // 1_000_000
    capsys.readouterr()
    for after_ms, stuck in ((1000, 0), (60_001, 1)):
        argv = ["audit", "-c", path, "--now-ms", str(renamed_ms + after_ms), "--slack-ms", "0"]
        main(argv)
        out = capsys.readouterr().out
        assert (
            f"  pending deletion: 1 file renamed .deleted (70 bytes), the oldest {after_ms} ms "
            f"ago; {stuck} stuck (file.delete.delay.ms 60000 + slack 0 ms)\n"
        ) in out
        assert ("stuck deletion" in out.splitlines()[-1]) is bool(stuck)
        main([*argv, "--json"])
        doc = json.loads(capsys.readouterr().out)
        (events,) = doc["retention"]
        assert events["pending"] == [
            {"path": str(deleted), "size_bytes": 70, "renamed_ms": renamed_ms}
        ]
        assert events["stuck"] == doc["stuck_deletions"] == stuck
    assert deleted.exists()  # the audit only reads
