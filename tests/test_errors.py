"""Tests of the error texts reports and marks carry."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from cleanerd.errors import (
    CHANGED_READ_ATTEMPTS,
    CleanerdError,
    CorruptRecordError,
    failure_text,
    reread_on_change,
)


def test_a_failure_is_said_by_its_own_text_unless_it_is_a_bug(tmp_path: Path) -> None:
    """cleanerd's errors and OS errors name the file and what is wrong: their text is the
    reason, with no type name before it; any other exception keeps its type."""
    corrupt = CorruptRecordError("CRC mismatch", path=tmp_path / "0.log", position=61)
    assert (
        failure_text(corrupt)
        == f"corrupt record batch in {tmp_path / '0.log'} at position 61: CRC mismatch"
    )
    denied = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "0.log"))
    assert failure_text(denied) == f"{tmp_path / '0.log'}: Permission denied"
    assert failure_text(ValueError("negative size")) == "ValueError: negative size"


def test_a_read_is_tried_again_while_files_change_under_it_then_its_error_raised() -> None:
    """`reread_on_change` runs the read again after a FileChangedError or a
    FileNotFoundError, CHANGED_READ_ATTEMPTS times in all, and raises the last error;
    any other error is raised at once."""
    calls: list[int] = []

    def changing(fails: int) -> int:
        calls.append(1)
        if len(calls) <= fails:
            raise FileNotFoundError(2, "No such file or directory", "x.log")
        return len(calls)

    assert reread_on_change(lambda: changing(CHANGED_READ_ATTEMPTS - 1)) == CHANGED_READ_ATTEMPTS
    calls.clear()
    with pytest.raises(FileNotFoundError):
        reread_on_change(lambda: changing(CHANGED_READ_ATTEMPTS))
    assert len(calls) == CHANGED_READ_ATTEMPTS
    calls.clear()

    def damaged() -> int:
        calls.append(1)
        raise CleanerdError("damage")

    with pytest.raises(CleanerdError, match="damage"):
        reread_on_change(damaged)
    assert len(calls) == 1
