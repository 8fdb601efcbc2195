"""Tests of cleanerd.log.fsutil: atomic writes, dir fsync, ENOSPC-safe unlink, and the
bits and group a new file takes from the one it replaces."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from cleanerd.log import fsutil
from tests.conftest import NOGROUP, mode_and_group


def test_atomic_write_replaces_and_leaves_no_tmp(tmp_path: Path) -> None:
    """The new content replaces the old and no `.tmp` file is left behind."""
    target = tmp_path / "file"
    target.write_bytes(b"old")
    fsutil.atomic_write(target, b"new")
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_crash_before_rename_keeps_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the rename fails, the old file is intact and the temp file is removed."""
    target = tmp_path / "file"
    target.write_bytes(b"old")

    def crash(self: Path, other: Path) -> Path:
        raise OSError(errno.EIO, "simulated crash before rename")

    monkeypatch.setattr(Path, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        fsutil.atomic_write(target, b"new")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_fsync_dir_ignores_only_einval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """EINVAL from a directory fsync is ignored; other errors are raised."""
    codes = iter([errno.EINVAL, errno.EIO])

    def failing_fsync(fd: int) -> None:
        raise OSError(next(codes), "fsync")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    fsutil.fsync_dir(tmp_path)
    with pytest.raises(OSError, match="fsync"):
        fsutil.fsync_dir(tmp_path)


def test_safe_unlink_truncates_on_enospc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On ENOSPC a single-link file is truncated, then the unlink is retried."""
    target = tmp_path / "seg.log"
    target.write_bytes(b"x" * 100)
    real_unlink = Path.unlink
    seen_sizes: list[int] = []

    def unlink_once_full(self: Path, missing_ok: bool = False) -> None:
        seen_sizes.append(self.stat().st_size)
        if len(seen_sizes) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_unlink(self, missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink_once_full)
    fsutil.safe_unlink(target)
    assert seen_sizes == [100, 0]
    assert not target.exists()


def test_safe_unlink_keeps_multi_link_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file with another hard link is never truncated: the ENOSPC error propagates."""
    target = tmp_path / "seg.log"
    target.write_bytes(b"data")
    os.link(target, tmp_path / "other")

    def full(self: Path, missing_ok: bool = False) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "unlink", full)
    with pytest.raises(OSError, match="No space"):
        fsutil.safe_unlink(target)
    assert (tmp_path / "other").read_bytes() == b"data"


@pytest.mark.usefixtures("umask_0027")
def test_atomic_write_keeps_the_replaced_files_bits_and_group(tmp_path: Path) -> None:
    """A checkpoint a broker wrote (0644, its group) stays one it can read after cleanerd
    rewrites it under the unit's umask (it became 0640 and cleanerd's group)."""
    target = tmp_path / "recovery-point-offset-checkpoint"
    target.write_bytes(b"old")
    os.chown(target, -1, NOGROUP)
    target.chmod(0o644)
    fsutil.atomic_write(target, b"new")
    assert mode_and_group(target) == (0o644, NOGROUP)
    fresh = tmp_path / "00000000000000000007.snapshot"
    fsutil.atomic_write(fresh, b"x", like=target)
    assert mode_and_group(fresh) == (0o644, NOGROUP)


def test_adopt_owner_copies_the_bits_where_it_may_not_chown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not root, and not in the group: the owner and group stay the process's, the
    bits are still copied, and nothing fails."""
    like = tmp_path / "like"
    like.write_bytes(b"")
    like.chmod(0o604)
    calls: list[tuple[int, int]] = []

    def refused(fd: int, uid: int, gid: int) -> None:
        calls.append((uid, gid))
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "fchown", refused)
    target = _created_by(1000, tmp_path / "new", like)
    assert calls == [(-1, like.stat().st_gid)]  # only the group is asked for
    # The group is root's already: it gets the owner's bits, the owner having changed.
    assert stat.S_IMODE(target.stat().st_mode) == 0o664


def test_a_new_owner_leaves_the_former_one_its_access_through_the_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker's segment (0644, kafka:kafka) replaced by cleanerd's user (in group
    kafka): the new file is cleanerd:kafka 0664, so the broker still opens it to write,
    as Kafka opens every segment it loads (0644 let it only read). No execute, set-id
    or sticky bit is copied, and a link is not followed to find the bits."""
    like = tmp_path / "00000000000000000000.log"
    like.write_bytes(b"")
    os.chown(like, 1001, NOGROUP)
    like.chmod(0o6755)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    target = _created_by(1000, tmp_path / "00000000000000000000.log.cleaned", like)
    assert mode_and_group(target) == (0o775 & 0o666, NOGROUP)
    link = tmp_path / "link"
    link.symlink_to(like)
    other = _created_by(1000, tmp_path / "other", link)
    assert stat.S_IMODE(other.stat().st_mode) == 0o600


def _created_by(uid: int, path: Path, like: Path) -> Path:
    """`path` created 0600 as if by `uid`, then given `like`'s bits and group."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.chown(path, uid, -1)
    try:
        fsutil.adopt_owner(fd, like)
    finally:
        os.close(fd)
    return path


@pytest.mark.usefixtures("umask_0027")
def test_a_file_with_nothing_to_replace_takes_its_dirs_bits_less_execute(tmp_path: Path) -> None:
    """A new file with no old one and no `like` (a fresh log dir's checkpoint) is as
    readable as its dir, in its dir's group; a dir made like a dir keeps execute."""
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    os.chown(log_dir, -1, NOGROUP)
    log_dir.chmod(0o775)
    fsutil.atomic_write(log_dir / "cleaner-offset-checkpoint", b"0\n0\n")
    assert mode_and_group(log_dir / "cleaner-offset-checkpoint") == (0o664, NOGROUP)
    fsutil.mkdir_like(log_dir / "t-0", log_dir)
    assert mode_and_group(log_dir / "t-0") == (0o775, NOGROUP)


def test_another_users_file_keeps_its_bits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not root: a file this process does not own (one it opened and emptied) is left as
    it is, where a chmod would fail."""
    like = tmp_path / "like"
    like.write_bytes(b"")
    like.chmod(0o600)
    target = tmp_path / "theirs"
    target.write_bytes(b"")
    target.chmod(0o644)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # root owns `target`
    fd = os.open(target, os.O_WRONLY)
    try:
        fsutil.adopt_owner(fd, like)
    finally:
        os.close(fd)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
