"""Commands received over MQTT, validated like any untrusted input.

Wire format: a message on `<prefix>/<host>/commands/<name>` whose payload is a JSON
object (an empty payload counts as `{}`), at most 4 KiB of UTF-8. The name is exactly one
topic level: a message on a deeper topic (`commands/clean/extra`) or on `commands` itself
is rejected like an unknown command, never taken for the command above it.

- `clean`: `{"topic": "<kafka topic>", "partition": <int >= 0>}` clean that partition now;
- `pause`, `resume`, `reload`: `{}`;
- every command may carry `"id": "<1..64 of a-z A-Z 0-9 . _ ->"`, echoed in the reply.

Types are strict (`"3"` is not a partition, `true` is not a number), unknown keys are
errors, and a topic must be a legal Kafka topic name: 1 to 249 characters of
`[a-zA-Z0-9._-]` and neither `.` nor `..`, so no name can reach a path outside a log dir.
An unknown command, a malformed payload or a retained message (whether delivered live or
when the subscription is made: `events.py` tells both) is rejected with the reason and
never reaches the daemon; a valid command goes to the daemon's handler, which may
reject it in turn (say, a partition that does not exist) by raising `CommandRejected`.
Either way exactly one `CommandReply` results, published as a `command.accepted` or
`command.rejected` event, with the request's `id` whenever the payload has a legal one,
and the rejected values shown as JSON. The one message that gets no reply is an empty
retained one: that is how a client clears a retained message (the broker forwards it),
not a command.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Annotated, Any, ClassVar, Final

import structlog
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

from cleanerd.errors import CleanerdError
from cleanerd.records.header import INT32_MAX

MAX_PAYLOAD_BYTES: Final = 4096
_TOPIC_NAME: Final = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_REQUEST_ID: Final = re.compile(r"[a-zA-Z0-9._-]{1,64}")
_SHOWN_NAME_CHARS: Final = 64

log = structlog.get_logger("cleanerd.commands")


class CommandRejected(CleanerdError):
    """A command that is not carried out; `reason` goes into the reply event."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def _legal_topic(name: str) -> str:
    if name in (".", "..") or not _TOPIC_NAME.fullmatch(name):
        raise PydanticCustomError(
            "topic_name",
            "{name} is not a legal Kafka topic name (1 to 249 of a-z A-Z 0-9 . _ -, "
            "not '.' or '..')",
            {"name": _shown(name)},
        )
    return name


def _legal_id(value: str) -> str:
    if not _REQUEST_ID.fullmatch(value):
        raise PydanticCustomError("request_id", "must be 1 to 64 of a-z A-Z 0-9 . _ -")
    return value


TopicName = Annotated[str, AfterValidator(_legal_topic)]
RequestId = Annotated[str, AfterValidator(_legal_id)]


