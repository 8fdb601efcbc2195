"""`cleanerd audit`: prove (or refute) the deletion deadlines of every partition.

Every log dir of the config is opened in observe mode (nothing is locked or modified,
so a live broker's or daemon's dirs can be audited). Every partition of a topic with
`delete` in its cleanup policy and `retention.ms` >= 0 has its retention deadline
audited from its segment metadata (`retention.audit`: segments past `retention.ms`
plus the retention slack, and what keeps them), and every partition of a topic
with `compact` in its cleanup policy (never `__cluster_metadata`) is scanned whole by
`compaction.audit.audit_partition`: superseded records still on disk, the age of the
oldest, tombstones and markers whose delete horizon has passed, records without a key
(which the next pass drops), and every superseded record older than
`max.compaction.lag.ms` plus the slack, a deadline violation. A
partition with more keyed records than `--memory-mb` holds is audited in key buckets,
each read again (`compaction.audit`), so the scan's memory stays within that budget.

The slack (`--slack-ms`) is how late a correct cleanerd may legitimately be after a
deadline. Default: `log.cleaner.backoff.ms` (a worker with nothing to do sleeps that
long before it looks again) plus a clean-time allowance of 5 minutes
(`CLEAN_TIME_ALLOWANCE_MS`), which covers the roll and retention check that makes an
idle segment cleanable and one cleaning pass over a partition of a few GiB at the
measured throughput (`bench/clean.py`); set it explicitly for larger partitions or
slower disks. The retention slack is `log.retention.check.interval.ms` (a broker
checks retention that often) plus the same allowance; `--slack-ms` sets both.

`--engine spark` runs the scan on Spark (`engine/spark/audit_job.py`: one task per segment, a
shuffle by partition, the same pure `audit_columns` core, so the report is the same,
record for record) in a job process, for fleets of log dirs; `--parquet PATH` (any Hadoop
filesystem URI) also writes the report as a Parquet table there. Without `--engine` the
scan runs here, whatever `engine.name` says. Progress (segments and bytes read, rate,
ETA) goes to stderr: a bar on a terminal, a line every few seconds otherwise.

Exit status: 0 when no partition violates a deadline; 1 when one does, or when a
partition, a segment's date or a log dir could not be read (corrupt data: nothing can be
proved about it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Final

from cleanerd.commands import Arg, epoch_ms, non_negative_int, positive_int
from cleanerd.commands.progress import Progress
from cleanerd.compaction.audit import (
    AUDIT_MEMORY_BYTES,
    DEFAULT_MAX_LISTED,
    PartitionAudit,
    audit_partition,
)
from cleanerd.config import Config, load_config
from cleanerd.errors import (
    CheckpointError,
    CleanerdError,
    ConfigError,
    failure_text,
    reread_on_change,
)
from cleanerd.log.files import (
    DELETED_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    METADATA_TOPIC,
    parse_topic_partition,
    partition_dir_gone,
)
from cleanerd.log.log_dir import LogDir
from cleanerd.log.ownership import lock_holder
from cleanerd.log.partition_log import LogConfig, PartitionLog
from cleanerd.log.topic_config import TopicConfig
from cleanerd.logger import log_to_stderr
from cleanerd.retention.audit import (
    HoldReason,
    PendingFile,
    RetentionAudit,
    audit_retention,
    audits_retention,
)
from cleanerd.wording import count

CLEAN_TIME_ALLOWANCE_MS: Final = 300_000

ARGS: Final[tuple[Arg, ...]] = (
    (("-c", "--config"), {"type": Path, "metavar": "FILE", "help": "the YAML config file"}),
    (
        ("--now-ms",),
        {
            "type": epoch_ms,
            "metavar": "T",
            "help": "measure ages and deadlines at T (ms since the epoch; default now)",
        },
    ),
    (
        ("--slack-ms",),
        {
            "type": non_negative_int,
            "metavar": "MS",
            "help": (
                "allowed lateness past max.compaction.lag.ms and past retention.ms (default: "
                "log.cleaner.backoff.ms, and log.retention.check.interval.ms for retention, "
                f"+ {CLEAN_TIME_ALLOWANCE_MS} ms clean-time allowance)"
            ),
        },
    ),
    (
        ("--max-listed",),
        {
            "type": non_negative_int,
            "default": DEFAULT_MAX_LISTED,
            "metavar": "N",
            "help": f"violations listed per partition, oldest first (default {DEFAULT_MAX_LISTED})",
        },
    ),
    (
        ("--memory-mb",),
        {
            "type": positive_int,
            "metavar": "MB",
            "help": "memory for one partition's records; a bigger partition is read again "
            f"per key bucket (local scan; default {AUDIT_MEMORY_BYTES >> 20})",
        },
    ),
    (("--json",), {"action": "store_true", "help": "print one JSON document"}),
    (
        ("--engine",),
        {
            "choices": ["local", "spark", "auto"],
            "default": "local",
            "help": "where the scan runs (default local; spark for many log dirs; auto, "
            "like the auto engine, scans locally)",
        },
    ),
    (
        ("--parquet",),
        {
            "metavar": "PATH",
            "help": "also write the report as Parquet at PATH (needs --engine spark)",
        },
    ),
)


def default_slack_ms(cfg: Config) -> int:
    """`log.cleaner.backoff.ms` plus the clean-time allowance (see the module docstring)."""
    return cfg.log_cleaner_backoff_ms + CLEAN_TIME_ALLOWANCE_MS


def default_retention_slack_ms(cfg: Config) -> int:
    """`log.retention.check.interval.ms` plus the clean-time allowance (see the module
    docstring)."""
    return cfg.log_retention_check_interval_ms + CLEAN_TIME_ALLOWANCE_MS


@dataclass(slots=True)
class AuditRun:
    """Every partition audited, and the log dirs that could not be read."""

    audits: list[PartitionAudit] = field(default_factory=list)
    retention: list[RetentionAudit] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def violations(self) -> int:
        return sum(a.violations for a in self.audits)

    @property
    def retention_violations(self) -> int:
        return sum(a.violations for a in self.retention)

    @property
    def stuck_deletions(self) -> int:
        return sum(a.stuck for a in self.retention)

    @property
    def failed(self) -> bool:
        """A violation, or something that could not be audited."""
        return bool(
            self.violations
            or self.errors
            or any(a.error for a in self.audits)
            or any(a.failed for a in self.retention)
        )


@dataclass(frozen=True, slots=True)
class RetentionScope:
    """What the retention audit is measured against."""

    now_ms: int
    slack_ms: int
    max_listed: int

    def audit(self, plog: PartitionLog, topic: TopicConfig, run: AuditRun) -> None:
        """Audit `plog`'s retention deadline into `run` (into its errors when its
        metadata cannot be read, unless the partition was deleted meanwhile)."""
        try:
            meta = reread_on_change(plog.readable_meta, gone=partial(partition_dir_gone, plog.dir))
        except (CleanerdError, OSError) as exc:
            if not partition_dir_gone(plog.dir):
                run.errors.append(f"{plog.dir}: retention not audited: {failure_text(exc)}")
            return
        run.retention.append(
            audit_retention(
                meta,
                topic,
                now_ms=self.now_ms,
                slack_ms=self.slack_ms,
                max_listed=self.max_listed,
                # Listed only where the open's listing saw a renamed file: rarely.
                pending=pending_deletion(plog.dir) if plog.recovery_report.leftovers else (),
            )
        )


def pending_deletion(dir_path: Path) -> list[PendingFile]:
    """The `.log.deleted` files of the partition dir `dir_path` (a file gone meanwhile,
    deleted by its deleter, is left out)."""
    pending = []
    for entry in _listing(dir_path):
        if entry.name.endswith(LOG_FILE_SUFFIX + DELETED_FILE_SUFFIX):
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            pending.append(PendingFile(entry.path, st.st_size, st.st_ctime_ns // 1_000_000))
    return pending


def compacted_partitions(
    cfg: Config, run: AuditRun, retention: RetentionScope | None = None
) -> Iterator[tuple[PartitionLog, TopicConfig]]:
    """Every compacted partition of every log dir of `cfg`, opened in observe mode, with
    `retention` auditing on the way (into `run`) the retention deadline of every
    partition that has one (`audits_retention`). The partitions that cannot be opened go
    to `run.errors`, with those whose damage the owner's open would find in a dir nobody
    holds (as `plan` foresees it: an interrupted swap it could not finish, or what its
    checks after a crash find)."""
    for path in cfg.log_dirs:
        try:
            with LogDir.open(Path(path), observe=True, state_dir=cfg.state_dir) as log_dir:
                owned = lock_holder(log_dir.path) is None
                for tp in log_dir.partitions():
                    try:
                        topic = cfg.topic_config(tp.topic)
                    except ConfigError as exc:  # two globs match it: not audited
                        run.errors.append(f"{log_dir.path / str(tp)}: {exc.reason}")
                        continue
                    timed = retention is not None and audits_retention(topic)
                    if not (topic.compact or timed) or tp.topic == METADATA_TOPIC:
                        continue
                    try:
                        # A segment a live broker swapped or deleted between the
                        # listing and the open: listed and opened again (the read
                        # retries on its own, `audit_partition`).
                        config = LogConfig.of_topic(topic)
                        path = log_dir.path / str(tp)
                        plog = reread_on_change(
                            partial(log_dir.open_partition, tp, config=config),
                            gone=partial(partition_dir_gone, path),
                        )
                        if owned:
                            plog.foresee_swap_damage()
                            # A compacted partition's scan walks every batch itself.
                            log_dir.foresee_open_damage(plog, walk=not topic.compact)
                    except (CleanerdError, OSError) as exc:
                        if not partition_dir_gone(path):  # else deleted since the listing
                            run.errors.append(f"{path}: {exc}")
                        continue
                    if retention is not None and timed:
                        retention.audit(plog, topic, run)
                    if topic.compact:
                        yield plog, topic
        except (CheckpointError, OSError) as exc:  # offline for a cycle too
            run.errors.append(f"{path}: offline, not read: {failure_text(exc)}")


def audit_log_dirs(
    cfg: Config,
    *,
    now_ms: int,
    slack_ms: int,
    max_listed: int,
    retention: RetentionScope | None = None,
    memory_bytes: int = AUDIT_MEMORY_BYTES,
    progress: Progress | None = None,
) -> AuditRun:
    """Audit every partition of every log dir of `cfg` (observe mode): the compacted ones
    each within about `memory_bytes` (see `compaction.audit`), and with `retention` the
    retention deadline of those that have one."""
    run = AuditRun()
    for plog, topic in compacted_partitions(cfg, run, retention):
        audit = audit_partition(
            plog,
            topic,
            now_ms=now_ms,
            slack_ms=slack_ms,
            max_listed=max_listed,
            memory_bytes=memory_bytes,
        )
        if audit.error is not None and partition_dir_gone(plog.dir):
            continue  # deleted while read (a topic deletion): nothing to audit
        run.audits.append(audit)
        if progress is not None:
            sizes = [s.size for s in plog.segments]
            progress.advance(segments=len(sizes), size=sum(sizes))
    return run


def audit_log_dirs_on_spark(
    cfg: Config,
    *,
    now_ms: int,
    slack_ms: int,
    max_listed: int,
    parquet: str | None,
    retention: RetentionScope | None = None,
    progress: Progress | None = None,
) -> AuditRun:
    """`audit_log_dirs` with the scan of the compacted partitions on Spark
    (`engine/spark/audit_job.py`), in a job process; `progress` counts the segments as
    the executors finish them. Retention deadlines take segment metadata only: they are
    audited here, as `audit_log_dirs` audits them."""
    from cleanerd.engine.spark.engine import (
        SparkSettings,
        audit_on_spark,
        check_spark_available,
        new_staging_dir,
    )
    from cleanerd.engine.spark.specs import audit_partition_spec

    check_spark_available()
    run = AuditRun()
    partitions = []
    for plog, topic in compacted_partitions(cfg, run, retention):
        spec = audit_partition_spec(plog, topic)
        partitions.append(spec)
        if spec.error is not None and progress is not None:
            # Not decoded on Spark (it could not be opened whole): done already.
            sizes = [s.size for s in plog.segments]
            progress.advance(segments=len(sizes), size=sum(sizes))
    if not partitions and parquet is None:
        return run  # nothing to scan: no Spark application (10 s of a JVM) for it
    staging = new_staging_dir(Path(cfg.state_dir), "audit", 1)
    try:
        run.audits = audit_on_spark(
            partitions,
            now_ms=now_ms,
            slack_ms=slack_ms,
            max_listed=max_listed,
            parquet=parquet,
            settings=SparkSettings(
                master=cfg.engine.spark.master, conf=tuple(sorted(cfg.engine.spark.conf.items()))
            ),
            staging=staging,
            on_progress=None
            if progress is None
            else lambda segments, size: progress.advance(segments=segments, size=size),
        )
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return run


def _total_segments(cfg: Config) -> tuple[int, int]:
    """(segments, bytes) of the compacted partitions' `.log` files: the progress total.
    One listing per dir and one look-up per topic, so the only cost per segment is its
    `stat`."""
    compacted: dict[str, bool] = {}
    segments = size = 0
    for path in cfg.log_dirs:
        for entry in _listing(path):
            try:
                topic = parse_topic_partition(entry.name).topic
                if topic not in compacted:
                    compacted[topic] = topic != METADATA_TOPIC and cfg.topic_config(topic).compact
            except (CleanerdError, ValueError):
                continue
            if not compacted[topic]:
                continue
            for file in _listing(entry.path):
                if file.name.endswith(LOG_FILE_SUFFIX):
                    try:
                        size += file.stat().st_size
                    except OSError:
                        continue
                    segments += 1
    return segments, size


def _listing(path: str | Path) -> list[os.DirEntry[str]]:
    """The entries of dir `path`; none when it cannot be listed (the audit reports it)."""
    try:
        with os.scandir(path) as entries:
            return list(entries)
    except OSError:
        return []


def render_text(a: PartitionAudit) -> list[str]:
    """One partition's audit as terminal lines."""
    head = f"{a.topic}-{a.partition} in {a.log_dir} ({a.strategy} strategy)"
    r = a.result
    if r is None:
        return [f"{head}: not audited: {a.error}"]
    age = r.oldest_superseded_age_ms
    oldest = "" if age is None else f", oldest {age} ms"
    if age is not None and age < 0:  # every one superseded by a record from the future
        oldest = f", superseded by records timestamped at least {-age} ms in the future"
    unknown = f", {r.superseded_unknown_age} of unknown age" if r.superseded_unknown_age else ""
    if a.max_compaction_lag_ms is None:
        deadline = "no max.compaction.lag.ms: no deadline"
    else:
        deadline = (
            f"{count(r.violations, 'deadline violation')} (max.compaction.lag.ms "
            f"{a.max_compaction_lag_ms} + slack {a.slack_ms} ms)"
        )
    lines = [
        f"{head}: {count(r.records, 'record')}, {count(r.keys, 'key')}, {r.superseded} superseded "
        f"({r.superseded_bytes} bytes){oldest}{unknown}; {deadline}"
    ]
    past = [
        f"{count(n, noun)} (oldest by {overdue_ms} ms)"
        for n, noun, overdue_ms in (
            (r.tombstones_past_horizon, "tombstone", r.oldest_tombstone_overdue_ms),
            (r.markers_past_horizon, "marker", r.oldest_marker_overdue_ms),
        )
        if n
    ]
    if past:
        lines.append(f"  past their delete horizon: {', '.join(past)}")
    if r.keyless_records:
        lines.append(
            f"  {count(r.keyless_records, 'record')} without a key, the first at offset "
            f"{r.first_keyless_offset}: a compacted topic keeps no record without a key, "
            "so the next pass over them drops them (as Kafka's cleaner does)"
        )
    lines.extend(
        f"  violation: offset {v.offset} superseded at {v.superseded_at_ms}, age {v.age_ms} ms"
        for v in r.listed_violations
    )
    if r.violations > len(r.listed_violations):
        lines.append(f"  ... and {r.violations - len(r.listed_violations)} more")
    return lines


