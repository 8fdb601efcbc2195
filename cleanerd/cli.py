"""The `cleanerd` command line: one argparse subcommand per entry of
`cleanerd.commands.COMMANDS`, dispatched to its module's `run`. Only the module of the
command given is imported (see `cleanerd.commands`)."""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import signal
import sys
import threading
from contextlib import nullcontext, suppress
from typing import cast

from cleanerd import __version__
from cleanerd.collector import long_lived_objects
from cleanerd.commands import COMMANDS, Arg, print_error
from cleanerd.daemon import hangup
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


def main(argv: list[str] | None = None) -> int:
    """Run the command line (`argv`, or this process's arguments); return the exit code.
    A call for the process's own arguments makes the command's imports as long-lived
    objects (`cleanerd.collector`: some 40,000 of them, about 0.1 s of collections
    otherwise); a test calling `main` many times in one process freezes nothing.

    Such a call also keeps numpy's OpenBLAS from starting its thread pool (unless the
    environment says otherwise): cleanerd calls no BLAS routine, and the pool's threads
    spin when started, about 50 ms of a core in every process (and worker) started. And
    it keeps numpy from asking for transparent huge pages for its large arrays: arrays
    sized for the most a span can hold (batch and record tables, decode buffers) are
    only touched as far as they fill, and a huge page is zeroed whole, 2 MiB at a time,
    at its first touch; a whole `clean` of 1,000,000 records in 100-record batches took
    about 4% longer with them (paired runs), and its offset map probes gained nothing."""
    words = sys.argv[1:] if argv is None else argv
    if argv is None and _selected(words) == "run":
        hangup.hold()  # before the imports: a SIGHUP in them must not end the daemon
    if argv is None and "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")
    with long_lived_objects() if argv is None else nullcontext():
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


def entry() -> int:
    """The process's entry point (the `cleanerd` script, `python -m cleanerd`): `main`
    for its own arguments, then the process ends without tearing the interpreter down
    (`exit_without_teardown`); the status is returned only where that cannot be."""
    status = main()
    exit_without_teardown(status)
    return status


def exit_without_teardown(status: int) -> None:
    """End the process with `status` as the interpreter would once `main` returned, but
    without tearing the interpreter down: the atexit handlers run (log handlers flushed,
    finalizers run, worker processes stopped), stdout and stderr are flushed, and the
    process exits. What is skipped, clearing every module and freeing numba's compiled
    code through LLVM's destructors, took about 35 ms of every command that ran a kernel.
    Returns (the caller exits as usual) while a non-daemon thread runs, which the
    interpreter would wait for, or where this Python has no atexit runner to call."""
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    main_thread = threading.main_thread()
    waited_for = [t for t in threading.enumerate() if t is not main_thread and not t.daemon]
    if run_exit_handlers is None or waited_for:
        return
    run_exit_handlers()
    for stream in (sys.stdout, sys.stderr):
        with suppress(OSError, ValueError):  # a reader gone, or a stream closed
            stream.flush()
    os._exit(status)
