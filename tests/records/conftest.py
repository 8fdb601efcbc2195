"""Fixtures of the record layer's tests."""

from __future__ import annotations

from typing import Any

import pytest

from cleanerd.records import columns


@pytest.fixture
def codec_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Calls into the codec layer from `segment_columns`: `decompress_into` (one batch at
    a time) and `decompress_frames` (a run of batches), by name."""
    calls: list[str] = []
    for name in ("decompress_into", "decompress_frames"):
        original = getattr(columns, name)

        def counting(*args: Any, _name: str = name, _original: Any = original) -> Any:
            calls.append(_name)
            return _original(*args)

        monkeypatch.setattr(columns, name, counting)
    return calls
