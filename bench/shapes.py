"""Small batches vs big ones: the shapes matrix of one partition's compaction.

For every codec of `--codecs` and every batch size of `--batches` (records per batch), a
partition of `--records` records with `--value-size`-byte values over `--keys` keys is
generated (`bench/compaction.py`; `--idempotent` puts a producer id on every batch, as
Kafka's default producer does), and on fresh copies of it, in turn:

- `whole`: the whole `cleanerd clean` process (`python -m cleanerd clean --engine local`
  with a config naming the log dir): interpreter start, imports, opening and recovering
  the dir, planning, the pass, the report. Wall time and the CPU time of the process and
  its children (the worker pool). The generated dir is what a crash leaves: segment files
  only, no index, no recovery point, so the open validates every batch and rebuilds the
  indexes (and the segments the clean replaced are never fsynced: the cycle flushes the
  rest at its end). Its kernels are the compiled ones (`cleanerd build-kernels` runs
  after the `numba` runs: its warm-up and what the runs cached);
- `numba`: the same with the kernels loaded through numba (`CLEANERD_AOT=0`), as before
  `build-kernels` ran;
- `stopped`: the same process on the same dir as a clean stop leaves it (indexes, the
  recovery point at the log end, a producer snapshot, Kafka's clean-shutdown marker:
  made by one `cleanerd clean` of it under a delete policy that deletes nothing), which
  is what a broker or cleanerd leaves after a restart or an earlier run;
- `pass`: the pass alone, in-process (`bench/compaction.py`'s `cleanerd`: numba kernels
  already loaded, the offset map warm, as in a running daemon);
- `aiokafka`: a plain-Python compaction on aiokafka's C record reader;
- `py`: the same compaction on aiokafka's pure-Python reader (`AIOKAFKA_NO_EXTENSIONS`),
  the plain-Python compaction the issue measured (2.9 s for 500,001 1-record batches);
- `copy`: a copy of the same segment bytes, fsynced (the floor);
- `empty`: the same `cleanerd clean` process on an empty log dir: the fixed cost of the
  command (interpreter start, imports, config, the report), which a daemon pays once
  and a one-shot command at every run.

The references' times are their work alone (in a process already started), so the
ratios of `whole` against them are conservative. Each method runs `--repeat` times and
the best counts; MB/s is the segment bytes over the wall time. `whole/aio` and `whole/py`
are how many times faster the whole clean is than the aiokafka compactions (the issue's
target: at least 10x the plain-Python one for 1- and 100-record batches), `numba/py` and
`stop/py` the same for the `numba` runs and the `stopped` dir, `whole/copy`
how many times slower than the copy (target: within 2x for 100-record batches);
`pass/aio` and `pass/copy` the same for the pass alone; `work/py` and `work/copy` the same
for the whole process less `empty` (its work: the open, recovery and index rebuild of a
crash-shaped dir, then the clean). `load` is the 1-minute load average after the row
(the machine is shared: a row measured under load varies by tens of percent).

    python -m bench.shapes [--records 100000] [--keys N] [--batches 1,10,100,1000]
                           [--codecs none,lz4,zstd] [--value-size 100] [--repeat 2]
                           [--idempotent] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bench.compaction import NOW_MS, TOPIC, TOPIC_DIR, generate, measure, sources
from cleanerd.records.header import Compression

CODECS = {codec.name.lower(): codec for codec in Compression}


@dataclass(frozen=True)
class Timing:
    seconds: float
    cpu_s: float


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


COMPILED: Final = {**os.environ, "CLEANERD_AOT": "1"}
NUMBA: Final = {**os.environ, "CLEANERD_AOT": "0"}


def build_kernels() -> None:
    """`cleanerd build-kernels`, from the numba cache the runs so far filled."""
    command = [sys.executable, "-m", "cleanerd", "build-kernels"]
    proc = subprocess.run(command, capture_output=True, text=True, check=False, env=COMPILED)
    if proc.returncode != 0:
        raise SystemExit(f"cleanerd build-kernels failed:\n{proc.stdout}{proc.stderr[-2000:]}")


def clean_process(
    work: Path, policy: str, env: Mapping[str, str] = COMPILED
) -> tuple[subprocess.CompletedProcess[str], Timing]:
    """One `cleanerd clean` process over the log dir `work/logs`, its topic under
    `policy` (a flow mapping of topic settings), in the environment `env`."""
    config = work / "cleanerd.yaml"
    config.write_text(
        f"log.dirs: [{work / 'logs'}]\nstate_dir: {work / 'state'}\ntopics:\n  {TOPIC}: {policy}\n"
    )
    command = [sys.executable, "-m", "cleanerd", "clean", "-c", str(config), "--json"]
    command += ["--engine", "local", "--now-ms", str(NOW_MS)]
    cpu, start = children_cpu(), time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    wall, cpu = time.perf_counter() - start, children_cpu() - cpu
    if proc.returncode != 0:
        raise SystemExit(f"cleanerd clean failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return proc, Timing(wall, cpu)


def stop_cleanly(template: Path, work: Path) -> Path:
    """A copy of the log dir `template` as a clean stop leaves it (see `stopped` in the
    module docstring); returns the copy's log dir."""
    shutil.copytree(template, work / "logs")
    clean_process(work, "{cleanup.policy: delete, retention.ms: -1, retention.bytes: -1}")
    marker = work / "logs" / ".kafka_cleanshutdown"
    if not marker.exists():
        raise SystemExit(f"no clean-shutdown marker after a clean stop of {work / 'logs'}")
    return work / "logs"


