"""sd_notify datagrams and watchdog settings, received on real AF_UNIX sockets."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from cleanerd.daemon.systemd import (
    Notifier,
    format_message,
    monotonic_usec,
    notify,
    notify_address,
    watchdog_interval,
)


def _receiver(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(5)
    return sock


@pytest.fixture(name="path_socket")
def _path_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A datagram socket bound to a path, named in $NOTIFY_SOCKET."""
    path = str(tmp_path / "notify.sock")
    with _receiver(path) as sock:
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        yield sock


@pytest.fixture(name="abstract_socket")
def _abstract_socket(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A datagram socket in the abstract namespace, named `@...` in $NOTIFY_SOCKET."""
    name = f"cleanerd-test-{uuid.uuid4().hex}"
    with _receiver("\0" + name) as sock:
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        yield sock


def _fields(sock: socket.socket) -> list[tuple[str, str]]:
    lines = sock.recv(4096).decode().split("\n")
    return [(key, value) for key, _, value in (line.partition("=") for line in lines)]


def test_notify_reaches_a_path_socket(path_socket: socket.socket) -> None:
    """notify() sends its fields, in order, as one datagram to a filesystem socket."""
    assert notify(READY=1, STATUS="watching 2 log dirs")
    assert _fields(path_socket) == [("READY", "1"), ("STATUS", "watching 2 log dirs")]


def test_notify_reaches_an_abstract_socket(abstract_socket: socket.socket) -> None:
    """An `@name` address is the abstract socket `\\0name`."""
    assert Notifier().ready()
    assert _fields(abstract_socket) == [("READY", "1")]


def test_notify_without_socket_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without $NOTIFY_SOCKET nothing is sent and every call reports False."""
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    notifier = Notifier()
    assert not notifier.enabled
    assert not notify(READY=1)
    assert not notifier.ready()
    assert not notifier.reloading()
    assert not notifier.stopping()
    assert not notifier.watchdog()


def test_reloading_carries_monotonic_usec(path_socket: socket.socket) -> None:
    """RELOADING=1 and MONOTONIC_USEC travel in the same datagram."""
    Notifier(clock=lambda: 123456789).reloading(status="reloading config")
    assert _fields(path_socket) == [
        ("RELOADING", "1"),
        ("MONOTONIC_USEC", "123456789"),
        ("STATUS", "reloading config"),
    ]


def test_reload_sequence_with_the_real_clock(path_socket: socket.socket) -> None:
    """A reload sends RELOADING with a current CLOCK_MONOTONIC time, then READY."""
    before = monotonic_usec()
    notifier = Notifier()
    notifier.reloading()
    notifier.ready(status="config reloaded")
    reloading = dict(_fields(path_socket))
    assert reloading["RELOADING"] == "1"
    assert before <= int(reloading["MONOTONIC_USEC"]) <= monotonic_usec()
    assert _fields(path_socket) == [("READY", "1"), ("STATUS", "config reloaded")]


def test_stopping_status_watchdog_extend(path_socket: socket.socket) -> None:
    """Each message of the Notifier is its own datagram with its own field."""
    notifier = Notifier()
    notifier.stopping()
    notifier.status("cleaning orders-0")
    notifier.watchdog()
    notifier.extend_timeout(30_000_000)
    assert [_fields(path_socket) for _ in range(4)] == [
        [("STOPPING", "1")],
        [("STATUS", "cleaning orders-0")],
        [("WATCHDOG", "1")],
        [("EXTEND_TIMEOUT_USEC", "30000000")],
    ]


def test_notifier_takes_an_explicit_environment(tmp_path: Path) -> None:
    """An injected environment replaces os.environ."""
    path = str(tmp_path / "n.sock")
    with _receiver(path) as sock:
        assert Notifier(environ={"NOTIFY_SOCKET": path}).stopping()
        assert _fields(sock) == [("STOPPING", "1")]


def test_a_socket_nobody_listens_at_is_logged_once_and_stops_nothing(tmp_path: Path) -> None:
    """A $NOTIFY_SOCKET nobody listens at (a supervisor passing it on, a manager gone) is
    said once, naming it, until a message gets through again; no call raises (the
    daemon's start failed on it, and a watchdog ping ended it without a clean stop)."""
    path = str(tmp_path / "gone.sock")
    notifier = Notifier(environ={"NOTIFY_SOCKET": path})
    with capture_logs() as logs:
        assert not notifier.ready("watching")
        assert not notifier.watchdog()
    (failed,) = logs
    assert (failed["event"], failed["socket"], failed["message"]) == (
        "systemd.notify_failed",
        path,
        "READY,STATUS",
    )
    with _receiver(path) as sock, capture_logs() as logs:
        assert notifier.watchdog()
        assert _fields(sock) == [("WATCHDOG", "1")]
    assert logs == []
    sock.close()
    Path(path).unlink()
    with capture_logs() as logs:
        assert not notifier.stopping()
    assert [e["event"] for e in logs] == ["systemd.notify_failed"]  # failing again: said


def test_a_receiver_that_stops_reading_costs_a_bounded_wait(tmp_path: Path) -> None:
    """A receiver whose queue is full (a stalled manager) makes a send fail after a
    bounded wait, which the notifier logs, instead of blocking its caller, the daemon's
    event loop, until the receiver reads: a test daemon pinging every 50 ms froze so."""
    path = str(tmp_path / "stalled.sock")
    notifier = Notifier(environ={"NOTIFY_SOCKET": path})
    outcomes: list[bool] = []

    def ping_until_refused() -> None:
        while not outcomes or outcomes[-1]:
            outcomes.append(notifier.watchdog())

    with _receiver(path), capture_logs() as logs:  # never read
        pinging = threading.Thread(target=ping_until_refused, daemon=True)
        pinging.start()
        pinging.join(30)
        assert not pinging.is_alive()
    assert outcomes[-1] is False
    assert all(outcomes[:-1])
    (failed,) = logs
    assert failed["event"] == "systemd.notify_failed"


@pytest.mark.parametrize("value", ["relative.sock", "@", "vsock:2:1234"])
def test_unsupported_addresses_are_errors(value: str) -> None:
    """A $NOTIFY_SOCKET that is neither a path nor an abstract name is reported."""
    with pytest.raises(ValueError, match="NOTIFY_SOCKET"):
        notify_address(value)


@pytest.mark.parametrize(
    "fields", [{}, {"STATUS": "two\nlines"}, {"A=B": "1"}], ids=["empty", "newline", "key-eq"]
)
def test_messages_that_would_break_the_format_are_refused(fields: dict[str, str]) -> None:
    """No empty message, no newline in a value, no '=' in a key."""
    with pytest.raises(ValueError, match="sd_notify"):
        format_message(fields)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4242"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4243"}, None),
        ({"WATCHDOG_USEC": "1000"}, 0.0005),
    ],
    ids=["off", "on", "our-pid", "other-pid", "short"],
)
def test_watchdog_interval(environ: dict[str, str], expected: float | None) -> None:
    """Pings come every WATCHDOG_USEC/2, and not at all for another WATCHDOG_PID."""
    assert watchdog_interval(environ, pid=4242) == expected


def test_watchdog_interval_defaults_to_our_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an explicit pid, WATCHDOG_PID is compared with this process."""
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert watchdog_interval() == 1.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert watchdog_interval() is None


@pytest.mark.parametrize("value", ["abc", "-5", "0", "1.5"])
def test_watchdog_interval_rejects_garbage(value: str) -> None:
    """A WATCHDOG_USEC that is not a positive integer is an error, not silence."""
    with pytest.raises(ValueError, match="WATCHDOG_USEC"):
        watchdog_interval({"WATCHDOG_USEC": value}, pid=1)
