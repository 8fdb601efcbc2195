"""Fixtures of the log layer's tests."""

from __future__ import annotations

from collections.abc import Iterator
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
