"""Fixed cost of the one-shot commands: a whole `cleanerd` process, start to exit.

Each case is run `--runs` times as a fresh process (`python -m cleanerd ...`, from this
checkout) after one untimed warm-up run (bytecode and numba caches in place); the table
shows the median and the least wall time (on a busy machine the least is the better
estimate of the cost), the median CPU time and the largest peak RSS of the process
(`wait4`), beside three references measured in the same run: the interpreter alone
(`python -c pass`), `python -c "import numpy"`, and the libraries of a `clean`: a process
that imports, in the same order, every module outside cleanerd that a `clean` of an empty
dir has imported by its end (the standard library's and the dependencies', listed by a
`clean` run in a child process first), as `cli.main` imports (the collector paused, the
environment it sets for numpy), and runs nothing of cleanerd's. What `clean (empty dir)`
takes above that row is cleanerd's own: its modules and classes, the config, the cycle
and the report. Bytecode is cached as for an installed package, even where
`PYTHONDONTWRITEBYTECODE` is set (`bytecode_env`).

Cases: `check-config`; `plan` of an empty log dir; `dump` of a one-batch segment;
`clean` of an empty log dir; `clean` of one small partition (3,000 records over 7 keys
in batches of 100, 15 segments of 4 KiB: one pass), in this process (the default) and
with `--pool` (a fork server, a resource tracker and a worker started for the pass); the
partition is copied afresh before each run, outside the timing.

    python -m bench.startup [--runs 7]

Target (issue 12): `check-config` and `plan` on an empty dir well under half a second.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    argv: list[str]
    """Arguments after the interpreter."""
    prepare: Callable[[], None] | None = None
    """Run before each run, untimed (restores the dir a clean changes)."""


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    wall_s: float
    min_wall_s: float
    cpu_s: float
    rss_mb: float


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """Wall s, CPU s (user + system) and peak RSS MB of one process running `argv`."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{err.decode()}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def measure(case: Case, runs: int, env: dict[str, str]) -> Row:
    samples = []
    for n in range(runs + 1):
        if case.prepare is not None:
            case.prepare()
        sample = run_once(case.argv, env)
        if n:  # the first run only warms the caches
            samples.append(sample)
    return Row(
        case.name,
        statistics.median(s[0] for s in samples),
        min(s[0] for s in samples),
        statistics.median(s[1] for s in samples),
        max(s[2] for s in samples),
    )


def build(work: Path, env: dict[str, str]) -> tuple[Path, Path, Path, Path]:
    """An empty log dir's config, a one-batch segment, and a small compacted partition
    (its pristine copy and the config of the dir it is copied into)."""
    empty = work / "empty"
    (empty / "data").mkdir(parents=True)
    empty_config = work / "empty.yaml"
    empty_config.write_text(f"log.dirs: [{empty / 'data'}]\nstate_dir: {work / 'state'}\n")

    small = work / "small"
    (small / "data").mkdir(parents=True)
    small_config = work / "small.yaml"
    small_config.write_text(
        f"log.dirs: [{small / 'data'}]\nstate_dir: {work / 'state'}\n"
        "topics:\n  t: {cleanup.policy: compact, segment.bytes: 4096}\n"
    )
    records = "".join(
        json.dumps({"key": f"k{i % 7}", "value": f"v{i}", "timestamp": 1_700_000_000_000}) + "\n"
        for i in range(3000)
    )
    for config, tp, text in (
        (small_config, "t-0", records),
        (empty_config, "tiny-0", records.splitlines(keepends=True)[0]),
    ):
        subprocess.run(
            [sys.executable, "-m", "cleanerd", "produce", "-c", str(config), tp],
            input=text.encode(),
            env=env,
            cwd=REPO,
            check=True,
            capture_output=True,
        )
    # The tiny segment is moved out of the empty dir: `plan` and `clean` see no partition.
    tiny = work / "tiny"
    shutil.move(empty / "data" / "tiny-0", tiny)
    pristine = work / "small-pristine"
    shutil.copytree(small / "data", pristine)
    return empty_config, tiny / "00000000000000000000.log", small_config, pristine


