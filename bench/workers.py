"""Do N workers clean N partitions in the time one worker cleans one? (the local engine)

Generates `--partitions` partitions like `bench/clean.py` does (`--records` records of
100-byte random values over `--keys` keys each, uncompressed), then for each worker count
in `--workers` cleans all of them through `LocalEngine` (every pass submitted at once,
the wall time measured until the last one is swapped in), on fresh copies, `--repeat`
times; the best time counts. Before timing, every worker process has run one pass on a
small partition (the numba kernels load from their on-disk cache on first use), so pool
start-up is not in the figure. `speedup` is the 1-worker time over the N-worker time;
`ideal` is min(N, partitions, cores); `parallel` is the passes' summed run time over the
wall time (how many passes really ran at once) and `cpu` their summed CPU time over the
wall time (how many cores they got): other load on the machine (the load average is
printed) shows as a `cpu` below `parallel`. `--dir /dev/shm` takes the disk out.

    python -m bench.workers [--partitions 2] [--workers 1,2] [--records 500000] [--repeat 3]
                            [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench.clean import CASES, generate
from cleanerd.compaction.cleaner import CleanerConfig
from cleanerd.engine.base import CleanJob
from cleanerd.engine.local import LocalEngine, WorkerSettings
from cleanerd.log.partition_log import PartitionLog

DEDUPE_BYTES = 128 * 1024 * 1024
NOW_MS = 1_800_000_000_000


def make_template(root: Path, partitions: int, records: int, keys: int) -> Path:
    """A log dir `root/logs` holding `bench-0` ... `bench-{partitions-1}`."""
    logs = root / "logs"
    logs.mkdir(parents=True)
    for p in range(partitions):
        staging = root / f"staging-{p}"
        d = generate(staging, CASES["100B"], records, keys)
        d.rename(logs / f"bench-{p}")
        staging.rmdir()
    return logs


def jobs_for(logs: Path, state: Path) -> list[CleanJob]:
    out = []
    for d in sorted(logs.iterdir()):
        meta = PartitionLog.open(d, read_only=True, recover=False).meta()
        out.append(
            CleanJob(
                log_dir=logs,
                state_dir=state,
                tp=meta.topic_partition,
                segments=meta.segments,
                first_dirty=0,
                first_uncleanable=meta.active.base_offset,
                now_ms=NOW_MS,
                config=CleanerConfig(segment_bytes=2**31 - 1),
            )
        )
    return out


def warm_up(engine: LocalEngine, work: Path) -> None:
    """Run small passes until every worker process has run one."""
    small = make_template(work / "warm", engine.workers, 20_000, 1_000)
    warmed: set[int] = set()
    while len(warmed) < engine.workers:
        copy = work / "warm-run"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(small, copy)
        futures = [engine.submit_clean(j) for j in jobs_for(copy, work / "state")]
        for f in futures:
            f.result()
        warmed |= {r.pid for r in engine.runs}


def measure(
    workers: int, template: Path, work: Path, repeat: int
) -> tuple[float, int, float, float]:
    """Best wall time (s) to clean every partition of `template`, the bytes read, and for
    that run the passes' summed run time and summed CPU time over the wall time."""
    best = float("inf")
    read = 0
    parallel = cpu = 0.0
    with LocalEngine(WorkerSettings(workers=workers, dedupe_buffer_size=DEDUPE_BYTES)) as engine:
        warm_up(engine, work)
        for _ in range(repeat):
            logs = work / "run"
            shutil.rmtree(logs, ignore_errors=True)
            shutil.copytree(template, logs)
            jobs = jobs_for(logs, work / "state")
            start = time.perf_counter()
            results = [f.result() for f in [engine.submit_clean(j) for j in jobs]]
            seconds = time.perf_counter() - start
            if seconds < best:
                best = seconds
                runs = list(engine.runs)[-len(jobs) :]
                parallel = sum(r.finished_ns - r.started_ns for r in runs) / 1e9 / seconds
                cpu = sum(r.cpu_ns for r in runs) / 1e9 / seconds
            read = sum(r.stats.bytes_read for r in results)
    return best, read, parallel, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, help="where to generate (default: the temp dir)")
    args = parser.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    cores = os.cpu_count() or 1
    if args.dir:
        args.dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-workers-", dir=args.dir) as tmp:
        root = Path(tmp)
        template = make_template(root / "template", args.partitions, args.records, args.keys)
        print(
            f"{args.partitions} partitions x {args.records:,} records (100 B values, "
            f"{args.keys:,} keys), {cores} cores, load {os.getloadavg()[0]:.1f}, "
            f"best of {args.repeat}"
        )
        header = ("workers", "seconds", "MB/s", "speedup", "ideal", "parallel", "cpu")
        print(" ".join(f"{h:>8}" for h in header))
        base: float | None = None
        for n in counts:
            seconds, read, parallel, cpu = measure(n, template, root / f"w{n}", args.repeat)
            base = seconds if base is None else base
            ideal = min(n, args.partitions, cores) / min(counts[0], args.partitions, cores)
            row = (n, seconds, read / seconds / 1e6, base / seconds, ideal, parallel, cpu)
            print(" ".join(f"{v:>8}" if isinstance(v, int) else f"{v:>8.2f}" for v in row))


if __name__ == "__main__":
    main()
