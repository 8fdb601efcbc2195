"""When to roll the active segment: Kafka's size and time rules, driven by the clock.

Kafka decides rolls only when a batch is appended, so the active segment of an idle
partition never rolls, and its data is never compacted however old it gets (the gap in
KIP-354's promise). cleanerd evaluates the same rules on a timer:

- **size** (`segment.bytes`): the segment is full once its `.log` holds at least
  `segment.bytes`; nothing more can be appended to it.
- **time** (`segment.ms`, KIP-354): the segment rolls once
  `now - rolling timestamp >= maxSegmentMs - jitter`, where
  `maxSegmentMs = min(segment.ms, max.compaction.lag.ms)` for topics with `compact` in
  their policy and `segment.ms` otherwise, and the rolling timestamp is the first batch's
  maxTimestamp. Kafka compares with `>`; cleanerd uses `>=` (DESIGN section 3) so that a
  segment rolls no later than the instant its first batch reaches the limit. Kafka
  measures the wait against the *incoming* batch's timestamp, and so does an append
  through cleanerd's log layer (`rolls_at_append`); with no append the wall clock stands
  in for it.

Clock skew: a first-batch timestamp later than the moment cleanerd first saw the segment
cannot be the time the segment was started, so the rolling timestamp is clamped to
`first_seen_ms`; a future timestamp thus delays a roll by at most the time the segment
had already existed when first seen, never forever. A first batch without a timestamp
(negative, as in magic 0) uses `first_seen_ms` too, as Kafka uses the segment's creation
time.

Minimum roll interval: LinkedIn saw a max compaction lag smaller than the roll jitter
make brokers roll a segment per message, exhausting file handles (linkedin/kafka#521;
they added a 15-minute floor). cleanerd rolls a segment by time only once
`min(min_roll_interval_ms, maxSegmentMs)` (`rolls.min_interval_ms`, 15 minutes by
default) have passed since the partition's last roll, read from evidence on disk that a
restart or a one-shot run finds the same: the previous segment's last modification (a
roll writes the old segment last, and a cleaned segment keeps its sources' mtime;
`SegmentAge.last_roll_ms`). A lone segment (the first
of a partition, or the last one retention left) has no such floor: rolling it once cannot
start a roll per batch, since the segment after it has a previous segment. Capping the
floor at `maxSegmentMs` keeps the compaction deadline: a topic that asks for a one-minute
lag gets one-minute segments, but neither jitter nor producer timestamps far in the past
(which make every new segment look overdue) can roll faster than that. Size rolls are
never delayed: a full segment cannot take more data. An empty segment never rolls.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from typing import Final

from cleanerd.log.meta import SegmentMeta

DEFAULT_MIN_ROLL_INTERVAL_MS: Final = 15 * 60 * 1000


class RollReason(enum.StrEnum):
    """Why a segment rolls, named after the config that forced it."""

    SEGMENT_BYTES = "segment.bytes"
    SEGMENT_MS = "segment.ms"
    MAX_COMPACTION_LAG_MS = "max.compaction.lag.ms"


@dataclass(frozen=True, slots=True)
class TimeRollLimit:
    """Kafka's maxSegmentMs and which config it came from."""

    ms: int
    reason: RollReason


@dataclass(frozen=True, slots=True)
class RollDecision:
    """Roll the segment now, for `reason`."""

    base_offset: int
    reason: RollReason
    waited_ms: int | None
    """For time rolls, now minus the rolling timestamp; None for size rolls."""


def time_roll_limit(segment_ms: int, max_compaction_lag_ms: int, *, compact: bool) -> TimeRollLimit:
    """Kafka's LogConfig.maxSegmentMs, with the config that sets it."""
    if compact and 0 < max_compaction_lag_ms < segment_ms:
        return TimeRollLimit(max_compaction_lag_ms, RollReason.MAX_COMPACTION_LAG_MS)
    return TimeRollLimit(segment_ms, RollReason.SEGMENT_MS)


def max_segment_ms(segment_ms: int, max_compaction_lag_ms: int, *, compact: bool) -> int:
    """min(segment.ms, max.compaction.lag.ms) for compacted topics, else segment.ms."""
    return time_roll_limit(segment_ms, max_compaction_lag_ms, compact=compact).ms


def segment_jitter_seed(topic: str, partition: int, base_offset: int) -> str:
    """A seed naming one segment, so its jitter is the same after every restart."""
    return f"{topic}-{partition}-{base_offset}"


def segment_jitter(segment_ms: int, jitter_ms: int, rng_seed: int | str | bytes) -> int:
    """Kafka's per-segment roll jitter: uniform in [0, min(jitter, segment.ms)), 0 if none.

    `random.Random` hashes str and bytes seeds with SHA-512, independent of
    PYTHONHASHSEED, so the draw is stable across processes.
    """
    bound = min(jitter_ms, segment_ms)
    if bound <= 0:
        return 0
    return random.Random(rng_seed).randrange(bound)


