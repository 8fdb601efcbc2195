"""Kafka's checkpoint files: the root offset checkpoints and the leader-epoch checkpoint.

Format (Kafka's CheckpointFile), UTF-8 text, one item per line::

    0                      version (0 for every file here)
    2                      number of entries N
    my-topic 0 1234        N entry lines
    my-topic 1 99

Offset checkpoints (`cleaner-offset-checkpoint`, `log-start-offset-checkpoint`,
`recovery-point-offset-checkpoint`, `replication-offset-checkpoint`) hold
`<topic> <partition> <offset>`; the leader-epoch checkpoint inside a partition dir holds
`<epoch> <startOffset>`. Fields are separated by runs of whitespace, as Kafka's reader
splits them; the writer uses single spaces.

Reading follows Kafka: an empty file, or a file that ends after the version line, holds
no entries; a version other than 0, a malformed line or an entry count that differs from
the count line raises `CheckpointError` naming the file and line. A missing file reads
as no entries (Kafka creates it empty on first use; cleanerd does not write into a dir
just to read it).

A cleaner pass rewrites `cleaner-offset-checkpoint` whole, with an entry for every
compacted partition of the dir, so a dir of thousands of partitions must not cost
several Python calls per line at each pass. The rewrite (`OffsetCheckpointFile.rewrite`)
keeps the lines of the entries it does not change. An offset checkpoint in the shape
Kafka and cleanerd write (the version and count lines, then `<topic> <partition>
<offset>` lines with single spaces, a legal topic name, numbers short enough to be in
range) is read by two regular-expression passes over the whole text; any other text
goes to the line-by-line reader, which also names what is wrong. Both give the same
entries for every file the fast one accepts.

Writing goes through `fsutil.atomic_write`: `<file>.tmp`, fsync, rename, dir fsync, so a
crash leaves either the old or the new checkpoint, never a mix.
"""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeVar

from cleanerd.errors import CheckpointError
from cleanerd.log.files import TopicPartition
from cleanerd.log.fsutil import atomic_write

CLEANER_OFFSET_CHECKPOINT: Final = "cleaner-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT: Final = "log-start-offset-checkpoint"
RECOVERY_POINT_OFFSET_CHECKPOINT: Final = "recovery-point-offset-checkpoint"
REPLICATION_OFFSET_CHECKPOINT: Final = "replication-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT: Final = "leader-epoch-checkpoint"

CHECKPOINT_VERSION: Final = 0

_INT = re.compile(r"[+-]?[0-9]+")
# At most 9 partition and 18 offset digits: always within int32 and int64, so only the
# line-by-line reader checks ranges.
_OFFSET_LINE: Final = r"([A-Za-z0-9._-]+) ([0-9]{1,9}) (-?[0-9]{1,18})\n"
_OFFSET_BODY = re.compile(f"(?:{_OFFSET_LINE})*")
_OFFSET_ENTRY = re.compile(_OFFSET_LINE)
_COUNT_HEAD = re.compile(r"0\n([0-9]{1,10})\n")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_WHITESPACE = re.compile(r"[ \t\n\x0b\f\r]+")  # Java's \s: ASCII only

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class EpochEntry:
    """One leader-epoch checkpoint line: the first offset written in `epoch`."""

    epoch: int
    start_offset: int


def _lines(path: Path) -> list[str]:
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"not UTF-8 text ({exc.reason})", path=path) from exc
    lines = _LINE_BREAK.split(text)
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _parse_int(text: str, path: Path, line: int, what: str) -> int:
    if not _INT.fullmatch(text):
        raise CheckpointError(f"{what} {text!r} is not an integer", path=path, line=line)
    return int(text)


def _fields(line: str) -> list[str]:
    # Java's String.split keeps a leading empty field and drops trailing ones.
    parts = _WHITESPACE.split(line)
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def read_checkpoint(path: Path, parse_entry: Callable[[list[str]], T | None]) -> list[T]:
    """Entries of the checkpoint file `path`; `parse_entry` returns None for a bad line."""
    if not path.exists():
        return []
    lines = _lines(path)
    if not lines:
        return []
    version = _parse_int(lines[0], path, 1, "version")
    if version != CHECKPOINT_VERSION:
        raise CheckpointError(f"unrecognised version {version}", path=path, line=1)
    if len(lines) == 1:
        return []
    expected = _parse_int(lines[1], path, 2, "entry count")
    entries: list[T] = []
    for number, line in enumerate(lines[2:], start=3):
        entry = parse_entry(_fields(line))
        if entry is None:
            raise CheckpointError(f"malformed line {line!r}", path=path, line=number)
        entries.append(entry)
    if len(entries) != expected:
        raise CheckpointError(
            f"expected {expected} entries but found {len(entries)}", path=path, line=2
        )
    return entries


