"""Watching the log dirs for new and removed partitions and segments, by a bounded poll.

What one scan reads, per log dir and per partition dir in it:

- one `scandir` of the log dir: its `<topic>-<partition>` entries (`-delete`, `-future`,
  `-stray` dirs and anything else are skipped, as `LogDir.partitions` does);
- one `stat` of each partition dir: a file created, renamed or unlinked in the dir moves
  the dir's mtime (and a dir deleted and re-created has a new inode), so only a dir whose
  `(inode, mtime)` changed since the last scan is listed again for its `<base>.log` files;
- one `stat` of each partition's active (highest-base) `.log`: an append moves its size
  and mtime;
- one `stat` of each log dir's `log-start-offset-checkpoint`: an application (or a
  retired broker's last write) that advances a log start offset replaces the file, and
  the segments below the new start are due for deletion at once.

So an idle partition costs two `stat` calls a scan, and a scan of N idle partitions is
O(N) system calls and no reads. Why a poll and not inotify (watchfiles): one inotify
watch per partition dir would be needed (inotify is not recursive), and the default
`fs.inotify.max_user_watches` on many hosts (8192) is below a storage host's partition
count, where a failure to add watches would silently lose events; a poll has no such
limit, works on every filesystem (NFS included) and its cost is predictable.

Bounded cost: the scanner measures each scan's CPU time on its own thread, and
`next_interval_s` stretches the time to the next scan so the watcher's share of one core
stays under `max_duty` (0.5% by default) however many partitions there are, never
scanning more often than every `min_interval_s`. `bench/idle.py` measures the result.

The daemon runs `scan()` in a thread executor (it is file work) and reacts to the
returned `WatchDelta`; `diff_snapshots` is the pure part, testable without files.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Final, NamedTuple

from cleanerd.log.checkpoint import LOG_START_OFFSET_CHECKPOINT
from cleanerd.log.files import (
    LOG_FILE_SUFFIX,
    TopicPartition,
    log_file_offsets,
    parse_topic_partition,
)
from cleanerd.log.known_segments import KnownDir

DEFAULT_MAX_DUTY: Final = 0.005
DEFAULT_MIN_INTERVAL_S: Final = 2.0


class PartitionKey(NamedTuple):
    """A partition in one log dir (the same topic-partition may sit in two log dirs). A
    tuple of plain values, so hashing and ordering 10,000 of them every scan is cheap."""

    log_dir: str
    topic: str
    partition: int

    @classmethod
    def of(cls, log_dir: str, tp: TopicPartition) -> PartitionKey:
        """The key of `tp` in `log_dir`."""
        return cls(log_dir, tp.topic, tp.partition)

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    def __str__(self) -> str:
        return f"{self.log_dir}/{self.topic}-{self.partition}"


class FileStamp(NamedTuple):
    """A file's identity and last write, as `stat` gives them."""

    inode: int
    mtime_ns: int
    size: int


@dataclass(frozen=True, slots=True)
class WatchedPartition:
    """What a scan saw of one partition dir."""

    dir_inode: int
    dir_mtime_ns: int
    segments: tuple[int, ...]
    """Base offsets of the `.log` files, ascending (the last is the active segment)."""
    active_size: int
    active_mtime_ns: int


@dataclass(frozen=True, slots=True)
class WatchSnapshot:
    """Every partition the last scan saw, and the log dirs it could not read."""

    partitions: Mapping[PartitionKey, WatchedPartition] = field(
        default_factory=lambda: MappingProxyType({})
    )
    unreadable_log_dirs: tuple[str, ...] = ()
    start_offsets: Mapping[str, FileStamp] = field(default_factory=lambda: MappingProxyType({}))
    """Each log dir's `log-start-offset-checkpoint` as last seen (absent: no file)."""

    def topic_partitions(self) -> frozenset[TopicPartition]:
        """The topic-partitions present in any log dir."""
        return frozenset(TopicPartition(k.topic, k.partition) for k in self.partitions)


