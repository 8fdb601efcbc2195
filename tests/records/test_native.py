"""Tests of `cleanerd.records.native`: loading the system libraries kernels call."""

from __future__ import annotations

import ctypes.util

import pytest

from cleanerd.records.native import load_library


def test_the_usual_name_is_tried_before_find_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """A library found under its usual name needs no `find_library` (an `ldconfig` run);
    one that is not is looked for there; one without a needed function is refused."""
    asked: list[str] = []
    find = ctypes.util.find_library

    def finding(name: str) -> str | None:
        asked.append(name)
        return find(name)

    monkeypatch.setattr(ctypes.util, "find_library", finding)
    assert load_library(["libz.so.1"], "z", ("deflate",)) is not None
    assert asked == []
    assert load_library(["no-such-library.so"], "z", ("deflate",)) is not None
    assert asked == ["z"]
    assert load_library(["libz.so.1"], "z", ("no_such_function",)) is None
