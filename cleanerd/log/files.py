"""File and directory names of a Kafka log dir (Kafka's LogFileUtils and the dir parsing
of UnifiedLog).

Inside a partition dir every segment is named by its base offset, zero padded to 20
digits, with one file per kind::

    00000000000000001234.log        record batches
    00000000000000001234.index      offset index
    00000000000000001234.timeindex  time index
    00000000000000001234.txnindex   aborted transactions (absent when there are none)
    00000000000000001234.snapshot   producer state at that offset

A rewrite appends a state suffix after the extension: `.cleaned` (output being written),
`.swap` (output complete, replacing old segments), `.deleted` (old files awaiting
deletion). The offset of any such file is the text before its first `.`.

cleanerd only ever renames, rewrites or deletes files whose names are exactly that
shape: 20 ASCII digits, a kind, at most one state suffix (`is_segment_file_name`). Kafka
itself parses any run of digits before the first `.`, but never writes anything but 20,
so a name that ends like a segment file and does not have that stem
(`00000000000000000abc.log`, `123.log`, `orders.index.swap`) was put there by something
else: `malformed_segment_file_name` says why, recovery reports it and leaves it alone.

A partition dir is `<topic>-<partition>`, split at the last `-` because topic names may
contain `-` and `.`. A dir that the broker is deleting, moving between log dirs or found
stray is renamed `<topic>-<partition>.<32 hex uuid>-delete` (`-future`, `-stray`); those
dirs are never partitions that cleanerd may touch.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Final

from cleanerd.logger import get_logger

log = get_logger(__name__)

LOG_FILE_SUFFIX: Final = ".log"
INDEX_FILE_SUFFIX: Final = ".index"
TIME_INDEX_FILE_SUFFIX: Final = ".timeindex"
TXN_INDEX_FILE_SUFFIX: Final = ".txnindex"
PRODUCER_SNAPSHOT_FILE_SUFFIX: Final = ".snapshot"

CLEANED_FILE_SUFFIX: Final = ".cleaned"
SWAP_FILE_SUFFIX: Final = ".swap"
DELETED_FILE_SUFFIX: Final = ".deleted"

DELETE_DIR_SUFFIX: Final = "-delete"
FUTURE_DIR_SUFFIX: Final = "-future"
STRAY_DIR_SUFFIX: Final = "-stray"
SPECIAL_DIR_SUFFIXES: Final = (DELETE_DIR_SUFFIX, FUTURE_DIR_SUFFIX, STRAY_DIR_SUFFIX)

INDEX_SUFFIXES: Final = (INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX, TXN_INDEX_FILE_SUFFIX)
SEGMENT_FILE_KINDS: Final = (LOG_FILE_SUFFIX, *INDEX_SUFFIXES, PRODUCER_SNAPSHOT_FILE_SUFFIX)
STATE_SUFFIXES: Final = (CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX, DELETED_FILE_SUFFIX)

METADATA_TOPIC: Final = "__cluster_metadata"
LOCK_FILE_NAME: Final = ".lock"
CLEAN_SHUTDOWN_FILE_NAME: Final = ".kafka_cleanshutdown"  # Kafka's marker of a clean stop

OFFSET_DIGITS: Final = 20

_SPECIAL_DIR = re.compile(r"^(\S+)-(\S+)\.(\S+)(-delete|-future|-stray)$")
_KINDS = "|".join(re.escape(k) for k in SEGMENT_FILE_KINDS)
_STATES = "|".join(re.escape(s) for s in STATE_SUFFIXES)
# What follows a segment file's stem: a kind and at most one state suffix.
_SEGMENT_TAIL = re.compile(rf"(?:{_KINDS})(?:{_STATES})?")
_SEGMENT_FILE = re.compile(rf"[0-9]{{{OFFSET_DIGITS}}}{_SEGMENT_TAIL.pattern}")
_SEGMENT_FILE_PARTS = re.compile(rf"([0-9]{{{OFFSET_DIGITS}}})({_KINDS})({_STATES})?")

# Whole names within a `listing_text`: each pattern starts at a `/` and ends before one.
_STEM = rf"([0-9]{{{OFFSET_DIGITS}}})"
LOG_NAMES: Final = re.compile(rf"/{_STEM}{re.escape(LOG_FILE_SUFFIX)}(?=/)")
"""Well-formed `.log` names (group: the stem)."""
INDEX_NAMES: Final = re.compile(rf"/{_STEM}({'|'.join(re.escape(k) for k in INDEX_SUFFIXES)})(?=/)")
"""Well-formed index names, no state suffix (groups: the stem, the kind)."""
SNAPSHOT_NAMES: Final = re.compile(rf"/{_STEM}{re.escape(PRODUCER_SNAPSHOT_FILE_SUFFIX)}(?=/)")
"""Well-formed producer snapshot names (group: the stem)."""
STATE_NAMES: Final = re.compile(rf"/{_STEM}(?:{_KINDS})(?:{_STATES})(?=/)")
"""Well-formed segment file names with a state suffix."""
MALFORMED_NAMES: Final = re.compile(
    rf"/(?![0-9]{{{OFFSET_DIGITS}}}\.)[^/.]*(?:{_KINDS})(?:{_STATES})?(?=/)"
)
"""Names that look like segment files (`looks_like_segment_file`) and are not well formed."""


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    """A topic and partition number; `str()` is Kafka's `<topic>-<partition>` dir name."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


