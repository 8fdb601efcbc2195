"""Where the repository's files are, for tests that read them (configs, units, fixtures)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
"""The checkout's root."""
