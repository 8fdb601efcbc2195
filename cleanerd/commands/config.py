"""`cleanerd config --default`: print the embedded demo config as YAML.

What `cleanerd run` (and every command) uses without `-c`, as a file to start from:
`cleanerd config --default > cleanerd.yaml`, edit it, `cleanerd run -c cleanerd.yaml`,
and SIGHUP reloads the edits. The output loads back to the same config.
"""

from __future__ import annotations

import argparse
from typing import Final

import yaml

from cleanerd.commands import Arg
from cleanerd.config import default_config_data

ARGS: Final[tuple[Arg, ...]] = (
    (
        ("--default",),
        {
            "action": "store_true",
            "required": True,
            "help": "the embedded demo config (./data, ./state, three demo topics)",
        },
    ),
)

HEADER: Final = (
    "# cleanerd's embedded demo config (`cleanerd config --default`). Edit it, run\n"
    "# `cleanerd run -c THIS_FILE`, and send SIGHUP to reload; `cleanerd check-config\n"
    "# THIS_FILE` checks it first. Every key is in the README's Configuration section.\n"
)


def run(args: argparse.Namespace) -> int:
    """The `config` command."""
    print(HEADER + yaml.safe_dump(default_config_data(), sort_keys=False), end="")
    return 0
