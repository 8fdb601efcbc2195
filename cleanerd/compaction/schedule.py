"""The order in which eligible logs are cleaned: deadlines first, then dirtiness.

Kafka hands each free cleaner thread the dirtiest eligible log. With few threads and
many logs a log forced by `max.compaction.lag.ms` can wait behind dirtier ones
indefinitely, so the deadline is not kept. cleanerd orders eligible logs by:

1. overdue logs (deadline before now), most overdue first;
2. then logs with a deadline, nearest first;
3. then logs without a deadline (no max lag, or no dirty timestamp);

and, within equal deadlines and in the last class, the dirtiest (highest cleanable
ratio) first. The topic-partition breaks every remaining tie, so two runs over the same
snapshot pick the same order. Deadlines are re-evaluated at the `now_ms` given, not at
the time the candidates were computed.
"""

from __future__ import annotations

from collections.abc import Iterable, Set

from cleanerd.compaction.cleanable import LogToClean
from cleanerd.log.files import TopicPartition

_OVERDUE, _DEADLINE, _NO_DEADLINE = 0, 1, 2

PriorityKey = tuple[int, int, float, str, int]


def priority_key(ltc: LogToClean, now_ms: int) -> PriorityKey:
    """Sort key: smaller is cleaned first."""
    tp = ltc.topic_partition
    if ltc.deadline_ms is None:
        return (_NO_DEADLINE, 0, -ltc.cleanable_ratio, tp.topic, tp.partition)
    klass = _OVERDUE if ltc.deadline_ms < now_ms else _DEADLINE
    # Ascending deadlines put the most overdue first among overdue logs, too.
    return (klass, ltc.deadline_ms, -ltc.cleanable_ratio, tp.topic, tp.partition)


def order_for_cleaning(candidates: Iterable[LogToClean], now_ms: int) -> list[LogToClean]:
    """Eligible candidates, in the order workers should take them."""
    return sorted(candidates, key=lambda ltc: priority_key(ltc, now_ms))


def select_next(
    candidates: Iterable[LogToClean],
    in_progress: Set[TopicPartition],
    uncleanable: Set[TopicPartition],
    now_ms: int,
) -> LogToClean | None:
    """The first eligible candidate that no worker holds and that is not quarantined."""
    free = (
        ltc
        for ltc in candidates
        if ltc.topic_partition not in in_progress and ltc.topic_partition not in uncleanable
    )
    return min(free, key=lambda ltc: priority_key(ltc, now_ms), default=None)
