"""Fixtures shared across the test suite.

The real broker-written files live in `tests/fixtures/kafka-real` (its README says where
they come from and what each holds). Tests get a writable copy.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
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


NOGROUP = 65534
"""A group the suite's (root) process is not in: files given it show where a new file
took its group from."""


@pytest.fixture
def umask_0027() -> Iterator[None]:
    """The systemd unit's umask: files this process creates are 0640 unless told."""
    old = os.umask(0o027)
    yield
    os.umask(old)


def mode_and_group(path: Path) -> tuple[int, int]:
    """A file's permission bits and group."""
    st = path.stat()
    return stat.S_IMODE(st.st_mode), st.st_gid


def give_mode_and_group(paths: list[Path], mode: int, gid: int) -> None:
    """Set the bits and group of `paths`, as a broker's files have them."""
    for path in paths:
        os.chown(path, -1, gid)
        path.chmod(mode)
