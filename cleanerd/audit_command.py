"""`cleanerd audit`: prove (or refute) the deletion deadline on every compacted partition.

Every log dir of the config is opened in observe mode (nothing is locked or modified,
so a live broker's or daemon's dirs can be audited), and every partition of a topic
with `compact` in its cleanup policy (never `__cluster_metadata`) is scanned whole by
`compaction.audit.audit_partition`: superseded records still on disk, the age of the
oldest, tombstones and markers whose delete horizon has passed, and every superseded
record older than `max.compaction.lag.ms` plus the slack, a deadline violation.

The slack (`--slack-ms`) is how late a correct cleanerd may legitimately be after a
deadline. Default: `log.cleaner.backoff.ms` (a worker with nothing to do sleeps that
long before it looks again) plus a clean-time allowance of 5 minutes
(`CLEAN_TIME_ALLOWANCE_MS`), which covers the roll and retention check that makes an
idle segment cleanable and one cleaning pass over a partition of a few GiB at the
measured throughput (`bench/clean.py`); set it explicitly for larger partitions or
slower disks.

Exit status: 0 when no partition violates its deadline; 1 when one does, or when a
partition or log dir could not be read (corrupt data: nothing can be proved about it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from cleanerd.compaction.audit import DEFAULT_MAX_LISTED, PartitionAudit, audit_partition
from cleanerd.config import Config, load_config
from cleanerd.errors import CleanerdError
from cleanerd.log.files import METADATA_TOPIC
from cleanerd.log.log_dir import LogDir
from cleanerd.produce import log_config_for

CLEAN_TIME_ALLOWANCE_MS: Final = 300_000

ARGS: Final[tuple[tuple[tuple[str, ...], dict[str, Any]], ...]] = (
    (("-c", "--config"), {"type": Path, "metavar": "FILE", "help": "the YAML config file"}),
    (
        ("--now-ms",),
        {
            "type": int,
            "metavar": "T",
            "help": "measure ages and deadlines at T (ms since the epoch; default now)",
        },
    ),
    (
        ("--slack-ms",),
        {
            "type": int,
            "metavar": "MS",
            "help": (
                "allowed lateness past max.compaction.lag.ms (default: log.cleaner.backoff.ms "
                f"+ {CLEAN_TIME_ALLOWANCE_MS} ms clean-time allowance)"
            ),
        },
    ),
    (
        ("--max-listed",),
        {
            "type": int,
            "default": DEFAULT_MAX_LISTED,
            "metavar": "N",
            "help": f"violations listed per partition, oldest first (default {DEFAULT_MAX_LISTED})",
        },
    ),
    (("--json",), {"action": "store_true", "help": "print one JSON document"}),
)


def default_slack_ms(cfg: Config) -> int:
    """`log.cleaner.backoff.ms` plus the clean-time allowance (see the module docstring)."""
    return cfg.log_cleaner_backoff_ms + CLEAN_TIME_ALLOWANCE_MS


@dataclass(slots=True)
class AuditRun:
    """Every partition audited, and the log dirs that could not be read."""

    audits: list[PartitionAudit] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def violations(self) -> int:
        return sum(a.violations for a in self.audits)

    @property
    def failed(self) -> bool:
        """A violation, or something that could not be audited."""
        return bool(self.violations or self.errors or any(a.error for a in self.audits))


def audit_log_dirs(cfg: Config, *, now_ms: int, slack_ms: int, max_listed: int) -> AuditRun:
    """Audit every compacted partition of every log dir of `cfg` (observe mode)."""
    run = AuditRun()
    for path in cfg.log_dirs:
        try:
            with LogDir.open(Path(path), observe=True, state_dir=cfg.state_dir) as log_dir:
                for tp in log_dir.partitions():
                    topic = cfg.topic_config(tp.topic)
                    if not topic.compact or tp.topic == METADATA_TOPIC:
                        continue
                    try:
                        plog = log_dir.open_partition(tp, config=log_config_for(topic))
                    except (CleanerdError, OSError) as exc:
                        run.errors.append(f"{log_dir.path / str(tp)}: {exc}")
                        continue
                    run.audits.append(
                        audit_partition(
                            plog, topic, now_ms=now_ms, slack_ms=slack_ms, max_listed=max_listed
                        )
                    )
        except OSError as exc:
            run.errors.append(f"{path}: cannot read the log dir: {exc.strerror or exc}")
    return run


def render_text(a: PartitionAudit) -> list[str]:
    """One partition's audit as terminal lines."""
    head = f"{a.topic}-{a.partition} in {a.log_dir} ({a.strategy} strategy)"
    r = a.result
    if r is None:
        return [f"{head}: not audited: {a.error}"]
    oldest = (
        "" if r.oldest_superseded_age_ms is None else f", oldest {r.oldest_superseded_age_ms} ms"
    )
    unknown = f", {r.superseded_unknown_age} of unknown age" if r.superseded_unknown_age else ""
    if a.max_compaction_lag_ms is None:
        deadline = "no max.compaction.lag.ms: no deadline"
    else:
        deadline = (
            f"{r.violations} deadline violations (max.compaction.lag.ms "
            f"{a.max_compaction_lag_ms} + slack {a.slack_ms} ms)"
        )
    lines = [
        f"{head}: {r.records} records, {r.keys} keys, {r.superseded} superseded "
        f"({r.superseded_bytes} bytes){oldest}{unknown}; {deadline}"
    ]
    if r.tombstones_past_horizon or r.markers_past_horizon:
        lines.append(
            f"  past their delete horizon: {r.tombstones_past_horizon} tombstones "
            f"(oldest by {r.oldest_tombstone_overdue_ms} ms), {r.markers_past_horizon} markers "
            f"(oldest by {r.oldest_marker_overdue_ms} ms)"
        )
    lines.extend(
        f"  violation: offset {v.offset} superseded at {v.superseded_at_ms}, age {v.age_ms} ms"
        for v in r.listed_violations
    )
    if r.violations > len(r.listed_violations):
        lines.append(f"  ... and {r.violations - len(r.listed_violations)} more")
    return lines


def run(args: argparse.Namespace) -> int:
    """The `audit` subcommand: exit 1 on a deadline violation or an unreadable partition."""
    cfg = load_config(args.config)
    now_ms = args.now_ms if args.now_ms is not None else time.time_ns() // 1_000_000
    slack_ms = args.slack_ms if args.slack_ms is not None else default_slack_ms(cfg)
    result = audit_log_dirs(cfg, now_ms=now_ms, slack_ms=slack_ms, max_listed=args.max_listed)
    if args.json:
        doc = {
            "now_ms": now_ms,
            "slack_ms": slack_ms,
            "violations": result.violations,
            "partitions": [a.to_json() for a in result.audits],
            "errors": result.errors,
        }
        print(json.dumps(doc, indent=2))
    else:
        for a in result.audits:
            for line in render_text(a):
                print(line)
        print(f"{len(result.audits)} partitions audited, {result.violations} deadline violations")
        for error in result.errors:
            print(f"cleanerd audit: {error}", file=sys.stderr)
    return 1 if result.failed else 0
