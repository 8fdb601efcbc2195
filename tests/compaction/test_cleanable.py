from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.compaction.cleanable import (
    NO_MAX_COMPACTION_LAG,
    EligibilityReason,
    LogToClean,
    UncleanableBound,
    clean_bytes,
    cleanable_bytes,
    cleanable_range,
    eligibility,
    kafka_max_compaction_delay,
    log_to_clean,
    max_compaction_delay,
)
from cleanerd.compaction.manager import select_next
from cleanerd.log.files import TopicPartition
from cleanerd.log.meta import PartitionMeta, SegmentMeta

T0 = 1_700_000_000_000
HOUR = 3_600_000
RECORD_BYTES = 70


@dataclass
class LogBuilder:
    """Appends one-record batches and rolls, like Kafka's cleaner test logs."""

    topic: str = "log"
    partition: int = 0
    sealed: list[SegmentMeta] = field(default_factory=list)
    open_batches: list[tuple[int, int]] = field(default_factory=list)  # (timestamp, size)
    base: int = 0
    next_offset: int = 0

    def append(self, count: int = 1, *, ts: int = T0, size: int = RECORD_BYTES) -> LogBuilder:
        for _ in range(count):
            self.open_batches.append((ts, size))
            self.next_offset += 1
        return self

    def roll(self) -> LogBuilder:
        if self.open_batches:
            self.sealed.append(self._segment())
            self.open_batches = []
            self.base = self.next_offset
        return self

    def _segment(self) -> SegmentMeta:
        stamps = [ts for ts, _ in self.open_batches]
        return SegmentMeta(
            base_offset=self.base,
            next_offset=self.next_offset,
            size_bytes=sum(size for _, size in self.open_batches),
            largest_timestamp_ms=max(stamps, default=T0),
            first_batch_timestamp_ms=stamps[0] if stamps else None,
            offset_index_bytes=0,
            time_index_bytes=0,
            last_modified_ms=max(stamps, default=T0),
        )

    def build(
        self,
        *,
        log_start: int | None = None,
        hw: int | None = None,
        first_unstable: int | None = None,
    ) -> PartitionMeta:
        segments = (*self.sealed, self._segment())
        return PartitionMeta(
            topic=self.topic,
            partition=self.partition,
            log_dir="/data",
            segments=segments,
            log_start_offset=segments[0].base_offset if log_start is None else log_start,
            log_end_offset=self.next_offset,
            high_watermark=hw,
            first_unstable_offset=first_unstable,
        )


def manager_log(records: int, topic: str = "log", ts: int = T0) -> LogBuilder:
    """LogCleanerManagerTest's log: roll after batch 0, then every 5 batches, final roll."""
    log = LogBuilder(topic=topic)
    for i in range(records):
        log.append(ts=ts)
        if i % 5 == 0:
            log.roll()
    return log.roll()


def ltc(
    meta: PartitionMeta,
    checkpoint: int | None,
    *,
    now: int = T0,
    min_lag: int = 0,
    max_lag: int = NO_MAX_COMPACTION_LAG,
) -> LogToClean:
    return log_to_clean(
        meta,
        checkpoint=checkpoint,
        now_ms=now,
        min_compaction_lag_ms=min_lag,
        max_compaction_lag_ms=max_lag,
    )


def grab_filthiest(
    candidates: list[LogToClean],
    *,
    ratio: float = 0.05,
    in_progress: frozenset[TopicPartition] = frozenset(),
    uncleanable: frozenset[TopicPartition] = frozenset(),
) -> LogToClean | None:
    eligible = [c for c in candidates if (eligibility(c, ratio, horizon_due=False) is not None)]
    return select_next(eligible, in_progress, uncleanable, T0)


def test_dirtiest_log_wins():
    """Scenario 45: of logs with 20, 25, 30 records cleaned to 20, the 30-record one goes."""
    logs = {n: ltc(manager_log(n, topic=f"log{n}").build(), 20) for n in (20, 25, 30)}
    tps = {n: c.topic_partition for n, c in logs.items()}
    candidates = list(logs.values())
    assert logs[20].cleanable_bytes == 0
    assert grab_filthiest(candidates) is logs[30]
    assert grab_filthiest(candidates, uncleanable=frozenset({tps[30]})) is logs[25]
    assert grab_filthiest(candidates, in_progress=frozenset({tps[30]})) is logs[25]
    taken = grab_filthiest(
        candidates, in_progress=frozenset({tps[30]}), uncleanable=frozenset({tps[25]})
    )
    assert taken is None


