"""Tests of cleanerd.compaction.manager: the state machine, candidates, selection order,
forced passes, retention holds and the uncleanable registry."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from cleanerd.compaction import manager
from cleanerd.compaction.cleanable import (
    CleanableRange,
    EligibilityReason,
    LogToClean,
    UncleanableBound,
)
from cleanerd.compaction.manager import (
    CleanerStateError,
    CleaningState,
    CompactedLog,
    LogCleanerManager,
    UncleanablePartitions,
    order_for_cleaning,
    priority_key,
    select_next,
)
from cleanerd.config import BrokerConfig
from cleanerd.log.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
)
from cleanerd.log.files import TopicPartition
from cleanerd.log.log_dir import LogDir
from cleanerd.log.topic_config import TopicConfig
from tests.builders import build_log, kv

A = TopicPartition("a", 0)
B = TopicPartition("b", 1)


def test_mark_reason_and_backoff() -> None:
    """A mark holds its reason until the backoff has passed."""
    r = UncleanablePartitions(backoff_ms=1000)
    r.mark(A, log_dir="/d", reason="CorruptRecordError: bad", now_ms=0)
    assert r.is_uncleanable(A, now_ms=999)
    assert r.reason(A) == "CorruptRecordError: bad"
    assert not r.is_uncleanable(A, now_ms=1000)
    assert r.reason(A) is None
    assert not r.is_uncleanable(B, now_ms=0)


def test_config_change_clears_mark() -> None:
    """A mark made under another config fingerprint no longer applies."""
    r = UncleanablePartitions()
    r.mark(A, log_dir="/d", reason="x", now_ms=0, config_fingerprint="v1")
    assert r.is_uncleanable(A, now_ms=1, config_fingerprint="v1")
    assert not r.is_uncleanable(A, now_ms=1, config_fingerprint="v2")
    assert len(r) == 0


def test_per_dir_view_and_vanished_partitions() -> None:
    """Marks are listed per log dir; vanished partitions are dropped."""
    r = UncleanablePartitions()
    r.mark(A, log_dir="/d1", reason="x", now_ms=0)
    r.mark(B, log_dir="/d2", reason="y", now_ms=0)
    assert set(r.in_dir("/d1")) == {A}
    r.retain_only([B])
    assert len(r) == 1
    r.clear(B)
    assert len(r) == 0


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


NOW = 1_700_000_000_000
LONG_MAX = 2**63 - 1


def topic(**overrides: Any) -> TopicConfig:
    base = dataclasses.replace(
        BrokerConfig().topic_defaults(),
        cleanup_policy=("compact",),
        min_cleanable_dirty_ratio=0.05,
        max_compaction_lag_ms=LONG_MAX,
    )
    return dataclasses.replace(base, **overrides)


def kafka_log(log_dir: Path, state: Path, tp: TopicPartition, records: int) -> None:
    """Kafka's LogCleanerManagerTest log: one record per batch, a roll after batch 0 and
    then every 5 batches, and a final roll (an empty active segment)."""
    batches = [[kv(f"k{i}", f"v{i}")] for i in range(records)]
    segments = [batches[:1]] + [batches[i : i + 5] for i in range(1, records, 5)] + [[]]
    build_log(log_dir, segments, state_dir=state, tp=tp)


@dataclasses.dataclass
class Dir:
    log_dir: LogDir
    manager: LogCleanerManager

    def item(self, tp: TopicPartition, t: TopicConfig | None = None) -> CompactedLog:
        return CompactedLog(self.log_dir, self.log_dir.open_partition(tp), t or topic())

    def items(self, *tps: TopicPartition) -> list[CompactedLog]:
        return [self.item(tp) for tp in tps]

    def checkpoint_file(self) -> dict[TopicPartition, int]:
        return OffsetCheckpointFile(self.log_dir.path / CLEANER_OFFSET_CHECKPOINT).read()


@pytest.fixture(name="make_dir")
def _make_dir(tmp_path: Path) -> Iterator[Any]:
    opened: list[LogDir] = []

    def make(
        logs: dict[TopicPartition, int],
        *,
        checkpoints: dict[TopicPartition, int] | None = None,
        starts: dict[TopicPartition, int] | None = None,
        name: str = "logs",
        single_segment: TopicPartition | None = None,
    ) -> Dir:
        path, state = tmp_path / name, tmp_path / "state"
        for tp, records in logs.items():
            kafka_log(path, state, tp, records)
        if single_segment is not None:
            batches = [[kv(f"k{i}", "v")] for i in range(9)]
            build_log(path, [batches], state_dir=state, tp=single_segment)
        if checkpoints is not None:
            OffsetCheckpointFile(path / CLEANER_OFFSET_CHECKPOINT).write(checkpoints)
        if starts is not None:
            OffsetCheckpointFile(path / LOG_START_OFFSET_CHECKPOINT).write(starts)
        log_dir = LogDir.open(path, state_dir=state)
        opened.append(log_dir)
        return Dir(log_dir, LogCleanerManager())

    yield make
    for d in opened:
        d.close()


A, B, C = TopicPartition("a", 0), TopicPartition("b", 0), TopicPartition("c", 0)
D = TopicPartition("d", 0)


def test_dirtiest_wins_and_busy_or_uncleanable_logs_are_passed_over(make_dir: Any) -> None:
    """Scenario 45: 20/25/30-record logs checkpointed at 20: the 30-record log first;
    uncleanable or in-progress ones are skipped; the 20-record log is never eligible."""
    d = make_dir({A: 20, B: 25, C: 30}, checkpoints={A: 20, B: 20, C: 20})
    items = d.items(A, B, C)
    m = d.manager
    m.refresh(items, NOW)
    assert m.candidates[A].eligible is None
    picked = m.grab_next(NOW)
    assert picked is not None
    assert picked.tp == C
    assert m.state(C) is CleaningState.IN_PROGRESS
    m.done_cleaning(C)

    m.refresh(items, NOW)
    m.mark_uncleanable(items[2], "corrupt", NOW)
    assert (picked := m.grab_next(NOW)) is not None
    assert picked.tp == B

    m2 = LogCleanerManager()
    m2.refresh(items, NOW)
    assert m2.begin_deleting([(C, topic())], NOW) == [C]  # C in progress instead
    assert (picked := m2.grab_next(NOW)) is not None
    assert picked.tp == B
    m2.done_cleaning(B)
    m2.refresh(items, NOW)
    m2.mark_uncleanable(items[1], "corrupt", NOW)  # C in progress, B uncleanable
    assert m2.grab_next(NOW) is None


def test_a_partition_is_never_handed_out_twice(make_dir: Any) -> None:
    """Once picked, a log is not picked again until done_cleaning, even after a refresh."""
    d = make_dir({C: 30}, checkpoints={C: 20})
    items = d.items(C)
    m = d.manager
    m.refresh(items, NOW)
    assert m.grab_next(NOW) is not None
    m.refresh(items, NOW)
    assert m.grab_next(NOW) is None
    m.done_cleaning(C)
    m.refresh(items, NOW)
    assert m.grab_next(NOW) is not None


def test_checkpoint_above_the_log_end_resets_and_is_rewritten(make_dir: Any) -> None:
    """Scenario 46: a checkpoint of 200 past the log end: chosen from 0, and the file now
    says 0; with start offset 10 and checkpoint 0, the first dirty offset is 10."""
    d = make_dir({A: 30, B: 30}, checkpoints={A: 200, B: 0}, starts={B: 10})
    m = d.manager
    candidates = {c.tp: c for c in m.refresh(d.items(A, B), NOW)}
    assert candidates[A].ltc.first_dirty == 0
    assert candidates[B].ltc.first_dirty == 10
    assert d.checkpoint_file() == {A: 0, B: 10}


def test_invalid_checkpoints_are_persisted_even_without_cleaning(make_dir: Any) -> None:
    """Scenario 53: start offset 20 = log end, checkpoint 15: nothing is chosen and the
    checkpoint becomes 20; of two logs (start 15 / checkpoint 10, and checkpoint 5) the
    second is chosen and the first's checkpoint becomes 15."""
    d = make_dir({A: 20}, checkpoints={A: 15}, starts={A: 20})
    m = d.manager
    m.refresh(d.items(A), NOW)
    assert m.grab_next(NOW) is None
    assert d.checkpoint_file() == {A: 20}


