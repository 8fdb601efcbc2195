"""Decode throughput with key extraction: cleanerd's columns vs aiokafka's C reader vs
kafka-python's reader, on one generated segment.

The segment holds producer-like batches of about 16 KiB (records with keys ``key-%08d``
and 100-byte values), optionally compressed. Every reader gets the same bytes in memory
and must reach every record's key; the time is the best of `--repeat` runs, MB/s counts
segment (on-disk) bytes. The numba
kernels are compiled (or loaded from the on-disk cache) by a warm-up run first, which is
not timed.

    python -m bench.decode [--size-mb 100] [--codec none|gzip|snappy|lz4|zstd]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np

from cleanerd.records import columns, walker
from cleanerd.records.batch import encode_batch, iter_records
from cleanerd.records.columns import segment_columns
from cleanerd.records.header import Compression
from cleanerd.records.record import Record
from cleanerd.records.walker import scan_batches

BATCH_BYTES = 16 * 1024
VALUE_BYTES = 100


def generate_segment(path: Path, size_bytes: int, codec: Compression) -> int:
    """Write about `size_bytes` of batches to `path`; return the record count."""
    rng = np.random.default_rng(7)
    per_batch = BATCH_BYTES // (VALUE_BYTES + 12 + 8)
    offset = 0
    written = 0
    ts = 1_700_000_000_000
    with open(path, "wb") as f:
        while written < size_bytes:
            # Half random, half repeated bytes: compressible like real payloads.
            values = rng.integers(0, 256, size=(per_batch, VALUE_BYTES // 2), dtype=np.uint8)
            records = [
                Record(
                    offset + i,
                    ts + i,
                    b"key-%08d" % (offset + i),
                    values[i].tobytes() + b"x" * (VALUE_BYTES - VALUE_BYTES // 2),
                )
                for i in range(per_batch)
            ]
            batch = encode_batch(records, base_offset=offset, compression=codec)
            f.write(batch)
            written += len(batch)
            offset += per_batch
            ts += per_batch
    return offset


def cleanerd_columns(data: bytes) -> int:
    cols = segment_columns(data)
    return int(np.count_nonzero(cols.key_len >= 0))


def cleanerd_iter_records(data: bytes) -> int:
    n = 0
    for info in scan_batches(data):
        for record in iter_records(data, info):
            n += record.key is not None
    return n


def aiokafka_reader(data: bytes) -> int:
    from aiokafka.record.memory_records import MemoryRecords

    records = MemoryRecords(data)
    n = 0
    while True:
        batch = records.next_batch()
        if batch is None:
            return n
        for record in batch:
            n += record.key is not None


def kafka_python_reader(data: bytes) -> int:
    from kafka.record.memory_records import MemoryRecords

    records = MemoryRecords(data)
    n = 0
    while True:
        batch = records.next_batch()
        if batch is None:
            return n
        for record in batch:
            n += record.key is not None


def best_of(fn: Callable[[bytes], int], data: bytes, repeat: int, expected: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        keys = fn(data)
        best = min(best, time.perf_counter() - start)
        if keys != expected:
            raise SystemExit(f"{fn.__name__} found {keys} keys, expected {expected}")
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=100.0, help="segment size (MB)")
    parser.add_argument("--codec", choices=[c.name.lower() for c in Compression], default="none")
    parser.add_argument("--repeat", type=int, default=3, help="runs per reader (best counts)")
    parser.add_argument("--skip-slow", action="store_true", help="skip the pure-Python readers")
    args = parser.parse_args()
    codec = Compression[args.codec.upper()]

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "00000000000000000000.log"
        count = generate_segment(path, int(args.size_mb * 1e6), codec)
        data = path.read_bytes()
    mb = len(data) / 1e6

    first = next(scan_batches(data))
    warm = time.perf_counter()
    segment_columns(data, end=first.size)
    warm_s = time.perf_counter() - warm
    kernels = [walker._walk_kernel, columns._batches_kernel]
    compiled = sum(len(cast(Any, k).stats.cache_misses) for k in kernels)

    readers: list[tuple[str, Callable[[bytes], int]]] = [
        ("cleanerd segment_columns", cleanerd_columns),
        ("aiokafka MemoryRecords (C)", aiokafka_reader),
    ]
    if not args.skip_slow:
        readers += [
            ("cleanerd iter_records (pure)", cleanerd_iter_records),
            ("kafka-python MemoryRecords", kafka_python_reader),
        ]
    print(
        f"segment: {mb:.1f} MB, {count} records, codec {args.codec}, "
        f"{os.cpu_count()} CPUs; numba warm-up {warm_s:.2f} s (on-disk cache "
        f"{'cold: compiled now' if compiled else 'warm'})"
    )
    print(f"{'reader':32} {'seconds':>9} {'MB/s':>9} {'records/s':>13}")
    for name, fn in readers:
        seconds = best_of(fn, data, args.repeat, count)
        print(f"{name:32} {seconds:9.3f} {mb / seconds:9.1f} {count / seconds:13,.0f}")


if __name__ == "__main__":
    main()
