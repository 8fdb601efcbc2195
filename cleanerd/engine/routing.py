"""The `auto` engine: each pass on Spark only where the local key map is too small.

With `engine.name: auto` (or `--engine auto`), a pass goes to Spark when its dirty range
holds more distinct keys than `engine.spark.min_keys_over_capacity` (>= 1, default 1)
times what one local worker's offset map can (`local_key_capacity`: Kafka's split of
`log.cleaner.dedupe.buffer.size` over `log.cleaner.threads`, entries of 24 or 32 bytes,
times the load factor); every other pass runs locally, where it costs no JVM start-up.
At 1 a range goes to Spark as soon as the local engine would need more than one pass;
`bench/spark.py` puts the crossover at about 4.5 to 7 times the capacity on a 2-core
host (below it, the local passes together still beat Spark's start-up and shuffle).
The `local` engine runs every pass locally and never starts a JVM; the `spark` engine
runs every pass on Spark.

The key count of a dirty range is known, in order of preference:

1. from the partition's previous local pass: a pass that ended before its first
   uncleanable offset filled its map, so the keys outgrew it; they are estimated as the
   capacity scaled by the share of the range's offsets that pass covered (keys spread
   evenly), and the estimate is kept until a local pass covers its range;
2. from the range's size: a record takes at least `MIN_RECORD_BYTES` on disk, so a range
   smaller than `capacity * MIN_RECORD_BYTES` cannot hold too many keys;
3. from a sample: up to `SAMPLE_BYTES`, spread as segment prefixes over the dirty range,
   is decoded and its keys hashed; the distinct count of the whole range is estimated
   with the GEE estimator (Charikar et al., "Towards estimation error guarantees for
   distinct values", PODS 2000): ``D = sqrt(N/n) * f1 + (d - f1)`` for `n` sampled of
   `N` records, `d` distinct keys in the sample, `f1` of them seen once. Its error is
   within a factor sqrt(N/n) either way, which is what a routing choice needs.

`choose_engine` is the pure decision; `AutoEngine` is the `Engine` that applies it,
delegating to a local engine and to a Spark engine made on first use.
"""

from __future__ import annotations

import math
import mmap
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

from cleanerd.compaction.cleaner import CleanResult
from cleanerd.compaction.keyhash import hash_keys
from cleanerd.compaction.map_memory import (
    OFFSET_ENTRY_BYTES,
    VERSIONED_ENTRY_BYTES,
    map_slots,
    memory_per_thread,
)
from cleanerd.config import Config
from cleanerd.engine.base import CleanJob, Engine
from cleanerd.engine.local import LocalEngine
from cleanerd.engine.spark.engine import SparkEngine
from cleanerd.errors import CleanerdError
from cleanerd.log.files import TopicPartition, log_file
from cleanerd.log.meta import SegmentMeta
from cleanerd.logger import get_logger
from cleanerd.records.columns import segment_columns
from cleanerd.records.header import CONTROL_MASK
from cleanerd.records.walker import scan_batches

log = get_logger(__name__)

SAMPLE_BYTES: Final = 8 * 1024 * 1024
MIN_RECORD_BYTES: Final = 8
"""A v2 record's smallest size on disk (7 bytes of varints plus a one-byte key)."""


def local_key_capacity(
    dedupe_buffer_size: int, threads: int, load_factor: float, *, versioned: bool
) -> int:
    """How many keys one local worker's offset map holds."""
    entry = VERSIONED_ENTRY_BYTES if versioned else OFFSET_ENTRY_BYTES
    return int(map_slots(memory_per_thread(dedupe_buffer_size, threads), entry) * load_factor)


def gee_distinct(counts: Sequence[int] | np.ndarray, population: int) -> int:
    """GEE's estimate of the distinct values among `population` records, from the
    occurrence count of each distinct value of a uniform-ish sample."""
    c = np.asarray(counts, dtype=np.int64)
    sampled = int(c.sum())
    if sampled == 0:
        return 0
    f1 = int(np.count_nonzero(c == 1))
    scale = math.sqrt(max(population, sampled) / sampled)
    return round(scale * f1 + (c.size - f1))


