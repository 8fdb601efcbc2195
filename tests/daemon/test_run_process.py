"""`cleanerd run` as a real process under a fake service manager: sd_notify over a socket
the test reads, real signals, the log on stderr and the metrics over HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from cleanerd.daemon.systemd import monotonic_usec
from cleanerd.log.checkpoint import OffsetCheckpointFile
from cleanerd.log.files import CLEAN_SHUTDOWN_FILE_NAME, TopicPartition
from cleanerd.log.log_dir import LogDir, Mode
from tests.builders import build_log, kv
from tests.daemon.conftest import WAIT_S, NotifyReceiver
from tests.paths import REPO

HOUR = 3_600_000
USERS = TopicPartition("users", 0)
EVENTS = TopicPartition("events", 0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Process:
    """The daemon's process, its JSON log (stderr) and its metrics endpoint."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    metrics_url: str

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a traceback line, shown on failure
        return out

    def wait_log(self, predicate: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            for line in self.lines():
                if predicate(line):
                    return line
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        pytest.fail(f"no log line for {what}:\n{self.log_path.read_text()}")

    def metric(self, name: str) -> float | None:
        with urllib.request.urlopen(self.metrics_url, timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " ") or line.startswith(name + "{"):
                    return float(line.rsplit(" ", 1)[1])
        return None

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)


def _config(tmp_path: Path, port: int, *, events_retention_ms: int) -> dict[str, Any]:
    return {
        "log.dirs": [str(tmp_path / "data")],
        "state_dir": str(tmp_path / "state"),
        "log.cleaner.backoff.ms": 200,
        "metrics": {"listen": f"127.0.0.1:{port}", "refresh_interval_s": 0.2},
        "logging": {"format": "json", "level": "info"},
        "topics": {
            "users": {"cleanup.policy": "compact"},
            "events": {"cleanup.policy": "delete", "retention.ms": events_retention_ms},
        },
    }


