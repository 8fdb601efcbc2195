"""Tests of cleanerd.log.roller: clock-driven rolls of real partitions and the first-seen
registry that survives restarts."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from cleanerd.config import BrokerConfig
from cleanerd.log.files import TopicPartition
from cleanerd.log.meta import SegmentMeta
from cleanerd.log.partition_log import LogConfig, PartitionLog
from cleanerd.log.roll import RollReason, SegmentAge, segment_jitter, segment_jitter_seed
from cleanerd.log.roller import (
    FirstSeen,
    SeenSegment,
    first_seen_path,
    maybe_roll,
    roll_decision,
)
from cleanerd.log.topic_config import TopicConfig
from tests.builders import build_log, kv, partition_flocks, settle_dir

T0 = 1_700_000_000_000
MINUTE = 60_000
HOUR = 60 * MINUTE
TP = TopicPartition("topic", 0)


def topic(**overrides: Any) -> TopicConfig:
    """Broker defaults with `overrides` (a compacted topic with a one-hour max lag)."""
    base = dataclasses.replace(
        BrokerConfig().topic_defaults(), cleanup_policy=("compact",), max_compaction_lag_ms=HOUR
    )
    return dataclasses.replace(base, **overrides)


def one_batch_log(tmp_path: Path, *, ts: int = T0, config: LogConfig | None = None) -> PartitionLog:
    return build_log(
        tmp_path / "logs",
        [[[kv("k", "v", timestamp=ts)]]],
        state_dir=tmp_path / "state",
        config=config,
    )


def active_meta(base: int = 0, *, mtime: int = T0) -> SegmentMeta:
    return SegmentMeta(base, base + 1, 70, T0, T0, 0, 0, mtime)


def test_idle_partition_rolls_by_clock(tmp_path: Path) -> None:
    """With no append at all, the active segment rolls once max.compaction.lag.ms has passed
    since its first batch, and not a millisecond before."""
    plog = one_batch_log(tmp_path)
    seen = FirstSeen(None, plog.log_dir)
    assert maybe_roll(plog, topic(), seen, now_ms=T0) is None
    assert maybe_roll(plog, topic(), seen, now_ms=T0 + HOUR - 1) is None
    with capture_logs() as logs:
        decision = maybe_roll(plog, topic(), seen, now_ms=T0 + HOUR)
    assert decision is not None
    assert decision.reason is RollReason.MAX_COMPACTION_LAG_MS
    rolled = [e for e in logs if e["event"] == "segment.rolled"]
    assert [e["reason"] for e in rolled] == ["max.compaction.lag.ms"]
    # The segment rolled, as the event and the reports name it, then the new one's base.
    assert [(e["base_offset"], e["next_offset"]) for e in rolled] == [(0, 1)]
    # One line a roll, with how long the rule waited (a `segment.roll_due` line before
    # it said that, two info lines a roll where the README promises one).
    assert [e["waited_ms"] for e in rolled] == [HOUR]
    assert [e["event"] for e in logs if e["log_level"] == "info"] == ["segment.rolled"]
    assert decision.waited_ms == HOUR
    assert [s.base_offset for s in plog.segments] == [0, 1]
    assert plog.segments[-1].size == 0


def test_segment_ms_rolls_delete_topics(tmp_path: Path) -> None:
    """A delete-only topic rolls by segment.ms, whatever its max lag."""
    plog = one_batch_log(tmp_path)
    seen = FirstSeen(None, plog.log_dir)
    cfg = topic(cleanup_policy=("delete",), segment_ms=2 * HOUR)
    assert maybe_roll(plog, cfg, seen, now_ms=T0) is None
    assert maybe_roll(plog, cfg, seen, now_ms=T0 + HOUR) is None
    with capture_logs() as logs:
        decision = maybe_roll(plog, cfg, seen, now_ms=T0 + 2 * HOUR)
    assert decision is not None
    assert decision.reason is RollReason.SEGMENT_MS
    rolled = [e for e in logs if e["event"] == "segment.rolled"]
    assert [e["reason"] for e in rolled] == ["segment.ms"]


def test_future_timestamp_is_clamped_to_first_sighting(tmp_path: Path) -> None:
    """A first batch stamped a year ahead rolls one max lag after cleanerd first saw it."""
    plog = one_batch_log(tmp_path, ts=T0 + 365 * 24 * HOUR)
    seen = FirstSeen(None, plog.log_dir)
    assert maybe_roll(plog, topic(), seen, now_ms=T0) is None
    decision = maybe_roll(plog, topic(), seen, now_ms=T0 + HOUR)
    assert decision is not None
    assert decision.waited_ms == HOUR


def test_empty_active_segment_never_rolls(tmp_path: Path) -> None:
    """An empty active segment stays, however old it is."""
    plog = build_log(tmp_path / "logs", [[]], state_dir=tmp_path / "state")
    seen = FirstSeen(None, plog.log_dir)
    assert maybe_roll(plog, topic(), seen, now_ms=T0) is None
    assert maybe_roll(plog, topic(), seen, now_ms=T0 + 1000 * HOUR) is None
    assert len(plog.segments) == 1


def test_full_segment_rolls_by_size(tmp_path: Path) -> None:
    """An active segment holding segment.bytes rolls at once, with the size reason."""
    plog = one_batch_log(tmp_path)
    seen = FirstSeen(None, plog.log_dir)
    decision = maybe_roll(plog, topic(segment_bytes=plog.active_segment.size), seen, now_ms=T0)
    assert decision is not None
    assert decision.reason is RollReason.SEGMENT_BYTES
    assert len(plog.segments) == 2


def rolled_at(plog: PartitionLog, ms: int) -> None:
    """Date the segment before the active one as written at `ms` (the test's clock): the
    roll that created the active segment happened then, as its files show."""
    previous = plog.segments[-2]
    for path in previous.paths:
        if path.exists():
            os.utime(path, ns=(ms * 1_000_000, ms * 1_000_000))


def test_minimum_roll_interval_counts_from_the_last_roll(tmp_path: Path) -> None:
    """Old producer timestamps roll a lone segment at once (one roll cannot become a roll
    per batch), but the segment that roll started waits the minimum interval after it,
    read from the files (the previous segment's mtime): the same in a fresh process."""
    plog = one_batch_log(tmp_path, ts=T0 - 100 * HOUR)
    cfg = topic(max_compaction_lag_ms=HOUR)
    interval = 15 * MINUTE
    fresh = FirstSeen(None, plog.log_dir)
    assert maybe_roll(plog, cfg, fresh, now_ms=T0, min_roll_interval_ms=interval)
    rolled_at(plog, T0)
    plog.append([kv("k", "w", timestamp=T0 - 99 * HOUR)])
    for _ in range(2):  # a second, new process decides alike
        seen = FirstSeen(None, plog.log_dir)
        now = T0 + interval - 1
        assert maybe_roll(plog, cfg, seen, now_ms=now, min_roll_interval_ms=interval) is None
    decision = maybe_roll(plog, cfg, seen, now_ms=T0 + interval, min_roll_interval_ms=interval)
    assert decision is not None
    assert decision.reason is RollReason.MAX_COMPACTION_LAG_MS


def test_segment_counts_as_seen_from_its_first_batch(tmp_path: Path) -> None:
    """A rolled, empty segment is not recorded; it counts as seen once it holds a batch, so
    time spent empty never makes it roll early."""
    plog = one_batch_log(tmp_path)
    seen = FirstSeen(None, plog.log_dir)
    seen.observe(TP, plog.active_segment.meta(), T0)
    assert maybe_roll(plog, topic(), seen, now_ms=T0 + HOUR) is not None
    rolled_at(plog, T0 + HOUR)
    assert maybe_roll(plog, topic(), seen, now_ms=T0 + 5 * HOUR) is None
    assert seen.get(TP) == SeenSegment(0, T0)
    plog.append([kv("k", "w", timestamp=T0 + 5 * HOUR)])
    assert maybe_roll(plog, topic(), seen, now_ms=T0 + 5 * HOUR + 1) is None
    assert seen.get(TP) == SeenSegment(1, T0 + 5 * HOUR + 1)
    assert maybe_roll(plog, topic(), seen, now_ms=T0 + 6 * HOUR - 1) is None
    assert maybe_roll(plog, topic(), seen, now_ms=T0 + 6 * HOUR) is not None


def test_read_only_and_metadata_logs_never_roll(tmp_path: Path) -> None:
    """Observe-mode partitions and __cluster_metadata are never rolled."""
    plog = one_batch_log(tmp_path)
    ro = PartitionLog.open(plog.dir, read_only=True, state_dir=tmp_path / "state")
    seen = FirstSeen(None, plog.log_dir)
    assert maybe_roll(ro, topic(), seen, now_ms=T0 + 100 * HOUR) is None
    meta_tp = TopicPartition("__cluster_metadata", 0)
    assert (
        roll_decision(
            meta_tp, active_meta(), topic(), now_ms=T0 + 100 * HOUR, age=SegmentAge(T0, T0)
        )
        is None
    )
    assert len(PartitionLog.open(plog.dir, read_only=True).segments) == 1


def test_jitter_rolls_early_and_is_stable() -> None:
    """Jitter moves a segment's roll earlier by a per-segment amount below
    segment.jitter.ms, drawn from its identity, so every evaluation agrees."""
    cfg = topic(cleanup_policy=("delete",), segment_ms=HOUR, segment_jitter_ms=30 * MINUTE)
    jitters = []
    for base in (0, 7):
        jitter = segment_jitter(HOUR, 30 * MINUTE, segment_jitter_seed("topic", 0, base))
        assert 0 <= jitter < 30 * MINUTE
        due = T0 + HOUR - jitter
        seg = active_meta(base)
        assert roll_decision(TP, seg, cfg, now_ms=due - 1, age=SegmentAge(T0, T0)) is None
        assert roll_decision(TP, seg, cfg, now_ms=due, age=SegmentAge(T0, T0)) is not None
        jitters.append(jitter)
    assert jitters[0] != jitters[1]


def test_first_seen_survives_restart(tmp_path: Path) -> None:
    """A saved registry gives the same first-seen time to the next process."""
    state, log_dir = tmp_path / "state", tmp_path / "logs"
    seen = FirstSeen.load(state, log_dir)
    assert seen.observe(TP, active_meta(5, mtime=T0 + HOUR), T0) == T0
    seen.save()
    again = FirstSeen.load(state, log_dir)
    assert again.get(TP) == SeenSegment(5, T0)
    assert again.observe(TP, active_meta(5), T0 + 10 * HOUR) == T0
    assert not again.changed


def test_first_seen_of_unseen_segment_is_its_mtime_when_earlier() -> None:
    """A segment never seen before counts as seen when its file was last written, if that
    is earlier than now; a new active segment replaces the old entry."""
    seen = FirstSeen(None, Path("/logs"))
    assert seen.observe(TP, active_meta(0, mtime=T0 - HOUR), T0) == T0 - HOUR
    assert seen.observe(TP, active_meta(9, mtime=T0 + HOUR), T0 + 5) == T0 + 5
    assert seen.get(TP) == SeenSegment(9, T0 + 5)
    empty = dataclasses.replace(active_meta(11, mtime=T0), next_offset=11, size_bytes=0)
    assert seen.observe(TP, empty, T0 + 6) == T0
    assert seen.get(TP) == SeenSegment(9, T0 + 5)
    assert seen.peek(TP, active_meta(10, mtime=T0), T0 + 9) == T0
    assert seen.get(TP) == SeenSegment(9, T0 + 5)


def test_retain_only_drops_vanished_partitions(tmp_path: Path) -> None:
    """Entries of deleted partitions are dropped and the file rewritten."""
    seen = FirstSeen.load(tmp_path, tmp_path / "logs")
    other = TopicPartition("gone", 3)
    seen.record(TP, 0, T0)
    seen.record(other, 0, T0)
    seen.save()
    seen.retain_only([TP])
    seen.save()
    doc = json.loads(first_seen_path(tmp_path, tmp_path / "logs").read_text())
    assert list(doc["segments"]) == ["topic-0"]


@pytest.mark.parametrize(
    "content", [b"{not json", b'{"version": 7}', b'{"version": 1, "segments": {"t-0": [1]}}']
)
def test_unreadable_registry_is_replaced(tmp_path: Path, content: bytes) -> None:
    """A damaged registry is logged and treated as empty, and the next save repairs it."""
    path = first_seen_path(tmp_path, tmp_path / "logs")
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    seen = FirstSeen.load(tmp_path, tmp_path / "logs")
    assert seen.get(TopicPartition("t", 0)) is None
    seen.save()
    assert json.loads(path.read_text())["segments"] == {}


def test_a_partition_not_due_is_decided_without_the_partition_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not due: decided on the current metadata, no partition lock taken; due: the lock
    is taken, the decision made again under it, and the segment rolled."""
    plog = one_batch_log(tmp_path)
    settle_dir(plog.dir)
    plog.meta()
    taken = partition_flocks(monkeypatch)
    seen = FirstSeen.load(tmp_path / "state", plog.log_dir)
    assert maybe_roll(plog, topic(segment_ms=HOUR), seen, now_ms=T0 + 1) is None
    assert taken == []
    assert maybe_roll(plog, topic(segment_ms=HOUR), seen, now_ms=T0 + 2 * HOUR) is not None
    assert taken == [plog.lock.path]
    assert len(plog.segments) == 2