def test_reset_of_one_log_while_another_is_chosen(make_dir: Any) -> None:
    """Scenario 53, two logs: the valid one is chosen, the other's checkpoint is rewritten."""
    d = make_dir({A: 30, B: 30}, checkpoints={A: 10, B: 5}, starts={A: 15})
    m = d.manager
    m.refresh(d.items(A, B), NOW)
    picked = m.grab_next(NOW)
    assert picked is not None
    assert picked.tp == B
    assert d.checkpoint_file() == {A: 15, B: 5}


def test_only_an_active_segment_is_never_chosen(make_dir: Any) -> None:
    """Scenario 47: 9 records in one segment, start offset 2 and checkpoint 0, or
    checkpoint 3 and no start offset change: nothing is chosen."""
    for name, checkpoints, starts in (("one", {A: 0}, {A: 2}), ("two", {A: 3}, None)):
        d = make_dir({}, checkpoints=checkpoints, starts=starts, name=name, single_segment=A)
        d.manager.refresh(d.items(A), NOW)
        assert d.manager.grab_next(NOW) is None


def test_which_logs_get_cleaner_driven_retention(make_dir: Any) -> None:
    """Scenario 48, the manager's part: retention is granted to compacted logs unless
    uncleanable, and never to a log a pass holds."""
    d = make_dir({A: 30, B: 30, C: 30})
    m = d.manager
    compact_delete = topic(cleanup_policy=("compact", "delete"))
    item_c = d.item(C)
    m.mark_uncleanable(item_c, "corrupt", NOW)
    assert m.begin_deleting([(A, compact_delete), (B, topic()), (C, topic())], NOW) == [A, B]
    assert m.begin_deleting([(A, topic())], NOW) == []  # already held
    m.done_deleting(A)
    m.done_deleting(B)
    m.refresh(d.items(A), NOW)
    assert m.grab_next(NOW) is not None
    assert m.begin_deleting([(A, topic())], NOW) == []  # being cleaned


