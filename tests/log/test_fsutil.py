"""Tests of cleanerd.log.fsutil: atomic writes, dir fsync and ENOSPC-safe unlink."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from cleanerd.log import fsutil


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
