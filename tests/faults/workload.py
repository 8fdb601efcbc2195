"""The compacted partition the fault tests break, and the independent check of what
survives.

Every record's value names its offset and key (`v<offset>-<key>` and padding), so a
reader can tell each record apart from every other: a record that comes back after it
was compacted away, a record under the wrong offset or a lost one shows. The check reads
the segment files with kafka-python's record reader (an independent codec), CRC-checked,
never with cleanerd's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from cleanerd.log.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleanerd.log.files import TopicPartition, parse_topic_partition
from cleanerd.log.partition_log import LogConfig, PartitionLog
from tests.paths import REPO

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kafka.record.memory_records import MemoryRecords

TOPIC = "big"
TP = TopicPartition(TOPIC, 0)
PADDING = b"x" * 80
LEFTOVER_SUFFIXES = (".cleaned", ".swap", ".deleted")


def key_of(i: int) -> bytes:
    return b"k%06d" % i


def value_of(offset: int, key: bytes) -> bytes:
    return b"v%d-%s-" % (offset, key) + PADDING


@dataclass
class Workload:
    """What was written to the partition: each key's latest offset."""

    latest: dict[bytes, int]

    def add(self, offset: int, key: bytes) -> None:
        self.latest[key] = offset


def write_partition(
    log_dir: Path,
    state_dir: Path,
    *,
    records: int,
    keys: int,
    segment_bytes: int,
    ts: int,
    tp: TopicPartition = TP,
) -> Workload:
    """`records` records over `keys` keys, 100 to a batch (kafka-python's builder), into
    partition `tp` of `log_dir`, with timestamp `ts`."""
    log_dir.mkdir(parents=True, exist_ok=True)
    plog = PartitionLog.create(
        log_dir, tp, config=LogConfig(segment_bytes=segment_bytes), state_dir=state_dir
    )
    work = Workload({})
    chunk: list[bytes] = []
    for base in range(0, records, 100):
        builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
        for offset in range(base, min(base + 100, records)):
            key = key_of(offset % keys)
            builder.append(offset - base, ts, key, value_of(offset, key), [])
            work.add(offset, key)
        batch = bytearray(builder.build())
        batch[0:8] = base.to_bytes(8, "big")  # the builder writes base offset 0
        chunk.append(bytes(batch))
        if len(chunk) == 100:
            plog.append_batches(b"".join(chunk))
            chunk = []
    if chunk:
        plog.append_batches(b"".join(chunk))
    return work


def extra_records(work: Workload, first_offset: int, count: int, ts: int) -> str:
    """`count` records of new keys as `cleanerd produce` input (JSON lines), offsets
    from `first_offset` (the log end), recorded in `work`."""
    lines = []
    for i in range(count):
        key = b"new%05d" % i
        offset = first_offset + i
        lines.append(
            json.dumps(
                {"key": key.decode(), "value": value_of(offset, key).decode(), "timestamp": ts}
            )
        )
        work.add(offset, key)
    return "\n".join(lines) + "\n"


def write_config(path: Path, log_dir: Path, state_dir: Path, **extra: Any) -> Path:
    """A config for the workload's compacted topic; `extra` keys override."""
    doc: dict[str, Any] = {
        "log.dirs": [str(log_dir)],
        "state_dir": str(state_dir),
        "log.cleanup.policy": ["compact"],
        "log.cleaner.min.cleanable.ratio": 0.01,
        "log.segment.delete.delay.ms": 60_000,
        "logging": {"format": "json"},
        **extra,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def records_on_disk(dir_path: Path) -> Iterator[tuple[int, bytes, bytes | None]]:
    """(offset, key, value) of every record of every segment, kafka-python's reader,
    every batch CRC-checked."""
    for seg in sorted(dir_path.glob("*.log")):
        batches = MemoryRecords(seg.read_bytes())
        while (batch := batches.next_batch()) is not None:
            assert batch.validate_crc(), f"{seg}: bad CRC in the batch at {batch.base_offset}"
            for r in batch:
                yield r.offset, r.key, r.value


def verify(dir_path: Path, work: Workload) -> None:
    """What must hold of the partition after any fault and another clean: every key's
    latest record is there with its value; every record is one that was written, under
    its own offset; below the cleaner checkpoint each key appears once (nothing
    compacted away came back); CRCs valid; no `.cleaned`, `.swap` or `.deleted` file."""
    leftovers = [p.name for p in dir_path.iterdir() if p.name.endswith(LEFTOVER_SUFFIXES)]
    assert not leftovers, leftovers
    tp = parse_topic_partition(dir_path.name)
    checkpoint = OffsetCheckpointFile(dir_path.parent / CLEANER_OFFSET_CHECKPOINT).read().get(tp, 0)
    seen: dict[bytes, int] = {}
    clean_keys: set[bytes] = set()
    for offset, key, value in records_on_disk(dir_path):
        assert value == value_of(offset, key), f"offset {offset}: {value!r} is not its record"
        if offset < checkpoint:
            assert key not in clean_keys, f"{key!r} twice below the checkpoint {checkpoint}"
            clean_keys.add(key)
        seen[key] = max(seen.get(key, -1), offset)
    missing = {k: o for k, o in work.latest.items() if seen.get(k) != o}
    assert not missing, (
        f"{len(missing)} keys lost their latest record, e.g. {next(iter(missing.items()))}"
    )
    assert seen.keys() == work.latest.keys()


def cleanerd(
    *args: str, stdin: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the `cleanerd` command (this interpreter's) to its end."""
    return subprocess.run(
        [sys.executable, "-m", "cleanerd", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@contextlib.contextmanager
def started(*args: str) -> Iterator[subprocess.Popen[str]]:
    """`cleanerd ARGS` started in a session of its own (the session holds whatever it
    starts: the fork server, workers, a Spark job); at the end of the block whatever of
    the session still runs is killed and reaped."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cleanerd", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def dir_state(dir_path: Path) -> dict[str, tuple[int, int]]:
    """Name -> (inode, size) of every file: whether anything changed since."""
    return {p.name: (p.stat().st_ino, p.stat().st_size) for p in sorted(dir_path.iterdir())}


def wait_for(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@dataclass
class Daemon:
    """A `cleanerd run` process in a session of its own, its JSON log lines collected."""

    proc: subprocess.Popen[str]
    events: list[dict[str, Any]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    """Every line of its output, JSON or not (a traceback is not)."""
    reader: threading.Thread | None = None

    @classmethod
    def start(cls, config: Path) -> Daemon:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cleanerd", "run", "-c", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
            start_new_session=True,
        )
        daemon = cls(proc)
        daemon.reader = threading.Thread(target=daemon._read, daemon=True)
        daemon.reader.start()
        wait_for(lambda: daemon.saw("startup.done"), 60, "the daemon's startup")
        return daemon

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            with contextlib.suppress(ValueError):
                self.events.append(json.loads(line))

    def saw(self, event: str) -> bool:
        return any(e.get("event") == event for e in list(self.events))

    def kill(self) -> None:
        """SIGKILL the daemon alone (its workers die with it: `engine.lifeline`)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def reap(self) -> None:
        """Kill whatever of the daemon's session still runs; close its output."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        if self.reader is not None:
            self.reader.join(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def cycle_starts_and_lengths(self) -> list[tuple[int, int]]:
        """(start ms, duration ms) of each finished cycle, from its `cycle.done` line."""
        out = []
        for e in list(self.events):
            if e.get("event") == "cycle.done":
                end = int(datetime.fromisoformat(e["timestamp"]).timestamp() * 1000)
                length = int(e["duration_s"] * 1000)
                out.append((end - length, length))
        return out
