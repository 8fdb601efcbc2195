"""`cleanerd plan`: what one maintenance cycle would do at `--now-ms`, and why, per partition.

Nothing is modified: every log dir is opened in observe mode (no `.lock` taken, no
recovery, partitions read-only), the first-seen registry is read but never saved.

A cycle is roll, then retention, then KIP-61 disk usage, then compaction, so the plan
of each partition is computed in that order over simulated snapshots (pure functions
over `PartitionMeta`, no files):

1. **roll** (`roller.roll_decision`): due now, and why (`segment.bytes`, `segment.ms`,
   `max.compaction.lag.ms`); otherwise when it will be due. A due roll is applied to the
   snapshot: the active segment becomes inactive and an empty one follows it;
2. **retention** (`executor.retention_plan`): the segments each rule deletes, the new log
   start offset, a future timestamp that blocks `retention.ms`; applied to the snapshot
   (a plan that would take the active segment rolls it first, as the executor does);
3. **compaction** (compacted topics, `cleanable.log_to_clean`): dirty ratio against
   `min.cleanable.dirty.ratio`, the cleanable range `[first dirty, first uncleanable)`
   and what bounds it (last stable offset, active segment, `min.compaction.lag.ms`), the
   max-lag deadline and how overdue it is (cleanerd's honest delay, and Kafka's), whether
   a delete horizon has passed, and whether it is eligible and in which order the
   workers would take it (`schedule.order_for_cleaning`); a partition found corrupt is
   reported uncleanable;
4. **disk usage**: per device, usage against `log.retention.disk.usage.percent` and the
   segments KIP-61 would delete (`disk_usage.plan_disk_usage_deletions` over the
   post-retention snapshots).

`plan_cycle` is the pure planning core (`bench/plan.py` times it); `run` gathers its
inputs from the log dirs and prints the result as text or `--json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cleanerd.compaction.cleanable import (
    EligibilityReason,
    LogToClean,
    eligibility,
    log_to_clean,
)
from cleanerd.compaction.horizon import HorizonCache, SegmentHorizon, horizon_due
from cleanerd.compaction.manager import order_for_cleaning
from cleanerd.config import Config, load_config
from cleanerd.errors import CleanerdError
from cleanerd.log.files import METADATA_TOPIC, TopicPartition
from cleanerd.log.log_dir import LogDir
from cleanerd.log.meta import PartitionMeta, SegmentMeta
from cleanerd.log.partition_log import LogConfig
from cleanerd.log.roll import DEFAULT_MIN_ROLL_INTERVAL_MS, RollDecision, rolling_timestamp
from cleanerd.log.roller import FirstSeen, roll_decision, time_rule
from cleanerd.log.topic_config import TopicConfig
from cleanerd.retention.disk import device_of, group_devices, measure
from cleanerd.retention.disk_usage import (
    DeviceOutcome,
    DeviceUsage,
    DiskDeletion,
    PartitionOnDevice,
    plan_disk_usage_deletions,
)
from cleanerd.retention.executor import retention_plan
from cleanerd.retention.policy import Deletion, RetentionPlan

ARGS: Final[tuple[tuple[tuple[str, ...], dict[str, Any]], ...]] = (
    (("-c", "--config"), {"type": Path, "metavar": "FILE", "help": "the YAML config file"}),
    (
        ("--now-ms",),
        {
            "type": int,
            "metavar": "T",
            "help": "evaluate every time rule at T (ms since the epoch; default now)",
        },
    ),
    (("--json",), {"action": "store_true", "help": "print one JSON document"}),
)


# ---------------------------------------------------------------------------------------
# The pure planning core


@dataclass(frozen=True, slots=True)
class PlanInput:
    """What planning one partition needs, all plain data."""

    meta: PartitionMeta
    topic: TopicConfig
    checkpoint: int | None
    """The partition's `cleaner-offset-checkpoint` entry."""
    first_seen_ms: int
    """When cleanerd first saw the active segment (`FirstSeen`)."""
    horizons: tuple[SegmentHorizon, ...] = ()
    """Delete horizons of the non-active segments (`HorizonCache`)."""
    uncleanable: str | None = None
    """Why the partition is uncleanable, or None."""


@dataclass(frozen=True, slots=True)
class RollPlan:
    """The active segment's roll: due now, or when."""

    decision: RollDecision | None
    limit_ms: int
    """Kafka's maxSegmentMs for the topic."""
    limit_reason: str
    due_at_ms: int | None
    """When the time rule will roll the segment (None: empty segment, never)."""


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    """The cleaning candidate's numbers and verdict."""

    ltc: LogToClean
    min_cleanable_ratio: float
    eligible: EligibilityReason | None
    horizon_due: bool
    uncleanable: str | None

    @property
    def blocked_by(self) -> tuple[str, ...]:
        """What set the first uncleanable offset (LSO, active segment, min lag)."""
        return tuple(b.value for b in self.ltc.cleanable_range.blocked_by)


