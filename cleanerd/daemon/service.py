"""`cleanerd run`: the daemon's lifecycle, startup -> main loop -> shutdown (uvicorn's shape).

Threads and what each may touch:

- the **event loop** (uvloop) runs the main loop, signal handlers, MQTT, reloads and the
  metrics refresh timer; it never reads or writes a log dir itself;
- the **maintenance thread** (one thread, so `Maintenance`, which is not thread-safe,
  is only ever driven from it) opens the log dirs (taking their `.lock`s), runs each
  cycle (`Maintenance.run_once`: rolls, retention, disk usage, then cleaning with the
  engine's worker processes), applies a reloaded config between cycles, and at shutdown
  writes the checkpoints and releases the locks;
- the cycle tells the loop what it did as it goes (`Maintenance.on_news`, through
  `call_soon_threadsafe`): the events of a pass or a deletion go out when it ends, not
  when the cycle does;
- **short-lived executor threads** run the watcher's scan, the per-tick disk-usage probe
  (one statvfs per device) and the metrics snapshot build, on immutable inputs.

When a cycle runs. A cycle over every partition costs CPU in proportion to the partition
count even when nothing changed, so the daemon does not repeat it blindly: it runs one at
startup, then whenever one of these holds (`cycle_due`):

- a command or a reload asked for one, or a device went above
  `log.retention.disk.usage.percent` (probed every tick; while a cycle's passes run on,
  the cycle is asked to run its deletion steps beside them instead, `Maintenance.interject`,
  and keeps its time rules going itself);
- a pass of the previous cycle made progress (more may be eligible);
- a compacted partition's max-lag deadline (active segment counted) has come;
- a time rule falls due (`CycleReport.next_due_ms`): a `segment.ms` or max-lag roll,
  `retention.ms` reaching the oldest segment, a delete horizon or the min lag passing, a
  `.deleted` file's `file.delete.delay.ms`; so each acts within a tick plus one cycle of
  its due time, and a reload (which asks for a cycle) recomputes them all. When they
  (or max-lag deadlines) fall due one after another, the next cycle waits nine times the
  last one's length, at most `log.cleaner.backoff.ms` (`steps.due_wait_ms`): a tenth of a
  core, not all of it;
- after `log.cleaner.backoff.ms` since the previous cycle: the watcher saw partitions,
  segments, appends or a log start offset change (changes the daemon made itself do not
  count); a device is still above its threshold; or a partition is past its deadline but
  its dirty data still waits for its roll or a blocking bound;
- `log.retention.check.interval.ms` has passed since the previous cycle: the revisit, a
  safety net for what neither a deadline nor a scan sees (a clock step, a file changed
  in place without moving its size or mtime).

After a cycle that failed whole, only a request starts one before `retry_wait_ms` has
passed (`log.cleaner.backoff.ms`, at least a second, doubled for each failure in a row, up
to the revisit interval): what failed it would fail the next at once, at every tick.

Lifecycle and signals:

- startup: check the configured dirs (`config.check_paths`, so an unusable one is
  reported by its key; the daemon starts unless the state dir or every log dir is
  unusable, the others going offline), bind the metrics endpoint (before a log dir is
  touched: a port clash changes nothing on disk; one with another daemon that owns a
  log dir of this state dir is named as that owner), open the log dirs, start MQTT (in the
  background: a missing broker never delays startup), first watcher scan, then `READY=1`;
- SIGHUP (or the `reload` command): `RELOADING=1` with `MONOTONIC_USEC`, read and validate
  the whole file (`reload.plan_reload`), apply it or keep the old one, `READY=1`;
- SIGTERM, SIGINT: `STOPPING=1`; stop taking work; passes in flight are aborted at their
  next segment boundary (the pass removes its `.cleaned` output, originals untouched),
  bounded by `shutdown_timeout_s`; recovery-point and log-start-offset checkpoints are
  written, the locks released, exit 0. A second SIGINT forces exit without waiting.
- `WATCHDOG=1` is sent from the main loop itself while it is healthy, so a stuck loop or
  a cycle that keeps failing stops the pings and systemd restarts the service.
- commands, from the event loop, through the two thread-safe hooks of the maintenance
  state: `clean` asks for a forced pass (`LogCleanerManager.force`: first in the next
  cycle, whatever the dirty ratio, if there is anything to clean) and requests a cycle;
  `pause` sets `Maintenance.drain` (the running cycle starts no new pass, those in
  flight finish, no abort), and until `resume` clears it the cycles only read the
  partitions' states (`run_once(act=False)`: no roll, retention, pass or delayed
  deletion, no time-rule deadline), so the delay gauges keep following what is
  written; a reload asks the maintenance state to try the uncleanable partitions again
  (`Maintenance.reloaded`).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final, TypeVar

import structlog
from pydantic import JsonValue

from cleanerd._jit import compiled_kernels_on
from cleanerd.clock import wall_clock_ms
from cleanerd.config import Config, check_paths, load_config
from cleanerd.daemon import hangup
from cleanerd.daemon.commands import (
    CleanCommand,
    Command,
    CommandRejected,
    PauseCommand,
    ReloadCommand,
    ResumeCommand,
)
from cleanerd.daemon.events import EventKind, EventPublisher, make_publisher
from cleanerd.daemon.metrics.exporter import MetricsExporter
from cleanerd.daemon.metrics.model import build_snapshot
from cleanerd.daemon.reload import ReloadPlan, diff_configs, plain, plan_reload
from cleanerd.daemon.reporting import Reporter
from cleanerd.daemon.systemd import Notifier, watchdog_interval
from cleanerd.daemon.triggers import (
    CycleClock,
    CycleTrigger,
    Deadlines,
    cycle_due,
    deadlines,
    touched_partitions,
)
from cleanerd.daemon.watcher import LogDirWatcher, PartitionKey, WatchDelta
from cleanerd.engine import Engine, create_engine
from cleanerd.engine.first_reads import ReaderPool
from cleanerd.engine.lifeline import owner_env
from cleanerd.errors import CleanerdError, ConfigError, LogDirLockedError
from cleanerd.log.files import TopicPartition
from cleanerd.log.ownership import Holder
from cleanerd.log_setup import configure_logging, partition_context
from cleanerd.maintenance.cycle import Maintenance, MaintenanceStatus
from cleanerd.maintenance.report import CycleNews, CycleReport, made_progress
from cleanerd.retention.disk import Device, group_devices, is_above, measure
from cleanerd.retention.disk_usage import DeviceUsage
from cleanerd.wording import count

log = structlog.get_logger("cleanerd.service")

BUILD_KERNELS_COMMAND: Final = (sys.executable, "-m", "cleanerd", "build-kernels", "--background")
"""What the daemon runs after its first cycle (`_build_kernels`)."""

T = TypeVar("T")

FORCED_EXIT: Final = 130
"""Exit status after a second SIGINT (128 + SIGINT, as a shell reports it)."""
OWNER_POLL_S: Final = 0.2
"""How often the start looks again at a log dir a one-shot cleanerd command owns."""
MAX_CYCLE_FAILURES: Final = 3
"""Cycles in a row that may fail with an unexpected error before the watchdog stops."""


class ServiceState(enum.Enum):
    """Where the daemon is in its lifecycle."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class CycleOutcome:
    """A cycle's report and a copy of the maintenance state the metrics read, taken in
    the maintenance thread so the loop never reads state that thread mutates."""

    report: CycleReport
    status: MaintenanceStatus
    changes: WatchDelta
    """The watcher's scan right after the cycle (so the next one starts from there)."""


