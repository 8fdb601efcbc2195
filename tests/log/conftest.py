"""Fixtures of the log layer's tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cleanerd.records import walker


@pytest.fixture
def walked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Bytes each walk of batch data covered, from every caller of the walker (table
    walks and summaries alike)."""
    sizes: list[int] = []
    original, summary_kernel = walker.Walker.__iter__, walker._summary_kernel

    def counting(self: walker.Walker) -> Iterator[walker.BatchTable]:
        yield from original(self)
        sizes.append(self.stop - self.start)

    def counting_summary(data: walker.U8, start: int, *args: Any) -> Any:
        found = summary_kernel(data, start, *args)
        sizes.append(int(found[1]) - start)
        return found

    monkeypatch.setattr(walker.Walker, "__iter__", counting)
    monkeypatch.setattr(walker, "_summary_kernel", counting_summary)
    return sizes


@pytest.fixture(name="advised")
def _advised(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files advised `POSIX_FADV_WILLNEED` (`posix_fadvise` recorded)."""
    advised: list[str] = []
    fadvise = os.posix_fadvise

    def recording(fd: int, offset: int, length: int, advice: int) -> None:
        if advice == os.POSIX_FADV_WILLNEED:
            advised.append(Path(f"/proc/self/fd/{fd}").readlink().name)
        fadvise(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", recording)
    return advised
