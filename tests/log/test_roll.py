from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.log.meta import SegmentMeta
from cleanerd.log.roll import (
    RollReason,
    SegmentAge,
    max_segment_ms,
    rolls_at_append,
    segment_jitter,
    segment_jitter_seed,
    should_roll,
    time_roll_limit,
)

T0 = 1_700_000_000_000
HOUR = 3_600_000
DAY = 24 * HOUR
WEEK = 7 * DAY
MB = 1 << 20


def active(size: int = 500, first_ts: int | None = T0) -> SegmentMeta:
    return SegmentMeta(
        base_offset=40,
        next_offset=40 if size == 0 else 45,
        size_bytes=size,
        largest_timestamp_ms=first_ts if first_ts is not None else T0,
        first_batch_timestamp_ms=None if size == 0 else first_ts,
        offset_index_bytes=0,
        time_index_bytes=0,
        last_modified_ms=T0,
    )


def roll(
    segment: SegmentMeta,
    *,
    now: int,
    max_seg: int = WEEK,
    first_seen_ms: int = T0,
    last_roll_ms: int | None = T0,
    **kw: Any,
):
    args: dict[str, Any] = {"segment_bytes": MB, "jitter_ms": 0}
    args.update(kw)
    age = SegmentAge(first_seen_ms, last_roll_ms)
    return should_roll(segment, now_ms=now, max_segment_ms=max_seg, age=age, **args)


def test_size_rolls_once_segment_bytes_is_reached():
    """A segment holding segment.bytes or more rolls; one byte less does not."""
    assert roll(active(size=MB - 1), now=T0) is None
    decision = roll(active(size=MB), now=T0)
    assert decision is not None
    assert decision.reason is RollReason.SEGMENT_BYTES
    assert decision.base_offset == 40


def test_idle_partition_rolls_by_clock():
    """No append is needed: the clock alone rolls a segment once maxSegmentMs has passed."""
    assert roll(active(), now=T0 + WEEK - 1) is None
    decision = roll(active(), now=T0 + WEEK)
    assert decision is not None
    assert decision.reason is RollReason.SEGMENT_MS
    assert decision.waited_ms == WEEK


def test_compacted_topic_rolls_at_max_compaction_lag():
    """KIP-354: maxSegmentMs = min(segment.ms, max.compaction.lag.ms) when compacting."""
    limit = time_roll_limit(WEEK, 6 * HOUR, compact=True)
    assert limit.ms == 6 * HOUR
    assert limit.reason is RollReason.MAX_COMPACTION_LAG_MS
    decision = roll(active(), now=T0 + 6 * HOUR, max_seg=limit.ms, time_reason=limit.reason)
    assert decision is not None
    assert decision.reason is RollReason.MAX_COMPACTION_LAG_MS


def test_max_segment_ms_ignores_lag_without_compaction():
    """A delete-only topic, or a lag above segment.ms, keeps segment.ms."""
    assert max_segment_ms(WEEK, HOUR, compact=False) == WEEK
    assert max_segment_ms(WEEK, 2 * WEEK, compact=True) == WEEK
    assert max_segment_ms(WEEK, HOUR, compact=True) == HOUR
    assert time_roll_limit(WEEK, 2 * WEEK, compact=True).reason is RollReason.SEGMENT_MS


def test_future_first_batch_timestamp_is_clamped_to_first_seen():
    """A first batch stamped a year ahead cannot block the roll: first_seen counts instead."""
    skewed = active(first_ts=T0 + 365 * DAY)
    decision = roll(skewed, now=T0 + WEEK)
    assert decision is not None
    assert decision.waited_ms == WEEK


def test_first_batch_without_timestamp_uses_first_seen():
    """A first batch with no timestamp (-1) is timed from when the segment was first seen."""
    assert roll(active(first_ts=-1), now=T0 + WEEK - 1) is None
    assert roll(active(first_ts=-1), now=T0 + WEEK) is not None


def test_empty_segment_never_rolls():
    """An empty active segment stays, however old, even with segment.bytes 0."""
    empty = active(size=0, first_ts=None)
    assert roll(empty, now=T0 + 100 * WEEK) is None
    assert roll(empty, now=T0 + 100 * WEEK, segment_bytes=0) is None


def test_jitter_rolls_earlier():
    """A drawn jitter j rolls the segment at maxSegmentMs - j."""
    assert roll(active(), now=T0 + WEEK - HOUR - 1, jitter_ms=HOUR) is None
    assert roll(active(), now=T0 + WEEK - HOUR, jitter_ms=HOUR) is not None


