"""The Spark clean job: compaction passes whose winners are found by Spark's shuffle.

Run as its own process, never inside the daemon: ``python -m
cleanerd.engine.spark.clean_job SPEC.json``. The spec (`specs.JobSpec`) lists one pass
per partition, each exactly what a local pass is given (segments, [first_dirty,
first_uncleanable), now_ms, the topic's cleaner settings), plus a staging dir. The job:

1. **Decode** (Spark tasks of one or more segments, `tasks.pack_tasks`, in the executors'
   Python workers): the segment is memory-mapped after checking it is the file of the
   pass's snapshot (`segment_reader.map_segment`; or, for a pass whose `read_root` is a
   Hadoop filesystem URI, read with Spark's `binaryFile` source) and decoded by
   `cleanerd.records.columns`; its keyed data records below the pass's end become rows
   (pass, seg, krow, key hash, offset, version, cand, upd) built with `hash_keys` and
   `strategy.segment_versions`, handed to the JVM as Arrow batches. `krow` is the
   record's rank among the segment's keyed records, the order in which the copy phase
   asks. `cand` marks the records the local pass puts in its map (dirty range, not
   aborted); `upd` the clean-section records that may beat a dirty winner under the
   timestamp and header strategies (the map's `update_existing_many`).
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
   the manifest (`specs.Manifest`) lists per pass the end offset, the stats and every
   group's output (base, next offset, replaced bases, records, bytes) for the engine to
   verify and install (`engine.py`).

Why the outputs are byte-identical to the local engine's: the copy phase is the same code;
its only other input, "is this keyed record superseded", is decided by the same rule over
the same hashes, versions and candidate set, and the end offset is the first uncleanable
offset, which is where a local pass whose map holds every key ends too. Aborted data is
found per segment by a `TransactionTracker` fed the aborted transactions overlapping that
segment; that equals the local pass's one tracker walking the range because an aborted
transaction is open exactly from its first offset to its ABORT marker, which the job
checks is present in the segment its `.txnindex` entry ends in (CorruptIndexError if not).

Failure: a segment that cannot be decoded fails its pass only (the manifest says why);
a pass whose copy fails leaves no `.cleaned` file. If the job dies, the engine removes any
`.cleaned` output; the originals are never touched by the job. The job exits when its
parent dies, so an orphan never writes into a partition after the daemon restarts.

Executors reach the log dirs and the staging dir by the same local paths (local master,
or a shared mount); segments on shared storage can instead be read through `read_root`.
"""

from __future__ import annotations

import math
import posixpath
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlparse

import numpy as np
from numpy.typing import NDArray

from cleanerd.compaction.cleaner import Cleaner
from cleanerd.compaction.keyhash import hash_keys
from cleanerd.compaction.strategy import ResolvedStrategy, segment_versions
from cleanerd.compaction.swap import FileOps, remove_stale_cleaned
from cleanerd.compaction.transactions import ABORT, TransactionTracker
from cleanerd.engine.spark.specs import (
    MANIFEST,
    JobSpec,
    Manifest,
    PassOutcome,
    record_error,
    recorded_errors,
)
from cleanerd.engine.spark.tasks import CLEAN_JOB, Columns, decode_groups, job_main, pack_tasks
from cleanerd.errors import (
    CleanerdError,
    CorruptIndexError,
    CorruptRecordError,
    FileStepError,
    file_step,
)
from cleanerd.log.files import log_file
from cleanerd.log.segment_reader import (
    aborted_between,
    join_buffers,
    load_aborted,
    map_segment,
    segment_offsets,
    segment_upper,
)
from cleanerd.log.txnindex import AbortedTxn
from cleanerd.records.columns import SegmentColumns, segment_columns
from cleanerd.records.control import control_type_column
from cleanerd.records.header import CONTROL_MASK, TRANSACTIONAL_MASK, Buffer
from cleanerd.records.walker import DECODE_WINDOW_BYTES, OffsetRange, batch_windows

if TYPE_CHECKING:
    from cleanerd.engine.spark.session import DataFrame, SparkSession