def filename_prefix_from_offset(offset: int) -> str:
    """The 20-digit zero-padded name stem of a segment whose base offset is `offset`."""
    if offset < 0:
        raise ValueError(f"negative offset {offset} cannot name a segment")
    return str(offset).zfill(OFFSET_DIGITS)


def offset_from_filename(filename: str) -> int:
    """The offset a file name encodes: the text before its first `.`.

    Raises ValueError for names that do not start with a decimal offset (for example
    `leader-epoch-checkpoint`), which callers skip as Kafka does.
    """
    stem = filename.split(".", 1)[0]
    if not stem.isdigit() or not stem.isascii():
        raise ValueError(f"{filename!r} does not start with an offset")
    return int(stem)


def special_dir_suffix(dirname: str) -> str | None:
    """`-delete`, `-future` or `-stray` when `dirname` ends with one of them, else None."""
    for suffix in SPECIAL_DIR_SUFFIXES:
        if dirname.endswith(suffix):
            return suffix
    return None


MAX_PARTITION: Final = 2**31 - 1
"""Kafka's partition ids are Java ints: a dir numbered above is no partition of Kafka's
(its checkpoint lines would not parse there either)."""


MAX_TOPIC_LENGTH: Final = 249
"""Kafka's longest topic name (`Topic.MAX_NAME_LENGTH`)."""
_LEGAL_TOPIC: Final = re.compile(rf"[a-zA-Z0-9._-]{{1,{MAX_TOPIC_LENGTH}}}")
"""Kafka's legal topic names (`Topic.validate`): a space, a slash or a newline in one
would break the dir's checkpoint lines (`<topic> <partition> <offset>`) or its path."""


class MisnamedPartitionDir(ValueError):
    """A partition dir's name that is not the one Kafka gives it (`parse_topic_partition`)."""


_misnamed_said: set[str] = set()
"""The misnamed dirs `list_partitions` warned of (once per process each)."""


def parse_topic_partition(dirname: str) -> TopicPartition:
    """Parse a live partition dir name `<topic>-<partition>`.

    Raises ValueError when the name is not one: no `-`, an empty topic, a partition that
    is not a decimal number or is above `MAX_PARTITION`, or a `-delete` / `-future` /
    `-stray` dir (whose well-formed shape is `<topic>-<partition>.<uuid>-delete`;
    malformed ones are rejected too); `MisnamedPartitionDir` for a partition number with
    a leading zero (`orders-07`), which Kafka never writes: everything here names a
    partition's dir `<log dir>/<topic>-<partition>`, so such a dir would be read under a
    name that is not its own (and `orders-07` beside `orders-7` would be one partition);
    and for a topic name Kafka does not allow.
    """
    suffix = special_dir_suffix(dirname)
    if suffix is not None:
        shape = "well-formed" if _SPECIAL_DIR.match(dirname) else "malformed"
        raise ValueError(f"{dirname!r} is a {shape} {suffix} dir, not a live partition dir")
    topic, sep, partition = dirname.rpartition("-")
    if not sep or not topic or not partition.isdigit() or not partition.isascii():
        raise ValueError(f"{dirname!r} is not a <topic>-<partition> dir name")
    if _LEGAL_TOPIC.fullmatch(topic) is None or topic in (".", ".."):
        raise MisnamedPartitionDir(
            f"{dirname!r}: {topic!r} is no legal Kafka topic name (at most "
            f"{MAX_TOPIC_LENGTH} ASCII letters, digits, '.', '_' and '-'; not '.' nor '..'): "
            "a broker would not load the dir, and its checkpoint lines would not parse"
        )
    if int(partition) > MAX_PARTITION:
        raise ValueError(f"{dirname!r}: partition {partition} is above Kafka's {MAX_PARTITION}")
    if partition != str(int(partition)):
        raise MisnamedPartitionDir(
            f"{dirname!r}: the partition number has a leading zero; Kafka names this "
            f"partition's dir {topic}-{int(partition)}"
        )
    return TopicPartition(topic, int(partition))


def is_segment_file_name(filename: str) -> bool:
    """`<20 ASCII digits><kind>[<state suffix>]`: the only names cleanerd ever renames,
    rewrites or deletes (kinds `.log`, `.index`, `.timeindex`, `.txnindex`, `.snapshot`;
    states `.cleaned`, `.swap`, `.deleted`)."""
    return _SEGMENT_FILE.fullmatch(filename) is not None


def segment_file_parts(filename: str) -> tuple[str, str, str | None] | None:
    """(stem, kind, state suffix or None) of a well-formed segment file name, else None:
    one match where a caller would otherwise test the name several times."""
    parts = _SEGMENT_FILE_PARTS.fullmatch(filename)
    return None if parts is None else parts.groups()  # type: ignore[return-value]


