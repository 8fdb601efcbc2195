"""A stand-in Kafka broker: another process that changes a log dir the way a live broker
does, for the tests of what cleanerd does beside one (observe mode).

It holds `<log dir>/.lock` with `fcntl.lockf` (as Kafka's `FileChannel.tryLock`), and
with its own codec (kafka-python's `DefaultRecordBatchBuilder` and `MemoryRecords`,
never cleanerd's) it does, in a loop, what a broker does to its files:

- appends batches to each partition's active segment, sometimes in two writes with a
  pause between them (a reader sees a partial batch at the tail, completed later), and
  adds `.index` / `.timeindex` entries every `INDEX_INTERVAL` bytes; the active
  segment's index files are preallocated (sparse) and trimmed when it is rolled out;
- rolls segments (new `.log`, `.index`, `.timeindex`) when the next batch would not fit,
  or at random (`segment.ms`);
- compacts the compacted topic the Kafka way: the cleaned segments are written as
  `<base>.log.cleaned` (and `.index.cleaned`, `.timeindex.cleaned`), renamed to `.swap`,
  the replaced segments renamed to `.deleted`, the `.swap` files renamed to their final
  names, and the `.deleted` files removed after `DELETE_DELAY_S`; then
  `cleaner-offset-checkpoint` moves to the end of the cleaned range;
- deletes the oldest segments of the delete-policy topic (retention: `.deleted`, then
  removed) and raises its log start offset;
- rewrites `recovery-point-offset-checkpoint`, `replication-offset-checkpoint`,
  `log-start-offset-checkpoint` and `cleaner-offset-checkpoint` through `<name>.tmp` and
  a rename.

Every path it creates, writes, renames (both names) or removes is appended to a journal
(paths relative to the log dir, one a line) before the change, so a test can tell its
changes from anyone else's.

Protocol on stdin/stdout: it sets the dir up, prints `ready` and waits for a line on
stdin; then it runs its loop for the given seconds, finishes every partial batch and
pending deletion, prints `idle` and keeps holding `.lock` until stdin closes.

    python -m tests.standin_broker LOG_DIR JOURNAL SECONDS [SEED]
"""

from __future__ import annotations

import os
import random
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from tests.holders import lock_like_kafka

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kafka.record.memory_records import MemoryRecords

COMPACTED: Final = "t"
"""The compacted topic's partitions (cleanup.policy=compact)."""
DELETED: Final = "r"
"""The delete-policy topic's partitions (retention by segment count)."""
PARTITIONS: Final = ((COMPACTED, 0), (COMPACTED, 1), (COMPACTED, 2), (DELETED, 0))
SEGMENT_BYTES: Final = 8 * 1024
INDEX_INTERVAL: Final = 1024
INDEX_BYTES: Final = 10 * 1024 * 1024
"""Kafka's default `segment.index.bytes`: the active segment's index files preallocated."""
DELETE_DELAY_S: Final = 1.0
KEYS: Final = 20
KEEP_SEGMENTS: Final = 3
"""The delete-policy topic keeps this many segments besides the active one."""
STEP_S: Final = 0.01
CHECKPOINT_EVERY_S: Final = 0.4


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def segment_name(base: int, suffix: str) -> str:
    return f"{base:020d}{suffix}"


