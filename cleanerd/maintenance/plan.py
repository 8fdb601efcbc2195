"""`cleanerd plan`'s core: what one maintenance cycle would do at an instant, and why,
per partition.

Nothing is modified: every log dir is opened in observe mode (no `.lock` taken, no
recovery, partitions read-only), the first-seen registry is read but never saved.

The plan runs the cycle's steps (`steps`) in the cycle's order over simulated snapshots
(pure functions over `PartitionMeta`, no files): a due roll is applied to the snapshot
(the active segment becomes inactive and an empty one follows it), then retention's
deletions, and KIP-61 plans over the snapshots that are left; compaction reports the
dirty ratio against `min.cleanable.dirty.ratio`, the cleanable range and what bounds it,
the max-lag deadline and how overdue it is (cleanerd's honest delay, and Kafka's),
whether a delete horizon has passed, whether the partition is eligible and in which
order the workers would take it; a partition found corrupt is reported uncleanable. A
partition whose segments cannot be read at all (a bad batch where its end is read, an
index that points nowhere) is listed as unreadable, with the error naming the file and
position: a cycle's steps fail on it too. Its retention and disk usage are still
planned over the segments before the damage (`PartitionLog.readable_meta`), as a cycle
deletes them; it is neither rolled nor cleaned.

`plan_cycle` is the pure core (`bench/plan.py` times it); `gather` reads its inputs from
the log dirs.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cleanerd.compaction.horizon import HorizonCache, SegmentHorizon
from cleanerd.compaction.manager import order_for_cleaning
from cleanerd.config import Config, log_dir_failure
from cleanerd.errors import (
    CheckpointError,
    CleanerdError,
    ConfigError,
    NoSegmentYet,
    reread_on_change,
)
from cleanerd.log.files import (
    CLEAN_SHUTDOWN_FILE_NAME,
    METADATA_TOPIC,
    TopicPartition,
    partition_dir_gone,
)
from cleanerd.log.log_dir import LogDir
from cleanerd.log.meta import PartitionMeta
from cleanerd.log.ownership import Holder
from cleanerd.log.partition_log import LogConfig, PartitionLog
from cleanerd.log.recovery import TruncatedTail, foreseen_torn_tail, leftover_bytes
from cleanerd.log.roll import DEFAULT_MIN_ROLL_INTERVAL_MS, SegmentAge
from cleanerd.log.roller import FirstSeen, segment_age
from cleanerd.log.topic_config import TopicConfig
from cleanerd.maintenance.report import (
    TailCut,
    Unreadable,
    deleted_json,
    disk_deleted_json,
    rolled_json,
    skipped_json,
)
from cleanerd.maintenance.steps import (
    HELD_UNCLEANABLE,
    CompactionPlan,
    RollPlan,
    compaction_plan,
    retention_applies,
    retention_step,
    roll_plan,
    simulate_deletions,
    simulate_roll,
)
from cleanerd.retention.disk import device_of, group_devices, is_above, measure
from cleanerd.retention.disk_usage import (
    DeviceOutcome,
    DeviceUsage,
    DiskDeletion,
    PartitionOnDevice,
    device_name,
    freed_bytes,
    plan_disk_usage_deletions,
)
from cleanerd.retention.policy import RetentionPlan, RetentionRoll

# ---------------------------------------------------------------------------------------
# The pure planning core


@dataclass(frozen=True, slots=True)
class PlanInput:
    """What planning one partition needs, all plain data."""

    meta: PartitionMeta
    topic: TopicConfig
    checkpoint: int | None
    """The partition's `cleaner-offset-checkpoint` entry."""
    age: SegmentAge
    """How old the active segment is (`roller.segment_age`)."""
    horizons: tuple[SegmentHorizon, ...] = ()
    """Delete horizons of the non-active segments (`HorizonCache`)."""
    uncleanable: str | None = None
    """Why the partition is uncleanable, or None."""
    pass_damage: str | None = None
    """What a cleaning pass would fail on before reading a batch
    (`PartitionLog.foresee_pass_damage`), or None."""
    rolls: bool = True
    """A cleanerd cycle rolls the partition (this config's, or the daemon's that holds
    its dir); False beside a broker, which rolls only when it appends (an idle
    partition's active segment never rolls, so its data is not cleanable)."""


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
    retention_roll: RetentionRoll | None
    """The roll the executor does first, because a rule would take every segment; None
    when it does not."""
    compaction: CompactionPlan | None
    """None for topics without `compact`."""
    order: int | None = None
    """Position in the cleaning order (1 first), None when not eligible."""
    damage: str | None = None
    """The damage that keeps the partition from being rolled or cleaned
    (`PartitionMeta.damage`); retention stops before it."""
    retention_skipped: str | None = None
    """Why the retention step passes the partition by (`steps.HELD_UNCLEANABLE`), or
    None."""
    roll_at_append: bool = False
    """The roll is due, but a broker holds the dir: it rolls at its next append, not in
    a cycle, and nothing is planned past that roll."""

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
    cleaner_enabled: bool = True
    """`log.cleaner.enable`: when false, an eligible partition gets no pass (no order)."""


