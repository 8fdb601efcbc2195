"""The daemon in-process: served as a task, driven by calling its signal handlers."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from concurrent.futures import Future
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import pytest
import structlog
import yaml

from cleanerd.cli import main
from cleanerd.compaction.cleanable import topic_log_to_clean
from cleanerd.compaction.cleaner import CleaningAborted, CleanResult
from cleanerd.config import Config, load_config
from cleanerd.daemon import hangup, service
from cleanerd.daemon.commands import (
    CleanCommand,
    CommandRejected,
    PauseCommand,
    ReloadCommand,
    ResumeCommand,
)
from cleanerd.daemon.events import Event, MqttPublisher
from cleanerd.daemon.service import Daemon, ServiceState, Timings
from cleanerd.daemon.systemd import Notifier
from cleanerd.daemon.triggers import Deadlines
from cleanerd.daemon.watcher import PartitionKey
from cleanerd.engine.base import CleanJob, PassNotStarted
from cleanerd.log.checkpoint import OffsetCheckpointFile
from cleanerd.log.files import TopicPartition
from cleanerd.log.known_segments import known_segments_path
from cleanerd.log.lock import holds_log_dir_lock
from cleanerd.maintenance.cycle import Maintenance
from cleanerd.maintenance.report import PartitionState
from cleanerd.retention.disk import Device, device_of, group_devices
from cleanerd.retention.disk_usage import device_name
from tests.builders import build_log, kv, settle_dir
from tests.daemon.conftest import (
    NotifyReceiver,
    RecordingPublisher,
    counted_listings,
    eventually,
    running,
)
from tests.tools import tmpfs

HOUR = 3_600_000
FAST = Timings(tick_s=0.05, shutdown_timeout_s=20.0, watch_min_interval_s=0.05)
USERS = TopicPartition("users", 0)
EVENTS = TopicPartition("events", 0)


XY = TopicPartition("xy", 0)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _settings(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "log.dirs": [str(tmp_path / "data")],
        "state_dir": str(tmp_path / "state"),
        "log.cleaner.backoff.ms": 200,
        "metrics": {"listen": "127.0.0.1:0"},
        "topics": {
            "users": {"cleanup.policy": "compact"},
            "events": {"cleanup.policy": "delete", "retention.ms": HOUR},
        },
    }
    data.update(changes)
    return data


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def _logs(tmp_path: Path) -> None:
    """users-0: three segments rewriting the same ten keys (dirty); events-0: three
    segments three hours old (past retention.ms)."""
    data, state = tmp_path / "data", tmp_path / "state"
    now = _now_ms()
    keys = [[[kv(f"k{i}", f"v{n}", timestamp=now - HOUR) for i in range(10)]] for n in range(3)]
    build_log(data, keys, state_dir=state, tp=USERS)
    old = [[[kv(None, f"e{n}", timestamp=now - 3 * HOUR)]] for n in range(3)]
    build_log(data, old, state_dir=state, tp=EVENTS)


def _daemon(
    config_path: Path, notify: NotifyReceiver, *, timings: Timings = FAST
) -> tuple[Daemon, RecordingPublisher]:
    daemon = Daemon(
        load_config(config_path),
        config_path=config_path,
        notifier=Notifier(environ=notify.environ),
        timings=timings,
    )
    events = RecordingPublisher()
    daemon.publisher = events
    return daemon, events


def _cycles_above(daemon: Daemon, count: int) -> bool:
    return daemon.cycles > count


@contextlib.asynccontextmanager
async def _idle_daemon(
    config_path: Path, notify: NotifyReceiver, tmp_path: Path
) -> AsyncIterator[tuple[Daemon, int]]:
    """A running daemon past its start-up cycles, with no safety-net cycle due for an
    hour: it and its cycle count, which stays put until something starts a cycle."""
    _write(config_path, _settings(tmp_path, **{"log.retention.check.interval.ms": HOUR}))
    daemon, _ = _daemon(config_path, notify)
    async with running(daemon):
        await eventually(lambda: daemon.cycles >= 2, "the startup cycle and its follow-up")
        idle = daemon.cycles
        await asyncio.sleep(0.5)
        assert daemon.cycles == idle
        yield daemon, idle


def _failed_at_least(daemon: Daemon, count: int) -> bool:
    return daemon.cycle_failures >= count


def _sample(text: str, name: str) -> float:
    """The value of the sample `name` (with its labels) in a scrape's `text`."""
    (line,) = [line for line in text.splitlines() if line.startswith(name + " ")]
    return float(line.split()[-1])


def _largest(text: str, name: str) -> float:
    """The largest value of the series `name` (any labels) in a scrape's `text`; -inf
    before the first metrics refresh exports any."""
    values = [line.split()[-1] for line in text.splitlines() if line.startswith(name + "{")]
    return max(map(float, values), default=-math.inf)


def _scrape(daemon: Daemon) -> str:
    address = daemon.exporter.address
    assert address is not None
    with urllib.request.urlopen(f"http://{address[0]}:{address[1]}/metrics", timeout=10) as r:
        return str(r.read().decode())


@pytest.fixture(name="config_path")
def _config_path(tmp_path: Path) -> Path:
    _logs(tmp_path)
    return _write(tmp_path / "cleanerd.yaml", _settings(tmp_path))


async def test_startup_holds_the_log_dirs_and_sends_ready(
    config_path: Path, notify_socket: NotifyReceiver, tmp_path: Path
) -> None:
    """1. serve() starts; 2. READY=1 with a STATUS line arrives; 3. the log dir's `.lock`
    is held and the metrics endpoint answers; 4. SIGTERM releases the lock."""
    daemon, _ = _daemon(config_path, notify_socket)
    async with running(daemon) as task:
        ready = await notify_socket.await_for("READY")
        assert ready["STATUS"] == "watching 1 log dir, 2 partitions"
        assert daemon.state is ServiceState.RUNNING
        assert holds_log_dir_lock(tmp_path / "data")
        assert "cleanerd_build_info" in _scrape(daemon)
    assert task.result() == 0
    assert not holds_log_dir_lock(tmp_path / "data")


async def test_an_ipv6_metrics_address_is_logged_in_brackets(
    notify_socket: NotifyReceiver, tmp_path: Path
) -> None:
    """`startup.done` names an IPv6 endpoint as a URL does, `[::1]:PORT`, not `::1:PORT`."""
    if not socket.has_ipv6:
        pytest.skip(reason="this host has no IPv6 support")
    _logs(tmp_path)
    path = _write(tmp_path / "cleanerd.yaml", _settings(tmp_path, metrics={"listen": "[::1]:0"}))
    daemon, _ = _daemon(path, notify_socket)
    with structlog.testing.capture_logs() as logs:
        async with running(daemon):
            await notify_socket.await_for("READY")
    (done,) = [e for e in logs if e["event"] == "startup.done"]
    assert re.fullmatch(r"\[::1\]:\d+", done["metrics"])


async def test_startup_cycle_cleans_and_deletes_and_publishes_events(
    config_path: Path, notify_socket: NotifyReceiver
) -> None:
    """The first cycle compacts the dirty partition and deletes expired segments; each pass
    and deletion becomes an event and is counted in the metrics."""
    daemon, events = _daemon(config_path, notify_socket)
    async with running(daemon):
        await eventually(lambda: daemon.cycles >= 1, "the first cycle")
        cleaned = events.of("log.cleaned")
        assert [(e.topic, e.partition) for e in cleaned] == [("users", 0)]
        stats = cleaned[0].data["stats"]
        assert isinstance(stats, dict)
        assert stats["messages_read"] == 20
        deleted = events.of("segment.deleted")
        assert {e.data["reason"] for e in deleted} == {"retention.ms"}
        assert {(e.topic, e.partition) for e in deleted} == {("events", 0)}
        await eventually(
            lambda: 'cleanerd_cleaner_passes_total{result="success"} 1.0' in _scrape(daemon),
            "the pass in the metrics",
        )