@pytest.fixture(name="daemon")
def _daemon(tmp_path: Path, notify_socket: NotifyReceiver) -> Iterator[Process]:
    """`python -m cleanerd run -c FILE` with NOTIFY_SOCKET set; killed if still running."""
    now = time.time_ns() // 1_000_000
    data, state = tmp_path / "data", tmp_path / "state"
    updates = [[[kv(f"k{i}", f"v{n}", timestamp=now - HOUR) for i in range(10)]] for n in range(3)]
    build_log(data, updates, state_dir=state, tp=USERS)
    old = [[[kv(None, f"e{n}", timestamp=now - 3 * HOUR)]] for n in range(3)]
    build_log(data, old, state_dir=state, tp=EVENTS)
    port = _free_port()
    config = tmp_path / "cleanerd.yaml"
    config.write_text(yaml.safe_dump(_config(tmp_path, port, events_retention_ms=10 * HOUR)))
    log_path = tmp_path / "cleanerd.log"
    env = {
        **os.environ,
        "NOTIFY_SOCKET": notify_socket.address,
        "PYTHONPATH": str(REPO),
    }
    env.pop("WATCHDOG_USEC", None)
    with open(log_path, "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cleanerd", "run", "-c", str(config)],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        yield Process(proc, log_path, f"http://127.0.0.1:{port}/metrics")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_run_reload_and_stop_under_a_service_manager(
    daemon: Process, notify_socket: NotifyReceiver, tmp_path: Path
) -> None:
    """1. READY=1 after startup; the first cycle cleans the dirty partition.
    2. SIGHUP with a valid changed config: RELOADING=1 with MONOTONIC_USEC, READY=1, and
       the new retention.ms deletes the expired segments.
    3. SIGHUP with an invalid config: refused with its errors, the old config keeps
       running, the reload metric reads 0.
    4. SIGTERM: STOPPING=1, exit status 0, checkpoints written."""
    config = tmp_path / "cleanerd.yaml"
    port = int(daemon.metrics_url.rsplit(":", 1)[1].split("/")[0])

    ready = notify_socket.wait_for("READY")
    assert " partition" in ready["STATUS"]
    assert "(s)" not in ready["STATUS"]
    daemon.wait_log(
        lambda e: e["event"] == "log.cleaned" and e.get("topic") == "users", "the first pass"
    )
    assert daemon.metric("cleanerd_config_last_reload_successful") == 1.0

    config.write_text(yaml.safe_dump(_config(tmp_path, port, events_retention_ms=HOUR)))
    before = monotonic_usec()
    daemon.signal(signal.SIGHUP)
    reloading = notify_socket.wait_for("RELOADING")
    assert before <= int(reloading["MONOTONIC_USEC"]) <= monotonic_usec()
    notify_socket.wait_for("READY")
    reloaded = daemon.wait_log(lambda e: e["event"] == "config.reloaded", "the reload")
    assert reloaded["changed"] == ["topics.events.retention.ms"]
    deleted = daemon.wait_log(
        lambda e: e["event"] == "segment.deleted" and e.get("topic") == "events",
        "a deletion under the new retention.ms",
    )
    assert deleted["reason"] == "retention.ms"
    assert deleted["partition"] == 0

    config.write_text("log.dirs: [data]\nlog.cleaner.threads: 0\nmetrics: {listen: 1}\n")
    daemon.signal(signal.SIGHUP)
    notify_socket.wait_for("RELOADING")
    notify_socket.wait_for("READY")
    failed = daemon.wait_log(lambda e: e["event"] == "config.reload_failed", "the refusal")
    assert len(failed["errors"]) == 2
    deadline = time.monotonic() + WAIT_S
    while daemon.metric("cleanerd_config_last_reload_successful") != 0.0:
        assert time.monotonic() < deadline, "the reload metric never read 0"
        time.sleep(0.05)
    assert daemon.proc.poll() is None  # still running, on the old config

    daemon.signal(signal.SIGTERM)
    notify_socket.wait_for("STOPPING")
    assert daemon.proc.wait(timeout=WAIT_S) == 0
    data = tmp_path / "data"
    assert USERS in OffsetCheckpointFile(data / "cleaner-offset-checkpoint").read()
    recovery = OffsetCheckpointFile(data / "recovery-point-offset-checkpoint").read()
    assert set(recovery) == {USERS, EVENTS}
    assert daemon.lines()[-1]["event"] == "shutdown.done"


def test_invalid_config_fails_startup_with_every_error(tmp_path: Path) -> None:
    """`cleanerd run` on an invalid file exits 1 before starting, naming every error."""
    config = tmp_path / "bad.yaml"
    config.write_text("log.dirs: [data]\nlog.cleaner.threads: 0\nmode: maybe\n")
    result = subprocess.run(
        [sys.executable, "-m", "cleanerd", "run", "-c", str(config)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert result.returncode == 1
    assert "log.cleaner.threads" in result.stderr
    assert "mode" in result.stderr


def test_unusable_log_dir_fails_startup_naming_the_key(tmp_path: Path) -> None:
    """`cleanerd run` with a file where a log dir should be exits 1 and its
    `startup.failed` line names the key and the path."""
    (tmp_path / "data").write_text("not a dir")
    failed = _failed_start(tmp_path, "127.0.0.1:0")
    assert f"log.dirs[0]: {str(tmp_path / 'data')!r} is a file, not a directory" in failed["error"]


def _failed_start(tmp_path: Path, listen: str) -> dict[str, Any]:
    """`cleanerd run` of log dir `<tmp_path>/data` with `metrics.listen` at `listen`,
    which must exit 1 at its start: its `startup.failed` line."""
    config = tmp_path / "cleanerd.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "log.dirs": [str(tmp_path / "data")],
                "state_dir": str(tmp_path / "state"),
                "metrics": {"listen": listen},
                "logging": {"format": "json"},
            }
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "cleanerd", "run", "-c", str(config)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    lines = [json.loads(x) for x in result.stderr.splitlines() if x.startswith("{")]
    failed: dict[str, Any] = next(x for x in lines if x["event"] == "startup.failed")
    return failed


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()
    }


