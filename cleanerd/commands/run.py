"""`cleanerd run [-c FILE]`: the daemon in the foreground, on uvloop, until SIGTERM/SIGINT.

Exit status: 0 after a clean stop (passes aborted or finished, checkpoints written,
locks released); 1 when the config is invalid, startup fails (a log dir or state dir that
cannot be used, reported as `startup.failed` with its key, say `log.dirs[0]: '/x/y' is a
file, not a directory`; a log dir another cleanerd owns, the metrics port taken, an
unreadable MQTT password file) or shutdown had to leave
a pass behind after `shutdown_timeout_s`; 130 when a second SIGINT forced the exit
without waiting for the work in flight. Either way every file is in a state that the
next start recovers (the swap protocol is crash-safe at every step).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
from pathlib import Path
from typing import Final

import structlog
import uvloop

from cleanerd.commands import Arg
from cleanerd.config import load_config
from cleanerd.daemon.service import Daemon
from cleanerd.log_setup import configure_logging

ARGS: Final[tuple[Arg, ...]] = (
    (
        ("-c", "--config"),
        {
            "type": Path,
            "metavar": "FILE",
            "help": "the YAML config file, re-read on SIGHUP (default: the embedded demo "
            "config: log dir ./data, state ./state, metrics on 127.0.0.1:9644)",
        },
    ),
)


def raise_open_files_limit() -> None:
    """Lift the soft RLIMIT_NOFILE to the hard limit: a pass opens several files per
    segment (systemd's LimitNOFILE= sets the hard limit; a shell's is often higher)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def run(args: argparse.Namespace) -> int:
    """The `run` subcommand."""
    config = load_config(args.config)
    configure_logging(config.logging.format, config.logging.level)
    raise_open_files_limit()
    daemon = Daemon(config, config_path=args.config)
    status = uvloop.run(daemon.serve())
    if daemon.abandoned:
        # The maintenance thread may still be inside a cycle: the interpreter would join
        # it at exit. Leave now; the kernel drops the locks.
        structlog.get_logger("cleanerd.service").warning("exit.without_joining", status=status)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status
