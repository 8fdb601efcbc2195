"""Kafka's sparse segment indexes: the offset index (`.index`) and the time index
(`.timeindex`).

On-disk format, big-endian, fixed-size entries back to back, nothing else::

    .index      relativeOffset:int32 | position:int32       (8 bytes)
    .timeindex  timestamp:int64      | relativeOffset:int32 (12 bytes)

`relativeOffset` is the offset minus the segment's base offset. An offset-index entry
maps a batch's last offset to the byte position where that batch starts; a time-index
entry says "the largest timestamp at or before this offset is `timestamp`", the offset
being the last offset of the earliest batch holding that timestamp.

Kafka's rules kept here (AbstractIndex, OffsetIndex, TimeIndex):

- lookup returns the greatest entry at or below the target, or `(base offset, 0)` /
  `(-1, base offset)` when there is none; the caller then scans the log forward;
- offsets are strictly increasing; a time-index entry is only written when its
  timestamp is strictly greater than the last one;
- capacity is `segment.index.bytes // entry size` entries; the time index reports
  "full" one slot early so the final entry written when a segment becomes inactive
  (`maybe_append(..., skip_full_check=True)`) always fits;
- which entries exist is decided by `IndexBuilder`, Kafka's per-batch interval rule
  (trunk, KAFKA-806): an entry is added for a batch when more than
  `index.interval.bytes` bytes were appended since the last entry, counted before the
  batch's own bytes, so the first batch of a segment is never indexed.

cleanerd keeps index files trimmed to exactly `entries x entry size` at all times (no
preallocation) and appends entries to the file right after the log bytes they describe
are written. An inactive segment's index is therefore byte-identical to Kafka's trimmed
one, an active segment's index is a valid index Kafka resizes on load, and another
process reading the dir always sees an index no newer than its log. A crash between
the two writes leaves an index missing its newest entry, which is still correct.

Loading tolerates the one foreign shape a Kafka dir can hold: a preallocated index of
an active segment (a live broker, or one that did not shut down cleanly) whose unused
tail is zero bytes. Trailing all-zero entries are ignored: position 0 is never indexed,
so a zero offset-index entry is never real, and a zero time-index entry can only be
real as the first entry of a one-entry file (timestamps strictly increase). A broker
preallocates by extending the file (a sparse tail, 10 MiB by default): when the file
system reports that nothing but holes follows the written part (`SEEK_HOLE`, then no
`SEEK_DATA` after it), only the written part is read, since a hole reads as zeros;
otherwise the whole file is.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
import struct
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Final, Self

import numpy as np
from numpy.typing import NDArray

from cleanerd._jit import jit
from cleanerd.errors import CorruptIndexError
from cleanerd.log.fsutil import atomic_write, fsync_file
from cleanerd.records.header import INT32_MAX, NO_TIMESTAMP

DEFAULT_MAX_INDEX_SIZE: Final = 10 * 1024 * 1024
DEFAULT_INDEX_INTERVAL_BYTES: Final = 4096

OFFSET_ENTRY: Final = struct.Struct(">ii")  # relativeOffset, position
TIME_ENTRY: Final = struct.Struct(">qi")  # timestamp, relativeOffset
assert OFFSET_ENTRY.size == 8
assert TIME_ENTRY.size == 12


class IndexPastLogError(CorruptIndexError):
    """An index entry that refers to bytes or offsets beyond the end of its log: the log
    lost data the index knew about, so the index must not be silently rebuilt."""


@dataclass(frozen=True, slots=True)
class OffsetPosition:
    """An offset-index answer: scan the log from `position` to find `offset`."""

    offset: int
    position: int


@dataclass(frozen=True, slots=True)
class TimestampOffset:
    """A time-index answer: no record at or before `offset` has a timestamp above
    `timestamp`."""

    timestamp: int
    offset: int


_READ_WHOLE = 4096
"""An index file up to this size is read whole when loaded (as cheap as its last entry)."""


def _pread_exact(path: Path | str, size: int, position: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        _check_regular(fd, path)
        return os.pread(fd, size, position)
    finally:
        os.close(fd)


def _check_regular(fd: int, path: Path | str) -> os.stat_result:
    """The stat of the file open at `fd`; an error naming `path` when it is not a
    regular file (a read of a dir fails with an error that names no file)."""
    st = os.fstat(fd)
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(
            errno.EISDIR, "a directory stands where the index file is", str(path)
        )
    if not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return st


def _read_written(fd: int, length: int) -> bytes:
    """The file's bytes up to its sparse tail, if all that follows the first hole is
    hole (which reads as zeros); else all `length` bytes. A live broker's active index is
    a few written blocks before megabytes of preallocated hole: reading them all cost
    31 ms per 10 MiB index, this costs two `lseek`s."""
    hole = length
    try:
        hole = os.lseek(fd, 0, os.SEEK_HOLE)
        if hole < length:
            os.lseek(fd, hole, os.SEEK_DATA)  # ENXIO: no data after the hole
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return os.pread(fd, hole, 0)
    return os.pread(fd, length, 0)


def _write_at(path: Path | str, data: bytes, position: int) -> None:
    """Write `data` at `position` and cut the file right after it; a write that fails
    (a full disk) cuts it at `position`, so no part of an entry is left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        try:
            os.pwrite(fd, data, position)
        except OSError:
            os.ftruncate(fd, position)  # a cut needs no space
            raise
        os.ftruncate(fd, position + len(data))
    finally:
        os.close(fd)


