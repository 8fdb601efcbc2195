"""`cleanerd build-kernels`: compile the kernels ahead of time (`cleanerd._aot`).

Builds, from the signatures this host's numba cache holds (the argument types the
kernels were called with here), the extension module that later processes load instead
of numba, and prints what it holds. First it runs the warm-up workload
(`kernel_warmup`: every command on small logs of every shape, through numba, in a
process of its own), so that the module holds what the commands call on any data, not
only what this host happened to run; `--no-warm-up` builds from the cache as it is.
`--remove` removes the module (the kernels then go to numba again). A build first
removes what one that was killed left in the cache (`_aot.remove_leftovers`). The
daemon runs it (`--background`: at the lowest CPU priority) once after its first cycle,
in a session of its own that dies with the daemon (`lifeline`: a daemon killed with
SIGKILL left its build, and the build's warm-up, running for a minute).
Exits 1 when it cannot build (no writable cache dir, or no C compiler: numba's pycc
needs one, which is checked before the warm-up) or the warm-up failed (the module is
then built from the cache as it was).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

from cleanerd import _aot, _jit
from cleanerd.commands import Arg
from cleanerd.engine.lifeline import OWNER_ENV, die_with_owner_from_env

ARGS: Final[tuple[Arg, ...]] = (
    (("--remove",), {"action": "store_true", "help": "remove the compiled kernels"}),
    (
        ("--background",),
        {"action": "store_true", "help": "at the lowest CPU priority (as the daemon runs it)"},
    ),
    (
        ("--no-warm-up",),
        {
            "action": "store_true",
            "help": "build only from what this host's runs cached (no warm-up workload)",
        },
    ),
)
WARM_UP_MODULE: Final = "cleanerd.commands.kernel_warmup"


def warm_up(root: Path) -> str | None:
    """Run the warm-up workload through numba in a process of its own, its scratch dir
    under `root`; None, or why it failed (the tail of what it printed)."""
    env = {**os.environ, "CLEANERD_AOT": "0"}
    command = [sys.executable, "-m", WARM_UP_MODULE, str(root)]
    proc = subprocess.run(  # noqa: S603 - this interpreter, our module
        command, capture_output=True, text=True, env=env, check=False
    )
    if proc.returncode == 0:
        return None
    said = (proc.stdout + proc.stderr).strip().splitlines()[-20:]
    return f"exit status {proc.returncode}: " + "\n".join(said)


def run(args: argparse.Namespace) -> int:
    """The `build-kernels` command."""
    if args.background:
        with contextlib.suppress(OSError):  # refused by a filter (the unit's): run as is
            os.nice(19)
    if OWNER_ENV in os.environ:  # the daemon's: its session (the warm-up) dies with it
        die_with_owner_from_env(whole_session=True)
    root = _jit.cache_root()
    if root is None:
        print("cleanerd build-kernels: no writable kernel cache dir (set NUMBA_CACHE_DIR)")
        return 1
    if args.remove:
        _aot.remove(root)
        print(f"removed the compiled kernels under {root / _aot.DIR_NAME}")
        return 0
    if (missing := _aot.missing_compiler()) is not None:  # before a warm-up for nothing
        print(f"cleanerd build-kernels: {missing}")
        return 1
    for path in _aot.remove_leftovers(root):
        print(f"removed {path}, left by a build that was killed")
    warm_up_failed = None
    warmed = False
    if not args.no_warm_up and _aot.warmed_up(root):
        warmed = True  # a daemon's restart: the module says it ran for these sources
        print("warm-up: already run for these sources (the module's manifest says so)")
    elif not args.no_warm_up:
        started = time.monotonic()
        warm_up_failed = warm_up(root)
        warmed = warm_up_failed is None
        if warmed:
            print(f"warm-up: every command on every log shape, {time.monotonic() - started:.1f} s")
        else:
            print(f"cleanerd build-kernels: the warm-up failed ({warm_up_failed})")
    try:
        built = _aot.build(root, warmed_up=warmed)
    except RuntimeError as exc:
        print(f"cleanerd build-kernels: {exc}")
        return 1
    except Exception as exc:  # noqa: BLE001 - pycc's (distutils') compile and link errors
        print(f"cleanerd build-kernels: the build failed: {type(exc).__name__}: {exc}")
        return 1
    how = "up to date" if built.up_to_date else f"built in {built.seconds:.1f} s"
    print(
        f"{built.path}: {built.kernels} kernels, {built.signatures} signatures "
        f"({built.skipped} only called from kernels, left out), {how}"
    )
    return 0 if warm_up_failed is None else 1
