"""Tests of the error texts reports and marks carry."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path

import pytest

from cleanerd.errors import (
    CHANGED_READ_ATTEMPTS,
    CHANGED_READ_PAUSE_SECONDS,
    CHANGED_READ_SECONDS,
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


class FakeTime:
    """A clock that only the pauses of `reread_on_change` move."""

    def __init__(self) -> None:
        self.now = 100.0
        self.pauses: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def changing_read(fails: int, calls: list[int]) -> Callable[[], int]:
    def read() -> int:
        calls.append(1)
        if len(calls) <= fails:
            raise FileNotFoundError(2, "No such file or directory", "x.log")
        return len(calls)

    return read


def test_a_read_is_tried_again_while_files_change_under_it_then_its_error_raised() -> None:
    """`reread_on_change` runs the read again after a FileChangedError or a
    FileNotFoundError, with a pause that doubles up to its cap, CHANGED_READ_ATTEMPTS
    times at least and until CHANGED_READ_SECONDS have passed, then raises the last
    error; any other error is raised at once."""
    t, calls = FakeTime(), list[int]()
    read = changing_read(CHANGED_READ_ATTEMPTS + 5, calls)
    assert reread_on_change(read, clock=t.clock, sleep=t.sleep) == CHANGED_READ_ATTEMPTS + 6
    first, cap = CHANGED_READ_PAUSE_SECONDS
    assert t.pauses[:3] == [first, 2 * first, 4 * first]
    assert max(t.pauses) <= cap

    t, calls = FakeTime(), list[int]()
    with pytest.raises(FileNotFoundError):
        reread_on_change(changing_read(10**6, calls), clock=t.clock, sleep=t.sleep)
    assert len(calls) > CHANGED_READ_ATTEMPTS
    assert CHANGED_READ_SECONDS <= t.now - 100.0 < CHANGED_READ_SECONDS + cap
    assert t.pauses[-1] == cap

    t, calls = FakeTime(), list[int]()

    def damaged() -> int:
        calls.append(1)
        raise CleanerdError("damage")

    with pytest.raises(CleanerdError, match="damage"):
        reread_on_change(damaged, clock=t.clock, sleep=t.sleep)
    assert len(calls) == 1


def test_reads_fast_enough_are_tried_three_times_at_least() -> None:
    """A read that fails slowly (each attempt outlasting CHANGED_READ_SECONDS) still has
    CHANGED_READ_ATTEMPTS in all."""
    t, calls = FakeTime(), list[int]()

    def slow_change() -> int:
        calls.append(1)
        t.now += 2 * CHANGED_READ_SECONDS
        raise FileNotFoundError(2, "No such file or directory", "x.log")

    with pytest.raises(FileNotFoundError):
        reread_on_change(slow_change, clock=t.clock, sleep=t.sleep)
    assert len(calls) == CHANGED_READ_ATTEMPTS


def test_a_partition_gone_is_not_read_again() -> None:
    """When `gone()` says the partition itself is no longer there (a topic deletion),
    the first read's error is raised at once, with no pause."""
    t, calls = FakeTime(), list[int]()
    with pytest.raises(FileNotFoundError):
        reread_on_change(changing_read(1, calls), gone=lambda: True, clock=t.clock, sleep=t.sleep)
    assert (len(calls), t.pauses) == (1, [])
