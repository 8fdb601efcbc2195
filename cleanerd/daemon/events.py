"""Events out and commands in over MQTT (aiomqtt 2.x), never in the way of cleaning.

Topics, under `<prefix>/<host>` (prefix `mqtt.topic_prefix`, default `cleanerd`):

- `events/<kind>`: one JSON object per event, QoS 1, not retained:
  `{"kind", "time_ms", "topic"?, "partition"?, "log_dir"?, "data": {...}}`;
- `status`: retained `online` once connected; retained `offline` on a clean stop, and
  the same as the last will, which the broker publishes when the connection dies;
- `commands/<name>`: subscribed (QoS 1) when the daemon gives a command handler; each
  message gets a `command.accepted` or `command.rejected` event back (see `commands`).
  The subscription is `commands/#`, so a message on a deeper topic, or on `commands`
  itself, is answered with a rejection too rather than going unnoticed.

Retained commands are refused, because they would run again at every reconnect. A broker
marks a retained message as such when it delivers it because a subscription was just
made, but MQTT 3.1.1 has it clear the flag when it forwards a message live, so a
retained command sent while the daemon is subscribed would look like any other. The
client therefore speaks MQTT 5 (mosquitto 1.6 and later, and the other current brokers)
and subscribes with Retain As Published: the flag then reaches the daemon either way.

Why cleaning never waits for the broker: `publish()` is synchronous and only puts the
event into a bounded queue (`mqtt.queue_size` while the broker is away, `CONNECTED_BURST`
times that while it is connected); when the queue is full it drops the oldest event and
counts it (`dropped`, exported as `cleanerd_events_dropped_total`). One supervised task owns the
connection: it connects, drains the queue, and after any failure reconnects with capped
exponential backoff and jitter. Only a session that lasted `STABLE_S` starts the backoff
over: one the broker ends at once, again and again (another client connecting with the
same client id takes the session over each time), backs off like a failed connect. An
event taken from the queue is held until the broker acknowledges it, so a connection
lost mid-publish resends it on the next connection (QoS 1 is at-least-once; a
subscriber may see it twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Literal, Protocol

import aiomqtt
import structlog
from paho.mqtt.subscribeoptions import SubscribeOptions
from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

from cleanerd.config import MqttConfig
from cleanerd.daemon.commands import CommandHandler, CommandReply, handle_command
from cleanerd.daemon.credentials import read_password, tls_context
from cleanerd.retention.policy import DeletionReason

EventKind = Literal[
    "segment.rolled",
    "log.cleaned",
    "segment.deleted",
    "disk.pressure",
    "partition.uncleanable",
    "clean.request_dropped",
    "config.reloaded",
    "command.accepted",
    "command.rejected",
]
ONLINE: Final = "online"
OFFLINE: Final = "offline"
_TOPIC_LEVEL_FORBIDDEN: Final = str.maketrans({c: "_" for c in "/+#\0"})

log = structlog.get_logger("cleanerd.events")


class Event(BaseModel):
    """One event; `time_ms` is wall-clock milliseconds, supplied by the emitter."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    kind: EventKind
    time_ms: int = Field(ge=0)
    topic: str | None = None
    partition: int | None = Field(default=None, ge=0)
    log_dir: str | None = None
    data: dict[str, JsonValue] = {}

    @model_validator(mode="after")
    def _consistent(self) -> Event:
        if (self.topic is None) != (self.partition is None):
            raise ValueError("topic and partition go together")
        if self.kind == "segment.deleted":
            reasons = [str(r) for r in DeletionReason]
            if self.data.get("reason") not in reasons:
                raise ValueError(f"segment.deleted needs data.reason, one of {reasons}")
        return self

    def to_json(self) -> bytes:
        """The MQTT payload: compact JSON without the unset optional fields."""
        return self.model_dump_json(exclude_none=True).encode()


