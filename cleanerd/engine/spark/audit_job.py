"""The Spark audit job: many log dirs' partitions at once, the local report exactly.

Run as its own process: ``python -m cleanerd.engine.spark.audit_job SPEC.json``. The
caller (`cleanerd audit --engine spark`, through `engine.audit_on_spark`) opens each
partition read-only and puts in the spec (`specs.AuditSpec`) what needs the whole
partition (the segments, the last stable offset, the aborted transactions below it, the
strategy and max lag), exactly as `audit.audit_partition` computes them
(`audit.audit_scope`); a partition that could not be opened carries its error instead.

1. **Decode** (Spark tasks of one or more segments, `tasks.pack_tasks`):
   `columns.segment_columns` (CRC checked) and `audit.segment_audit_columns`, the local
   audit's own per-segment step, give the segment's candidate rows, to the JVM as Arrow
   batches. Aborted data is found with a `TransactionTracker` per segment fed the
   aborted transactions overlapping it (the clean job's argument, `clean_job`: equal to
   the local audit's one tracker), and only for partitions that have any, as locally. A
   segment that cannot be decoded records its error; its partition reports the error of
   its first such segment, as the local audit, which stops there, does.
2. **Audit** (shuffle by partition): the rows of a partition, put back in segment and row
   order, are the local `AuditColumns`, and `audit.partition_audit` (over the pure core
   `audit.audit_columns`) gives the partition's `PartitionAudit`.
3. **Write**: the report (`specs.AuditReport`, partitions in spec order) and, if asked,
   a Parquet table with one row per partition (the `cleanerd audit --json` fields, nested
   `listed_violations`), through Spark's writer, so the Parquet path may be any Hadoop
   filesystem URI.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
from numpy.typing import NDArray
from pydantic import TypeAdapter

from cleanerd.compaction.audit import (
    AuditColumns,
    PartitionAudit,
    partition_audit,
    segment_audit_columns,
)
from cleanerd.compaction.strategy import ResolvedStrategy
from cleanerd.compaction.transactions import TransactionTracker
from cleanerd.engine.spark.specs import (
    REPORT,
    AuditPartition,
    AuditReport,
    AuditSpec,
    record_error,
    record_progress,
    recorded_errors,
)
from cleanerd.engine.spark.tasks import AUDIT_JOB, Columns, decode_groups, job_main, pack_tasks
from cleanerd.errors import CorruptRecordError
from cleanerd.log.files import log_file
from cleanerd.log.segment_reader import map_file
from cleanerd.log.txnindex import AbortedTxn
from cleanerd.records.columns import segment_columns
from cleanerd.records.header import Buffer
from cleanerd.records.walker import OffsetRange

if TYPE_CHECKING:
    from cleanerd.engine.spark.session import SparkSession

_OWN_ROWS: Final = ("marker_horizon", "keyless_count", "keyless_first")
COLUMN_NAMES: Final = tuple(
    f.name for f in dataclasses.fields(AuditColumns) if f.name not in _OWN_ROWS
)
"""The per-record columns. Marker horizons travel as rows of their own (`marker`, the
horizon in `horizon`), and so do a segment's keyless records (`keyless`: their count in
`size`, the first one's offset in `offset`)."""
ROW_SCHEMA: Final = (
    "part int, seg int, row long, marker boolean, keyless boolean, hash_hi long, "
    "hash_lo long, offset long, timestamp long, version long, has_version boolean, "
    "size long, tombstone boolean, horizon long"
)
OUT_SCHEMA: Final = "part int, doc string"
PARQUET_SCHEMA: Final = (
    "log_dir string, topic string, partition int, strategy string, now_ms long, "
    "max_compaction_lag_ms long, slack_ms long, error string, records long, keys long, "
    "superseded long, superseded_bytes long, superseded_unknown_age long, "
    "oldest_superseded_age_ms long, violations long, "
    "listed_violations array<struct<offset: long, superseded_at_ms: long, age_ms: long>>, "
    "tombstones long, tombstones_past_horizon long, oldest_tombstone_overdue_ms long, "
    "markers_past_horizon long, oldest_marker_overdue_ms long, keyless_records long, "
    "first_keyless_offset long"
)
_AUDIT_JSON: Final = TypeAdapter(PartitionAudit)
"""A partition's audit as it travels from the executor that computed it to the driver."""


# ---------------------------------------------------------------------------------------
# Executor side (pure numpy; tested without Spark).