BITMAP_SUFFIX: Final = ".superseded"
KEY_PARTITION_BYTES: Final = 256 * 1024 * 1024
"""Segment bytes per shuffle partition of the reduce (a partition's rows are ranked in
one numpy sort, about 60 bytes per record)."""

ROW_SCHEMA: Final = (
    "pass int, seg long, krow long, hi long, lo long, offset long, "
    "has boolean, version long, cand boolean, upd boolean"
)
LOSER_SCHEMA: Final = "pass int, seg long, krow long"
BITMAP_SCHEMA: Final = "pass int, seg long, bits long"

I64 = NDArray[np.int64]
Bools = NDArray[np.bool_]


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
    offsets: OffsetRange
    """What the segment's batches may hold (`segment_offsets`)."""


class _AbortedScan:
    """Aborted transactional data of one segment read window by window (`of` for each,
    in order, one tracker carried across them); `check` then asks that every aborted
    transaction ending in the segment had its ABORT marker there (see the module
    docstring on why one tracker per segment decides as the pass's one tracker does)."""

    def __init__(self, task: SegmentTask) -> None:
        self.task = task
        self.tracker = TransactionTracker()
        self.tracker.add_aborted(list(task.aborted))
        self.markers: set[tuple[int, int]] = set()

    def of(self, sc: SegmentColumns) -> Bools:
        """Per batch of `sc`: transactional data of an aborted transaction."""
        aborted = np.zeros(sc.num_batches, np.bool_)
        if not self.task.aborted:
            return aborted
        attrs = sc.attributes.astype(np.int64)
        lasts = sc.base_offset + sc.last_offset_delta
        flagged = np.flatnonzero(attrs & (CONTROL_MASK | TRANSACTIONAL_MASK))
        is_control = (attrs[flagged] & CONTROL_MASK) != 0
        types = control_type_column(sc)[flagged]
        discardable = self.tracker.on_batches(
            producer_id=sc.producer_id[flagged],
            is_control=is_control,
            is_transactional=np.ones(flagged.size, np.bool_),
            control_type=types,
            last_offset=lasts[flagged],
        )
        aborted[flagged] = discardable & ~is_control
        abort = flagged[is_control & (types == ABORT)]
        self.markers |= set(zip(sc.producer_id[abort].tolist(), lasts[abort].tolist(), strict=True))
        return aborted

    def check(self) -> None:
        task = self.task
        for t in task.aborted:
            if (
                task.base <= t.last_offset < task.upper
                and (t.producer_id, t.last_offset) not in self.markers
            ):
                raise CorruptIndexError(
                    f"aborted transaction of producer {t.producer_id} at [{t.first_offset}, "
                    f"{t.last_offset}] has no ABORT marker at {t.last_offset} in {task.path}",
                    path=str(Path(task.path).with_suffix(".txnindex")),
                )


def aborted_batches(sc: SegmentColumns, task: SegmentTask) -> Bools:
    """Per batch of the whole segment `sc`: transactional data of an aborted
    transaction (CorruptIndexError when an ABORT marker is missing)."""
    scan = _AbortedScan(task)
    aborted = scan.of(sc)
    scan.check()
    return aborted