def test_a_metrics_port_in_use_fails_startup_before_a_log_dir_is_touched(
    tmp_path: Path,
) -> None:
    """`cleanerd run` whose `metrics.listen` is taken exits 1 naming the key and the
    address, and leaves the log dir as it was: Kafka's clean-shutdown marker is still
    there (opening the dir takes it, and a start that fails after that costs the next
    one, cleanerd's or a broker's, a full recovery)."""
    data, state = tmp_path / "data", tmp_path / "state"
    build_log(data / "users-0", [[[kv("k", "v")]], [[kv("k", "w")]]], state_dir=state, tp=USERS)
    (data / CLEAN_SHUTDOWN_FILE_NAME).write_text('{"version":0,"brokerEpoch":-1}')
    before = _files(data)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = f"127.0.0.1:{taken.getsockname()[1]}"
        failed = _failed_start(tmp_path, listen)
    assert failed["error"].startswith(f"metrics.listen {listen}: cannot bind: ")
    assert _files(data) == before


def test_second_owner_is_refused_naming_the_first(tmp_path: Path) -> None:
    """While one cleanerd process owns the log dir (here this test, through the same state
    dir, as a running daemon would, its metrics endpoint on the config's port too),
    `cleanerd run` and `cleanerd clean` on the same config exit 1 naming its pid, and
    write nothing. `run` said only that the port was in use: it binds the port before it
    opens a dir."""
    data, state = tmp_path / "data", tmp_path / "state"
    data.mkdir()
    config = tmp_path / "cleanerd.yaml"
    with contextlib.ExitStack() as held:
        endpoint = held.enter_context(socket.socket())
        endpoint.bind(("127.0.0.1", 0))
        endpoint.listen()
        first = held.enter_context(LogDir.open(data, state_dir=state))
        config.write_text(
            yaml.safe_dump(
                {
                    "log.dirs": [str(data)],
                    "state_dir": str(state),
                    "metrics": {"listen": f"127.0.0.1:{endpoint.getsockname()[1]}"},
                    "logging": {"format": "json"},
                }
            )
        )
        assert first.mode is Mode.OWNER
        before = sorted(p.name for p in data.iterdir())
        for command in ("run", "clean"):
            result = subprocess.run(
                [sys.executable, "-m", "cleanerd", command, "-c", str(config)],
                cwd=tmp_path,
                env={**os.environ, "PYTHONPATH": str(REPO)},
                capture_output=True,
                text=True,
                timeout=WAIT_S,
                check=False,
            )
            assert result.returncode == 1, (command, result.stdout, result.stderr)
            said = result.stdout + result.stderr
            assert f"owned by another cleanerd process (pid {os.getpid()}" in said, command
            assert sorted(p.name for p in data.iterdir()) == before