async def test_sigterm_stops_with_checkpoints_written(
    config_path: Path, notify_socket: NotifyReceiver, tmp_path: Path
) -> None:
    """1. a cycle ran; 2. SIGTERM; 3. STOPPING=1 is sent; 4. serve() returns 0; 5. the
    cleaner, recovery-point and log-start-offset checkpoints name the partitions."""
    daemon, _ = _daemon(config_path, notify_socket)
    async with running(daemon) as task:
        await eventually(lambda: daemon.cycles >= 1, "the first cycle")
        daemon.handle_term()
        await asyncio.wait({task})
    assert task.result() == 0
    notify_socket.wait_for("STOPPING")
    assert notify_socket.kinds()[-1] == "STOPPING"
    data = tmp_path / "data"
    assert USERS in OffsetCheckpointFile(data / "cleaner-offset-checkpoint").read()
    recovery = OffsetCheckpointFile(data / "recovery-point-offset-checkpoint").read()
    assert set(recovery) == {USERS, EVENTS}
    assert (data / "log-start-offset-checkpoint").is_file()


async def test_sigint_stops_cleanly_and_a_second_one_forces(
    config_path: Path, notify_socket: NotifyReceiver
) -> None:
    """One SIGINT stops like SIGTERM; a second one while stopping sets force_exit, and the
    exit status says so (130)."""
    daemon, _ = _daemon(config_path, notify_socket)
    async with running(daemon) as task:
        daemon.handle_int()
        assert daemon.should_exit
        assert not daemon.force_exit
        daemon.handle_int()
        assert daemon.force_exit
        await asyncio.wait({task})
    assert task.result() == 130


async def test_sighup_applies_a_changed_valid_config(
    config_path: Path, notify_socket: NotifyReceiver, tmp_path: Path
) -> None:
    """1. SIGHUP after the file changed; 2. RELOADING=1 with MONOTONIC_USEC, then READY=1;
    3. the new topic policy and metrics opt-in apply; 4. the reload metric reads 1."""
    daemon, events = _daemon(config_path, notify_socket)
    async with running(daemon):
        notify_socket.wait_for("READY")
        changed = _settings(tmp_path, metrics={"listen": "127.0.0.1:0", "per_partition": True})
        changed["topics"]["events"]["retention.ms"] = 2 * HOUR
        _write(config_path, changed)
        with structlog.testing.capture_logs() as logs:
            daemon.handle_hup()
            reloading = await notify_socket.await_for("RELOADING")
            assert int(reloading["MONOTONIC_USEC"]) > 0
            await notify_socket.await_for("READY")
        (line,) = [e for e in logs if e["event"] == "config.reloaded"]
        bound = daemon.exporter.address
        assert bound is not None
        assert line["metrics"] == f"{bound[0]}:{bound[1]}"
        assert daemon.config.topic_config("events").retention_ms == 2 * HOUR
        assert daemon.exporter.settings.per_partition
        (reloaded,) = events.of("config.reloaded")
        assert reloaded.data["successful"] is True
        assert reloaded.data["changed"] == [
            "metrics.per_partition",
            "topics.events.retention.ms",
        ]
        assert "cleanerd_config_last_reload_successful 1.0" in _scrape(daemon)


async def test_sighup_refuses_an_invalid_config_whole(
    config_path: Path, notify_socket: NotifyReceiver, tmp_path: Path
) -> None:
    """An invalid file is refused with every error logged; the old config keeps running,
    READY=1 still follows RELOADING=1, and the reload metric reads 0. The event has the
    keys of every `config.reloaded` event, nothing changed."""
    daemon, events = _daemon(config_path, notify_socket)
    async with running(daemon):
        notify_socket.wait_for("READY")
        old = daemon.config
        bad = _settings(tmp_path, **{"log.cleaner.threads": 0})
        bad["topics"]["events"]["retention.msx"] = 5
        _write(config_path, bad)
        with structlog.testing.capture_logs() as logs:
            errors = await daemon.reload()
        assert len(errors) == 2
        assert daemon.config is old
        (failed,) = [e for e in logs if e["event"] == "config.reload_failed"]
        assert failed["errors"] == errors
        assert any("log.cleaner.threads" in e for e in errors)
        assert any("retention.msx" in e for e in errors)
        (event,) = events.of("config.reloaded")
        assert event.data == {
            "successful": False,
            "changed": [],
            "restart_required": [],
            "errors": errors,
        }
        notify_socket.wait_for("RELOADING")
        notify_socket.wait_for("READY")
        assert "cleanerd_config_last_reload_successful 0.0" in _scrape(daemon)


async def test_a_reload_whose_metrics_port_is_taken_fails_and_says_what_applied(
    config_path: Path, notify_socket: NotifyReceiver, tmp_path: Path
) -> None:
    """A valid file whose new `metrics.listen` cannot be bound: the rest of it applies,
    the metrics opt-ins beside the address too, the old endpoint stays, and the reload
    is reported failed, as the alert's runbook says (`config.reload_failed` with the
    error once, and the keys that did apply; the event says unsuccessful; the metric
    reads 0). Before, it was logged as `config.reloaded` at info, listing
    `metrics.listen` among the changed keys; and later, the whole `metrics` section
    kept its old settings, `metrics.per_partition` with it."""
    daemon, events = _daemon(config_path, notify_socket)
    async with running(daemon):
        notify_socket.wait_for("READY")
        serving = daemon.exporter.address
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            listen = f"127.0.0.1:{taken.getsockname()[1]}"
            new = _settings(tmp_path, metrics={"listen": listen, "per_partition": True})
            new["log.cleaner.backoff.ms"] = 999
            _write(config_path, new)
            with structlog.testing.capture_logs() as logs:
                errors = await daemon.reload()
        assert errors == [f"metrics.listen {listen}: cannot bind: Address already in use"]
        assert daemon.config.log_cleaner_backoff_ms == 999
        assert daemon.config.metrics.per_partition
        assert daemon.exporter.settings.per_partition
        assert daemon.config.metrics.listen == daemon.exporter.settings.listen != listen
        assert daemon.exporter.address == serving
        assert not [e for e in logs if e["event"] == "config.reloaded"]
        (failed,) = [e for e in logs if e["event"] == "config.reload_failed"]
        assert failed["log_level"] == "error"
        assert failed["errors"] == errors
        assert failed["changed"] == ["log.cleaner.backoff.ms", "metrics.per_partition"]
        assert serving is not None
        assert failed["metrics"] == f"{serving[0]}:{serving[1]}"
        (event,) = events.of("config.reloaded")
        assert event.data["successful"] is False
        assert event.data["changed"] == ["log.cleaner.backoff.ms", "metrics.per_partition"]
        assert "cleanerd_config_last_reload_successful 0.0" in _scrape(daemon)


