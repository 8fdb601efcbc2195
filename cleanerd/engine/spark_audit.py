"""The deadline audit on Spark: many log dirs' partitions at once, the local report exactly.

Run as its own process: ``python -m cleanerd.engine.spark_audit SPEC.json``. The caller
(`cleanerd audit --engine spark`) opens each partition read-only and puts in the spec
what needs the whole partition (the segments, the last stable offset, the aborted
transactions below it, the strategy and max lag), exactly as `audit.audit_partition`
computes them; a partition that could not be opened carries its error instead.

1. **Decode** (one Spark task per segment): `columns.segment_columns` (CRC checked) and
   `audit.segment_audit_columns`, the local audit's own per-segment step, give the
   segment's candidate rows, to the JVM as Arrow batches. Aborted data is found with a
   `TransactionTracker` per segment fed the aborted transactions overlapping it (the
   clean job's argument, `spark_job`: equal to the local audit's one tracker), and only
   for partitions that have any, as locally. A segment that cannot be decoded records
   its error; its partition reports the error of its first such segment, as the local
   audit, which stops there, does.
2. **Audit** (shuffle by partition): the rows of a partition, put back in segment and row
   order, are the local `AuditColumns`, and `audit.audit_columns` (the pure core) gives
   the report, one JSON document per partition.
3. **Write**: the report JSON (the `cleanerd audit --json` document, partitions in spec
   order) and a Parquet table with one row per partition (nested `listed_violations`),
   through Spark's writer, so the Parquet path may be any Hadoop filesystem URI.

Mode `columns` (the engine's `submit_audit`) stops after step 1 and stages each
partition's columns as `.npz` files instead.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
from numpy.typing import NDArray

from cleanerd.compaction.audit import (
    AuditColumns,
    AuditResult,
    PartitionAudit,
    Violation,
    audit_columns,
    segment_audit_columns,
)
from cleanerd.compaction.cleanable import NO_MAX_COMPACTION_LAG
from cleanerd.compaction.strategy import CompactionStrategy, ResolvedStrategy, resolve_strategy
from cleanerd.compaction.transactions import TransactionTracker
from cleanerd.config import TopicConfig
from cleanerd.engine.lifeline import die_with_owner_from_env
from cleanerd.engine.spark_job import pack_tasks
from cleanerd.errors import CleanerdError, CorruptRecordError
from cleanerd.log.files import TopicPartition, log_file
from cleanerd.log.partition_log import PartitionLog
from cleanerd.log.segment_reader import map_file
from cleanerd.log.txnindex import AbortedTxn
from cleanerd.records.columns import segment_columns
from cleanerd.records.header import Buffer

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from cleanerd.engine.base import AuditJob
    from cleanerd.engine.spark import JobRunner, SparkSettings

SPEC_VERSION: Final = 1
REPORT: Final = "report.json"
COLUMN_NAMES: Final = (
    "hash_hi",
    "hash_lo",
    "offset",
    "timestamp",
    "version",
    "has_version",
    "size",
    "tombstone",
    "horizon",
)
ROW_SCHEMA: Final = (
    "part int, seg int, row long, marker boolean, hash_hi long, hash_lo long, offset long, "
    "timestamp long, version long, has_version boolean, size long, tombstone boolean, "
    "horizon long"
)
OUT_SCHEMA: Final = "part int, doc string"
PARQUET_SCHEMA: Final = (
    "log_dir string, topic string, partition int, strategy string, now_ms long, "
    "max_compaction_lag_ms long, slack_ms long, error string, records long, keys long, "
    "superseded long, superseded_bytes long, superseded_unknown_age long, "
    "oldest_superseded_age_ms long, violations long, "
    "listed_violations array<struct<offset: long, superseded_at_ms: long, age_ms: long>>, "
    "tombstones long, tombstones_past_horizon long, oldest_tombstone_overdue_ms long, "
    "markers_past_horizon long, oldest_marker_overdue_ms long"
)


@dataclass(frozen=True, slots=True)
class AuditPartition:
    """One partition to audit, with what needs the whole partition already computed."""

    log_dir: str
    tp: TopicPartition
    segments: tuple[int, ...]
    """Base offsets of the segments to read, ascending."""
    strategy: ResolvedStrategy
    stable_offset: int
    aborted: tuple[AbortedTxn, ...]
    max_compaction_lag_ms: int
    error: str | None = None
    """Why the partition could not be opened (nothing is read then)."""

    @property
    def dir_path(self) -> Path:
        """The partition dir."""
        return Path(self.log_dir) / str(self.tp)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "log_dir": self.log_dir,
            "topic": self.tp.topic,
            "partition": self.tp.partition,
            "segments": list(self.segments),
            "strategy": self.strategy.strategy.value,
            "strategy_header": None if self.strategy.header is None else self.strategy.header.hex(),
            "stable_offset": self.stable_offset,
            "aborted": [asdict(t) for t in self.aborted],
            "max_compaction_lag_ms": self.max_compaction_lag_ms,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> AuditPartition:
        """The partition `d` describes."""
        header = d["strategy_header"]
        return cls(
            log_dir=d["log_dir"],
            tp=TopicPartition(d["topic"], d["partition"]),
            segments=tuple(d["segments"]),
            strategy=ResolvedStrategy(
                CompactionStrategy(d["strategy"]),
                None if header is None else bytes.fromhex(header),
            ),
            stable_offset=d["stable_offset"],
            aborted=tuple(AbortedTxn(**t) for t in d["aborted"]),
            max_compaction_lag_ms=d["max_compaction_lag_ms"],
            error=d["error"],
        )


@dataclass(frozen=True, slots=True)
class AuditSpec:
    """One audit job: the partitions, when and how strictly, and where the output goes."""

    partitions: tuple[AuditPartition, ...]
    now_ms: int
    slack_ms: int
    max_listed: int
    staging: str
    mode: str = "report"
    """`report` (JSON and Parquet) or `columns` (staged `AuditColumns`)."""
    parquet: str | None = None
    master: str = "local[*]"
    conf: Mapping[str, str] = field(default_factory=dict)

    def write(self, path: Path) -> None:
        """Write the spec as JSON."""
        doc = {
            "version": SPEC_VERSION,
            "partitions": [p.to_json() for p in self.partitions],
            "now_ms": self.now_ms,
            "slack_ms": self.slack_ms,
            "max_listed": self.max_listed,
            "staging": self.staging,
            "mode": self.mode,
            "parquet": self.parquet,
            "master": self.master,
            "conf": dict(self.conf),
        }
        path.write_text(json.dumps(doc))

    @classmethod
    def read(cls, path: Path) -> AuditSpec:
        """The spec written by `write`."""
        doc = json.loads(path.read_text())
        if doc.get("version") != SPEC_VERSION:
            raise ValueError(f"{path}: spec version {doc.get('version')!r}, not {SPEC_VERSION}")
        return cls(
            partitions=tuple(AuditPartition.from_json(p) for p in doc["partitions"]),
            now_ms=doc["now_ms"],
            slack_ms=doc["slack_ms"],
            max_listed=doc["max_listed"],
            staging=doc["staging"],
            mode=doc["mode"],
            parquet=doc["parquet"],
            master=doc["master"],
            conf=doc["conf"],
        )


def partition_audit_from_json(d: Mapping[str, Any]) -> PartitionAudit:
    """The `PartitionAudit` whose `to_json` is `d`."""
    result = None
    if d.get("records") is not None:
        names = {f for f in AuditResult.__dataclass_fields__ if f != "listed_violations"}
        result = AuditResult(
            **{k: d[k] for k in names},
            listed_violations=tuple(Violation(**v) for v in d["listed_violations"]),
        )
    return PartitionAudit(
        log_dir=d["log_dir"],
        topic=d["topic"],
        partition=d["partition"],
        strategy=d["strategy"],
        now_ms=d["now_ms"],
        max_compaction_lag_ms=d["max_compaction_lag_ms"],
        slack_ms=d["slack_ms"],
        result=result,
        error=d["error"],
    )


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


def audit_rows(task: AuditTask, raw: Buffer) -> dict[str, NDArray[Any]]:
    """The candidate rows and marker horizons of one segment (columns of `ROW_SCHEMA`)."""
    tracker = None
    if task.aborted is not None:
        tracker = TransactionTracker()
        tracker.add_aborted(list(task.aborted))
    try:
        sc = segment_columns(raw)
        cols = segment_audit_columns(
            sc, strategy=task.strategy, stable_offset=task.stable_offset, tracker=tracker
        )
    except CorruptRecordError as exc:
        raise exc.located(Path(task.path)) from exc
    n, m = len(cols), cols.marker_horizon.size
    out: dict[str, NDArray[Any]] = {
        "part": np.full(n + m, task.part, np.int32),
        "seg": np.full(n + m, task.seg, np.int32),
        "row": np.concatenate([np.arange(n), np.arange(m)]).astype(np.int64),
        "marker": np.concatenate([np.zeros(n, np.bool_), np.ones(m, np.bool_)]),
    }
    for name in COLUMN_NAMES:
        col = getattr(cols, name)
        pad = cols.marker_horizon if name == "horizon" else np.zeros(m, col.dtype)
        out[name] = np.concatenate([col, pad]).astype(
            np.int64 if col.dtype == np.uint64 else col.dtype
        )
    return out


def columns_of(rows: Mapping[str, NDArray[Any]]) -> AuditColumns:
    """The `AuditColumns` of one partition's rows, in segment and row order."""
    order = np.lexsort((rows["row"], rows["seg"]))
    marker = rows["marker"][order]
    data = order[~marker]

    def col(name: str, dtype: Any) -> NDArray[Any]:
        return np.ascontiguousarray(rows[name][data]).astype(dtype)

    return AuditColumns(
        hash_hi=col("hash_hi", np.int64).view(np.uint64),
        hash_lo=col("hash_lo", np.int64).view(np.uint64),
        offset=col("offset", np.int64),
        timestamp=col("timestamp", np.int64),
        version=col("version", np.int64),
        has_version=col("has_version", np.bool_),
        size=col("size", np.int64),
        tombstone=col("tombstone", np.bool_),
        horizon=col("horizon", np.int64),
        marker_horizon=np.ascontiguousarray(rows["horizon"][order[marker]]).astype(np.int64),
    )