def segment_rows(task: SegmentTask, raw: Buffer) -> dict[str, NDArray[Any]]:
    """The rows of stage 1 for one segment (columns of `ROW_SCHEMA`), decoded a window
    of whole batches at a time (`walker.batch_windows`: an executor's memory does not
    grow with the segment's size beyond its rows); CorruptRecordError names the segment
    and byte position."""
    scan = _AbortedScan(task)
    parts = []
    keyed = 0
    try:
        for start, end, offsets in batch_windows(raw, DECODE_WINDOW_BYTES, task.offsets):
            sc = segment_columns(raw, start=start, end=end, verify_crc=True, offsets=offsets)
            parts.append(_rows(task, sc, scan, keyed))
            keyed += int(np.count_nonzero(sc.key_len >= 0))
            del sc  # no view of a mapping may outlive the task
    except CorruptRecordError as exc:
        raise exc.located(Path(task.path)) from exc
    if task.upper > task.first_dirty:
        scan.check()
    if len(parts) == 1:
        return parts[0]
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def _rows(
    task: SegmentTask, sc: SegmentColumns, scan: _AbortedScan, keyed_before: int
) -> dict[str, NDArray[Any]]:
    bi = sc.batch_index.astype(np.int64)
    data = (sc.attributes.astype(np.int64)[bi] & CONTROL_MASK) == 0
    keyed = sc.key_len >= 0
    krow = np.cumsum(keyed, dtype=np.int64) - 1 + keyed_before
    offsets = sc.offset
    rows = np.flatnonzero(keyed & data & (offsets < task.end))
    dirty = task.upper > task.first_dirty
    versioned = task.strategy.versioned
    # Aborted data is no candidate, nor (below the dirty range) a contender of the
    # timestamp and header strategies: it is discarded whatever its version.
    mappable = ~scan.of(sc)[bi[rows]] if dirty or versioned else np.ones(rows.size, np.bool_)
    cand = np.zeros(rows.size, np.bool_)
    if dirty:
        cand = mappable & (offsets[rows] >= task.first_dirty)
    upd = np.zeros(rows.size, np.bool_)
    if versioned:
        upd = mappable & (offsets[rows] < task.first_dirty)
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
    tmp = path.with_name(path.name + ".tmp")
    with file_step("staging a segment's superseded-record bitmap", path):
        path.parent.mkdir(parents=True, exist_ok=True)
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


def _write_bitmaps(staging: Path, cols: Mapping[str, NDArray[Any]]) -> dict[str, NDArray[Any]]:
    """Stage the bitmaps of the losers `cols` (whole segments); their (pass, seg, bits)."""
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
    return {
        "pass": np.array(out_pass, np.int32),
        "seg": np.array(out_seg, np.int64),
        "bits": np.array(out_bits, np.int64),
    }


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
        self,
        base_offset: int,
        first_keyed: int,
        offsets: I64,
        hashes: Callable[[], NDArray[np.uint64]],
        *,
        final: bool,
    ) -> Bools:
        keep = np.ones(offsets.shape[0], np.bool_)
        path = bitmap_path(self.staging, self.pass_index, base_offset)
        if path.exists():
            superseded = read_bitmap(path)
            last = first_keyed + keep.size
            if final and superseded.size > last:
                raise CleanerdError(
                    f"{path}: decides {superseded.size} keyed records, the segment has "
                    f"{last} (it changed since the job read it)"
                )
            window = superseded[first_keyed:last]
            keep[: window.size] = ~window
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
                    offsets=segment_offsets(p.segments, idx),
                )
            )
    return tasks


def _uri_path(uri: str) -> str:
    """The path part of a URI or plain path, normalised (Spark qualifies paths)."""
    return posixpath.normpath(urlparse(uri).path)


def _decode_local(
    spec: JobSpec, tasks: Sequence[SegmentTask], groups: Sequence[Sequence[int]]
) -> Callable[[Columns], Iterator[Columns]]:
    def decode(i: int) -> Columns:
        task = tasks[i]
        p = spec.passes[task.pass_index]
        active = task.base == p.segments[-1].base_offset
        return segment_rows(task, map_segment(Path(task.path), p.segment(task.base), active=active))

    def failed(i: int, exc: BaseException) -> None:
        record_error(spec.staging, tasks[i].pass_index, tasks[i].base, exc)

    return decode_groups(groups, decode, failed)


def _decode_remote(
    spec: JobSpec, tasks: Sequence[SegmentTask]
) -> Callable[[str, Buffer], Iterator[Columns]]:
    by_path = {_uri_path(t.path): t for t in tasks}

    def decode(uri: str, content: Buffer) -> Iterator[Columns]:
        task = by_path[_uri_path(uri)]
        try:
            yield segment_rows(task, content)
        except CleanerdError as exc:
            record_error(spec.staging, task.pass_index, task.base, exc)

    return decode