@dataclass(frozen=True, slots=True)
class AuditTask:
    """One segment of one partition."""

    part: int
    seg: int
    path: str
    strategy: ResolvedStrategy
    stable_offset: int
    aborted: tuple[AbortedTxn, ...] | None
    """The aborted transactions overlapping the segment; None when the partition has none."""
    offsets: OffsetRange
    """What the segment's batches may hold: up to the next segment's base offset."""


def audit_rows(task: AuditTask, raw: Buffer) -> dict[str, NDArray[Any]]:
    """The candidate rows, marker horizons and keyless count of one segment (columns of
    `ROW_SCHEMA`)."""
    tracker = None
    if task.aborted is not None:
        tracker = TransactionTracker()
        tracker.add_aborted(list(task.aborted))
    try:
        sc = segment_columns(raw, offsets=task.offsets)
        cols = segment_audit_columns(
            sc, strategy=task.strategy, stable_offset=task.stable_offset, tracker=tracker
        )
    except CorruptRecordError as exc:
        raise exc.located(Path(task.path)) from exc
    n, m, k = len(cols), cols.marker_horizon.size, cols.keyless_count.size
    kinds = np.repeat(np.arange(3), [n, m, k])  # data rows, then markers, then keyless
    out: dict[str, NDArray[Any]] = {
        "part": np.full(n + m + k, task.part, np.int32),
        "seg": np.full(n + m + k, task.seg, np.int32),
        "row": np.concatenate([np.arange(n), np.arange(m), np.arange(k)]).astype(np.int64),
        "marker": kinds == 1,
        "keyless": kinds == 2,
    }
    carried = {"horizon": cols.marker_horizon}
    keyless = {"offset": cols.keyless_first, "size": cols.keyless_count}
    for name in COLUMN_NAMES:
        col = getattr(cols, name)
        pads = (
            carried.get(name, np.zeros(m, col.dtype)),
            keyless.get(name, np.zeros(k, col.dtype)),
        )
        out[name] = np.concatenate([col, *pads]).astype(
            np.int64 if col.dtype == np.uint64 else col.dtype
        )
    return out


def columns_of(rows: Mapping[str, NDArray[Any]]) -> AuditColumns:
    """The `AuditColumns` of one partition's rows, in segment and row order."""
    order = np.lexsort((rows["row"], rows["seg"]))
    marker = rows["marker"][order]
    keyless = rows["keyless"][order]
    data = order[~marker & ~keyless]
    carried = {
        "marker_horizon": ("horizon", order[marker]),
        "keyless_count": ("size", order[keyless]),
        "keyless_first": ("offset", order[keyless]),
    }

    def col(name: str, dtype: type[Any]) -> NDArray[Any]:
        # Marker and keyless rows carry their values in the columns `carried` names;
        # int64 hashes cast to uint64 keep their bits.
        source, at = carried.get(name, (name, data))
        return np.ascontiguousarray(rows[source][at]).astype(dtype)

    return AuditColumns.build(col)


def _audit_of(p: AuditPartition, read: AuditColumns | str, spec: AuditSpec) -> PartitionAudit:
    return partition_audit(
        str(p.log_dir),
        p.tp,
        p.strategy,
        p.max_compaction_lag_ms,
        read,
        now_ms=spec.now_ms,
        slack_ms=spec.slack_ms,
        max_listed=spec.max_listed,
    )


def _audit_partitions(spec: AuditSpec, rows: Columns) -> Iterator[Columns]:
    """Stage 2 over the rows of whole partitions: (part, doc) per partition, the doc its
    audit as JSON."""
    parts, docs = [], []
    for part in np.unique(rows["part"]).tolist():
        cols = columns_of({k: v[rows["part"] == part] for k, v in rows.items()})
        doc = _AUDIT_JSON.dump_json(_audit_of(spec.partitions[part], cols, spec)).decode()
        parts.append(part)
        docs.append(doc)
    yield {"part": np.array(parts, np.int32), "doc": np.array(docs, object)}


# ---------------------------------------------------------------------------------------
# The driver.


def audit_tasks(spec: AuditSpec) -> list[AuditTask]:
    """Every segment of every partition that was opened."""
    tasks = []
    for i, p in enumerate(spec.partitions):
        if p.error is not None:
            continue
        bases = p.segments
        for k, base in enumerate(bases):
            upper = bases[k + 1] if k + 1 < len(bases) else None
            aborted = None
            if p.aborted:
                aborted = tuple(
                    t
                    for t in p.aborted
                    if t.last_offset >= base and (upper is None or t.first_offset < upper)
                )
            tasks.append(
                AuditTask(
                    part=i,
                    seg=k,
                    path=str(log_file(p.dir_path, base)),
                    strategy=p.strategy,
                    stable_offset=p.stable_offset,
                    aborted=aborted,
                    offsets=OffsetRange.of_segment(base, upper),
                )
            )
    return tasks


