"""An overdue idle segment rolls and is compacted in the first cycle of a fresh process,
`cleanerd clean` and a (re)started `cleanerd run` alike: the minimum roll interval counts
from the partition's last roll as the files show it, not from when the process first saw
the segment."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from cleanerd.log.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleanerd.log.files import TopicPartition
from tests.faults.workload import started, wait_for

MINUTE = 60_000
TP = TopicPartition("users", 0)


def setup(tmp_path: Path) -> Path:
    """`users-0`: 20 records over 5 keys written now with timestamps 30 minutes old, in
    its only (active) segment; max lag 10 minutes, so it is overdue by 20."""
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "log.dirs": [str(tmp_path / "data")],
                "state_dir": str(tmp_path / "state"),
                "metrics": {"listen": "127.0.0.1:0"},
                "logging": {"format": "json"},
                "topics": {
                    "users": {
                        "cleanup.policy": "compact",
                        "max.compaction.lag.ms": 10 * MINUTE,
                        "min.cleanable.dirty.ratio": 1.0,
                    }
                },
            }
        )
    )
    (tmp_path / "data").mkdir()
    old = int(time.time() * 1000) - 30 * MINUTE
    lines = "".join(
        json.dumps({"key": f"k{i % 5}", "value": f"v{i}", "timestamp": old}) + "\n"
        for i in range(20)
    )
    produced = subprocess.run(
        [sys.executable, "-m", "cleanerd", "produce", "-c", str(config), str(TP)],
        input=lines,
        capture_output=True,
        text=True,
        check=False,
    )
    assert produced.returncode == 0, produced.stderr
    return config


def checkpoint(tmp_path: Path) -> int:
    path = tmp_path / "data" / CLEANER_OFFSET_CHECKPOINT
    return OffsetCheckpointFile(path).read().get(TP, 0) if path.exists() else 0


def test_one_clean_rolls_and_compacts_an_overdue_idle_segment(tmp_path: Path) -> None:
    config = setup(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "cleanerd", "clean", "-c", str(config)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "users-0: rolled segment 0 (max.compaction.lag.ms" in done.stdout
    assert "users-0: cleaned (max.compaction.lag.ms" in done.stdout
    assert checkpoint(tmp_path) == 20


def test_a_started_daemon_rolls_and_compacts_it_in_its_first_cycle(tmp_path: Path) -> None:
    config = setup(tmp_path)
    with started("run", "-c", str(config)) as daemon:
        assert daemon.stdout is not None
        first_cycle: list[dict[str, object]] = []
        for line in daemon.stdout:
            if line.startswith("{") and (event := json.loads(line))["event"] == "cycle.done":
                first_cycle.append(event)
                break
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
    assert first_cycle
    assert first_cycle[0]["rolled"] == 1
    wait_for(lambda: checkpoint(tmp_path) == 20, 1, "the checkpoint")
