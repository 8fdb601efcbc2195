"""What the engine and both jobs share about running cleanerd's code on Spark.

- The job processes: their modules (`CLEAN_JOB`, `AUDIT_JOB`), what they do when started
  (`job_main`), and their environment and that of Spark's Python workers
  (`python_path_env`): this interpreter, and cleanerd importable even from a source
  checkout.
- How segments become decode tasks (`pack_tasks`): a task costs tens of milliseconds, so
  small segments share one, while there are enough tasks to keep every core busy.
- How an executor decodes a group of segments (`decode_groups`): a segment that cannot be
  read is recorded and skipped, so it fails only its own pass or partition, which the
  job's driver then reports.

Nothing here imports Spark: executor stages are functions over numpy `Columns`, which
`session.py` adapts to the Arrow batches Spark hands them.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, TypeAlias

from numpy.typing import NDArray

import cleanerd
from cleanerd.engine.lifeline import die_with_owner_from_env
from cleanerd.errors import CleanerdError

CLEAN_JOB: Final = "cleanerd.engine.spark.clean_job"
AUDIT_JOB: Final = "cleanerd.engine.spark.audit_job"
"""The modules the job processes run (``python -m MODULE SPEC.json``)."""
TASK_BYTES: Final = 64 * 1024 * 1024
"""Segments smaller than this share a decode task."""

Columns: TypeAlias = Mapping[str, NDArray[Any]]
"""Rows as numpy columns by name: what an executor stage takes and gives."""


def python_path_env() -> dict[str, str]:
    """Environment for a job process and Spark's Python workers: the driver runs this
    interpreter; executors run `PYSPARK_PYTHON` when cleanerd's environment sets it (an
    interpreter path that exists on the executors, with cleanerd's dependencies), else
    this interpreter's path; and cleanerd is importable even when it is not installed
    (a source checkout)."""
    root = str(Path(cleanerd.__file__).resolve().parent.parent)
    paths = [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON") or sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
    }


def job_main(module: str, argv: Sequence[str] | None, run: Callable[[Path], object]) -> int:
    """What ``python -m MODULE SPEC.json`` does: `run` the job of the spec file, in a
    process that dies with the one that launched it, whole session (exit 2 on a usage
    error)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print(f"usage: python -m {module} SPEC.json", file=sys.stderr)
        return 2
    die_with_owner_from_env(whole_session=True)
    run(Path(args[0]))
    return 0


def pack_tasks(sizes: Sequence[int], parallelism: int) -> list[list[int]]:
    """Segments (by index) grouped into decode tasks: one per segment of `TASK_BYTES` or
    more, small ones together, at least `2 * parallelism` tasks while there are segments
    to spread (largest first onto the least loaded task, then the one with fewest)."""
    total = sum(sizes)
    n = min(len(sizes), max(2 * parallelism, math.ceil(total / TASK_BYTES)))
    groups: list[list[int]] = [[] for _ in range(n)]
    loads = [0] * n
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        j = min(range(n), key=lambda g: (loads[g], len(groups[g])))
        groups[j].append(i)
        loads[j] += sizes[i]
    return [sorted(g) for g in groups if g]


def decode_groups(
    groups: Sequence[Sequence[int]],
    decode: Callable[[int], Columns],
    failed: Callable[[int, BaseException], None],
) -> Callable[[Columns], Iterator[Columns]]:
    """The executor stage over the ids of `spark.range(len(groups))` (one id, so one
    group, per Spark task): the rows `decode(i)` of every segment `i` of each group; a
    segment that cannot be read (CleanerdError, OSError) goes to `failed` instead."""

    def run(ids: Columns) -> Iterator[Columns]:
        for group_id in ids["id"].tolist():
            for i in groups[group_id]:
                try:
                    rows = decode(i)
                except (CleanerdError, OSError) as exc:
                    failed(i, exc)
                    continue
                yield rows

    return run
