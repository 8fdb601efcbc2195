"""MQTT events and commands against a real mosquitto broker on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import logging
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiomqtt
import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from structlog.testing import capture_logs

from cleanerd.config import MqttConfig, TlsConfig
from cleanerd.daemon.commands import CleanCommand, Command, CommandRejected, CommandReply
from cleanerd.daemon.credentials import tls_context
from cleanerd.daemon.events import (
    OFFLINE,
    ONLINE,
    Backoff,
    Event,
    EventPublisher,
    MqttPublisher,
    NullPublisher,
    command_name,
    make_publisher,
    reply_event,
    topic_level,
)
from tests.paths import REPO
from tests.tools import require_tool

HOST = "testhost"
FAST = Backoff(initial_s=0.05, max_s=0.2)
WAIT_S = 15.0  # an upper bound for things that take milliseconds, never an assertion


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Broker:
    """A mosquitto process on 127.0.0.1:`port`, restartable on the same port."""

    binary: str
    conf: Path
    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([self.binary, "-c", str(self.conf)], stderr=out)
        for _ in range(500):
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.1),
            ):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        pytest.fail(f"mosquitto did not start on port {self.port}:\n{self.log.read_text()}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None


def _broker(tmp_path: Path, extra: str = "") -> Iterator[Broker]:
    binary = require_tool("mosquitto", "mosquitto")
    port = _free_port()
    conf = tmp_path / "mosquitto.conf"
    # As root mosquitto would switch to its own user, who cannot read tmp_path.
    conf.write_text(
        f"listener {port} 127.0.0.1\npersistence false\nuser {getpass.getuser()}\n{extra}"
    )
    broker = Broker(binary, conf, port, tmp_path / "mosquitto.log")
    broker.start()
    try:
        yield broker
    finally:
        broker.kill()


@pytest.fixture(name="broker")
def _anonymous_broker(tmp_path: Path) -> Iterator[Broker]:
    """mosquitto accepting anonymous clients."""
    yield from _broker(tmp_path, "allow_anonymous true\n")


def _settings(broker: Broker, **kwargs: object) -> MqttConfig:
    return MqttConfig.model_validate(
        {"enabled": True, "host": "127.0.0.1", "port": broker.port, **kwargs}
    )


def _event(n: int) -> Event:
    return Event(
        kind="log.cleaned",
        time_ms=1_700_000_000_000 + n,
        topic="orders",
        partition=n,
        log_dir="/var/lib/kafka/data",
        data={"n": n, "bytes_read": 100 * n},
    )


@contextlib.asynccontextmanager
async def _subscriber(broker: Broker, *topics: str) -> AsyncIterator[aiomqtt.Client]:
    async with aiomqtt.Client("127.0.0.1", broker.port, identifier="test-sub") as client:
        for topic in topics:
            await client.subscribe(topic, qos=1)
        yield client


async def _next(client: aiomqtt.Client) -> aiomqtt.Message:
    async with asyncio.timeout(WAIT_S):
        return await anext(aiter(client.messages))


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(WAIT_S):
        while True:
            if condition():
                return
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def _running(publisher: MqttPublisher) -> AsyncIterator[MqttPublisher]:
    await publisher.start()
    try:
        yield publisher
    finally:
        await publisher.stop()


# ---------------------------------------------------------------------------
# Pure parts


def test_event_json_omits_unset_fields() -> None:
    """An event's payload is compact JSON without the fields it does not set."""
    event = Event(kind="config.reloaded", time_ms=5, data={"changed": ["log.roll.ms"]})
    assert json.loads(event.to_json()) == {
        "kind": "config.reloaded",
        "time_ms": 5,
        "data": {"changed": ["log.roll.ms"]},
    }