@dataclass(frozen=True, slots=True)
class PartitionPlan:
    """What a cycle does to one partition."""

    log_dir: str
    topic: str
    partition: int
    policy: tuple[str, ...]
    roll: RollPlan | None
    """None for `__cluster_metadata` (never rolled)."""
    retention: RetentionPlan
    rolled_for_retention: bool
    """Retention would take every segment: the executor rolls first."""
    compaction: CompactionPlan | None
    """None for topics without `compact`."""
    order: int | None = None
    """Position in the cleaning order (1 first), None when not eligible."""

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class CyclePlan:
    """The whole cycle: partition plans (by log dir, topic, partition) and KIP-61."""

    now_ms: int
    partitions: tuple[PartitionPlan, ...]
    devices: tuple[DeviceUsage, ...]
    disk_outcomes: tuple[DeviceOutcome, ...]
    disk_deletions: tuple[DiskDeletion, ...]


def _empty_segment(base: int, now_ms: int) -> SegmentMeta:
    return SegmentMeta(
        base_offset=base,
        next_offset=base,
        size_bytes=0,
        largest_timestamp_ms=now_ms,
        first_batch_timestamp_ms=None,
        offset_index_bytes=0,
        time_index_bytes=0,
        last_modified_ms=now_ms,
    )


def simulate_roll(meta: PartitionMeta, now_ms: int) -> PartitionMeta:
    """`meta` after a roll: an empty active segment at the log end offset."""
    if meta.active.is_empty:
        return meta
    segments = (*meta.segments, _empty_segment(meta.log_end_offset, now_ms))
    return dataclasses.replace(meta, segments=segments)


def simulate_deletions(meta: PartitionMeta, plan: RetentionPlan) -> PartitionMeta:
    """`meta` after the plan's deletions (always a prefix of the segments)."""
    if not plan.deletions:
        return meta
    gone = len(plan.deletions)
    return dataclasses.replace(
        meta, segments=meta.segments[gone:], log_start_offset=plan.log_start_offset
    )


def roll_plan(
    tp: TopicPartition,
    active: SegmentMeta,
    topic: TopicConfig,
    *,
    now_ms: int,
    first_seen_ms: int,
    min_roll_interval_ms: int = DEFAULT_MIN_ROLL_INTERVAL_MS,
) -> RollPlan:
    """The roll decision at `now_ms` and, by the time rule, when it falls due."""
    limit, jitter = time_rule(tp, active.base_offset, topic)
    decision = roll_decision(
        tp,
        active,
        topic,
        now_ms=now_ms,
        first_seen_ms=first_seen_ms,
        min_roll_interval_ms=min_roll_interval_ms,
    )
    due_at = None
    if not active.is_empty:
        due_at = max(
            rolling_timestamp(active, first_seen_ms) + limit.ms - jitter,
            first_seen_ms + min(min_roll_interval_ms, limit.ms),
        )
    return RollPlan(decision, limit.ms, limit.reason.value, due_at)


def plan_partition(
    inp: PlanInput, *, now_ms: int, min_roll_interval_ms: int = DEFAULT_MIN_ROLL_INTERVAL_MS
) -> tuple[PartitionPlan, PartitionMeta]:
    """The plan of one partition, and its snapshot after the cycle's roll and retention
    (the input of KIP-61 planning)."""
    meta, topic = inp.meta, inp.topic
    if meta.never_touched:
        nothing = RetentionPlan((), meta.log_start_offset, False, None)
        return _partition_plan(inp, None, nothing, rolled=False, compaction=None), meta
    roll = roll_plan(
        meta.topic_partition,
        meta.active,
        topic,
        now_ms=now_ms,
        first_seen_ms=inp.first_seen_ms,
        min_roll_interval_ms=min_roll_interval_ms,
    )
    current = simulate_roll(meta, now_ms) if roll.decision is not None else meta
    retention = retention_plan(current, topic, now_ms=now_ms)
    rolled = retention.roll_needed
    if rolled:
        current = simulate_roll(current, now_ms)
        retention = retention_plan(current, topic, now_ms=now_ms)
    current = simulate_deletions(current, retention)
    compaction = _compaction_plan(inp, current, now_ms=now_ms) if topic.compact else None
    return _partition_plan(inp, roll, retention, rolled=rolled, compaction=compaction), current


