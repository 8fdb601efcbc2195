"""Shared set-up of the engine tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.engine.owned import release_all


@pytest.fixture(autouse=True)
def _release_log_dirs() -> Iterator[None]:
    yield
    release_all()
