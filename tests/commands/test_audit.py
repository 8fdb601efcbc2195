"""Tests of `cleanerd audit` end to end: violations, exit status, and a clean that fixes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cleanerd.cli import main
from cleanerd.commands.audit import CLEAN_TIME_ALLOWANCE_MS
from cleanerd.log.files import TopicPartition
from tests.builders import build_log, kv
from tests.compaction.conftest import LogBuilder, k

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
    delete-policy partition of duplicates (never audited)."""
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
    assert "other-0" not in out
    assert main(["clean", "-c", path, "--now-ms", str(NOW)]) == 0
    capsys.readouterr()
    assert main(["audit", "-c", path, "--now-ms", str(NOW)]) == 0
    assert "0 deadline violations" in capsys.readouterr().out


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