def test_min_roll_interval_stops_a_segment_per_append():
    """Old producer timestamps cannot roll a segment younger than the minimum interval."""
    old = active(first_ts=T0 - 365 * DAY)
    seen = T0
    assert roll(old, now=seen + 14 * 60_000, last_roll_ms=seen) is None
    assert roll(old, now=seen + 15 * 60_000, last_roll_ms=seen) is not None


def test_a_min_roll_interval_of_zero_holds_no_roll():
    """`rolls.min_interval_ms: 0` turns the floor off, even when the last roll's time (a
    file's mtime) is later than the time rule's instant: the floor held the roll until
    that mtime (a past --now-ms, a clock stepped back, files with future mtimes)."""
    old = active(first_ts=T0 - 365 * DAY)
    later = T0 + DAY  # the previous segment's mtime, after `now`
    assert roll(old, now=T0, last_roll_ms=later, min_roll_interval_ms=0) is not None
    assert roll(old, now=T0, last_roll_ms=later) is None  # the default floor still holds


def test_min_roll_interval_is_capped_by_max_segment_ms():
    """A one-minute lag still rolls every minute, and jitter above the lag cannot go faster."""
    seen = T0
    kw: dict[str, Any] = {"max_seg": 60_000, "first_seen_ms": seen, "jitter_ms": 5 * 60_000}
    assert roll(active(first_ts=seen), now=seen + 59_999, **kw) is None
    assert roll(active(first_ts=seen), now=seen + 60_000, **kw) is not None


def test_jitter_is_zero_without_jitter():
    """segment.jitter.ms 0 (Kafka's default) means no jitter."""
    assert segment_jitter(WEEK, 0, "t-0-0") == 0


def test_jitter_is_stable_per_segment():
    """The same segment draws the same jitter after a restart; other segments differ."""
    seed = segment_jitter_seed("t", 0, 1000)
    assert seed == "t-0-1000"
    first = segment_jitter(WEEK, DAY, seed)
    assert segment_jitter(WEEK, DAY, seed) == first
    draws = {segment_jitter(WEEK, DAY, segment_jitter_seed("t", 0, b)) for b in range(20)}
    assert len(draws) > 1


@settings(deadline=None, max_examples=200)
@given(
    segment_ms=st.integers(min_value=1, max_value=10 * WEEK),
    jitter_ms=st.integers(min_value=0, max_value=10 * WEEK),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_jitter_bounds(segment_ms: int, jitter_ms: int, seed: int):
    """Jitter lies in [0, min(segment.jitter.ms, segment.ms))."""
    j = segment_jitter(segment_ms, jitter_ms, seed)
    assert j >= 0
    assert j == 0 or j < min(jitter_ms, segment_ms)


def _at_append(incoming: int, **kw: Any) -> bool:
    args: dict[str, Any] = {
        "max_segment_ms": HOUR,
        "jitter_ms": 0,
        "now_ms": 10 * HOUR,
        "last_roll_ms": None,
        "min_roll_interval_ms": 15 * 60_000,
    }
    return rolls_at_append(kw.pop("first", 0), incoming, **(args | kw))


def test_an_append_rolls_by_its_records_timestamps_past_the_first_batch():
    """Kafka's shouldRoll: the incoming records' max timestamp against the segment's first
    batch's, with `>` (not the clock: records written at once, hours apart, still split)."""
    assert not _at_append(HOUR)
    assert _at_append(HOUR + 1)
    assert not _at_append(HOUR + 1, first=1)
    assert _at_append(HOUR - 99, jitter_ms=100)
    assert not _at_append(5 * HOUR, first=None)  # no timestamp: the clock rule decides
    assert not _at_append(5 * HOUR, first=-1)


def test_an_append_roll_keeps_the_minimum_interval_on_the_clock():
    """After a roll, the next time roll by an append waits for min(interval, maxSegmentMs)
    on the clock, however far apart the records' timestamps are; a lone segment rolls."""
    assert _at_append(5 * HOUR, last_roll_ms=None)
    assert not _at_append(5 * HOUR, now_ms=HOUR, last_roll_ms=HOUR - 60_000)
    assert _at_append(5 * HOUR, now_ms=HOUR, last_roll_ms=HOUR - 15 * 60_000)
    assert _at_append(5 * HOUR, now_ms=HOUR, last_roll_ms=HOUR, min_roll_interval_ms=0)
    assert _at_append(
        5 * HOUR, now_ms=HOUR, last_roll_ms=HOUR - 60_000, max_segment_ms=60_000
    )  # the floor never exceeds maxSegmentMs