def looks_like_segment_file(filename: str) -> bool:
    """Whether the text from the first `.` on is a segment file's kind and optional state
    suffix, whatever comes before it."""
    _, dot, tail = filename.partition(".")
    return bool(dot) and _SEGMENT_TAIL.fullmatch(dot + tail) is not None


def malformed_segment_file_name(filename: str) -> str | None:
    """Why a name that ends like a segment file is not one, or None (a well-formed segment
    file name, or a name that does not end like one, such as `leader-epoch-checkpoint`)."""
    if is_segment_file_name(filename) or not looks_like_segment_file(filename):
        return None  # the common case (a well-formed name) decided by one match
    stem = filename.split(".", 1)[0]
    if stem.isascii() and stem.isdigit():
        return f"its offset {stem!r} has {len(stem)} digits, not {OFFSET_DIGITS}"
    return f"{stem!r} before the first '.' is not a {OFFSET_DIGITS}-digit offset"


def is_log_file(filename: str) -> bool:
    """A well-formed segment data file name (`.log`, no state suffix)."""
    return filename.endswith(LOG_FILE_SUFFIX) and is_segment_file_name(filename)


def listing_text(names: Iterable[str]) -> str:
    """A dir's names as one text, `/a/b/c/`: `/` is the one character no file name holds,
    so the `..._NAMES` patterns, anchored between two, match whole names only. A start
    reads 10,000 listings of tens of names; one regex pass over each in place of a test
    per name is several times cheaper."""
    return "/" + "/".join(names) + "/"


def log_file_offsets(names: Iterable[str]) -> list[int]:
    """The base offsets of the well-formed `.log` names (`is_log_file`) among `names`,
    ascending."""
    return sorted(map(int, LOG_NAMES.findall(listing_text(names))))


def is_index_file(filename: str) -> bool:
    """A well-formed offset, time or transaction index file name (no state suffix)."""
    return filename.endswith(INDEX_SUFFIXES) and is_segment_file_name(filename)


def segment_file(dir_path: Path, base_offset: int, kind: str, suffix: str = "") -> Path:
    """`<dir>/<20-digit base><kind><suffix>`, e.g. kind `.index`, suffix `.swap`."""
    return dir_path / f"{filename_prefix_from_offset(base_offset)}{kind}{suffix}"


def log_file(dir_path: Path, base_offset: int, suffix: str = "") -> Path:
    """The `.log` file of the segment at `base_offset`."""
    return segment_file(dir_path, base_offset, LOG_FILE_SUFFIX, suffix)


def offset_index_file(dir_path: Path, base_offset: int, suffix: str = "") -> Path:
    """The `.index` file of the segment at `base_offset`."""
    return segment_file(dir_path, base_offset, INDEX_FILE_SUFFIX, suffix)


def time_index_file(dir_path: Path, base_offset: int, suffix: str = "") -> Path:
    """The `.timeindex` file of the segment at `base_offset`."""
    return segment_file(dir_path, base_offset, TIME_INDEX_FILE_SUFFIX, suffix)


def txn_index_file(dir_path: Path, base_offset: int, suffix: str = "") -> Path:
    """The `.txnindex` file of the segment at `base_offset`."""
    return segment_file(dir_path, base_offset, TXN_INDEX_FILE_SUFFIX, suffix)


def partition_dir_gone(path: Path) -> bool:
    """Whether the partition dir `path` is no longer there: a broker deleting its topic
    renames it (`<topic>-<partition>.<id>-delete`) and then removes it. A read that
    failed on such a partition met its deletion, not damage."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return True
    return False


def list_partitions(path: Path) -> dict[TopicPartition, Path]:
    """Every live partition dir of the log dir `path`, by topic-partition; `-delete`,
    `-future`, `-stray` dirs and anything that is not `<topic>-<partition>` are skipped,
    a misnamed partition dir (`MisnamedPartitionDir`) with a warning.
    Links with a partition dir's name are listed, whatever they point to, so that opening
    them reports and refuses them (see `log_dir`). Only the dir is read."""
    found: dict[TopicPartition, Path] = {}
    with os.scandir(path) as listing:
        entries = sorted(listing, key=attrgetter("name"))
    for entry in entries:
        # The listing's file types (d_type) answer both, without a stat per entry.
        if not (entry.is_symlink() or entry.is_dir(follow_symlinks=False)):
            continue
        try:
            found[parse_topic_partition(entry.name)] = Path(entry.path)
        except MisnamedPartitionDir as exc:
            if entry.path not in _misnamed_said:
                _misnamed_said.add(entry.path)
                log.warning(
                    "log_dir.partition_dir_misnamed",
                    path=entry.path,
                    error=str(exc),
                    action="not read nor maintained: rename it, or remove it if a copy",
                )
        except ValueError:
            log.debug("log_dir.entry_skipped", path=entry.path)
    return found