def test_retention_hold_blocks_grab_and_releases(make_dir: Any) -> None:
    """While retention holds a log it cannot be picked; afterwards it can."""
    d = make_dir({A: 30})
    m = d.manager
    m.refresh(d.items(A), NOW)
    with m.retention_hold([(A, topic())], NOW) as granted:
        assert granted == [A]
        assert m.grab_next(NOW) is None
    assert m.state(A) is None
    assert m.grab_next(NOW) is not None


def test_state_transitions() -> None:
    """Scenario 51: pause/abort/resume counting, and the done_* rules."""
    m = LogCleanerManager()
    m.pause(A)  # a retention pause
    assert not m.abort_and_pause(A)
    assert m.paused_count(A) == 2
    m.resume(A)
    m.resume(A)
    assert m.state(A) is None
    with pytest.raises(CleanerStateError):
        m.resume(A)

    for done in (m.done_cleaning, m.done_deleting):
        with pytest.raises(CleanerStateError):
            done(A)  # no state
        m.pause(A)
        with pytest.raises(CleanerStateError):
            done(A)  # paused
        m.resume(A)
        assert m.begin_deleting([(A, topic())], NOW) == [A]  # IN_PROGRESS
        done(A)
        assert m.state(A) is None
        m.begin_deleting([(A, topic())], NOW)
        assert m.abort_and_pause(A)
        assert m.state(A) is CleaningState.ABORTED
        done(A)
        assert m.state(A) is CleaningState.PAUSED
        assert m.paused_count(A) == 1
        m.resume(A)
        assert m.state(A) is None
    m.begin_deleting([(A, topic())], NOW)
    with pytest.raises(CleanerStateError):
        m.pause(A)  # in progress cannot be paused without an abort


