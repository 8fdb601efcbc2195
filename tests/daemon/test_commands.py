"""Command parsing and dispatch: untrusted payloads are validated before any handler runs."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.daemon import commands
from cleanerd.daemon.commands import (
    MAX_PAYLOAD_BYTES,
    CleanCommand,
    Command,
    CommandRejected,
    PauseCommand,
    ReloadCommand,
    ResumeCommand,
    handle_command,
    parse_command,
)


def test_parse_clean() -> None:
    """A clean command names a topic and a partition, and may carry a request id."""
    command = parse_command("clean", b'{"topic": "orders.v1", "partition": 4, "id": "req-9"}')
    assert command == CleanCommand(topic="orders.v1", partition=4, id="req-9")


@pytest.mark.parametrize(
    ("name", "model"),
    [("pause", PauseCommand), ("resume", ResumeCommand), ("reload", ReloadCommand)],
)
@pytest.mark.parametrize("payload", [b"", b"  ", b"{}"])
def test_parse_commands_without_arguments(
    name: str, model: type[PauseCommand | ResumeCommand | ReloadCommand], payload: bytes
) -> None:
    """pause, resume and reload take an empty payload or an empty object."""
    assert parse_command(name, payload) == model()


@pytest.mark.parametrize(
    ("name", "payload", "reason"),
    [
        ("explode", b"{}", 'unknown command "explode"'),
        ("clean/../x", b"{}", "unknown command"),
        ("clean", b'{"topic": "orders", "partition": ', "not JSON"),
        ("clean", b"\xff\xfe", "not UTF-8"),
        ("pause", b'{"id": "c17", "id": "c18"}', 'payload gives the key "id" twice'),
        ("clean", b'{"topic": "a", "partition": 0, "topic": "b"}', 'key "topic" twice'),
        ("clean", b"[1, 2]", "must be a JSON object, not list"),
        ("clean", b'"clean"', "must be a JSON object, not str"),
        ("clean", b'{"topic": "orders"}', "partition: required"),
        ("clean", b'{"partition": 0}', "topic: required"),
        ("clean", b'{"topic": "../etc", "partition": 0}', "not a legal Kafka topic name"),
        ("clean", b'{"topic": "..", "partition": 0}', "not a legal Kafka topic name"),
        ("clean", b'{"topic": ".", "partition": 0}', "not a legal Kafka topic name"),
        ("clean", b'{"topic": "/etc/passwd", "partition": 0}', "not a legal Kafka topic name"),
        ("clean", b'{"topic": "", "partition": 0}', "not a legal Kafka topic name"),
        ("clean", b'{"topic": "a b", "partition": 0}', "not a legal Kafka topic name"),
        pytest.param(
            "clean",
            b'{"topic": "%s", "partition": 0}' % (b"a" * 250),
            "legal Kafka topic",
            id="topic-250-chars",
        ),
        ("clean", b'{"topic": "orders", "partition": "3"}', "partition"),
        ("clean", b'{"topic": "orders", "partition": 3.0}', "partition"),
        ("clean", b'{"topic": "orders", "partition": true}', "partition"),
        ("clean", b'{"topic": "orders", "partition": -1}', "partition"),
        ("clean", b'{"topic": "orders", "partition": 2147483648}', "partition"),
        ("clean", b'{"topic": 7, "partition": 0}', "topic"),
        ("clean", b'{"topic": "orders", "partition": 0, "force": true}', "force: unknown key"),
        ("clean", b'{"topic": "orders", "partition": 0, "name": "x"}', "name: unknown key"),
        ("pause", b'{"topic": "orders"}', "topic: unknown key"),
        ("reload", b'{"id": "a/b"}', "id: must be 1 to 64"),
        pytest.param("reload", b"[" * 100_000, "exceeds", id="oversized"),
        pytest.param("reload", b"[" * 2000 + b"]" * 2000, "nested too deeply", id="deep"),
    ],
)
def test_bad_commands_are_rejected_with_a_reason(name: str, payload: bytes, reason: str) -> None:
    """Unknown names, malformed or oversized payloads, wrong types, unknown keys and
    illegal (path-like) topic names are rejected, and the reason says which."""
    with pytest.raises(CommandRejected) as info:
        parse_command(name, payload)
    assert reason in info.value.reason


def test_retained_commands_are_rejected() -> None:
    """A retained command message is refused even when well-formed."""
    with pytest.raises(CommandRejected, match="retained"):
        parse_command("reload", b"{}", retained=True)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("clean/extra", 'unknown command "clean/extra": the name is the one topic level after'),
        ("pause/", 'unknown command "pause/": the name is the one topic level after'),
        ("", "no command name: publish to commands/<name>"),
    ],
)
def test_deeper_or_missing_command_names_are_rejected(name: str, reason: str) -> None:
    """A topic below a command's (`commands/clean/extra`) or `commands` itself is no
    command, even with a valid payload for the command above it, and the reason says so."""
    with pytest.raises(CommandRejected) as info:
        parse_command(name, b'{"topic": "orders", "partition": 0}')
    assert info.value.reason.startswith(reason)
    assert info.value.reason.endswith("(known: clean, pause, reload, resume)")


def test_payload_limit_is_inclusive() -> None:
    """A payload of exactly the limit is parsed (and judged on its content)."""
    payload = b'{"topic": "orders", "partition": 0}'
    padded = payload + b" " * (MAX_PAYLOAD_BYTES - len(payload))
    assert parse_command("clean", padded) == CleanCommand(topic="orders", partition=0)


def test_long_untrusted_names_are_cut_in_reasons() -> None:
    """An attacker-sized command name is not echoed back whole."""
    with pytest.raises(CommandRejected) as info:
        parse_command("x" * 10_000, b"{}")
    assert len(info.value.reason) < 200


@settings(deadline=None, max_examples=100)
@given(topic=st.text(alphabet="abcXYZ019._-", min_size=1, max_size=249))
def test_every_legal_topic_name_is_accepted(topic: str) -> None:
    """Any 1..249 characters of [a-zA-Z0-9._-] other than '.' and '..' is a topic."""
    payload = json.dumps({"topic": topic, "partition": 0}).encode()
    if topic in (".", ".."):
        with pytest.raises(CommandRejected):
            parse_command("clean", payload)
    else:
        assert parse_command("clean", payload) == CleanCommand(topic=topic, partition=0)


@settings(deadline=None, max_examples=100)
@given(
    topic=st.tuples(st.text(max_size=20), st.sampled_from("/\\\0 "), st.text(max_size=20)).map(
        "".join
    )
)
def test_topics_with_path_or_space_characters_are_rejected(topic: str) -> None:
    """No topic name with a slash, backslash, NUL or space gets through."""
    payload = json.dumps({"topic": topic, "partition": 0}).encode()
    with pytest.raises(CommandRejected, match="legal Kafka topic name"):
        parse_command("clean", payload)


async def test_handle_command_accepts_valid_commands() -> None:
    """A valid command reaches the handler and is reported accepted with its target."""
    seen: list[Command] = []

    async def handler(command: Command) -> None:
        seen.append(command)

    reply = await handle_command("clean", b'{"topic": "t", "partition": 1, "id": "x"}', handler)
    assert reply is not None
    assert seen == [CleanCommand(topic="t", partition=1, id="x")]
    assert (reply.accepted, reply.command, reply.id, reply.topic, reply.partition) == (
        True,
        "clean",
        "x",
        "t",
        1,
    )


async def test_handle_command_never_calls_the_handler_for_bad_input() -> None:
    """An invalid command is rejected without reaching the handler."""
    seen: list[Command] = []

    async def handler(command: Command) -> None:
        seen.append(command)

    reply = await handle_command("clean", b'{"topic": "../etc", "partition": 0}', handler)
    assert reply is not None
    assert not reply.accepted
    assert reply.reason is not None
    assert "legal Kafka topic name" in reply.reason
    assert seen == []


async def test_handler_rejection_is_reported() -> None:
    """The daemon's handler rejects (an unknown partition) by raising CommandRejected."""

    async def handler(command: Command) -> None:
        raise CommandRejected("no partition ghost-0 in any log dir")

    reply = await handle_command("clean", b'{"topic": "ghost", "partition": 0}', handler)
    assert reply is not None
    assert (reply.accepted, reply.reason) == (False, "no partition ghost-0 in any log dir")
    assert (reply.topic, reply.partition) == ("ghost", 0)


