"""The daemon's MQTT events and commands against a real mosquitto broker on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
import yaml
from structlog.testing import capture_logs

from cleanerd.config import load_config
from cleanerd.daemon.events import MqttPublisher
from cleanerd.daemon.service import Daemon, Timings
from cleanerd.daemon.systemd import Notifier
from cleanerd.log.files import TopicPartition
from tests.builders import build_log, kv
from tests.daemon.conftest import WAIT_S, NotifyReceiver, eventually, running
from tests.daemon.test_events import FAST, HOST, Broker, _subscriber

HOUR = 3_600_000
BASE = f"cleanerd/{HOST}"

pytestmark = pytest.mark.network


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _dirty(tmp_path: Path, tp: TopicPartition, *, timestamp: int) -> None:
    """Three segments rewriting the same five keys: dirty ratio 1 once rolled."""
    segments = [[[kv(f"k{i}", f"v{n}", timestamp=timestamp) for i in range(5)]] for n in range(3)]
    build_log(tmp_path / "data", segments, state_dir=tmp_path / "state", tp=tp)


def _config(tmp_path: Path, broker: Broker) -> Path:
    data: dict[str, Any] = {
        "log.dirs": [str(tmp_path / "data")],
        "state_dir": str(tmp_path / "state"),
        # No cycle starts by itself after startup: only the commands below start one.
        "log.cleaner.backoff.ms": HOUR,
        "log.retention.check.interval.ms": HOUR,
        "metrics": {"listen": "127.0.0.1:0"},
        "mqtt": {"enabled": True, "host": "127.0.0.1", "port": broker.port},
        "topics": {
            "users": {"cleanup.policy": "compact"},
            "sessions": {"cleanup.policy": "compact", "segment.ms": 1000},
            # Never eligible by ratio (1.0 is never exceeded) nor by lag: only forced.
            "ledger": {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 1.0},
            "events": {"cleanup.policy": "delete", "retention.ms": HOUR},
        },
    }
    path = tmp_path / "cleanerd.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


class Inbox:
    """The events a subscriber received, read on demand."""

    def __init__(self, client: aiomqtt.Client) -> None:
        self.client = client
        self.events: list[Any] = []
        """Event objects, and `status` payloads as plain strings."""

    async def wait(self, predicate: Callable[[Any], bool], what: str, nth: int = 1) -> Any:
        """The `nth` event (received so far or next) satisfying `predicate`."""
        messages = aiter(self.client.messages)
        try:
            async with asyncio.timeout(WAIT_S):
                while True:
                    matching = [event for event in self.events if predicate(event)]
                    if len(matching) >= nth:
                        return matching[nth - 1]
                    message = await anext(messages)
                    payload = message.payload
                    assert isinstance(payload, bytes | bytearray)
                    text = payload.decode()
                    is_status = message.topic.value.endswith("/status")
                    self.events.append(text if is_status else json.loads(text))
        except TimeoutError:
            pytest.fail(f"no {what}; received {self.events}")


def _kind(kind: str, topic: str | None = None, partition: int | None = None) -> Callable[..., bool]:
    def match(e: Any) -> bool:
        return bool(
            isinstance(e, dict)
            and e["kind"] == kind
            and (topic is None or e.get("topic") == topic)
            and (partition is None or e.get("partition") == partition)
        )

    return match


def _daemon(tmp_path: Path, broker: Broker, notify: NotifyReceiver) -> Daemon:
    config_path = _config(tmp_path, broker)
    daemon = Daemon(
        load_config(config_path),
        config_path=config_path,
        notifier=Notifier(environ=notify.environ),
        timings=Timings(tick_s=0.05, watch_min_interval_s=0.05),
        host=HOST,
    )
    # Reconnect attempts at test speed.
    daemon.publisher = MqttPublisher(
        daemon.config.mqtt, host=HOST, backoff=FAST, on_command=daemon.on_command
    )
    return daemon


async def test_events_commands_and_a_broker_outage(
    broker: Broker, tmp_path: Path, notify_socket: NotifyReceiver
) -> None:
    """1. the startup cycle's roll, pass and deletion arrive as events;
    2. a `clean` command for a new partition is accepted and its pass follows, and so
    does one for a partition whose dirty ratio is below its threshold;
    3. a path-like topic and a missing partition are rejected, nothing is done;
    4. with the broker killed, a cycle still cleans;
    5. once the broker is back the daemon reconnects (retained status `online` again)
    and answers commands."""
    now = _now_ms()
    _dirty(tmp_path, TopicPartition("users", 0), timestamp=now - HOUR)
    _dirty(tmp_path, TopicPartition("ledger", 0), timestamp=now - HOUR)
    sessions = build_log(
        tmp_path / "data",
        [[[kv("s", "1", timestamp=now - HOUR)]]],
        state_dir=tmp_path / "state",
        tp=TopicPartition("sessions", 0),
    )
    # Written an hour ago as far as the roller can tell (it clamps to the file's mtime).
    hour_ago_ns = (now - HOUR) * 1_000_000
    os.utime(sessions.active_segment.log_path, ns=(hour_ago_ns, hour_ago_ns))
    expired = [[[kv(None, f"e{n}", timestamp=now - 3 * HOUR)]] for n in range(2)]
    expired.append([[kv(None, "fresh", timestamp=now)]])
    build_log(
        tmp_path / "data", expired, state_dir=tmp_path / "state", tp=TopicPartition("events", 0)
    )
    daemon = _daemon(tmp_path, broker, notify_socket)
    async with contextlib.AsyncExitStack() as stack:
        # Subscribed before the daemon starts, so the startup cycle's events are seen.
        before_outage = contextlib.AsyncExitStack()
        sub = await before_outage.enter_async_context(_subscriber(broker, f"{BASE}/events/#"))
        await stack.enter_async_context(running(daemon))
        inbox = Inbox(sub)
        rolled = await inbox.wait(_kind("segment.rolled", "sessions", 0), "segment.rolled")
        assert rolled["data"]["reason"] == "segment.ms"
        cleaned = await inbox.wait(_kind("log.cleaned", "users", 0), "log.cleaned")
        assert cleaned["data"]["stats"]["messages_read"] == 10
        deleted = await inbox.wait(_kind("segment.deleted", "events", 0), "segment.deleted")
        assert deleted["data"]["reason"] == "retention.ms"

        users_1 = TopicPartition("users", 1)
        _dirty(tmp_path, users_1, timestamp=now - HOUR)
        await eventually(
            lambda: users_1 in daemon.watcher.snapshot.topic_partitions(), "the new partition"
        )
        await sub.publish(f"{BASE}/commands/clean", b'{"topic": "users", "partition": 1}', qos=1)
        await inbox.wait(_kind("command.accepted", "users", 1), "command.accepted")
        await inbox.wait(_kind("log.cleaned", "users", 1), "the commanded pass")
        assert not any(_kind("log.cleaned", "ledger", 0)(e) for e in inbox.events)
        await sub.publish(f"{BASE}/commands/clean", b'{"topic": "ledger", "partition": 0}', qos=1)
        forced = await inbox.wait(_kind("log.cleaned", "ledger", 0), "the forced pass")
        assert forced["data"]["reason"] == "requested"

        await sub.publish(f"{BASE}/commands/clean", b'{"topic": "../etc", "partition": 0}', qos=1)
        await sub.publish(f"{BASE}/commands/clean", b'{"topic": "users", "partition": 9}', qos=1)
        bad_name = await inbox.wait(_kind("command.rejected"), "the path-like topic rejected")
        assert "legal Kafka topic name" in bad_name["data"]["reason"]
        missing = await inbox.wait(_kind("command.rejected", "users", 9), "missing partition")
        assert "does not exist" in missing["data"]["reason"]
        await before_outage.aclose()

        broker.kill()
        await eventually(lambda: not daemon.publisher.connected, "the lost connection")
        passes = daemon.exporter.service.passes["success"]
        _dirty(tmp_path, TopicPartition("users", 2), timestamp=now - HOUR)
        daemon.request_cycle()
        await eventually(
            lambda: daemon.exporter.service.passes["success"] == passes + 1,
            "a pass while the broker is down",
        )

        broker.start()
        async with _subscriber(broker, f"{BASE}/status", f"{BASE}/events/#") as sub:
            inbox = Inbox(sub)
            await inbox.wait(lambda e: e == "online", "the retained online status")
            await sub.publish(f"{BASE}/commands/pause", b'{"id": "after-outage"}', qos=1)
            reply = await inbox.wait(_kind("command.accepted"), "the reply after reconnecting")
            assert reply["data"]["id"] == "after-outage"
            assert daemon.paused


async def test_deeper_topics_and_retained_commands_live_and_at_reconnect(
    broker: Broker, tmp_path: Path, notify_socket: NotifyReceiver
) -> None:
    """Against the running daemon: a `clean` on a topic below `commands/clean` is
    rejected; a retained `pause` is rejected when it arrives live, and again when the
    daemon reconnects (the broker hands it over with the new subscription), and the
    daemon never pauses; a plain `pause` after the reconnect is accepted."""
    _dirty(tmp_path, TopicPartition("users", 0), timestamp=_now_ms() - HOUR)
    daemon = _daemon(tmp_path, broker, notify_socket)

    def retained_pause_rejected(e: Any) -> bool:
        return _kind("command.rejected")(e) and e["data"]["command"] == "pause"

    async with contextlib.AsyncExitStack() as stack:
        sub = await stack.enter_async_context(_subscriber(broker, f"{BASE}/events/#"))
        await stack.enter_async_context(running(daemon))
        inbox = Inbox(sub)
        await eventually(lambda: daemon.publisher.connected, "the broker connection")
        clean = b'{"topic": "users", "partition": 0}'
        await sub.publish(f"{BASE}/commands/clean/extra", clean, qos=1)
        deeper = await inbox.wait(_kind("command.rejected"), "the deeper topic rejected")
        assert deeper["data"]["command"] == "clean/extra"
        assert "the one topic level after commands/" in deeper["data"]["reason"]

        await sub.publish(f"{BASE}/commands/pause", b"{}", qos=1, retain=True)
        live = await inbox.wait(retained_pause_rejected, "the live retained pause rejected")
        assert "retained" in live["data"]["reason"]

        # A client taking over the daemon's client id makes the broker drop the daemon's
        # connection; the daemon reconnects and subscribes again.
        intruder = aiomqtt.Client("127.0.0.1", broker.port, identifier=f"cleanerd-{HOST}")
        with contextlib.suppress(aiomqtt.MqttError):
            async with intruder:
                pass
        again = await inbox.wait(retained_pause_rejected, "the retained pause at reconnect", 2)
        assert "retained" in again["data"]["reason"]
        assert not daemon.paused

        await sub.publish(f"{BASE}/commands/pause", b'{"id": "plain"}', qos=1)
        accepted = await inbox.wait(_kind("command.accepted"), "the plain pause accepted")
        assert accepted["data"]["id"] == "plain"
        assert daemon.paused


async def test_a_reload_that_changes_mqtt_hands_the_connection_over_once(
    broker: Broker, tmp_path: Path, notify_socket: NotifyReceiver
) -> None:
    """A SIGHUP that changes an `mqtt` key replaces the connection: the old one stops
    (its retained `offline` first), then the new one connects, once, and stays, and the
    retained status ends `online`. Both have one client id: the new one started first
    took the old one's session over and the old one took it back, without end."""
    _dirty(tmp_path, TopicPartition("users", 0), timestamp=_now_ms() - HOUR)
    daemon = _daemon(tmp_path, broker, notify_socket)
    config_path = tmp_path / "cleanerd.yaml"
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(running(daemon))
        await eventually(lambda: daemon.publisher.connected, "the broker connection")
        old = daemon.publisher
        assert isinstance(old, MqttPublisher)
        stop = old.stop

        async def slow_stop() -> None:  # a stop that takes its time (events to deliver)
            await asyncio.sleep(0.5)
            await stop()

        old.stop = slow_stop  # type: ignore[method-assign]
        data = yaml.safe_load(config_path.read_text())
        data["mqtt"]["keepalive_s"] = 9
        config_path.write_text(yaml.safe_dump(data))
        with capture_logs() as logs:
            await daemon.reload()
            await eventually(lambda: daemon.publisher.connected, "the new connection")
            assert old._task is None  # stopped before the new one connected
            await asyncio.sleep(2)  # a fight over the client id shows within this
        assert daemon.publisher is not old
        assert not old.connected
        assert daemon.publisher.connected
        events = [e["event"] for e in logs if e["event"].startswith("mqtt.")]
        assert events == ["mqtt.connected"]
        sub = await stack.enter_async_context(_subscriber(broker, f"{BASE}/status"))
        status = await anext(aiter(sub.messages))
        assert (status.payload, status.retain) == (b"online", True)


