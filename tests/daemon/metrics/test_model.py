"""Tests of cleanerd.daemon.metrics.model: the snapshot's numbers, Kafka's and cleanerd's."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.compaction.cleanable import log_to_clean
from cleanerd.compaction.manager import UncleanablePartitions
from cleanerd.compaction.stats import CleanerStats
from cleanerd.daemon.metrics.model import build_snapshot
from cleanerd.log.files import TopicPartition
from cleanerd.log.meta import PartitionMeta, SegmentMeta
from cleanerd.log.roll import RollDecision, RollReason
from cleanerd.maintenance.report import MaintenanceCounters, PartitionState, Unreadable
from cleanerd.retention.disk import DiskUsageReport
from cleanerd.retention.disk_usage import DeviceUsage, DiskDeletion
from cleanerd.retention.executor import RetentionOutcome
from cleanerd.retention.policy import Deletion, DeletionReason

NOW = 1_700_000_000_000
MIN = 60_000


def seg(base: int, first_ts: int, size: int = 100) -> SegmentMeta:
    return SegmentMeta(base, base + 10, size, first_ts, first_ts, 0, 0, first_ts)


def meta(topic: str, log_dir: str, first_ts: list[int]) -> PartitionMeta:
    segments = tuple(seg(10 * i, ts) for i, ts in enumerate(first_ts))
    return PartitionMeta(
        topic=topic,
        partition=0,
        log_dir=log_dir,
        segments=segments,
        log_start_offset=0,
        log_end_offset=segments[-1].next_offset,
        high_watermark=None,
        first_unstable_offset=None,
    )


def state(m: PartitionMeta, lag: int = 10 * MIN, checkpoint: int | None = None) -> PartitionState:
    ltc = log_to_clean(
        m, checkpoint=checkpoint, now_ms=NOW, min_compaction_lag_ms=0, max_compaction_lag_ms=lag
    )
    return PartitionState(m, ltc)


def stats(read: int, written: int, util: float, ms: int) -> CleanerStats:
    return CleanerStats(read, written, 0, 0, 0, 0, 0, util, 0, 0, ms)


def test_honest_delay_counts_the_active_segment() -> None:
    """Overdue data in an unrolled active segment shows in the delay (not in Kafka's own,
    which `plan` shows), per partition, per log dir and overall."""
    idle = state(meta("idle", "/a", [NOW - 60 * MIN]))
    rolled = state(meta("rolled", "/b", [NOW - 30 * MIN, NOW]))
    snap = build_snapshot(now_ms=NOW, partitions=[idle, rolled])
    by_topic = {p.topic: p for p in snap.partitions}
    assert by_topic["idle"].compaction_delay_ms == 50 * MIN
    assert idle.ltc is not None
    assert idle.ltc.kafka_compaction_delay_ms == 0
    assert by_topic["rolled"].compaction_delay_ms == 20 * MIN
    assert snap.max_compaction_delay_ms == 50 * MIN
    assert [(d.log_dir, d.max_compaction_delay_ms) for d in snap.log_dirs] == [
        ("/a", 50 * MIN),
        ("/b", 20 * MIN),
    ]


def test_uncleanable_partitions_and_bytes_per_dir() -> None:
    """Uncleanable partitions count per log dir with their cleanable bytes; they stay in
    the delay but leave Kafka's dirty ratio; a marked partition without a snapshot still
    counts."""
    bad = state(meta("bad", "/a", [NOW - 60 * MIN, NOW - 50 * MIN, NOW]))
    good = state(meta("good", "/a", [NOW, NOW, NOW]), checkpoint=10)
    registry = UncleanablePartitions()
    registry.mark(TopicPartition("bad", 0), log_dir="/a", reason="corrupt", now_ms=NOW)
    registry.mark(TopicPartition("gone", 0), log_dir="/a", reason="io", now_ms=NOW)
    snap = build_snapshot(
        now_ms=NOW, partitions=[bad, good], log_dirs=["/a", "/empty"], uncleanable=registry
    )
    a, empty = snap.log_dirs
    assert (a.uncleanable_partitions, a.uncleanable_bytes) == (2, 200)
    assert (empty.log_dir, empty.partitions, empty.uncleanable_partitions) == ("/empty", 0, 0)
    assert a.max_compaction_delay_ms == 50 * MIN
    assert a.max_dirty_ratio == 0.5  # good's; bad's 1.0 does not count
    assert snap.uncleanable_partitions == 2
    assert snap.partitions[0].uncleanable_reason == "corrupt"


def test_unreadable_partitions_count_per_dir_and_among_its_partitions() -> None:
    """A partition the last cycle could not read counts in its log dir's unreadable and
    partition counts (once, however often listed), in a dir with no readable partition
    too; a readable partition's dir counts none."""
    good = state(meta("good", "/a", [NOW]))
    unreadable = [
        Unreadable("/a", TopicPartition("bad", 0), ("compact",), "bad CRC"),
        Unreadable("/a", TopicPartition("bad", 0), ("compact",), "bad CRC"),
        Unreadable("/b", TopicPartition("other", 3), ("delete",), "link refused"),
    ]
    snap = build_snapshot(
        now_ms=NOW, partitions=[good], log_dirs=["/a", "/c"], unreadable=unreadable
    )
    counts = {d.log_dir: (d.partitions, d.unreadable_partitions) for d in snap.log_dirs}
    assert counts == {"/a": (2, 1), "/b": (1, 1), "/c": (0, 0)}
    assert [p.topic for p in snap.partitions] == ["good"]