def plan_partition(
    inp: PlanInput,
    *,
    now_ms: int,
    cleaner_enabled: bool = True,
    min_roll_interval_ms: int = DEFAULT_MIN_ROLL_INTERVAL_MS,
) -> tuple[PartitionPlan, PartitionMeta]:
    """The steps of one partition over its snapshot, and the snapshot after the cycle's
    roll and retention (the input of KIP-61 planning)."""
    meta, topic = inp.meta, inp.topic
    if meta.never_touched:
        nothing = RetentionPlan((), meta.log_start_offset, None, None)
        return _partition_plan(inp, None, nothing, rolled=None, compaction=None), meta
    if meta.damage is not None:
        # A cycle's roll and clean steps fail on it; retention stops before the damage.
        retention, _rolled, current, skipped = _retention(inp, meta, now_ms, cleaner_enabled)
        planned = _partition_plan(
            inp, None, retention, rolled=None, compaction=None, retention_skipped=skipped
        )
        return planned, current
    roll = roll_plan(
        meta.topic_partition,
        meta.active,
        topic,
        now_ms=now_ms,
        age=inp.age,
        # A broker's roll (`LogSegment.shouldRoll`) keeps no minimum interval: cleanerd's
        # floor on its own rolls is no rule of the broker's.
        min_roll_interval_ms=min_roll_interval_ms if inp.rolls else 0,
    )
    at_append = roll.decision is not None and not inp.rolls
    current = simulate_roll(meta, now_ms) if roll.decision is not None and inp.rolls else meta
    retention, rolled, current, skipped = _retention(inp, current, now_ms, cleaner_enabled)
    compaction = None
    if topic.compact:
        compaction = _compaction(inp, current, now_ms)
    planned = _partition_plan(
        inp,
        roll,
        retention,
        rolled=rolled,
        compaction=compaction,
        retention_skipped=skipped,
        roll_at_append=at_append,
    )
    return planned, current


def _compaction(inp: PlanInput, current: PartitionMeta, now_ms: int) -> CompactionPlan:
    """The clean step's plan of `inp`'s partition as `current` stands; an eligible
    partition whose pass fails on `inp.pass_damage` is uncleanable instead, as the cycle
    marks it once that pass failed."""
    plan = compaction_plan(
        current,
        inp.topic,
        now_ms=now_ms,
        checkpoint=inp.checkpoint,
        horizons=inp.horizons,
        uncleanable=inp.uncleanable,
    )
    if inp.pass_damage is None or plan.eligible is None:
        return plan
    return dataclasses.replace(plan, eligible=None, uncleanable=inp.pass_damage, pass_fails=True)


def _retention(
    inp: PlanInput, current: PartitionMeta, now_ms: int, cleaner_enabled: bool
) -> tuple[RetentionPlan, RetentionRoll | None, PartitionMeta, str | None]:
    """The retention step over `current`: the plan, the roll it does first, the snapshot
    after it, and why the step passes the partition by (None when it does not). A
    compacted partition the cycle holds uncleanable (found corrupt, or a damaged
    segment: the cycle marks it before this step) is passed by."""
    nothing = RetentionPlan((), current.log_start_offset, None, None)
    if not retention_applies(inp.topic, cleaner_enabled=cleaner_enabled):
        return nothing, None, current, None
    if inp.topic.compact and (inp.uncleanable is not None or current.damage is not None):
        return nothing, None, current, HELD_UNCLEANABLE
    retention, rolled, current = retention_step(current, inp.topic, now_ms=now_ms)
    return retention, rolled, current, None


