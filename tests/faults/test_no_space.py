"""A full disk, for real: `cleanerd clean` on a small tmpfs.

A pass needs room for one group's output while the group's old files still exist; the
old files of its earlier groups wait as `.deleted` for `file.delete.delay.ms`, and a
one-shot run keeps the deletions of earlier passes in its queue too. When the disk runs
full, what only waits for readers goes at once (the pass's own `.deleted` files, then
everything waiting on that device), the failed step is tried again once, and a pass that
still cannot fit fails naming the file and the step, leaving the partition as it was.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import psutil
import pytest

from cleanerd.log.files import TopicPartition
from tests.faults.workload import (
    TP,
    cleanerd,
    records_on_disk,
    verify,
    write_config,
    write_partition,
)
from tests.tools import tmpfs

pytestmark = pytest.mark.root

SEGMENT_BYTES = 4 * 1024 * 1024
TS = 1_700_000_000_000


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def used(path: Path) -> int:
    return int(psutil.disk_usage(str(path)).used)


def fill(path: Path, leave_bytes: int) -> None:
    """Write a filler file until about `leave_bytes` are free."""
    free = int(psutil.disk_usage(str(path.parent)).free)
    with open(path, "wb") as f:
        f.write(bytes(max(0, free - leave_bytes)))


def test_clean_on_a_nearly_full_disk_frees_its_own_leftovers_and_finishes(
    tmp_path: Path,
) -> None:
    """29 MB of log (unique keys: the output is as big as the input) on a 40 MB tmpfs:
    the pass runs out of space at its third group, unlinks the old files of its first
    two groups at once, writes the group again and finishes, and says the disk ran full
    (`clean.ran_out_of_space`: it said nothing); nothing is left behind."""
    with tmpfs(tmp_path / "mnt", "40m") as mnt:
        data, state = mnt / "data", tmp_path / "state"
        work = write_partition(
            data, state, records=260_000, keys=260_000, segment_bytes=SEGMENT_BYTES, ts=TS
        )
        config = write_config(
            tmp_path / "c.yaml", data, state, **{"log.segment.bytes": SEGMENT_BYTES}
        )
        before = used(mnt)
        log_bytes = sum(p.stat().st_size for p in (data / str(TP)).iterdir())
        # Keeping every old segment until the pass ends would need a second copy.
        assert psutil.disk_usage(str(mnt)).free < log_bytes
        done = cleanerd("clean", "-c", str(config))
        assert done.returncode == 0, done.stdout + done.stderr
        assert "1 cleaning pass, 0 partitions uncleanable" in done.stdout
        (warned,) = [e for e in json_lines(done.stderr) if e["event"] == "clean.ran_out_of_space"]
        assert (warned["topic"], warned["partition"], warned["level"]) == (TP.topic, 0, "warning")
        verify(data / str(TP), work)
        assert used(mnt) <= before + 64 * 1024  # + the checkpoint files


def test_pass_that_cannot_fit_fails_naming_the_file_and_step_and_changes_nothing(
    tmp_path: Path,
) -> None:
    """Less room than one group's output: the pass fails with the `.cleaned` file and the
    step named, tries once more in the run at most, and leaves the partition as it was;
    a second run fails the same way and leaves nothing behind either."""
    with tmpfs(tmp_path / "mnt", "24m") as mnt:
        data, state = mnt / "data", tmp_path / "state"
        work = write_partition(
            data, state, records=100_000, keys=100_000, segment_bytes=SEGMENT_BYTES, ts=TS
        )
        fill(mnt / "filler", 1 << 20)
        config = write_config(
            tmp_path / "c.yaml", data, state, **{"log.segment.bytes": SEGMENT_BYTES}
        )
        partition = data / str(TP)
        files = sorted(p.name for p in partition.iterdir())
        for _ in range(2):
            done = cleanerd("clean", "-c", str(config))
            assert done.returncode == 1, done.stdout + done.stderr
            line = next(li for li in done.stdout.splitlines() if "uncleanable" in li)
            assert re.search(r"No space left on device \(ENOSPC\) while writing the cleaned", line)
            assert f"{partition}/00000000000000000000.log.cleaned" in line
            assert done.stderr.count("clean.no_space_retry") <= 1
            assert sorted(p.name for p in partition.iterdir()) == files
            verify(partition, work)


def test_full_disk_unlinks_what_other_passes_left_waiting(tmp_path: Path) -> None:
    """Two partitions on one small device, `file.delete.delay.ms` a minute: the first
    pass leaves its old segments waiting; the second runs out of space, they are
    unlinked at once (the delay yields to disk pressure) and the second pass is retried
    and finishes."""
    with tmpfs(tmp_path / "mnt", "30m") as mnt:
        data, state = mnt / "data", tmp_path / "state"
        works = {
            tp: write_partition(
                data, state, records=90_000, keys=90_000, segment_bytes=SEGMENT_BYTES, ts=TS, tp=tp
            )
            for tp in (TopicPartition("a", 0), TopicPartition("b", 0))
        }
        fill(mnt / "filler", 12 << 20)
        config = write_config(
            tmp_path / "c.yaml",
            data,
            state,
            **{"log.segment.bytes": SEGMENT_BYTES, "log.cleaner.threads": 1},
        )
        done = cleanerd("clean", "-c", str(config))
        assert done.returncode == 0, done.stdout + done.stderr
        assert "2 cleaning passes, 0 partitions uncleanable" in done.stdout
        assert "segment.unlinked_early" in done.stderr
        for tp, work in works.items():
            verify(data / str(tp), work)
            assert sum(1 for _ in records_on_disk(data / str(tp))) == 90_000


def test_retention_on_a_full_disk_deletes_everything_due_in_one_clean(
    tmp_path: Path,
) -> None:
    """A `delete` topic whose every record is past `retention.ms`, on a tmpfs with no
    byte free. The inactive due segments need no space; the roll that lets retention
    take the active one needs next to none (it succeeds here: a producer snapshot it
    cannot write is only a warning); the checkpoints written after the step need new
    files, and fail. The first `clean` deletes every due segment, the active one too,
    and fails naming the checkpoint it could not write; their unlink frees the disk, and
    the next `clean` writes the checkpoints. (Before, each partition's checkpoint was
    written between its deletions and its roll, and its failure skipped the roll: the
    active segment's records outlived `retention.ms` until the next `clean`.)"""
    with tmpfs(tmp_path / "mnt", "8m") as mnt:
        data, state = mnt / "data", tmp_path / "state"
        write_partition(data, state, records=30_000, keys=30_000, segment_bytes=1 << 20, ts=TS)
        partition = data / str(TP)
        logs = sorted(p.name for p in partition.glob("*.log"))
        assert len(logs) >= 3
        fill(mnt / "filler", 0)
        config = write_config(
            tmp_path / "c.yaml",
            data,
            state,
            **{
                "log.cleanup.policy": ["delete"],
                "log.retention.ms": 3_600_000,
                "log.segment.bytes": 1 << 20,
            },
        )
        now = ["--now-ms", str(TS + 7_200_000)]
        first = cleanerd("clean", "-c", str(config), *now)
        assert first.returncode == 1, first.stdout + first.stderr
        line = next(li for li in first.stdout.splitlines() if "retention failed" in li)
        assert re.search(r"No space left on device \(ENOSPC\) while writing \S+: /", line)
        assert line.endswith(str(data / "recovery-point-offset-checkpoint"))
        assert f"1 segment rolled, {len(logs)} deleted by retention" in first.stdout
        (active,) = partition.glob("*.log")
        assert active.stat().st_size == 0
        assert active.name == f"{30_000:020d}.log"
        assert not list(partition.glob("*.deleted"))

        second = cleanerd("clean", "-c", str(config), *now)
        assert second.returncode == 0, second.stdout + second.stderr
        assert "0 deleted by retention" in second.stdout
        checkpoint = (data / "recovery-point-offset-checkpoint").read_text().split("\n")
        assert f"{TP.topic} {TP.partition} 30000" in checkpoint