async def test_restart_required_key_keeps_its_old_value(
    config_path: Path, notify_socket: NotifyReceiver, tmp_path: Path
) -> None:
    """A changed `log.dirs` is logged as "restart required" and kept; the other changes in
    the same file apply."""
    daemon, _ = _daemon(config_path, notify_socket)
    async with running(daemon):
        new = _settings(tmp_path, **{"log.dirs": [str(tmp_path / "other")]})
        new["log.cleaner.backoff.ms"] = 999
        _write(config_path, new)
        with structlog.testing.capture_logs() as logs:
            assert await daemon.reload() == []
        assert daemon.config.log_dirs == (tmp_path / "data",)
        assert daemon.config.log_cleaner_backoff_ms == 999
        (warning,) = [e for e in logs if e["event"] == "config.restart_required"]
        assert warning["key"] == "log.dirs"
        assert warning["running"] == [str(tmp_path / "data")]


async def test_commands_are_validated_against_the_log_dirs(
    config_path: Path, notify_socket: NotifyReceiver
) -> None:
    """`clean` of a missing partition or of a topic that is not compacted is rejected; a
    valid one starts a cycle, which says so when it drops it (nothing to clean); `pause`
    stops new cycles and `clean`; `resume` restarts."""
    daemon, events = _daemon(config_path, notify_socket)
    async with running(daemon):
        await eventually(lambda: daemon.cycles >= 1, "the first cycle")
        with pytest.raises(CommandRejected, match="does not exist"):
            await daemon.on_command(CleanCommand(topic="users", partition=7))
        with pytest.raises(CommandRejected, match="not compacted"):
            await daemon.on_command(CleanCommand(topic="events", partition=0))
        await eventually(lambda: daemon.last_outcome is not None, "an idle daemon")
        before = daemon.cycles
        await daemon.on_command(CleanCommand(topic="users", partition=0, id="r1"))
        await eventually(lambda: daemon.cycles > before, "the requested cycle")
        # The first cycle cleaned it all: the request is dropped, and the sender told so.
        (dropped,) = events.of("clean.request_dropped")
        assert (dropped.topic, dropped.partition) == ("users", 0)
        assert dropped.data == {"reason": "nothing to clean", "ids": ["r1"]}
        assert "cleanerd_cleaning_paused 0.0" in _scrape(daemon)
        await daemon.on_command(PauseCommand())
        assert "cleanerd_cleaning_paused 1.0" in _scrape(daemon)  # a dashboard sees it
        with pytest.raises(CommandRejected, match="paused"):
            await daemon.on_command(CleanCommand(topic="users", partition=0))
        paused_at = daemon.cycles
        daemon.request_cycle()  # a cycle reads the states only: nothing is done
        await eventually(lambda: daemon.cycles > paused_at, "a states-only cycle")
        assert daemon.last_outcome is not None
        report = daemon.last_outcome.report
        assert (report.rolled, report.retention, report.cleaned) == ((), (), ())
        assert [s.reason for s in report.skipped if s.phase == "cycle"] == ["paused: states only"]
        await daemon.on_command(ResumeCommand())
        assert "cleanerd_cleaning_paused 0.0" in _scrape(daemon)
        await eventually(lambda: daemon.cycles > paused_at, "a cycle after resume")


async def test_a_reload_of_an_unchanged_file_starts_a_cycle(
    config_path: Path, notify_socket: NotifyReceiver, tmp_path: Path
) -> None:
    """SIGHUP makes cleanerd look again at once even when the file did not change (after
    a repair made in place, say), as the README's table of cycle reasons promises."""
    async with _idle_daemon(config_path, notify_socket, tmp_path) as (daemon, idle):
        daemon.handle_hup()
        await eventually(lambda: daemon.cycles > idle, "a cycle after the reload")


async def test_a_sighup_before_the_loop_took_the_signal_is_a_reload(
    config_path: Path, notify_socket: NotifyReceiver, tmp_path: Path
) -> None:
    """A SIGHUP while `cleanerd run` imports and starts (held by `hangup.hold`, which the
    command line installs first) is answered with a reload once the daemon's handler
    is in place. Before, the default action ended the process with status 129."""
    changed = _settings(tmp_path)
    changed["topics"]["events"]["retention.ms"] = 3 * HOUR
    daemon, _ = _daemon(config_path, notify_socket)
    _write(config_path, changed)  # after the start read it: only a reload sees this
    hangup.hold()
    try:
        os.kill(os.getpid(), signal.SIGHUP)
        async with running(daemon):
            await eventually(
                lambda: daemon.config.topic_config("events").retention_ms == 3 * HOUR,
                "the reload the early SIGHUP asked for",
            )
        assert not hangup.take()
    finally:  # whatever happened, no later test inherits the handler or the wish
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        hangup.take()


