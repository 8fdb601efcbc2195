"""A full disk at every single file operation of a pass, in turn: the pass either
finishes (it freed the `.deleted` files of its own earlier groups and wrote the group
again) or fails with an error naming the file and the step; either way the partition,
once the owner has recovered it, holds the records before or after the pass (groups:
each group before or after), and the next pass completes."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from cleanerd.compaction.cleaner import swapped_files
from cleanerd.errors import FileStepError
from tests.compaction.conftest import clean
from tests.compaction.crashing_ops import CrashingOps
from tests.compaction.test_cleaner_crash import build, cfg, checkpoint, records, recover


class NoSpaceAt(CrashingOps):
    """The disk is full at operation `crash_at` (once: a retry may find space)."""

    def _tick(self, what: str) -> None:
        if self.count == self.crash_at:
            self.count += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        super()._tick(what)


def attempt(d: Path, at: int) -> FileStepError | None:
    """A pass with the disk full at operation `at`; its error, None if it finished."""
    try:
        clean(d, ops=NoSpaceAt(at), config=cfg(400))
    except FileStepError as exc:
        return exc
    return None


def test_full_disk_at_every_file_operation(tmp_path: Path) -> None:
    template = build(tmp_path / "template").parent
    ref = tmp_path / "reference"
    shutil.copytree(template, ref)
    pre = records(ref / "t-0")
    ops = CrashingOps()
    clean(ref / "t-0", ops=ops, config=cfg(400))
    post = records(ref / "t-0")
    outcomes = set()
    for at in range(ops.count):
        root = tmp_path / f"full-{at}"
        shutil.copytree(template, root)
        error = attempt(root / "t-0", at)
        if error is not None:
            assert error.no_space
            assert str(root) in str(error), f"{error} names no file (at {ops.trace[at]})"
            assert " while " in str(error)
            for path in swapped_files(error):  # the owner unlinks them like a pass's
                path.unlink(missing_ok=True)
        outcomes.add("failed" if error else "finished")
        recover(root / "t-0")
        state = records(root / "t-0")
        assert post <= state <= pre, f"lost or resurrected records at {ops.trace[at]}"
        clean(root / "t-0", first_dirty=checkpoint(root), config=cfg(400))
        recover(root / "t-0")
        assert records(root / "t-0") == post
        shutil.rmtree(root)
    assert outcomes == {"failed", "finished"}
