"""What the compaction benchmarks share: one generated partition, and three ways to
process it, each run in its own process that prints its numbers as JSON.

`generate` writes a partition `bench-0`: records with keys drawn uniformly from `keys`
keys (so about records/keys versions per key, all but the last superseded), random
values, in batches of `per_batch` records (default: producer-like batches of about
16 KiB), segments of 256 MiB, and a one-record active segment. With `idempotent`, every
batch carries a producer id, epoch and sequence, as Kafka's default producer writes them
(four producers taking turns). Every method then processes all segments below the active
one:

- `copy`: read every segment file and write it to a new file, fsynced (the floor);
- `aiokafka`: read every record with aiokafka's reader (C extension), keep a dict
  key -> latest record, write the survivors in offset order with aiokafka's
  DefaultRecordBatchBuilder in ~16 KiB batches, fsynced (what a user would write);
- `aiokafka-py`: the same with aiokafka's pure-Python reader and builder
  (`AIOKAFKA_NO_EXTENSIONS=1`), the plain-Python compaction issue 12 measured against
  (2.9 s for 500,001 1-record batches there);
- `cleanerd`: one `Cleaner.clean` pass (map build, copy, swap, checkpoint), in-process.

`measure` runs one method in a fresh process, `--repeat` times on the same data, and
keeps the best; cleanerd first warms up (numba kernels loaded from their on-disk cache)
and then runs as a daemon's worker would: a first pass ("cold"), then passes on fresh
copies of the log with the same map, the memory one pass frees kept for the next
(`engine/heap.py`). `seconds` is wall time (fsync included), `cpu_s` the process's
CPU time (user + system) of that run, `rss_mb` the process's peak RSS.

    python -m bench.compaction --child METHOD DIR [--repeat N]   (used by the benchmarks)
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
from pathlib import Path
from typing import Final

from cleanerd.compaction.offset_map import OffsetMap
from cleanerd.engine.heap import keep_freed_memory
from cleanerd.records.batch import encode_batch
from cleanerd.records.header import Compression
from cleanerd.records.record import Record

SEGMENT_BYTES = 256 * 1024 * 1024
DEDUPE_BYTES = 128 * 1024 * 1024  # Kafka's default log.cleaner.dedupe.buffer.size
BATCH_BYTES = 16 * 1024
TOPIC = "bench"
TOPIC_DIR = f"{TOPIC}-0"
NOW_MS = 1_800_000_000_000
PRODUCERS = 4


def generate(
    root: Path,
    *,
    value_size: int,
    codec: Compression,
    records: int,
    keys: int,
    per_batch: int | None = None,
    idempotent: bool = False,
) -> Path:
    """Write the partition `root/bench-0`; returns its dir."""
    d = root / TOPIC_DIR
    d.mkdir(parents=True)
    rng = random.Random(42)
    if per_batch is None:
        per_batch = max(1, BATCH_BYTES // (value_size + 20))
    offset, base, size = 0, 0, 0
    out = open(d / f"{base:020d}.log", "wb")  # noqa: SIM115
    ts = 1_700_000_000_000
    sequences = [0] * PRODUCERS
    while offset < records:
        n = min(per_batch, records - offset)
        batch = [
            Record(
                offset + i,
                ts + offset + i,
                b"key-%08d" % rng.randrange(keys),
                rng.randbytes(value_size),
            )
            for i in range(n)
        ]
        pid, epoch, sequence = -1, -1, -1
        if idempotent:
            k = (offset // per_batch) % PRODUCERS
            pid, epoch, sequence = 1000 + k, 0, sequences[k]
            sequences[k] += n
        data = encode_batch(
            batch,
            base_offset=offset,
            compression=codec,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=sequence,
        )
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
        tp=TopicPartition(TOPIC, 0),
        segments=meta.segments,
        first_dirty=0,
        first_uncleanable=meta.active.base_offset,
        now_ms=NOW_MS,
        config=CleanerConfig(segment_bytes=2**31 - 1),
    )
    return {
        "seconds": time.perf_counter() - start,
        "cpu_s": cpu_seconds() - cpu,
        "map_bytes_per_key": m.bytes_per_key,
        "index_s": result.stats.elapsed_index_secs,
    }


def run_aiokafka_py(d: Path) -> dict[str, float]:
    """`run_aiokafka` with aiokafka's pure-Python record classes (`measure` sets
    `AIOKAFKA_NO_EXTENSIONS` for this method's process)."""
    from aiokafka.record.default_records import DefaultRecordBatch

    if DefaultRecordBatch.__name__ != "_DefaultRecordBatchPy":
        raise SystemExit("aiokafka-py needs AIOKAFKA_NO_EXTENSIONS=1 before aiokafka loads")
    return run_aiokafka(d)


METHODS = {
    "copy": run_copy,
    "aiokafka": run_aiokafka,
    "aiokafka-py": run_aiokafka_py,
    "cleanerd": run_cleanerd,
}
PURE_PYTHON_ENV: Final = {"AIOKAFKA_NO_EXTENSIONS": "1"}
"""The environment `aiokafka-py` runs in."""


def timed(run: Callable[[], dict[str, float]]) -> tuple[float, float, dict[str, float]]:
    """(wall seconds, CPU seconds, the run's own numbers) of one run; a run that reports
    its own `seconds` and `cpu_s` (cleanerd: the pass without the segment listing) is
    taken at its word."""
    cpu, start = cpu_seconds(), time.perf_counter()
    out = run()
    wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    return out.pop("seconds", wall), out.pop("cpu_s", cpu), out


def child(method: str, d: Path, repeat: int) -> None:
    """Run one method on `d` and print its numbers as JSON: the best of `repeat` runs
    (see the module docstring)."""
    runs = []
    extra: dict[str, float] = {}
    if method == "cleanerd":
        keep_freed_memory()  # as a worker process runs its passes (engine/heap.py)
        m = OffsetMap(DEDUPE_BYTES)
        for codec in (Compression.NONE, Compression.LZ4):  # plain and side-buffer kernels
            with tempfile.TemporaryDirectory() as tmp:
                warm = generate(Path(tmp), value_size=100, codec=codec, records=2000, keys=100)
                run_cleanerd(warm, m)
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
    """`method` on a fresh copy `work` of the log dir `template`, in its own process."""
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(template, work)
    command = [sys.executable, "-m", "bench.compaction", "--child", method, str(work / TOPIC_DIR)]
    env = {**os.environ, **(PURE_PYTHON_ENV if method == "aiokafka-py" else {})}
    proc = subprocess.run(
        [*command, "--repeat", str(repeat)],
        capture_output=True,
        check=True,
        text=True,
        env=env,
    )
    out: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("METHOD", "DIR"), required=True)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    child(args.child[0], Path(args.child[1]), args.repeat)


if __name__ == "__main__":
    main()
