"""`cleanerd produce`: append JSON-lines records to a partition through `PartitionLog`.

Input, one JSON object per line (blank lines are skipped)::

    {"key": "user-1", "value": "...", "headers": {"h": "v"}, "timestamp": 1726045973899}

- `key` / `value`: a UTF-8 string or null; a null value is a tombstone. `key_b64` /
  `value_b64` give the bytes in base64 instead (one of each pair at most). `value` (or
  `value_b64`) must be present, so a tombstone is always written on purpose.
- `headers`: an object of string keys to string-or-null values, or a list of
  `[key, value]` pairs when a key repeats (order is kept). `headers_b64` gives the
  values in base64 instead, as `cleanerd dump --json` prints them, so its records can
  be fed back in (a header strategy's version of any bytes, say).
- `timestamp`: milliseconds (CreateTime); the current time when absent.

Records are grouped into batches of `batch_size` and each batch is appended as one v2
batch with the chosen codec; offsets are assigned by the log (the next ones after its
end). Consistency with the input: lines are appended in order, each batch as one append
under the partition lock, so a reader sees whole batches. On a bad line, the records
read before it are appended (the batch being filled is flushed first) and nothing from
the bad line on is: the error says how many records were appended and at which offsets.
An append that fails (a full disk) leaves no part of its batch behind, and its error says
the same, from the first line of that batch.
Parsing is per line in Python; this is an input tool for tests and demos, not a hot
path.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cleanerd.commands import CONFIG_OPTIONS, Arg, positive_int
from cleanerd.config import (
    LONG_MAX,
    Config,
    current_user,
    load_config,
    log_dir_problem,
    probe_path,
)
from cleanerd.errors import CleanerdError, failure_text
from cleanerd.log.files import LOCK_FILE_NAME, METADATA_TOPIC, parse_topic_partition
from cleanerd.log.log_dir import LogDir
from cleanerd.log.partition_log import LogConfig, PartitionLog
from cleanerd.logger import log_to_stderr
from cleanerd.records.header import Compression
from cleanerd.records.record import Record, RecordHeader
from cleanerd.wording import count

_FIELDS: Final = frozenset(
    {"key", "key_b64", "value", "value_b64", "headers", "headers_b64", "timestamp"}
)


@dataclass(frozen=True, slots=True)
class Appended:
    """One batch appended: its first and last offset."""

    first_offset: int
    last_offset: int

    @property
    def count(self) -> int:
        return self.last_offset - self.first_offset + 1


class ProduceStopped(CleanerdError):
    """Producing stopped at a line; `appended` lists what was appended from the lines
    before it, and the message says so: nothing from that line on was."""

    def __init__(self, line_number: int, reason: str, appended: list[Appended]) -> None:
        self.line_number = line_number
        self.reason = reason
        self.appended = appended
        records = sum(a.count for a in appended)
        if records:
            done = (
                f"the {count(records, 'record')} before it "
                f"{'was' if records == 1 else 'were'} appended "
                f"(offsets {appended[0].first_offset}..{appended[-1].last_offset})"
            )
        else:
            done = "nothing was appended"
        super().__init__(
            f"line {line_number}: {reason}; {done}, nothing from line {line_number} on"
        )


class ProduceInputError(ProduceStopped):
    """A bad input line."""


class ProduceWriteError(ProduceStopped):
    """An append that failed (a full disk, say): the batch of records from the line it
    names on was not appended, not even in part."""


class _BadLine(ValueError):
    """A line that is not a valid record (the message says why)."""


@contextmanager
def open_for_append(
    cfg: Config, partition: str, *, log_dir: Path | None = None
) -> Iterator[PartitionLog]:
    """The partition `partition` (`<topic>-<n>`) in `log_dir` (default: the first of
    `log.dirs`), opened for appending with the topic's settings, its dir created if
    needed (never the log dir: a missing one is usually an unmounted disk or a typo, and
    the records would land on whatever file system holds its parent).

    The log dir is opened as `LogDir` does for any writer: owned (its `.lock` taken)
    when nobody holds it, shared when a cleanerd daemon owns it. Raises CleanerdError
    when it may not be written: observe mode, a missing log dir, a `.lock` held by
    anything else (a running broker), the KRaft metadata log, or a name that is not
    `<topic>-<n>`.
    """
    try:
        tp = parse_topic_partition(partition)
    except ValueError as e:
        raise CleanerdError(str(e)) from None
    if tp.topic == METADATA_TOPIC:
        raise CleanerdError(f"{METADATA_TOPIC} is the KRaft metadata log: cleanerd never writes it")
    if cfg.observe:
        raise CleanerdError("mode is observe: cleanerd does not write to its log dirs")
    target = cfg.log_dirs[0] if log_dir is None else log_dir
    if not target.is_dir():
        key = "--log-dir" if log_dir is not None else "log.dirs[0]"
        why = log_dir_problem(key, target, probe_path(target), observe=False, user=current_user())
        raise CleanerdError(why or f"{key}: {str(target)!r} is not a directory")
    with LogDir.open(target, allow_shared=True, state_dir=cfg.state_dir) as opened:
        if opened.read_only:
            # Named as the daemon names it: a broker, or cleanerd of another state dir.
            held = opened.held_by
            who = held.described if held is not None else "a process that is not a cleanerd daemon"
            raise CleanerdError(
                f"{target / LOCK_FILE_NAME} is held by {who}: not writing to that log dir"
            )
        config = LogConfig.of_topic(
            cfg.topic_config(tp.topic), min_roll_interval_ms=cfg.rolls.min_interval_ms
        )
        yield opened.create_partition(tp, config=config)


def produce(
    lines: Iterable[str],
    log: PartitionLog,
    *,
    batch_size: int,
    compression: Compression,
    now_ms: int,
) -> Iterator[Appended]:
    """Append the records of `lines` to `log`, yielding each batch once it is appended.

    Raises ProduceInputError at the first bad line, after appending the records before
    it.
    """
    if batch_size < 1:
        raise ValueError(f"batch size {batch_size} must be at least 1")
    appended: list[Appended] = []
    pending: list[Record] = []
    first_line = 0  # of the pending batch

    def flush() -> Appended:
        try:
            first, last = log.append(pending, compression=compression)
        except (CleanerdError, OSError) as e:
            raise ProduceWriteError(first_line, failure_text(e), appended) from e
        appended.append(Appended(first, last))
        pending.clear()
        return appended[-1]

    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = parse_record(line, now_ms=now_ms)
        except _BadLine as e:
            if pending:
                yield flush()
            raise ProduceInputError(number, str(e), appended) from None
        if not pending:
            first_line = number
        pending.append(record)
        if len(pending) == batch_size:
            yield flush()
    if pending:
        yield flush()


def parse_record(line: str, *, now_ms: int) -> Record:
    """The record one input line describes (offset 0: the log assigns offsets)."""
    try:
        obj = json.loads(line.rstrip("\r\n"))
    except json.JSONDecodeError as e:
        raise _BadLine(f"invalid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(obj, dict):
        raise _BadLine(f"expected a JSON object, got {_json_kind(obj)}")
    unknown = sorted(set(obj) - _FIELDS)
    if unknown:
        raise _BadLine(
            f"unknown {'field' if len(unknown) == 1 else 'fields'} {', '.join(unknown)}; "
            f"known: {', '.join(sorted(_FIELDS))}"
        )
    if "value" not in obj and "value_b64" not in obj:
        raise _BadLine('"value" is missing (use null for a tombstone)')
    return Record(
        0,
        _timestamp(obj.get("timestamp", now_ms)),
        _bytes_field(obj, "key"),
        _bytes_field(obj, "value"),
        _headers(obj),
    )


def _bytes_field(obj: dict[str, Any], name: str) -> bytes | None:
    encoded = f"{name}_b64"
    if name in obj and encoded in obj:
        raise _BadLine(f'give "{name}" or "{encoded}", not both')
    if encoded in obj:
        text = obj[encoded]
        if text is None:
            return None
        if not isinstance(text, str):
            raise _BadLine(f'"{encoded}" must be a base64 string or null')
        try:
            return base64.b64decode(text, validate=True)
        except binascii.Error as e:
            raise _BadLine(f'"{encoded}" is not valid base64: {e}') from None
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _BadLine(f'"{name}" must be a string or null (use "{encoded}" for bytes)')
    return _utf8(value, name)


def _headers(obj: dict[str, Any]) -> tuple[RecordHeader, ...]:
    if "headers" in obj and "headers_b64" in obj:
        raise _BadLine('give "headers" or "headers_b64", not both')
    b64 = "headers_b64" in obj
    name = "headers_b64" if b64 else "headers"
    raw = obj.get(name, {})
    if isinstance(raw, dict):
        pairs: list[object] = [[k, v] for k, v in raw.items()]
    elif isinstance(raw, list):
        pairs = raw
    else:
        raise _BadLine(f'"{name}" must be an object or a list of [key, value] pairs')
    headers = []
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
            raise _BadLine(f"header {json.dumps(pair)} is not a [string, string or null] pair")
        key, value = pair
        _utf8(key, "header key")  # the key is stored as text, but must encode
        if value is not None and not isinstance(value, str):
            raise _BadLine(f"header {key!r} value must be a string or null")
        if value is None:
            headers.append(RecordHeader(key, None))
        elif b64:
            try:
                headers.append(RecordHeader(key, base64.b64decode(value, validate=True)))
            except binascii.Error as e:
                raise _BadLine(f"header {key!r} value is not valid base64: {e}") from None
        else:
            headers.append(RecordHeader(key, _utf8(value, "header value")))
    return tuple(headers)


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a \ud800 escape
        raise _BadLine(f"{what} is not valid Unicode text") from None


def _timestamp(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= LONG_MAX:
        raise _BadLine(f'"timestamp" must be a non-negative integer (ms), got {json.dumps(value)}')
    return value


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, list):
        return "an array"
    return "a string" if isinstance(value, str) else "a number"


ARGS: Final[tuple[Arg, ...]] = (
    (("-c", "--config"), CONFIG_OPTIONS),
    (("partition",), {"metavar": "TOPIC-PARTITION", "help": "e.g. orders-0"}),
    (
        ("--log-dir",),
        {
            "type": Path,
            "metavar": "DIR",
            "help": "the log dir to write in (default: the first of log.dirs)",
        },
    ),
    (
        ("--compression",),
        {
            "choices": [c.name.lower() for c in Compression],
            "default": "none",
            "help": "batch codec (default: none)",
        },
    ),
    (
        ("--batch-size",),
        {
            "type": positive_int,
            "default": 100,
            "metavar": "N",
            "help": "records per batch (default: 100)",
        },
    ),
)


def run(args: argparse.Namespace) -> int:
    """The `produce` command: append stdin's records, printing each batch's offsets."""
    cfg = load_config(args.config)
    # Log lines go to stderr in the configured format, as for the other commands; stdout
    # holds only the offsets appended.
    log_to_stderr(cfg.logging.format, cfg.logging.level)
    if args.log_dir is not None and args.log_dir.resolve() not in {
        d.resolve() for d in cfg.log_dirs
    }:
        print(
            f"cleanerd produce: --log-dir {args.log_dir} is not one of log.dirs: "
            "cleanerd does not maintain what is written there under this config",
            file=sys.stderr,
        )
    with open_for_append(cfg, args.partition, log_dir=args.log_dir) as log:
        batches = produce(
            sys.stdin,
            log,
            batch_size=args.batch_size,
            compression=Compression[args.compression.upper()],
            now_ms=time.time_ns() // 1_000_000,
        )
        for batch in batches:
            print(f"{log.topic_partition}: offsets {batch.first_offset}..{batch.last_offset}")
    return 0