def render_retention(a: RetentionAudit) -> list[str]:
    """One partition's retention audit as terminal lines."""
    past = "none past retention.ms"
    if a.past_retention:
        past = (
            f"{a.past_retention} past retention.ms ({a.past_retention_bytes} bytes), "
            f"the most overdue by {a.most_overdue_ms} ms"
        )
    lines = [
        f"{a.topic}-{a.partition} in {a.log_dir} (retention.ms {a.retention_ms}): "
        f"{count(a.segments, 'segment')}, {past}; {count(a.violations, 'retention violation')} "
        f"(retention.ms {a.retention_ms} + slack {a.slack_ms} ms)"
    ]
    if a.due:
        them = "it since its deadline" if a.due == 1 else "them since their deadline"
        lines.append(
            f"  due: retention, run now, deletes {count(a.due, 'segment')} past retention.ms "
            f"(no retention check has deleted {them})"
        )
    if a.hold is not None:
        lines.append(f"  kept: {_hold_text(a)}")
    lines.extend(
        f"  not dated: segment {d.base_offset} is damaged, nothing is proved about it: {d.damage}"
        for d in a.damaged
    )
    if a.pending:
        oldest = a.pending[0]
        lines.append(
            f"  pending deletion: {count(len(a.pending), 'file')} renamed .deleted "
            f"({sum(f.size_bytes for f in a.pending)} bytes), the oldest "
            f"{a.now_ms - oldest.renamed_ms} ms ago; {a.stuck} stuck (file.delete.delay.ms "
            f"{a.file_delete_delay_ms} + slack {a.slack_ms} ms)"
        )
    lines.extend(
        f"  violation: segment {v.base_offset} ({v.size_bytes} bytes), largest timestamp "
        f"{v.largest_timestamp_ms}, past retention.ms by {v.overdue_ms} ms"
        for v in a.listed
    )
    if a.violations > len(a.listed):
        lines.append(f"  ... and {a.violations - len(a.listed)} more")
    return lines


