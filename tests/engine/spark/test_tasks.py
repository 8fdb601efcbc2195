"""Packing segments into the Spark jobs' decode tasks; the jobs' Python environment."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.engine.spark.tasks import pack_tasks, python_path_env


@given(
    sizes=st.lists(st.integers(0, 300 << 20), min_size=1, max_size=30),
    parallelism=st.integers(1, 8),
)
@settings(max_examples=50, deadline=None)
def test_pack_tasks_covers_every_segment_once(sizes: list[int], parallelism: int) -> None:
    """Every segment is in exactly one task, and there are never more tasks than segments."""
    groups = pack_tasks(sizes, parallelism)
    assert sorted(i for g in groups for i in g) == list(range(len(sizes)))
    assert len(groups) <= len(sizes)
    assert len(groups) >= min(len(sizes), 2 * parallelism)


def test_executors_run_pysparks_python_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """`PYSPARK_PYTHON` in cleanerd's environment names the executors' interpreter (a
    cluster's own path); unset, it is this interpreter. The driver is always this one."""
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/python3.11/bin/python3")
    env = python_path_env()
    assert env["PYSPARK_PYTHON"] == "/opt/python3.11/bin/python3"
    assert env["PYSPARK_DRIVER_PYTHON"] == sys.executable
    monkeypatch.delenv("PYSPARK_PYTHON")
    assert python_path_env()["PYSPARK_PYTHON"] == sys.executable