def _partition_plan(
    inp: PlanInput,
    roll: RollPlan | None,
    retention: RetentionPlan,
    *,
    rolled: RetentionRoll | None,
    compaction: CompactionPlan | None,
    retention_skipped: str | None = None,
    roll_at_append: bool = False,
) -> PartitionPlan:
    return PartitionPlan(
        log_dir=inp.meta.log_dir,
        topic=inp.meta.topic,
        partition=inp.meta.partition,
        policy=inp.topic.cleanup_policy,
        roll=roll,
        retention=retention,
        retention_roll=rolled,
        compaction=compaction,
        damage=inp.meta.damage,
        retention_skipped=retention_skipped,
        roll_at_append=roll_at_append,
    )


def plan_cycle(
    inputs: Sequence[PlanInput],
    *,
    now_ms: int,
    devices: Sequence[DeviceUsage] = (),
    device_of_dir: Mapping[str, int] | None = None,
    protects: Callable[[str], bool] = lambda _topic: False,
    cleaner_enabled: bool = True,
    min_roll_interval_ms: int = DEFAULT_MIN_ROLL_INTERVAL_MS,
    freed_first: Mapping[int, int] | None = None,
    no_disk_usage: Collection[str] = (),
) -> CyclePlan:
    """Plan every partition (`steps`), order the eligible ones for cleaning, and plan
    KIP-61 over the post-retention snapshots of the partitions on `devices` when one is
    above its threshold. The cycle's KIP-61 step measures after the opens deleted the
    leftover files (`freed_first`, bytes per device) and after the files retention
    renamed `.deleted` were unlinked (a device above its threshold gets them unlinked at
    once): the plan takes both off the measured usage before planning. KIP-61 deletes
    nothing in the log dirs `no_disk_usage` (whose owner has no such step: a broker),
    whose bytes still count on their device."""
    planned = [
        plan_partition(
            i,
            now_ms=now_ms,
            cleaner_enabled=cleaner_enabled,
            min_roll_interval_ms=min_roll_interval_ms,
        )
        for i in inputs
    ]
    where = device_of_dir or {}
    on_devices = [
        PartitionOnDevice(where[meta.log_dir], meta)
        for _, meta in planned
        if meta.log_dir in where and meta.log_dir not in no_disk_usage
    ]
    freed = dict(freed_first or {})
    block = {u.device: u.block_bytes for u in devices}
    for inp, (p, _) in zip(inputs, planned, strict=True):
        if p.log_dir in where:
            device = where[p.log_dir]
            segments = {s.base_offset: s for s in inp.meta.segments}
            freed[device] = freed.get(device, 0) + sum(
                freed_bytes(segments[d.base_offset], block.get(device, 1))
                for d in p.retention.deletions
            )
    disk = plan_disk_usage_deletions(
        [
            dataclasses.replace(u, used_bytes=max(0, u.used_bytes - freed.get(u.device, 0)))
            for u in devices
        ],
        on_devices,
        protected_topics={i.meta.topic for i in inputs if protects(i.meta.topic)},
        now_ms=now_ms,
    )
    if disk.deletions:
        planned = _after_disk_usage(inputs, planned, disk.deletions, now_ms)
    eligible = [
        p.compaction.ltc
        for p, _ in planned
        if cleaner_enabled and p.compaction is not None and p.compaction.eligible is not None
    ]
    order_of = {
        ltc.topic_partition: n
        for n, ltc in enumerate(order_for_cleaning(eligible, now_ms), start=1)
    }
    plans = tuple(
        dataclasses.replace(p, order=order_of[p.topic_partition])
        if p.topic_partition in order_of
        else p
        for p, _ in planned
    )
    return CyclePlan(now_ms, plans, tuple(devices), disk.devices, disk.deletions, cleaner_enabled)