def _decode(
    spec: AuditSpec, tasks: Sequence[AuditTask], groups: Sequence[Sequence[int]]
) -> Callable[[Columns], Iterator[Columns]]:
    def decode(i: int) -> Columns:
        raw = map_file(Path(tasks[i].path))
        rows = audit_rows(tasks[i], raw)
        record_progress(spec.staging, tasks[i].part, tasks[i].seg, len(raw))
        return rows

    def failed(i: int, exc: BaseException) -> None:
        record_error(spec.staging, tasks[i].part, tasks[i].seg, exc)
        try:
            size = Path(tasks[i].path).stat().st_size
        except OSError:
            size = 0
        record_progress(spec.staging, tasks[i].part, tasks[i].seg, size)

    return decode_groups(groups, decode, failed)


def run_audit(spec: AuditSpec, *, spark: SparkSession | None = None) -> None:
    """Run the audit of `spec`: write the `AuditReport` (and, if asked, the Parquet
    table); `spark` is an existing session to use (tests share one), else the job starts
    and stops its own."""
    spec.staging.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    own = spark is None
    if spark is None:
        from cleanerd.engine.spark import session  # starting Spark: the job's heavy seam

        spark = session.spark_session(spec.master, spec.conf, "cleanerd-audit")
    try:
        audits = tuple(_report(spec, _run(spark, spec)))
        if spec.parquet is not None:
            _write_parquet(spark, audits, spec.parquet)
        elapsed_ms = round((time.monotonic() - started) * 1000)
        AuditReport(audits, elapsed_ms).write(spec.staging / REPORT)
    finally:
        if own:
            spark.stop()


def _run(spark: SparkSession, spec: AuditSpec) -> dict[int, PartitionAudit]:
    """Stages 1 and 2; the audits of the partitions with candidate rows."""
    from cleanerd.engine.spark import session  # Spark's pipeline: the job's heavy seam

    tasks = audit_tasks(spec)
    if not tasks:
        return {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, module="pyspark")
        parallelism = spark.sparkContext.defaultParallelism
        sizes = [_size(Path(t.path)) for t in tasks]
        groups = pack_tasks(sizes, parallelism)
        ids = spark.range(0, len(groups), 1, len(groups))
        rows = ids.mapInArrow(session.numpy_stage(_decode(spec, tasks, groups)), ROW_SCHEMA)
        n = max(1, min(len(spec.partitions), 2 * parallelism))
        audit = session.numpy_stage(lambda cols: _audit_partitions(spec, cols))
        out = rows.repartition(n, "part").mapInArrow(audit, OUT_SCHEMA).collect()
    return {int(r["part"]): _AUDIT_JSON.validate_json(r["doc"]) for r in out}


def _report(spec: AuditSpec, audited: Mapping[int, PartitionAudit]) -> Iterator[PartitionAudit]:
    """Every partition's audit in spec order: its error (opening it, or decoding its first
    bad segment), else its audit, else the audit of no candidate rows."""
    errors = recorded_errors(spec.staging)
    for i, p in enumerate(spec.partitions):
        error = p.error or errors.get(i)
        if error is not None:
            yield _audit_of(p, error, spec)
        else:
            yield audited.get(i) or _audit_of(p, AuditColumns.empty(), spec)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # the task reports the error


def _write_parquet(spark: SparkSession, audits: Sequence[PartitionAudit], path: str) -> None:
    names = [f.split()[0] for f in _top_level_fields(PARQUET_SCHEMA)]
    docs = [a.to_json() for a in audits]
    rows = [
        tuple(
            [(v["offset"], v["superseded_at_ms"], v["age_ms"]) for v in d.get(n) or []]
            if n == "listed_violations"
            else d.get(n)
            for n in names
        )
        for d in docs
    ]
    frame = spark.createDataFrame(rows, PARQUET_SCHEMA)
    frame.coalesce(1).write.mode("overwrite").parquet(path)


def _top_level_fields(schema: str) -> list[str]:
    """Split a DDL schema at the commas outside `<...>`."""
    fields, depth, start = [], 0, 0
    for i, ch in enumerate(schema):
        depth += (ch == "<") - (ch == ">")
        if ch == "," and depth == 0:
            fields.append(schema[start:i].strip())
            start = i + 1
    fields.append(schema[start:].strip())
    return fields


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m cleanerd.engine.spark.audit_job SPEC.json`."""
    return job_main(AUDIT_JOB, argv, lambda path: run_audit(AuditSpec.read(path)))


if __name__ == "__main__":
    sys.exit(main())