@pytest.mark.parametrize(
    ("stopped", "own_state"),
    [(False, True), (True, True), (False, False)],
    ids=["produce-ends", "sigterm", "produce-of-another-state-dir"],
)
def test_a_start_waits_for_a_produce_that_owns_the_dir(
    tmp_path: Path, stopped: bool, own_state: bool
) -> None:
    """An application's `cleanerd produce` owns one of the dirs as the daemon starts: the
    start waits for it (`startup.waiting_for_owner`, naming the command) with no dir
    opened, so the other dir keeps its clean-shutdown marker, then takes the dirs and
    runs; a SIGTERM while it waits stops it with status 0. So too for a `produce` whose
    config has another state dir (it was taken for a broker: the dir stayed observed,
    maintained by nothing, until a restart). It exited 1 at once, naming a 'running
    daemon or `cleanerd clean`': under systemd, a restart loop while appends kept landing
    at start time."""
    data, other, state = tmp_path / "data", tmp_path / "other", tmp_path / "state"
    data.mkdir()
    other.mkdir()
    marker = other / CLEAN_SHUTDOWN_FILE_NAME
    marker.write_text('{"version":0,"brokerEpoch":-1}')
    config = tmp_path / "cleanerd.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "log.dirs": [str(other), str(data)],
                "state_dir": str(state),
                "metrics": {"listen": "127.0.0.1:0"},
                "logging": {"format": "json"},
            }
        )
    )
    app = tmp_path / "app.yaml"
    app.write_text(yaml.safe_dump({"log.dirs": [str(data)], "state_dir": str(tmp_path / "app")}))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "cleanerd"]
    produce = ["produce", "-c", str(config if own_state else app), "--log-dir", str(data)]
    with subprocess.Popen(
        [*command, *produce, "t-0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    ) as producer:
        assert producer.stdin is not None
        producer.stdin.write('{"key": "a", "value": "1"}\n')  # appended at the end
        producer.stdin.flush()
        deadline = time.monotonic() + WAIT_S  # until it holds the dir: its partition made
        while not (data / "t-0").is_dir() and time.monotonic() < deadline:
            time.sleep(0.05)
        log_path = tmp_path / "run.log"
        with open(log_path, "wb") as log_file:
            daemon = subprocess.Popen(
                [*command, "run", "-c", str(config)], stderr=log_file, env=env, cwd=tmp_path
            )
        try:
            process = Process(daemon, log_path, "")
            waiting = process.wait_log(
                lambda e: e["event"] == "startup.waiting_for_owner", "the wait"
            )
            assert waiting["log_dir"] == str(data)
            assert f"pid {producer.pid}" in waiting["holder"]
            assert "`cleanerd produce`" in waiting["holder"]
            assert marker.exists()  # no dir opened while it waits
            if stopped:
                daemon.send_signal(signal.SIGTERM)
                assert daemon.wait(WAIT_S) == 0
                assert marker.exists()
                assert "startup.failed" not in log_path.read_text()
                return
            producer.stdin.close()
            assert producer.wait(WAIT_S) == 0
            process.wait_log(lambda e: e["event"] == "startup.done", "the start")
            assert "observe_forced" not in log_path.read_text()  # it owns both
            daemon.send_signal(signal.SIGTERM)
            assert daemon.wait(WAIT_S) == 0
        finally:
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait()


def test_a_log_reader_gone_costs_the_lines_not_the_cycles_or_the_stop(tmp_path: Path) -> None:
    """`cleanerd run 2>&1 | tee …` whose `tee` dies: every later log line meets EPIPE.
    The lines are dropped; cycles still run and succeed (the metrics say so), and
    SIGTERM still stops the daemon with status 0. Before, each cycle failed on its own
    log lines, and the SIGTERM handler's line lost the stop: it spun until killed."""
    now = time.time_ns() // 1_000_000
    build_log(
        tmp_path / "data",
        [[[kv(f"k{i}", f"v{n}", timestamp=now - HOUR) for i in range(10)]] for n in range(3)],
        state_dir=tmp_path / "state",
        tp=USERS,
    )
    port = _free_port()
    config = _config(tmp_path, port, events_retention_ms=10 * HOUR)
    config["logging"]["level"] = "debug"  # a line at every tick: the pipe breaks at once
    (tmp_path / "cleanerd.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.Popen(
        [sys.executable, "-m", "cleanerd", "run", "-c", str(tmp_path / "cleanerd.yaml")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if b'"startup.done"' in line:
                break
        proc.stderr.close()  # the reader is gone
        url = f"http://127.0.0.1:{port}/metrics"
        process = Process(proc, tmp_path / "unused.log", url)
        deadline = time.monotonic() + WAIT_S
        done = 0.0
        while time.monotonic() < deadline and done < 2:
            time.sleep(0.2)
            done = process.metric('cleanerd_cycles_total{result="done"}') or 0.0
        assert done >= 2, "cycles stopped succeeding once the log's reader was gone"
        assert process.metric('cleanerd_cycles_total{result="failed"}') == 0.0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
