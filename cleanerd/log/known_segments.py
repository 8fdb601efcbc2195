"""What an owner knew of each segment's bytes when it stopped cleanly or last changed
them, for the next owner's start (`<state dir>/known-segments/<log dir key>`).

Metadata of a segment (its next offset, max timestamp, first batch, index sizes, its
earliest delete horizon) costs a dozen system calls and a walk of its tail to read; on a
host with 100,000 segments that is most of a start. Kafka's loader trusts a cleanly
stopped dir's index files instead; cleanerd also keeps what it had read, keyed by each
`.log` file's identity, and a start after a clean stop (`log_dir.py`'s marker) takes
each segment's metadata from here when the file is still the one described; a start
after a crash, for the segments wholly below the recovery point only.

Format (little endian)::

    cleanerd known segments 1\n
    {"partitions": [<dir name>, ...], "dirs": [[inode, mtime ns] or null, ...],
     "rows": N, "crc32c": C}\n
    N rows of `ROW` (112 bytes): partition (index into "partitions"), base offset,
        inode, size, mtime (ns), next offset, max timestamp, its offset, first batch
        max timestamp, flags (1: there is a first batch, 2: the horizon is known,
        4: no transaction was open at the segment's next offset, the log end),
        offset index bytes, time index bytes, earliest delete horizon, batches with one

`C` is the CRC-32C of the rows. A file that does not parse or check out is reported
and ignored: the start then reads every segment, which is slow but never wrong.

`dirs` (absent in files of older versions) holds, for a partition whose segments are
all known, its dir's inode and mtime when that mtime was settled (more than two seconds
old, so any later entry change moves it): with the segments' base offsets and the
active `.log`'s size and mtime, what the daemon's watcher sees of the dir (`KnownDir`),
so its first scan lists only dirs that changed since.

Crash consistency: the file is written whole with `atomic_write` (temp file, fsync,
rename) by a clean stop, before the clean-shutdown marker, and by the daemon after each
cycle that changed the segments (a roll, a clean, a deletion, a segment read for the
first time), so a crash leaves the old file or the new one. An entry is used only for a
`.log` whose (inode, size, mtime in ns) equal the entry's: a segment appended to,
truncated, rewritten or replaced since has another identity and is read from its
files. Without the marker (a crash), an entry is used only for a segment wholly below
the recovery point: that file was flushed after its last write and before the checkpoint
named it, so its size and mtime cannot have outlived the bytes they describe, which an
unflushed file's can (a crash may keep an append's new size and lose its data). An
observer uses the file only while the marker is there.
The identity relies on every write moving the mtime, which nanosecond mtimes (ext4,
xfs, tmpfs) do; on a filesystem with one-second mtimes, a segment replaced within the
same second by a file of the same size under a reused inode number would pass for the
old one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final, NamedTuple

import numpy as np

from cleanerd.log.fsutil import atomic_write
from cleanerd.log.lock import log_dir_key
from cleanerd.logger import get_logger
from cleanerd.records.crc32c_library import crc32c

log = get_logger(__name__)

MAGIC: Final = b"cleanerd known segments 1\n"
ROW: Final = np.dtype(
    [
        ("partition", "<i8"),
        ("base_offset", "<i8"),
        ("inode", "<u8"),
        ("size", "<i8"),
        ("mtime_ns", "<i8"),
        ("next_offset", "<i8"),
        ("max_timestamp", "<i8"),
        ("offset_of_max_timestamp", "<i8"),
        ("first_batch_timestamp", "<i8"),
        ("flags", "<i8"),
        ("offset_index_bytes", "<i8"),
        ("time_index_bytes", "<i8"),
        ("horizon", "<i8"),
        ("horizon_batches", "<i8"),
    ]
)
_HAS_FIRST: Final = 1
_HAS_HORIZON: Final = 2
_STABLE_END: Final = 4

Identity = tuple[int, int, int]
"""(inode, size, mtime in ns) of a `.log` file."""


class KnownSegment(NamedTuple):
    """What was read of one segment's files, and which `.log` file it describes (a named
    tuple: a start builds one per segment, 100,000 of them on a big host, and a tuple
    costs a fifth of a frozen dataclass to build)."""

    base_offset: int
    identity: Identity
    next_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int
    first_batch_timestamp: int | None
    offset_index_bytes: int
    time_index_bytes: int
    delete_horizon: tuple[int, int] | None
    """(earliest KIP-534 delete horizon, batches carrying one), when it was scanned."""
    stable_end: bool = False
    """The partition's last segment, and no transaction was open at its end: while the
    `.log` is this file, the log has no first unstable offset, and the producer snapshot
    need not be read to say so."""


Known = dict[str, dict[int, KnownSegment]]
"""Known segments by partition dir name, then base offset."""


class KnownDir(NamedTuple):
    """A partition dir as cleanerd last kept it, all its segments known."""

    inode: int
    mtime_ns: int
    segments: tuple[int, ...]
    """Base offsets of its `.log` files, ascending (the last is the active one)."""
    active_size: int
    active_mtime_ns: int


class KnownFile(NamedTuple):
    """What one file holds: the segments, and the dirs whose stamps were kept."""

    segments: Known
    dirs: dict[str, KnownDir]


NOTHING_KNOWN: Final = KnownFile({}, {})


def known_segments_path(state_dir: Path, log_dir: Path) -> Path:
    """Where the known segments of `log_dir` are kept."""
    return state_dir / "known-segments" / log_dir_key(log_dir)


def encode(
    known: Iterable[tuple[str, Iterable[KnownSegment]]],
    dirs: Mapping[str, tuple[int, int]] | None = None,
) -> bytes:
    """The file's bytes for `known` (partition dir name, its segments) and `dirs` (the
    settled (inode, mtime) of dirs whose segments are all in `known`)."""
    names: list[str] = []
    rows: list[tuple[int, ...]] = []
    stamps = {} if dirs is None else dirs
    for name, segments in known:
        index = len(names)
        names.append(name)
        for k in segments:
            horizon, batches = (0, 0) if k.delete_horizon is None else k.delete_horizon
            flags = (
                (_HAS_FIRST if k.first_batch_timestamp is not None else 0)
                | (_HAS_HORIZON if k.delete_horizon is not None else 0)
                | (_STABLE_END if k.stable_end else 0)
            )
            rows.append(
                (
                    index,
                    k.base_offset,
                    *k.identity,
                    k.next_offset,
                    k.max_timestamp,
                    k.offset_of_max_timestamp,
                    k.first_batch_timestamp or 0,
                    flags,
                    k.offset_index_bytes,
                    k.time_index_bytes,
                    horizon,
                    batches,
                )
            )
    body = np.array(rows, dtype=ROW).tobytes()
    header = {
        "partitions": names,
        "dirs": [stamps.get(name) for name in names],
        "rows": len(rows),
        "crc32c": crc32c(body),
    }
    return MAGIC + json.dumps(header).encode() + b"\n" + body


def decode(data: bytes) -> KnownFile:
    """What the file's bytes hold; ValueError saying what is wrong."""
    if not data.startswith(MAGIC):
        raise ValueError("it does not start with the format's first line")
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        raise ValueError("its header line is cut short")
    header = json.loads(data[len(MAGIC) : end])
    names, count = header["partitions"], int(header["rows"])
    body = data[end + 1 :]
    if len(body) != count * ROW.itemsize:
        raise ValueError(f"{len(body)} bytes of rows, not {count} rows of {ROW.itemsize}")
    if crc32c(body) != header["crc32c"]:
        raise ValueError("the rows' CRC-32C does not match the header")
    rows = np.frombuffer(body, dtype=ROW)
    known: Known = {name: {} for name in names}
    for (
        part,
        base,
        inode,
        size,
        mtime,
        nxt,
        max_ts,
        at_max,
        first,
        flags,
        oi_bytes,
        ti_bytes,
        horizon,
        batches,
    ) in rows.tolist():
        known[names[part]][base] = KnownSegment(
            base,
            (inode, size, mtime),
            nxt,
            max_ts,
            at_max,
            first if flags & _HAS_FIRST else None,
            oi_bytes,
            ti_bytes,
            (horizon, batches) if flags & _HAS_HORIZON else None,
            bool(flags & _STABLE_END),
        )
    dirs: dict[str, KnownDir] = {}
    for name, stamp in zip(names, header.get("dirs") or [None] * len(names), strict=True):
        segments = known[name]
        if stamp is None or not segments:
            continue
        bases = tuple(sorted(segments))
        _, size, mtime = segments[bases[-1]].identity
        dirs[name] = KnownDir(int(stamp[0]), int(stamp[1]), bases, size, mtime)
    return KnownFile(known, dirs)


def read_known_segments(state_dir: Path, log_dir: Path) -> KnownFile:
    """What is kept for `log_dir` (nothing when there is no usable file: an unreadable
    one is reported, naming it and why, and ignored)."""
    path = known_segments_path(state_dir, log_dir)
    try:
        return decode(path.read_bytes())
    except FileNotFoundError:
        return NOTHING_KNOWN
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        log.warning("known_segments.unreadable", path=str(path), error=str(exc), action="ignored")
        return NOTHING_KNOWN


def write_known_segments(
    state_dir: Path,
    log_dir: Path,
    known: Iterable[tuple[str, Iterable[KnownSegment]]],
    dirs: Mapping[str, tuple[int, int]] | None = None,
) -> Path:
    """Replace what is kept for `log_dir` (atomically)."""
    path = known_segments_path(state_dir, log_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, encode(known, dirs))
    return path
