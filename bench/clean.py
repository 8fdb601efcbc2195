"""One compaction pass: cleanerd vs a plain file copy of the same bytes (the floor) vs a
plain-Python compaction built on aiokafka's record codec (what a user would write).

Each case generates one partition: `--records` records with keys drawn uniformly from
`--keys` keys (so about records/keys versions per key, all but the last superseded),
random values of the case's size, in producer-like batches of about 16 KiB, segments of
256 MiB, and a one-record active segment. Every method then processes all segments below
the active one:

- `copy`: read every segment file and write it to a new file, fsynced (the floor);
- `aiokafka`: read every record with aiokafka's reader (C extension), keep a dict
  key -> latest record, write the survivors in offset order with aiokafka's
  DefaultRecordBatchBuilder in ~16 KiB batches, fsynced;
- `cleanerd`: one `Cleaner.clean` pass (map build, copy, swap, checkpoint).

Each method runs in its own subprocess (peak RSS is that process's, from getrusage),
which runs it `--repeat` times on the same data and keeps the best; cleanerd first warms
up (numba kernels loaded from their on-disk cache). The three subprocesses run in turn,
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
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cleanerd.compaction.offset_map import OffsetMap
from cleanerd.records.batch import encode_batch
from cleanerd.records.header import Compression
from cleanerd.records.record import Record

SEGMENT_BYTES = 256 * 1024 * 1024
DEDUPE_BYTES = 128 * 1024 * 1024  # Kafka's default log.cleaner.dedupe.buffer.size
BATCH_BYTES = 16 * 1024
TOPIC_DIR = "bench-0"


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
    """Write the partition `root/bench-0`; returns its dir."""
    d = root / TOPIC_DIR
    d.mkdir(parents=True)
    rng = random.Random(42)
    per_batch = max(1, BATCH_BYTES // (case.value_size + 20))
    offset, base, size = 0, 0, 0
    out = open(d / f"{base:020d}.log", "wb")  # noqa: SIM115
    ts = 1_700_000_000_000
    while offset < records:
        n = min(per_batch, records - offset)
        batch = [
            Record(
                offset + i,
                ts + offset + i,
                b"key-%08d" % rng.randrange(keys),
                rng.randbytes(case.value_size),
            )
            for i in range(n)
        ]
        data = encode_batch(batch, base_offset=offset, compression=case.codec)
        if size + len(data) > SEGMENT_BYTES:
            out.close()
            base, size = offset, 0
            out = open(d / f"{base:020d}.log", "wb")  # noqa: SIM115
        out.write(data)
        size += len(data)
        offset += n
    out.close()
    last = [Record(offset, ts + offset, b"active", b"x")]
    (d / f"{offset:020d}.log").write_bytes(encode_batch(last, base_offset=offset))
    return d


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def sources(d: Path) -> list[Path]:
    return sorted(d.glob("*.log"))[:-1]


def run_copy(d: Path) -> dict[str, float]:
    for src in sources(d):
        dst = src.with_name(src.name + ".copy")
        with open(src, "rb") as f, open(dst, "wb") as g:
            while chunk := f.read(8 * 1024 * 1024):
                g.write(chunk)
            g.flush()
            os.fsync(g.fileno())
    return {}


def run_aiokafka(d: Path) -> dict[str, float]:
    from aiokafka.record.default_records import DefaultRecordBatchBuilder
    from aiokafka.record.memory_records import MemoryRecords

    latest: dict[bytes, tuple[int, int, bytes | None]] = {}
    codec = 0
    for src in sources(d):
        records = MemoryRecords(src.read_bytes())
        while records.has_next():
            batch = records.next_batch()
            codec = batch.compression_type
            for r in batch:
                latest[r.key] = (r.offset, r.timestamp, r.value)
    survivors = sorted((o, ts, k, v) for k, (o, ts, v) in latest.items())
    with open(d / "aiokafka.log", "wb") as out:
        i = 0
        while i < len(survivors):
            builder = DefaultRecordBatchBuilder(
                magic=2,
                compression_type=codec,
                is_transactional=False,
                producer_id=-1,
                producer_epoch=-1,
                base_sequence=-1,
                batch_size=BATCH_BYTES,
            )
            base = survivors[i][0]
            while i < len(survivors):
                o, ts, k, v = survivors[i]
                if builder.append(o - base, ts, k, v, []) is None:
                    break
                i += 1
            data = builder.build()
            data[0:8] = base.to_bytes(8, "big")  # the base offset is not covered by the CRC
            out.write(data)
        out.flush()
        os.fsync(out.fileno())
    return {}


def run_cleanerd(d: Path, offset_map: OffsetMap | None = None) -> dict[str, float]:
    """One pass; `seconds` is the pass alone (the segment listing comes before it)."""
    from cleanerd.compaction.cleaner import Cleaner, CleanerConfig
    from cleanerd.log.files import TopicPartition
    from cleanerd.log.partition_log import PartitionLog

    meta = PartitionLog.open(d, read_only=True, recover=False).meta()
    m = OffsetMap(DEDUPE_BYTES) if offset_map is None else offset_map
    cpu, start = cpu_seconds(), time.perf_counter()
    result = Cleaner(m).clean(
        log_dir=d.parent,
        tp=TopicPartition("bench", 0),
        segments=meta.segments,
        first_dirty=0,
        first_uncleanable=meta.active.base_offset,
        now_ms=1_800_000_000_000,
        config=CleanerConfig(segment_bytes=2**31 - 1),
    )
    return {
        "seconds": time.perf_counter() - start,
        "cpu_s": cpu_seconds() - cpu,
        "map_bytes_per_key": m.bytes_per_key,
        "index_s": result.stats.elapsed_index_secs,
    }


METHODS = {"copy": run_copy, "aiokafka": run_aiokafka, "cleanerd": run_cleanerd}


def timed(run: Callable[[], dict[str, float]]) -> tuple[float, float, dict[str, float]]:
    """(wall seconds, CPU seconds, the run's own numbers) of one run; a run that reports
    its own `seconds` and `cpu_s` (cleanerd: the pass without the segment listing) is
    taken at its word."""
    cpu, start = cpu_seconds(), time.perf_counter()
    out = run()
    wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    return out.pop("seconds", wall), out.pop("cpu_s", cpu), out


def child(method: str, d: Path, repeat: int) -> None:
    """Run one method on `d` and print its numbers as JSON: the best of `repeat` runs.
    cleanerd runs as a daemon would: a first pass in a fresh process (numba kernels
    loaded from the disk cache by a warm-up, the map's pages faulted in: "cold"), then
    passes on fresh copies of the log with the same map ("warm", what each pass of a
    running daemon costs)."""
    runs = []
    extra: dict[str, float] = {}
    if method == "cleanerd":
        m = OffsetMap(DEDUPE_BYTES)
        for warm in ("100B", "100B-lz4"):  # plain and side-buffer kernel variants
            with tempfile.TemporaryDirectory() as tmp:
                run_cleanerd(generate(Path(tmp), CASES[warm], 2000, 100), m)
        pristine = d.parent.parent / "cleanerd-pristine"
        shutil.rmtree(pristine, ignore_errors=True)  # an earlier round's
        shutil.copytree(d.parent, pristine)
        extra["cold_s"] = run_cleanerd(d, m)["seconds"]
        for _ in range(repeat):
            shutil.rmtree(d.parent)
            shutil.copytree(pristine, d.parent)
            runs.append(timed(lambda: run_cleanerd(d, m)))
    else:
        runs = [timed(lambda: METHODS[method](d)) for _ in range(repeat)]
    wall, cpu, out = min(runs, key=lambda r: r[0])
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": wall, "cpu_s": cpu, "rss_mb": rss_mb, **out, **extra}))


def measure(method: str, template: Path, work: Path, repeat: int) -> dict[str, float]:
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(template, work)
    command = [sys.executable, "-m", "bench.clean", "--child", method, str(work / TOPIC_DIR)]
    proc = subprocess.run(
        [*command, "--repeat", str(repeat)],
        capture_output=True,
        check=True,
        text=True,
    )
    out: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


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
    parser.add_argument("--child", nargs=2, metavar=("METHOD", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]), args.repeat)
        return
    names = list(CASES) if args.cases == "all" else args.cases.split(",")
    print(f"{args.records:,} records, {args.keys:,} keys, one pass over all non-active segments")
    print(f"best of {args.repeat} runs x {args.rounds} rounds; {os.cpu_count()} CPUs")
    header = f"{'case':<10} {'method':<9} {'MB':>7} {'time s':>7} {'cpu s':>6} {'MB/s':>7} "
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
                    f"{name:<10} {method:<9} {mb:>7.1f} {secs:>7.2f} {r['cpu_s']:>6.2f} "
                    f"{mb / secs:>7.1f} {args.records / secs:>11,.0f} {r['rss_mb']:>7.0f} "
                    f"{per_key:>9} {results['aiokafka']['seconds'] / secs:>10.1f}x "
                    f"{secs / results['copy']['seconds']:>7.1f}x {cold} {load:>9}"
                )


if __name__ == "__main__":
    main()