def reply_event(reply: CommandReply, now_ms: int) -> Event:
    """The `command.accepted` or `command.rejected` event for `reply`."""
    data: dict[str, JsonValue] = {"command": reply.command}
    if reply.id is not None:
        data["id"] = reply.id
    if reply.reason is not None:
        data["reason"] = reply.reason
    return Event(
        kind="command.accepted" if reply.accepted else "command.rejected",
        time_ms=now_ms,
        topic=reply.topic,
        partition=reply.partition,
        data=data,
    )


class EventPublisher(Protocol):
    """What the daemon needs from an event sink; the counters feed the metrics."""

    published: int
    dropped: int

    @property
    def connected(self) -> bool: ...

    def publish(self, event: Event) -> None:
        """Queue `event`; never blocks, never raises for a broker problem."""

    async def start(self) -> None:
        """Begin delivering (returns at once; delivery runs in the background)."""

    async def stop(self) -> None:
        """Deliver what is queued within a bounded time and close."""

    def undelivered(self) -> list[Event]:
        """After `stop`: the events it could not deliver, oldest first (taken out)."""

    def adopt(self, events: Sequence[Event]) -> None:
        """Queue `events` (a replaced publisher's undelivered ones) ahead of this one's."""


class NullPublisher:
    """The sink when MQTT is off: every event is discarded, nothing is counted."""

    def __init__(self) -> None:
        self.published = 0
        self.dropped = 0

    @property
    def connected(self) -> bool:
        return False

    def publish(self, event: Event) -> None:
        del event

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def undelivered(self) -> list[Event]:
        return []

    def adopt(self, events: Sequence[Event]) -> None:
        del events  # MQTT was turned off: nothing is sent