@dataclass(frozen=True, slots=True)
class KeyEstimate:
    """Distinct keys of a dirty range, and how the number was found."""

    keys: int
    source: str
    """`history`, `size` or `sample`."""


def choose_engine(
    estimate: KeyEstimate, capacity: int, *, min_keys_over_capacity: float = 1.0
) -> str:
    """`spark` when the estimated keys exceed `min_keys_over_capacity` times the local
    map's capacity, else `local`."""
    return "spark" if estimate.keys > capacity * min_keys_over_capacity else "local"


def keys_from_filled_map(job: CleanJob, end_offset: int, capacity: int) -> int:
    """The dirty range's keys, from a local pass whose full map (`capacity` keys) took it
    from `job.first_dirty` only to `end_offset`."""
    span = job.first_uncleanable - job.first_dirty
    covered = max(end_offset - job.first_dirty, 1)
    return max(capacity + 1, math.ceil(capacity * span / covered))


def _dirty_segments(job: CleanJob) -> list[SegmentMeta]:
    segs = job.segments
    out = []
    for i, seg in enumerate(segs):
        upper = segs[i + 1].base_offset if i + 1 < len(segs) else seg.next_offset
        if seg.base_offset < job.first_uncleanable and upper > job.first_dirty:
            out.append(seg)
    return out