class _Command(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    id: RequestId | None = None


class CleanCommand(_Command):
    """Clean one partition now, whatever its dirty ratio."""

    name: ClassVar[str] = "clean"
    topic: TopicName
    partition: int = Field(ge=0, le=INT32_MAX)


class PauseCommand(_Command):
    """Stop starting new work (work in flight finishes)."""

    name: ClassVar[str] = "pause"


class ResumeCommand(_Command):
    """Start new work again after `pause`."""

    name: ClassVar[str] = "resume"


class ReloadCommand(_Command):
    """Re-read and validate the config file, as SIGHUP does."""

    name: ClassVar[str] = "reload"


Command = CleanCommand | PauseCommand | ResumeCommand | ReloadCommand
CommandHandler = Callable[[Command], Awaitable[None]]

COMMANDS: Final[dict[str, type[Command]]] = {
    "clean": CleanCommand,
    "pause": PauseCommand,
    "resume": ResumeCommand,
    "reload": ReloadCommand,
}


def parse_command(name: str, payload: bytes, *, retained: bool = False) -> Command:
    """The command `name` with `payload`; raises CommandRejected with the reason."""
    model = COMMANDS.get(name)
    if model is None:
        raise CommandRejected(_unknown(name))
    if retained:
        raise CommandRejected("retained command messages are refused: they would replay")
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise CommandRejected(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    document = _json_object(payload)
    try:
        return model.model_validate(document)
    except ValidationError as e:
        raise CommandRejected("; ".join(_problem(d) for d in e.errors())) from None


def _unknown(name: str) -> str:
    """Why `name` is no command, with the known ones."""
    known = f"(known: {', '.join(sorted(COMMANDS))})"
    if not name:
        return f"no command name: publish to commands/<name> {known}"
    if "/" in name:
        return (
            f"unknown command {_shown(name)}: the name is the one topic level after "
            f"commands/, with nothing below it {known}"
        )
    return f"unknown command {_shown(name)} {known}"


def _json_object(payload: bytes) -> dict[str, Any]:
    if not payload.strip():
        return {}
    try:
        document = json.loads(payload.decode("utf-8"), object_pairs_hook=_unique_keys)
    except UnicodeDecodeError as e:
        raise CommandRejected(f"payload is not UTF-8 (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise CommandRejected(f"payload is not JSON: {e.msg} at character {e.pos}") from None
    except RecursionError:
        raise CommandRejected("payload is not JSON: nested too deeply") from None
    if not isinstance(document, dict):
        raise CommandRejected(f"payload must be a JSON object, not {type(document).__name__}")
    return document


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different: one given twice is refused, as the
    config file refuses one (which of the two was meant is not for the daemon to guess)."""
    document: dict[str, Any] = {}
    for key, value in pairs:
        if key in document:
            raise CommandRejected(f"payload gives the key {_shown(key)} twice")
        document[key] = value
    return document


def _problem(d: ErrorDetails) -> str:
    where = ".".join(str(part) for part in d["loc"]) or "payload"
    if d["type"] == "extra_forbidden":
        return f"{where}: unknown key"
    if d["type"] == "missing":
        return f"{where}: required"
    if d["type"] in ("topic_name", "request_id"):
        return f"{where}: {d['msg']}"
    return f"{where}: {_shown(d['input'])} {d['msg'][:1].lower()}{d['msg'][1:]}"


def _shown(value: object) -> str:
    """`value` as JSON (the wire format), cut short: untrusted text goes back into reply
    events."""
    try:
        return _cut(json.dumps(value))
    except (TypeError, ValueError, RecursionError):  # nested past what dumps walks
        return f"<a {type(value).__name__}>"


def _cut(text: str) -> str:
    """`text` cut short, for a reply field."""
    if len(text) > _SHOWN_NAME_CHARS:
        return text[: _SHOWN_NAME_CHARS - 3] + "..."
    return text


@dataclass(frozen=True, slots=True)
class CommandReply:
    """The outcome of one command message, for the `command.accepted|rejected` event."""

    command: str
    accepted: bool
    reason: str | None = None
    id: str | None = None
    topic: str | None = None
    partition: int | None = None


async def handle_command(
    name: str, payload: bytes, handler: CommandHandler, *, retained: bool = False
) -> CommandReply | None:
    """Parse, hand a valid command to `handler`, and say what became of it (None for an
    empty retained message: a client clearing a retained one, nothing to answer).

    `handler` rejects by raising CommandRejected; any other exception is a bug in the
    daemon, logged with its traceback and answered with a rejection.
    """
    if retained and not payload:
        log.info("command.retained_cleared", command=_cut(name))
        return None
    try:
        command = parse_command(name, payload, retained=retained)
    except CommandRejected as e:
        return _rejected(name, payload, e.reason)
    except Exception:  # untrusted input: a parse that fails outright is a rejection too
        log.exception("command.unreadable", command=_cut(name))
        return _rejected(name, payload, "payload could not be read (see the daemon's log)")
    try:
        await handler(command)
    except CommandRejected as e:
        log.warning("command.rejected", command=command.name, reason=e.reason)
        return _reply(command, e.reason)
    except Exception:
        log.exception("command.failed", command=command.name)
        return _reply(command, "internal error (see the daemon's log)")
    log.info("command.accepted", command=command.name)
    return _reply(command, None)


def _rejected(name: str, payload: bytes, reason: str) -> CommandReply:
    shown = _cut(name)  # the reply's `command` field: the name as sent, not quoted
    request = _request_id(payload)
    log.warning("command.rejected", command=shown, reason=reason, id=request)
    return CommandReply(shown, accepted=False, reason=reason, id=request)


class _Pairs(list[tuple[str, Any]]):
    """A JSON object's members as given, a key given twice too."""


def _request_id(payload: bytes) -> str | None:
    """The legal `id` of a payload that is no valid command, if it has one to echo (one
    `id` only: of a payload refused for giving it twice, none)."""
    try:
        document = json.loads(
            payload[: MAX_PAYLOAD_BYTES + 1].decode("utf-8"), object_pairs_hook=_Pairs
        )
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(document, _Pairs):
        return None
    ids = [value for key, value in document if key == "id"]
    if len(ids) != 1:
        return None
    value = ids[0]
    return value if isinstance(value, str) and _REQUEST_ID.fullmatch(value) else None


def _reply(command: Command, reason: str | None) -> CommandReply:
    reply = CommandReply(command.name, accepted=reason is None, reason=reason, id=command.id)
    if isinstance(command, CleanCommand):
        return replace(reply, topic=command.topic, partition=command.partition)
    return reply
