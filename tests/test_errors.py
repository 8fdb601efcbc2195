"""Tests of the error texts reports and marks carry."""

from __future__ import annotations

import errno
from pathlib import Path

from cleanerd.errors import CorruptRecordError, failure_text


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
