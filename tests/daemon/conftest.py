"""Helpers for the daemon's tests: an sd_notify receiver, the daemon run in-process as a
task, a recording event sink, and (from `test_events`) the real mosquitto broker."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import pytest

from cleanerd.daemon import watcher
from cleanerd.daemon.events import Event, NullPublisher
from cleanerd.daemon.service import Daemon

# The mosquitto fixtures live with the publisher's own tests; importing the fixture
# function here makes `broker` available to every test in this directory.
from tests.daemon.test_events import _anonymous_broker  # noqa: F401

WAIT_S = 30.0
"""An upper bound for things that take milliseconds to seconds; never an assertion."""


@dataclass
class NotifyReceiver:
    """A datagram socket in the abstract namespace, as systemd's notify socket."""

    sock: socket.socket
    address: str
    """The `$NOTIFY_SOCKET` value (`@name`)."""
    history: list[dict[str, str]] = field(default_factory=list)

    @property
    def environ(self) -> dict[str, str]:
        return {"NOTIFY_SOCKET": self.address}

    def receive(self, timeout: float = WAIT_S) -> dict[str, str]:
        """The next datagram as a dict (blocking up to `timeout`)."""
        self.sock.settimeout(timeout)
        data = self.sock.recv(4096).decode()
        message = dict(line.partition("=")[::2] for line in data.split("\n"))
        self.history.append(message)
        return message

    def wait_for(self, key: str, timeout: float = WAIT_S) -> dict[str, str]:
        """The next datagram holding `key` (others are skipped but kept in `history`)."""
        while True:
            message = self.receive(timeout)
            if key in message:
                return message

    async def await_for(self, key: str) -> dict[str, str]:
        """`wait_for` without blocking the event loop."""
        return await asyncio.to_thread(self.wait_for, key)

    def kinds(self) -> list[str]:
        """The first key of every datagram received so far (WATCHDOG pings left out)."""
        return [next(iter(m)) for m in self.history if "WATCHDOG" not in m]


@pytest.fixture(name="notify_socket")
def _notify_socket() -> Iterator[NotifyReceiver]:
    """An abstract-namespace notify socket (no path-length limit, nothing to clean up)."""
    name = f"cleanerd-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        yield NotifyReceiver(sock, "@" + name)


class RecordingPublisher(NullPublisher):
    """An event sink that keeps every event."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[Event] = []

    def publish(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.kind == kind]


async def eventually(condition: Callable[[], bool], what: str) -> None:
    """Wait until `condition()` holds (fails after WAIT_S, naming `what`)."""
    try:
        async with asyncio.timeout(WAIT_S):
            while not condition():  # noqa: ASYNC110 - a plain predicate, nothing to await
                await asyncio.sleep(0.02)
    except TimeoutError:
        pytest.fail(f"timed out waiting for {what}")


@contextlib.asynccontextmanager
async def running(daemon: Daemon) -> AsyncIterator[asyncio.Task[int]]:
    """Serve `daemon` as a task until the block ends, then stop it as SIGTERM would."""
    task = asyncio.create_task(daemon.serve(), name="daemon")
    started = asyncio.ensure_future(daemon.started.wait())
    async with asyncio.timeout(WAIT_S):
        await asyncio.wait({task, started}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        started.cancel()
        pytest.fail(f"the daemon did not start: exit status {task.result()}")
    try:
        yield task
    finally:
        if not task.done():
            daemon.handle_term()
        async with asyncio.timeout(WAIT_S):
            await asyncio.wait({task})


def counted_listings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The partition dirs the watcher lists from now on (`watcher._list_segments`)."""
    listed: list[str] = []
    real = watcher._list_segments

    def counting(path: str) -> tuple[int, ...]:
        listed.append(path)
        return real(path)

    monkeypatch.setattr(watcher, "_list_segments", counting)
    return listed
