"""File-system primitives with an explicit crash-consistency argument (borg's discipline).

The argument every writer in cleanerd relies on:

- `atomic_write` writes the new content to `<path>.tmp`, flushes and fsyncs it, then
  `os.replace`s it over `<path>` and fsyncs the directory. A crash before the rename
  leaves the old file intact (and at most a stale `.tmp`, which the next write
  overwrites); a crash after it leaves the complete new file, because its data was on
  disk before the rename made it visible. The directory fsync makes the rename itself
  durable, so a later step that depends on it (deleting what it superseded) cannot
  survive a crash that the rename did not.
- `fsync_dir` ignores only EINVAL: some network file systems cannot fsync a directory,
  and there is nothing better to do there; every other error means the rename may not
  be durable and is raised.
- `safe_unlink` survives a full disk: on some file systems (btrfs, ZFS) unlinking needs
  free space for metadata and fails with ENOSPC. If the file has a single link,
  truncating it to zero frees its data blocks without needing new space, after which
  the unlink is retried. A file with other hard links is not truncated, since that
  would destroy data reachable by another name.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

TMP_SUFFIX = ".tmp"


def fsync_dir(path: Path | str) -> None:
    """fsync the directory `path` so renames and unlinks in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)


def fsync_file(path: Path | str) -> None:
    """fsync the data and metadata of the existing file `path`."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path | str, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new file.

    Order: write `<path>.tmp`, flush, fsync, `os.replace` over `path`, fsync the dir.
    On any error before the rename the temporary file is removed and the old file stays.
    """
    target = Path(path)
    tmp = target.with_name(target.name + TMP_SUFFIX)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def safe_unlink(path: Path | str) -> None:
    """Unlink `path`, freeing its space even when the disk is full.

    On ENOSPC, a single-link file is truncated to zero length (which frees its blocks
    without allocating) and the unlink is retried; a multi-link file re-raises.
    """
    file = Path(path)
    try:
        file.unlink()
    except OSError as exc:
        if exc.errno != errno.ENOSPC or file.stat().st_nlink > 1:
            raise
        os.truncate(file, 0)
        file.unlink()
