"""The command-line commands: one module each, named in `COMMANDS`.

A command is a module `cleanerd.commands.<module>` with `ARGS` (its arguments, as
`(flags, options)` pairs for `argparse.add_argument`) and `run(args) -> exit status`, and
one `CommandInfo` entry below naming it. `cleanerd.cli` imports only the module of the
command being run, so a command pays for no other's imports (`plan` never loads Spark or
the audit). Exit statuses: 0 success, 1 a cleanerd error (bad config, corrupt data, bad
input, a failed step), 2 a usage error (argparse's), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cleanerd.errors import os_error_text

Arg = tuple[tuple[str, ...], dict[str, Any]]
"""One `add_argument(*flags, **options)` call."""

CONFIG_OPTIONS: Final[dict[str, Any]] = {
    "type": Path,
    "metavar": "FILE",
    "help": "the YAML config file (default: the embedded demo config: ./data, ./state)",
}
"""The options of every command's `-c`/`--config`."""


@dataclass(frozen=True, slots=True)
class CommandInfo:
    """A subcommand: its name, one-line help and the module that implements it."""

    name: str
    help: str
    module: str
    description: str | None = None


COMMANDS: Final[tuple[CommandInfo, ...]] = (
    CommandInfo(
        "run",
        "run the daemon: watch, roll, retain and compact until SIGTERM (SIGHUP reloads)",
        "run",
    ),
    CommandInfo(
        "clean",
        "run one maintenance cycle (roll, retention, disk usage, cleaning) and print it",
        "clean",
    ),
    CommandInfo(
        "plan", "print what one cycle would do to each partition, and why (changes nothing)", "plan"
    ),
    CommandInfo(
        "audit",
        "report superseded records and data past retention.ms still on disk, and their "
        "deadline violations",
        "audit",
    ),
    CommandInfo(
        "check-config",
        "validate a config file and the dirs it names; exit 0, or 1 listing every error",
        "check_config",
    ),
    CommandInfo(
        "build-kernels",
        "compile the kernels ahead of time from this host's numba cache (later runs skip numba)",
        "build_kernels",
    ),
    CommandInfo(
        "config",
        "print a config: --default, the embedded demo config, as a file to edit and reload",
        "config",
    ),
    CommandInfo(
        "produce",
        "append JSON-lines records from stdin to a partition",
        "produce",
        description=(
            "Append records to TOPIC-PARTITION, one JSON object per stdin line: "
            '{"key": str|null, "value": str|null, "headers": {k: v} or [[k, v], ...], '
            '"timestamp": ms}; key_b64/value_b64 for bytes; a null value is a tombstone. '
            "Prints the offsets assigned to each batch."
        ),
    ),
    CommandInfo(
        "dump",
        "print segment and index files the way Kafka's kafka-dump-log does, or as JSON lines",
        "dump",
    ),
)


def print_error(command: str, e: Exception) -> None:
    """Print `e` as `cleanerd COMMAND: message` on stderr, after the output so far."""
    sys.stdout.flush()
    message = os_error_text(e) if isinstance(e, OSError) else str(e)
    print(f"cleanerd {command}: {message}", file=sys.stderr)


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: an integer of at least 0 (a duration, a count)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


EARLIEST_MS: Final = 10**11
"""1973-03-03 in ms since the epoch: a smaller instant is one given in seconds."""
LATEST_MS: Final = 10**14
"""The year 5138 in ms since the epoch: a larger instant is one given in microseconds."""


def epoch_ms(text: str) -> int:
    """An argparse type: an instant in milliseconds since the epoch (`--now-ms`). One that
    reads as seconds or microseconds is refused, saying which: taken as milliseconds,
    seconds would put every time rule in 1970 (nothing due, nothing expired) and
    microseconds far in the future (every segment past its retention)."""
    value = non_negative_int(text)
    if value < EARLIEST_MS:
        raise argparse.ArgumentTypeError(
            f"{value} is before 1973 as ms since the epoch: seconds? "
            f"In milliseconds that is {value * 1000}"
        )
    if value > LATEST_MS:
        raise argparse.ArgumentTypeError(
            f"{value} is after the year 5138 as ms since the epoch: microseconds? "
            f"In milliseconds that is {value // 1000}"
        )
    return value