@dataclass(frozen=True, slots=True)
class Timings:
    """The daemon's own intervals (the config's intervals are read from the config)."""

    tick_s: float = 1.0
    """Main loop period: disk probe, watchdog, timers."""
    shutdown_timeout_s: float = 30.0
    """How long shutdown waits for aborted passes (below systemd's TimeoutStopSec=60s)."""
    watch_min_interval_s: float = 2.0
    watch_max_duty: float = 0.005
    progress_interval_s: float = 5.0
    """A cycle running longer logs `cycle.progress` this often."""
    owner_wait_s: float = 60.0
    """How long the start waits for a one-shot cleanerd command (a `produce`, a `clean`)
    that owns a log dir to let go (below systemd's TimeoutStartSec=120s)."""


class Daemon:
    """The service; see the module docstring. `serve()` runs it until a stop signal.

    Args:
        config: the validated config the daemon starts with.
        config_path: the file SIGHUP re-reads (None: the embedded default).
        notifier: sd_notify sender (a no-op outside systemd).
        clock_ms: wall-clock milliseconds, the instant every time rule is evaluated at.
        engine_factory: builds the cleaning engine from a config.
        timings: the daemon's own intervals.
        host: the name in MQTT topics (default: the host name).
    """

    def __init__(
        self,
        config: Config,
        *,
        config_path: Path | None,
        notifier: Notifier | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        engine_factory: Callable[[Config], Engine] = create_engine,
        timings: Timings = Timings(),
        host: str | None = None,
    ) -> None:
        self.config = config
        self.config_path = config_path
        self.notifier = notifier if notifier is not None else Notifier()
        self.clock_ms = clock_ms
        self.timings = timings
        self.host = host
        self._engine_factory = engine_factory
        self.state = ServiceState.STARTING
        self.should_exit = False
        self.force_exit = False
        self.abandoned = False
        """Shutdown gave up waiting for the maintenance thread (forced, or past the
        timeout): the process must exit without joining it."""
        self.failed_at_shutdown = False
        """A checkpoint could not be written at shutdown (exit status 1)."""
        self.paused = False
        self.started = asyncio.Event()
        self.exporter = MetricsExporter(config.metrics)
        self.watcher = LogDirWatcher(
            config.log_dirs,
            max_duty=timings.watch_max_duty,
            min_interval_s=timings.watch_min_interval_s,
        )
        self.publisher = self._new_publisher(config)
        self.reporter = Reporter(self.exporter, lambda: self.publisher, clock_ms)
        self.maintenance: Maintenance | None = None
        self.last_outcome: CycleOutcome | None = None
        self.cycles = 0
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="maintenance")
        self._abort = threading.Event()
        self._wake = asyncio.Event()
        self._reload_lock = asyncio.Lock()
        self._reload_wanted = False
        self._cycle_task: asyncio.Task[None] | None = None
        self._hand_over: asyncio.Task[None] | None = None
        """The last MQTT connection hand-over a reload started (`_replace_publisher`)."""
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cycle_requested = False
        self._changed = False
        self.cycle_failures = 0
        self._idle_cycles = 0
        """Idle cycles since the last `cycle.done` line at info."""
        self._last_cycle_end_ms: int | None = None
        self._looked_ms: int | None = None
        """The last tick that found no cycle due (see `_last_look_ms`)."""
        self._last_cycle_ms = 0
        self._deadlines = Deadlines()
        self._devices: tuple[Device, ...] = ()
        self._present: frozenset[tuple[Path, int]] = frozenset()
        """The log dirs the last disk probe found, each with its device."""
        self._usage: tuple[DeviceUsage, ...] = ()
        self._above: frozenset[int] = frozenset()
        self._interjected_ms: int | None = None
        """When the running cycle was last asked to run its deletion steps beside its
        passes (`_interject_on_pressure`); None: at the next tick."""
        self._probe_ok = True
        self._next_scan = 0.0
        self._next_metrics = 0.0
        self._next_watchdog = 0.0
        self._watchdog_s: float | None = None
        self._events_base = (0, 0)
        self._taken: tuple[CycleReport, MaintenanceStatus] | None = None
        """The report and maintenance status of the last cycle that took its partitions'
        states (told then, before its passes; replaced by the whole report at its end):
        the partition metrics show those states. The other numbers come from the last
        cycle that ended (a cycle's failed steps and marks are known at its end), or
        from this until the first one ends."""
        self._snapshot_source: tuple[tuple[CycleReport, MaintenanceStatus], int] | None = None
        """The `_taken` and the count of later states the last snapshot was built of (a
        cycle's end replaces `_taken` and `last_outcome` together)."""
        self._unreadable: frozenset[str] = frozenset()

    # -- signals ----------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        """Route SIGTERM, SIGINT and SIGHUP to `handle_<name>` on the running loop; a
        SIGHUP that came before (`hangup.hold`) is handled now."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, self.handle_signal, sig)
        if hangup.take():
            self.handle_hup()

    def remove_signal_handlers(self) -> None:
        """Give the signals back to their default handling."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)

    def handle_signal(self, sig: int) -> None:
        """Dispatch `sig` to `handle_term`, `handle_int` or `handle_hup`."""
        name = signal.Signals(sig).name.removeprefix("SIG").lower()
        getattr(self, f"handle_{name}")()

    def handle_term(self) -> None:
        """Stop: no new work, abort passes in flight, checkpoint, exit 0."""
        self._request_exit("SIGTERM")

    def handle_int(self) -> None:
        """As SIGTERM; a second one forces exit without waiting for passes."""
        if self.should_exit:
            self.force_exit = True
            log.warning("shutdown.forced")
            self._wake.set()
            return
        self._request_exit("SIGINT")

    def handle_hup(self) -> None:
        """Re-read the config (coalesced: several SIGHUPs during a reload give one more)."""
        self._reload_wanted = True
        self._wake.set()

    def _request_exit(self, why: str) -> None:
        first = not self.should_exit
        # The stop is recorded before it is logged: no failure to log may lose it.
        self.should_exit = True
        self._abort.set()
        self._wake.set()
        if first:
            log.info("shutdown.requested", signal=why)

    # -- serve ------------------------------------------------------------------------------

    async def serve(self) -> int:
        """Run startup, the main loop and shutdown; the exit status (0 after a clean
        stop, 1 if startup failed or shutdown had to abandon work in flight, 130 after a
        forced exit)."""
        self.install_signal_handlers()
        try:
            try:
                await self.startup()
            except (CleanerdError, OSError) as exc:
                log.error("startup.failed", error=str(exc))
                await self.shutdown()
                return 1
            await self.main_loop()
            await self.shutdown()
        finally:
            self.remove_signal_handlers()
        if self.force_exit:
            return FORCED_EXIT
        return 1 if self.abandoned or self.failed_at_shutdown else 0

    async def startup(self) -> None:
        """Check the log dirs, bind the metrics endpoint, open the log dirs, start MQTT,
        first scan, READY."""
        cfg = self.config
        log.info(
            "startup.begin",
            log_dirs=[str(p) for p in cfg.log_dirs],
            mode=cfg.mode,
            config=str(self.config_path) if self.config_path else "embedded default",
        )
        # A log dir unusable beside usable ones goes offline with the others maintained,
        # and is tried again every cycle; Maintenance reports it in the same words.
        await asyncio.to_thread(check_paths, cfg, path=self.config_path)
        # Bound before a log dir is opened: opening one takes Kafka's clean-shutdown
        # marker, so a port clash found after it would cost the next start (cleanerd's
        # or a broker's) a full recovery. Until the first refresh a scrape gets the
        # service's own families.
        try:
            self.exporter.start()
        except OSError as exc:
            # Most often a second daemon of the same config, whose endpoint holds the
            # port: named as the open would name it, not by the port it also holds.
            refused = await asyncio.to_thread(self._owned_by_another_daemon)
            if refused is not None:
                raise refused from exc
            raise
        await asyncio.to_thread(self._wait_for_one_shot_owners)
        if self.should_exit:
            return  # stopped while it waited: nothing was opened
        loop = asyncio.get_running_loop()
        self.maintenance = await self._in_thread(lambda: self._open_maintenance(loop))
        self._devices = await asyncio.to_thread(group_devices, cfg.log_dirs)
        self._present = _placed(self._devices)
        await self.publisher.start()
        self.watcher.seed({str(d.path): d.known_dirs for d in self.maintenance.log_dirs})
        await asyncio.to_thread(self.watcher.scan)
        self._watchdog_s = watchdog_interval()
        self.state = ServiceState.RUNNING
        self.started.set()
        status = self._status_line()
        self.notifier.ready(status)
        log.info("startup.done", status=status, metrics=self._metrics_address())

    def _wait_for_one_shot_owners(self) -> None:
        """Wait, up to `Timings.owner_wait_s` or a stop, while a one-shot cleanerd command
        (an application's `produce`, a `clean`) owns one of the log dirs: it lets go in
        moments, where another daemon does not (the open refuses that one at once). No
        dir is opened meanwhile, so none loses its clean-shutdown marker to a retry."""
        if self.config.observe:
            return  # nothing is owned: nothing to wait for
        deadline: float | None = None
        while not self.should_exit:
            waiting = [h for h in map(self._holder, self.config.log_dirs) if h and h.ends_by_itself]
            if not waiting:
                return
            if deadline is None:
                deadline = time.monotonic() + self.timings.owner_wait_s
                h = waiting[0]
                log.info("startup.waiting_for_owner", log_dir=str(h.log_dir), holder=h.described)
            elif time.monotonic() >= deadline:
                return  # the open leaves it offline, tried again every cycle
            time.sleep(OWNER_POLL_S)

    def _owned_by_another_daemon(self) -> LogDirLockedError | None:
        """The refusal the open gives for the first log dir that another cleanerd daemon
        of this state dir owns; None when none does (or nothing is to be owned)."""
        if self.config.observe:
            return None
        for log_dir in self.config.log_dirs:
            h = self._holder(log_dir)
            if h is not None and h.cleanerd and not h.ends_by_itself:
                return LogDirLockedError(log_dir, h.refusal())
        return None

    def _holder(self, log_dir: Path) -> Holder | None:
        """Who holds `log_dir`; None when it cannot be looked at (the open says why)."""
        try:
            return Holder.of(log_dir, self.config.state_dir)
        except OSError:
            return None

    def _open_maintenance(self, loop: asyncio.AbstractEventLoop) -> Maintenance:
        engine = self._engine_factory(self.config)
        try:
            return Maintenance(
                self.config,
                engine,
                clock=self.clock_ms,
                progress_interval_s=self.timings.progress_interval_s,
                readers=functools.partial(
                    ReaderPool.for_this_host, self.config.logging.format, self.config.logging.level
                ),
                on_news=functools.partial(self._told, loop),
            )
        except BaseException:
            engine.shutdown()
            raise

    def _told(self, loop: asyncio.AbstractEventLoop, news: CycleNews) -> None:
        """From the maintenance thread: report what the running cycle did so far (with
        the maintenance status, taken here, once it took its partitions' states)."""
        m = self.maintenance
        status = m.status() if news.taken is not None and m is not None else None
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens
            loop.call_soon_threadsafe(self._hear, news, status)

    def _hear(self, news: CycleNews, status: MaintenanceStatus | None) -> None:
        self.reporter.happened(news, workers=self.config.log_cleaner_threads)
        if news.taken is not None and status is not None:
            self._taken = (news.taken, status)
            self._next_metrics = 0.0  # publish the states at the next tick

    async def main_loop(self) -> None:
        """Tick until asked to stop; a tick only starts background work and never waits
        for it, so signals, commands and the watchdog stay prompt."""
        while not self.should_exit:
            self.on_tick()
            if self.should_exit:
                break
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.timings.tick_s):
                    await self._wake.wait()

    def on_tick(self) -> None:
        """Housekeeping: reload, watchdog, watcher, disk probe, metrics, cycle. Each piece
        of background work runs as its own task, one at a time per kind."""
        now = time.monotonic()
        # Until the last reload's task is gone (its done callback comes a loop turn after
        # its lock is released), a new one cannot be spawned: the wish waits for it.
        if self._reload_wanted and "reload" not in self._tasks and not self._reload_lock.locked():
            self._reload_wanted = False
            self._spawn("reload", self._reload_task)
        if self._watchdog_s is not None and now >= self._next_watchdog and self.healthy():
            self.notifier.watchdog()
            self._next_watchdog = now + self._watchdog_s
        if now >= self._next_scan:
            self._spawn("watch", self._scan)
        self._spawn("disk-probe", self._probe_disks)
        if now >= self._next_metrics:
            self._next_metrics = now + self.config.metrics.refresh_interval_s
            self._spawn("metrics", self._refresh_metrics)
        self._maybe_start_cycle()

    def healthy(self) -> bool:
        """Whether the watchdog may ping: cycles do not keep failing."""
        return self.cycle_failures < MAX_CYCLE_FAILURES

    def _spawn(self, name: str, work: Callable[[], Coroutine[object, object, None]]) -> None:
        """Run `work()` as a task named `name`, unless one by that name still runs."""
        if name in self._tasks:
            return
        task = asyncio.create_task(work(), name=name)
        self._tasks[name] = task
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task.get_name(), None)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("task.failed", task=task.get_name(), exc_info=exc)

    async def _build_kernels(self) -> None:
        """`cleanerd build-kernels --background` in a process of its own, once per
        daemon, after its first cycle ran the kernels (filling numba's cache with their
        signatures): a restart, and `plan`, `clean` and `audit` run with this cache dir,
        then load the compiled kernels instead of numba (`cleanerd._aot`). A module
        already built from the same sources and signatures is kept as it is."""
        proc = await asyncio.create_subprocess_exec(
            *BUILD_KERNELS_COMMAND,
            env={**os.environ, **owner_env()},  # dies with this process (`lifeline`)
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own process group: its warm-up process too
        )
        try:
            output, _ = await proc.communicate()
        except asyncio.CancelledError:
            # A stop: the whole group goes (a warm-up left running would work on for
            # seconds after the daemon exited). The build renames its files in last;
            # the next one removes the scratch this one leaves.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            raise
        said = output.decode(errors="replace").strip()
        if proc.returncode == 0:
            log.info("kernels.built", result=said.rpartition("\n")[2])  # the module's line
        else:
            # All of it: a failed warm-up is said before the build's own last line.
            log.warning(
                "kernels.build_failed",
                status=proc.returncode,
                error=said,
                consequence="each process loads its kernels through numba",
            )

    async def _in_thread(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn)

    # -- the watcher and the disk probe -----------------------------------------------------

    async def _scan(self) -> None:
        """One watcher scan, on the maintenance thread: scans never overlap a cycle,
        which rescans itself when it ends."""
        try:
            if self._cycle_task is None:
                self._on_delta(await self._in_thread(self.watcher.scan))
        finally:
            self._next_scan = time.monotonic() + self.watcher.next_interval_s

    def _on_delta(self, delta: WatchDelta, *, own: frozenset[PartitionKey] = frozenset()) -> None:
        """Log partitions that came or went and log dirs that cannot be read; remember
        changes the daemon did not make."""
        for key in delta.added_partitions:
            log.info(
                "partition.found",
                topic=key.tp.topic,
                partition=key.tp.partition,
                log_dir=key.log_dir,
            )
        for key in delta.removed_partitions:
            log.info(
                "partition.gone",
                topic=key.tp.topic,
                partition=key.tp.partition,
                log_dir=key.log_dir,
            )
        if delta.partitions() - own or delta.start_offsets:
            self._changed = True
        unreadable = frozenset(self.watcher.snapshot.unreadable_log_dirs)
        m = self.maintenance
        offline = {str(p) for p in m.offline_dirs} if m is not None else set()
        for path in sorted(unreadable - self._unreadable - offline):
            # (An offline dir is said by the cycle, with why: `log_dir.offline`.)
            log.error("log_dir.unreadable", log_dir=path)
        self._unreadable = unreadable

    async def _probe_disks(self) -> None:
        percent = self.config.log_retention_disk_usage_percent
        # Grouped anew at each probe: a log dir whose disk was mounted again is on
        # another device, and one missing at the start may have come.
        self._devices = await asyncio.to_thread(group_devices, self.config.log_dirs)
        present = _placed(self._devices)
        m = self.maintenance
        came = {d for d, _ in present - self._present}  # new, or on another device
        if m is not None and came & set(m.offline_dirs):
            self.request_cycle()  # an offline dir came (its disk mounted): take it now
        self._present = present
        if not self._devices:
            return
        try:
            usage = await asyncio.to_thread(measure, self._devices, percent)
        except OSError as exc:
            if self._probe_ok:  # log the first failure, not one a second
                log.error("disk.probe_failed", error=str(exc))
            self._probe_ok = False
            return
        self._probe_ok = True
        self._usage = usage
        above = frozenset(u.device for u in usage if is_above(u))
        for u in usage:
            if u.device in above and u.device not in self._above:
                self.reporter.disk_pressure(u)
        if above - self._above:
            self.request_cycle()  # a threshold crossing acts at once
            self._interjected_ms = None  # beside a running cycle's passes too
        self._above = above

    # -- cycles -----------------------------------------------------------------------------

    def request_cycle(self) -> None:
        """Run a cycle as soon as none is running."""
        self._cycle_requested = True
        self._wake.set()

    def _maybe_start_cycle(self) -> None:
        # Paused, cycles still run, to read the partitions' states only (`run_once`'s
        # `act`): the delay gauges keep following what is written during a pause.
        if self._cycle_task is not None:
            self._interject_on_pressure()
            return
        if self.should_exit:
            return
        last = self.last_outcome
        clock = CycleClock(
            now_ms=self.clock_ms(),
            last_end_ms=self._last_cycle_end_ms,
            last_cleaned=last is not None and any(map(made_progress, last.report.cleaned)),
            changed=self._changed,
            next_deadline_ms=self._deadlines.next_ms,
            next_due_ms=self._deadlines.due_ms,
            overdue=self._deadlines.overdue,
            disk_pressure=bool(self._above),
            requested=self._cycle_requested,
            failures_in_a_row=self.cycle_failures,
            last_length_ms=self._last_cycle_ms,
        )
        trigger = cycle_due(
            clock,
            backoff_ms=self.config.log_cleaner_backoff_ms,
            revisit_ms=self.config.log_retention_check_interval_ms,
        )
        if trigger is None:
            if not self.paused:
                self._looked_ms = clock.now_ms
            return
        self._cycle_requested = False
        self._changed = False
        self._interjected_ms = clock.now_ms  # the cycle runs the disk-usage step itself
        self._cycle_task = asyncio.create_task(self._cycle(trigger), name="cycle")

    def _interject_on_pressure(self) -> None:
        """While a cycle's passes run on, a device above its threshold has the cycle run
        its deletion steps beside them (`Maintenance.interject`): at once when the device
        went above, then every `log.cleaner.backoff.ms` while it stays there, as cycles
        would. (The time rules the cycle keeps itself.)"""
        m = self.maintenance
        if m is None or not self._above or self.paused or self.should_exit:
            return
        now = self.clock_ms()
        last = self._interjected_ms
        if last is not None and now - last < self.config.log_cleaner_backoff_ms:
            return
        self._interjected_ms = now
        m.interject()

    async def _cycle(self, trigger: CycleTrigger) -> None:
        config, act = self.config, not self.paused
        started = time.monotonic()
        try:
            outcome = await self._in_thread(lambda: self._run_cycle(config, act=act))
        except Exception:
            self.cycle_failures += 1
            log.exception("cycle.failed", failures_in_a_row=self.cycle_failures)
            outcome = None
        finally:
            self._cycle_task = None
            self._last_cycle_end_ms = self.clock_ms()
            self._last_cycle_ms = round((time.monotonic() - started) * 1000)
            self._wake.set()
        self.exporter.record_cycle(outcome is not None)
        if outcome is None:
            return
        self.cycle_failures = 0
        self.cycles += 1
        self.last_outcome = outcome
        self._taken = (outcome.report, outcome.status)
        if self.cycles == 1 and compiled_kernels_on():
            self._spawn("build-kernels", self._build_kernels)
        report = outcome.report
        marked = frozenset(
            tp for d in self.config.log_dirs for tp in outcome.status.uncleanable.in_dir(str(d))
        )
        self._deadlines = deadlines(report, uncleanable=marked)
        self._on_delta(outcome.changes, own=touched_partitions(outcome.report))
        disk = report.disk_usage
        fields = {
            "trigger": trigger.value,
            "duration_s": round(time.monotonic() - started, 3),
            "partitions": len(self.watcher.snapshot.partitions),
            "rolled": len(report.rolled),
            "deleted": sum(len(o.deletions) for o in report.retention),
            "disk_deleted": len(disk.deleted) if disk is not None else 0,
            "cleaned": len(report.cleaned),
            "failed": len(report.failed),
            "errors": len(report.errors),
            "unlinked": len(report.unlinked),
            "aborted": report.aborted,
        }
        if disk is not None and disk.dry_run:
            fields["disk_would_delete"] = len(disk.deletions)
        if report.idle and self.cycles > 1:
            # An idle cycle (the watcher's, the safety net's) says nothing new: at debug,
            # counted on the next line that reports work, so a quiet daemon's log is not
            # one identical line per interval. The first cycle is always reported.
            self._idle_cycles += 1
            log.debug("cycle.done", **fields)
        else:
            log.info("cycle.done", **fields, idle_cycles_before=self._idle_cycles)
            self._idle_cycles = 0
        self._next_metrics = 0.0  # publish the new states at the next tick
        maintenance = self.maintenance
        if maintenance is not None:
            # After the cycle is reported: what it costs delays no state or metric.
            try:
                await self._in_thread(maintenance.keep_known)
            except Exception:  # an aid to the next start: never the daemon's end
                log.exception("known_segments.keep_failed")

    def _run_cycle(self, config: Config, *, act: bool) -> CycleOutcome:
        """One cycle, in the maintenance thread, with `config` applied first (only the
        states without `act`: see `Maintenance.run_once`)."""
        m = self.maintenance
        assert m is not None
        if m.config is not config:
            m.reconfigure(config, self._engine_factory)
        report = m.run_once(self._abort, act=act)
        return CycleOutcome(report, m.status(), self.watcher.scan())

    # -- events and metrics -----------------------------------------------------------------

    def emit(
        self,
        kind: EventKind,
        data: dict[str, JsonValue],
        *,
        tp: TopicPartition | None = None,
        log_dir: str | None = None,
    ) -> None:
        """Queue an event (`Reporter.emit`)."""
        self.reporter.emit(kind, data, tp=tp, log_dir=log_dir)

    async def _refresh_metrics(self) -> None:
        """Publish the metrics model. The partition part is rebuilt only when a cycle
        ended or a later state was told (`Reporter.states`); otherwise the last snapshot
        gets fresh device usage and, once some delay grows with the clock (a partition
        past a compaction deadline or with data past `retention.ms`, in an observed dir
        too, where no cycle comes to meet it), its delays aged from their deadlines
        (`MetricsSnapshot.aged`), which keeps an idle daemon with thousands of
        partitions cheap."""
        self._record_events()
        taken, outcome, config, usage = self._taken, self.last_outcome, self.config, self._usage
        if taken is None:
            return
        report, status = taken if outcome is None else (outcome.report, outcome.status)
        status = replace(status, last_run_ms=self._last_look_ms(status.last_run_ms))
        now = self.clock_ms()
        last = self.exporter.snapshot
        told = self.reporter.later_count
        built = self._snapshot_source
        if last is None or built is None or built[0] is not taken or built[1] != told:
            snapshot = await asyncio.to_thread(
                self.reporter.snapshot,
                report,
                self.reporter.states(taken[0]),
                status,
                now_ms=now,
                log_dirs=[str(p) for p in config.log_dirs],
                usage=usage,
                device_dirs=self._device_dirs(),
            )
            self._snapshot_source = (taken, told)
        else:
            devices = build_snapshot(
                now_ms=now, partitions=(), devices=usage, device_log_dirs=self._device_dirs()
            ).devices
            ageing = last.ageing_from_ms
            if ageing is not None and now >= ageing:
                last = last.aged(now, partitions=config.metrics.per_partition)
            snapshot = replace(last, now_ms=now, devices=devices, last_run_ms=status.last_run_ms)
        self.exporter.update(snapshot)

    def _last_look_ms(self, grabbed_ms: int | None) -> int | None:
        """When the cleaner last looked for work, Kafka's `time-since-last-run-ms` reading
        from it: the last cycle's look (`grabbed_ms`, None while no worker ever looked: in
        observe mode, or with cleaning off), or a tick since that found no cycle due,
        which is a look too: between cycles the deadlines say what would make a log
        eligible, as a broker's idle cleaner thread looks every `log.cleaner.backoff.ms`.
        A paused daemon does not look. So an idle daemon reads about a tick, not up to a
        `log.retention.check.interval.ms`, where a Kafka alert fires."""
        if grabbed_ms is None or self._looked_ms is None:
            return grabbed_ms
        return max(grabbed_ms, self._looked_ms)

    def _device_dirs(self) -> dict[int, list[str]]:
        return {d.device: [str(p) for p in d.log_dirs] for d in self._devices}

    def _record_events(self) -> None:
        published, dropped = self._events_base
        p = self.publisher
        connected = p.connected if self.config.mqtt.enabled else None
        self.exporter.record_events(published + p.published, dropped + p.dropped, connected)

    def _metrics_address(self) -> str | None:
        address = self.exporter.address
        if address is None:
            return None
        host = f"[{address[0]}]" if ":" in address[0] else address[0]  # an IPv6 address
        return f"{host}:{address[1]}"

    def _status_line(self) -> str:
        partitions = len(self.watcher.snapshot.partitions)
        dirs = len(self.config.log_dirs)
        state = "paused" if self.paused else "watching"
        m = self.maintenance
        observed = len(m.observed_dirs) if m is not None else 0
        offline = len(m.offline_dirs) if m is not None else 0
        only = f" ({observed} observed only: nothing is written there)" if observed else ""
        only += f" ({offline} offline: left alone until readable)" if offline else ""
        return f"{state} {count(dirs, 'log dir')}{only}, {count(partitions, 'partition')}"

    # -- commands ---------------------------------------------------------------------------

    async def on_command(self, command: Command) -> None:
        """Carry out a validated MQTT command; raise CommandRejected to refuse it."""
        if self.should_exit:
            raise CommandRejected("the daemon is shutting down")
        if isinstance(command, CleanCommand):
            self._clean_command(TopicPartition(command.topic, command.partition), command.id)
        elif isinstance(command, PauseCommand):
            self.paused = True
            self.exporter.record_paused(True)
            if self.maintenance is not None:
                # The running cycle picks no new partition; its passes in flight finish.
                self.maintenance.drain.set()
            log.info("cleaning.paused")
            self.notifier.status(self._status_line())
        elif isinstance(command, ResumeCommand):
            self.paused = False
            self.exporter.record_paused(False)
            if self.maintenance is not None:
                self.maintenance.drain.clear()
            log.info("cleaning.resumed")
            self.notifier.status(self._status_line())
            self.request_cycle()
        elif isinstance(command, ReloadCommand):
            errors = await self.reload()
            if errors:
                raise CommandRejected("config refused: " + "; ".join(errors))

    def _clean_command(self, tp: TopicPartition, request_id: str | None) -> None:
        where = [k.log_dir for k in self.watcher.snapshot.partitions if k.tp == tp]
        if not where:
            raise CommandRejected(f"partition {tp} does not exist in any log dir")
        if self.paused:
            raise CommandRejected("cleaning is paused (send resume first)")
        m = self.maintenance
        if m is None:
            raise CommandRejected("the daemon is starting")
        try:
            m.request_clean(tp, where, request_id)
        except ConfigError as exc:
            raise CommandRejected(exc.reason) from None
        except CleanerdError as exc:
            raise CommandRejected(str(exc)) from None
        with partition_context(tp.topic, tp.partition, where[0]):
            log.info("clean.requested")
        self.request_cycle()

    # -- reload -----------------------------------------------------------------------------

    async def _reload_task(self) -> None:
        await self.reload()

    async def reload(self) -> list[str]:
        """Re-read the config file; apply what can change live. Returns the errors ([]
        when the new config runs). Serialised: one reload at a time."""
        async with self._reload_lock:
            self.notifier.reloading("reloading configuration")
            try:
                return await self._reload()
            finally:
                self.notifier.ready(self._status_line())

    async def _reload(self) -> list[str]:
        where = str(self.config_path) if self.config_path else "embedded default"
        try:
            new = await asyncio.to_thread(load_config, self.config_path)
        except ConfigError as exc:
            log.error("config.reload_failed", path=where, errors=exc.errors)
            self.exporter.record_reload(False)
            self.emit(
                "config.reloaded",
                {
                    "successful": False,
                    "changed": [],
                    "restart_required": [],
                    "errors": list[JsonValue](exc.errors),
                },
            )
            return list(exc.errors)
        plan = plan_reload(self.config, new)
        for change in plan.refused:
            log.warning(
                "config.restart_required",
                key=change.name,
                running=plain(change.old),
                in_file=plain(change.new),
            )
        previous = self.config
        config, errors = await self._apply(plan)
        self.config = config
        self.exporter.record_reload(not errors)
        # What runs now differs from before in what applied: not the refused keys, nor
        # a part that failed and kept its old settings.
        changed = [c.name for c in diff_configs(previous, config)]
        refused = [c.name for c in plan.refused]
        fields = {
            "path": where,
            "changed": changed,
            "restart_required": refused,
            "metrics": self._metrics_address(),  # where a new `listen` (port 0 too) went
        }
        if errors:  # a part kept its old settings: the reload failed, what it lists applied
            log.error("config.reload_failed", errors=errors, **fields)
        else:
            log.info("config.reloaded", **fields)
        self.emit(
            "config.reloaded",
            {
                "successful": not errors,
                "changed": list[JsonValue](changed),
                "restart_required": list[JsonValue](refused),
                "errors": list[JsonValue](errors),
            },
        )
        # A reload also asks cleanerd to look again at once, changed or not: after a
        # repair made in place (a byte put back, a link replaced, a disk freed), say.
        if self.maintenance is not None:
            self.maintenance.reloaded()
        self.request_cycle()
        return errors

    async def _apply(self, plan: ReloadPlan) -> tuple[Config, list[str]]:
        """Apply the live parts of `plan`; a part that fails keeps its old settings."""
        config, old = plan.config, self.config
        errors: list[str] = []
        if plan.touches(("logging",)):
            configure_logging(config.logging.format, config.logging.level)
        if plan.touches(("metrics",)):
            try:
                await asyncio.to_thread(self.exporter.configure, config.metrics)
            except OSError as exc:  # ListenError: it names the key and the address
                errors.append(str(exc))
                # Only the address failed: the opt-ins beside it apply at the old one.
                metrics = config.metrics.model_copy(update={"listen": old.metrics.listen})
                self.exporter.configure(metrics)  # the address it has: nothing to bind
                config = config.model_copy(update={"metrics": metrics})
        if plan.touches(("mqtt",)):
            try:
                await self._replace_publisher(config)
            except ConfigError as exc:
                errors += exc.errors
                config = config.model_copy(update={"mqtt": old.mqtt})
        return config, errors

    def _new_publisher(self, config: Config) -> EventPublisher:
        return make_publisher(config.mqtt, host=self.host, on_command=self.on_command)

    async def _replace_publisher(self, config: Config) -> None:
        """Events go to the new publisher at once; its connection starts once the old
        one is stopped (its queue delivered, or handed over when its broker is away, its
        retained `offline` published), in a task of its own, so the reload does not
        wait. Both use one client id: started first, the new session took the old one
        over and the old, reconnecting, took it back, each dropping the other without
        end, and the old's `offline` came after the new's `online`."""
        new = self._new_publisher(config)
        old, self.publisher = self.publisher, new
        published, dropped = self._events_base
        at_swap = (old.published, old.dropped)
        self._events_base = (published + at_swap[0], dropped + at_swap[1])
        before = self._hand_over

        async def hand_over() -> None:
            if before is not None:
                # A reload before this one is still handing over to `old`: `old` has
                # its events, and is started, only once that is done.
                await asyncio.wait({before})
            await old.stop()
            # What the old one delivered or dropped while it stopped; what it could not
            # deliver (its broker away) goes out through the new one, oldest first.
            published, dropped = self._events_base
            self._events_base = (
                published + old.published - at_swap[0],
                dropped + old.dropped - at_swap[1],
            )
            new.adopt(old.undelivered())
            await new.start()

        name = f"mqtt-hand-over-{id(old)}"
        self._spawn(name, hand_over)
        self._hand_over = self._tasks.get(name)

    # -- shutdown ---------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """STOPPING, abort passes (bounded), checkpoint, release everything."""
        self.state = ServiceState.STOPPING
        self.should_exit = True
        self._abort.set()
        self.notifier.stopping("stopping")
        log.info("shutdown.begin")
        if self._cycle_task is not None and not await self._wait_or_force(self._cycle_task):
            self.abandoned = True
            log.warning("shutdown.cycle_abandoned", forced=self.force_exit)
        elif self.maintenance is not None:
            closing = asyncio.ensure_future(self._in_thread(self._close_maintenance))
            if not await self._wait_or_force(closing):
                self.abandoned = True
                log.warning("shutdown.close_abandoned", forced=self.force_exit)
            elif (error := closing.exception()) is not None:
                self.failed_at_shutdown = True
                log.error("shutdown.close_failed", error=str(error), exc_info=error)
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.publisher.stop()
        await asyncio.to_thread(self.exporter.stop)
        self._thread.shutdown(wait=not self.abandoned, cancel_futures=True)
        self.state = ServiceState.STOPPED
        log.info("shutdown.done", forced=self.force_exit, abandoned=self.abandoned)

    async def _wait_or_force(self, task: asyncio.Future[T]) -> bool:
        """Wait for `task` up to the shutdown timeout, or until a forced exit; True when
        it is done."""
        deadline = time.monotonic() + self.timings.shutdown_timeout_s
        while not task.done() and not self.force_exit and time.monotonic() < deadline:
            await asyncio.wait({task}, timeout=0.1)
        return task.done()

    def _close_maintenance(self) -> None:
        """Write recovery-point and log-start-offset checkpoints, unlink the `.deleted`
        files that wait for `file.delete.delay.ms` (nobody is left to honour it, and a
        stopped service should not hold disk space), release the log dirs. A checkpoint
        that cannot be written is an error naming the file, and the exit status says so."""
        m = self.maintenance
        assert m is not None
        for exc in m.shutdown():
            self.failed_at_shutdown = True
            log.error("shutdown.checkpoint_failed", error=str(exc))


def _placed(devices: tuple[Device, ...]) -> frozenset[tuple[Path, int]]:
    """Each log dir of `devices` with its device."""
    return frozenset((d, dev.device) for dev in devices for d in dev.log_dirs)
