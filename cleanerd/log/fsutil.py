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
- `adopt_owner` gives a file cleanerd creates in a log dir the permission bits and group
  (and, as root, the owner) of the file it replaces or stands beside, or of its dir when
  it has neither (less the execute bits): the broker, or whoever reads a retired dir's
  segments, keeps reading (and, for `.lock`, opening to write) what cleanerd writes
  there, whatever cleanerd's own user and umask (the systemd unit runs it as `cleanerd`
  with umask 0027). A file it creates is first a `.cleaned` or `.tmp` name, so the bits
  are set before a rename makes the file visible under its final name. `mkdir_like` does
  the same for a partition dir it creates.
- `safe_unlink` survives a full disk: on some file systems (btrfs, ZFS) unlinking needs
  free space for metadata and fails with ENOSPC. If the file has a single link,
  truncating it to zero frees its data blocks without needing new space, after which
  the unlink is retried. A file with other hard links is not truncated, since that
  would destroy data reachable by another name.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from cleanerd.logger import get_logger

log = get_logger(__name__)

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


def adopt_owner(fd: int, like: Path | str) -> None:
    """Give the file (or dir) this process created, open at `fd`, the permission bits
    and group of `like` (a regular file or dir, not followed if a link), and its owner
    when this process may (root).

    - A file takes read and write bits only (no execute, set-id or sticky bit); like a
      dir, the dir's less the execute ones. A dir keeps the set-group-id bit its
      parent gave it (a unit with RestrictSUIDSGID refuses to set one).
    - When the owner changes (not root: the file is this user's), the group gets the
      bits the owner had, so the former owner (a broker, through the data's group)
      keeps opening the file to write, as Kafka opens every segment it loads.
    - A group this process is not in, or cannot give (an unmapped id), is left as its
      own, with a warning once; a file another user owns (one opened and emptied) is
      left alone. Nothing when `like` is gone or neither a file nor a dir."""
    try:
        st = Path(like).lstat()
    except FileNotFoundError:
        return
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        return
    own = os.fstat(fd)
    root = os.geteuid() == 0
    if own.st_uid != os.geteuid() and not root:
        return  # another user's file (emptied, say): its bits are not this process's to set
    is_dir = stat.S_ISDIR(own.st_mode)
    mode = stat.S_IMODE(st.st_mode) & (0o777 if is_dir else 0o666)
    if is_dir:
        mode |= stat.S_IMODE(own.st_mode) & stat.S_ISGID
    grouped = st.st_gid == own.st_gid
    try:
        os.fchown(fd, st.st_uid if root else -1, st.st_gid)
        grouped = True
    except OSError as exc:  # EPERM: not in the group; EINVAL: an id a namespace lacks
        _warn_group_kept(like, st.st_gid, exc)
    if grouped and not root and st.st_uid != own.st_uid:
        mode |= (mode & 0o700) >> 3
    os.fchmod(fd, mode)


_group_warned: set[int] = set()


def _warn_group_kept(like: Path | str, gid: int, exc: OSError) -> None:
    """Say once per group that new files cannot take it (the log dirs' readers may then
    be unable to read what cleanerd writes)."""
    if gid in _group_warned:
        return
    _group_warned.add(gid)
    log.warning(
        "files.group_not_adopted",
        like=str(like),
        group=gid,
        error=exc.strerror,
        hint="add the service user to that group (SupplementaryGroups=)",
    )


def model_for(path: Path, like: Path | None = None) -> Path:
    """What a file written at `path` takes its bits and group from (`adopt_owner`): the
    file it replaces, else `like`, else its dir."""
    if path.exists():
        return path
    return path.parent if like is None else like


def mkdir_like(path: Path, like: Path) -> None:
    """Create the dir `path` with the bits and group of the dir `like` (its parent, the
    log dir a partition dir is made in)."""
    path.mkdir()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        adopt_owner(fd, like)
    finally:
        os.close(fd)


def atomic_write(path: Path | str, data: bytes, *, like: Path | str | None = None) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new file;
    the new file takes the bits and group of the old one, else of `like`, else of its
    dir (`adopt_owner`).

    Order: write `<path>.tmp`, flush, fsync, `os.replace` over `path`, fsync the dir.
    On any error before the rename the temporary file is removed and the old file stays.
    """
    target = Path(path)
    tmp = target.with_name(target.name + TMP_SUFFIX)
    try:
        # Not through a link at the `.tmp` name: it would be followed, written and chowned.
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        with open(os.open(tmp, flags, 0o644), "wb") as f:
            adopt_owner(f.fileno(), model_for(target, None if like is None else Path(like)))
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
