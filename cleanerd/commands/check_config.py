"""`cleanerd check-config FILE` (or `-c FILE`, as the other commands take it): validate a
config file, then the dirs and files it names.

The file first (every error at once, each naming the key, the value and the rule); its
dirs (`config.path_problems`) and the files the daemon reads at its start (the MQTT
password and TLS files, `daemon.credentials`) only once it is valid, since they are
named by its keys, and the topics in the log dirs that two globs match (which the
daemon leaves alone, `config.ambiguous_on_disk`); then, in a mode that owns its log
dirs, what it needs of every partition in them (`log.access`: the daemon only finds
that out step by step, partition by partition, so this is the one place it is looked
at ahead). Prints `FILE: OK` and
exits 0 (with `config_warnings` on stderr, and a warning for an owned log dir another
process holds now, which the daemon would only observe), or exits 1 with the errors.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Final

from cleanerd.commands import Arg
from cleanerd.config import (
    Config,
    ambiguous_on_disk,
    config_warnings,
    current_user,
    load_config,
    may,
    path_problems,
)
from cleanerd.daemon import credentials
from cleanerd.errors import ConfigError
from cleanerd.log.access import check_partitions
from cleanerd.log.files import LOCK_FILE_NAME
from cleanerd.log.ownership import Holder
from cleanerd.logger import log_to_stderr

ARGS: Final[tuple[Arg, ...]] = (
    (("file",), {"type": Path, "metavar": "FILE", "nargs": "?", "help": "the YAML config file"}),
    (("-c", "--config"), {"type": Path, "metavar": "FILE", "help": "the same, given as -c"}),
)


def run(args: argparse.Namespace) -> int:
    """The `check-config` command."""
    given = {f for f in (args.file, args.config) if f is not None}
    if len(given) != 1:
        print("cleanerd check-config: give the config file once: FILE or -c FILE", file=sys.stderr)
        return 2
    (file,) = given
    cfg = load_config(file)
    # Log lines (a dir the checks skip, at debug) go to stderr at the config's level.
    log_to_stderr(cfg.logging.format, cfg.logging.level)
    found = path_problems(cfg) + ambiguous_on_disk(cfg) + credentials.problems(cfg.mqtt)
    held = {} if found or cfg.observe else _held_by_another(cfg)
    warnings = config_warnings(cfg) + list(held.values())
    if not found and not cfg.observe:
        user = current_user()
        for i, log_dir in enumerate(cfg.log_dirs):
            if i not in held:  # a broker's now: what the owner would need waits
                access = check_partitions(log_dir, may)
                found += access.problems(f"log.dirs[{i}]", log_dir, user)
    for warning in warnings:
        print(f"cleanerd check-config: warning: {warning}", file=sys.stderr)
    if found:
        raise ConfigError(found, path=file)
    print(f"{file}: OK")
    return 0


def _held_by_another(cfg: Config) -> dict[int, str]:
    """The owned log dirs (by index) whose `.lock` a process other than cleanerd holds
    now (a running broker, most likely), each with its warning: the daemon would only
    observe them."""
    found = {}
    for i, log_dir in enumerate(cfg.log_dirs):
        holder = Holder.of(log_dir, cfg.state_dir)
        if holder.pid is None or holder.cleanerd:
            continue  # free, or a running cleanerd's own
        found[i] = (
            f"log.dirs[{i}]: {str(log_dir / LOCK_FILE_NAME)!r} is held by {holder.described}: "
            "mode: owner only observes it while it is held, and owns it "
            "only from a restart after it is let go; beside a live broker set "
            "mode: observe"
        )
    return found
