"""`cleanerd plan`: what one maintenance cycle would do at `--now-ms`, and why, per
partition; nothing is modified (every log dir is read in observe mode, see
`cleanerd.maintenance.plan`). Text for a terminal, or `--json` in the schema `clean
--json` shares (`cleanerd.maintenance.report`). Exit status 1 when a log dir or a
partition could not be read.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from cleanerd import wording
from cleanerd.commands import Arg, epoch_ms
from cleanerd.config import load_config
from cleanerd.logger import log_to_stderr
from cleanerd.maintenance.plan import (
    CyclePlan,
    PartitionPlan,
    cycle_json,
    gather,
    plan_cycle,
)
from cleanerd.maintenance.report import Unreadable
from cleanerd.maintenance.steps import RollPlan
from cleanerd.retention.disk_usage import device_name
from cleanerd.retention.policy import Deletion

ARGS: Final[tuple[Arg, ...]] = (
    (("-c", "--config"), {"type": Path, "metavar": "FILE", "help": "the YAML config file"}),
    (
        ("--now-ms",),
        {
            "type": epoch_ms,
            "metavar": "T",
            "help": "evaluate every time rule at T (ms since the epoch; default now)",
        },
    ),
    (("--json",), {"action": "store_true", "help": "print one JSON document"}),
)


def _roll_text(roll: RollPlan, now_ms: int, *, at_append: bool = False) -> str:
    d = roll.decision
    if d is not None:
        waited = "" if d.waited_ms is None else f", waited {d.waited_ms} ms of {roll.limit_ms} ms"
        if at_append:  # a broker's dir: it rolls only when it appends
            return f"roll: due at the broker's next append ({d.reason.value}{waited})"
        return f"roll: due now ({d.reason.value}{waited})"
    if roll.due_at_ms is None:
        return "roll: no (the active segment is empty)"
    if roll.held_by_min_interval:
        return (
            f"roll: not yet; the minimum roll interval ({roll.min_interval_ms} ms after the "
            f"last roll: rolls.min_interval_ms, at most {roll.limit_reason}) holds the "
            f"{roll.limit_reason} "
            f"roll until {roll.due_at_ms} (in {roll.due_at_ms - now_ms} ms)"
        )
    return (
        f"roll: not yet; {roll.limit_reason} rolls it at {roll.due_at_ms} "
        f"(in {roll.due_at_ms - now_ms} ms)"
    )


def _retention_text(p: PartitionPlan) -> str:
    r = p.retention
    if p.retention_skipped is not None:
        return f"retention: skipped ({p.retention_skipped})"
    if not r.deletions:
        text = "retention: nothing to delete"
    else:
        by_reason: dict[str, list[Deletion]] = {}
        for d in r.deletions:
            by_reason.setdefault(d.reason.value, []).append(d)
        parts = ", ".join(
            f"{reason}: {wording.count(len(ds), 'segment')} ({sum(d.size_bytes for d in ds)} bytes)"
            for reason, ds in by_reason.items()
        )
        first = "roll first, then " if p.retention_roll is not None else ""
        text = f"retention: {first}delete {parts}; log start offset -> {r.log_start_offset}"
    if r.future_timestamp_base is not None:
        text += (
            f"; segment {r.future_timestamp_base} has a future timestamp and blocks retention.ms"
        )
    if r.damaged_base is not None:
        text += f"; segment {r.damaged_base} is damaged and stops retention until it is repaired"
    return text


def _compaction_text(p: PartitionPlan, *, cleaner_enabled: bool) -> str:
    c = p.compaction
    if c is None:
        return "compaction: no (cleanup.policy has no compact)"
    ltc = c.ltc
    if c.uncleanable is not None:
        verdict = f"uncleanable ({c.uncleanable})"
    elif c.eligible is not None and not cleaner_enabled:
        verdict = f"eligible ({c.eligible.value}) but not cleaned: log.cleaner.enable is false"
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
    cleanable = (
        f"cleanable [{ltc.first_dirty}, {ltc.first_uncleanable}) {ltc.cleanable_bytes} bytes"
    )
    if ltc.first_dirty > ltc.first_uncleanable:  # a log start inside the active segment
        cleanable = (
            f"nothing cleanable (first dirty offset {ltc.first_dirty}, first uncleanable "
            f"{ltc.first_uncleanable})"
        )
    return (
        f"compaction: {verdict}; dirty ratio {ltc.cleanable_ratio:.3f} vs "
        f"{c.min_cleanable_ratio:g}; {cleanable}, blocked by {', '.join(c.blocked_by)}; "
        f"{deadline}{horizon}"
    )


def render_text(
    plan: CyclePlan,
    unreadable: Sequence[Unreadable] = (),
    observed: Mapping[str, str] | None = None,
) -> list[str]:
    """The plan as lines for a terminal."""
    lines = [
        f"{path}: only observed ({why}): cleanerd changes nothing there; the plan is what "
        "its owner's cycle should do"
        for path, why in (observed or {}).items()
    ]
    damaged = {(p.log_dir, p.topic_partition) for p in plan.partitions if p.damage}
    for bad in unreadable:
        if (bad.log_dir, bad.tp) not in damaged:
            lines.append(f"{bad.tp} in {bad.log_dir} ({','.join(bad.policy)})")
            lines.append(f"  unreadable, nothing planned: {bad.reason}")
    for p in plan.partitions:
        head = f"{p.topic_partition} in {p.log_dir}"
        if p.damage is not None:
            lines.append(f"{head} ({','.join(p.policy)})")
            lines.append(f"  unreadable, neither rolled nor cleaned: {p.damage}")
            lines.append(f"  {_retention_text(p)}")
            continue
        if p.roll is None:
            lines.append(f"{head}: the KRaft metadata log, never modified")
            continue
        lines.append(f"{head} ({','.join(p.policy)})")
        roll = p.retention_roll
        if roll is not None and p.roll.decision is None:
            # Said here too: the roll line would otherwise say "not yet" above it.
            lines.append(f"  roll: due now ({roll.reason.value}: retention takes every segment)")
        else:
            lines.append(f"  {_roll_text(p.roll, plan.now_ms, at_append=p.roll_at_append)}")
        lines.append(f"  {_retention_text(p)}")
        lines.append(f"  {_compaction_text(p, cleaner_enabled=plan.cleaner_enabled)}")
    outcomes = {o.device: o for o in plan.disk_outcomes}
    for u in plan.devices:
        pct = 100 * u.used_bytes / u.total_bytes if u.total_bytes else 0.0
        line = (
            f"device {device_name(u.device)}: {pct:.1f}% used "
            f"({u.used_bytes} of {u.total_bytes} bytes), "
            f"threshold {u.threshold_percent:g}%"
        )
        o = outcomes.get(u.device)
        if o is not None:
            count = sum(1 for d in plan.disk_deletions if d.device == u.device)
            line += (
                f"; disk usage would delete {wording.count(count, 'segment')} -> "
                f"{o.used_bytes_after} bytes used"
            )
            if o.above_threshold:
                line += ", still above the threshold"
        lines.append(line)
        lines.extend(
            f"  disk.usage: delete {d.topic_partition} segment {d.base_offset} in {d.log_dir} "
            f"({d.freed_bytes} bytes)"
            for d in plan.disk_deletions
            if d.device == u.device
        )
    return lines


def run(args: argparse.Namespace) -> int:
    """The `plan` subcommand: exit 1 when a log dir or partition could not be read."""
    cfg = load_config(args.config)
    # Log lines go to stderr, so stdout holds only the report (`--json` stays parseable).
    log_to_stderr(cfg.logging.format, cfg.logging.level)
    now_ms = args.now_ms if args.now_ms is not None else time.time_ns() // 1_000_000
    gathered = gather(cfg, now_ms=now_ms)
    plan = plan_cycle(
        gathered.inputs,
        now_ms=now_ms,
        devices=gathered.devices,
        device_of_dir=gathered.device_of_dir,
        protects=cfg.disk_usage.protects,
        cleaner_enabled=cfg.log_cleaner_enable,
        min_roll_interval_ms=cfg.rolls.min_interval_ms,
        freed_first=gathered.freed_first,
        no_disk_usage=gathered.no_disk_usage,
    )
    if args.json:
        doc = cycle_json(
            plan, gathered.errors, gathered.unreadable, gathered.observed, gathered.truncated
        )
        print(json.dumps(doc, indent=2))
    else:
        for line in render_text(plan, gathered.unreadable, gathered.observed):
            print(line)
        for cut in gathered.truncated:
            print(cut.text(foreseen=True))
    # A pass foreseen to fail is the cycle's uncleanable partition: exit 1, as `clean`.
    failing = [
        f"{Path(p.log_dir) / f'{p.topic}-{p.partition}'}: the pass will fail: "
        f"{p.compaction.uncleanable}"
        for p in plan.partitions
        if p.compaction is not None and p.compaction.pass_fails
    ]
    for error in [*gathered.errors, *failing]:  # in the JSON too: the exit status says why
        print(f"cleanerd plan: {error}", file=sys.stderr)
    return 1 if gathered.errors or failing else 0
