"""Packing segments into the Spark jobs' decode tasks."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.engine.spark.tasks import pack_tasks


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