@pytest.mark.parametrize(
    "fields",
    [
        {"kind": "segment.exploded", "time_ms": 1},
        {"kind": "log.cleaned", "time_ms": 1, "topic": "t"},
        {"kind": "segment.deleted", "time_ms": 1, "data": {"reason": "because"}},
        {"kind": "log.cleaned", "time_ms": "1"},
    ],
    ids=["unknown-kind", "topic-without-partition", "bad-deletion-reason", "time-as-text"],
)
def test_event_rejects_invalid_fields(fields: dict[str, object]) -> None:
    """An event with an unknown kind, half a topic-partition, an unknown deletion
    reason or a mistyped field is refused."""
    with pytest.raises(ValidationError):
        Event.model_validate(fields)


def test_segment_deleted_accepts_the_deletion_reasons() -> None:
    """`segment.deleted` carries one of the retention module's deletion reasons."""
    event = Event(
        kind="segment.deleted", time_ms=1, topic="t", partition=0, data={"reason": "disk.usage"}
    )
    assert event.data["reason"] == "disk.usage"


def test_reply_event_carries_the_outcome() -> None:
    """A rejected reply names the command, its id and the reason; an accepted clean
    names the topic-partition."""
    rejected = reply_event(CommandReply("clean", accepted=False, reason="nope", id="r1"), 9)
    assert (rejected.kind, rejected.data) == (
        "command.rejected",
        {"command": "clean", "id": "r1", "reason": "nope"},
    )
    accepted = reply_event(CommandReply("clean", True, topic="t", partition=2), 9)
    assert (accepted.kind, accepted.topic, accepted.partition) == ("command.accepted", "t", 2)


@settings(deadline=None, max_examples=50)
@given(attempt=st.integers(0, 200), seed=st.integers(0, 2**32))
def test_backoff_is_capped_and_jittered(attempt: int, seed: int) -> None:
    """Each delay lies in [d/2, d] with d = min(cap, initial * 2**attempt)."""
    backoff = Backoff(initial_s=0.5, max_s=30.0)
    ceiling = min(30.0, 0.5 * 2.0**attempt)
    assert ceiling / 2 <= backoff.delay(attempt, random.Random(seed)) <= ceiling


def test_backoff_jitter_spreads_delays() -> None:
    """Two daemons with different random streams do not retry in lockstep."""
    delays = {Backoff().delay(3, random.Random(seed)) for seed in range(10)}
    assert len(delays) == 10


def test_command_name_is_everything_below_commands() -> None:
    """The name is the rest of the topic after `<base>/commands/`, deeper levels included
    (for parse_command to reject); `commands` itself gives an empty name; anything else
    is not a command."""
    base = "cleanerd/h"
    assert command_name("cleanerd/h/commands/clean", base) == "clean"
    assert command_name("cleanerd/h/commands/clean/extra", base) == "clean/extra"
    assert command_name("cleanerd/h/commands/", base) == ""
    assert command_name("cleanerd/h/commands", base) == ""
    assert command_name("cleanerd/h/commandsx/clean", base) is None
    assert command_name("cleanerd/h/events/log.cleaned", base) is None


def test_topic_level_removes_mqtt_specials() -> None:
    """A host name cannot add topic levels or wildcards."""
    assert topic_level("a/b+c#d") == "a_b_c_d"
    assert topic_level("") == "_"


def test_make_publisher_follows_enabled() -> None:
    """MQTT off (the default) gives the NullPublisher; on gives the MqttPublisher."""
    assert isinstance(make_publisher(MqttConfig()), NullPublisher)
    assert isinstance(make_publisher(MqttConfig(enabled=True)), MqttPublisher)


async def test_null_publisher_discards() -> None:
    """With MQTT off, publishing is a no-op that counts nothing."""
    publisher: EventPublisher = NullPublisher()
    await publisher.start()
    publisher.publish(_event(1))
    await publisher.stop()
    assert (publisher.published, publisher.dropped, publisher.connected) == (0, 0, False)


async def test_overflow_drops_oldest_and_counts() -> None:
    """A full queue drops its oldest event for each new one and counts the drops."""
    publisher: EventPublisher = MqttPublisher(MqttConfig(queue_size=3), host=HOST)
    for n in range(5):
        publisher.publish(_event(n))
    assert publisher.dropped == 2
    assert isinstance(publisher, MqttPublisher)
    assert publisher.queued == 3