def _fast_offsets(text: str) -> dict[TopicPartition, int] | None:
    """The entries of an offset checkpoint in the shape cleanerd and Kafka write (see the
    module docstring), the last line winning as in `read_checkpoint`; None for any other
    text, which the line-by-line reader then reads or rejects."""
    head = _COUNT_HEAD.match(text)
    if head is None or not _OFFSET_BODY.fullmatch(text, head.end()):
        return None
    found = _OFFSET_ENTRY.findall(text, head.end())
    if len(found) != int(head.group(1)):
        return None
    return {TopicPartition(t, int(p)): int(o) for t, p, o in found}


def _read_offsets(path: Path) -> dict[TopicPartition, int]:
    """The entries of the offset checkpoint `path`, parsed whole when it has the usual
    shape (`_fast_offsets`), else line by line (which reports what is wrong)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except (UnicodeDecodeError, FileNotFoundError):
        text = None
    fast = None if text is None else _fast_offsets(text)
    return fast if fast is not None else dict(read_checkpoint(path, _parse_offset_entry))


def format_offsets(offsets: Mapping[TopicPartition, int]) -> bytes:
    """The bytes of an offset checkpoint holding `offsets`, sorted by topic and partition
    (stable diffs; a key function, as the dataclass comparison costs a call per pair)."""
    order = sorted(offsets, key=_TP_KEY)
    return format_checkpoint(_offset_entry(tp, offsets[tp]) for tp in order)


def _offset_entry(tp: TopicPartition, offset: int) -> str:
    return f"{tp.topic} {tp.partition} {offset}"


_TP_KEY: Final = operator.attrgetter("topic", "partition")


def format_checkpoint(lines: Iterable[str]) -> bytes:
    """The bytes of a version-0 checkpoint holding `lines` as entries."""
    body = list(lines)
    entries = "\n".join(body) + "\n" if body else ""
    return f"{CHECKPOINT_VERSION}\n{len(body)}\n{entries}".encode()


def _int_or_none(text: str, bits: int) -> int | None:
    # Java's parseInt / parseLong: decimal, optional sign, within the type's range.
    if not _INT.fullmatch(text):
        return None
    value = int(text)
    return value if -(2 ** (bits - 1)) <= value < 2 ** (bits - 1) else None


def _parse_offset_entry(fields: list[str]) -> tuple[TopicPartition, int] | None:
    if len(fields) != 3 or not fields[0]:
        return None
    partition, offset = _int_or_none(fields[1], 32), _int_or_none(fields[2], 64)
    if partition is None or offset is None:
        return None
    return TopicPartition(fields[0], partition), offset


def _parse_epoch_entry(fields: list[str]) -> EpochEntry | None:
    if len(fields) != 2:
        return None
    epoch, start = _int_or_none(fields[0], 32), _int_or_none(fields[1], 64)
    if epoch is None or start is None:
        return None
    return EpochEntry(epoch, start)


class OffsetCheckpointFile:
    """A root checkpoint mapping each topic-partition to an offset."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[TopicPartition, int]:
        """Entries by topic-partition; the last line wins if a partition repeats.

        The parsed entries are kept per file identity (inode, size, mtime): a file that
        has not changed since it was last read or written by this process is not parsed
        again. Every write replaces the file (a new inode), so a change is never missed;
        a pass over one of thousands of partitions reads the file several times."""
        return dict(self._parsed().offsets)

    def _parsed(self) -> _Parsed:
        try:
            identity = self._identity()
        except FileNotFoundError:
            return _Parsed((0, 0, 0), _read_offsets(self.path))
        cached = _PARSED.get(self.path)
        if cached is not None and cached.identity == identity:
            return cached
        parsed = _Parsed(identity, _read_offsets(self.path))
        _remember(self.path, parsed)
        return parsed

    def write(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Atomically replace the file with `offsets` (sorted for stable diffs)."""
        atomic_write(self.path, format_offsets(offsets))
        self.written(offsets)

    def written(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Note that the file now holds exactly `offsets` (written by this process), so
        the next `read` does not parse it again."""
        _remember(self.path, _Parsed(self._identity(), dict(offsets)))

    def rewrite(
        self,
        tp: TopicPartition,
        offset: int,
        *,
        write: Callable[[Path, bytes], None] = atomic_write,
    ) -> None:
        """Replace the file (through `write`, an atomic replace) with `tp` at `offset` and
        the other entries whose partition dirs are still listed in the file's dir (Kafka
        drops the others): the cleaner's update after each pass.

        A dir of thousands of partitions has a pass per partition, each rewriting every
        entry, so the entries that did not change are neither parsed, formatted nor
        sorted again: their entry lines are kept (per file identity, beside the parsed
        entries, by partition dir name) and written back in the order they have in the
        file, a new partition's last. One listing of the dir tells which partitions are
        still there (a name listed, not a stat per entry)."""
        parsed = self._parsed()
        if parsed.lines is None:
            parsed.lines = {str(t): _offset_entry(t, o) for t, o in parsed.offsets.items()}
        present = set(os.listdir(self.path.parent))  # noqa: PTH208 - names, not Paths
        if parsed.lines.keys() <= present:  # nearly always: one set test, no loop per entry
            lines, offsets = dict(parsed.lines), dict(parsed.offsets)
        else:
            lines = {name: line for name, line in parsed.lines.items() if name in present}
            offsets = {t: o for t, o in parsed.offsets.items() if str(t) in present}
        lines[str(tp)] = _offset_entry(tp, offset)
        offsets[tp] = offset
        write(self.path, format_checkpoint(lines.values()))
        _remember(self.path, _Parsed(self._identity(), offsets, lines))

    def _identity(self) -> tuple[int, int, int]:
        st = self.path.stat()
        return (st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(slots=True)
class _Parsed:
    """An offset checkpoint as last read or written by this process."""

    identity: tuple[int, int, int]
    """(inode, size, mtime) of the file these entries are of."""
    offsets: dict[TopicPartition, int]
    lines: dict[str, str] | None = None
    """Each entry's line (without its newline) by its partition's dir name, in file
    order: made by the first `rewrite` of the file."""


_PARSED: dict[Path, _Parsed] = {}
"""Offset checkpoints as last read or written by this process, by path."""
_PARSED_MAX: Final = 64


def _remember(path: Path, parsed: _Parsed) -> None:
    if path not in _PARSED and len(_PARSED) >= _PARSED_MAX:
        _PARSED.pop(next(iter(_PARSED)))
    _PARSED[path] = parsed


class LeaderEpochCheckpointFile:
    """A partition dir's `leader-epoch-checkpoint`: epoch start offsets, in file order."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> list[EpochEntry]:
        """Entries in file order."""
        return read_checkpoint(self.path, _parse_epoch_entry)

    def write(self, entries: Iterable[EpochEntry]) -> None:
        """Atomically replace the file with `entries`."""
        lines = (f"{e.epoch} {e.start_offset}" for e in entries)
        atomic_write(self.path, format_checkpoint(lines))


@dataclass(frozen=True, slots=True)
class RootCheckpoints:
    """The offsets a log dir's root checkpoint files hold, per partition."""

    cleaner_offsets: dict[TopicPartition, int]
    log_start_offsets: dict[TopicPartition, int]
    recovery_points: dict[TopicPartition, int]
    high_watermarks: dict[TopicPartition, int]

    @classmethod
    def read(cls, log_dir: Path) -> RootCheckpoints:
        """Read the four root checkpoint files of `log_dir` (absent files are empty)."""
        return cls(
            cleaner_offsets=OffsetCheckpointFile(log_dir / CLEANER_OFFSET_CHECKPOINT).read(),
            log_start_offsets=OffsetCheckpointFile(log_dir / LOG_START_OFFSET_CHECKPOINT).read(),
            recovery_points=OffsetCheckpointFile(log_dir / RECOVERY_POINT_OFFSET_CHECKPOINT).read(),
            high_watermarks=OffsetCheckpointFile(log_dir / REPLICATION_OFFSET_CHECKPOINT).read(),
        )
