"""`cleanerd check-config FILE`: validate a config file, then the dirs it names.

The file first (every error at once, each naming the key, the value and the rule); its
dirs only once it is valid, since they are named by its keys (`config.check_paths`).
Prints `FILE: OK` and exits 0, or exits 1 with the errors.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Final

from cleanerd.commands import Arg
from cleanerd.config import check_paths, load_config

ARGS: Final[tuple[Arg, ...]] = (
    (("file",), {"type": Path, "metavar": "FILE", "help": "the YAML config file"}),
)


def run(args: argparse.Namespace) -> int:
    """The `check-config` command."""
    check_paths(load_config(args.file), path=args.file)
    print(f"{args.file}: OK")
    return 0