# ---------------------------------------------------------------------------
# With a broker


@pytest.mark.network
async def test_events_arrive_with_qos1_on_their_topics(broker: Broker) -> None:
    """Events reach a subscriber as QoS 1 JSON under <prefix>/<host>/events/<kind>."""
    publisher = MqttPublisher(_settings(broker), host=HOST, backoff=FAST)
    async with _subscriber(broker, f"cleanerd/{HOST}/events/#") as sub, _running(publisher):
        publisher.publish(_event(1))
        publisher.publish(Event(kind="disk.pressure", time_ms=2, data={"used_ratio": 0.97}))
        first, second = await _next(sub), await _next(sub)
    assert first.topic.value == f"cleanerd/{HOST}/events/log.cleaned"
    assert first.qos == 1
    assert not first.retain
    assert json.loads(first.payload) == json.loads(_event(1).to_json())
    assert second.topic.value == f"cleanerd/{HOST}/events/disk.pressure"
    assert publisher.published == 2


@pytest.mark.network
async def test_status_online_then_offline_on_clean_stop(broker: Broker) -> None:
    """The retained status reads `online` while connected and `offline` after stop()."""
    settings_ = _settings(broker, topic_prefix="site/kafka")
    publisher = MqttPublisher(settings_, host=HOST, backoff=FAST)
    status = f"site/kafka/{HOST}/status"
    await publisher.start()
    await _until(lambda: publisher.connected)
    async with _subscriber(broker, status) as sub:
        message = await _next(sub)
        assert (message.payload, message.retain) == (ONLINE.encode(), True)
    await publisher.stop()
    assert not publisher.connected
    async with _subscriber(broker, status) as sub:
        message = await _next(sub)
        assert (message.payload, message.retain) == (OFFLINE.encode(), True)


@pytest.mark.network
async def test_a_burst_while_connected_is_delivered_whole(broker: Broker) -> None:
    """A cycle hands over all its events at its end: with the broker connected, more
    than `queue_size` at once are all delivered (the bound, meant for a broker that is
    away, dropped most of a big host's first cycle)."""
    publisher = MqttPublisher(_settings(broker, queue_size=5), host=HOST, backoff=FAST)
    async with _subscriber(broker, f"cleanerd/{HOST}/events/#") as sub, _running(publisher):
        await _until(lambda: publisher.connected)
        for n in range(40):
            publisher.publish(_event(n))
        received = [json.loads((await _next(sub)).payload) for _ in range(40)]
    assert [r["data"]["n"] for r in received] == list(range(40))
    assert publisher.dropped == 0


@pytest.mark.network
async def test_queued_events_survive_until_connect_newest_kept(broker: Broker) -> None:
    """Events published before the broker is reached are delivered in order after the
    connect, minus the oldest ones the full queue dropped."""
    publisher = MqttPublisher(_settings(broker, queue_size=3), host=HOST, backoff=FAST)
    for n in range(5):
        publisher.publish(_event(n))
    async with _subscriber(broker, f"cleanerd/{HOST}/events/#") as sub, _running(publisher):
        received = [json.loads((await _next(sub)).payload) for _ in range(3)]
    assert [r["data"]["n"] for r in received] == [2, 3, 4]
    assert publisher.dropped == 2