def test_worker_gauges_as_kafka_computes_them() -> None:
    """Clean time, buffer utilisation and recopy ratio come from the workers' last rounds;
    time since the last run from its timestamp."""
    snap = build_snapshot(
        now_ms=NOW,
        partitions=[],
        last_runs=[stats(1000, 400, 0.25, 2500), stats(3000, 600, 0.75, 1200)],
        last_run_ms=NOW - 700,
        dead_workers=1,
    )
    assert snap.kafka_max_clean_time_secs == 2
    assert snap.kafka_max_buffer_utilization_percent == 75
    assert snap.kafka_cleaner_recopy_percent == 25
    assert snap.kafka_time_since_last_run_ms == 700
    assert snap.dead_workers == 1
    empty = build_snapshot(now_ms=NOW, partitions=[])
    assert (empty.recopy_ratio, empty.kafka_time_since_last_run_ms) == (0.0, 0)


def test_scenario_43_worker_gauges_are_maxima_and_zero_without_runs() -> None:
    """Kafka scenario 43: with no rounds the buffer, clean-time and delay gauges read 0;
    with three workers they are the maxima of the last rounds (0.75/0.85/0.65 => 85, a
    0.9 round => 90, all 0.5 => 50; 1/2/3 s => 3, a 4 s round => 4, all 1.5 s => 1)."""
    none = build_snapshot(now_ms=NOW, partitions=[])
    assert none.kafka_max_buffer_utilization_percent == 0
    assert none.kafka_max_clean_time_secs == 0
    assert none.max_compaction_delay_ms == 0

    def gauges(utils: list[float], secs: list[float]) -> tuple[int, int]:
        runs = [stats(1, 1, u, int(t * 1000)) for u, t in zip(utils, secs, strict=True)]
        snap = build_snapshot(now_ms=NOW, partitions=[], last_runs=runs)
        return snap.kafka_max_buffer_utilization_percent, snap.kafka_max_clean_time_secs

    assert gauges([0.75, 0.85, 0.65], [1, 2, 3]) == (85, 3)
    assert gauges([0.75, 0.9, 0.65], [1, 4, 3]) == (90, 4)
    assert gauges([0.5, 0.5, 0.5], [1.5, 1.5, 1.5]) == (50, 1)


def test_counters_and_devices() -> None:
    """Rolls and deletions are counted by reason (a dry run counts nothing); devices
    report usage and threshold as ratios."""
    counters = MaintenanceCounters()
    counters.count_roll(RollDecision(0, RollReason.MAX_COMPACTION_LAG_MS, 5))
    counters.count_retention(
        RetentionOutcome(
            "/a", "t", 0, (Deletion(0, 100, DeletionReason.RETENTION_MS),), None, 10, None, ()
        )
    )
    tp = TopicPartition("t", 0)
    deletion = DiskDeletion(tp, "/a", 10, 50, 60, 1, 20)
    report = DiskUsageReport(False, (), (), (deletion, deletion), (), ())
    counters.count_disk_usage(report)
    counters.count_disk_usage(DiskUsageReport(True, (), (), (deletion,), (), ()))
    usage = DeviceUsage(1, 1000, 250, 80)
    snap = build_snapshot(
        now_ms=NOW,
        partitions=[],
        devices=[usage],
        device_log_dirs={1: ["/a"]},
        counters=counters.snapshot(),
    )
    assert dict(snap.counters.segments_rolled) == {"max.compaction.lag.ms": 1}
    assert dict(snap.counters.segments_deleted) == {"retention.ms": 1, "disk.usage": 2}
    assert dict(snap.counters.bytes_deleted) == {"retention.ms": 100, "disk.usage": 100}
    (device,) = snap.devices
    assert (device.usage_ratio, device.threshold_ratio, device.log_dirs) == (0.25, 0.8, ("/a",))


@settings(max_examples=200, deadline=None)
@given(
    partitions=st.lists(
        st.tuples(
            st.sampled_from(["/a", "/b"]),
            st.lists(st.integers(-120, 30), min_size=1, max_size=3),  # first_ts, minutes
            st.one_of(st.none(), st.integers(1, 90)),  # max.compaction.lag.ms, minutes
            st.one_of(st.none(), st.integers(-60, 60)),  # retention due, minutes from NOW
        ),
        max_size=6,
    ),
    later=st.integers(0, 180),
)
def test_an_aged_snapshot_is_the_one_built_later(
    partitions: list[tuple[str, list[int], int | None, int | None]], later: int
) -> None:
    """Ageing a snapshot (what the daemon does between cycles, in O(log dirs) for the
    maxima) gives what building it anew from the same states aged to the later time
    gives (`Reporter.snapshot`):
    the delays and overdue times of every partition, every log dir and overall, and
    `ageing_from_ms` says when that starts to differ from the snapshot as it is."""
    states = []
    for n, (log_dir, firsts, lag, due) in enumerate(partitions):
        m = meta(f"t{n}", log_dir, sorted(NOW + f * MIN for f in firsts))
        s = PartitionState(m) if lag is None else state(m, lag=lag * MIN)
        retention_due = None if due is None else NOW + due * MIN
        states.append(replace(s, retention_due_ms=retention_due))
    dirs = ["/a", "/b"]
    snap = build_snapshot(now_ms=NOW, partitions=states, log_dirs=dirs)
    then = NOW + later * MIN
    built = build_snapshot(now_ms=then, partitions=[s.aged(then) for s in states], log_dirs=dirs)
    assert snap.aged(then) == built
    assert snap.aged(then, partitions=False) == replace(built, partitions=snap.partitions)
    ageing = snap.ageing_from_ms
    if ageing is None or then < ageing:
        assert replace(built, now_ms=NOW) == snap