def test_failure_while_evaluating_marks_only_that_log(make_dir: Any) -> None:
    """Scenario 54: a log whose candidate cannot be computed (its segments cannot be
    read) is marked uncleanable with the reason; the other log is still chosen. One
    whose dir vanished (its topic deleted meanwhile) met its deletion: no candidate, no
    mark."""
    d = make_dir({A: 30, B: 30, C: 30})
    items = d.items(A, B, C)
    for tp in (A, C):
        for f in (d.log_dir.path / str(tp)).iterdir():
            f.unlink()
    (d.log_dir.path / str(C)).rmdir()
    m = d.manager
    candidates = m.refresh(items, NOW)
    assert [c.tp for c in candidates] == [B]
    assert m.registry.reason(A) is not None
    assert m.registry.reason(C) is None
    picked = m.grab_next(NOW)
    assert picked is not None
    assert picked.tp == B


def test_forced_logs_go_first_whatever_their_ratio(make_dir: Any) -> None:
    """A forced log below its ratio is picked before the dirtiest, once, as `requested`."""
    d = make_dir({A: 21, C: 30}, checkpoints={A: 16, C: 20})
    items = [d.item(A, topic(min_cleanable_dirty_ratio=0.99)), d.item(C)]
    m = d.manager
    m.refresh(items, NOW)
    assert m.candidates[A].eligible is None
    m.force(A)
    assert m.forced == (A,)
    picked = m.grab_next(NOW)
    assert picked is not None
    assert (picked.tp, picked.eligible) == (A, EligibilityReason.REQUESTED)
    assert m.forced == ()
    assert (picked := m.grab_next(NOW)) is not None
    assert picked.tp == C
    m.done_cleaning(A)
    m.done_cleaning(C)
    m.refresh(items, NOW)
    assert m.grab_next(NOW) is not None  # C is still the dirtiest: the force is spent
    assert m.grab_next(NOW) is None


def _raise_eio() -> None:
    raise OSError(5, "Input/output error")