def stage_bitmaps(spark: SparkSession, spec: JobSpec) -> dict[int, str]:
    """Stages 1-3 for every pass of `spec`; returns the passes that failed, with why."""
    tasks = segment_tasks(spec)
    if tasks:
        with warnings.catch_warnings():
            # pyspark warns about the installed pandas, which the Arrow path does not use.
            warnings.filterwarnings("ignore", category=FutureWarning, module="pyspark")
            _bitmap_frame(spark, spec, tasks).collect()
    return recorded_errors(spec.staging)


def _bitmap_frame(spark: SparkSession, spec: JobSpec, tasks: Sequence[SegmentTask]) -> DataFrame:
    from cleanerd.engine.spark import session  # Spark's pipeline: the job's heavy seam

    local = [t for t in tasks if spec.passes[t.pass_index].read_root is None]
    remote = [t for t in tasks if spec.passes[t.pass_index].read_root is not None]
    frames: list[DataFrame] = []
    parallelism = spark.sparkContext.defaultParallelism
    if local:
        sizes = [spec.passes[t.pass_index].segment(t.base).size_bytes for t in local]
        groups = pack_tasks(sizes, parallelism)
        # spark.range splits evenly: one id, so one group of segments, per task.
        ids = spark.range(0, len(groups), 1, len(groups))
        decode = session.numpy_stage(_decode_local(spec, local, groups))
        frames.append(ids.mapInArrow(decode, ROW_SCHEMA))
    if remote:
        files = spark.read.format("binaryFile").load([t.path for t in remote])
        frames.append(
            files.mapInArrow(session.file_stage(_decode_remote(spec, remote)), ROW_SCHEMA)
        )
    rows = frames[0]
    for other in frames[1:]:
        rows = rows.unionByName(other)
    total = sum(s.size_bytes for p in spec.passes for s in p.segments)
    key_partitions = max(parallelism, math.ceil(total / KEY_PARTITION_BYTES))
    versioned = np.array([p.config.strategy.versioned for p in spec.passes], np.bool_)
    losers = rows.repartition(key_partitions, "pass", "hi", "lo").mapInArrow(
        session.numpy_stage(lambda cols: [superseded_rows(cols, versioned)]), LOSER_SCHEMA
    )
    staging = spec.staging
    return losers.repartition(min(len(tasks), 2 * parallelism), "pass", "seg").mapInArrow(
        session.numpy_stage(lambda cols: [_write_bitmaps(staging, cols)]), BITMAP_SCHEMA
    )


def copy_pass(spec: JobSpec, index: int) -> PassOutcome:
    """The copy phase of pass `index` over its staged bitmaps (no swap, no checkpoint);
    on failure no `.cleaned` file of the pass is left."""
    p = spec.passes[index]
    oracle = SupersededBitmaps(spec.staging, index, p.first_uncleanable)
    try:
        result = Cleaner(None).clean(
            log_dir=p.log_dir,
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
        # Only this pass writes `.cleaned` files of the partition (the scheduler runs one
        # pass of a partition at a time), so every one there is this pass's.
        remove_stale_cleaned(p.dir_path, FileOps())
        errno = exc.errno if isinstance(exc, (OSError, FileStepError)) else None
        return PassOutcome(end_offset=p.first_uncleanable, error=str(exc), errno=errno)
    return PassOutcome(end_offset=result.end_offset, cleaned=result.cleaned, stats=result.stats)


def run_job(spec: JobSpec, *, spark: SparkSession | None = None) -> Manifest:
    """Run every pass of `spec` and write the manifest; `spark` is an existing session to
    use (tests share one), else the job starts and stops its own."""
    spec.staging.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    own = spark is None
    if spark is None:
        from cleanerd.engine.spark import session  # starting Spark: the job's heavy seam

        spark = session.spark_session(spec.master, spec.conf, "cleanerd-clean")
    t1 = time.monotonic()
    try:
        failed = stage_bitmaps(spark, spec)
    finally:
        if own:
            spark.stop()
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
    manifest.write(spec.staging / MANIFEST)
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m cleanerd.engine.spark.clean_job SPEC.json`: exit 0 once the manifest is
    written (failed passes are reported in it), non-zero if the job itself failed."""
    return job_main(CLEAN_JOB, argv, lambda path: run_job(JobSpec.read(path)))


if __name__ == "__main__":
    sys.exit(main())