def _partition_plan(
    inp: PlanInput,
    roll: RollPlan | None,
    retention: RetentionPlan,
    *,
    rolled: bool,
    compaction: CompactionPlan | None,
) -> PartitionPlan:
    return PartitionPlan(
        log_dir=inp.meta.log_dir,
        topic=inp.meta.topic,
        partition=inp.meta.partition,
        policy=inp.topic.cleanup_policy,
        roll=roll,
        retention=retention,
        rolled_for_retention=rolled,
        compaction=compaction,
    )


def _compaction_plan(inp: PlanInput, meta: PartitionMeta, *, now_ms: int) -> CompactionPlan:
    topic = inp.topic
    ltc = log_to_clean(
        meta,
        checkpoint=inp.checkpoint,
        now_ms=now_ms,
        min_compaction_lag_ms=topic.min_compaction_lag_ms,
        max_compaction_lag_ms=topic.max_compaction_lag_ms,
    )
    live = {s.base_offset for s in meta.segments}
    due = horizon_due(
        (h for h in inp.horizons if h.base_offset in live),
        now_ms=now_ms,
        end_offset=ltc.first_uncleanable,
    )
    eligible = None
    if inp.uncleanable is None:
        eligible = eligibility(ltc, topic.min_cleanable_dirty_ratio, horizon_due=due)
    return CompactionPlan(ltc, topic.min_cleanable_dirty_ratio, eligible, due, inp.uncleanable)


def plan_cycle(
    inputs: Sequence[PlanInput],
    *,
    now_ms: int,
    devices: Sequence[DeviceUsage] = (),
    device_of_dir: Mapping[str, int] | None = None,
    protects: Callable[[str], bool] = lambda _topic: False,
    min_roll_interval_ms: int = DEFAULT_MIN_ROLL_INTERVAL_MS,
) -> CyclePlan:
    """Plan every partition, order the eligible ones for cleaning, and plan KIP-61 over
    the post-retention snapshots of the partitions on `devices`."""
    planned = [
        plan_partition(i, now_ms=now_ms, min_roll_interval_ms=min_roll_interval_ms) for i in inputs
    ]
    eligible = [
        p.compaction.ltc
        for p, _ in planned
        if p.compaction is not None and p.compaction.eligible is not None
    ]
    order_of = {
        ltc.topic_partition: n
        for n, ltc in enumerate(order_for_cleaning(eligible, now_ms), start=1)
    }
    plans = tuple(
        dataclasses.replace(p, order=order_of.get(p.topic_partition))
        if p.compaction is not None and p.compaction.eligible is not None
        else p
        for p, _ in planned
    )
    where = device_of_dir or {}
    on_devices = [
        PartitionOnDevice(where[meta.log_dir], meta) for _, meta in planned if meta.log_dir in where
    ]
    disk = plan_disk_usage_deletions(
        devices,
        on_devices,
        protected_topics={i.meta.topic for i in inputs if protects(i.meta.topic)},
        now_ms=now_ms,
    )
    return CyclePlan(now_ms, plans, tuple(devices), disk.devices, disk.deletions)


# ---------------------------------------------------------------------------------------
# Gathering the inputs (observe mode)


@dataclass(slots=True)
class Gathered:
    """The planning inputs read from the log dirs, and what could not be read."""

    inputs: list[PlanInput]
    device_of_dir: dict[str, int]
    devices: tuple[DeviceUsage, ...]
    errors: list[str]


def gather(cfg: Config, *, now_ms: int) -> Gathered:
    """Read every log dir of `cfg` in observe mode into planning inputs."""
    out = Gathered([], {}, (), [])
    readable: list[Path] = []
    for path in cfg.log_dirs:
        try:
            with LogDir.open(Path(path), observe=True, state_dir=cfg.state_dir) as log_dir:
                _gather_dir(cfg, log_dir, now_ms, out)
                out.device_of_dir[str(log_dir.path)] = device_of(log_dir.path)
                readable.append(log_dir.path)
        except OSError as exc:
            out.errors.append(f"{path}: cannot read the log dir: {exc.strerror or exc}")
    out.devices = measure(group_devices(readable), cfg.log_retention_disk_usage_percent)
    return out