def test_a_forced_log_with_nothing_to_clean_is_dropped(
    make_dir: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forcing a log with no cleanable bytes, one that does not exist, one marked
    uncleanable or one that cannot be read does nothing, and each drop is handed on
    once, with why and the ids of the requests (an unreadable one was "no such
    partition")."""
    d = make_dir({A: 20, C: 30, D: 30}, checkpoints={A: 20, C: 20, D: 20})
    m = d.manager
    m.force(A, "a1")
    m.force(A, "a2")
    m.force(B)
    m.force(C, "c")
    m.mark_uncleanable(d.item(C), "corrupt record batch", NOW)
    sick = d.item(D)
    monkeypatch.setattr(sick.plog, "meta", _raise_eio)
    m.force(D, "d")
    m.refresh([d.item(A), d.item(C), sick], NOW)
    assert m.forced == ()
    assert m.grab_next(NOW) is None
    dropped = {r.tp: (r.reason, r.request_ids, r.log_dir) for r in m.take_dropped()}
    assert dropped == {
        A: ("nothing to clean", ("a1", "a2"), str(d.log_dir.path)),
        B: ("no such partition", (), None),
        C: ("marked uncleanable: corrupt record batch", ("c",), str(d.log_dir.path)),
        D: ("unreadable: [Errno 5] Input/output error", ("d",), None),
    }
    assert m.take_dropped() == ()


def test_a_force_waits_while_the_log_is_busy(make_dir: Any) -> None:
    """A log forced while retention holds it is picked once it is free."""
    d = make_dir({A: 21}, checkpoints={A: 16})
    items = [d.item(A, topic(min_cleanable_dirty_ratio=0.99))]
    m = d.manager
    m.refresh(items, NOW)
    with m.retention_hold([(A, topic())], NOW):
        m.force(A)
        m.refresh(items, NOW)
        assert m.grab_next(NOW) is None
        assert m.forced == (A,)
    m.refresh(items, NOW)
    assert (picked := m.grab_next(NOW)) is not None
    assert picked.eligible is EligibilityReason.REQUESTED


def test_partition_log_lines_carry_topic_partition_and_log_dir(make_dir: Any) -> None:
    """`cleaner_checkpoint.reset` and `partition.uncleanable` name the partition in
    three fields: topic, partition (an int) and log_dir."""
    d = make_dir({A: 30}, checkpoints={A: 200})
    items = d.items(A)
    with capture_logs() as logs:
        d.manager.refresh(items, NOW)
        d.manager.mark_uncleanable(items[0], "corrupt", NOW)
    lines = {e["event"]: e for e in logs}
    for event in ("cleaner_checkpoint.reset", "partition.uncleanable"):
        line = lines[event]
        assert (line["topic"], line["partition"]) == ("a", 0), event
        assert line["log_dir"] == str(d.log_dir.path)


def _refreshed(
    make_dir: Any, ends: dict[str, int]
) -> tuple[LogCleanerManager, dict[TopicPartition, CompactedLog], list[TopicPartition]]:
    """Partitions `<topic>-0` ending at `ends[topic]`, checkpointed at 21, refreshed once:
    the manager, the logs and the eligible ones in cleaning order."""
    tps = [TopicPartition(topic, 0) for topic in ends]
    d = make_dir({tp: ends[tp.topic] for tp in tps}, checkpoints=dict.fromkeys(tps, 21))
    items = {tp: d.item(tp) for tp in tps}
    candidates = d.manager.refresh(list(items.values()), NOW)
    ltcs = [c.ltc for c in candidates if c.eligible is not None]
    return d.manager, items, [ltc.topic_partition for ltc in order_for_cleaning(ltcs, NOW)]


def test_a_pass_ending_does_not_sort_every_candidate_again(
    make_dir: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After each pass, `refresh_one` recomputes that log's candidate; the next pick
    then sorted every candidate left again, so n passes over a dir of n compacted
    partitions cost O(n^2 log n) (at 4,000 partitions, 6% of the cycle). A recomputed
    candidate now goes into the sorted order where it belongs (a binary search), and the
    picks still follow the order."""
    m, items, expected = _refreshed(make_dir, {f"t{i:02d}": 26 + i for i in range(40)})
    assert len(expected) == 40
    keys = [0]
    counted = manager.priority_key

    def counting(*args: Any) -> Any:
        keys[0] += 1
        return counted(*args)

    monkeypatch.setattr(manager, "priority_key", counting)
    picks = []
    first = m.grab_next(NOW)
    assert first is not None
    picks.append(first.tp)
    sorted_once = keys[0]
    assert sorted_once == 40
    m.done_cleaning(first.tp)
    # Nothing was cleaned, so the first is still the most urgent: it goes in at the head.
    assert m.refresh_one(items[first.tp], NOW) is not None
    assert m.refresh_one(items[expected[-1]], NOW) is not None  # a new candidate object
    while (picked := m.grab_next(NOW)) is not None:
        picks.append(picked.tp)
    assert keys[0] - sorted_once <= 2 * 10  # two binary searches, no sort
    assert picks == [expected[0], *expected]


def test_grabs_follow_the_cleaning_order_around_busy_and_uncleanable_logs(
    make_dir: Any,
) -> None:
    """Picking every log one by one follows `select_next` over what is left: the order is
    sorted once per refresh, a busy log at its head is passed over and still picked once
    free, a log marked uncleanable after the refresh is skipped, a recomputed candidate
    (refresh_one) takes its new place, and time passing between picks changes nothing."""
    m, items, expected = _refreshed(make_dir, {f"t{i}": 26 + 5 * i for i in range(7)})
    assert len(expected) == 7
    first, second, third = expected[:3]
    assert m.begin_deleting([(first, topic())], NOW) == [first]  # busy: retention holds it
    m.mark_uncleanable(items[third], "corrupt", NOW)
    picks = []
    for step in range(3):
        picked = m.grab_next(NOW + step * 60_000)
        assert picked is not None
        picks.append(picked.tp)
    m.done_deleting(first)
    assert m.refresh_one(items[expected[6]], NOW) is not None  # a new candidate object
    while (picked := m.grab_next(NOW + 10 * 60_000)) is not None:
        picks.append(picked.tp)
    assert picks == [second, expected[3], expected[4], first, expected[5], expected[6]]
    assert third not in picks
