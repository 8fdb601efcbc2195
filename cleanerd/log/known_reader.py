"""Segment metadata read by a process other than the log dir's owner, for the owner to
take (`PartitionLog.take_known`): the first reads of a start that has nothing kept of a
dir (no clean stop: a first start, or one after a crash), spread over helper processes.

A start with nothing kept reads each segment's metadata once (its next offset, max
timestamp, first batch, index sizes: a dozen system calls and a read of a small file,
about 40 us), 100,000 of them on a storage host; the owner's process meanwhile opens the
partitions. The reads are independent of the opens, so helpers do them alongside.

What a reader returns is `known_segments.py`'s format (`encode`), one row per segment it
could read, keyed by partition dir name: the same bytes a clean stop writes, so the owner
decodes and checks them the same way.

Consistency: a reader writes nothing and takes no lock; it opens the segments read-only
and reports what their bytes said when read, under the `.log`'s identity (inode, size,
mtime in ns) as it saw it. The owner takes an entry only for the very file it opened
(same identity) and only for a segment whose indexes its own open did not rebuild (the
entry names the old index sizes), so an entry describing a file that changed, was
truncated by recovery or was replaced is never used: that segment is read by the owner
as if no reader had run. A segment the reader cannot read (corrupt, gone, torn) gets no
row; the owner reads it and reports it itself.

The owner's open leaves the cheap checks it would run (`recovery.py`: the active
segment's after a clean shutdown; after a crash, those of the segments wholly below the
recovery point, with `check`) to the readers: a row of such a segment also says that
its indexes passed it, as the files were when read; a segment that fails it (or needs
its indexes rebuilt) gets no row, so the owner checks it, rebuilds or reports. The
owner takes a row of the active segment only while nothing was appended to it (its
identity again).

A start after a crash that takes what cleanerd kept (`recovery.py`) reads no segment
below the recovery point, so there is nothing to read beside it; but its opening waits
on the disk for what it does read (each segment file's inode, the active segment, the
latest producer snapshot). `warm_dirs` brings those into the kernel's caches from
another process, from the last partition back while the owner opens from the first,
without reading them itself (an `lstat` of each file, and `POSIX_FADV_WILLNEED` on the
active `.log` and the latest snapshot when small, opened with `O_NOFOLLOW`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path

from cleanerd.errors import CleanerdError
from cleanerd.log.files import (
    LOG_FILE_SUFFIX,
    PRODUCER_SNAPSHOT_FILE_SUFFIX,
    filename_prefix_from_offset,
    log_file_offsets,
)
from cleanerd.log.known_segments import KnownSegment, encode
from cleanerd.log.producer_state import snapshot_offsets_in
from cleanerd.log.recovery import list_refusing_links
from cleanerd.log.segment import LogSegment, advise_small


def read_dir(path: str, *, check: bool = False) -> list[KnownSegment]:
    """What can be read of the segments of the partition dir `path`: of those that pass
    the open's cheap check (`LogSegment.check`) for the last one, and with `check` for
    the others."""
    dir_path = Path(path)
    try:
        # The owner's checks first: a link or a FIFO named like a segment is never opened.
        bases = log_file_offsets([e.name for e in list_refusing_links(dir_path)])
    except (CleanerdError, OSError):
        return []  # gone, unreadable or refused: the owner's open says why
    segments: list[LogSegment | None] = []
    for base in bases:
        try:
            segments.append(LogSegment(dir_path, base, read_only=True))
        except (CleanerdError, OSError):
            segments.append(None)
    for segment in segments:
        if segment is not None:  # so that the reads of a cold dir overlap
            segment.prefetch(indexes=check)
    found = []
    for n in range(len(segments)):
        # Each segment goes once read: a checked one holds its indexes' entries.
        segment, segments[n] = segments[n], None
        if segment is None:
            continue
        try:
            if check or n == len(bases) - 1:
                segment.check()
            segment.meta()
            known = segment.known()
            # A missing index, which the owner's open creates, leaves the segment to it.
            if known is not None and segment.indexes_as_known(known):
                found.append(known)
        except (CleanerdError, OSError):
            continue
    return found


def warm_dirs(paths: Sequence[str]) -> bytes:
    """Bring into the kernel's caches what an owner's open after a crash reads of each of
    the partition dirs `paths` (see the module docstring); no rows (`encode`'s format,
    empty). Nothing is written or read, and no link is followed."""
    for path in paths:
        try:
            names = [e.name for e in list_refusing_links(Path(path))]
        except (CleanerdError, OSError):
            continue  # the owner's open says why
        for name in names:
            with suppress(OSError):
                os.lstat(os.path.join(path, name))  # noqa: PTH118 - strs, not Paths
        # The active segment's index files are left out: preallocated, never small.
        for last, suffix in (
            (log_file_offsets(names), LOG_FILE_SUFFIX),
            (snapshot_offsets_in(names), PRODUCER_SNAPSHOT_FILE_SUFFIX),
        ):
            if last:
                name = filename_prefix_from_offset(last[-1]) + suffix
                advise_small(os.path.join(path, name), None)  # noqa: PTH118
    return encode([])


def read_dirs(paths: Sequence[str], *, check: bool = False) -> bytes:
    """`read_dir` of each of `paths`, in `known_segments.py`'s format."""
    return encode((Path(p).name, read_dir(p, check=check)) for p in paths)