def jitter_of_segment(
    topic: str, partition: int, base_offset: int, segment_ms: int, jitter_ms: int
) -> int:
    """The jitter of the segment of `topic`-`partition` at `base_offset`, drawn from its
    own seed (`segment_jitter_seed`): the same for a clock roll and an append's roll, and
    after every restart."""
    return segment_jitter(segment_ms, jitter_ms, segment_jitter_seed(topic, partition, base_offset))


@dataclass(frozen=True, slots=True)
class SegmentAge:
    """What tells how old an active segment is (see the module docstring)."""

    first_seen_ms: int
    """When cleanerd first saw it holding a batch: clamps a future first-batch timestamp."""
    last_roll_ms: int | None
    """When it was rolled in, by the evidence on disk (None: a lone segment); the
    minimum roll interval counts from here."""


@dataclass(frozen=True, slots=True)
class TimeRollDue:
    """When the time rule rolls a segment, and what sets that instant."""

    at_ms: int
    rolling_timestamp_ms: int
    held_by_min_interval: bool
    """The minimum roll interval, not the time rule itself, sets `at_ms`."""


def time_roll_due(
    segment: SegmentMeta,
    *,
    max_segment_ms: int,
    jitter_ms: int,
    age: SegmentAge,
    min_roll_interval_ms: int = DEFAULT_MIN_ROLL_INTERVAL_MS,
) -> TimeRollDue:
    """The instant the time rule rolls the (non-empty) `segment`: its rolling timestamp
    plus `maxSegmentMs - jitter`, but not before `min(min_roll_interval_ms,
    maxSegmentMs)` after the partition's last roll (no floor when that interval is 0,
    even if the last roll's time, a file's mtime, is later than the time rule's)."""
    rolling = rolling_timestamp(segment, age.first_seen_ms)
    by_time = rolling + max_segment_ms - jitter_ms
    if age.last_roll_ms is None or min_roll_interval_ms <= 0:
        return TimeRollDue(by_time, rolling, False)
    floor = age.last_roll_ms + min(min_roll_interval_ms, max_segment_ms)
    return TimeRollDue(max(by_time, floor), rolling, floor > by_time)


def rolling_timestamp(segment: SegmentMeta, first_seen_ms: int) -> int:
    """The time the segment counts as started: first batch maxTimestamp, clamped."""
    ts = segment.first_batch_timestamp_ms
    if ts is None or ts < 0:
        return first_seen_ms
    return min(ts, first_seen_ms)


def rolls_at_append(
    first_batch_timestamp_ms: int | None,
    incoming_max_timestamp_ms: int,
    *,
    max_segment_ms: int,
    jitter_ms: int,
    now_ms: int,
    last_roll_ms: int | None,
    min_roll_interval_ms: int = DEFAULT_MIN_ROLL_INTERVAL_MS,
) -> bool:
    """Whether an append of records whose max timestamp is `incoming_max_timestamp_ms`
    rolls the active segment first, by the time rule: Kafka's `shouldRoll`, which
    measures the wait from the segment's first batch (its maxTimestamp) to the incoming
    records, not to the clock, so that records written with timestamps far apart (a
    backfill, a replay) are split as a broker splits them, and with Kafka's `>` (an
    append is an instant: nothing here waits for a limit to pass). With the floor of
    `time_roll_due`: the minimum roll interval counts on the clock (`now_ms`) from the
    partition's last roll (`last_roll_ms`, None for a lone segment), as producer
    timestamps that go back and forth would otherwise roll at every other append. A
    first batch without a timestamp leaves the roll to the clock rule (`should_roll`)."""
    if first_batch_timestamp_ms is None or first_batch_timestamp_ms < 0:
        return False
    if incoming_max_timestamp_ms - first_batch_timestamp_ms <= max_segment_ms - jitter_ms:
        return False
    if last_roll_ms is None or min_roll_interval_ms <= 0:
        return True
    return now_ms >= last_roll_ms + min(min_roll_interval_ms, max_segment_ms)


def should_roll(
    segment: SegmentMeta,
    *,
    now_ms: int,
    segment_bytes: int,
    max_segment_ms: int,
    jitter_ms: int,
    age: SegmentAge,
    min_roll_interval_ms: int = DEFAULT_MIN_ROLL_INTERVAL_MS,
    time_reason: RollReason = RollReason.SEGMENT_MS,
) -> RollDecision | None:
    """Whether the active `segment` must roll at `now_ms`, and why; None to keep it.

    `jitter_ms` is the segment's drawn jitter (`segment_jitter`), `age` what tells how
    old it is, and `time_reason` names the config behind `max_segment_ms`
    (`time_roll_limit(...).reason`).
    """
    if segment.is_empty:
        return None
    if segment.size_bytes >= segment_bytes:
        return RollDecision(segment.base_offset, RollReason.SEGMENT_BYTES, None)
    due = time_roll_due(
        segment,
        max_segment_ms=max_segment_ms,
        jitter_ms=jitter_ms,
        age=age,
        min_roll_interval_ms=min_roll_interval_ms,
    )
    if now_ms < due.at_ms:
        return None
    return RollDecision(segment.base_offset, time_reason, now_ms - due.rolling_timestamp_ms)
