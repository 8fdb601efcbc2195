"""`cleanerd clean`: one full maintenance cycle, then exit; prints what it did.

The cycle is the daemon's (`cleanerd.maintenance.cycle`): rolls, retention, KIP-61 disk usage,
then cleaning by the schedule (overdue first, then nearest deadline, then dirtiest) with
`log.cleaner.threads` workers on the chosen engine, until nothing is eligible. On the
local engine one pass at a time runs in this process, and worker processes are started
only for passes that run beside it (`LocalEngine(in_process=True)`); `--pool` runs every
pass in a worker process, isolated from the command as the daemon's are. Each log dir of the
config is opened in owner mode; a dir whose `.lock` another process holds is observed,
not touched. Old segment files are unlinked before the command exits: a
one-shot process has nobody left to honour `file.delete.delay.ms` for it.

`--now-ms` is the instant every time rule is evaluated at (rolls, retention, lags,
horizons, expiry): the cycle's clock stands still at it. `--topic` (repeatable) limits
rolls, retention and cleaning to those topics; disk usage, which orders segments across
every topic of a device, is then not enforced. A `--topic` that matches no partition in
the log dirs (a typo, a partition's dir name, a topic with no replica on this host) is
named among what was left alone, and does not change the exit status. Output: the rolls,
deletions, disk usage, Kafka's stats block for each pass, partitions found uncleanable,
steps that failed (a partition that could not be opened, rolled or retained, with the
reason), the partitions and log dirs left alone, and the writes of the clean stop after
the cycle that failed; `--json` prints the `CycleReport` as one JSON document (and
`stop_errors`). Exit status 1 when a pass or a step failed, a log dir was offline (it
could not be opened, or its root checkpoint files could not be read: the other dirs are
maintained all the same), or a log dir could not be owned: one that another cleanerd
process owns (a running daemon) is an error before anything is done, naming its pid; one
that another program holds (a Kafka broker) is only observed.
"""

from __future__ import annotations

import argparse
import functools
import json
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Final

from cleanerd.clock import wall_clock_ms
from cleanerd.commands import Arg, epoch_ms
from cleanerd.commands.progress import Progress, TrackedEngine
from cleanerd.compaction.stats import render_invalid_warning, render_stats
from cleanerd.config import load_config
from cleanerd.engine import create_engine
from cleanerd.engine.first_reads import ReaderPool
from cleanerd.logger import get_logger, log_to_stderr
from cleanerd.maintenance.cycle import Maintenance
from cleanerd.maintenance.report import CycleReport
from cleanerd.retention.disk_usage import device_name
from cleanerd.wording import count

log = get_logger(__name__)

ARGS: Final[tuple[Arg, ...]] = (
    (
        ("-c", "--config"),
        {"type": Path, "metavar": "FILE", "help": "the YAML config file"},
    ),
    (
        ("--now-ms",),
        {
            "type": epoch_ms,
            "metavar": "T",
            "help": "evaluate every time rule at T (ms since the epoch; default now)",
        },
    ),
    (
        ("--topic",),
        {
            "action": "append",
            "metavar": "T",
            "help": "only this topic (repeatable; default every topic)",
        },
    ),
    (
        ("--engine",),
        {
            "choices": ["local", "spark", "auto"],
            "help": "where passes run: local, spark (every pass) or auto (Spark for passes "
            "whose keys outgrow the local map); default: the config's engine.name",
        },
    ),
    (
        ("--pool",),
        {
            "action": "store_true",
            "help": "run every pass in a worker process, as the daemon does (default: one "
            "pass at a time in this process, workers only for passes beside it)",
        },
    ),
    (("--json",), {"action": "store_true", "help": "print one JSON document"}),
)


def render_text(report: CycleReport, stop_errors: Sequence[str] = ()) -> list[str]:
    """The report as terminal lines; `stop_errors`: what the writes of a clean stop after
    the cycle (flushes, snapshots, checkpoints) failed with, each naming its file."""
    lines = [
        f"{r.tp}: rolled segment {r.base_offset} ({r.reason}"
        + (f", first batch {r.waited_ms} ms old" if r.waited_ms is not None else "")
        + ")"
        for r in report.rolled
    ]
    lines += [
        f"{o.topic}-{o.partition}: deleted segment {d.base_offset} "
        f"({d.size_bytes} bytes, {d.reason.value}); log start offset {o.log_start_offset}"
        for o in report.retention
        for d in o.deletions
    ]
    disk = report.disk_usage
    if disk is not None:
        verb = "would delete" if disk.dry_run else "deleted"
        lines += [
            f"{dd.topic_partition}: {verb} segment {dd.base_offset} "
            f"({dd.freed_bytes} bytes, {dd.reason.value}, device {device_name(dd.device)})"
            for dd in disk.deletions
        ]
        for before, after in zip(disk.before, disk.after, strict=True):
            lines.append(
                f"device {device_name(before.device)}: "
                f"{_percent(before.used_bytes, before.total_bytes)} "
                f"-> {_percent(after.used_bytes, after.total_bytes)} used "
                f"(threshold {before.threshold_percent:g}%)"
            )
    for c in report.cleaned:
        block = render_stats(
            thread_id=0,
            log_name=str(c.tp),
            first_dirty_offset=c.first_dirty,
            end_offset=c.end_offset,
            stats=c.stats,
        )
        overdue = f", {c.overdue_ms} ms overdue" if c.overdue_ms else ""
        lines.append(f"{c.tp}: cleaned ({c.reason}{overdue}){block}")
        warning = render_invalid_warning(c.stats)
        if warning is not None:
            lines.append(warning)
    lines += [t.text() for t in report.truncated]
    lines += [f"{f.tp}: uncleanable: {f.reason}" for f in report.failed]
    lines += [f"{e.tp}: {e.phase} failed: {e.reason}" for e in report.errors]
    named = {(e.log_dir, e.tp) for e in report.errors} | {(f.log_dir, f.tp) for f in report.failed}
    lines += [
        f"{u.tp}: unreadable: {u.reason}"
        for u in report.unreadable
        if (u.log_dir, u.tp) not in named  # a line above gave its error already
    ]
    for s in report.skipped:
        where = str(s.tp) if s.tp is not None else (s.log_dir or "cycle")
        # Passed by while the dirs were listed: no step of the cycle ran there.
        what = "left alone" if s.phase == "discover" else f"{s.phase} skipped"
        lines.append(f"{where}: {what}: {s.reason}")
    lines += [f"{o.log_dir}: offline, left alone: {o.reason}" for o in report.offline]
    lines += [f"stop: checkpoint failed: {e}" for e in stop_errors]
    if report.aborted:
        lines.append(
            "interrupted: the passes in flight were stopped (their logs left as they were), "
            "the steps not begun skipped"
        )
    lines.append(
        f"{count(len(report.rolled), 'segment')} rolled, "
        f"{sum(len(o.deletions) for o in report.retention)} deleted by retention, "
        f"{len(disk.deletions) if disk is not None and not disk.dry_run else 0} "
        f"deleted for disk usage"
    )
    failed = len(report.errors) + len(stop_errors)
    errors = f", {count(failed, 'step')} failed" if failed else ""
    if report.offline:
        errors += f", {count(len(report.offline), 'log dir')} offline"
    lines.append(
        f"{count(len(report.cleaned), 'cleaning pass', 'cleaning passes')}, "
        f"{count(len(report.failed), 'partition')} uncleanable" + errors
    )
    return lines