def _after_disk_usage(
    inputs: Sequence[PlanInput],
    planned: list[tuple[PartitionPlan, PartitionMeta]],
    deletions: Sequence[DiskDeletion],
    now_ms: int,
) -> list[tuple[PartitionPlan, PartitionMeta]]:
    """The clean step planned again over the snapshots the KIP-61 step cut (its
    deletions are each partition's oldest segments, never the active one): the cycle
    cleans after that step, so a pass never covers what it deleted."""
    gone = Counter((d.log_dir, d.topic_partition) for d in deletions)
    out = []
    for inp, (p, meta) in zip(inputs, planned, strict=True):
        cut = gone.get((meta.log_dir, meta.topic_partition), 0)
        if cut and p.compaction is not None:
            meta = simulate_deletions(meta, cut)
            p = dataclasses.replace(p, compaction=_compaction(inp, meta, now_ms))
        out.append((p, meta))
    return out


# ---------------------------------------------------------------------------------------
# Gathering the inputs (observe mode)


@dataclass(slots=True)
class Gathered:
    """The planning inputs read from the log dirs, and what could not be read."""

    inputs: list[PlanInput]
    device_of_dir: dict[str, int]
    devices: tuple[DeviceUsage, ...]
    errors: list[str]
    unreadable: list[Unreadable] = dataclasses.field(default_factory=list)
    observed: dict[str, str] = dataclasses.field(default_factory=dict)
    """The log dirs a cycle of this config would only observe, and why."""
    no_disk_usage: set[str] = dataclasses.field(default_factory=set)
    """The log dirs whose owner has no KIP-61 step: those a broker holds, and all in
    `mode: observe` (a cleanerd daemon holding one deletes there as this config would)."""
    freed_first: dict[int, int] = dataclasses.field(default_factory=dict)
    """Per device above its threshold: the bytes of leftover files the owner's opens
    delete before its KIP-61 step measures (`recovery.leftover_bytes`)."""
    truncated: list[TailCut] = dataclasses.field(default_factory=list)
    """The torn tails the owner's opens will cut (`recovery.foreseen_torn_tail`)."""


def gather(cfg: Config, *, now_ms: int) -> Gathered:
    """Read every log dir of `cfg` in observe mode into planning inputs."""
    out = Gathered([], {}, (), [])
    readable: list[Path] = []
    owned: dict[Path, list[Path]] = {}  # the partition dirs of the dirs a cycle owns
    for path in cfg.log_dirs:
        try:
            with LogDir.open(Path(path), observe=True, state_dir=cfg.state_dir) as log_dir:
                partitions = log_dir.partitions()
                if (why := _observed_because(cfg, log_dir.path)) is not None:
                    out.observed[str(log_dir.path)] = why.reason
                    if not why.by_cleanerd:
                        out.no_disk_usage.add(str(log_dir.path))
                else:
                    owned[log_dir.path] = list(partitions.values())
                    marker = log_dir.path / CLEAN_SHUTDOWN_FILE_NAME
                    log_dir.owner_trusts = marker.exists()
                rolled_by_cleanerd = why is None or why.by_cleanerd
                _gather_dir(
                    cfg,
                    log_dir,
                    partitions,
                    now_ms,
                    out,
                    owned=why is None,
                    rolls=rolled_by_cleanerd,
                )
                out.device_of_dir[str(log_dir.path)] = device_of(log_dir.path)
                readable.append(log_dir.path)
        except (CheckpointError, OSError) as exc:  # offline for a cycle too
            out.errors.append(f"{path}: offline, not read: {log_dir_failure(cfg, Path(path), exc)}")
    out.devices = measure(group_devices(readable), cfg.log_retention_disk_usage_percent)
    if any(is_above(u) for u in out.devices):
        for path, partition_dirs in owned.items():
            device = out.device_of_dir[str(path)]
            out.freed_first[device] = out.freed_first.get(device, 0) + sum(
                leftover_bytes(d) for d in partition_dirs if not d.is_symlink()
            )
    return out


@dataclass(frozen=True, slots=True)
class _Observed:
    reason: str
    by_cleanerd: bool
    """Held by a cleanerd owner, whose cycle does what this config's would."""


def _observed_because(cfg: Config, path: Path) -> _Observed | None:
    """Why a cycle would only observe the log dir `path` (`mode: observe`, or its
    `.lock` held by another process: a broker, or a cleanerd daemon, named as `clean`
    and `check-config` name it), or None."""
    if cfg.observe:
        return _Observed("mode: observe", by_cleanerd=False)
    holder = Holder.of(path, cfg.state_dir)
    if holder.pid is not None and holder.pid != os.getpid():
        return _Observed(f".lock held by {holder.described}", by_cleanerd=holder.cleanerd)
    return None