async def test_handler_bug_is_an_internal_error_rejection() -> None:
    """An unexpected exception in the handler is answered, not propagated."""

    async def handler(command: Command) -> None:
        raise RuntimeError("boom")

    reply = await handle_command("reload", b"", handler)
    assert reply is not None
    assert not reply.accepted
    assert reply.reason is not None
    assert "internal error" in reply.reason


async def test_a_rejection_echoes_the_requests_id() -> None:
    """A client matches replies by `id`: a rejected command (bad values, a key given
    twice, retained, even unknown) still carries its legal one; an illegal one, or one
    given twice, is not echoed."""

    async def handler(command: Command) -> None:
        raise AssertionError("never reached")

    cases = [
        ("clean", b'{"topic": "../etc", "partition": 0, "id": "r1"}', False, "r1"),
        ("pause", b'{"id": "r2"}', True, "r2"),
        ("explode", b'{"id": "r3"}', False, "r3"),
        ("clean", b'{"topic": 7, "id": "a/b"}', False, None),
        ("clean", b'{"id": "r4", "topic": "a", "partition": 0, "topic": "b"}', False, "r4"),
        ("pause", b'{"id": "r5", "id": "r6"}', False, None),
    ]
    for name, payload, retained, request in cases:
        reply = await handle_command(name, payload, handler, retained=retained)
        assert reply is not None
        assert (reply.accepted, reply.id) == (False, request)