@pytest.mark.network
async def test_broker_restart_publish_never_blocks_and_reconnects(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the broker killed, publish() returns at once and queues; once the broker is
    back on the same port the publisher reconnects and delivers old and new events."""
    publisher = MqttPublisher(_settings(broker), host=HOST, backoff=FAST)
    # Hold reconnects until the test's subscriber is back, so it cannot miss the resends.
    gate = asyncio.Event()
    gate.set()
    session = publisher._session

    async def gated_session() -> None:
        await gate.wait()
        await session()

    monkeypatch.setattr(publisher, "_session", gated_session)
    async with _running(publisher):
        await _until(lambda: publisher.connected)
        gate.clear()
        broker.kill()
        await _until(lambda: not publisher.connected)
        for n in range(3):
            # publish() is a plain function, not a coroutine: it cannot wait for a broker.
            publisher.publish(_event(n))
        assert publisher.queued == 3
        broker.start()
        async with _subscriber(broker, f"cleanerd/{HOST}/events/#") as sub:
            gate.set()
            await _until(lambda: publisher.connected)
            publisher.publish(_event(3))
            ns = [json.loads((await _next(sub)).payload)["data"]["n"] for _ in range(4)]
    assert ns == [0, 1, 2, 3]
    assert publisher.published == 4


@pytest.mark.network
async def test_will_is_offline_when_the_connection_dies(broker: Broker, tmp_path: Path) -> None:
    """A publisher process killed with SIGKILL leaves the retained status `offline`."""
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        from cleanerd.config import MqttConfig
        from cleanerd.daemon.events import MqttPublisher
        from cleanerd.log_setup import configure_logging

        async def main():
            configure_logging("json", stream=sys.stderr)
            settings = MqttConfig(enabled=True, host="127.0.0.1", port={broker.port})
            publisher = MqttPublisher(settings, host="{HOST}")
            await publisher.start()
            while not publisher.connected:
                await asyncio.sleep(0.01)
            print("connected", flush=True)
            await asyncio.sleep(3600)

        asyncio.run(main())
        """
    )
    status = f"cleanerd/{HOST}/status"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=subprocess.PIPE, cwd=REPO
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), WAIT_S)
        assert line == b"connected\n"
        async with _subscriber(broker, status) as sub:
            assert (await _next(sub)).payload == ONLINE.encode()
            proc.kill()
            assert (await _next(sub)).payload == OFFLINE.encode()
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
    async with _subscriber(broker, status) as sub:  # the will was retained
        message = await _next(sub)
    assert (message.payload, message.retain) == (OFFLINE.encode(), True)


@pytest.fixture(name="password_broker")
def _password_broker(tmp_path: Path) -> Iterator[Broker]:
    """mosquitto that accepts only user `cleanerd` with password `pw-123`."""
    passwd = require_tool("mosquitto_passwd", "mosquitto")
    users = tmp_path / "users"
    subprocess.run([passwd, "-c", "-b", str(users), "cleanerd", "pw-123"], check=True)
    users.chmod(0o600)
    yield from _broker(tmp_path, f"allow_anonymous false\npassword_file {users}\n")


@pytest.mark.network
async def test_password_from_file(password_broker: Broker, tmp_path: Path) -> None:
    """With username and password_file set, the publisher logs in and delivers."""
    pw = tmp_path / "mqtt-password"
    pw.write_text("pw-123\n")
    settings_ = _settings(password_broker, username="cleanerd", password_file=str(pw))
    sub_client = aiomqtt.Client(
        "127.0.0.1", password_broker.port, username="cleanerd", password="pw-123"
    )
    async with sub_client:
        await sub_client.subscribe(f"cleanerd/{HOST}/events/#", qos=1)
        async with _running(MqttPublisher(settings_, host=HOST, backoff=FAST)) as pub:
            pub.publish(_event(7))
            message = await _next(sub_client)
    assert json.loads(message.payload)["data"]["n"] == 7


@pytest.mark.network
async def test_wrong_password_never_connects(password_broker: Broker, tmp_path: Path) -> None:
    """A refused login keeps retrying in the background and publish() still queues."""
    pw = tmp_path / "mqtt-password"
    pw.write_text("wrong\n")
    settings_ = _settings(password_broker, username="cleanerd", password_file=str(pw))
    publisher = MqttPublisher(settings_, host=HOST, backoff=FAST)
    async with _running(publisher):
        await _until(lambda: publisher._attempt >= 3)
        publisher.publish(_event(1))
        assert not publisher.connected
        assert publisher.queued == 1