_LIST_LIBRARIES = """
import contextlib, io, sys
from cleanerd import cli
with contextlib.redirect_stdout(io.StringIO()):
    status = cli.main(["clean", "-c", sys.argv[1]])
for name in sys.modules:
    if not name.startswith(("__main__", "__mp_main__", "cleanerd")):
        print(name)
sys.exit(status)
"""
"""Lists the modules outside cleanerd (in import order) that a `clean` of the config
`argv[1]` has imported by its end: the compiled kernels' module is cleanerd's."""

_IMPORT_LIBRARIES = """
import gc, importlib, os, sys
gc.disable()
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")
for name in open(sys.argv[1]).read().split():
    importlib.import_module(name)
"""
"""Imports the modules listed in the file `argv[1]` as `cli.main` makes a command's
imports: with the collector paused (`cleanerd.collector`) and the environment it sets
before numpy is imported."""


def list_libraries(config: Path, out: Path, env: dict[str, str]) -> int:
    """Write to `out` the modules outside cleanerd a `clean` of `config` imports (see
    `_LIST_LIBRARIES`); how many."""
    proc = subprocess.run(
        [sys.executable, "-c", _LIST_LIBRARIES, str(config)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"listing the libraries of a clean failed:\n{proc.stderr[-2000:]}")
    out.write_text(proc.stdout)
    return len(proc.stdout.split())


def bytecode_env() -> dict[str, str]:
    """The environment of the measured processes: this checkout first on the path, and
    bytecode written and read as an installed package's is (`PYTHONDONTWRITEBYTECODE`
    dropped, so the warm-up run leaves `.pyc` files and the timed runs do not compile
    every module from source)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    env = bytecode_env()
    with tempfile.TemporaryDirectory(prefix="cleanerd-bench-startup-") as tmp:
        work = Path(tmp)
        empty_config, tiny_segment, small_config, pristine = build(work, env)
        small_data = work / "small" / "data"

        def restore() -> None:
            shutil.rmtree(small_data)
            shutil.copytree(pristine, small_data)

        libraries = work / "libraries.txt"
        count = list_libraries(empty_config, libraries, env)
        cleanerd = ["-m", "cleanerd"]
        cases = [
            Case("python -c pass", ["-c", "pass"]),
            Case('python -c "import numpy"', ["-c", "import numpy"]),
            Case(f"clean's {count} library modules", ["-c", _IMPORT_LIBRARIES, str(libraries)]),
            Case("check-config", [*cleanerd, "check-config", str(empty_config)]),
            Case("plan (empty dir)", [*cleanerd, "plan", "-c", str(empty_config)]),
            Case("dump (1-batch segment)", [*cleanerd, "dump", str(tiny_segment)]),
            Case("clean (empty dir)", [*cleanerd, "clean", "-c", str(empty_config)]),
            Case("clean (1 partition)", [*cleanerd, "clean", "-c", str(small_config)], restore),
            Case(
                "clean --pool (1 partition)",
                [*cleanerd, "clean", "--pool", "-c", str(small_config)],
                restore,
            ),
        ]
        load = os.getloadavg()[0]
        rows = [measure(c, args.runs, env) for c in cases]
        load = max(load, os.getloadavg()[0])
    print(f"median of {args.runs} runs each (after one warm-up); load average up to {load:.1f}")
    print(f"{'command':<32} {'wall s':>7} {'min s':>7} {'cpu s':>7} {'peak RSS MB':>12}")
    for r in rows:
        print(f"{r.name:<32} {r.wall_s:7.3f} {r.min_wall_s:7.3f} {r.cpu_s:7.3f} {r.rss_mb:12.1f}")


if __name__ == "__main__":
    main()
