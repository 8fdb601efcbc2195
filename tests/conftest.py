"""Fixtures shared across the test suite.

The real broker-written files live in `tests/fixtures/kafka-real` (its README says where
they come from and what each holds). Tests get a writable copy.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.paths import REPO

KAFKA_REAL = REPO / "tests" / "fixtures" / "kafka-real"

# Kernels go to numba in the suite (and the processes it starts), whether or not this
# checkout has compiled kernels (`cleanerd build-kernels`): the tests of those build
# their own (`tests/test_aot.py`).
os.environ.setdefault("CLEANERD_AOT", "0")


@pytest.fixture(name="kafka_real")
def _kafka_real(tmp_path: Path) -> Path:
    """A writable copy of the real Kafka log dirs (kraft-combined-logs, logdir-a/-b)."""
    copy = tmp_path / "kafka-real"
    shutil.copytree(KAFKA_REAL, copy)
    return copy