def test_checkpoint_beyond_log_end_resets_to_log_start():
    """Scenario 46: checkpoint 200 > LEO gives first dirty 0 and a checkpoint rewrite."""
    meta = manager_log(20).build()
    rng = cleanable_range(meta, checkpoint=200, now_ms=T0, min_compaction_lag_ms=0)
    assert rng.first_dirty == 0
    assert rng.checkpoint_reset
    assert grab_filthiest([ltc(meta, 200)]) is not None


def test_checkpoint_below_log_start_resets_to_log_start():
    """Scenario 46: log start 10 with checkpoint 0 gives first dirty 10."""
    meta = manager_log(20).build(log_start=10)
    rng = cleanable_range(meta, checkpoint=0, now_ms=T0, min_compaction_lag_ms=0)
    assert (rng.first_dirty, rng.checkpoint_reset) == (10, True)


def test_no_checkpoint_starts_at_log_start_without_reset():
    """Without a checkpoint the log start offset is the first dirty offset; nothing to rewrite."""
    meta = manager_log(20).build(log_start=10)
    rng = cleanable_range(meta, checkpoint=None, now_ms=T0, min_compaction_lag_ms=0)
    assert (rng.first_dirty, rng.checkpoint_reset) == (10, False)


def test_only_an_active_segment_is_never_chosen():
    """Scenario 47: 9 records in the active segment are not cleanable, whatever the checkpoint."""
    meta = LogBuilder().append(9).build(log_start=2)
    for checkpoint in (0, 3):
        candidate = ltc(meta, checkpoint)
        assert candidate.cleanable_bytes == 0
        assert grab_filthiest([candidate]) is None


def test_range_stops_at_high_watermark():
    """Scenario 52a: with HW 50 inside the log the first uncleanable offset is the LSO."""
    log = LogBuilder()
    for _ in range(8):
        log.append(10).roll()
    meta = log.append(5).build(hw=50)
    rng = cleanable_range(meta, checkpoint=0, now_ms=T0, min_compaction_lag_ms=0)
    assert rng.uncleanable_offset == 50
    assert rng.first_uncleanable == 50
    assert rng.blocked_by == (UncleanableBound.LAST_STABLE_OFFSET,)


def test_range_stops_at_active_segment():
    """Scenario 52b: with HW = LEO the active segment's base bounds the range."""
    log = LogBuilder()
    for _ in range(8):
        log.append(10).roll()
    meta = log.append(5).build()
    rng = cleanable_range(meta, checkpoint=0, now_ms=T0, min_compaction_lag_ms=0)
    assert rng.first_uncleanable == 80
    assert rng.blocked_by == (UncleanableBound.ACTIVE_SEGMENT,)


def test_min_lag_stops_at_segment_with_new_records():
    """Scenario 52c: after the lag, the segment active at t0 (now holding t1 data) bounds it."""
    t1 = T0 + HOUR + 1
    log = LogBuilder()
    for _ in range(4):
        log.append(10, ts=T0).roll()
    meta = log.append(3, ts=T0).append(3, ts=t1).roll().append(2, ts=t1).build()
    rng = cleanable_range(meta, checkpoint=0, now_ms=t1, min_compaction_lag_ms=HOUR)
    assert rng.first_uncleanable == 40
    assert rng.blocked_by == (UncleanableBound.MIN_COMPACTION_LAG,)


def test_min_lag_passed_everywhere_leaves_active_bound():
    """Scenario 52d: everything older than the lag is cleanable up to the active segment."""
    log = LogBuilder()
    for _ in range(4):
        log.append(10, ts=T0).roll()
    meta = log.append(2, ts=T0).build()
    rng = cleanable_range(meta, checkpoint=0, now_ms=T0 + HOUR + 1, min_compaction_lag_ms=HOUR)
    assert rng.first_uncleanable == 40
    assert rng.blocked_by == (UncleanableBound.ACTIVE_SEGMENT,)


def test_checkpoint_validity_against_log_start_and_end():
    """Scenario 52e: checkpoint 15 is kept at start 10, reset at start 20, reset at 25 > LEO."""
    meta = manager_log(20)
    for start, checkpoint, reset in ((10, 15, False), (20, 15, True), (0, 25, True)):
        rng = cleanable_range(
            meta.build(log_start=start), checkpoint=checkpoint, now_ms=T0, min_compaction_lag_ms=0
        )
        assert rng.checkpoint_reset is reset