@dataclass(frozen=True, slots=True)
class WatchDelta:
    """What changed between two scans."""

    added_partitions: tuple[PartitionKey, ...] = ()
    removed_partitions: tuple[PartitionKey, ...] = ()
    added_segments: tuple[tuple[PartitionKey, int], ...] = ()
    removed_segments: tuple[tuple[PartitionKey, int], ...] = ()
    appended: tuple[PartitionKey, ...] = ()
    """Partitions whose active segment grew or was rewritten in place."""
    start_offsets: tuple[str, ...] = ()
    """Log dirs whose `log-start-offset-checkpoint` was written."""

    @property
    def changed(self) -> bool:
        """Whether anything changed at all."""
        return bool(
            self.added_partitions
            or self.removed_partitions
            or self.added_segments
            or self.removed_segments
            or self.appended
            or self.start_offsets
        )

    def partitions(self) -> frozenset[PartitionKey]:
        """Every partition the delta mentions."""
        return frozenset(
            [
                *self.added_partitions,
                *self.removed_partitions,
                *(key for key, _ in self.added_segments),
                *(key for key, _ in self.removed_segments),
                *self.appended,
            ]
        )


def diff_snapshots(old: WatchSnapshot, new: WatchSnapshot) -> WatchDelta:
    """The changes from `old` to `new`, each list sorted. A partition whose state object
    is the same in both (the scan keeps it when nothing moved) costs one identity test."""
    before, after = old.partitions, new.partitions
    added_segments: list[tuple[PartitionKey, int]] = []
    removed_segments: list[tuple[PartitionKey, int]] = []
    appended: list[PartitionKey] = []
    for key, now in after.items():
        was = before.get(key)
        if was is None or was is now:
            continue
        if was.segments != now.segments:
            was_set, now_set = set(was.segments), set(now.segments)
            added_segments += [(key, base) for base in now_set - was_set]
            removed_segments += [(key, base) for base in was_set - now_set]
        same_active = was.segments[-1:] == now.segments[-1:]
        if same_active and (was.active_size, was.active_mtime_ns) != (
            now.active_size,
            now.active_mtime_ns,
        ):
            appended.append(key)
    return WatchDelta(
        added_partitions=tuple(sorted(after.keys() - before.keys())),
        removed_partitions=tuple(sorted(before.keys() - after.keys())),
        added_segments=tuple(sorted(added_segments)),
        removed_segments=tuple(sorted(removed_segments)),
        appended=tuple(sorted(appended)),
        start_offsets=tuple(
            sorted(
                d
                for d in old.start_offsets.keys() | new.start_offsets.keys()
                if old.start_offsets.get(d) != new.start_offsets.get(d)
            )
        ),
    )


def _list_segments(dir_path: str) -> tuple[int, ...]:
    # A listing of names: scandir's entry objects cost more than the names' test.
    return tuple(log_file_offsets(os.listdir(dir_path)))  # noqa: PTH208


def _active_log(dir_path: str, base: int) -> str:
    return f"{dir_path}/{base:020d}{LOG_FILE_SUFFIX}"


def scan_partition(dir_path: str, previous: WatchedPartition | None) -> WatchedPartition | None:
    """The state of one partition dir, re-listing it only if it changed since `previous`
    (and returning `previous` itself when nothing moved). None when the dir vanished
    during the scan (a partition deleted meanwhile); `previous` when it cannot be read."""
    try:
        # str paths and os.stat: building a Path per call costs several times the stat.
        st = os.stat(dir_path)  # noqa: PTH116
        same_dir = (
            previous is not None
            and previous.dir_inode == st.st_ino
            and previous.dir_mtime_ns == st.st_mtime_ns
        )
        segments = previous.segments if previous is not None and same_dir else None
        if segments is None:
            segments = _list_segments(dir_path)
    except FileNotFoundError:
        return None
    except OSError:
        return previous  # unreadable for now (permissions, I/O): keep what was seen
    size, mtime_ns = -1, -1
    if segments:
        try:
            active = os.stat(_active_log(dir_path, segments[-1]))  # noqa: PTH116
            size, mtime_ns = active.st_size, active.st_mtime_ns
        except FileNotFoundError:
            # Renamed away (a swap, a deletion) between the listing and now: the dir's
            # mtime moved too, so the next scan lists it again.
            pass
    if (
        previous is not None
        and same_dir
        and previous.active_size == size
        and previous.active_mtime_ns == mtime_ns
    ):
        return previous
    return WatchedPartition(st.st_ino, st.st_mtime_ns, segments, size, mtime_ns)


NameCache = dict[tuple[str, str], PartitionKey | None]
"""(log dir, entry name) -> its partition key, or None for an entry that is not one."""