def _read_partition(
    log_dir: LogDir, tp: TopicPartition, topic: TopicConfig, horizons: HorizonCache, *, owned: bool
) -> tuple[PartitionLog, PartitionMeta, tuple[SegmentHorizon, ...]]:
    """The partition opened and read whole, or as far as its damage lets it be
    (`PartitionMeta.damage`). A live broker may rename or delete a segment while it is
    read (observe mode): the partition is listed and read again (`reread_on_change`).
    `owned`: raise what the owner's open would for an interrupted swap it cannot finish
    (in a dir another process holds, a swap may be in flight: nothing to foresee)."""
    compacted = topic.compact and tp.topic != METADATA_TOPIC

    def read() -> tuple[PartitionLog, PartitionMeta, tuple[SegmentHorizon, ...]]:
        plog = log_dir.open_partition(tp, config=LogConfig.of_topic(topic))
        if owned:
            plog.foresee_swap_damage()
            log_dir.foresee_open_damage(plog)
        meta = plog.readable_meta()
        read_whole = compacted and meta.damage is None
        return plog, meta, horizons.partition(plog) if read_whole else ()

    return reread_on_change(read, gone=lambda: partition_dir_gone(log_dir.path / str(tp)))


def _gather_dir(
    cfg: Config,
    log_dir: LogDir,
    partitions: Mapping[TopicPartition, Path],
    now_ms: int,
    out: Gathered,
    *,
    owned: bool,
    rolls: bool,
) -> None:
    """The planning inputs of one log dir into `out`. `owned`: this config's cycle would
    own the dir (its opens cut torn tails); `rolls`: a cleanerd cycle rolls there (this
    config's, or the daemon's that holds it)."""
    first_seen = FirstSeen.load(cfg.state_dir, log_dir.path)
    horizons = HorizonCache()
    for tp in partitions:
        try:
            topic = cfg.topic_config(tp.topic)
        except ConfigError as exc:  # two globs match it: the cycle leaves it alone too
            out.errors.append(f"{log_dir.path / str(tp)}: {exc.reason}")
            continue
        try:
            plog, meta, segment_horizons = _read_partition(
                log_dir, tp, topic, horizons, owned=owned
            )
        except NoSegmentYet:
            # Being created by a broker, or left so by a crash (the owner's open creates
            # the first segment): nothing to plan, and nothing wrong, as `audit` finds.
            continue
        except (CleanerdError, OSError) as exc:
            if partition_dir_gone(log_dir.path / str(tp)):
                continue  # deleted since the listing (a topic deletion): nothing to plan
            out.errors.append(f"{log_dir.path / str(tp)}: {exc}")
            out.unreadable.append(Unreadable(str(log_dir.path), tp, topic.cleanup_policy, str(exc)))
            continue
        if meta.damage is not None:
            out.errors.append(f"{log_dir.path / str(tp)}: {meta.damage}")
            out.unreadable.append(
                Unreadable(str(log_dir.path), tp, topic.cleanup_policy, meta.damage)
            )
        elif plog.corrupt is not None:
            # Damage the owner's open will find outside any segment's batches (an index
            # the foresight checked): the cycle's error for the partition, so the exit
            # status is `clean`'s.
            out.errors.append(f"{log_dir.path / str(tp)}: {plog.corrupt}")
        elif owned and (tail := _foreseen_cut(plog)) is not None:
            out.truncated.append(TailCut(str(log_dir.path), tp, tail))
        age = segment_age(plog, first_seen, meta.active, now_ms)
        compacted = topic.compact and tp.topic != METADATA_TOPIC and meta.damage is None
        if rolls and compacted and _rolls(meta, topic, age, now_ms, cfg.rolls.min_interval_ms):
            # The cycle rolls first, then looks for passed horizons in the segment it
            # closed too: so must the plan (only then, as reading it costs a walk).
            segment_horizons += (horizons.segment(plog.active_segment),)
        out.inputs.append(
            PlanInput(
                meta=meta,
                topic=topic,
                checkpoint=log_dir.checkpoints.cleaner_offsets.get(tp),
                age=age,
                horizons=segment_horizons,
                uncleanable=None if plog.corrupt is None else str(plog.corrupt),
                pass_damage=plog.foresee_pass_damage(meta) if rolls and compacted else None,
                rolls=rolls,
            )
        )