class Journal:
    """The file listing every path this process changes, flushed line by line."""

    def __init__(self, path: Path, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._out = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the process

    def touch(self, path: Path) -> Path:
        self._out.write(str(path.relative_to(self.log_dir)) + "\n")
        self._out.flush()
        return path


@dataclass
class Segment:
    base: int
    size: int = 0
    next_offset: int = 0
    index_entries: int = 0
    time_entries: int = 0
    since_index: int = 0
    max_ts: int = -1
    offset_of_max_ts: int = -1
    last_time_entry: int = -1


@dataclass
class Partition:
    topic: str
    partition: int
    dir: Path
    segments: list[Segment] = field(default_factory=list)
    log_start: int = 0
    cleaned_to: int = 0
    pending_tail: bytes = b""
    pending_batch: tuple[int, int, int, int] | None = None
    """(last offset, position, timestamp, size) of the batch whose tail is not written yet."""

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def active(self) -> Segment:
        return self.segments[-1]

    def path(self, base: int, suffix: str) -> Path:
        return self.dir / segment_name(base, suffix)


class Broker:
    """The stand-in's state and its file operations (one thread)."""

    def __init__(self, log_dir: Path, journal: Journal, rng: random.Random) -> None:
        self.log_dir = log_dir
        self.journal = journal
        self.rng = rng
        self.partitions = [Partition(t, p, log_dir / f"{t}-{p}") for t, p in PARTITIONS]
        self.to_delete: list[tuple[float, Path]] = []
        self.seq = 0

    # -- files ---------------------------------------------------------------------------

    def write_new(self, path: Path, data: bytes) -> None:
        self.journal.touch(path)
        path.write_bytes(data)

    def append_bytes(self, path: Path, data: bytes) -> None:
        self.journal.touch(path)
        with open(path, "ab") as f:
            f.write(data)

    def pwrite(self, path: Path, data: bytes, at: int) -> None:
        self.journal.touch(path)
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, data, at)
        finally:
            os.close(fd)

    def truncate(self, path: Path, size: int) -> None:
        self.journal.touch(path)
        os.truncate(path, size)

    def rename(self, src: Path, dst: Path) -> None:
        self.journal.touch(src)
        self.journal.touch(dst)
        src.rename(dst)

    def remove(self, path: Path) -> None:
        self.journal.touch(path)
        path.unlink(missing_ok=True)  # a later `.deleted` of the same name replaced it

    def write_checkpoint(self, name: str, entries: dict[str, int]) -> None:
        """Kafka's offset checkpoint format, written to `<name>.tmp` and renamed over."""
        lines = ["0", str(len(entries))]
        for tp, offset in sorted(entries.items()):
            topic, _, partition = tp.rpartition("-")
            lines.append(f"{topic} {partition} {offset}")
        tmp = self.log_dir / f"{name}.tmp"
        self.journal.touch(tmp)
        with open(tmp, "w", encoding="ascii") as f:
            f.write("\n".join(lines) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.rename(tmp, self.log_dir / name)

    # -- segments ------------------------------------------------------------------------

    def create_segment(self, p: Partition, base: int, suffix: str = "") -> Segment:
        """A new empty segment; its index files preallocated as Kafka's active ones."""
        self.write_new(p.path(base, ".log" + suffix), b"")
        for ext, entry in ((".index", 8), (".timeindex", 12)):
            path = p.path(base, ext + suffix)
            self.write_new(path, b"")
            self.truncate(path, INDEX_BYTES // entry * entry)
        return Segment(base, next_offset=base)

    def seal(self, p: Partition, seg: Segment, suffix: str = "") -> None:
        """What Kafka does to a segment that stops being active: the last time index
        entry, then both indexes trimmed to their entries."""
        if seg.max_ts >= 0 and seg.last_time_entry != seg.offset_of_max_ts:
            self.add_time_entry(p, seg, suffix)
        self.truncate(p.path(seg.base, ".index" + suffix), seg.index_entries * 8)
        self.truncate(p.path(seg.base, ".timeindex" + suffix), seg.time_entries * 12)

    def add_time_entry(self, p: Partition, seg: Segment, suffix: str = "") -> None:
        entry = seg.max_ts.to_bytes(8, "big") + (seg.offset_of_max_ts - seg.base).to_bytes(4, "big")
        self.pwrite(p.path(seg.base, ".timeindex" + suffix), entry, seg.time_entries * 12)
        seg.time_entries += 1
        seg.last_time_entry = seg.offset_of_max_ts

    def index_batch(
        self,
        p: Partition,
        seg: Segment,
        last: int,
        position: int,
        ts: int,
        size: int,
        suffix: str = "",
    ) -> None:
        """Kafka's LogSegment.append bookkeeping for one batch at `position`."""
        seg.size = position + size
        seg.next_offset = last + 1
        if ts > seg.max_ts:
            seg.max_ts, seg.offset_of_max_ts = ts, last
        seg.since_index += size
        if seg.since_index > INDEX_INTERVAL:
            entry = (last - seg.base).to_bytes(4, "big") + position.to_bytes(4, "big")
            self.pwrite(p.path(seg.base, ".index" + suffix), entry, seg.index_entries * 8)
            seg.index_entries += 1
            if seg.last_time_entry != seg.offset_of_max_ts:
                self.add_time_entry(p, seg, suffix)
            seg.since_index = 0

    def roll(self, p: Partition) -> None:
        old = p.active
        if old.size == 0:
            return  # Kafka never rolls an empty segment
        new = self.create_segment(p, old.next_offset)
        self.seal(p, old)
        p.segments.append(new)

    # -- the broker's work ----------------------------------------------------------------

    def batch(self, base: int, count: int) -> tuple[bytes, int]:
        """One v2 batch of `count` records from offset `base`, kafka-python's codec."""
        ts = now_ms()
        builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
        for i in range(count):
            self.seq += 1
            key = b"k%d" % self.rng.randrange(KEYS)
            value = b"v%d-" % self.seq + b"x" * self.rng.randrange(20, 200)
            builder.append(i, ts, key, value, [])
        data = bytearray(builder.build())
        data[0:8] = base.to_bytes(8, "big")  # the builder writes base offset 0
        return bytes(data), ts

    def produce(self, p: Partition, *, torn: bool) -> None:
        """Append one batch; `torn`: only its first part now, the rest at the next step."""
        if p.pending_batch is not None:
            self.finish_tail(p)
            return
        data, ts = self.batch(p.active.next_offset, self.rng.randrange(1, 6))
        if p.active.size and p.active.size + len(data) > SEGMENT_BYTES:
            self.roll(p)
        seg = p.active
        last = seg.next_offset + int.from_bytes(data[23:27], "big")
        log = p.path(seg.base, ".log")
        if torn:
            cut = self.rng.randrange(1, len(data))
            self.append_bytes(log, data[:cut])
            p.pending_tail, p.pending_batch = data[cut:], (last, seg.size, ts, len(data))
            seg.next_offset = last + 1  # reserved; the index waits for the whole batch
            return
        self.append_bytes(log, data)
        self.index_batch(p, seg, last, seg.size, ts, len(data))

    def finish_tail(self, p: Partition) -> None:
        if p.pending_batch is None:
            return
        last, position, ts, size = p.pending_batch
        self.append_bytes(p.path(p.active.base, ".log"), p.pending_tail)
        self.index_batch(p, p.active, last, position, ts, size)
        p.pending_tail, p.pending_batch = b"", None

    def clean(self, p: Partition) -> None:
        """Compact every segment before the active one, Kafka's way: the cleaned
        segments (grouped by their sources' sizes) go `.cleaned` -> `.swap`, the sources
        to `.deleted`, the swaps to their names; the checkpoint follows."""
        sources = p.segments[:-1]
        if len(sources) < 2:
            return
        records: dict[int, list[tuple[int, int, bytes, bytes]]] = {}
        latest: dict[bytes, int] = {}
        for seg in sources:
            batches = MemoryRecords(p.path(seg.base, ".log").read_bytes())
            rows = records.setdefault(seg.base, [])
            while (b := batches.next_batch()) is not None:
                for r in b:
                    rows.append((r.offset, r.timestamp, r.key, r.value))
                    latest[r.key] = r.offset
        groups: list[list[Segment]] = [[]]
        for seg in sources:
            if groups[-1] and sum(s.size for s in groups[-1]) + seg.size > SEGMENT_BYTES:
                groups.append([])
            groups[-1].append(seg)
        cleaned: list[Segment] = []
        for group in groups:
            out = self.create_segment(p, group[0].base, ".cleaned")
            log = p.path(out.base, ".log.cleaned")
            for seg in group:
                kept = [r for r in records[seg.base] if latest[r[2]] == r[0]]
                for i in range(0, len(kept), 3):  # rebatched three by three
                    chunk = kept[i : i + 3]
                    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
                    for offset, ts, key, value in chunk:
                        builder.append(offset - chunk[0][0], ts, key, value, [])
                    data = bytearray(builder.build())
                    data[0:8] = chunk[0][0].to_bytes(8, "big")
                    position = out.size
                    self.append_bytes(log, bytes(data))
                    self.index_batch(
                        p,
                        out,
                        chunk[-1][0],
                        position,
                        max(r[1] for r in chunk),
                        len(data),
                        ".cleaned",
                    )
            out.next_offset = group[-1].next_offset
            self.seal(p, out, ".cleaned")
            mtime = max(p.path(s.base, ".log").stat().st_mtime_ns for s in group)
            os.utime(log, ns=(mtime, mtime))  # Kafka keeps the sources' last modified
            cleaned.append(out)
        for out in reversed(cleaned):
            for ext in (".log", ".index", ".timeindex"):
                self.rename(p.path(out.base, ext + ".cleaned"), p.path(out.base, ext + ".swap"))
        for seg in sources:
            self.delete_later(p, seg)
        for out in cleaned:
            for ext in (".log", ".index", ".timeindex"):
                self.rename(p.path(out.base, ext + ".swap"), p.path(out.base, ext))
        p.segments = [*cleaned, p.active]
        p.cleaned_to = p.active.base
        self.write_checkpoint("cleaner-offset-checkpoint", self.entries("cleaned_to", COMPACTED))

    def delete_later(self, p: Partition, seg: Segment) -> None:
        """Kafka's asyncDeleteSegment: renamed to `.deleted` now, removed after the file
        delete delay."""
        for ext in (".log", ".index", ".timeindex"):
            src = p.path(seg.base, ext)
            dst = src.with_name(src.name + ".deleted")
            self.rename(src, dst)
            self.to_delete.append((time.monotonic() + DELETE_DELAY_S, dst))

    def retain(self, p: Partition) -> None:
        """Retention by segment count: the oldest segments beyond KEEP_SEGMENTS go."""
        while len(p.segments) - 1 > KEEP_SEGMENTS:
            self.delete_later(p, p.segments.pop(0))
            p.log_start = p.segments[0].base

    def remove_due(self, *, all_of_them: bool = False) -> None:
        now = time.monotonic()
        for due, path in list(self.to_delete):
            if all_of_them or due <= now:
                self.remove(path)
                self.to_delete.remove((due, path))

    def entries(self, attr: str, topic: str | None = None) -> dict[str, int]:
        return {
            p.name: int(getattr(p, attr))
            for p in self.partitions
            if topic is None or p.topic == topic
        }

    def checkpoints(self) -> None:
        self.write_checkpoint(
            "recovery-point-offset-checkpoint", {p.name: p.active.base for p in self.partitions}
        )
        self.write_checkpoint(
            "replication-offset-checkpoint",
            {p.name: p.active.next_offset for p in self.partitions if p.pending_batch is None},
        )
        self.write_checkpoint("log-start-offset-checkpoint", self.entries("log_start"))

    # -- the process ----------------------------------------------------------------------

    def setup(self) -> None:
        """A broker's log dir: meta.properties, each partition with a few segments."""
        self.write_new(
            self.log_dir / "meta.properties",
            b"#\n#stand-in broker\ncluster.id=rwd2jqiwRaCycLq7mKVHXA\n"
            b"directory.id=AiSXPLrdRM-HREWplhnaNA\nnode.id=1\nversion=1\n",
        )
        for p in self.partitions:
            self.journal.touch(p.dir)
            p.dir.mkdir()
            self.write_new(
                p.dir / "partition.metadata", b"version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAQ\n"
            )
            p.segments.append(self.create_segment(p, 0))
            while len(p.segments) < 3:
                self.produce(p, torn=False)
        self.checkpoints()

    def run(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        next_checkpoint = 0.0
        while time.monotonic() < end:
            p = self.rng.choice(self.partitions)
            roll = self.rng.random()
            if p.pending_batch is not None:
                self.finish_tail(p)
            elif roll < 0.02:
                self.roll(p)  # segment.ms
            elif roll < 0.05 and p.topic == COMPACTED:
                self.clean(p)
            else:
                self.produce(p, torn=roll > 0.85)
            if p.topic == DELETED:
                self.retain(p)
            self.remove_due()
            if time.monotonic() >= next_checkpoint:
                self.checkpoints()
                next_checkpoint = time.monotonic() + CHECKPOINT_EVERY_S
            time.sleep(STEP_S)
        for p in self.partitions:
            self.finish_tail(p)
        self.remove_due(all_of_them=True)
        self.checkpoints()


def main(argv: list[str]) -> None:
    log_dir, journal = Path(argv[0]), Path(argv[1])
    seconds = float(argv[2])
    seed = int(argv[3]) if len(argv) > 3 else 0
    log_dir.mkdir(parents=True, exist_ok=True)
    j = Journal(journal, log_dir)
    j.touch(log_dir / ".lock")
    lock_like_kafka(log_dir)
    broker = Broker(log_dir, j, random.Random(seed))
    broker.setup()
    print("ready", flush=True)
    sys.stdin.readline()
    broker.run(seconds)
    print("idle", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main(sys.argv[1:])