class _Index(ABC):
    """An index file read lazily: the entry count and last entry come from the file's
    size and last bytes; all entries are read only for lookups and checks. New entries
    wait in memory until `flush_entries` appends them."""

    entry: ClassVar[struct.Struct]

    def __init__(
        self, path: Path | str, base_offset: int, *, max_index_size: int = DEFAULT_MAX_INDEX_SIZE
    ) -> None:
        self.os_path = os.fspath(path)
        """The file, for system calls: a `Path` is built only when asked for (`path`), as
        a check of 100,000 segments would build them for nothing."""
        self.base_offset = base_offset
        self.max_entries = max_index_size // self.entry.size
        self.file_exists = False
        self._file_bytes = 0
        self._in_file = 0
        # Entries not yet in the file, one list per field: a rebuild extends them from
        # arrays (`tolist`, no Python per entry) and `_encode` packs them in one call.
        self._pending_a: list[int] = []
        self._pending_b: list[int] = []
        self._last: tuple[int, int] | None = None
        self._columns: tuple[NDArray[np.int64], NDArray[np.int64]] | None = None

    @functools.cached_property
    def path(self) -> Path:
        """The index file."""
        return Path(self.os_path)

    @classmethod
    def load(
        cls, path: Path | str, base_offset: int, *, max_index_size: int = DEFAULT_MAX_INDEX_SIZE
    ) -> Self:
        """Open `path` (an absent file is an empty index with `file_exists` False)."""
        index = cls(path, base_offset, max_index_size=max_index_size)
        index._load()
        return index

    def _load(self) -> None:
        try:
            fd = os.open(self.os_path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            length = _check_regular(fd, self.os_path).st_size
            self.file_exists = True
            self._file_bytes = length
            size = self.entry.size
            if length % size:
                raise CorruptIndexError(
                    f"size {length} is not a multiple of the entry size {size}", path=self.path
                )
            count = length // size
            if count == 0:
                return
            if length <= _READ_WHOLE:  # one read serves the last entry and any check
                raw = os.pread(fd, length, 0)
                self._strip_preallocated(raw)
                if self._in_file == count:
                    self._columns = self._parse(raw)
                return
            last = os.pread(fd, size, length - size)
            if any(last):
                self._in_file = count
                self._last = self.entry.unpack(last)
            else:
                self._strip_preallocated(_read_written(fd, length))
        finally:
            os.close(fd)

    def _strip_preallocated(self, raw: bytes) -> None:
        size = self.entry.size
        # The file can shrink while it is read: a live broker trims an active segment's
        # preallocated index when it rolls it out. What was read is then a prefix of the
        # file before the trim (ending anywhere in its zero tail) or the trimmed file;
        # both hold the same entries, and a part entry at the end can only be zeros.
        raw = raw[: len(raw) - len(raw) % size]
        # The last entry holding a non-zero byte ends where the zeros at the end start.
        used = -(-len(raw.rstrip(b"\0")) // size) or self._zero_entries_kept(len(raw) // size)
        self._in_file = used
        self._last = self.entry.unpack_from(raw, (used - 1) * size) if used else None

    @classmethod
    @functools.cache
    def _table_dtype(cls) -> np.dtype[np.void]:
        """The file's rows as a numpy record type (made once: it costs microseconds)."""
        return np.dtype([("a", f">i{cls.entry.size - 4}"), ("b", ">i4")])

    def _zero_entries_kept(self, count: int) -> int:
        """How many entries of an all-zero file of `count` entries are real."""
        return 0

    @property
    def entries(self) -> int:
        """Number of entries."""
        return self._in_file + len(self._pending_a)

    @property
    def size_in_bytes(self) -> int:
        """Bytes of the trimmed file: entries x entry size (Kafka's sizeInBytes)."""
        return self.entries * self.entry.size

    @property
    def is_full(self) -> bool:
        """No room for another entry (a full index forces a roll)."""
        return self.entries >= self.max_entries

    def relative_offset(self, offset: int) -> int:
        """`offset - base offset`, which must fit an int32 (Kafka's relativeOffset)."""
        rel = offset - self.base_offset
        if not 0 <= rel <= INT32_MAX:
            raise ValueError(
                f"offset {offset} does not fit an int32 relative to base offset "
                f"{self.base_offset} of {self.path}"
            )
        return rel

    def _relative_column(self, offsets: NDArray[np.int64]) -> NDArray[np.int64]:
        """`relative_offset` of every row of an ascending column (its ends decide)."""
        rel = offsets - self.base_offset
        if rel.size and (rel[0] < 0 or rel[-1] > INT32_MAX):
            self.relative_offset(int(offsets[0] if rel[0] < 0 else offsets[-1]))  # raises
        return rel

    def _columns_all(self) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Both fields of every entry, as native int64 columns."""
        if self._columns is None:
            raw = b""
            if self._in_file:
                raw = _pread_exact(self.os_path, self._in_file * self.entry.size, 0)
            self._columns = self._parse(raw + self._pending_bytes())
        return self._columns

    def _parse(self, raw: bytes) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        table = np.frombuffer(raw, dtype=self._table_dtype())
        return (table["a"].astype(np.int64), table["b"].astype(np.int64))

    def _encode(self, first: object, second: object) -> bytes:
        """Entries from two columns (arrays or lists of ints), in the file's format."""
        a = np.asarray(first, dtype=np.int64)
        table = np.empty(a.size, dtype=self._table_dtype())
        table["a"], table["b"] = a, second
        return table.tobytes()

    def _pending_bytes(self) -> bytes:
        if not self._pending_a:
            return b""
        return self._encode(self._pending_a, self._pending_b)

    def _add(self, first: int, second: int) -> None:
        self._pending_a.append(first)
        self._pending_b.append(second)
        self._last = (first, second)
        self._columns = None

    def _extend(self, first: NDArray[np.int64], second: NDArray[np.int64]) -> None:
        """`_add` for every row of two checked columns."""
        if first.size:
            self._pending_a += first.tolist()
            self._pending_b += second.tolist()
            self._last = (self._pending_a[-1], self._pending_b[-1])
            self._columns = None

    def to_bytes(self) -> bytes:
        """The whole trimmed file content."""
        return self._encode(*self._columns_all())

    def flush_entries(self) -> None:
        """Append the entries the file lacks (creating it), so that it holds exactly the
        index's entries and no preallocated tail."""
        target = self.entries * self.entry.size
        if self.file_exists and self._file_bytes == target:
            return
        _write_at(self.os_path, self._pending_bytes(), self._in_file * self.entry.size)
        self._in_file, self._pending_a, self._pending_b = self.entries, [], []
        self._file_bytes, self.file_exists = target, True

    def write(self) -> None:
        """Replace the file atomically with the index's entries (after a rebuild)."""
        atomic_write(self.path, self.to_bytes())
        self._in_file, self._pending_a, self._pending_b = self.entries, [], []
        self._file_bytes, self.file_exists = self.entries * self.entry.size, True

    def fsync(self) -> None:
        """fsync the file if it exists."""
        if self.file_exists:
            fsync_file(self.path)

    @abstractmethod
    def sanity_check(self) -> None:
        """Raise CorruptIndexError if the entries themselves are out of order."""


class OffsetIndex(_Index):
    """A segment's `.index`: sparse map from a batch's last offset to its file position."""

    entry = OFFSET_ENTRY

    @property
    def last_entry(self) -> OffsetPosition:
        """The last entry, or `(base offset, 0)` when empty."""
        if self._last is None:
            return OffsetPosition(self.base_offset, 0)
        return OffsetPosition(self.base_offset + self._last[0], self._last[1])

    @property
    def last_offset(self) -> int:
        """Offset of the last entry, or the base offset when empty."""
        return self.last_entry.offset

    def entry_arrays(self) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Every entry as columns: absolute offsets and positions."""
        rel, pos = self._columns_all()
        return rel + self.base_offset, pos

    def entry_at(self, n: int) -> OffsetPosition:
        """Entry number `n`."""
        rel, pos = self._columns_all()
        return OffsetPosition(self.base_offset + int(rel[n]), int(pos[n]))

    def lookup(self, target_offset: int) -> OffsetPosition:
        """The greatest entry with offset <= target, or `(base offset, 0)` if none."""
        rel, _ = self._columns_all()
        slot = int(np.searchsorted(rel, target_offset - self.base_offset, side="right")) - 1
        if slot < 0:
            return OffsetPosition(self.base_offset, 0)
        return self.entry_at(slot)

    def append(self, offset: int, position: int) -> None:
        """Add an entry; offsets must strictly increase and the index must not be full."""
        if self.is_full:
            raise ValueError(f"attempt to append to a full index {self.path} ({self.entries})")
        if self._last is not None and offset <= self.last_offset:
            raise ValueError(
                f"attempt to append offset {offset} to {self.path}, no larger than the "
                f"last offset {self.last_offset}"
            )
        self._add(self.relative_offset(offset), position)

    def append_many(self, offsets: NDArray[np.int64], positions: NDArray[np.int64]) -> None:
        """`append` for every row, checked on the columns: it raises, with nothing
        added, where `append` would raise for some row."""
        n = offsets.size
        if not n:
            return
        if self.entries + n > self.max_entries:
            raise ValueError(
                f"attempt to append to a full index {self.path} "
                f"({self.entries} entries, {n} more, room for {self.max_entries})"
            )
        floor = self.last_offset if self._last is not None else int(offsets[0]) - 1
        bad = np.flatnonzero(np.diff(offsets, prepend=floor) <= 0)
        if bad.size:
            row = int(bad[0])
            before = floor if row == 0 else int(offsets[row - 1])
            raise ValueError(
                f"attempt to append offset {int(offsets[row])} to {self.path}, no larger "
                f"than the offset before it ({before})"
            )
        self._extend(self._relative_column(offsets), positions)

    def sanity_check(self) -> None:
        """Raise CorruptIndexError unless offsets and positions strictly increase."""
        rel, pos = self._columns_all()
        _check_increasing(rel, "offset", self.os_path, self.base_offset, strict=True)
        _check_increasing(pos, "position", self.os_path, 0, strict=True)
        if rel.size and (rel[0] < 0 or pos[0] < 0):
            raise CorruptIndexError("entry 0 has a negative offset or position", path=self.path)

    def check_within(self, log_size: int, log_path: Path | str) -> None:
        """Raise IndexPastLogError if the last entry points at or past `log_size`, the
        size of the segment's `log_path` (both files named: which one is wrong is not
        known), CorruptIndexError if it points before the log's start (a damaged entry:
        positions are never negative)."""
        last = self.last_entry
        if self.entries and (last.position < 0 or last.offset < self.base_offset):
            raise CorruptIndexError(
                f"entry {self.entries - 1} (offset {last.offset}, position {last.position}) "
                f"is before the start of the log {log_path}",
                path=self.path,
            )
        if self.entries and last.position >= log_size:
            raise IndexPastLogError(
                f"entry {self.entries - 1} (offset {last.offset}) points to position "
                f"{last.position}, past the end of the log {log_path} ({log_size} bytes): "
                "the log was cut short, or the index describes other bytes",
                path=self.path,
            )


class TimeIndex(_Index):
    """A segment's `.timeindex`: the largest timestamp seen up to an offset."""

    entry = TIME_ENTRY

    def _zero_entries_kept(self, count: int) -> int:
        # A one-entry file (0, base) is real: timestamp 0 at the base offset.
        return 1 if count == 1 else 0

    @property
    def is_full(self) -> bool:
        """Full one slot early, so the final entry of an inactive segment always fits."""
        return self.entries >= self.max_entries - 1

    @property
    def last_entry(self) -> TimestampOffset:
        """The last entry, or `(-1, base offset)` when empty (Kafka's default)."""
        if self._last is None:
            return TimestampOffset(NO_TIMESTAMP, self.base_offset)
        return TimestampOffset(self._last[0], self.base_offset + self._last[1])

    def entry_at(self, n: int) -> TimestampOffset:
        """Entry number `n`."""
        ts, rel = self._columns_all()
        return TimestampOffset(int(ts[n]), self.base_offset + int(rel[n]))

    def lookup(self, target_timestamp: int) -> TimestampOffset:
        """The greatest entry with timestamp <= target, or `(-1, base offset)` if none."""
        ts, _ = self._columns_all()
        slot = int(np.searchsorted(ts, target_timestamp, side="right")) - 1
        if slot < 0:
            return TimestampOffset(NO_TIMESTAMP, self.base_offset)
        return self.entry_at(slot)

    def maybe_append(self, timestamp: int, offset: int, *, skip_full_check: bool = False) -> bool:
        """Add `(timestamp, offset)` if the timestamp is strictly greater than the last.

        Returns whether an entry was added. Offsets or timestamps going backwards are
        errors; an equal timestamp is skipped (the final entry of a segment re-appends
        the max timestamp, which is often already the last entry).
        """
        if not skip_full_check and self.is_full:
            raise ValueError(f"attempt to append to a full time index {self.path}")
        last = self.last_entry
        if self._last is not None and offset < last.offset:
            raise ValueError(
                f"attempt to append offset {offset} to {self.path}, below the last offset "
                f"{last.offset}"
            )
        if self._last is not None and timestamp < last.timestamp:
            raise ValueError(
                f"attempt to append timestamp {timestamp} to {self.path}, below the last "
                f"timestamp {last.timestamp}"
            )
        if timestamp <= last.timestamp:
            return False
        self._add(timestamp, self.relative_offset(offset))
        return True

    def append_increasing(self, timestamps: NDArray[np.int64], offsets: NDArray[np.int64]) -> None:
        """`maybe_append` for every row of non-decreasing `timestamps` and `offsets`
        (the running maximum `IndexBuilder` keeps): the rows whose timestamp is above the
        one before them (and above the last entry) are added. It raises, with nothing
        added, where `maybe_append` would raise for some row."""
        if not timestamps.size:
            return
        last = self.last_entry
        if self._last is not None and (offsets[0] < last.offset or timestamps[0] < last.timestamp):
            self.maybe_append(int(timestamps[0]), int(offsets[0]))  # raises
        if (np.diff(timestamps) < 0).any() or (np.diff(offsets) < 0).any():
            raise ValueError(f"timestamps or offsets appended to {self.path} go backwards")
        before = np.empty_like(timestamps)
        before[0] = last.timestamp
        before[1:] = timestamps[:-1]
        keep = timestamps > before
        kept = int(np.count_nonzero(keep))
        # maybe_append checks fullness before it decides; the last row's check is the
        # last one made, with every earlier kept row already added.
        if self.entries + kept - int(keep[-1]) >= self.max_entries - 1:
            raise ValueError(f"attempt to append to a full time index {self.path}")
        self._extend(timestamps[keep], self._relative_column(offsets[keep]))

    def sanity_check(self) -> None:
        """Raise CorruptIndexError unless timestamps strictly increase and offsets never
        decrease."""
        ts, rel = self._columns_all()
        _check_increasing(ts, "timestamp", self.os_path, 0, strict=True)
        _check_increasing(rel, "offset", self.os_path, self.base_offset, strict=False)
        if rel.size and rel[0] < 0:
            raise CorruptIndexError("entry 0 has a negative relative offset", path=self.path)


