"""One compaction pass: cleanerd vs a plain file copy of the same bytes (the floor) vs a
plain-Python compaction built on aiokafka's record codec (what a user would write).

Each case generates one partition (`bench/compaction.py`: `--records` records with keys
drawn uniformly from `--keys` keys, random values of the case's size, in producer-like
batches of about 16 KiB) and runs the methods of `bench/compaction.py` on it: `copy`
(the floor), `aiokafka` (a plain-Python compaction on aiokafka's C record reader),
`aiokafka-py` (the same on its pure-Python reader) and `cleanerd` (one pass).

Each method runs in its own subprocess (peak RSS is that process's, from getrusage),
which runs it `--repeat` times on the same data and keeps the best; cleanerd first warms
up (numba kernels loaded from their on-disk cache). The subprocesses run in turn,
`--rounds` times, and each method's best over all rounds counts: on a machine whose load
changes, every method gets the same chances. `time s` is wall time (fsync included),
`cpu s` the process's CPU time (user + system) of that best run, which other load
disturbs less; `load` is the 1-minute load average before and after the case. Single
core: the cleaner is single-threaded. `map B/key` is the offset map's entry size.

    python -m bench.clean [--records 1000000] [--keys 100000] [--cases all]
                          [--repeat 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.compaction import METHODS, TOPIC_DIR, measure, sources
from bench.compaction import generate as generate_partition
from cleanerd.records.header import Compression

__all__ = ["CASES", "TOPIC_DIR", "Case", "generate", "sources"]


@dataclass(frozen=True)
class Case:
    name: str
    value_size: int
    codec: Compression


CASES = {
    "100B": Case("100B", 100, Compression.NONE),
    "1KiB": Case("1KiB", 1024, Compression.NONE),
    "100B-lz4": Case("100B-lz4", 100, Compression.LZ4),
    "100B-zstd": Case("100B-zstd", 100, Compression.ZSTD),
}


def generate(root: Path, case: Case, records: int, keys: int) -> Path:
    """Write the partition `root/bench-0` of `case`; returns its dir."""
    return generate_partition(
        root, value_size=case.value_size, codec=case.codec, records=records, keys=keys
    )


def best_of_rounds(
    template: Path, root: Path, repeat: int, rounds: int
) -> dict[str, dict[str, float]]:
    """Each method's best run over `rounds` rounds in which the methods take turns; the
    peak RSS is the highest of its processes."""
    best: dict[str, dict[str, float]] = {}
    for _ in range(rounds):
        for method in METHODS:
            r = measure(method, template, root / method, repeat)
            if method not in best:
                best[method] = r
                continue
            rss = max(best[method]["rss_mb"], r["rss_mb"])
            if r["seconds"] < best[method]["seconds"]:
                best[method] = r
            best[method]["rss_mb"] = rss
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--cases", default="all", help=f"comma list of {', '.join(CASES)}")
    parser.add_argument("--repeat", type=int, default=3, help="runs per process (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="turns per method (default 3)")
    args = parser.parse_args()
    names = list(CASES) if args.cases == "all" else args.cases.split(",")
    print(f"{args.records:,} records, {args.keys:,} keys, one pass over all non-active segments")
    print(f"best of {args.repeat} runs x {args.rounds} rounds; {os.cpu_count()} CPUs")
    header = f"{'case':<10} {'method':<11} {'MB':>7} {'time s':>7} {'cpu s':>6} {'MB/s':>7} "
    header += f"{'rec/s':>11} {'RSS MB':>7} {'map B/key':>9} {'vs aiokafka':>11} "
    header += f"{'vs copy':>8} {'cold s':>7} {'load':>9}"
    print(header)
    for name in names:
        case = CASES[name]
        with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
            root = Path(tmp)
            d = generate(root / "template", case, args.records, args.keys)
            mb = sum(p.stat().st_size for p in sources(d)) / 1e6
            load_before = os.getloadavg()[0]
            results = best_of_rounds(root / "template", root, args.repeat, args.rounds)
            load = f"{load_before:.1f}-{os.getloadavg()[0]:.1f}"
            for method, r in results.items():
                secs = r["seconds"]
                per_key = f"{r['map_bytes_per_key']:.0f}" if "map_bytes_per_key" in r else "-"
                cold = f"{r['cold_s']:>7.2f}" if "cold_s" in r else f"{'-':>7}"
                print(
                    f"{name:<10} {method:<11} {mb:>7.1f} {secs:>7.2f} {r['cpu_s']:>6.2f} "
                    f"{mb / secs:>7.1f} {args.records / secs:>11,.0f} {r['rss_mb']:>7.0f} "
                    f"{per_key:>9} {results['aiokafka']['seconds'] / secs:>10.1f}x "
                    f"{secs / results['copy']['seconds']:>7.1f}x {cold} {load:>9}"
                )


if __name__ == "__main__":
    main()