async def test_events_queued_while_the_broker_is_away_outlive_a_reload_that_changes_mqtt(
    broker: Broker, tmp_path: Path, notify_socket: NotifyReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the broker away, a reload that changes an `mqtt` key replaces the connection:
    the events the old one still held go to the new one, oldest first, and are delivered
    once the broker is back. Before, they went with the old connection, counted nowhere."""
    _dirty(tmp_path, TopicPartition("users", 0), timestamp=_now_ms() - HOUR)
    daemon = _daemon(tmp_path, broker, notify_socket)
    config_path = tmp_path / "cleanerd.yaml"
    gate = asyncio.Event()  # the new connection waits for the test's subscriber
    made = daemon._new_publisher

    def gated(config: Any) -> Any:
        publisher = made(config)
        assert isinstance(publisher, MqttPublisher)
        session = publisher._session

        async def gated_session() -> None:
            await gate.wait()
            await session()

        monkeypatch.setattr(publisher, "_session", gated_session)
        return publisher

    monkeypatch.setattr(daemon, "_new_publisher", gated)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(running(daemon))
        await eventually(lambda: daemon.publisher.connected, "the broker connection")
        broker.kill()
        await eventually(lambda: not daemon.publisher.connected, "the connection lost")
        assert await daemon.reload() == []  # the file as it was: its event waits
        data = yaml.safe_load(config_path.read_text())
        data["mqtt"]["keepalive_s"] = 9
        config_path.write_text(yaml.safe_dump(data))
        assert await daemon.reload() == []
        broker.start()
        sub = await stack.enter_async_context(_subscriber(broker, f"{BASE}/events/#"))
        gate.set()
        inbox = Inbox(sub)
        reloaded = _kind("config.reloaded")
        first = await inbox.wait(reloaded, "the event of the reload before the new connection")
        second = await inbox.wait(reloaded, "the event of the reload that made it", 2)
        assert (first["data"]["changed"], second["data"]["changed"]) == ([], ["mqtt.keepalive_s"])
        assert daemon.publisher.dropped == 0