def _hold_text(a: RetentionAudit) -> str:
    """Why retention keeps segments of `a` past their deadline."""
    hold = a.hold
    assert hold is not None
    at = f"retention stops at segment {hold.base_offset}"
    match hold.reason:
        case HoldReason.FUTURE_TIMESTAMP:
            ahead = hold.largest_timestamp_ms - a.now_ms
            if not hold.size_bytes:
                return f"{at}, which is empty: dated by its file's mtime, {ahead} ms in the future"
            return f"{at}, whose largest timestamp is {ahead} ms in the future"
        case HoldReason.NOT_EXPIRED:
            # Kafka's rule is strict: past retention.ms 1 ms after the deadline.
            past = hold.largest_timestamp_ms + a.retention_ms + 1
            return (
                f"{at}, not past retention.ms before {past} (in {past - a.now_ms} ms; the "
                "oldest segments go first)"
            )
        case HoldReason.DAMAGE:
            return f"{at}, which is damaged: {hold.damage}"
        case HoldReason.HIGH_WATERMARK:
            return (
                f"{at}: the high watermark {hold.high_watermark} "
                f"(replication-offset-checkpoint) is below its end {hold.end_offset}"
            )


def run(args: argparse.Namespace) -> int:
    """The `audit` subcommand: exit 1 on a deadline violation or an unreadable partition."""
    cfg = load_config(args.config)
    # Log lines go to stderr, so stdout holds only the report (`--json` stays parseable).
    log_to_stderr(cfg.logging.format, cfg.logging.level)
    now_ms = args.now_ms if args.now_ms is not None else time.time_ns() // 1_000_000
    slack_ms = args.slack_ms if args.slack_ms is not None else default_slack_ms(cfg)
    retention = RetentionScope(
        now_ms=now_ms,
        slack_ms=default_retention_slack_ms(cfg) if args.slack_ms is None else args.slack_ms,
        max_listed=args.max_listed,
    )
    if args.parquet is not None and args.engine != "spark":
        print("cleanerd audit: --parquet needs --engine spark", file=sys.stderr)
        return 2
    if args.memory_mb is not None and args.engine == "spark":
        print("cleanerd audit: --memory-mb bounds the local scan only", file=sys.stderr)
        return 2
    segments, size = _total_segments(cfg)
    # No bar for a run with nothing to scan (retention deadlines alone, read from metadata).
    bar = Progress("audit", segments=segments, total_bytes=size) if segments else None
    with bar if bar is not None else nullcontext() as progress:
        if args.engine == "spark":
            result = audit_log_dirs_on_spark(
                cfg,
                now_ms=now_ms,
                slack_ms=slack_ms,
                max_listed=args.max_listed,
                parquet=args.parquet,
                retention=retention,
                progress=progress,
            )
        else:
            result = audit_log_dirs(
                cfg,
                now_ms=now_ms,
                slack_ms=slack_ms,
                max_listed=args.max_listed,
                retention=retention,
                memory_bytes=AUDIT_MEMORY_BYTES if args.memory_mb is None else args.memory_mb << 20,
                progress=progress,
            )
    not_audited = [a for a in result.audits if a.result is None]
    undated = [
        f"{r.name}: segment {d.base_offset} not dated: {d.damage}"
        for r in result.retention
        for d in r.damaged
    ]
    if args.json:
        doc = {
            "now_ms": now_ms,
            "slack_ms": slack_ms,
            "violations": result.violations,
            "partitions": [a.to_json() for a in result.audits],
            "retention_slack_ms": retention.slack_ms,
            "retention_violations": result.retention_violations,
            "stuck_deletions": result.stuck_deletions,
            "retention": [a.to_json() for a in result.retention],
            # Everything not audited, as `plan --json` lists what it could not read.
            "errors": result.errors
            + [f"{a.name}: not audited: {a.error}" for a in not_audited]
            + undated,
        }
        print(json.dumps(doc, indent=2))
    else:
        for a in result.audits:
            for line in render_text(a):
                print(line)
        for r in result.retention:
            for line in render_retention(r):
                print(line)
        audited = {a.name for a in result.audits if a.result is not None}
        audited.update(r.name for r in result.retention)
        unread = f", {len(not_audited)} not audited" if not_audited else ""
        unread += f", {count(len(undated), 'damaged segment')} not dated" if undated else ""
        retained = (
            f", {count(result.retention_violations, 'retention violation')}"
            if result.retention
            else ""
        )
        if result.stuck_deletions:
            retained += f", {count(result.stuck_deletions, 'stuck deletion')}"
        print(
            f"{count(len(audited), 'partition')} audited{unread}, "
            f"{count(result.violations, 'deadline violation')}{retained}"
        )
        for error in result.errors:
            print(f"cleanerd audit: {error}", file=sys.stderr)
    return 1 if result.failed else 0