CONNECTED_BURST: Final = 100
"""While connected, the queue holds this many times `mqtt.queue_size` (see `publish`)."""
STABLE_S: Final = 10.0
"""A session connected at least this long was a working connection: the next reconnect
starts the backoff over."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential backoff with jitter: attempt n waits a random time in
    [d/2, d], d = min(max_s, initial_s * 2**n), so many daemons that lost one broker do
    not all come back at the same instant."""

    initial_s: float = 0.5
    max_s: float = 60.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before reconnect attempt `attempt` (0 is the first retry)."""
        ceiling = min(self.max_s, self.initial_s * 2 ** min(attempt, 64))
        return rng.uniform(ceiling / 2, ceiling)


def command_name(topic: str, base_topic: str) -> str | None:
    """The command a message on `topic` asks for: everything after
    `<base_topic>/commands/` (empty for `commands` itself; it may hold `/`, which
    `parse_command` rejects), or None for a topic outside `commands`."""
    commands = f"{base_topic}/commands"
    if topic == commands:
        return ""
    if topic.startswith(commands + "/"):
        return topic.removeprefix(commands + "/")
    return None


def topic_level(name: str) -> str:
    """`name` made safe as one MQTT topic level (no `/`, `+`, `#` or NUL)."""
    return name.translate(_TOPIC_LEVEL_FORBIDDEN) or "_"


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class MqttPublisher:
    """Events to an MQTT broker, and commands from it, through one supervised task.

    Construct it with the `mqtt` settings (the password file and TLS files are read
    here, so a bad path fails at startup); `start()` inside the running loop; `publish()`
    from the loop's thread; `stop()` on shutdown. `host` names this daemon in the topics
    (default: the host name).
    """

    def __init__(
        self,
        settings: MqttConfig,
        *,
        host: str | None = None,
        on_command: CommandHandler | None = None,
        backoff: Backoff = Backoff(),
        rng: random.Random | None = None,
        clock_ms: Callable[[], int] = _wall_ms,
        stop_timeout_s: float = 5.0,
    ) -> None:
        self._settings = settings
        self.host = topic_level(host if host is not None else socket.gethostname())
        self.base_topic = f"{settings.topic_prefix}/{self.host}"
        self._client_id = settings.client_id or f"cleanerd-{self.host}"
        self._password = read_password(settings.password_file) if settings.password_file else None
        self._tls = tls_context(settings.tls)
        self._on_command = on_command
        self._backoff = backoff
        self._rng = rng if rng is not None else random.Random()
        self._clock_ms = clock_ms
        self._stop_timeout_s = stop_timeout_s
        self._queue: asyncio.Queue[Event] = asyncio.Queue()  # bounded in `publish`
        self._queue_size = settings.queue_size
        self._inflight: Event | None = None
        self._client: aiomqtt.Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        """Set by `stop()`, for good: the session loop ends at its next turn even if a
        cancellation was lost in the session's teardown, and `start()` starts nothing."""
        self._attempt = 0
        self._connected_at: float | None = None
        """When the current session connected (monotonic seconds)."""
        self._overflowing = False
        self.published = 0
        self.dropped = 0

    @property
    def status_topic(self) -> str:
        return f"{self.base_topic}/status"

    def event_topic(self, kind: str) -> str:
        return f"{self.base_topic}/events/{kind}"

    @property
    def connected(self) -> bool:
        """Whether a broker connection is up now."""
        return self._client is not None

    @property
    def queued(self) -> int:
        """Events waiting for the broker, the one in flight included."""
        return self._queue.qsize() + (self._inflight is not None)

    def publish(self, event: Event) -> None:
        """Queue `event`; when the queue is full, drop the oldest queued events. Full is
        `queue_size` while the broker is away, `CONNECTED_BURST` times that while it is
        connected: a cycle hands over all its events at its end (thousands, on a big
        host's first cycle), which a connected broker takes in a moment, and the bound
        alone dropped most of them."""
        limit = self._queue_size * (CONNECTED_BURST if self.connected else 1)
        while self._queue.qsize() >= limit:
            self._queue.get_nowait()
            self._queue.task_done()
            self.dropped += 1
            if not self._overflowing:
                self._overflowing = True
                log.warning("mqtt.events_dropping", queue_size=self._queue_size)
        self._queue.put_nowait(event)

    async def start(self) -> None:
        """Start the connection task; returns at once (a broker outage never delays startup).
        A publisher stopped before it started never starts (a reload replaced it)."""
        if self._task is None and not self._stopped:
            self._task = asyncio.create_task(self._run(), name="mqtt-publisher")

    async def stop(self) -> None:
        """Deliver queued events for up to `stop_timeout_s` (only if connected), publish
        the retained `offline` status, and disconnect cleanly so the will is not sent.
        The session task ends whatever happens meanwhile (a stop cancelled midway)."""
        self._stopped = True
        task = self._task
        if task is None:
            return
        try:
            timeout = self._stop_timeout_s
            if self._client is not None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._queue.join()
            client = self._client
            if client is not None:
                with contextlib.suppress(aiomqtt.MqttError):
                    await client.publish(
                        self.status_topic, OFFLINE, qos=1, retain=True, timeout=timeout
                    )
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self._task = None

    def undelivered(self) -> list[Event]:
        events = [] if self._inflight is None else [self._inflight]
        self._inflight = None
        while not self._queue.empty():
            events.append(self._queue.get_nowait())
            self._queue.task_done()
        return events

    def adopt(self, events: Sequence[Event]) -> None:
        # Through `publish`, oldest first: an overflow drops the oldest and counts it.
        for event in [*events, *self.undelivered()]:
            self.publish(event)

    async def _run(self) -> None:
        while not self._stopped:
            try:
                await self._session()
            except* aiomqtt.MqttError as group:
                lasted = self._session_ended()
                # A lost connection is news, a broker still away at each retry is not:
                # the first failure and every tenth retry are warnings, the rest debug.
                logged = log.warning if self._attempt % 10 == 0 else log.debug
                fields: dict[str, object] = {}
                if lasted is not None and lasted < STABLE_S:
                    fields["connected_s"] = round(lasted, 3)
                    fields["consequence"] = (
                        "the broker ended the session as soon as it began: backing off; "
                        "is another client using the same mqtt.client_id (a second "
                        "cleanerd on this host)?"
                    )
                logged(
                    "mqtt.disconnected",
                    broker=f"{self._settings.host}:{self._settings.port}",
                    error="; ".join(str(e) for e in group.exceptions),
                    failed_attempts=self._attempt + 1,
                    **fields,
                )
            except* Exception:
                self._session_ended()
                log.exception("mqtt.session_failed")
            finally:
                self._client = None
            if self._stopped:
                # The cancellation of `stop()` can be lost: a session's task group that
                # fails on a dropped connection while it is cancelled raises that
                # failure, not the cancellation.
                return
            delay = self._backoff.delay(self._attempt, self._rng)
            self._attempt += 1
            await asyncio.sleep(delay)

    def _session_ended(self) -> float | None:
        """How long the session that just ended was connected (None: it never was); one
        that lasted `STABLE_S` starts the backoff over."""
        if self._connected_at is None:
            return None
        lasted, self._connected_at = time.monotonic() - self._connected_at, None
        if lasted >= STABLE_S:
            self._attempt = 0
        return lasted

    def _new_client(self) -> aiomqtt.Client:
        settings = self._settings
        return aiomqtt.Client(
            settings.host,
            settings.port,
            username=settings.username,
            password=self._password,
            identifier=self._client_id,
            protocol=aiomqtt.ProtocolVersion.V5,  # for Retain As Published: see the docstring
            will=aiomqtt.Will(self.status_topic, OFFLINE, qos=1, retain=True),
            keepalive=settings.keepalive_s,
            tls_context=self._tls,
        )

    async def _session(self) -> None:
        client = self._new_client()
        async with client:
            self._connected_at = time.monotonic()
            await client.publish(self.status_topic, ONLINE, qos=1, retain=True)
            if self._on_command is not None:
                await client.subscribe(
                    f"{self.base_topic}/commands/#",
                    options=SubscribeOptions(qos=1, retainAsPublished=True),
                )
            self._client = client
            self._overflowing = False
            log.info(
                "mqtt.connected",
                broker=f"{self._settings.host}:{self._settings.port}",
                failed_attempts=self._attempt,
            )
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._send_events(client))
                tasks.create_task(self._receive_commands(client))

    async def _send_events(self, client: aiomqtt.Client) -> None:
        while True:
            if self._inflight is None:
                self._inflight = await self._queue.get()
            event = self._inflight
            await client.publish(self.event_topic(event.kind), event.to_json(), qos=1)
            self._inflight = None
            self.published += 1
            self._queue.task_done()

    async def _receive_commands(self, client: aiomqtt.Client) -> None:
        """Answer commands; also ends the session (by raising) when the connection drops,
        which cancels a publish that waits for an acknowledgement that will never come."""
        async for message in client.messages:
            name = command_name(message.topic.value, self.base_topic)
            if self._on_command is None or name is None:
                continue
            reply = await handle_command(
                name, _payload_bytes(message.payload), self._on_command, retained=message.retain
            )
            if reply is not None:
                self.publish(reply_event(reply, self._clock_ms()))


def make_publisher(
    settings: MqttConfig, *, host: str | None = None, on_command: CommandHandler | None = None
) -> EventPublisher:
    """An MqttPublisher when `mqtt.enabled` (its password and TLS files are read here:
    ConfigError), else a NullPublisher."""
    if not settings.enabled:
        return NullPublisher()
    return MqttPublisher(settings, host=host, on_command=on_command)


def _payload_bytes(payload: object) -> bytes:
    if isinstance(payload, bytes | bytearray):
        return bytes(payload)
    if payload is None:
        return b""
    return str(payload).encode()
