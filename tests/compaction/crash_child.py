"""Run one pass over `<root>/t-0` that SIGKILLs itself at file operation `k`:
``python -m tests.compaction.crash_child ROOT K``."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.compaction.conftest import clean
from tests.compaction.crashing_ops import CrashingOps


def main() -> None:
    root, k = Path(sys.argv[1]), int(sys.argv[2])
    clean(root / "t-0", ops=CrashingOps(k, sigkill=True))


if __name__ == "__main__":
    main()
