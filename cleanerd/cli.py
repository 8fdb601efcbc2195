"""The `cleanerd` command line: one argparse subcommand per `Command` in `COMMANDS`.

Adding a subcommand is one function `(args) -> exit code` and one `Command(...)` entry
naming it, its help and its arguments. Exit codes: 0 success, 1 a cleanerd error (bad
config, corrupt data, bad input), 2 a usage error (argparse's), 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cleanerd import __version__, audit_command, clean_command, plan_command, run_command
from cleanerd.config import check_paths, load_config
from cleanerd.dump import DumpOptions, dump_file
from cleanerd.errors import CleanerdError
from cleanerd.produce import open_for_append, produce
from cleanerd.records.header import Compression


@dataclass(frozen=True, slots=True)
class Arg:
    """One `add_argument(*flags, **options)` call."""

    flags: tuple[str, ...]
    options: dict[str, Any]


def arg(*flags: str, **options: Any) -> Arg:
    return Arg(flags, options)


@dataclass(frozen=True, slots=True)
class Command:
    """A subcommand: its name, one-line help, arguments and the function that runs it."""

    name: str
    help: str
    run: Callable[[argparse.Namespace], int]
    args: tuple[Arg, ...] = ()
    description: str | None = None


CONFIG_ARG: Final = arg(
    "-c",
    "--config",
    type=Path,
    metavar="FILE",
    help="the YAML config file (default: the embedded demo config: ./data, ./state)",
)


def _check_config(args: argparse.Namespace) -> int:
    # The file first; its dirs only once it is valid (they are named by its keys).
    check_paths(load_config(args.file), path=args.file)
    print(f"{args.file}: OK")
    return 0


def _dump(args: argparse.Namespace) -> int:
    options = DumpOptions(deep_iteration=args.deep_iteration, print_data_log=args.print_data_log)
    status = 0
    for path in args.files:
        try:
            for line in dump_file(path, options):
                print(line)
        except BrokenPipeError:
            raise  # the reader is gone: stop, see main
        except (CleanerdError, OSError) as e:
            _error(args, e)
            status = 1
    return status


def _produce(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
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


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def _error(args: argparse.Namespace, e: Exception) -> None:
    """Print `e` as `cleanerd COMMAND: message` on stderr, after the output so far."""
    sys.stdout.flush()
    if isinstance(e, OSError) and e.filename is not None:
        message = f"{e.filename}: {e.strerror}"
    else:
        message = str(e)
    print(f"cleanerd {args.command}: {message}", file=sys.stderr)


COMMANDS: Final[tuple[Command, ...]] = (
    Command(
        "run",
        "run the daemon: watch, roll, retain and compact until SIGTERM (SIGHUP reloads)",
        run_command.run,
        tuple(arg(*f, **o) for f, o in run_command.ARGS),
    ),
    Command(
        "clean",
        "run one maintenance cycle (roll, retention, disk usage, cleaning) and print it",
        clean_command.run,
        tuple(arg(*f, **o) for f, o in clean_command.ARGS),
    ),
    Command(
        "plan",
        "print what one cycle would do to each partition, and why (changes nothing)",
        plan_command.run,
        tuple(arg(*f, **o) for f, o in plan_command.ARGS),
    ),
    Command(
        "audit",
        "report superseded records still on disk and deletion-deadline violations",
        audit_command.run,
        tuple(arg(*f, **o) for f, o in audit_command.ARGS),
    ),
    Command(
        "check-config",
        "validate a config file and the dirs it names; exit 0, or 1 listing every error",
        _check_config,
        (arg("file", type=Path, metavar="FILE", help="the YAML config file"),),
    ),
    Command(
        "produce",
        "append JSON-lines records from stdin to a partition",
        _produce,
        (
            CONFIG_ARG,
            arg("partition", metavar="TOPIC-PARTITION", help="e.g. orders-0"),
            arg(
                "--log-dir",
                type=Path,
                metavar="DIR",
                help="the log dir to write in (default: the first of log.dirs)",
            ),
            arg(
                "--compression",
                choices=[c.name.lower() for c in Compression],
                default="none",
                help="batch codec (default: none)",
            ),
            arg(
                "--batch-size",
                type=_positive_int,
                default=100,
                metavar="N",
                help="records per batch (default: 100)",
            ),
        ),
        description=(
            "Append records to TOPIC-PARTITION, one JSON object per stdin line: "
            '{"key": str|null, "value": str|null, "headers": {k: v} or [[k, v], ...], '
            '"timestamp": ms}; key_b64/value_b64 for bytes; a null value is a tombstone. '
            "Prints the offsets assigned to each batch."
        ),
    ),
    Command(
        "dump",
        "print segment and index files the way Kafka's kafka-dump-log does",
        _dump,
        (
            arg(
                "files",
                type=Path,
                nargs="+",
                metavar="FILE",
                help=".log, .index, .timeindex or .txnindex files",
            ),
            arg("--deep-iteration", action="store_true", help="also print every record"),
            arg(
                "--print-data-log",
                action="store_true",
                help="also print every record's key and value (implies --deep-iteration)",
            ),
        ),
    ),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cleanerd",
        description="Log maintenance for Kafka-format log directories.",
    )
    parser.add_argument("--version", action="version", version=f"cleanerd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        p = sub.add_parser(
            command.name, help=command.help, description=command.description or command.help
        )
        for a in command.args:
            p.add_argument(*a.flags, **a.options)
        p.set_defaults(run=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    args = build_parser().parse_args(argv)
    try:
        status: int = args.run(args)
    except BrokenPipeError:
        # The reader went away (`cleanerd dump ... | head`). Point stdout at /dev/null so
        # the interpreter's final flush does not raise again; exit as SIGPIPE would.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except (CleanerdError, OSError) as e:
        _error(args, e)
        return 1
    except KeyboardInterrupt:
        return 130
    return status