def audit_document(
    p: AuditPartition, cols: AuditColumns | None, error: str | None, spec: AuditSpec
) -> dict[str, Any]:
    """One partition's report, `audit_partition`'s `PartitionAudit.to_json` exactly."""
    lag = p.max_compaction_lag_ms
    audit = PartitionAudit(
        log_dir=p.log_dir,
        topic=p.tp.topic,
        partition=p.tp.partition,
        strategy=p.strategy.strategy.value,
        now_ms=spec.now_ms,
        max_compaction_lag_ms=None if lag >= NO_MAX_COMPACTION_LAG else lag,
        slack_ms=spec.slack_ms,
        result=None,
        error=error,
    )
    if error is None and cols is not None:
        result = audit_columns(
            cols,
            versioned=p.strategy.versioned,
            now_ms=spec.now_ms,
            max_compaction_lag_ms=lag,
            slack_ms=spec.slack_ms,
            max_listed=spec.max_listed,
        )
        audit = dataclasses.replace(audit, result=result)
    return audit.to_json()


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
                )
            )
    return tasks


def _errors_dir(spec: AuditSpec) -> Path:
    return Path(spec.staging) / "errors"


def _decode(
    tasks: Sequence[AuditTask], groups: Sequence[Sequence[int]], staging: Path
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    from cleanerd.engine.spark_job import arrow_batches

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for group_id in batch.column(0).to_pylist():
                for task in (tasks[i] for i in groups[group_id]):
                    try:
                        rows = audit_rows(task, map_file(Path(task.path)))
                    except (CleanerdError, OSError) as exc:
                        errors = staging / "errors"
                        errors.mkdir(parents=True, exist_ok=True)
                        name = f"{task.part:08d}-{task.seg:08d}.txt"
                        (errors / name).write_text(str(exc))
                        continue
                    yield from arrow_batches(rows)

    return decode


def _audit(
    spec: AuditSpec,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    from cleanerd.engine.spark_job import table_columns

    def audit(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        rows = table_columns(list(batches))
        if rows is None:
            return
        parts, docs = [], []
        for part in np.unique(rows["part"]).tolist():
            mine = {k: v[rows["part"] == part] for k, v in rows.items()}
            cols = columns_of(mine)
            p = spec.partitions[part]
            if spec.mode == "columns":
                _stage_columns(Path(spec.staging), part, cols)
                doc: dict[str, Any] = {}
            else:
                doc = audit_document(p, cols, None, spec)
            parts.append(part)
            docs.append(json.dumps(doc))
        yield pa.RecordBatch.from_arrays(
            [pa.array(parts, pa.int32()), pa.array(docs, pa.string())], names=["part", "doc"]
        )

    return audit


def columns_path(staging: Path, part: int) -> Path:
    """Where mode `columns` stages partition `part`'s columns."""
    return staging / "columns" / f"{part:08d}.npz"


def _stage_columns(staging: Path, part: int, cols: AuditColumns) -> None:
    path = columns_path(staging, part)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {name: getattr(cols, name) for name in (*COLUMN_NAMES, "marker_horizon")}
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def load_columns(staging: Path, part: int) -> AuditColumns:
    """The columns mode `columns` staged for `part` (no rows when none were staged)."""
    path = columns_path(staging, part)
    if not path.exists():
        return AuditColumns.empty()
    with np.load(path) as z:
        return AuditColumns(**{name: z[name] for name in z.files})


def run_audit(spec: AuditSpec, *, spark: SparkSession | None = None) -> list[dict[str, Any]]:
    """Run the audit of `spec`; returns the partitions' documents in spec order (mode
    `report`: also written to `<staging>/report.json` and, if asked, to Parquet)."""
    from cleanerd.engine.spark_job import spark_session

    staging = Path(spec.staging)
    staging.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    session = (
        spark if spark is not None else spark_session(spec.master, spec.conf, "cleanerd-audit")
    )
    try:
        docs = _run(session, spec)
        if spec.mode == "report" and spec.parquet is not None:
            _write_parquet(session, docs, spec.parquet)
    finally:
        if spark is None:
            session.stop()
    if spec.mode == "report":
        report = {"docs": docs, "elapsed_ms": round((time.monotonic() - started) * 1000)}
        (staging / REPORT).write_text(json.dumps(report))
    return docs


def _run(spark: SparkSession, spec: AuditSpec) -> list[dict[str, Any]]:
    staging = Path(spec.staging)
    tasks = audit_tasks(spec)
    found: dict[int, dict[str, Any]] = {}
    if tasks:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, module="pyspark")
            parallelism = spark.sparkContext.defaultParallelism
            sizes = [_size(Path(t.path)) for t in tasks]
            groups = pack_tasks(sizes, parallelism)
            ids = spark.range(0, len(groups), 1, len(groups))
            rows = ids.mapInArrow(_decode(tasks, groups, staging), ROW_SCHEMA)
            n = max(1, min(len(spec.partitions), 2 * parallelism))
            out = rows.repartition(n, "part").mapInArrow(_audit(spec), OUT_SCHEMA).collect()
        found = {int(r["part"]): json.loads(r["doc"]) for r in out}
    errors: dict[int, str] = {}
    if _errors_dir(spec).is_dir():
        for path in sorted(_errors_dir(spec).iterdir()):
            errors.setdefault(int(path.name.split("-")[0]), path.read_text())
    docs = []
    for i, p in enumerate(spec.partitions):
        error = p.error or errors.get(i)
        if spec.mode == "columns":
            docs.append({"error": error})
        elif error is not None:
            docs.append(audit_document(p, None, error, spec))
        else:
            docs.append(found.get(i) or audit_document(p, AuditColumns.empty(), None, spec))
    return docs


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # the task reports the error


def _write_parquet(spark: SparkSession, docs: Sequence[Mapping[str, Any]], path: str) -> None:
    names = [f.split()[0] for f in _top_level_fields(PARQUET_SCHEMA)]
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


def audit_columns_on_spark(
    jobs: Sequence[AuditJob], settings: SparkSettings, *, runner: JobRunner | None = None
) -> list[AuditColumns]:
    """Mode `columns` for the engine's `submit_audit`: the jobs' columns, decoded by a
    Spark job process (or `runner`); a segment that cannot be read raises CleanerdError
    with its reason."""
    from cleanerd.engine.spark import launch_job

    partitions = tuple(
        AuditPartition(
            log_dir=str(j.log_dir),
            tp=j.tp,
            segments=tuple(s.base_offset for s in j.segments),
            strategy=j.strategy,
            stable_offset=j.stable_offset,
            aborted=tuple(j.aborted),
            max_compaction_lag_ms=NO_MAX_COMPACTION_LAG,
        )
        for j in jobs
    )
    staging = Path(tempfile.mkdtemp(prefix="cleanerd-audit-"))
    try:
        spec = AuditSpec(
            partitions=partitions,
            now_ms=0,
            slack_ms=0,
            max_listed=0,
            staging=str(staging),
            mode="columns",
            master=settings.master,
            conf=dict(settings.conf),
        )
        spec.write(staging / "spec.json")
        if runner is None:
            launch_job(staging / "spec.json", staging, threading.Event(), module=__name__)
        else:
            runner(staging / "spec.json", staging, threading.Event(), module=__name__)
        errors = _errors_dir(spec)
        out = []
        for i in range(len(jobs)):
            failed = sorted(errors.glob(f"{i:08d}-*.txt")) if errors.is_dir() else []
            if failed:
                raise CleanerdError(failed[0].read_text())
            out.append(load_columns(staging, i))
        return out
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def audit_partition_spec(plog: PartitionLog, topic: TopicConfig) -> AuditPartition:
    """What the job needs of one partition, computed as `audit.audit_partition` does (a
    partition whose metadata cannot be read carries the error)."""
    tp = plog.topic_partition
    strategy = resolve_strategy(topic.compaction_strategy, topic.compaction_strategy_header)
    entry = AuditPartition(
        log_dir=str(plog.log_dir),
        tp=tp,
        segments=(),
        strategy=strategy,
        stable_offset=0,
        aborted=(),
        max_compaction_lag_ms=topic.max_compaction_lag_ms,
    )
    try:
        meta = plog.meta()
        stable = meta.last_stable_offset
        aborted = plog.collect_aborted_transactions(meta.log_start_offset, stable)
    except CleanerdError as exc:
        return dataclasses.replace(entry, error=str(exc))
    return dataclasses.replace(
        entry,
        segments=tuple(s.base_offset for s in meta.segments),
        stable_offset=stable,
        aborted=tuple(aborted),
    )


def audit_on_spark(
    partitions: Sequence[AuditPartition],
    *,
    now_ms: int,
    slack_ms: int,
    max_listed: int,
    parquet: str | None,
    settings: SparkSettings,
    staging: Path,
    runner: JobRunner | None = None,
) -> list[PartitionAudit]:
    """Audit `partitions` in a Spark job process (or with `runner`); the reports in
    order, as `audit.audit_partition` gives them."""
    from cleanerd.engine.spark import launch_job

    staging.mkdir(parents=True, exist_ok=True)
    spec = AuditSpec(
        partitions=tuple(partitions),
        now_ms=now_ms,
        slack_ms=slack_ms,
        max_listed=max_listed,
        staging=str(staging),
        parquet=parquet,
        master=settings.master,
        conf=dict(settings.conf),
    )
    spec_path = staging / "spec.json"
    spec.write(spec_path)
    if runner is None:
        launch_job(spec_path, staging, threading.Event(), module=__name__)
    else:
        runner(spec_path, staging, threading.Event(), module=__name__)
    report = json.loads((staging / REPORT).read_text())
    return [partition_audit_from_json(d) for d in report["docs"]]


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m cleanerd.engine.spark_audit SPEC.json`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m cleanerd.engine.spark_audit SPEC.json", file=sys.stderr)
        return 2
    die_with_owner_from_env(whole_session=True)
    run_audit(AuditSpec.read(Path(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
