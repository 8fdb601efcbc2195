"""`cleanerd build-kernels`: compile the kernels ahead of time (`cleanerd._aot`).

Builds, from the signatures this host's numba cache holds (the argument types the
kernels were called with here: run the daemon or a `clean` first), the extension module
that later processes load instead of numba, and prints what it holds. `--remove` removes
it (the kernels then go to numba again). The daemon runs it (`--background`: at the
lowest CPU priority) once after its first cycle. Exits 1 when it cannot build: no kernel
cache to build from, no writable cache dir, no C compiler (numba's pycc needs one).
"""

from __future__ import annotations

import argparse
import os
from typing import Final

from cleanerd import _aot, _jit
from cleanerd.commands import Arg

ARGS: Final[tuple[Arg, ...]] = (
    (("--remove",), {"action": "store_true", "help": "remove the compiled kernels"}),
    (
        ("--background",),
        {"action": "store_true", "help": "at the lowest CPU priority (as the daemon runs it)"},
    ),
)


def run(args: argparse.Namespace) -> int:
    """The `build-kernels` command."""
    if args.background:
        os.nice(19)
    root = _jit.cache_root()
    if root is None:
        print("cleanerd build-kernels: no writable kernel cache dir (set NUMBA_CACHE_DIR)")
        return 1
    if args.remove:
        _aot.remove(root)
        print(f"removed the compiled kernels under {root / _aot.DIR_NAME}")
        return 0
    try:
        built = _aot.build(root)
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
    return 0