def _percent(used: int, total: int) -> str:
    return f"{100 * used / total:.1f}%" if total else "n/a"


def run(args: argparse.Namespace) -> int:
    """The `clean` subcommand; exit status 1 if any step failed (opening, rolling,
    retention, cleaning a partition, a write of the stop), a log dir was offline or could
    not be owned (see above)."""
    config = load_config(args.config)
    # Log lines go to stderr, so stdout holds only the report (`--json` stays parseable).
    log_to_stderr(config.logging.format, config.logging.level)
    now_ms: int | None = args.now_ms
    clock = wall_clock_ms if now_ms is None else (lambda: now_ms)
    topics = frozenset(args.topic) if args.topic else None
    progress = Progress("clean", segments=0, total_bytes=0)
    # One-shot: a pass runs in this process rather than in a pool started for it, unless
    # `--pool` asks for a worker's isolation.
    in_process = not args.pool
    engine = TrackedEngine(create_engine(config, args.engine, in_process=in_process), progress)
    signals: list[int] = []
    try:
        # The engine stops before the log dirs are released: no pass outlives the locks.
        readers = functools.partial(
            ReaderPool.for_this_host, config.logging.format, config.logging.level
        )
        with Maintenance(
            config, engine, clock=clock, topics=topics, readers=readers
        ) as maintenance:
            try:
                with _stopped_by_signals(signals) as stop:
                    report = maintenance.run_once(stop)
                for signum in signals[:1]:
                    log.warning("clean.interrupted", signal=signal.Signals(signum).name)
            except BaseException:  # a second Ctrl-C too: the passes stop before their swap
                engine.shutdown(abort=True)
                raise
            engine.shutdown()
            # A dir the config says to own, held by another process (a broker): not
            # cleaned, and the exit status says so.
            held = any(d.held_by is not None for d in maintenance.log_dirs)
            # What a clean stop leaves (flushed, snapshots, checkpoints, Kafka's marker),
            # so the next open of these dirs reads no segment it need not.
            stop_errors = [str(exc) for exc in maintenance.checkpoint(clean_stop=True)]
            for error in stop_errors:
                log.error("shutdown.checkpoint_failed", error=error)
            unlinked = maintenance.close(unlink_pending=True)
    except BaseException:
        if progress.segments_total:
            progress.finish(failed=True)
        raise
    if progress.segments_total:
        progress.finish(failed=bool(signals))
    if args.json:
        doc = report.to_json()
        doc["unlinked"] += [str(p) for p in unlinked]
        doc["stop_errors"] = stop_errors
        print(json.dumps(doc, indent=1))
    else:
        print("\n".join(render_text(report, stop_errors)))
    if signals:  # interrupted: as a process a signal ends exits, the report printed first
        return 128 + signals[0]
    return 1 if report.failed or report.errors or report.offline or held or stop_errors else 0


@contextmanager
def _stopped_by_signals(received: list[int]) -> Iterator[threading.Event]:
    """While the cycle runs, SIGINT (Ctrl-C) and SIGTERM stop it as they stop the
    daemon's (`run_once`'s `stop`): the passes in flight are aborted, their logs left as
    they were, the steps not begun skipped, and the command still writes its clean stop
    and prints what it did. Yields the event; the signals go to `received`; a second one
    leaves at once (KeyboardInterrupt). The handlers before come back after."""
    stop = threading.Event()

    def handle(signum: int, _frame: FrameType | None) -> None:
        # Nothing logged here: the handler runs between two bytecodes of the main
        # thread, which may hold the log stream's lock (a deadlock; said after the cycle).
        if stop.is_set():
            raise KeyboardInterrupt
        received.append(signum)
        stop.set()

    if threading.current_thread() is not threading.main_thread():
        yield stop  # `main` called from a thread (tests): no handler to set
        return
    kinds = (signal.SIGINT, signal.SIGTERM)
    before = {kind: signal.signal(kind, handle) for kind in kinds}
    try:
        yield stop
    finally:
        for kind, handler in before.items():
            signal.signal(kind, handler)