def _sample_hashes(path: Path, budget: int, first: int, end: int) -> tuple[np.ndarray, int, int]:
    """(key hashes, records, bytes) of the keyed data records in [first, end) among the
    batches of `path` that start within its first `budget` bytes."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return np.zeros((0, 2), np.uint64), 0, 0
        raw = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    stop = 0
    for info in scan_batches(raw, verify_crc=False):
        stop = info.position + info.size
        if stop >= budget:
            break
    sc = segment_columns(raw, end=stop, verify_crc=False)
    bi = sc.batch_index.astype(np.int64)
    data = (sc.attributes.astype(np.int64)[bi] & CONTROL_MASK) == 0
    rows = np.flatnonzero(data & (sc.key_len >= 0) & (sc.offset >= first) & (sc.offset < end))
    hashes = np.zeros((rows.size, 2), np.uint64)
    for bid, buf in enumerate(sc.buffers):
        mask = sc.buffer_id[rows] == bid
        if mask.any():
            sel = rows[mask]
            hashes[mask] = hash_keys(buf, sc.key_pos[sel], sc.key_len[sel])
    return hashes, int(sc.num_records), stop


def estimate_keys(job: CleanJob, *, capacity: int, sample_bytes: int = SAMPLE_BYTES) -> KeyEstimate:
    """The dirty range's distinct keys from its size or a sample (module docstring)."""
    dirty = _dirty_segments(job)
    total = sum(s.size_bytes for s in dirty)
    if total < capacity * MIN_RECORD_BYTES:
        return KeyEstimate(total // MIN_RECORD_BYTES, "size")
    budget = max(1, sample_bytes // max(1, len(dirty)))
    parts, records, read = [], 0, 0
    for seg in dirty:
        hashes, n, used = _sample_hashes(
            log_file(job.dir_path, seg.base_offset), budget, job.first_dirty, job.first_uncleanable
        )
        parts.append(hashes)
        records += n
        read += used
    if read == 0:
        return KeyEstimate(0, "sample")
    hashes = np.concatenate(parts) if parts else np.zeros((0, 2), np.uint64)
    _, counts = np.unique(hashes, axis=0, return_counts=True)
    keyed_share = hashes.shape[0] / max(records, 1)
    population = round(records * total / read * keyed_share)
    return KeyEstimate(gee_distinct(counts, population), "sample")


class AutoEngine:
    """The `auto` engine: each pass on the engine `choose_engine` picks.
    `spark_factory` is called on the first Spark pass."""

    def __init__(
        self,
        local: Engine,
        spark_factory: Callable[[], Engine],
        capacity: Callable[[CleanJob], int],
        *,
        sample_bytes: int = SAMPLE_BYTES,
        min_keys_over_capacity: float = 1.0,
    ) -> None:
        self.local = local
        self.min_keys_over_capacity = min_keys_over_capacity
        self._spark_factory = spark_factory
        self._spark: Engine | None = None
        self._capacity = capacity
        self._sample_bytes = sample_bytes
        self._lock = threading.Lock()
        self._map_filled: dict[TopicPartition, int] = {}
        """Keys estimated from the last local pass of a partition that filled its map."""
        self._where: dict[TopicPartition, Engine] = {}
        self.decisions: dict[TopicPartition, tuple[str, KeyEstimate]] = {}
        """The last routing decision per partition, with its estimate (for logs)."""

    @property
    def name(self) -> str:
        return "auto"

    @property
    def workers(self) -> int:
        spark = self._spark.workers if self._spark is not None else 0
        return self.local.workers + max(spark, 1)

    @property
    def dead_workers(self) -> int:
        spark = self._spark.dead_workers if self._spark is not None else 0
        return self.local.dead_workers + spark

    def estimate(self, job: CleanJob) -> KeyEstimate:
        """The key estimate routing `job`."""
        capacity = self._capacity(job)
        with self._lock:
            filled = self._map_filled.get(job.tp)
        if filled is not None:
            return KeyEstimate(filled, "history")
        try:
            return estimate_keys(job, capacity=capacity, sample_bytes=self._sample_bytes)
        except (CleanerdError, OSError):
            return KeyEstimate(0, "sample")  # the local pass reports the corruption

    def submit_clean(self, job: CleanJob) -> Future[CleanResult]:
        estimate = self.estimate(job)
        capacity = self._capacity(job)
        choice = choose_engine(
            estimate, capacity, min_keys_over_capacity=self.min_keys_over_capacity
        )
        # Said at info where the pass leaves this host: which engine ran it shows nowhere
        # else (a Spark pass's statistics have no map to show).
        (log.info if choice == "spark" else log.debug)(
            "clean.routed",
            topic=job.tp.topic,
            partition=job.tp.partition,
            log_dir=str(job.log_dir),
            engine=choice,
            keys=estimate.keys,
            keys_from=estimate.source,
            local_capacity=capacity,
        )
        engine = self._spark_engine() if choice == "spark" else self.local
        with self._lock:
            self.decisions[job.tp] = (choice, estimate)
            self._where[job.tp] = engine
        future = engine.submit_clean(job)
        if engine is self.local:
            future.add_done_callback(lambda f: self._note_local(job, f))
        return future

    def _note_local(self, job: CleanJob, future: Future[CleanResult]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        end = future.result().end_offset
        with self._lock:
            if end < job.first_uncleanable:
                self._map_filled[job.tp] = keys_from_filled_map(job, end, self._capacity(job))
            else:
                self._map_filled.pop(job.tp, None)

    def _spark_engine(self) -> Engine:
        with self._lock:
            if self._spark is None:
                self._spark = self._spark_factory()
            return self._spark

    def flush(self) -> None:
        self.local.flush()
        if self._spark is not None:
            self._spark.flush()

    def abort(self, tp: TopicPartition) -> bool:
        with self._lock:
            engine = self._where.get(tp)
        return engine.abort(tp) if engine is not None else False

    def shutdown(self, *, abort: bool = False) -> None:
        self.local.shutdown(abort=abort)
        if self._spark is not None:
            self._spark.shutdown(abort=abort)


def auto_engine(config: Config, *, in_process: bool = False) -> AutoEngine:
    """The `auto` engine of `config`: local passes on `LocalEngine` (`in_process` as
    there), the passes whose keys outgrow its map by `engine.spark.min_keys_over_capacity`
    on `SparkEngine` (checked for PySpark and Java when first used)."""

    def capacity(job: CleanJob) -> int:
        return local_key_capacity(
            config.log_cleaner_dedupe_buffer_size,
            config.log_cleaner_threads,
            config.log_cleaner_io_buffer_load_factor,
            versioned=job.config.strategy.versioned,
        )

    return AutoEngine(
        LocalEngine.from_config(config, in_process=in_process),
        lambda: SparkEngine.from_config(config),
        capacity,
        min_keys_over_capacity=config.engine.spark.min_keys_over_capacity,
    )