def test_open_transaction_bounds_the_range():
    """Scenario 52f: an open txn at 0 blocks all; after the abort the lag still bounds it."""
    t1 = T0 + HOUR + 1
    lag = HOUR
    open_txn = LogBuilder().append(3, ts=T0).build(hw=3, first_unstable=0)
    rng = cleanable_range(open_txn, checkpoint=0, now_ms=t1, min_compaction_lag_ms=lag)
    assert (rng.first_dirty, rng.first_uncleanable) == (0, 0)
    assert rng.blocked_by == (UncleanableBound.LAST_STABLE_OFFSET, UncleanableBound.ACTIVE_SEGMENT)

    aborted = LogBuilder().append(3, ts=T0).roll().append(1, ts=t1).roll().build(hw=4)
    rng = cleanable_range(aborted, checkpoint=0, now_ms=t1, min_compaction_lag_ms=lag)
    assert (rng.first_dirty, rng.first_uncleanable) == (0, 3)
    later = cleanable_range(aborted, checkpoint=0, now_ms=t1 + lag + 1, min_compaction_lag_ms=lag)
    assert later.first_uncleanable == 4


def test_checkpoint_past_the_bounds_gives_an_empty_range():
    """A dirty offset beyond the LSO is the range's upper bound, aligned to its segment."""
    log = LogBuilder()
    for _ in range(3):
        log.append(10).roll()
    meta = log.append(5).build(hw=12)
    rng = cleanable_range(meta, checkpoint=25, now_ms=T0, min_compaction_lag_ms=0)
    assert (rng.first_dirty, rng.uncleanable_offset, rng.first_uncleanable) == (25, 25, 20)
    assert rng.blocked_by == (UncleanableBound.LAST_STABLE_OFFSET,)
    assert cleanable_bytes(meta, rng.first_dirty, rng.first_uncleanable) == 0


def test_invalid_checkpoint_is_flagged_even_when_not_chosen():
    """Scenario 53: start 20 = LEO with checkpoint 15 is not chosen but the reset is flagged."""
    meta = manager_log(20).build(log_start=20)
    candidate = ltc(meta, 15)
    assert candidate.cleanable_range.checkpoint_reset
    assert candidate.first_dirty == 20
    assert grab_filthiest([candidate]) is None


def test_second_log_chosen_while_first_checkpoint_resets():
    """Scenario 53: start 15 / checkpoint 10 resets; the log with checkpoint 5 is chosen."""
    first = ltc(manager_log(20, topic="a").build(log_start=15), 10)
    second = ltc(manager_log(20, topic="b").build(), 5)
    assert first.cleanable_range.checkpoint_reset
    assert first.first_dirty == 15
    assert grab_filthiest([first, second], ratio=0.5) is second


def test_byte_accounting_with_dirty_at_active_base():
    """Scenario 27: dirty = uncleanable = active base counts every inactive byte as clean."""
    log = LogBuilder()
    for size in (90, 80, 70, 60, 50):
        log.append(size=size).roll()
    meta = log.append(size=40).build()
    assert clean_bytes(meta, 5) == meta.size_bytes - meta.active.size_bytes
    assert cleanable_bytes(meta, 5, 5) == 0


def test_byte_accounting_between_segments():
    """Scenario 27: dirty at seg 2 and uncleanable at seg 4 split clean and cleanable bytes."""
    log = LogBuilder()
    for size in (90, 80, 70, 60, 50):
        log.append(size=size).roll()
    meta = log.append(size=40).build()
    assert clean_bytes(meta, 2) == 90 + 80
    assert cleanable_bytes(meta, 2, 4) == 70 + 60


def test_straddling_segment_counts_as_clean_and_cleanable():
    """A segment holding the dirty offset counts in both clean and cleanable bytes."""
    meta = LogBuilder().append(5, size=10).roll().append(5, size=20).roll().append(1).build()
    candidate = ltc(meta, 7)
    assert candidate.clean_bytes == 50 + 100
    assert candidate.cleanable_bytes == 100
    assert candidate.total_bytes == 250
    assert candidate.cleanable_ratio == 100 / 250