def run_whole(template: Path, work: Path, env: Mapping[str, str] = COMPILED) -> Timing:
    """One `cleanerd clean` process over a fresh copy of the log dir `template`; fails
    unless it cleaned the partition up to its active segment."""
    if work.exists():
        shutil.rmtree(work)
    logs = work / "logs"
    shutil.copytree(template, logs)
    proc, timing = clean_process(work, "{cleanup.policy: compact}", env)
    report = json.loads(proc.stdout)
    active = sources(logs / TOPIC_DIR)  # the cleaned segments; the active one follows
    cleaned = [c["end_offset"] for c in report["cleaned"]]
    if not cleaned or not active:
        raise SystemExit(f"cleanerd clean did not clean {logs / TOPIC_DIR}: {proc.stdout}")
    return timing


def run_empty(work: Path) -> Timing:
    """One `cleanerd clean` process over an empty log dir (`empty` in the module
    docstring)."""
    if work.exists():
        shutil.rmtree(work)
    (work / "logs").mkdir(parents=True)
    return clean_process(work, "{cleanup.policy: compact}")[1]


def best(runs: list[Timing]) -> Timing:
    return min(runs, key=lambda t: t.seconds)


def row(codec: str, per_batch: int, args: argparse.Namespace, root: Path) -> dict[str, float | str]:
    template = root / "template"
    d = generate(
        template,
        value_size=args.value_size,
        codec=CODECS[codec],
        records=args.records,
        keys=args.keys,
        per_batch=per_batch,
        idempotent=args.idempotent,
    )
    mb = sum(p.stat().st_size for p in sources(d)) / 1e6
    numba = best([run_whole(template, root / "whole", NUMBA) for _ in range(args.repeat)])
    build_kernels()
    whole = best([run_whole(template, root / "whole") for _ in range(args.repeat)])
    empty = best([run_empty(root / "empty") for _ in range(args.repeat)])
    stopped = stop_cleanly(template, root / "stopped")
    whole_stopped = best([run_whole(stopped, root / "whole") for _ in range(args.repeat)])
    results = {
        method: measure(method, template, root / method, args.repeat)
        for method in ("cleanerd", "aiokafka", "aiokafka-py", "copy")
    }
    shutil.rmtree(root)
    return {
        "mb": mb,
        "whole_s": whole.seconds,
        "whole_cpu": whole.cpu_s,
        "empty_s": empty.seconds,
        "stopped_s": whole_stopped.seconds,
        "numba_s": numba.seconds,
        "pass_s": results["cleanerd"]["seconds"],
        "aio_s": results["aiokafka"]["seconds"],
        "py_s": results["aiokafka-py"]["seconds"],
        "copy_s": results["copy"]["seconds"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=None, help="default: records / 10")
    parser.add_argument("--batches", default="1,10,100,1000", help="records per batch")
    parser.add_argument("--codecs", default="none,lz4,zstd", help=", ".join(CODECS))
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=2, help="runs per method (best)")
    parser.add_argument("--idempotent", action="store_true", help="producer ids on batches")
    parser.add_argument("--dir", default=os.environ.get("BENCH_DIR"), help="scratch dir")
    args = parser.parse_args()
    if args.keys is None:
        args.keys = max(1, args.records // 10)
    if args.dir:
        Path(args.dir).mkdir(parents=True, exist_ok=True)
    print(
        f"{args.records:,} records, {args.keys:,} keys, {args.value_size}-byte values"
        f"{', idempotent producers' if args.idempotent else ''}; best of {args.repeat}; "
        f"{os.cpu_count()} CPUs"
    )
    header = f"{'codec':<5} {'rec/b':>5} {'MB':>6} {'whole s':>7} {'cpu s':>6} {'MB/s':>6} "
    header += f"{'numba s':>7} {'stop s':>6} {'pass s':>6} {'MB/s':>6} {'aio s':>6} {'MB/s':>6} "
    header += f"{'py s':>6} {'copy s':>6} {'MB/s':>6} {'whole/aio':>9} {'whole/py':>8} "
    header += f"{'numba/py':>8} {'stop/py':>7} {'whole/copy':>10} {'pass/aio':>8} "
    header += f"{'pass/copy':>9} {'empty s':>7} {'work/py':>7} {'work/copy':>9} {'load':>5}"
    print(header)
    for codec in args.codecs.split(","):
        for per_batch in (int(b) for b in args.batches.split(",")):
            with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
                r = row(codec, per_batch, args, Path(tmp) / "case")
            mb, whole, pass_s = float(r["mb"]), float(r["whole_s"]), float(r["pass_s"])
            aio, py, copy = float(r["aio_s"]), float(r["py_s"]), float(r["copy_s"])
            stop, numba = float(r["stopped_s"]), float(r["numba_s"])
            empty = float(r["empty_s"])
            work = max(whole - empty, 1e-3)  # both are best-of runs: noise can cross them
            print(
                f"{codec:<5} {per_batch:>5} {mb:>6.1f} {whole:>7.2f} {float(r['whole_cpu']):>6.2f} "
                f"{mb / whole:>6.1f} {numba:>7.2f} {stop:>6.2f} {pass_s:>6.2f} "
                f"{mb / pass_s:>6.1f} {aio:>6.2f} {mb / aio:>6.1f} {py:>6.2f} {copy:>6.3f} "
                f"{mb / copy:>6.0f} {aio / whole:>8.1f}x {py / whole:>7.1f}x "
                f"{py / numba:>7.1f}x {py / stop:>6.1f}x {whole / copy:>9.1f}x "
                f"{aio / pass_s:>7.1f}x {pass_s / copy:>8.1f}x {empty:>7.2f} {py / work:>6.1f}x "
                f"{work / copy:>8.1f}x {os.getloadavg()[0]:>5.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