def _gather_dir(cfg: Config, log_dir: LogDir, now_ms: int, out: Gathered) -> None:
    first_seen = FirstSeen.load(cfg.state_dir, log_dir.path)
    horizons = HorizonCache()
    for tp in log_dir.partitions():
        topic = cfg.topic_config(tp.topic)
        try:
            plog = log_dir.open_partition(tp, config=LogConfig.of_topic(topic))
            meta = plog.meta()
            compacted = topic.compact and tp.topic != METADATA_TOPIC
            segment_horizons = horizons.partition(plog) if compacted else ()
        except (CleanerdError, OSError) as exc:
            out.errors.append(f"{log_dir.path / str(tp)}: {exc}")
            continue
        out.inputs.append(
            PlanInput(
                meta=meta,
                topic=topic,
                checkpoint=log_dir.checkpoints.cleaner_offsets.get(tp),
                first_seen_ms=first_seen.peek(tp, meta.active, now_ms),
                horizons=segment_horizons,
                uncleanable=None if plog.corrupt is None else str(plog.corrupt),
            )
        )


# ---------------------------------------------------------------------------------------
# Output


def _deletions_json(plan: RetentionPlan) -> list[dict[str, Any]]:
    return [
        {"base_offset": d.base_offset, "size_bytes": d.size_bytes, "reason": d.reason.value}
        for d in plan.deletions
    ]


def partition_json(p: PartitionPlan) -> dict[str, Any]:
    """One partition's plan as a JSON-ready dict."""
    out: dict[str, Any] = {
        "log_dir": p.log_dir,
        "topic": p.topic,
        "partition": p.partition,
        "cleanup_policy": list(p.policy),
        "roll": None,
        "retention": {
            "deletions": _deletions_json(p.retention),
            "log_start_offset": p.retention.log_start_offset,
            "roll_first": p.rolled_for_retention,
            "future_timestamp_base": p.retention.future_timestamp_base,
        },
        "compaction": None,
    }
    if p.roll is not None:
        d = p.roll.decision
        out["roll"] = {
            "due": d is not None,
            "reason": None if d is None else d.reason.value,
            "waited_ms": None if d is None else d.waited_ms,
            "limit_ms": p.roll.limit_ms,
            "limit_reason": p.roll.limit_reason,
            "due_at_ms": p.roll.due_at_ms,
        }
    c = p.compaction
    if c is not None:
        ltc = c.ltc
        out["compaction"] = {
            "eligible": c.eligible is not None,
            "reason": None if c.eligible is None else c.eligible.value,
            "order": p.order,
            "dirty_ratio": ltc.cleanable_ratio,
            "min_cleanable_dirty_ratio": c.min_cleanable_ratio,
            "first_dirty_offset": ltc.first_dirty,
            "first_uncleanable_offset": ltc.first_uncleanable,
            "checkpoint_reset": ltc.cleanable_range.checkpoint_reset,
            "clean_bytes": ltc.clean_bytes,
            "cleanable_bytes": ltc.cleanable_bytes,
            "blocked_by": list(c.blocked_by),
            "earliest_dirty_timestamp_ms": ltc.earliest_dirty_timestamp_ms,
            "deadline_ms": ltc.deadline_ms,
            "overdue_ms": ltc.compaction_delay_ms,
            "kafka_overdue_ms": ltc.kafka_compaction_delay_ms,
            "horizon_due": c.horizon_due,
            "uncleanable": c.uncleanable,
        }
    return out


def cycle_json(plan: CyclePlan, errors: Sequence[str] = ()) -> dict[str, Any]:
    """The whole plan as a JSON-ready dict."""
    return {
        "now_ms": plan.now_ms,
        "partitions": [partition_json(p) for p in plan.partitions],
        "cleaning_order": [
            str(p.topic_partition)
            for p in sorted((p for p in plan.partitions if p.order), key=lambda p: p.order or 0)
        ],
        "devices": [
            {
                "device": u.device,
                "total_bytes": u.total_bytes,
                "used_bytes": u.used_bytes,
                "threshold_percent": u.threshold_percent,
            }
            for u in plan.devices
        ],
        "disk_usage": {
            "deletions": [
                {
                    "log_dir": d.log_dir,
                    "topic": d.topic_partition.topic,
                    "partition": d.topic_partition.partition,
                    "base_offset": d.base_offset,
                    "freed_bytes": d.freed_bytes,
                    "log_start_offset": d.log_start_offset,
                }
                for d in plan.disk_deletions
            ],
            "devices": [dataclasses.asdict(o) for o in plan.disk_outcomes],
        },
        "errors": list(errors),
    }


def _roll_text(roll: RollPlan, now_ms: int) -> str:
    d = roll.decision
    if d is not None:
        waited = "" if d.waited_ms is None else f", waited {d.waited_ms} ms of {roll.limit_ms} ms"
        return f"roll: due now ({d.reason.value}{waited})"
    if roll.due_at_ms is None:
        return "roll: no (the active segment is empty)"
    return (
        f"roll: not yet; {roll.limit_reason} rolls it at {roll.due_at_ms} "
        f"(in {roll.due_at_ms - now_ms} ms)"
    )


