"""The `cleanerd` command line: one argparse subcommand per entry of
`cleanerd.commands.COMMANDS`, dispatched to its module's `run`. Only the module of the
command given is imported (see `cleanerd.commands`)."""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import cast

from cleanerd import __version__
from cleanerd.commands import COMMANDS, Arg, print_error
from cleanerd.errors import CleanerdError


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The parser; the arguments of `selected` (a command name) are loaded with its
    module, the other commands appear with their help only."""
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
        if command.name == selected:
            module = importlib.import_module(f"cleanerd.commands.{command.module}")
            for flags, options in cast(tuple[Arg, ...], module.ARGS):
                p.add_argument(*flags, **options)
            p.set_defaults(run=module.run)
    return parser


def _selected(argv: list[str]) -> str | None:
    """The command named on the command line: the first word that is not an option (the
    top level has only `--version` and `--help`, which take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


@contextmanager
def _long_lived_imports() -> Iterator[None]:
    """The command's imports with the cyclic collector paused, their objects then frozen.

    A command imports some 40,000 objects (modules, classes, functions) that live as long
    as the process. Made with the collector on, they trigger full collections that walk
    all of them again and again, and the interpreter walks them once more at exit: about
    0.1 s of a 0.6 s `plan`. None of them is garbage, so nothing is collected while they
    are made, and `gc.freeze` then keeps them out of every later collection (which also
    spares a forked worker from copying their pages when a collection would touch them).
    """
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def main(argv: list[str] | None = None) -> int:
    """Run the command line (`argv`, or this process's arguments); return the exit code.
    Only a call for the process's own arguments freezes the imports (a test calling
    `main` many times in one process must not freeze what each call leaves behind)."""
    words = sys.argv[1:] if argv is None else argv
    with _long_lived_imports() if argv is None else nullcontext():
        parser = build_parser(_selected(words))
    args = parser.parse_args(words)
    try:
        status: int = args.run(args)
    except BrokenPipeError:
        # The reader went away (`cleanerd dump ... | head`). Point stdout at /dev/null so
        # the interpreter's final flush does not raise again; exit as SIGPIPE would.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except (CleanerdError, OSError) as e:
        print_error(args.command, e)
        return 1
    except KeyboardInterrupt:
        return 130
    return status