def _check_increasing(
    values: NDArray[np.int64], what: str, path: Path | str, shift: int, *, strict: bool
) -> None:
    if values.size < 2:
        return  # nothing to compare (numpy costs more than the check on tiny indexes)
    steps = np.diff(values)
    bad = np.flatnonzero(steps <= 0 if strict else steps < 0)
    if bad.size:
        n = int(bad[0]) + 1
        raise CorruptIndexError(
            f"entry {n} has {what} {int(values[n]) + shift}, not above entry {n - 1}'s "
            f"{int(values[n - 1]) + shift}",
            path=path,
        )


class IndexBuilder:
    """Kafka's index maintenance for one segment (LogSegment.append and recover).

    For each batch, in file order: the running max timestamp, and the last offset of the
    earliest batch holding it, are updated; then, if more than `interval_bytes` bytes were
    appended since the last entry (this batch not counted), the batch gets the
    offset-index entry `(last offset, start position)` and the time index gets
    `(max timestamp so far, its offset)` when that timestamp is new. `finish` adds the
    final time-index entry a segment gets when it becomes inactive.
    """

    def __init__(
        self,
        offset_index: OffsetIndex,
        time_index: TimeIndex,
        interval_bytes: int,
        *,
        bytes_since_last_entry: int = 0,
        max_timestamp: int = NO_TIMESTAMP,
        offset_of_max_timestamp: int | None = None,
    ) -> None:
        self.offset_index = offset_index
        self.time_index = time_index
        self.interval_bytes = interval_bytes
        self.bytes_since_last_entry = bytes_since_last_entry
        self.max_timestamp = max_timestamp
        base = offset_index.base_offset
        self.offset_of_max_timestamp = (
            base if offset_of_max_timestamp is None else offset_of_max_timestamp
        )

    def add_batch(self, position: int, size: int, last_offset: int, max_timestamp: int) -> None:
        """Account for the batch of `size` bytes starting at `position`."""
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.offset_of_max_timestamp = last_offset
        if self.bytes_since_last_entry > self.interval_bytes:
            self.offset_index.append(last_offset, position)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self.bytes_since_last_entry = 0
        self.bytes_since_last_entry += size

    def add_batches(
        self,
        position: NDArray[np.int64],
        size: NDArray[np.int64],
        last_offset: NDArray[np.int64],
        max_timestamp: NDArray[np.int64],
    ) -> None:
        """`add_batch` for every row of a batch table: the rule run compiled, the entries
        it picks added as columns (no Python per batch or per entry)."""
        n = len(position)
        rows = np.empty(n, np.int64)
        entry_max = np.empty(n, np.int64)
        entry_offset = np.empty(n, np.int64)
        found = _index_entries(
            position,
            size,
            last_offset,
            max_timestamp,
            self.interval_bytes,
            self.bytes_since_last_entry,
            self.max_timestamp,
            self.offset_of_max_timestamp,
            rows,
            entry_max,
            entry_offset,
        )
        k, since, top, top_offset = (int(x) for x in found)
        entry_rows = rows[:k]
        self.offset_index.append_many(last_offset[entry_rows], position[entry_rows])
        self.time_index.append_increasing(entry_max[:k], entry_offset[:k])
        self.bytes_since_last_entry, self.max_timestamp, self.offset_of_max_timestamp = (
            since,
            top,
            top_offset,
        )

    def finish(self) -> None:
        """Add the final time-index entry (the max timestamp), ignoring fullness."""
        self.time_index.maybe_append(
            self.max_timestamp, self.offset_of_max_timestamp, skip_full_check=True
        )


@jit
def _index_entries(
    position: NDArray[np.int64],
    size: NDArray[np.int64],
    last_offset: NDArray[np.int64],
    max_timestamp: NDArray[np.int64],
    interval: int,
    since: int,
    top: int,
    top_offset: int,
    rows: NDArray[np.int64],
    entry_max: NDArray[np.int64],
    entry_offset: NDArray[np.int64],
) -> tuple[int, int, int, int]:
    """`IndexBuilder.add_batch`'s rule over rows: which rows earn an offset-index entry,
    with the time-index candidate at each; (entries, bytes since, max ts, its offset)."""
    k = 0
    for i in range(position.shape[0]):
        if max_timestamp[i] > top:
            top = max_timestamp[i]
            top_offset = last_offset[i]
        if since > interval:
            rows[k] = i
            entry_max[k] = top
            entry_offset[k] = top_offset
            k += 1
            since = 0
        since += size[i]
    return k, since, top, top_offset