def _retention_text(p: PartitionPlan) -> str:
    r = p.retention
    if not r.deletions:
        text = "retention: nothing to delete"
    else:
        by_reason: dict[str, list[Deletion]] = {}
        for d in r.deletions:
            by_reason.setdefault(d.reason.value, []).append(d)
        parts = ", ".join(
            f"{reason}: {len(ds)} ({sum(d.size_bytes for d in ds)} bytes)"
            for reason, ds in by_reason.items()
        )
        first = "roll first, then " if p.rolled_for_retention else ""
        text = f"retention: {first}delete {parts}; log start offset -> {r.log_start_offset}"
    if r.future_timestamp_base is not None:
        text += (
            f"; segment {r.future_timestamp_base} has a future timestamp and blocks retention.ms"
        )
    return text


def _compaction_text(p: PartitionPlan) -> str:
    c = p.compaction
    if c is None:
        return "compaction: no (cleanup.policy has no compact)"
    ltc = c.ltc
    if c.uncleanable is not None:
        verdict = f"uncleanable ({c.uncleanable})"
    elif c.eligible is not None:
        verdict = f"eligible ({c.eligible.value}), order {p.order}"
    else:
        verdict = "not eligible"
    deadline = "no deadline"
    if ltc.deadline_ms is not None:
        deadline = f"deadline {ltc.deadline_ms}"
        if ltc.compaction_delay_ms > 0:
            deadline += (
                f" overdue by {ltc.compaction_delay_ms} ms "
                f"(Kafka sees {ltc.kafka_compaction_delay_ms} ms)"
            )
        else:
            deadline += " not yet passed"
    horizon = "; a delete horizon has passed" if c.horizon_due else ""
    return (
        f"compaction: {verdict}; dirty ratio {ltc.cleanable_ratio:.3f} vs "
        f"{c.min_cleanable_ratio:g}; cleanable [{ltc.first_dirty}, {ltc.first_uncleanable}) "
        f"{ltc.cleanable_bytes} bytes, blocked by {', '.join(c.blocked_by)}; "
        f"{deadline}{horizon}"
    )


def render_text(plan: CyclePlan) -> list[str]:
    """The plan as lines for a terminal."""
    lines = []
    for p in plan.partitions:
        head = f"{p.topic_partition} in {p.log_dir}"
        if p.roll is None:
            lines.append(f"{head}: the KRaft metadata log, never modified")
            continue
        lines.append(f"{head} ({','.join(p.policy)})")
        lines.append(f"  {_roll_text(p.roll, plan.now_ms)}")
        lines.append(f"  {_retention_text(p)}")
        lines.append(f"  {_compaction_text(p)}")
    outcomes = {o.device: o for o in plan.disk_outcomes}
    for u in plan.devices:
        pct = 100 * u.used_bytes / u.total_bytes if u.total_bytes else 0.0
        line = (
            f"device {u.device}: {pct:.1f}% used ({u.used_bytes} of {u.total_bytes} bytes), "
            f"threshold {u.threshold_percent:g}%"
        )
        o = outcomes.get(u.device)
        if o is not None:
            count = sum(1 for d in plan.disk_deletions if d.device == u.device)
            line += f"; disk usage would delete {count} segments -> {o.used_bytes_after} bytes used"
            if o.above_threshold:
                line += ", still above the threshold"
        lines.append(line)
    lines.extend(
        f"  disk.usage: delete {d.topic_partition} segment {d.base_offset} in {d.log_dir} "
        f"({d.freed_bytes} bytes)"
        for d in plan.disk_deletions
    )
    return lines


def run(args: argparse.Namespace) -> int:
    """The `plan` subcommand: exit 1 when a log dir or partition could not be read."""
    cfg = load_config(args.config)
    now_ms = args.now_ms if args.now_ms is not None else time.time_ns() // 1_000_000
    gathered = gather(cfg, now_ms=now_ms)
    plan = plan_cycle(
        gathered.inputs,
        now_ms=now_ms,
        devices=gathered.devices,
        device_of_dir=gathered.device_of_dir,
        protects=cfg.disk_usage.protects,
    )
    if args.json:
        print(json.dumps(cycle_json(plan, gathered.errors), indent=2))
    else:
        for line in render_text(plan):
            print(line)
        for error in gathered.errors:
            print(f"cleanerd plan: {error}", file=sys.stderr)
    return 1 if gathered.errors else 0
