"""Fixtures shared across the test suite.

The real broker-written files live in the project's `shared/` folder, beside the
repository checkout (`../shared/fixtures/kafka-real`). They are read-only inputs: tests
get a writable copy.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.paths import REPO

KAFKA_REAL = REPO.parent / "shared" / "fixtures" / "kafka-real"


@pytest.fixture(name="kafka_real")
def _kafka_real(tmp_path: Path) -> Path:
    """A writable copy of the real Kafka log dirs (kraft-combined-logs, logdir-a/-b)."""
    if not KAFKA_REAL.is_dir():
        pytest.fail(f"real Kafka fixtures not found at {KAFKA_REAL}")
    copy = tmp_path / "kafka-real"
    shutil.copytree(KAFKA_REAL, copy)
    for path in [copy, *copy.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)  # the originals are read-only
    return copy