def _partition_dirs(
    log_dir: str, known: NameCache, seen: NameCache
) -> Iterable[tuple[PartitionKey, str]]:
    with os.scandir(log_dir) as entries:
        for entry in entries:
            cache_key = (log_dir, entry.name)
            if cache_key in known:
                key = known[cache_key]
            else:
                try:
                    key = PartitionKey.of(log_dir, parse_topic_partition(entry.name))
                except ValueError:
                    key = None
            seen[cache_key] = key
            # is_dir() answers from the listing's d_type (a stat only for a symlink).
            if key is not None and entry.is_dir():
                yield key, entry.path


def scan_log_dirs(
    log_dirs: Sequence[Path], previous: WatchSnapshot, names: NameCache | None = None
) -> WatchSnapshot:
    """One scan of every log dir, reusing `previous` for partition dirs that did not
    change, and `names` for dir names parsed before (left holding this scan's names)."""
    known: NameCache = {} if names is None else names
    seen: NameCache = {}
    found: dict[PartitionKey, WatchedPartition] = {}
    unreadable: list[str] = []
    starts: dict[str, FileStamp] = {}
    for log_dir in log_dirs:
        name = str(log_dir)
        try:
            dirs = list(_partition_dirs(name, known, seen))
        except OSError:
            unreadable.append(name)
            continue
        try:
            st = os.stat(f"{name}/{LOG_START_OFFSET_CHECKPOINT}")  # noqa: PTH116
            starts[name] = FileStamp(st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            pass  # no checkpoint (yet), or unreadable: no start offset to act on
        for key, path in dirs:
            state = scan_partition(path, previous.partitions.get(key))
            if state is not None:
                found[key] = state
    if names is not None:
        names.clear()
        names.update(seen)
    return WatchSnapshot(MappingProxyType(found), tuple(unreadable), MappingProxyType(starts))


class LogDirWatcher:
    """Polls `log_dirs`; see the module docstring for what a scan costs and how it is bounded.

    `scan()` is blocking file work: call it from a worker thread, one scan at a time.
    `cpu_clock` measures a scan's CPU time (the calling thread's, by default).
    """

    def __init__(
        self,
        log_dirs: Sequence[Path],
        *,
        max_duty: float = DEFAULT_MAX_DUTY,
        min_interval_s: float = DEFAULT_MIN_INTERVAL_S,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        if not 0 < max_duty <= 1:
            raise ValueError(f"max_duty {max_duty} must be in (0, 1]")
        self.log_dirs = tuple(log_dirs)
        self.max_duty = max_duty
        self.min_interval_s = min_interval_s
        self._cpu_clock = cpu_clock
        self.snapshot = WatchSnapshot()
        self._names: NameCache = {}
        self.last_scan_cpu_s = 0.0

    @property
    def next_interval_s(self) -> float:
        """Seconds to wait before the next scan so scans use at most `max_duty` of a core."""
        return max(self.min_interval_s, self.last_scan_cpu_s / self.max_duty)

    def seed(self, known: Mapping[str, Mapping[str, KnownDir]]) -> None:
        """Before the first scan: take what cleanerd last kept of the partition dirs
        (log dir -> dir name -> `KnownDir`) as if a scan had seen it, so the first scan
        lists only the dirs whose stamp moved since (and stats the others' active
        segment, as every scan does). A start after cleanerd's clean stop then lists
        each dir once, when the first cycle opens it, not twice."""
        seeded: dict[PartitionKey, WatchedPartition] = {}
        for log_dir, dirs in known.items():
            for name, d in dirs.items():
                try:
                    key = PartitionKey.of(log_dir, parse_topic_partition(name))
                except ValueError:
                    continue
                seeded[key] = WatchedPartition(
                    d.inode, d.mtime_ns, d.segments, d.active_size, d.active_mtime_ns
                )
        self.snapshot = WatchSnapshot(MappingProxyType(seeded))

    def scan(self) -> WatchDelta:
        """Scan now; return the changes since the previous scan (the first scan reports
        every partition as added) and keep the new snapshot."""
        start = self._cpu_clock()
        new = scan_log_dirs(self.log_dirs, self.snapshot, self._names)
        delta = diff_snapshots(self.snapshot, new)
        self.snapshot = new
        self.last_scan_cpu_s = self._cpu_clock() - start
        return delta
