"""Tests of cleanerd.wording: counted nouns."""

from __future__ import annotations

from cleanerd.wording import count


def test_singular_for_one_plural_otherwise() -> None:
    """0 and many take the plural, exactly one the singular; irregular plurals are given."""
    assert [count(n, "segment") for n in (0, 1, 2)] == ["0 segments", "1 segment", "2 segments"]
    assert count(1, "cleaning pass", "cleaning passes") == "1 cleaning pass"
    assert count(3, "cleaning pass", "cleaning passes") == "3 cleaning passes"