def test_the_run_command_holds_sighup_from_its_first_instant(tmp_path: Path) -> None:
    """`cleanerd run` installs `hangup.hold` before it imports the daemon (here: before
    it finds its config file missing); the other commands leave SIGHUP alone."""
    probe = (
        "import signal, sys\n"
        "from cleanerd import cli\n"
        "sys.argv = ['cleanerd', sys.argv[1], '-c', sys.argv[2]]\n"
        "cli.main()\n"
        "print(getattr(signal.getsignal(signal.SIGHUP), '__name__', 'default'))\n"
    )
    missing = str(tmp_path / "missing.yaml")
    held = {
        command: subprocess.run(
            [sys.executable, "-c", probe, command, missing],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for command in ("run", "plan")
    }
    assert held == {"run": "_remember", "plan": "default"}


async def test_a_sighup_while_the_last_reload_task_ends_is_not_lost(
    config_path: Path, notify_socket: NotifyReceiver, tmp_path: Path
) -> None:
    """A SIGHUP that comes after a reload released its lock but before its task is gone
    (its done callback runs a loop turn later; a reload that rebinds the metrics
    listener made the window wide enough for a quick second edit to fall in it) waits
    for the task, then reloads. Before, the tick cleared the wish and spawned nothing,
    and the newest file was never read."""
    async with _idle_daemon(config_path, notify_socket, tmp_path) as (daemon, _):
        ending = asyncio.Event()

        async def linger() -> None:
            await ending.wait()

        lingering = asyncio.create_task(linger(), name="reload")
        daemon._tasks["reload"] = lingering
        lingering.add_done_callback(daemon._task_done)
        changed = _settings(tmp_path)
        changed["topics"]["events"]["retention.ms"] = 3 * HOUR
        _write(config_path, changed)
        daemon.handle_hup()
        daemon.on_tick()
        assert daemon.config.topic_config("events").retention_ms != 3 * HOUR
        ending.set()
        await eventually(
            lambda: daemon.config.topic_config("events").retention_ms == 3 * HOUR,
            "the newest file applied",
        )


async def test_failed_cycles_are_counted_and_exported(
    config_path: Path, notify_socket: NotifyReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cycle that fails whole (here: an unexpected error out of the cycle, as a bug
    would raise) leaves the partition gauges at the last good cycle's state, so it is
    counted apart: `cleanerd_cycles_total{result="failed"}` and
    `cleanerd_cycle_failures_in_a_row`, which a done cycle sets back to 0."""
    daemon, _ = _daemon(config_path, notify_socket)
    discover = Maintenance._discover

    def failing(self: Maintenance, report: Any) -> Any:
        raise RuntimeError("injected")

    async with running(daemon):
        await eventually(lambda: daemon.cycles >= 1, "the first cycle")
        monkeypatch.setattr(Maintenance, "_discover", failing)
        for failures in (1, 2):
            daemon.request_cycle()
            await eventually(partial(_failed_at_least, daemon, failures), "a failed cycle")
        # Each failure is exported after its cycle (and a timer may add one more):
        # wait for the second's export; every failure since the first cycle is in a row.
        await eventually(
            lambda: _sample(_scrape(daemon), "cleanerd_cycle_failures_in_a_row") >= 2,
            "the failures exported",
        )
        text = _scrape(daemon)
        in_a_row = _sample(text, "cleanerd_cycle_failures_in_a_row")
        assert _sample(text, 'cleanerd_cycles_total{result="failed"}') == in_a_row
        monkeypatch.setattr(Maintenance, "_discover", discover)
        daemon.request_cycle()
        await eventually(lambda: daemon.cycle_failures == 0, "a done cycle")
        assert "cleanerd_cycle_failures_in_a_row 0.0" in _scrape(daemon)


async def test_a_cycle_that_fails_after_deleting_still_publishes_the_deletions(
    config_path: Path, notify_socket: NotifyReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a cycle did before it failed (here its deletions, before its cleaning phase
    raised, as a bug would) is published: the events go out as the cycle goes. Before,
    they came from the report of a cycle that ended, and a failed one lost them."""

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected")

    monkeypatch.setattr(Maintenance, "_clean", failing)
    daemon, events = _daemon(config_path, notify_socket)
    async with running(daemon):
        await eventually(partial(_failed_at_least, daemon, 1), "a failed cycle")
        await eventually(lambda: bool(events.of("segment.deleted")), "the deletions published")
    assert daemon.cycles == 0
    deleted = events.of("segment.deleted")
    assert {(e.topic, e.partition, e.data["reason"]) for e in deleted} == {
        ("events", 0, "retention.ms")
    }


async def test_a_cycle_that_fails_whole_is_not_retried_at_every_tick(
    config_path: Path, notify_socket: NotifyReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cycle that fails whole leaves the deadlines of the last good one, here a time
    rule already due: the next cycle waits `log.cleaner.backoff.ms` (at least a second),
    doubled for each failure, instead of starting at the next tick. The daemon ran about
    a thousand failing cycles a second, each logging its traceback."""
    daemon, _ = _daemon(config_path, notify_socket)

    def failing(self: Any, report: Any) -> Any:
        raise RuntimeError("injected")

    async with running(daemon):
        await eventually(lambda: daemon.cycles >= 1, "the first cycle")
        monkeypatch.setattr(Maintenance, "_discover", failing)
        daemon._deadlines = Deadlines(due_ms=1)  # a time rule due since long ago
        daemon.request_cycle()
        await eventually(partial(_failed_at_least, daemon, 1), "a failed cycle")
        await asyncio.sleep(1.0)
        # The first retry a second after the failure, the next two seconds later.
        assert daemon.cycle_failures <= 2


async def test_a_topic_two_globs_match_fails_its_steps_and_says_so_in_the_metrics(
    notify_socket: NotifyReceiver, tmp_path: Path
) -> None:
    """A topic that two `topics:` globs match, created while the daemon runs: the
    cycles go on (none fails whole), and `cleanerd_failed_steps` counts its partition's
    failed step until the config says which entry applies. It was only logged once."""
    _logs(tmp_path)
    retain = {"cleanup.policy": "delete", "retention.ms": HOUR}
    topics = {"users": {"cleanup.policy": "compact"}, "events": retain, "x*": retain, "*y": retain}
    config_path = _write(tmp_path / "cleanerd.yaml", _settings(tmp_path, topics=topics))
    daemon, _ = _daemon(config_path, notify_socket)
    failed = f'cleanerd_failed_steps{{log_dir="{tmp_path / "data"}"}}'
    async with running(daemon):
        await eventually(lambda: failed in _scrape(daemon), "the first cycle exported")
        assert _sample(_scrape(daemon), failed) == 0
        build_log(tmp_path / "data", [[[kv("k", "v")]]], state_dir=tmp_path / "state", tp=XY)
        daemon.request_cycle()
        await eventually(lambda: _sample(_scrape(daemon), failed) == 1, "the step counted")
        assert daemon.cycle_failures == 0


async def test_a_malformed_root_checkpoint_takes_its_log_dir_offline_not_the_cycle(
    config_path: Path, notify_socket: NotifyReceiver, tmp_path: Path
) -> None:
    """A root checkpoint file made malformed while the daemon runs: the cycles go on
    (none fails whole), `cleanerd_log_dir_offline` is 1 for the dir, the file is left
    as it is; once it is repaired, the dir is back (the gauge 0)."""
    daemon, _ = _daemon(config_path, notify_socket)
    data = str(tmp_path / "data")
    checkpoint = tmp_path / "data" / "cleaner-offset-checkpoint"
    offline = f'cleanerd_log_dir_offline{{log_dir="{data}"}}'
    async with running(daemon):
        await eventually(lambda: offline in _scrape(daemon), "the first cycle exported")
        assert _sample(_scrape(daemon), offline) == 0
        # Written whole (renamed into place), as Kafka and cleanerd write checkpoints.
        malformed = tmp_path / "malformed"
        await asyncio.to_thread(malformed.write_text, "0\n1\nusers zero 5\n")
        await asyncio.to_thread(malformed.replace, checkpoint)
        done = daemon.cycles
        daemon.request_cycle()
        await eventually(lambda: _sample(_scrape(daemon), offline) == 1, "the dir offline")
        assert daemon.cycles > done
        assert daemon.cycle_failures == 0
        assert checkpoint.read_text() == "0\n1\nusers zero 5\n"
        assert "(1 offline: left alone until readable)" in daemon._status_line()
        await asyncio.to_thread(checkpoint.unlink)
        daemon.request_cycle()
        await eventually(lambda: _sample(_scrape(daemon), offline) == 0, "the dir back")


async def test_a_log_dir_missing_at_the_start_is_offline_until_it_is_there(
    notify_socket: NotifyReceiver, tmp_path: Path
) -> None:
    """One of two log dirs missing at the start (a disk not mounted yet, or dead): the
    daemon starts on the other and maintains it, as a broker starts with the dirs it can
    use, reports the missing one offline with check-config's words, and takes it, on its
    device, as soon as the disk probe sees it there, not at the next cycle due. It used
    to refuse to start, and under systemd's restart limit to stay down, leaving the
    healthy disks without retention or KIP-61."""
    _logs(tmp_path)
    late = tmp_path / "late"
    dirs = {"log.dirs": [str(tmp_path / "data"), str(late)]}
    config_path = _write(tmp_path / "cleanerd.yaml", _settings(tmp_path, **dirs))
    daemon, events = _daemon(config_path, notify_socket)
    offline = f'cleanerd_log_dir_offline{{log_dir="{late}"}}'
    device = f'cleanerd_log_dir_device_info{{device="{device_name(device_of(tmp_path))}"'
    with structlog.testing.capture_logs() as logs:
        async with running(daemon):
            ready = await notify_socket.await_for("READY")
            assert ready["STATUS"] == (
                "watching 2 log dirs (1 offline: left alone until readable), 2 partitions"
            )
            assert holds_log_dir_lock(tmp_path / "data")
            await eventually(lambda: offline in _scrape(daemon), "the first cycle exported")
            assert _sample(_scrape(daemon), offline) == 1
            assert f'{device},log_dir="{late}"}} 1.0' not in _scrape(daemon)
            await asyncio.to_thread(late.mkdir)  # no cycle is due for 5 minutes: the probe
            await eventually(lambda: _sample(_scrape(daemon), offline) == 0, "the dir taken")
            assert holds_log_dir_lock(late)
            await eventually(
                lambda: f'{device},log_dir="{late}"}} 1.0' in _scrape(daemon), "its device"
            )
    said = [(e["event"], e["log_dir"]) for e in logs if e["log_level"] == "error"]
    assert said == [("log_dir.offline", str(late))]  # once, with why; not also unreadable
    assert [e["log_dir"] for e in logs if e["event"] == "log_dir.online"] == [str(late)]
    assert [(e.topic, e.partition) for e in events.of("log.cleaned")] == [("users", 0)]


async def test_an_offline_mount_point_is_taken_when_a_disk_is_mounted_on_it(
    notify_socket: NotifyReceiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log dir whose path is there but unusable (here a file; a root-owned mount point
    with no disk in practice), then a disk mounted on it (the path on another device):
    the disk probe sees the device change and starts a cycle that takes the dir, not
    the revisit five minutes later; it looked only at whether the path was there."""
    _logs(tmp_path)
    late = tmp_path / "late"
    late.write_text("not a dir")
    dirs = {"log.dirs": [str(tmp_path / "data"), str(late)]}
    config_path = _write(tmp_path / "cleanerd.yaml", _settings(tmp_path, **dirs))
    daemon, _ = _daemon(config_path, notify_socket)
    offline = f'cleanerd_log_dir_offline{{log_dir="{late}"}}'
    mounted = False
    real = group_devices

    def devices(log_dirs: Any) -> Any:
        grouped = real(log_dirs)
        if not mounted:
            return grouped
        return tuple(Device(d.device + 1, d.log_dirs) if late in d.log_dirs else d for d in grouped)

    monkeypatch.setattr(service, "group_devices", devices)
    async with running(daemon):
        await eventually(lambda: offline in _scrape(daemon), "the first cycle exported")
        assert _sample(_scrape(daemon), offline) == 1
        await asyncio.to_thread(late.unlink)
        await asyncio.to_thread(late.mkdir)  # the disk's root, as the mount shows it
        mounted = True
        await eventually(lambda: _sample(_scrape(daemon), offline) == 0, "the dir taken")


async def test_reload_command_reports_an_invalid_file(
    config_path: Path, notify_socket: NotifyReceiver
) -> None:
    """The `reload` command is rejected, with the errors, when the file is invalid."""
    daemon, _ = _daemon(config_path, notify_socket)
    async with running(daemon):
        await asyncio.to_thread(config_path.write_text, "log.cleaner.threads: [\n")
        with pytest.raises(CommandRejected, match="YAML syntax error"):
            await daemon.on_command(ReloadCommand())


async def test_new_data_seen_by_the_watcher_starts_a_cycle(
    config_path: Path, notify_socket: NotifyReceiver, tmp_path: Path
) -> None:
    """An idle daemon runs no cycle; records appended to a partition make the watcher's
    next scan start one (after `log.cleaner.backoff.ms`)."""
    async with _idle_daemon(config_path, notify_socket, tmp_path) as (daemon, idle):
        plog = build_log(
            tmp_path / "data",
            [[[kv("k", "v", timestamp=_now_ms())]]],
            state_dir=tmp_path / "state",
            tp=TopicPartition("users", 5),
        )
        assert plog.log_end_offset == 1
        await eventually(lambda: daemon.cycles > idle, "a cycle for the new partition")


async def test_an_idle_daemon_has_looked_for_work_a_tick_ago(
    config_path: Path, notify_socket: NotifyReceiver, tmp_path: Path
) -> None:
    """Between cycles, each tick that finds no cycle due is a look for work, as a broker's
    idle cleaner thread looks every `log.cleaner.backoff.ms`: the last-run gauge follows
    the ticks with no cycle run. It stood at the last cycle, so an idle daemon's
    `time-since-last-run-ms` climbed to `log.retention.check.interval.ms` (5 minutes by
    default), where a Kafka alert on it fires."""
    name = "cleanerd_last_clean_timestamp_seconds"
    async with _idle_daemon(config_path, notify_socket, tmp_path) as (daemon, idle):
        first = _sample(await asyncio.to_thread(_scrape, daemon), name)
        assert first > 0

        async def later() -> bool:
            return _sample(await asyncio.to_thread(_scrape, daemon), name) >= first + 1

        deadline = time.monotonic() + 20
        while not await later():
            assert time.monotonic() < deadline, "the gauge did not follow the ticks"
            await asyncio.sleep(0.2)
        assert daemon.cycles == idle


async def test_idle_cycles_are_logged_at_debug_and_counted_on_the_next_busy_one(
    config_path: Path, notify_socket: NotifyReceiver, tmp_path: Path
) -> None:
    """After the startup cycle (always reported), cycles that change nothing log
    `cycle.done` at debug only; the next cycle that does something logs it at info with
    the number of idle cycles before it."""
    daemon, _ = _daemon(config_path, notify_socket)
    with structlog.testing.capture_logs() as logs:
        async with running(daemon):
            await eventually(lambda: daemon.cycles >= 2, "the startup cycle and its follow-up")
            for n in range(3):
                daemon.request_cycle()
                await eventually(partial(_cycles_above, daemon, daemon.cycles), f"cycle {n}")
            # (whether debug lines reach capture_logs depends on the logging set up
            # before: the test counts the info lines, which must not grow)
            info = [e for e in logs if e["event"] == "cycle.done" and e["log_level"] == "info"]
            assert len(info) == 1
            assert daemon.cycles >= 5
            old = [[[kv(None, "late", timestamp=_now_ms() - 3 * HOUR)]]]
            build_log(tmp_path / "data", old, state_dir=tmp_path / "state", tp=EVENTS)
            done = daemon.cycles
            daemon.request_cycle()
            await eventually(lambda: daemon.cycles > done, "the cycle that deletes")
    reported = [e for e in logs if e["event"] == "cycle.done" and e["log_level"] == "info"]
    assert reported[0]["idle_cycles_before"] == 0
    assert reported[0]["cleaned"] == 1
    busy = [e for e in reported[1:] if e["deleted"]]
    assert busy
    assert busy[0]["idle_cycles_before"] >= 3
    assert len(reported) == 1 + len(busy)


async def test_disk_pressure_is_published_and_acted_on(
    config_path: Path, notify_socket: NotifyReceiver, tmp_path: Path
) -> None:
    """With a threshold below the device's usage, the tick's probe publishes
    `disk.pressure` and the cycle deletes segments with reason `disk.usage`."""
    _write(config_path, _settings(tmp_path, **{"log.retention.disk.usage.percent": 1}))
    daemon, events = _daemon(config_path, notify_socket)
    async with running(daemon):
        await eventually(lambda: bool(events.of("disk.pressure")), "the disk.pressure event")
        await eventually(
            lambda: any(e.data["reason"] == "disk.usage" for e in events.of("segment.deleted")),
            "a disk.usage deletion",
        )


class BlockingEngine:
    """An engine whose passes run until aborted (and, with `honours_abort` False, until
    `release`), so a test can stop the daemon in the middle of one."""

    name = "blocking"
    workers = 1
    dead_workers = 0

    def __init__(self, *, honours_abort: bool = True) -> None:
        self.honours_abort = honours_abort
        self.submitted: list[TopicPartition] = []
        self.aborted: list[TopicPartition] = []
        self._running: dict[TopicPartition, Future[CleanResult]] = {}

    def submit_clean(self, job: CleanJob) -> Future[CleanResult]:
        future: Future[CleanResult] = Future()
        future.set_running_or_notify_cancel()
        self._running[job.tp] = future
        self.submitted.append(job.tp)
        return future

    def flush(self) -> None:
        pass

    def abort(self, tp: TopicPartition) -> bool:
        self.aborted.append(tp)
        if self.honours_abort:
            self._stop(tp)
        return tp in self._running

    def release(self) -> None:
        for tp in list(self._running):
            self._stop(tp)

    def _stop(self, tp: TopicPartition) -> None:
        future = self._running.pop(tp, None)
        if future is not None:
            future.set_exception(CleaningAborted(tp))

    def shutdown(self, *, abort: bool = False) -> None:
        if abort:
            self.release()


def _blocking_daemon(
    config_path: Path, notify: NotifyReceiver, engine: BlockingEngine, timings: Timings
) -> Daemon:
    return Daemon(
        load_config(config_path),
        config_path=config_path,
        notifier=Notifier(environ=notify.environ),
        timings=timings,
        engine_factory=lambda _config: engine,
    )


async def test_sigterm_aborts_the_passes_in_flight(
    config_path: Path, notify_socket: NotifyReceiver, tmp_path: Path
) -> None:
    """1. a pass is running; 2. SIGTERM; 3. the engine is asked to abort it (the pass then
    removes its `.cleaned` output before any swap); 4. checkpoints are written; exit 0."""
    engine = BlockingEngine()
    daemon = _blocking_daemon(config_path, notify_socket, engine, FAST)
    async with running(daemon) as task:
        await eventually(lambda: engine.submitted == [USERS], "the pass to start")
        daemon.handle_term()
        await asyncio.wait({task})
    assert task.result() == 0
    assert engine.aborted == [USERS]
    assert not daemon.abandoned
    assert (tmp_path / "data" / "recovery-point-offset-checkpoint").is_file()


async def test_shutdown_is_bounded_when_a_pass_ignores_the_abort(
    config_path: Path, notify_socket: NotifyReceiver
) -> None:
    """A pass that does not stop within `shutdown_timeout_s` is left behind: serve()
    returns 1 and flags `abandoned`, so the process exits without joining it."""
    engine = BlockingEngine(honours_abort=False)
    timings = replace(FAST, shutdown_timeout_s=0.3)
    daemon = _blocking_daemon(config_path, notify_socket, engine, timings)
    try:
        async with running(daemon) as task:
            await eventually(lambda: engine.submitted == [USERS], "the pass to start")
            daemon.handle_term()
            await asyncio.wait({task})
        assert task.result() == 1
        assert daemon.abandoned
    finally:
        engine.release()


async def test_the_partition_metrics_come_before_the_first_cycles_passes_end(
    config_path: Path, notify_socket: NotifyReceiver
) -> None:
    """The first cycle of a big host may clean for minutes: its partitions' states are
    exported once it has taken them, while its passes still run (one is held here).
    Before, a scrape had no partition metric until the first cycle ended."""
    engine = BlockingEngine()
    daemon = _blocking_daemon(config_path, notify_socket, engine, FAST)
    try:
        async with running(daemon):
            await eventually(lambda: engine.submitted == [USERS], "the pass to start")
            await eventually(
                lambda: "cleanerd_max_dirty_ratio{" in _scrape(daemon), "the partition metrics"
            )
            assert daemon.cycles == 0  # the first cycle has not ended
            text = _scrape(daemon)
            assert _largest(text, "cleanerd_max_dirty_ratio") > 0  # users-0, before its pass
    finally:
        engine.release()


class _FailingFirst(BlockingEngine):
    """Fails its first pass as an engine does (nothing started); holds the others."""

    def submit_clean(self, job: CleanJob) -> Future[CleanResult]:
        future = super().submit_clean(job)
        if len(self.submitted) == 1:
            self._running.pop(job.tp)
            future.set_exception(PassNotStarted(job.tp, OSError("injected")))
        return future


async def test_a_cycles_failed_steps_stay_exported_while_the_next_one_runs(
    config_path: Path, notify_socket: NotifyReceiver, tmp_path: Path
) -> None:
    """The partition gauges come from the states a cycle took before its passes, but a
    step that failed in the last cycle stays counted in `cleanerd_failed_steps` while
    the next one runs: that one's failures are known at its end. Taken from the running
    cycle's report, the gauge fell to 0 for as long as its passes ran."""
    engine = _FailingFirst()
    daemon = _blocking_daemon(config_path, notify_socket, engine, FAST)
    failed = f'cleanerd_failed_steps{{log_dir="{tmp_path / "data"}"}}'
    try:
        async with running(daemon):
            await eventually(lambda: failed in _scrape(daemon), "the first cycle exported")
            await eventually(lambda: _sample(_scrape(daemon), failed) == 1, "the failed pass")
            daemon.request_cycle()
            await eventually(lambda: engine.submitted == [USERS, USERS], "the second pass")
            await asyncio.sleep(0.5)  # ticks: the second cycle's states are exported
            taken, ended = daemon._taken, daemon.last_outcome
            assert taken is not None
            assert ended is not None
            assert taken[0] is not ended.report  # the second cycle took its states
            assert _sample(_scrape(daemon), failed) == 1
    finally:
        engine.release()


async def test_a_device_going_above_its_threshold_beside_a_long_pass_is_acted_on_at_once(
    notify_socket: NotifyReceiver, tmp_path: Path
) -> None:
    """A real tmpfs: while a pass runs on (held here), a file fills the device past
    log.retention.disk.usage.percent; the probe sees it, and the running cycle deletes
    the oldest segments for disk usage then, without waiting for the pass to end."""
    with tmpfs(tmp_path / "dev", "4m") as dev:
        data, state = dev / "data", tmp_path / "state"
        now = _now_ms()
        keys = [[[kv(f"k{i}", f"v{n}", timestamp=now) for i in range(10)]] for n in range(3)]
        build_log(data, keys, state_dir=state, tp=USERS)
        value = "x" * 1000
        old = [[[kv(None, value, timestamp=now - HOUR)] * 100] for _ in range(4)]
        build_log(data, old, state_dir=state, tp=EVENTS)
        settings = _settings(tmp_path, **{"log.retention.disk.usage.percent": 50})
        settings["log.dirs"] = [str(data)]
        settings["topics"]["events"]["retention.ms"] = -1
        config_path = _write(tmp_path / "cleanerd.yaml", settings)
        engine = BlockingEngine()
        daemon = _blocking_daemon(config_path, notify_socket, engine, FAST)
        events = RecordingPublisher()
        daemon.publisher = events
        try:
            async with running(daemon):
                await eventually(lambda: engine.submitted == [USERS], "the pass to start")
                oldest = data / str(EVENTS) / f"{0:020d}.log"
                assert oldest.exists()
                (dev / "filler").write_bytes(b"\0" * (2 * 1024 * 1024 + 512 * 1024))
                await eventually(lambda: not oldest.exists(), "a deletion beside the pass")
                assert USERS in engine._running  # the pass still runs
                engine.release()
        finally:
            engine.release()
    deleted = events.of("segment.deleted")  # published with the cycle's report
    assert {e.data["reason"] for e in deleted} == {"disk.usage"}


@pytest.mark.parametrize(
    ("command", "event", "said"),
    [
        ("print('built in 1.0 s')", "kernels.built", "built in 1.0 s"),
        (
            "import sys; print('no C compiler'); sys.exit(1)",
            "kernels.build_failed",
            "no C compiler",
        ),
        (
            "import sys; print('the warm-up failed (boom)'); print('m.so: built'); sys.exit(1)",
            "kernels.build_failed",
            "the warm-up failed (boom)",
        ),
    ],
)
async def test_the_first_cycle_has_the_kernels_compiled_in_a_process_of_their_own(
    config_path: Path,
    notify_socket: NotifyReceiver,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    event: str,
    said: str,
) -> None:
    """After its first cycle (which ran the kernels, filling numba's cache), the daemon
    runs `cleanerd build-kernels --background` once, in a process of its own, and logs
    what it said; a failure is a warning naming the consequence. `CLEANERD_AOT=0`, which
    the suite sets, turns it off."""
    monkeypatch.setenv("CLEANERD_AOT", "1")
    monkeypatch.setattr(service, "BUILD_KERNELS_COMMAND", (sys.executable, "-c", command))
    with structlog.testing.capture_logs() as logs:
        daemon, _ = _daemon(config_path, notify_socket)
        async with running(daemon):
            await eventually(lambda: any(e["event"] == event for e in logs), "the build's outcome")
            await eventually(lambda: daemon.cycles >= 2, "a second cycle")
    outcomes = [e for e in logs if e["event"].startswith("kernels.")]
    assert len(outcomes) == 1
    assert outcomes[0]["event"] == event
    assert said in str(outcomes[0].get("result", outcomes[0].get("error")))


async def test_a_stop_during_the_kernel_build_ends_its_whole_process_group(
    config_path: Path,
    notify_socket: NotifyReceiver,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A stop while `build-kernels` runs ends it and the processes it started (its
    warm-up), not only the build itself: a warm-up left behind worked on for seconds
    after the daemon exited, and one killed later with it left its scratch behind."""
    pid_file = tmp_path / "child.pid"
    command = (
        "import subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pid_file)!r}, 'w').write(str(child.pid)); time.sleep(60)"
    )
    monkeypatch.setenv("CLEANERD_AOT", "1")
    monkeypatch.setattr(service, "BUILD_KERNELS_COMMAND", (sys.executable, "-c", command))
    daemon, _ = _daemon(config_path, notify_socket)
    async with running(daemon):
        await eventually(lambda: pid_file.exists() and pid_file.read_text() != "", "the build")
    child = int(pid_file.read_text())

    def ended() -> bool:
        try:
            return psutil.Process(child).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    await eventually(ended, "the build's child to end")


def _failing_cycle(config: object) -> None:
    raise RuntimeError("a cycle that fails")


async def test_watchdog_pings_stop_when_cycles_keep_failing(
    config_path: Path, notify_socket: NotifyReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `WATCHDOG_USEC` set, WATCHDOG=1 comes from the main loop while healthy; after
    repeated cycle failures the pings stop, so systemd would restart the service."""
    monkeypatch.setenv("WATCHDOG_USEC", "100000")
    daemon, _ = _daemon(config_path, notify_socket)
    async with running(daemon):
        await notify_socket.await_for("WATCHDOG")
        # Every cycle from now on fails. A cycle that succeeds resets the count, and one
        # may already be running (the startup cycle, or an idle one the watcher triggered
        # after it), so the count is set only once no cycle is in flight.
        await eventually(lambda: daemon.cycles >= 1, "the startup cycle to end")
        monkeypatch.setattr(daemon, "_run_cycle", _failing_cycle)
        await eventually(lambda: daemon._cycle_task is None, "the cycle in flight to end")
        daemon.cycle_failures = 3
        await asyncio.sleep(0.2)  # a ping already in flight may still land
        while True:
            try:
                notify_socket.receive(timeout=0.3)
            except TimeoutError:
                break
        assert not daemon.healthy()


# -- the pure parts -----------------------------------------------------------------------


def _state(tmp_path: Path, config: Config, *, first_ts: int, now_ms: int) -> PartitionState:
    batches = [[[kv("k", "v", timestamp=first_ts)]], [[kv("k", "w", timestamp=first_ts)]]]
    plog = build_log(tmp_path / "data", batches, state_dir=tmp_path / "state", tp=USERS)
    meta = plog.meta()
    ltc = topic_log_to_clean(meta, config.topic_config("users"), checkpoint=None, now_ms=now_ms)
    return PartitionState(meta, ltc)


def test_aged_states_grow_the_delay_of_an_overdue_partition(tmp_path: Path) -> None:
    """Between cycles the cached snapshots are aged: an overdue partition's delay grows
    with the clock, a partition before its deadline is kept as it is."""
    data = _settings(tmp_path)
    data["topics"]["users"]["max.compaction.lag.ms"] = 1_000
    config = load_config(_write(tmp_path / "c.yaml", data))
    state = _state(tmp_path, config, first_ts=100_000, now_ms=100_500)
    assert state.ltc is not None
    assert state.ltc.deadline_ms == 101_000
    assert state.aged(100_900) == state
    aged = state.aged(104_000)
    assert aged.ltc is not None
    assert aged.ltc.compaction_delay_ms == 3_000
    assert aged.ltc.kafka_compaction_delay_ms == 3_000


async def test_a_paused_daemon_still_shows_the_delay_of_what_is_written(
    config_path: Path, notify_socket: NotifyReceiver, tmp_path: Path
) -> None:
    """While paused, cycles read the partitions' states only: a record appended during
    the pause and past its `max.compaction.lag.ms` shows in the delay gauge, and nothing
    is rolled or cleaned. No cycle ran while paused, so the gauge read 0 for as long as
    the pause lasted, and the overdue alert could not fire."""
    lagged = {"cleanup.policy": "compact", "max.compaction.lag.ms": 2 * HOUR}
    topics = {"users": lagged, "events": {"cleanup.policy": "delete", "retention.ms": HOUR}}
    _write(config_path, _settings(tmp_path, topics=topics))
    daemon, events = _daemon(config_path, notify_socket)
    async with running(daemon):
        await eventually(lambda: daemon.cycles >= 1, "the first cycle")
        await daemon.on_command(PauseCommand())
        delay = "cleanerd_max_compaction_delay_seconds"
        await eventually(lambda: _largest(_scrape(daemon), delay) == 0, "nothing overdue")
        # A cycle running at the pause may have been in a step's write already.
        await eventually(lambda: daemon._cycle_task is None, "the cycle in flight done")
        cleaned, rolled = len(events.of("log.cleaned")), len(events.of("segment.rolled"))
        build_log(
            tmp_path / "data",
            [[[kv("late", "v", timestamp=_now_ms() - 3 * HOUR)]]],
            state_dir=tmp_path / "state",
            tp=TopicPartition("users", 3),
        )
        await eventually(lambda: _largest(_scrape(daemon), delay) > 1800, "the delay")
        assert (len(events.of("log.cleaned")), len(events.of("segment.rolled"))) == (
            cleaned,
            rolled,
        )


async def test_the_delays_of_an_observed_dir_grow_between_cycles(
    tmp_path: Path, notify_socket: NotifyReceiver
) -> None:
    """In a log dir only observed (`mode: observe`, or a broker's), nothing comes to
    meet a deadline, so no cycle runs for it until the next periodic one: the
    compaction delay and the retention overdue still grow with the clock at each
    refresh. They stayed as the last cycle left them (up to
    `log.retention.check.interval.ms` behind, five minutes by default), so the overdue
    alerts fired that much late."""
    _logs(tmp_path)
    topics = {
        "users": {"cleanup.policy": "compact", "max.compaction.lag.ms": HOUR // 2},
        "events": {"cleanup.policy": "delete", "retention.ms": HOUR},
    }
    settings = _settings(tmp_path, topics=topics, mode="observe")
    settings["log.retention.check.interval.ms"] = 24 * HOUR  # no periodic cycle here
    settings["metrics"]["refresh_interval_s"] = 0.05
    config_path = _write(tmp_path / "c.yaml", settings)
    clock = [_now_ms()]
    daemon = Daemon(
        load_config(config_path),
        config_path=config_path,
        notifier=Notifier(environ=notify_socket.environ),
        clock_ms=lambda: clock[0],
        timings=FAST,
    )
    delay, overdue = (
        "cleanerd_max_compaction_delay_seconds",
        "cleanerd_max_retention_overdue_seconds",
    )

    def read() -> tuple[float, float]:
        text = _scrape(daemon)
        return _largest(text, delay), _largest(text, overdue)

    async with running(daemon):
        await eventually(lambda: daemon.cycles >= 1 and read()[0] > 0, "the first cycle's gauges")
        await eventually(lambda: daemon._cycle_task is None, "the first cycle to end")
        cycles, before = daemon.cycles, read()
        assert min(before) > 0
        clock[0] += 600_000

        def grown() -> list[float]:
            return [round(now - then, 3) for now, then in zip(read(), before, strict=True)]

        await eventually(lambda: grown() == [600, 600], "both gauges 600 s on")
        assert daemon.cycles == cycles


async def test_pause_lets_the_pass_in_flight_finish_and_starts_no_other(
    config_path: Path, notify_socket: NotifyReceiver, tmp_path: Path
) -> None:
    """`pause` during a cycle: the running pass is not aborted, the cycle ends when it
    does, without starting the other eligible partition; after `resume` passes start."""
    now = _now_ms()
    keys = [[[kv(f"k{i}", f"v{n}", timestamp=now - HOUR) for i in range(10)]] for n in range(3)]
    build_log(tmp_path / "data", keys, state_dir=tmp_path / "state", tp=TopicPartition("users", 1))
    engine = BlockingEngine()
    daemon = _blocking_daemon(config_path, notify_socket, engine, FAST)
    async with running(daemon):
        await eventually(lambda: len(engine.submitted) == 1, "the first pass to start")
        await daemon.on_command(PauseCommand())
        engine.release()  # the pass in flight reports back
        await eventually(lambda: daemon.cycles == 1, "the drained cycle to end")
        assert len(engine.submitted) == 1
        assert engine.aborted == []
        await daemon.on_command(ResumeCommand())
        await eventually(lambda: len(engine.submitted) == 2, "a pass after resume")
        engine.release()


async def test_no_pass_is_rerun_once_the_passed_horizons_are_acted_on(
    tmp_path: Path, notify_socket: NotifyReceiver
) -> None:
    """A log whose tombstones went at their horizon gets no further pass, cycle after
    cycle (the demo topic's shape: batches of 20 over 40 keys, every 15th a tombstone)."""
    minute, t0 = 60_000, _now_ms() - HOUR
    data, state = tmp_path / "data", tmp_path / "state"
    batches = [
        [
            kv(f"k{(b * 20 + i) * 7 % 40}", None if i % 15 == 14 else "v", timestamp=t0 + b)
            for i in range(20)
        ]
        for b in range(15)
    ]
    build_log(data, [batches[:7], batches[7:14], batches[14:]], state_dir=state, tp=USERS)
    settings = _settings(tmp_path, topics={"users": {"cleanup.policy": "compact"}})
    settings["topics"]["users"]["delete.retention.ms"] = minute
    path = _write(tmp_path / "cleanerd.yaml", settings)
    for at in (t0, t0 + 2 * minute):  # stamp the horizons, then act on them
        assert main(["clean", "-c", str(path), "--now-ms", str(at)]) == 0
    daemon, events = _daemon(path, notify_socket)
    async with running(daemon):
        for n in range(1, 4):
            await eventually(partial(lambda n: daemon.cycles >= n, n), f"cycle {n}")
            daemon.request_cycle()
    assert events.of("log.cleaned") == []


async def test_the_daemon_keeps_what_it_knows_after_its_cycle(
    config_path: Path, notify_socket: NotifyReceiver, tmp_path: Path
) -> None:
    """While it runs, not only at its clean stop: a start after it was killed takes what
    it kept (`Maintenance.keep_known`)."""
    kept = known_segments_path(tmp_path / "state", tmp_path / "data")
    daemon, _ = _daemon(config_path, notify_socket)
    async with running(daemon):
        await eventually(lambda: daemon.cycles >= 1, "the first cycle")
        await eventually(kept.exists, "the known segments kept")


async def test_a_start_after_a_clean_stop_lists_no_unchanged_partition_dir(
    tmp_path: Path, notify_socket: NotifyReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watcher's first scan takes what the clean stop recorded of each partition dir
    and lists only dirs changed since: here none, then the one a segment was added to."""
    data, state = tmp_path / "data", tmp_path / "state"
    now = _now_ms()
    for tp in (USERS, EVENTS):
        build_log(data, [[[kv("k", "v", timestamp=now)]]], state_dir=state, tp=tp)
    config_path = _write(tmp_path / "cleanerd.yaml", _settings(tmp_path, topics={}))
    for run in range(2):  # the second stop finds the dirs as the first left them, settled
        daemon, _ = _daemon(config_path, notify_socket)
        async with running(daemon):
            await eventually(partial(_cycles_above, daemon, 0), "the first cycle")
        for tp in (USERS, EVENTS):
            if run == 0:
                settle_dir(data / str(tp))
    listed = counted_listings(monkeypatch)
    daemon, _ = _daemon(config_path, notify_socket)
    async with running(daemon):
        assert listed == []
        assert len(daemon.watcher.snapshot.partitions) == 2
    (data / str(USERS) / "00000000000000000009.log").write_bytes(b"")
    daemon, _ = _daemon(config_path, notify_socket)
    async with running(daemon):
        assert listed == [str(data / str(USERS))]
        assert daemon.watcher.snapshot.partitions[
            PartitionKey(str(data), USERS.topic, USERS.partition)
        ].segments == (0, 9)


class _SlowToStop(RecordingPublisher):
    """A connection still delivering when a reload replaces it, with one event it then
    cannot deliver."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.pending = [Event(kind="config.reloaded", time_ms=1)]

    async def stop(self) -> None:
        await self.release.wait()

    def undelivered(self) -> list[Event]:
        out, self.pending = self.pending, []
        return out


async def test_two_quick_mqtt_reloads_hand_the_first_connections_events_on(
    config_path: Path, notify_socket: NotifyReceiver
) -> None:
    """A second reload that changes `mqtt` while the first one's hand-over waits for the
    old connection to stop: the hand-overs run in turn, so the events the first
    connection could not deliver reach the last one. Before, the first hand-over gave
    them to the connection the second reload had already stopped: lost, uncounted."""
    daemon, _ = _daemon(config_path, notify_socket)
    first = _SlowToStop()
    daemon.publisher = first
    mqtt = daemon.config.mqtt.model_copy(update={"enabled": True, "port": 1})  # no broker
    config = daemon.config.model_copy(update={"mqtt": mqtt})
    await daemon._replace_publisher(config)
    await daemon._replace_publisher(config)
    last = daemon.publisher
    assert isinstance(last, MqttPublisher)
    await asyncio.sleep(0.1)  # the second hand-over's turn comes while the first waits
    first.release.set()
    await eventually(lambda: last.queued == 1, "the first connection's event queued last")
    await asyncio.gather(*daemon._tasks.values())
    await last.stop()
