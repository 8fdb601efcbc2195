from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.compaction.cleanable import CleanableRange, LogToClean, UncleanableBound
from cleanerd.compaction.schedule import order_for_cleaning, priority_key, select_next
from cleanerd.log.files import TopicPartition

NOW = 1_700_000_000_000
HOUR = 3_600_000


def candidate(topic: str, *, deadline: int | None, ratio: float, partition: int = 0) -> LogToClean:
    total = 1000
    cleanable = round(ratio * total)
    return LogToClean(
        topic_partition=TopicPartition(topic, partition),
        first_dirty=0,
        first_uncleanable=10,
        clean_bytes=total - cleanable,
        cleanable_bytes=cleanable,
        total_bytes=total,
        cleanable_ratio=ratio,
        compaction_delay_ms=0 if deadline is None else max(0, NOW - deadline),
        kafka_compaction_delay_ms=0,
        earliest_dirty_timestamp_ms=None if deadline is None else deadline - HOUR,
        deadline_ms=deadline,
        needs_compaction_now=deadline is not None and deadline < NOW,
        cleanable_range=CleanableRange(0, 10, 10, False, (UncleanableBound.ACTIVE_SEGMENT,)),
    )


def topics(ordered: list[LogToClean]) -> list[str]:
    return [c.topic_partition.topic for c in ordered]


def test_overdue_then_nearest_deadline_then_dirtiest():
    """Overdue logs go first, then the nearest deadline, then logs by dirty ratio."""
    logs = [
        candidate("dirtiest", deadline=None, ratio=0.9),
        candidate("dirty", deadline=None, ratio=0.6),
        candidate("due-soon", deadline=NOW + HOUR, ratio=0.1),
        candidate("due-later", deadline=NOW + 5 * HOUR, ratio=0.8),
        candidate("overdue", deadline=NOW - HOUR, ratio=0.01),
    ]
    ordered = order_for_cleaning(logs, NOW)
    assert topics(ordered) == ["overdue", "due-soon", "due-later", "dirtiest", "dirty"]


def test_most_overdue_first():
    """Among overdue logs, the one whose deadline passed longest ago is first."""
    logs = [
        candidate("late", deadline=NOW - HOUR, ratio=0.9),
        candidate("later", deadline=NOW - 3 * HOUR, ratio=0.1),
    ]
    assert topics(order_for_cleaning(logs, NOW)) == ["later", "late"]


def test_deadlines_are_judged_at_the_given_now():
    """A log computed before its deadline counts as overdue once now has passed it."""
    due = candidate("due", deadline=NOW + HOUR, ratio=0.1)
    assert priority_key(due, NOW)[0] > priority_key(due, NOW + 2 * HOUR)[0]


def test_equal_deadlines_prefer_dirtier_log():
    """Two logs due at the same instant go dirtiest first."""
    logs = [
        candidate("a", deadline=NOW + HOUR, ratio=0.2),
        candidate("b", deadline=NOW + HOUR, ratio=0.7),
    ]
    assert topics(order_for_cleaning(logs, NOW)) == ["b", "a"]


def test_ties_break_by_topic_partition():
    """Identical priorities order by topic, then partition number (2 before 10)."""
    logs = [
        candidate("b", deadline=None, ratio=0.5, partition=0),
        candidate("a", deadline=None, ratio=0.5, partition=10),
        candidate("a", deadline=None, ratio=0.5, partition=2),
    ]
    ordered = order_for_cleaning(logs, NOW)
    assert [str(c.topic_partition) for c in ordered] == ["a-2", "a-10", "b-0"]


def test_select_next_skips_held_and_uncleanable_logs():
    """A log in progress or quarantined is never picked; with none left, nothing is."""
    overdue = candidate("overdue", deadline=NOW - HOUR, ratio=0.1)
    soon = candidate("soon", deadline=NOW + HOUR, ratio=0.1)
    dirty = candidate("dirty", deadline=None, ratio=0.9)
    logs = [dirty, soon, overdue]
    assert select_next(logs, set(), set(), NOW) is overdue
    assert select_next(logs, {overdue.topic_partition}, set(), NOW) is soon
    held = {overdue.topic_partition}
    assert select_next(logs, held, {soon.topic_partition}, NOW) is dirty
    everything = {c.topic_partition for c in logs}
    assert select_next(logs, everything, set(), NOW) is None


@settings(deadline=None, max_examples=100)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.integers(min_value=-5, max_value=5)),
            st.integers(min_value=0, max_value=10),
        ),
        min_size=1,
        max_size=12,
    ),
    st.integers(min_value=0, max_value=2**32),
)
def test_order_is_independent_of_input_order(specs: list[tuple[int | None, int]], seed: int):
    """Shuffling the candidates never changes the cleaning order."""
    logs = [
        candidate(
            "t",
            partition=i,
            deadline=None if d is None else NOW + d * HOUR,
            ratio=r / 10,
        )
        for i, (d, r) in enumerate(specs)
    ]
    shuffled = logs[:]
    random.Random(seed).shuffle(shuffled)
    assert order_for_cleaning(shuffled, NOW) == order_for_cleaning(logs, NOW)
    assert select_next(shuffled, set(), set(), NOW) == order_for_cleaning(logs, NOW)[0]