# ---------------------------------------------------------------------------
# Commands over MQTT


@pytest.mark.network
async def test_commands_valid_reach_handler_bad_are_rejected(broker: Broker) -> None:
    """Valid commands reach the handler and are accepted; malformed JSON, an unknown
    command, a path-like topic and a missing partition are rejected before it; the
    handler's own rejection (an unknown partition) is reported too."""
    received: list[Command] = []

    async def handler(command: Command) -> None:
        if isinstance(command, CleanCommand) and command.topic != "orders":
            raise CommandRejected(f"no partition {command.topic}-{command.partition}")
        received.append(command)

    base = f"cleanerd/{HOST}"
    sent = [
        ("clean", b'{"topic": "orders", "partition": 3, "id": "a1"}'),
        ("clean", b'{"topic": "orders", "partition": '),
        ("explode", b"{}"),
        ("clean", b'{"topic": "../etc", "partition": 0}'),
        ("clean", b'{"topic": "orders"}'),
        ("clean", b'{"topic": "payments", "partition": 0}'),
        ("pause", b""),
    ]
    publisher = MqttPublisher(_settings(broker), host=HOST, backoff=FAST, on_command=handler)
    async with _subscriber(broker, f"{base}/events/#") as sub, _running(publisher):
        await _until(lambda: publisher.connected)
        for name, payload in sent:
            await sub.publish(f"{base}/commands/{name}", payload, qos=1)
        replies = [json.loads((await _next(sub)).payload) for _ in sent]

    assert [(r["kind"], r["data"]["command"]) for r in replies] == [
        ("command.accepted", "clean"),
        ("command.rejected", "clean"),
        ("command.rejected", "explode"),
        ("command.rejected", "clean"),
        ("command.rejected", "clean"),
        ("command.rejected", "clean"),
        ("command.accepted", "pause"),
    ]
    assert replies[0]["data"]["id"] == "a1"
    assert (replies[0]["topic"], replies[0]["partition"]) == ("orders", 3)
    reasons = [r["data"].get("reason", "") for r in replies]
    assert "not JSON" in reasons[1]
    assert "unknown command" in reasons[2]
    assert "legal Kafka topic name" in reasons[3]
    assert "partition: required" in reasons[4]
    assert "no partition payments-0" in reasons[5]
    assert [c.name for c in received] == ["clean", "pause"]


@pytest.mark.network
async def test_retained_command_is_rejected(broker: Broker) -> None:
    """A retained command (which would replay on every reconnect) is refused."""
    received: list[Command] = []

    async def handler(command: Command) -> None:
        received.append(command)

    base = f"cleanerd/{HOST}"
    async with _subscriber(broker, f"{base}/events/#") as sub:
        await sub.publish(f"{base}/commands/reload", b"{}", qos=1, retain=True)
        publisher = MqttPublisher(_settings(broker), host=HOST, backoff=FAST, on_command=handler)
        async with _running(publisher):
            reply = json.loads((await _next(sub)).payload)
        await sub.publish(f"{base}/commands/reload", b"", qos=1, retain=True)  # clear it
    assert reply["kind"] == "command.rejected"
    assert "retained" in reply["data"]["reason"]
    assert received == []


@pytest.mark.network
async def test_deeper_command_topics_are_rejected(broker: Broker) -> None:
    """A message on a topic below a command's, or on `commands` itself, gets a
    `command.rejected` reply saying why, even with a valid payload; the handler never
    sees it."""
    received: list[Command] = []

    async def handler(command: Command) -> None:
        received.append(command)

    base = f"cleanerd/{HOST}"
    payload = b'{"topic": "orders", "partition": 0}'
    publisher = MqttPublisher(_settings(broker), host=HOST, backoff=FAST, on_command=handler)
    async with _subscriber(broker, f"{base}/events/#") as sub, _running(publisher):
        await _until(lambda: publisher.connected)
        await sub.publish(f"{base}/commands/clean/extra", payload, qos=1)
        deeper = json.loads((await _next(sub)).payload)
        await sub.publish(f"{base}/commands", payload, qos=1)
        bare = json.loads((await _next(sub)).payload)
    assert (deeper["kind"], deeper["data"]["command"]) == ("command.rejected", "clean/extra")
    assert "the one topic level after commands/" in deeper["data"]["reason"]
    assert (bare["kind"], bare["data"]["command"]) == ("command.rejected", "")
    assert "no command name" in bare["data"]["reason"]
    assert received == []


