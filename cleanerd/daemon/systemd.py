"""systemd's notify protocol (sd_notify(3)), written out instead of linking libsystemd.

Wire format: one datagram on an `AF_UNIX`/`SOCK_DGRAM` socket to the address in
`$NOTIFY_SOCKET`, holding newline-separated `KEY=VALUE` lines. An address starting with
`/` is a filesystem path; one starting with `@` is in Linux's abstract namespace (the `@`
stands for a leading NUL byte). Without `$NOTIFY_SOCKET` the process is not supervised by
a notify-type unit, and every call here does nothing.

Messages cleanerd sends: `READY=1` once started (and after every reload), `RELOADING=1`
with `MONOTONIC_USEC=` in the same datagram when a SIGHUP reload begins (systemd ignores a
reload notification without the timestamp), `STOPPING=1` when shutdown begins, `STATUS=`
for `systemctl status`, and `WATCHDOG=1` while the event loop is healthy. The watchdog
pings come from a task on the event loop itself, so a blocked loop stops them and systemd
restarts the service.

A datagram socket's send blocks while the receiver's queue is full (ten datagrams by
default, `net.unix.max_dgram_qlen`): a manager that stalls, or a supervisor that passes
`$NOTIFY_SOCKET` on and reads it slowly, would freeze the event loop that sends. A send
waits at most `SEND_TIMEOUT_S`, then fails as a manager gone does.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Final

from cleanerd.logger import get_logger

log = get_logger(__name__)

NOTIFY_SOCKET: Final = "NOTIFY_SOCKET"
WATCHDOG_USEC: Final = "WATCHDOG_USEC"
WATCHDOG_PID: Final = "WATCHDOG_PID"
SEND_TIMEOUT_S: Final = 0.5

FieldValue = str | int


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC in microseconds, the clock systemd compares MONOTONIC_USEC with."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def notify_address(value: str) -> str:
    """The socket address for a `$NOTIFY_SOCKET` value: `@name` becomes `\\0name`.

    Raises ValueError for anything but a path or an abstract name (systemd's `vsock:`
    addresses are not supported), so a misconfigured environment is reported, not ignored.
    """
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    raise ValueError(
        f"{NOTIFY_SOCKET}={value!r}: only AF_UNIX paths (/...) and abstract names (@...) "
        "are supported"
    )


def format_message(fields: Mapping[str, FieldValue]) -> bytes:
    """The datagram for `fields`, in their order. Raises ValueError on an empty message or
    a key or value that would break the line format."""
    if not fields:
        raise ValueError("an sd_notify message needs at least one field")
    lines = []
    for key, value in fields.items():
        text = str(value)
        if not key or "=" in key or "\n" in key or "\n" in text:
            raise ValueError(f"sd_notify field {key!r}={text!r}: no '=' in keys, no newlines")
        lines.append(f"{key}={text}")
    return "\n".join(lines).encode()


def notify(*, environ: Mapping[str, str] | None = None, **fields: FieldValue) -> bool:
    """Send `fields` (e.g. `READY=1`) to the service manager.

    Returns False without doing anything when `$NOTIFY_SOCKET` is unset, True once the
    datagram is sent. A socket error (the manager went away), or a receiver's queue still
    full after `SEND_TIMEOUT_S` (TimeoutError), propagates as OSError.
    """
    env = os.environ if environ is None else environ
    value = env.get(NOTIFY_SOCKET)
    if not value:
        return False
    address = notify_address(value)
    message = format_message(fields)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(SEND_TIMEOUT_S)
        sock.sendto(message, address)
    return True


def watchdog_interval(
    environ: Mapping[str, str] | None = None, pid: int | None = None
) -> float | None:
    """Seconds between `WATCHDOG=1` pings: half of `$WATCHDOG_USEC`, as sd_watchdog_enabled(3)
    recommends. None when the watchdog is off or meant for another process
    (`$WATCHDOG_PID` set and not `pid`, default our own). Raises ValueError on a value
    that is not a positive integer."""
    env = os.environ if environ is None else environ
    usec_text = env.get(WATCHDOG_USEC)
    if not usec_text:
        return None
    pid_text = env.get(WATCHDOG_PID)
    if pid_text:
        owner = _positive_int(WATCHDOG_PID, pid_text)
        if owner != (os.getpid() if pid is None else pid):
            return None
    return _positive_int(WATCHDOG_USEC, usec_text) / 2 / 1_000_000


def _positive_int(name: str, text: str) -> int:
    if not text.isascii() or not text.isdigit() or int(text) <= 0:
        raise ValueError(f"{name}={text!r}: must be a positive integer")
    return int(text)


class Notifier:
    """The messages cleanerd sends, each one datagram; all no-ops when not under systemd.

    `environ` is read at every call (default `os.environ`); `clock` gives MONOTONIC_USEC.
    A datagram that cannot be sent (nobody listens at `$NOTIFY_SOCKET`: a supervisor that
    passes it on without serving it, a manager gone) is logged, once until one gets
    through again, and the daemon runs on, as a caller of sd_notify(3) gets its error
    back: a side channel must not stop the service, nor cost it its clean stop.
    """

    def __init__(
        self,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], int] = monotonic_usec,
    ) -> None:
        self._environ = environ
        self._clock = clock
        self._failing: str | None = None
        """The error of the last datagram that could not be sent, until one is."""

    @property
    def enabled(self) -> bool:
        """Whether a service manager listens (`$NOTIFY_SOCKET` is set)."""
        env = os.environ if self._environ is None else self._environ
        return bool(env.get(NOTIFY_SOCKET))

    def ready(self, status: str | None = None) -> bool:
        """Startup (or a reload) finished."""
        return self._send({"READY": 1}, status)

    def reloading(self, status: str | None = None) -> bool:
        """A reload begins; MONOTONIC_USEC rides in the same datagram."""
        return self._send({"RELOADING": 1, "MONOTONIC_USEC": self._clock()}, status)

    def stopping(self, status: str | None = None) -> bool:
        """Shutdown begins."""
        return self._send({"STOPPING": 1}, status)

    def status(self, text: str) -> bool:
        """A one-line status for `systemctl status`."""
        return self._send({}, text)

    def watchdog(self) -> bool:
        """The loop is alive and healthy."""
        return self._send({"WATCHDOG": 1}, None)

    def extend_timeout(self, usec: int) -> bool:
        """Ask for `usec` more before the start (or stop) timeout kills us."""
        return self._send({"EXTEND_TIMEOUT_USEC": usec}, None)

    def _send(self, fields: dict[str, FieldValue], status: str | None) -> bool:
        if status is not None:
            fields["STATUS"] = status
        try:
            sent = notify(environ=self._environ, **fields)
        except OSError as exc:
            if self._failing != str(exc):
                self._failing = str(exc)
                env = os.environ if self._environ is None else self._environ
                log.warning(
                    "systemd.notify_failed",
                    socket=env.get(NOTIFY_SOCKET),
                    message=",".join(fields),
                    error=str(exc),
                    consequence="the service manager hears nothing (readiness, watchdog) "
                    "until a message gets through; the daemon runs on",
                )
            return False
        self._failing = None
        return sent