def test_min_lag_holds_back_recent_data():
    """Scenario 55: within the min lag nothing is cleanable; after it, up to the t0 active base."""
    lag = HOUR
    log = LogBuilder()
    for _ in range(6):
        log.append(20, ts=T0).roll()
    t0_active_base = log.next_offset
    log.append(5, ts=T0)
    half = ltc(log.build(), None, now=T0 + lag // 2, min_lag=lag)
    assert half.cleanable_bytes == 0
    assert half.cleanable_range.blocked_by == (UncleanableBound.MIN_COMPACTION_LAG,)

    t1 = T0 + lag + 1
    meta = log.append(5, ts=t1).roll().append(1, ts=t1).build()
    after = ltc(meta, None, now=t1, min_lag=lag)
    assert after.first_uncleanable == t0_active_base
    assert after.cleanable_bytes > 0


def test_max_lag_forces_cleaning_despite_ratio_one():
    """Scenario 56: with ratio 1.0, only the max lag makes a log eligible, block by block."""
    min_lag, max_lag = HOUR, 6 * HOUR
    log = LogBuilder()
    for _ in range(3):
        log.append(100, ts=T0).roll()
    log.append(10, ts=T0)
    at_3h = ltc(log.build(), None, now=T0 + 3 * HOUR, min_lag=min_lag, max_lag=max_lag)
    assert not (eligibility(at_3h, 1.0, horizon_due=False) is not None)

    t1 = T0 + max_lag + 1
    first_block_end = log.next_offset
    meta = log.append(100, ts=t1).roll().build()
    forced = ltc(meta, None, now=t1, min_lag=min_lag, max_lag=max_lag)
    assert forced.needs_compaction_now
    assert eligibility(forced, 1.0, horizon_due=False) is EligibilityReason.MAX_COMPACTION_LAG
    assert forced.first_uncleanable == first_block_end - 10

    t2 = t1 + max_lag + 1
    cleaned_once = ltc(meta, forced.first_uncleanable, now=t2, min_lag=min_lag, max_lag=max_lag)
    assert cleaned_once.needs_compaction_now
    assert eligibility(cleaned_once, 1.0, horizon_due=False) is not None
    assert cleaned_once.first_uncleanable == meta.active.base_offset


def test_kafka_delay_ignores_active_segment_but_cleanerd_counts_it():
    """Overdue data in the active segment reads 0 in Kafka's delay, not in cleanerd's."""
    max_lag = HOUR
    meta = LogBuilder().append(5, ts=T0).roll().append(5, ts=T0 - 2 * HOUR).build()
    now = T0 + 10
    kafka = kafka_max_compaction_delay(
        meta, first_dirty=5, now_ms=now, max_compaction_lag_ms=max_lag
    )
    honest = max_compaction_delay(meta, first_dirty=5, now_ms=now, max_compaction_lag_ms=max_lag)
    assert kafka.delay_ms == 0
    assert kafka.earliest_dirty_timestamp_ms is None
    assert honest.earliest_dirty_timestamp_ms == T0 - 2 * HOUR
    assert honest.deadline_ms == T0 - HOUR
    assert honest.delay_ms == HOUR + 10
    candidate = ltc(meta, 5, now=now, max_lag=max_lag)
    assert candidate.compaction_delay_ms == HOUR + 10
    assert candidate.kafka_compaction_delay_ms == 0
    assert not candidate.needs_compaction_now


def test_kafka_delay_over_dirty_inactive_segments():
    """Kafka's delay is now - max lag - earliest first-batch timestamp of dirty segments."""
    meta = (
        LogBuilder()
        .append(2, ts=T0 - 9 * HOUR)
        .roll()
        .append(2, ts=T0 - 5 * HOUR)
        .roll()
        .append(2, ts=T0 - 3 * HOUR)
        .roll()
        .append(1, ts=T0)
        .build()
    )
    delay = kafka_max_compaction_delay(meta, first_dirty=2, now_ms=T0, max_compaction_lag_ms=HOUR)
    assert delay.earliest_dirty_timestamp_ms == T0 - 5 * HOUR
    assert delay.delay_ms == 4 * HOUR
    clean = kafka_max_compaction_delay(meta, first_dirty=6, now_ms=T0, max_compaction_lag_ms=HOUR)
    assert clean.delay_ms == 0


def test_delay_ignores_non_positive_timestamps():
    """First-batch timestamps <= 0 (no timestamp) never count as the earliest dirty time."""
    meta = LogBuilder().append(2, ts=-1).roll().append(2, ts=0).roll().append(1, ts=T0).build()
    delay = kafka_max_compaction_delay(meta, first_dirty=0, now_ms=T0, max_compaction_lag_ms=1)
    assert delay.earliest_dirty_timestamp_ms is None
    assert delay.delay_ms == 0


def test_no_max_lag_means_no_deadline():
    """Kafka's default max lag (Long.MAX) gives no deadline and no delay."""
    meta = LogBuilder().append(2, ts=1).roll().append(1).build()
    candidate = ltc(meta, None, now=T0)
    assert candidate.deadline_ms is None
    assert candidate.compaction_delay_ms == 0


def test_ratio_must_be_strictly_above_threshold():
    """A ratio equal to min.cleanable.dirty.ratio is not eligible."""
    meta = LogBuilder().append(size=50).roll().append(size=50).roll().append(1).build()
    candidate = ltc(meta, 1)
    assert candidate.cleanable_ratio == 0.5
    assert not (eligibility(candidate, 0.5, horizon_due=False) is not None)
    assert eligibility(candidate, 0.49, horizon_due=False) is EligibilityReason.DIRTY_RATIO


def test_forced_log_needs_cleanable_bytes():
    """A log past its max lag with nothing cleanable is not eligible."""
    meta = LogBuilder().append(2, ts=T0 - 5 * HOUR).roll().append(1).build()
    candidate = ltc(meta, None, now=T0, min_lag=6 * HOUR, max_lag=HOUR)
    assert candidate.needs_compaction_now
    assert candidate.cleanable_bytes == 0
    assert not (eligibility(candidate, 0.5, horizon_due=False) is not None)


def test_passed_delete_horizon_makes_a_clean_log_eligible():
    """cleanerd extension: a due horizon in the clean section forces a rewrite."""
    meta = LogBuilder().append(4).roll().append(1).build()
    candidate = ltc(meta, 4)
    assert candidate.cleanable_bytes == 0
    assert not (eligibility(candidate, 0.5, horizon_due=False) is not None)
    assert eligibility(candidate, 0.5, horizon_due=True) is EligibilityReason.DELETE_HORIZON
    empty = dataclasses.replace(candidate, clean_bytes=0, total_bytes=0)
    assert not (eligibility(empty, 0.5, horizon_due=True) is not None)


@st.composite
def partitions(draw: st.DrawFn) -> tuple[PartitionMeta, int | None, int, int]:
    log = LogBuilder()
    for _ in range(draw(st.integers(min_value=0, max_value=6))):
        count = draw(st.integers(min_value=1, max_value=4))
        log.append(count, ts=T0 + draw(st.integers(min_value=0, max_value=10 * HOUR))).roll()
    log.append(draw(st.integers(min_value=0, max_value=3)))
    leo = log.next_offset
    hw = draw(st.one_of(st.none(), st.integers(min_value=0, max_value=leo)))
    unstable = draw(st.one_of(st.none(), st.integers(min_value=0, max_value=leo)))
    checkpoint = draw(st.one_of(st.none(), st.integers(min_value=-2, max_value=leo + 2)))
    now = T0 + draw(st.integers(min_value=0, max_value=20 * HOUR))
    min_lag = draw(st.sampled_from([0, HOUR, 5 * HOUR]))
    return log.build(hw=hw, first_unstable=unstable), checkpoint, now, min_lag


@settings(deadline=None, max_examples=150)
@given(partitions())
def test_cleanable_section_respects_every_bound(case: tuple[PartitionMeta, int | None, int, int]):
    """The cleanable section never reaches the active segment, the LSO or a young segment."""
    meta, checkpoint, now, min_lag = case
    candidate = ltc(meta, checkpoint, now=now, min_lag=min_lag)
    assert candidate.first_uncleanable in [s.base_offset for s in meta.segments]
    assert candidate.first_uncleanable <= meta.active.base_offset
    assert candidate.first_uncleanable <= max(candidate.first_dirty, meta.last_stable_offset)
    assert meta.log_start_offset <= candidate.first_dirty <= meta.log_end_offset
    assert 0.0 <= candidate.cleanable_ratio <= 1.0
    dirty_segments = meta.segments[meta.segment_index_for(candidate.first_dirty) :]
    for seg in dirty_segments:
        if seg.base_offset >= candidate.first_uncleanable:
            break
        if min_lag > 0:
            assert seg.largest_timestamp_ms <= now - min_lag
