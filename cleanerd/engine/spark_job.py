"""The Spark engine's job: compaction passes whose winners are found by Spark's shuffle.

Run as its own process, never inside the daemon: ``python -m cleanerd.engine.spark_job
SPEC.json``. The spec (`JobSpec`, JSON) lists one pass per partition, each exactly what a
local pass is given (segments, [first_dirty, first_uncleanable), now_ms, the topic's
cleaner settings), plus a staging dir. The job:

1. **Decode** (one Spark task per segment, in the executors' Python workers): the segment
   is memory-mapped (or, for a pass whose `read_root` is a Hadoop filesystem URI, read
   with Spark's `binaryFile` source) and decoded by `cleanerd.records.columns`; its keyed
   data records below the pass's end become rows (pass, seg, krow, key hash, offset,
   version, cand, upd) built with `hash_keys` and `record_versions`, handed to the JVM as
   Arrow batches. `krow` is the record's rank among the segment's keyed records, the order
   in which the copy phase asks. `cand` marks the records the local pass puts in its map
   (dirty range, not aborted); `upd` the clean-section records that may beat a dirty
   winner under the timestamp and header strategies (the map's `update_existing_many`).
2. **Reduce** (Spark's shuffle by key hash, so no memory cap on keys per pass): each
   shuffle partition ranks its rows with numpy; a key with a `cand` row has one winner,
   the highest-ranked `cand`/`upd` row (offset strategy: highest offset; others:
   KIP-280's (has version, version, offset)). A record is superseded iff its key has a
   winner and it is below it (offset strategy) or is not it (the others): the local map's
   `keep_mask` rule, over the same 128-bit hashes.
3. **Bitmaps** (shuffle by segment): per segment, the superseded `krow`s become a bitmap
   file `<staging>/pass-<i>/<base>.superseded` (8-byte little-endian bit count, then the
   bits, `np.packbits` order); a segment without one has nothing superseded.
4. **Copy** (this process, after Spark stops): the local pass itself
   (`Cleaner.clean(oracle=SupersededBitmaps, install=False)`) writes the `.cleaned`
   segments and indexes, with every batch, transaction, producer and horizon rule shared
   with the local engine; the bitmaps replace only the offset map. No swap, no checkpoint:
   the manifest (`<staging>/manifest.json`) lists per pass the end offset, the stats and
   every group's output (base, next offset, replaced bases, records, bytes) for the caller
   to verify and install (`cleanerd.engine.spark`).

Why the outputs are byte-identical to the local engine's: the copy phase is the same code;
its only other input, "is this keyed record superseded", is decided by the same rule over
the same hashes, versions and candidate set, and the end offset is the first uncleanable
offset, which is where a local pass whose map holds every key ends too. Aborted data is
found per segment by a `TransactionTracker` fed the aborted transactions overlapping that
segment; that equals the local pass's one tracker walking the range because an aborted
transaction is open exactly from its first offset to its ABORT marker, which the job
checks is present in the segment its `.txnindex` entry ends in (CorruptIndexError if not).

Failure: a segment that cannot be decoded fails its pass only (the manifest says why);
a pass whose copy fails leaves no `.cleaned` file. If the job dies, the caller removes any
`.cleaned` output; the originals are never touched by the job. The job exits when its
parent dies, so an orphan never writes into a partition after the daemon restarts.

Executors reach the log dirs and the staging dir by the same local paths (local master,
or a shared mount); segments on shared storage can instead be read through `read_root`.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlparse

import numpy as np
from numpy.typing import NDArray

import cleanerd
from cleanerd.compaction.cleaner import CleanedGroup, Cleaner, CleanerConfig, CleanResult
from cleanerd.compaction.keyhash import hash_keys
from cleanerd.compaction.stats import CleanerStats
from cleanerd.compaction.strategy import CompactionStrategy, ResolvedStrategy, segment_versions
from cleanerd.compaction.swap import FileOps, remove_stale_cleaned
from cleanerd.compaction.transactions import ABORT, TransactionTracker
from cleanerd.engine.lifeline import die_with_owner_from_env
from cleanerd.errors import CleanerdError, CorruptIndexError, CorruptRecordError
from cleanerd.log.files import TopicPartition, log_file
from cleanerd.log.meta import SegmentMeta
from cleanerd.log.segment_reader import (
    aborted_between,
    join_buffers,
    load_aborted,
    map_segment,
    segment_upper,
)
from cleanerd.log.txnindex import AbortedTxn
from cleanerd.records.columns import SegmentColumns, segment_columns
from cleanerd.records.control import control_types
from cleanerd.records.header import (
    CONTROL_MASK,
    TRANSACTIONAL_MASK,
    Buffer,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

SPEC_VERSION: Final = 1
MANIFEST: Final = "manifest.json"
BITMAP_SUFFIX: Final = ".superseded"
KEY_PARTITION_BYTES: Final = 256 * 1024 * 1024
"""Segment bytes per shuffle partition of the reduce (a partition's rows are ranked in
one numpy sort, about 60 bytes per record)."""
ROWS_PER_BATCH: Final = 1 << 20
TASK_BYTES: Final = 64 * 1024 * 1024
"""Segments smaller than this share a decode task (a task costs tens of milliseconds)."""

ROW_SCHEMA: Final = (
    "pass int, seg long, krow long, hi long, lo long, offset long, "
    "has boolean, version long, cand boolean, upd boolean"
)
LOSER_SCHEMA: Final = "pass int, seg long, krow long"
BITMAP_SCHEMA: Final = "pass int, seg long, bits long"

I64 = NDArray[np.int64]
Bools = NDArray[np.bool_]


# ---------------------------------------------------------------------------------------
# The spec and the manifest: plain JSON between the engine and the job.


def _config_to_json(c: CleanerConfig) -> dict[str, Any]:
    s = c.strategy
    return {
        "segment_bytes": c.segment_bytes,
        "max_index_size": c.max_index_size,
        "index_interval_bytes": c.index_interval_bytes,
        "delete_retention_ms": c.delete_retention_ms,
        "producer_id_expiration_ms": c.producer_id_expiration_ms,
        "strategy": s.strategy.value,
        "strategy_header": None if s.header is None else s.header.hex(),
    }


def _config_from_json(d: Mapping[str, Any]) -> CleanerConfig:
    header = d["strategy_header"]
    return CleanerConfig(
        segment_bytes=d["segment_bytes"],
        max_index_size=d["max_index_size"],
        index_interval_bytes=d["index_interval_bytes"],
        delete_retention_ms=d["delete_retention_ms"],
        producer_id_expiration_ms=d["producer_id_expiration_ms"],
        strategy=ResolvedStrategy(
            CompactionStrategy(d["strategy"]), None if header is None else bytes.fromhex(header)
        ),
    )


@dataclass(frozen=True, slots=True)
class PassSpec:
    """One partition's pass, as a local pass would be given it."""

    log_dir: str
    tp: TopicPartition
    segments: tuple[SegmentMeta, ...]
    first_dirty: int
    first_uncleanable: int
    now_ms: int
    config: CleanerConfig
    read_root: str | None = None
    """The partition dir as the executors reach it (a Hadoop filesystem URI), when they
    cannot read `log_dir` directly."""

    @property
    def dir_path(self) -> Path:
        """The partition dir."""
        return Path(self.log_dir) / str(self.tp)

    def segment(self, base: int) -> SegmentMeta:
        """The segment based at `base`."""
        return next(s for s in self.segments if s.base_offset == base)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "log_dir": self.log_dir,
            "topic": self.tp.topic,
            "partition": self.tp.partition,
            "segments": [asdict(s) for s in self.segments],
            "first_dirty": self.first_dirty,
            "first_uncleanable": self.first_uncleanable,
            "now_ms": self.now_ms,
            "config": _config_to_json(self.config),
            "read_root": self.read_root,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PassSpec:
        """The pass `d` describes (`to_json`'s output)."""
        return cls(
            log_dir=d["log_dir"],
            tp=TopicPartition(d["topic"], d["partition"]),
            segments=tuple(SegmentMeta(**s) for s in d["segments"]),
            first_dirty=d["first_dirty"],
            first_uncleanable=d["first_uncleanable"],
            now_ms=d["now_ms"],
            config=_config_from_json(d["config"]),
            read_root=d.get("read_root"),
        )


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What one job process does: `passes`, staged under `staging`, on `master`."""

    passes: tuple[PassSpec, ...]
    staging: str
    master: str = "local[*]"
    conf: Mapping[str, str] = field(default_factory=dict)

    def write(self, path: Path) -> None:
        """Write the spec as JSON."""
        doc = {
            "version": SPEC_VERSION,
            "staging": self.staging,
            "master": self.master,
            "conf": dict(self.conf),
            "passes": [p.to_json() for p in self.passes],
        }
        _write_json(path, doc)

    @classmethod
    def read(cls, path: Path) -> JobSpec:
        """The spec written by `write`; ValueError for another version."""
        doc = json.loads(path.read_text())
        if doc.get("version") != SPEC_VERSION:
            raise ValueError(f"{path}: spec version {doc.get('version')!r}, not {SPEC_VERSION}")
        return cls(
            passes=tuple(PassSpec.from_json(p) for p in doc["passes"]),
            staging=doc["staging"],
            master=doc["master"],
            conf=doc["conf"],
        )


@dataclass(frozen=True, slots=True)
class PassOutcome:
    """What the job did for one pass: its `.cleaned` output, or why it failed."""

    end_offset: int
    cleaned: tuple[CleanedGroup, ...] = ()
    stats: CleanerStats | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "end_offset": self.end_offset,
            "cleaned": [asdict(g) for g in self.cleaned],
            "stats": None if self.stats is None else asdict(self.stats),
            "error": self.error,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PassOutcome:
        """The outcome `d` describes."""
        return cls(
            end_offset=d["end_offset"],
            cleaned=tuple(
                CleanedGroup(**{**g, "old_bases": tuple(g["old_bases"])}) for g in d["cleaned"]
            ),
            stats=None if d["stats"] is None else CleanerStats(**d["stats"]),
            error=d["error"],
        )


@dataclass(frozen=True, slots=True)
class Manifest:
    """The job's result: one outcome per pass of the spec, in order, and its timings."""

    outcomes: tuple[PassOutcome, ...]
    startup_ms: int = 0
    """Starting Spark (JVM, session)."""
    reduce_ms: int = 0
    """Decode, shuffle and bitmaps."""
    copy_ms: int = 0
    """Writing the `.cleaned` output."""

    def write(self, path: Path) -> None:
        """Write the manifest as JSON (tmp file and rename: a reader never sees half)."""
        doc = {
            "version": SPEC_VERSION,
            "outcomes": [o.to_json() for o in self.outcomes],
            "startup_ms": self.startup_ms,
            "reduce_ms": self.reduce_ms,
            "copy_ms": self.copy_ms,
        }
        _write_json(path, doc)

    @classmethod
    def read(cls, path: Path) -> Manifest:
        """The manifest written by `write`."""
        doc = json.loads(path.read_text())
        if doc.get("version") != SPEC_VERSION:
            raise ValueError(f"{path}: manifest version {doc.get('version')!r}")
        return cls(
            outcomes=tuple(PassOutcome.from_json(o) for o in doc["outcomes"]),
            startup_ms=doc["startup_ms"],
            reduce_ms=doc["reduce_ms"],
            copy_ms=doc["copy_ms"],
        )


