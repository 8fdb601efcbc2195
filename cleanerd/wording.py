"""Counted nouns in human output: "1 segment", "2 segments", never "1 segments" or
"segment(s)". Every message that puts a count before a noun goes through `count`."""

from __future__ import annotations


def count(n: int, singular: str, plural: str | None = None) -> str:
    """`n` and the noun, singular for exactly one (`plural` defaults to singular + "s");
    the noun may be followed by words that do not change ("deadline violation")."""
    return f"{n} {singular if n == 1 else (plural or singular + 's')}"