@pytest.mark.network
async def test_retained_command_published_while_subscribed_is_rejected(broker: Broker) -> None:
    """A command published with the retain flag while the daemon is already subscribed
    (a live delivery, whose flag MQTT 3.1.1 would clear) is refused as well."""
    received: list[Command] = []

    async def handler(command: Command) -> None:
        received.append(command)

    base = f"cleanerd/{HOST}"
    publisher = MqttPublisher(_settings(broker), host=HOST, backoff=FAST, on_command=handler)
    async with _subscriber(broker, f"{base}/events/#") as sub:
        async with _running(publisher):
            await _until(lambda: publisher.connected)
            await sub.publish(f"{base}/commands/pause", b"{}", qos=1, retain=True)
            reply = json.loads((await _next(sub)).payload)
        await sub.publish(f"{base}/commands/pause", b"", qos=1, retain=True)  # clear it
    assert (reply["kind"], reply["data"]["command"]) == ("command.rejected", "pause")
    assert "retained" in reply["data"]["reason"]
    assert received == []


def _make_certs(tmp_path: Path) -> dict[str, Path]:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate."""
    openssl = require_tool("openssl", "openssl")
    files = {name: tmp_path / f"{name}.pem" for name in ("ca", "ca-key", "server", "server-key")}
    files |= {"client": tmp_path / "client.pem", "client-key": tmp_path / "client-key.pem"}
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True)

    run("req", "-x509", *ec, "-keyout", str(files["ca-key"]), "-out", str(files["ca"]),
        "-days", "1", "-subj", "/CN=cleanerd-test-ca")  # fmt: skip
    for name, san in (("server", "IP:127.0.0.1"), ("client", "DNS:cleanerd")):
        csr = tmp_path / f"{name}.csr"
        ext = tmp_path / f"{name}.ext"
        ext.write_text(f"subjectAltName={san}\n")
        run("req", *ec, "-keyout", str(files[f"{name}-key"]), "-out", str(csr),
            "-subj", f"/CN={name}")  # fmt: skip
        run("x509", "-req", "-in", str(csr), "-CA", str(files["ca"]),
            "-CAkey", str(files["ca-key"]), "-CAcreateserial", "-days", "1",
            "-out", str(files[name]), "-extfile", str(ext))  # fmt: skip
    return files


@pytest.fixture(name="tls_broker")
def _tls_broker(tmp_path: Path) -> Iterator[tuple[Broker, dict[str, Path]]]:
    """mosquitto on TLS that requires a client certificate from the same CA."""
    certs = _make_certs(tmp_path)
    conf = (
        f"cafile {certs['ca']}\ncertfile {certs['server']}\nkeyfile {certs['server-key']}\n"
        "require_certificate true\nallow_anonymous true\n"
    )
    for broker in _broker(tmp_path, conf):
        yield broker, certs


@pytest.mark.network
async def test_tls_with_client_certificate(tls_broker: tuple[Broker, dict[str, Path]]) -> None:
    """With mqtt.tls set, the publisher verifies the broker against ca_file, presents
    cert_file/key_file, and delivers events over TLS."""
    broker, certs = tls_broker
    tls = {
        "enabled": True,
        "ca_file": str(certs["ca"]),
        "cert_file": str(certs["client"]),
        "key_file": str(certs["client-key"]),
    }
    publisher = MqttPublisher(_settings(broker, tls=tls), host=HOST, backoff=FAST)
    sub_tls = tls_context(TlsConfig.model_validate(tls))
    sub = aiomqtt.Client("127.0.0.1", broker.port, identifier="sub", tls_context=sub_tls)
    async with sub, _running(publisher):
        await sub.subscribe(f"cleanerd/{HOST}/events/#", qos=1)
        publisher.publish(_event(5))
        message = await _next(sub)
    assert json.loads(message.payload)["data"]["n"] == 5


async def test_a_broker_that_stays_away_is_not_a_warning_at_every_retry() -> None:
    """The first failed connection is a warning, the retries after it debug but every
    tenth, each counting the failed attempts: a broker down for an hour at the capped
    backoff made a warning line every few seconds."""
    settings = MqttConfig.model_validate(
        {"enabled": True, "host": "127.0.0.1", "port": _free_port()}
    )
    publisher = MqttPublisher(settings, host=HOST, backoff=Backoff(initial_s=0.001, max_s=0.002))
    # Debug lines kept whatever level an earlier test configured (`log_to_stderr`).
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with capture_logs() as logs:
            async with _running(publisher):
                await _until(lambda: sum(e["event"] == "mqtt.disconnected" for e in logs) >= 12)
    finally:
        structlog.configure(**saved)
    failures = [e for e in logs if e["event"] == "mqtt.disconnected"][:12]
    assert [e["failed_attempts"] for e in failures] == list(range(1, 13))
    warned = [e["failed_attempts"] for e in failures if e["log_level"] == "warning"]
    assert warned == [1, 11]


@pytest.mark.network
async def test_two_clients_taking_one_client_id_over_back_off(broker: Broker) -> None:
    """Two daemons on one host with the default client id: the broker ends one's session
    whenever the other connects. A session that ends at once counts as a failed attempt
    (the backoff grows, the warning says why) instead of starting the backoff over, which
    made the two take the id from each other several times a second for good."""
    backoff = Backoff(initial_s=0.05, max_s=60.0)
    one = MqttPublisher(_settings(broker), host=HOST, backoff=backoff)
    two = MqttPublisher(_settings(broker), host=HOST, backoff=backoff)
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with capture_logs() as logs:
            async with _running(one), _running(two):
                await _until(lambda: sum(e["event"] == "mqtt.disconnected" for e in logs) >= 4)
                await asyncio.sleep(1.0)
    finally:
        structlog.configure(**saved)
    lost = [e for e in logs if e["event"] == "mqtt.disconnected"]
    assert max(e["failed_attempts"] for e in lost) >= 3  # counted on, not started over
    assert len(lost) < 20  # 0.05 s, 0.1 s, 0.2 s, ... not a take-over every 0.3 s
    short = [e for e in lost if "connected_s" in e]  # (a few lose the race to connect)
    assert short
    assert all(e["connected_s"] < 10 for e in short)
    assert "same mqtt.client_id" in short[0]["consequence"]


async def test_stop_ends_the_session_loop_even_when_its_cancellation_is_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A session that turns the cancellation of `stop()` into a dropped connection (as
    a task group whose client fails while it is cancelled does) still ends: the loop
    retried it, so a publisher a reload replaced kept reconnecting under the new one's
    client id for good. A stopped publisher never starts again."""
    settings = MqttConfig.model_validate({"enabled": True, "host": "127.0.0.1", "port": 1})
    publisher = MqttPublisher(settings, host=HOST, backoff=FAST)
    sessions = 0

    async def lossy_session() -> None:
        nonlocal sessions
        sessions += 1
        try:
            await asyncio.sleep(WAIT_S * 10)
        except asyncio.CancelledError:
            raise aiomqtt.MqttError("Disconnected during message iteration") from None

    monkeypatch.setattr(publisher, "_session", lossy_session)
    await publisher.start()
    await _until(lambda: sessions == 1)
    async with asyncio.timeout(WAIT_S):
        await publisher.stop()
    assert sessions == 1
    await publisher.start()
    assert not publisher.connected
    await asyncio.sleep(0.1)
    assert sessions == 1