def _rolls(
    meta: PartitionMeta, topic: TopicConfig, age: SegmentAge, now_ms: int, min_interval_ms: int
) -> bool:
    """Whether the cycle's roll step closes the active segment (`plan_partition`'s roll)."""
    roll = roll_plan(
        meta.topic_partition,
        meta.active,
        topic,
        now_ms=now_ms,
        age=age,
        min_roll_interval_ms=min_interval_ms,
    )
    return roll.decision is not None


# ---------------------------------------------------------------------------------------
# JSON (the schema `clean --json` shares, `report`)


def _foreseen_cut(plog: PartitionLog) -> TruncatedTail | None:
    """The torn tail the owner's open will cut from `plog` (open read-only), if any; a
    file gone or changed since it was read says nothing (the open sees it anew)."""
    try:
        return foreseen_torn_tail(plog.active_segment)
    except OSError:
        return None


def _deletions_json(plan: RetentionPlan) -> list[dict[str, Any]]:
    return [
        {"base_offset": d.base_offset, "size_bytes": d.size_bytes, "reason": d.reason.value}
        for d in plan.deletions
    ]


def _rolled(partitions: Sequence[PartitionPlan]) -> list[dict[str, Any]]:
    """The rolls the cycle would report, in its order: the roll step's over every
    partition first, then those retention makes before deleting every segment."""
    out = []
    for p in partitions:
        d = None if p.roll is None else p.roll.decision
        if d is not None and not p.roll_at_append:
            tp = p.topic_partition
            out.append(rolled_json(p.log_dir, tp, d.base_offset, d.reason.value, d.waited_ms))
    for p in partitions:
        roll = p.retention_roll
        if roll is not None:
            tp = p.topic_partition
            out.append(rolled_json(p.log_dir, tp, roll.base_offset, roll.reason.value, None))
    return out


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
            "roll_first": p.retention_roll is not None,
            "future_timestamp_base": p.retention.future_timestamp_base,
            "damaged_base": p.retention.damaged_base,
            "skipped": p.retention_skipped,
        },
        "damage": p.damage,
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
            "held_by_min_interval": p.roll.held_by_min_interval,
            "at_next_append": p.roll_at_append,
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
            "pass_fails": c.pass_fails,
        }
    return out


def cycle_json(
    plan: CyclePlan,
    errors: Sequence[str] = (),
    unreadable: Sequence[Unreadable] = (),
    observed: Mapping[str, str] | None = None,
    truncated: Sequence[TailCut] = (),
) -> dict[str, Any]:
    """The whole plan as a JSON-ready dict (`truncated`: the torn tails the opens will
    cut, as `clean --json` lists those it cut)."""
    observed = observed or {}
    return {
        "now_ms": plan.now_ms,
        "rolled": _rolled(plan.partitions),
        "deleted": [
            deleted_json(p.log_dir, p.topic_partition, d)
            for p in plan.partitions
            for d in p.retention.deletions
        ]
        + [disk_deleted_json(d) for d in plan.disk_deletions],
        "skipped": [
            skipped_json(p.log_dir, p.topic_partition, "retention", p.retention_skipped)
            for p in plan.partitions
            if p.retention_skipped is not None
        ],
        "partitions": [partition_json(p) for p in plan.partitions],
        "unreadable": [u.to_json() for u in unreadable],
        "truncated": [t.to_json() for t in truncated],
        "observed": [{"log_dir": d, "reason": why} for d, why in observed.items()],
        "cleaner_enabled": plan.cleaner_enabled,
        "cleaning_order": [
            str(p.topic_partition)
            for p in sorted((p for p in plan.partitions if p.order), key=lambda p: p.order or 0)
        ],
        "devices": [
            {
                "device": device_name(u.device),
                "total_bytes": u.total_bytes,
                "used_bytes": u.used_bytes,
                "threshold_percent": u.threshold_percent,
            }
            for u in plan.devices
        ],
        "disk_usage": {
            "devices": [
                {**dataclasses.asdict(o), "device": device_name(o.device)}
                for o in plan.disk_outcomes
            ]
        },
        "errors": list(errors),
    }
