"""The Spark engine against the local engine: one pass over the same log, start-up cost,
and the key count from which Spark is the better choice.

The log is `bench.clean`'s: 100-byte values in ~16 KiB batches, 256 MiB segments, keys
drawn uniformly from `--keys`. Every run gets a fresh copy of it and cleans everything
below the active segment:

- `local`: `Cleaner.clean` in this process with a map that holds every key (one pass);
- `spark local[N]`: a `SparkEngine` pass (job process, JVM start, decode, shuffle,
  bitmaps, copy, then the verification and swap here), timed from submit to result; the
  job's own phases come from its manifest.

Start-up versus per-byte cost: the Spark runs are repeated on a tiny log (`--tiny-mb`);
its time is the fixed cost, and (time - fixed) / size the per-byte cost.

Crossover: a local pass stops when its map is full, so a dirty range with more keys than
the map holds takes several passes. The local engine is run to completion with maps of
1/r of the keys (`--ratios`), counting passes; Spark's time does not depend on the map.
The crossover is the smallest keys-per-map-capacity ratio at which the local passes take
longer than Spark local[2]; multiplied by the capacity of the default map
(`log.cleaner.dedupe.buffer.size` 128 MiB, one thread) it is the key count from which
`engine.name: auto` should send a partition to Spark on this machine.

    python -m bench.spark [--gb 1] [--keys 1000000] [--tiny-mb 2] [--ratios 2,4]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.clean import CASES, TOPIC_DIR, generate, sources
from cleanerd.compaction.cleaner import Cleaner, CleanerConfig
from cleanerd.compaction.offset_map import OffsetMap
from cleanerd.engine.base import CleanJob
from cleanerd.engine.routing import local_key_capacity
from cleanerd.engine.spark.engine import SparkEngine, SparkSettings
from cleanerd.log.files import TopicPartition
from cleanerd.log.partition_log import PartitionLog

RECORD_BYTES = 125  # a 100-byte value, its key and framing, in 16 KiB batches
CONFIG = CleanerConfig(segment_bytes=2**31 - 1)
TP = TopicPartition("bench", 0)
NOW = 1_800_000_000_000
DEFAULT_DEDUPE = 128 * 1024 * 1024


@dataclass(frozen=True)
class Run:
    label: str
    mb: float
    seconds: float
    passes: int = 1
    detail: str = ""


def fresh(template: Path, work: Path) -> Path:
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(template, work)
    return work / TOPIC_DIR


def run_local(d: Path, map_bytes: int) -> tuple[float, int]:
    """Clean to the end with a map of `map_bytes`, pass after pass; (seconds, passes)."""
    m = OffsetMap(map_bytes)
    plog = PartitionLog.open(d, read_only=True, recover=False)
    start, passes, first_dirty = time.perf_counter(), 0, 0
    while True:
        meta = plog.meta()
        end = meta.active.base_offset
        result = Cleaner(m).clean(
            log_dir=d.parent,
            tp=TP,
            segments=meta.segments,
            first_dirty=first_dirty,
            first_uncleanable=end,
            now_ms=NOW,
            config=CONFIG,
        )
        passes += 1
        for path in result.deleted_files:
            path.unlink()
        first_dirty = result.end_offset
        if first_dirty >= end:
            return time.perf_counter() - start, passes


def run_spark(d: Path, master: str, state: Path) -> tuple[float, str]:
    """One Spark pass; (seconds from submit to result, the job's phases)."""
    meta = PartitionLog.open(d, read_only=True, recover=False).meta()
    job = CleanJob(
        log_dir=d.parent,
        state_dir=state,
        tp=TP,
        segments=meta.segments,
        first_dirty=0,
        first_uncleanable=meta.active.base_offset,
        now_ms=NOW,
        config=CONFIG,
    )
    conf = (("spark.driver.memory", "2g"), ("spark.ui.showConsoleProgress", "false"))
    with SparkEngine(SparkSettings(master=master, conf=conf)) as engine:
        start = time.perf_counter()
        future = engine.submit_clean(job)
        engine.flush()
        future.result()
        seconds = time.perf_counter() - start
        m = engine.manifests[-1]
    rest = seconds - (m.startup_ms + m.reduce_ms + m.copy_ms) / 1000
    detail = (
        f"JVM+session {m.startup_ms / 1000:.1f}s, decode+shuffle+bitmaps "
        f"{m.reduce_ms / 1000:.1f}s, copy {m.copy_ms / 1000:.1f}s, launch+verify+swap {rest:.1f}s"
    )
    return seconds, detail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--tiny-mb", type=float, default=2.0)
    parser.add_argument("--ratios", default="2,4", help="keys per local map capacity")
    parser.add_argument("--masters", default="local[1],local[2]")
    args = parser.parse_args()
    masters = args.masters.split(",")
    ratios = [float(r) for r in args.ratios.split(",")]
    records = int(args.gb * 1e9 / RECORD_BYTES)
    tiny_records = int(args.tiny_mb * 1e6 / RECORD_BYTES)
    case = CASES["100B"]
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        root = Path(tmp)
        template = generate(root / "big", case, records, args.keys).parent
        tiny = generate(root / "tiny", case, tiny_records, min(args.keys, tiny_records)).parent
        mb = sum(p.stat().st_size for p in sources(template / TOPIC_DIR)) / 1e6
        tiny_mb = sum(p.stat().st_size for p in sources(tiny / TOPIC_DIR)) / 1e6
        print(f"{records:,} records ({mb:,.0f} MB), {args.keys:,} keys; tiny log {tiny_mb:.1f} MB")
        run_local(fresh(tiny, root / "warm"), 1 << 26)  # numba kernels from the disk cache
        full_map = (args.keys * 24 * 10) // 9 + 1024
        seconds, _ = run_local(fresh(template, root / "work"), full_map)
        runs.append(Run("local (map holds every key)", mb, seconds))
        spark_big: dict[str, float] = {}
        for master in masters:
            for label, tmpl, size in (("tiny", tiny, tiny_mb), ("1 GB", template, mb)):
                seconds, detail = run_spark(fresh(tmpl, root / "work"), master, root / "state")
                runs.append(Run(f"spark {master}, {label} log", size, seconds, detail=detail))
                if label == "tiny":
                    fixed = seconds
                else:
                    spark_big[master] = seconds
                    per_mb = (seconds - fixed) / (size - tiny_mb)
                    runs[-1] = Run(
                        runs[-1].label,
                        size,
                        seconds,
                        detail=f"{detail}; fixed {fixed:.1f}s + {per_mb * 1000:.1f} ms/MB",
                    )
        crossover = None
        best_spark = min(spark_big.values())
        for ratio in ratios:
            map_bytes = int(args.keys / ratio / 0.9 * 24) + 24
            seconds, passes = run_local(fresh(template, root / "work"), map_bytes)
            runs.append(Run(f"local, keys = {ratio:g} x map", mb, seconds, passes))
            if crossover is None and seconds > best_spark:
                crossover = ratio
    print(f"{'engine':<32} {'MB':>7} {'time s':>7} {'MB/s':>7} {'passes':>6}  detail")
    for r in runs:
        print(
            f"{r.label:<32} {r.mb:>7.1f} {r.seconds:>7.1f} {r.mb / r.seconds:>7.1f} "
            f"{r.passes:>6}  {r.detail}"
        )
    capacity = local_key_capacity(DEFAULT_DEDUPE, 1, 0.9, versioned=False)
    if crossover is None:
        print(f"local stays faster up to {max(ratios):g} x its map's keys on this machine")
    else:
        print(
            f"Spark is the better choice from about {crossover:g} x the local map's keys: "
            f"{int(crossover * capacity):,} keys with the default 128 MiB buffer and one "
            f"thread (capacity {capacity:,} keys)"
        )


if __name__ == "__main__":
    main()