def _write_json(path: Path, doc: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


# ---------------------------------------------------------------------------------------
# Executor side, stage 1: a segment's rows (pure numpy; tested without Spark).


@dataclass(frozen=True, slots=True)
class SegmentTask:
    """One segment of one pass, as an executor needs it."""

    pass_index: int
    path: str
    """Local path of the `.log`, or its URI when read through `binaryFile`."""
    base: int
    upper: int
    first_dirty: int
    end: int
    """The pass's end offset (its first uncleanable offset)."""
    strategy: ResolvedStrategy
    aborted: tuple[AbortedTxn, ...]
    """The partition's aborted transactions overlapping [base, upper)."""


def aborted_batches(sc: SegmentColumns, task: SegmentTask) -> Bools:
    """Per batch: transactional data of an aborted transaction (see the module docstring
    on why one tracker per segment decides as the pass's one tracker does)."""
    aborted = np.zeros(sc.num_batches, np.bool_)
    if not task.aborted:
        return aborted
    attrs = sc.attributes.astype(np.int64)
    lasts = (sc.base_offset + sc.last_offset_delta).tolist()
    tracker = TransactionTracker()
    tracker.add_aborted(list(task.aborted))
    markers: set[tuple[int, int]] = set()
    types = control_types(sc)
    for b in np.flatnonzero(attrs & (CONTROL_MASK | TRANSACTIONAL_MASK)).tolist():
        pid, last = int(sc.producer_id[b]), lasts[b]
        if attrs[b] & CONTROL_MASK:
            kind = types[b]
            tracker.on_control_batch(pid, kind, last)
            if kind == ABORT:
                markers.add((pid, last))
        else:
            aborted[b] = tracker.on_data_batch(pid, True, last)
    for t in task.aborted:
        if (
            task.base <= t.last_offset < task.upper
            and (t.producer_id, t.last_offset) not in markers
        ):
            raise CorruptIndexError(
                f"aborted transaction of producer {t.producer_id} at [{t.first_offset}, "
                f"{t.last_offset}] has no ABORT marker at {t.last_offset} in {task.path}",
                path=str(Path(task.path).with_suffix(".txnindex")),
            )
    return aborted


def segment_rows(task: SegmentTask, raw: Buffer) -> dict[str, NDArray[Any]]:
    """The rows of stage 1 for one segment (columns of `ROW_SCHEMA`); CorruptRecordError
    names the segment and byte position."""
    try:
        sc = segment_columns(raw, verify_crc=True)
        return _rows(task, sc)
    except CorruptRecordError as exc:
        raise exc.located(Path(task.path)) from exc


def _rows(task: SegmentTask, sc: SegmentColumns) -> dict[str, NDArray[Any]]:
    bi = sc.batch_index.astype(np.int64)
    data = (sc.attributes.astype(np.int64)[bi] & CONTROL_MASK) == 0
    keyed = sc.key_len >= 0
    krow = np.cumsum(keyed, dtype=np.int64) - 1
    offsets = sc.offset
    rows = np.flatnonzero(keyed & data & (offsets < task.end))
    cand = np.zeros(rows.size, np.bool_)
    if task.upper > task.first_dirty:
        mappable = ~aborted_batches(sc, task)[bi[rows]]
        cand = mappable & (offsets[rows] >= task.first_dirty)
    versioned = task.strategy.versioned
    upd = (offsets[rows] < task.first_dirty) if versioned else np.zeros(rows.size, np.bool_)
    joined = join_buffers(sc)
    hashes = hash_keys(joined.buf, joined.key_pos[rows], sc.key_len[rows])
    version, has = segment_versions(task.strategy, sc, joined, rows)
    return {
        "pass": np.full(rows.size, task.pass_index, np.int32),
        "seg": np.full(rows.size, task.base, np.int64),
        "krow": krow[rows],
        "hi": hashes[:, 0].view(np.int64),
        "lo": hashes[:, 1].view(np.int64),
        "offset": np.ascontiguousarray(offsets[rows]),
        "has": has,
        "version": version,
        "cand": cand,
        "upd": upd,
    }


# ---------------------------------------------------------------------------------------
# Executor side, stage 2: the superseded rows of one shuffle partition.


def superseded_rows(cols: Mapping[str, NDArray[Any]], versioned: Bools) -> dict[str, I64]:
    """The (pass, seg, krow) of every superseded row among `cols` (rows of whole keys:
    every row of a key is in the same shuffle partition). `versioned[p]` says whether pass
    p's strategy keeps exactly the winner (else: offsets at or past the winner's)."""
    pass_ids = cols["pass"].astype(np.int64)
    hi, lo, offset = cols["hi"], cols["lo"], cols["offset"]
    n = offset.shape[0]
    if n == 0:
        return {"pass": pass_ids.astype(np.int32), "seg": pass_ids, "krow": pass_ids}
    has = cols["has"]
    # KIP-280's order: a version counts only where the record has one (`_beats`).
    version = np.where(has, cols["version"], 0)
    order = np.lexsort((offset, version, has, lo, hi, pass_ids))
    p, h, lw = pass_ids[order], hi[order], lo[order]
    new_key = np.ones(n, np.bool_)
    new_key[1:] = (p[1:] != p[:-1]) | (h[1:] != h[:-1]) | (lw[1:] != lw[:-1])
    starts = np.flatnonzero(new_key)
    cand = cols["cand"][order]
    eligible = cand | cols["upd"][order]
    # The key's winner: its highest-ranked eligible row (rows are ranked ascending).
    winner = np.maximum.reduceat(np.where(eligible, np.arange(n), -1), starts)
    has_cand = np.logical_or.reduceat(cand, starts)
    sizes = np.diff(np.append(starts, n))
    sorted_offset = offset[order]
    win_offset = np.repeat(sorted_offset[np.maximum(winner, 0)], sizes)
    exact = versioned[p]
    loses = np.where(exact, sorted_offset != win_offset, sorted_offset < win_offset)
    rows = order[np.repeat(has_cand, sizes) & loses]
    return {
        "pass": pass_ids[rows].astype(np.int32),
        "seg": cols["seg"][rows],
        "krow": cols["krow"][rows],
    }


# ---------------------------------------------------------------------------------------
# Stage 3 and the copy phase: superseded bitmaps.


def bitmap_path(staging: Path, pass_index: int, base: int) -> Path:
    """Where the superseded bitmap of segment `base` of pass `pass_index` is staged."""
    return staging / f"pass-{pass_index}" / f"{base:020d}{BITMAP_SUFFIX}"


def write_bitmap(path: Path, krows: I64) -> int:
    """Stage the bitmap with bits `krows` set; returns its bit count."""
    bits = int(krows.max()) + 1 if krows.size else 0
    dense = np.zeros(bits, np.bool_)
    dense[krows] = True
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(bits.to_bytes(8, "little") + np.packbits(dense).tobytes())
    tmp.replace(path)
    return bits


def read_bitmap(path: Path) -> Bools:
    """The bits of a staged bitmap."""
    data = path.read_bytes()
    bits = int.from_bytes(data[:8], "little")
    packed = np.frombuffer(data, np.uint8, offset=8)
    if packed.size != (bits + 7) // 8:
        raise CleanerdError(f"{path}: {packed.size} bytes for {bits} bits")
    return np.unpackbits(packed, count=bits).astype(np.bool_)


@dataclass(frozen=True, slots=True)
class SupersededBitmaps:
    """The Spark engine's `RetentionOracle`: the staged bitmaps of one pass."""

    staging: Path
    pass_index: int
    end_offset: int

    @property
    def latest_offset(self) -> int:
        return self.end_offset - 1

    def keep_keyed(
        self, base_offset: int, offsets: I64, hashes: Callable[[], NDArray[np.uint64]]
    ) -> Bools:
        keep = np.ones(offsets.shape[0], np.bool_)
        path = bitmap_path(self.staging, self.pass_index, base_offset)
        if path.exists():
            superseded = read_bitmap(path)
            if superseded.size > keep.size:
                raise CleanerdError(
                    f"{path}: decides {superseded.size} keyed records, the segment has "
                    f"{keep.size} (it changed since the job read it)"
                )
            keep[: superseded.size] = ~superseded
        return keep


# ---------------------------------------------------------------------------------------
# The driver.


def segment_tasks(spec: JobSpec) -> list[SegmentTask]:
    """Every segment to decode: those below each pass's end."""
    tasks = []
    for i, p in enumerate(spec.passes):
        aborted = load_aborted(p.dir_path, p.segments)
        for idx, seg in enumerate(p.segments):
            if seg.base_offset >= p.first_uncleanable:
                break
            upper = segment_upper(p.segments, idx, p.first_uncleanable)
            if p.read_root is None:
                path = str(log_file(p.dir_path, seg.base_offset))
            else:
                path = f"{p.read_root.rstrip('/')}/{log_file(Path(), seg.base_offset).name}"
            tasks.append(
                SegmentTask(
                    pass_index=i,
                    path=path,
                    base=seg.base_offset,
                    upper=upper,
                    first_dirty=p.first_dirty,
                    end=p.first_uncleanable,
                    strategy=p.config.strategy,
                    aborted=tuple(aborted_between(aborted, seg.base_offset, upper)),
                )
            )
    return tasks


def _uri_path(uri: str) -> str:
    """The path part of a URI or plain path, normalised (Spark qualifies paths)."""
    return posixpath.normpath(urlparse(uri).path)


def _record_error(staging: Path, task: SegmentTask, exc: BaseException) -> None:
    errors = staging / "errors"
    errors.mkdir(parents=True, exist_ok=True)
    (errors / f"pass-{task.pass_index}-{task.base:020d}.txt").write_text(str(exc))


def arrow_batches(cols: Mapping[str, NDArray[Any]]) -> Iterator[pa.RecordBatch]:
    """Columns as Arrow record batches of at most `ROWS_PER_BATCH` rows."""
    import pyarrow as pa

    n = next(iter(cols.values())).shape[0]
    for start in range(0, n, ROWS_PER_BATCH):
        stop = min(n, start + ROWS_PER_BATCH)
        yield pa.RecordBatch.from_arrays(
            [pa.array(c[start:stop]) for c in cols.values()], names=list(cols)
        )


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


def _decode_local(
    spec: JobSpec, tasks: Sequence[SegmentTask], groups: Sequence[Sequence[int]], staging: Path
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for group_id in batch.column(0).to_pylist():
                for task in (tasks[i] for i in groups[group_id]):
                    p = spec.passes[task.pass_index]
                    active = task.base == p.segments[-1].base_offset
                    try:
                        raw = map_segment(Path(task.path), p.segment(task.base), active=active)
                        cols = segment_rows(task, raw)
                    except (CleanerdError, OSError) as exc:
                        _record_error(staging, task, exc)
                        continue
                    yield from arrow_batches(cols)

    return decode


def _decode_remote(
    tasks: Sequence[SegmentTask], staging: Path
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    by_path = {_uri_path(t.path): t for t in tasks}

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            paths = batch.column("path").to_pylist()
            for i, uri in enumerate(paths):
                task = by_path[_uri_path(uri)]
                content = batch.column("content")[i].as_buffer()
                try:
                    cols = segment_rows(task, memoryview(content) if content else b"")
                except CleanerdError as exc:
                    _record_error(staging, task, exc)
                    continue
                yield from arrow_batches(cols)

    return decode


def _reduce(
    versioned: Bools,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def reduce(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        cols = table_columns(list(batches))
        if cols is None:
            return
        yield from arrow_batches(superseded_rows(cols, versioned))

    return reduce


def table_columns(batches: Sequence[pa.RecordBatch]) -> dict[str, NDArray[Any]] | None:
    """The rows of `batches` as numpy columns; None when there are none."""
    import pyarrow as pa

    if not sum(b.num_rows for b in batches):
        return None
    table = pa.Table.from_batches(batches)
    return {
        name: np.asarray(table.column(name).to_numpy(zero_copy_only=False))
        for name in table.column_names
    }


def _write_bitmaps(
    staging: Path,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        cols = table_columns(list(batches))
        if cols is None:
            return
        p, seg, krow = (cols[n].astype(np.int64) for n in ("pass", "seg", "krow"))
        order = np.lexsort((krow, seg, p))
        p, seg, krow = p[order], seg[order], krow[order]
        bounds = np.flatnonzero((p[1:] != p[:-1]) | (seg[1:] != seg[:-1])) + 1
        out_pass, out_seg, out_bits = [], [], []
        for a, b in zip([0, *bounds.tolist()], [*bounds.tolist(), p.size], strict=True):
            bits = write_bitmap(bitmap_path(staging, int(p[a]), int(seg[a])), krow[a:b])
            out_pass.append(int(p[a]))
            out_seg.append(int(seg[a]))
            out_bits.append(bits)
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(out_pass, pa.int32()),
                pa.array(out_seg, pa.int64()),
                pa.array(out_bits, pa.int64()),
            ],
            names=["pass", "seg", "bits"],
        )

    return write


def stage_bitmaps(spark: SparkSession, spec: JobSpec) -> dict[int, str]:
    """Stages 1-3 for every pass of `spec`; returns the passes that failed, with why."""
    staging = Path(spec.staging)
    tasks = segment_tasks(spec)
    if tasks:
        with warnings.catch_warnings():
            # pyspark warns about the installed pandas, which the Arrow path does not use.
            warnings.filterwarnings("ignore", category=FutureWarning, module="pyspark")
            _bitmap_frame(spark, spec, tasks).collect()
    failed: dict[int, str] = {}
    errors = staging / "errors"
    if errors.is_dir():
        for path in sorted(errors.iterdir()):
            index = int(path.name.split("-")[1])
            failed.setdefault(index, path.read_text())
    return failed


def _bitmap_frame(spark: SparkSession, spec: JobSpec, tasks: Sequence[SegmentTask]) -> DataFrame:
    staging = Path(spec.staging)
    local = [t for t in tasks if spec.passes[t.pass_index].read_root is None]
    remote = [t for t in tasks if spec.passes[t.pass_index].read_root is not None]
    frames: list[DataFrame] = []
    parallelism = spark.sparkContext.defaultParallelism
    if local:
        sizes = [spec.passes[t.pass_index].segment(t.base).size_bytes for t in local]
        groups = pack_tasks(sizes, parallelism)
        # spark.range splits evenly: one id, so one group of segments, per task.
        ids = spark.range(0, len(groups), 1, len(groups))
        frames.append(ids.mapInArrow(_decode_local(spec, local, groups, staging), ROW_SCHEMA))
    if remote:
        files = spark.read.format("binaryFile").load([t.path for t in remote])
        frames.append(files.mapInArrow(_decode_remote(remote, staging), ROW_SCHEMA))
    rows = frames[0]
    for other in frames[1:]:
        rows = rows.unionByName(other)
    total = sum(s.size_bytes for p in spec.passes for s in p.segments)
    key_partitions = max(parallelism, math.ceil(total / KEY_PARTITION_BYTES))
    versioned = np.array([p.config.strategy.versioned for p in spec.passes], np.bool_)
    losers = rows.repartition(key_partitions, "pass", "hi", "lo").mapInArrow(
        _reduce(versioned), LOSER_SCHEMA
    )
    return losers.repartition(min(len(tasks), 2 * parallelism), "pass", "seg").mapInArrow(
        _write_bitmaps(staging), BITMAP_SCHEMA
    )


def copy_pass(spec: JobSpec, index: int) -> PassOutcome:
    """The copy phase of pass `index` over its staged bitmaps (no swap, no checkpoint);
    on failure no `.cleaned` file of the pass is left."""
    p = spec.passes[index]
    oracle = SupersededBitmaps(Path(spec.staging), index, p.first_uncleanable)
    try:
        result: CleanResult = Cleaner(None).clean(
            log_dir=Path(p.log_dir),
            tp=p.tp,
            segments=p.segments,
            first_dirty=p.first_dirty,
            first_uncleanable=p.first_uncleanable,
            now_ms=p.now_ms,
            config=p.config,
            oracle=oracle,
            install=False,
        )
    except (CleanerdError, OSError) as exc:
        remove_outputs(p)
        return PassOutcome(end_offset=p.first_uncleanable, error=str(exc))
    return PassOutcome(end_offset=result.end_offset, cleaned=result.cleaned, stats=result.stats)


def remove_outputs(p: PassSpec) -> None:
    """Remove every `.cleaned` file of the partition (`swap.remove_stale_cleaned`): only
    its pass (which the scheduler runs one at a time) writes them, and outside a pass they
    are garbage. An output that overflowed a segment is based at offsets of no source."""
    remove_stale_cleaned(p.dir_path, FileOps())


def python_path_env() -> dict[str, str]:
    """Environment for Spark's Python workers: this interpreter, and cleanerd importable
    even when it is not installed (a source checkout)."""
    root = str(Path(cleanerd.__file__).resolve().parent.parent)
    paths = [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
    }


def spark_session(master: str, conf: Mapping[str, str], app: str) -> SparkSession:
    """A session on `master` with cleanerd's defaults (no UI, Arrow on) under `conf`."""
    from pyspark.sql import SparkSession

    os.environ.update(python_path_env())
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def run_job(spec: JobSpec, *, spark: SparkSession | None = None) -> Manifest:
    """Run every pass of `spec` and write the manifest; `spark` is an existing session to
    use (tests share one), else the job starts and stops its own."""
    staging = Path(spec.staging)
    staging.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    session = (
        spark if spark is not None else spark_session(spec.master, spec.conf, "cleanerd-clean")
    )
    t1 = time.monotonic()
    try:
        failed = stage_bitmaps(session, spec)
    finally:
        if spark is None:
            session.stop()
    t2 = time.monotonic()
    outcomes = []
    for i, p in enumerate(spec.passes):
        if i in failed:
            outcomes.append(PassOutcome(end_offset=p.first_uncleanable, error=failed[i]))
        else:
            outcomes.append(copy_pass(spec, i))
    t3 = time.monotonic()
    manifest = Manifest(
        tuple(outcomes),
        startup_ms=round((t1 - t0) * 1000),
        reduce_ms=round((t2 - t1) * 1000),
        copy_ms=round((t3 - t2) * 1000),
    )
    manifest.write(staging / MANIFEST)
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m cleanerd.engine.spark_job SPEC.json`: exit 0 once the manifest is
    written (failed passes are reported in it), non-zero if the job itself failed."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m cleanerd.engine.spark_job SPEC.json", file=sys.stderr)
        return 2
    die_with_owner_from_env(whole_session=True)
    run_job(JobSpec.read(Path(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