async def test_an_empty_retained_message_clears_and_gets_no_reply() -> None:
    """Publishing an empty retained message is how a client clears a retained one: it
    is neither run (an empty `pause` is a valid pause) nor answered as a rejection."""

    async def handler(command: Command) -> None:
        raise AssertionError("never reached")

    assert await handle_command("pause", b"", handler, retained=True) is None


async def test_rejected_values_are_shown_as_json() -> None:
    """The reply quotes what was refused as the JSON it came in, not as Python."""

    async def handler(command: Command) -> None:
        raise AssertionError("never reached")

    reply = await handle_command("clean", b'{"topic": "t", "partition": "3"}', handler)
    assert reply is not None
    assert reply.reason is not None
    assert reply.reason.startswith('partition: "3" ')


def test_a_value_nested_past_what_a_reply_can_quote_is_named_by_its_type() -> None:
    """A partition nested some 1,000 lists deep (under 4 KiB) parses, but quoting it in
    the reply recursed past Python's limit, and the error dropped the MQTT session."""
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    assert commands._shown(deep) == "<a list>"


async def test_a_parse_that_fails_outright_is_a_rejection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever fails in reading an untrusted payload is answered as a rejection: an
    error escaping here ended the MQTT session and lost the reply."""

    def broken(name: str, payload: bytes, *, retained: bool = False) -> Command:
        raise RecursionError("maximum recursion depth exceeded")

    async def handler(command: Command) -> None:
        raise AssertionError("never reached")

    monkeypatch.setattr(commands, "parse_command", broken)
    reply = await handle_command("clean", b'{"id": "r9"}', handler)
    assert reply is not None
    assert (reply.accepted, reply.id) == (False, "r9")
    assert reply.reason == "payload could not be read (see the daemon's log)"
