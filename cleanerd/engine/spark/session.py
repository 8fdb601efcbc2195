"""The one module that imports PySpark and PyArrow, the optional `spark` extra.

The jobs (`clean_job`, `audit_job`) import it only in the functions that start Spark or
build its pipeline, so nothing else ever loads Spark: not the daemon, the local engine
or the Spark engine's own process (`engine.py`), and not the executor stages, which are
plain numpy functions. A host without the extra runs everything but the jobs.

What the jobs need of Spark is here: a session with cleanerd's defaults, and the
adapters that let their executor stages work on numpy columns (`numpy_stage`,
`file_stage`) while Spark hands them Arrow record batches (`DataFrame.mapInArrow`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, TypeAlias

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray
from pyspark.sql import DataFrame as DataFrame  # re-exported: the jobs' annotations
from pyspark.sql import SparkSession as SparkSession

from cleanerd.engine.spark.tasks import Columns, python_path_env
from cleanerd.records.header import Buffer

ROWS_PER_BATCH: Final = 1 << 20

ArrowFunction: TypeAlias = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
"""What `DataFrame.mapInArrow` runs over each partition of a frame."""


def spark_session(master: str, conf: Mapping[str, str], app: str) -> SparkSession:
    """A session on `master` with cleanerd's defaults (no UI, Arrow on) under `conf`.

    On a cluster, executors start their Python workers with the interpreter this
    process names (`PYSPARK_PYTHON`, `tasks.python_path_env`) but not with this
    process's environment: the driver's `PYTHONPATH` does not reach them.
    `spark.executorEnv.PYTHONPATH` carries it, so executors that see this cleanerd at
    the same path (the same host, a shared mount) import this very code, not whatever
    version their interpreter has installed; paths they lack are ignored by Python."""
    env = python_path_env()
    os.environ.update(env)
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executorEnv.PYTHONPATH", env["PYTHONPATH"])
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def _arrow_batches(cols: Columns) -> Iterator[pa.RecordBatch]:
    """Columns as Arrow record batches of at most `ROWS_PER_BATCH` rows."""
    n = next(iter(cols.values())).shape[0]
    for start in range(0, n, ROWS_PER_BATCH):
        stop = min(n, start + ROWS_PER_BATCH)
        yield pa.RecordBatch.from_arrays(
            [pa.array(c[start:stop]) for c in cols.values()], names=list(cols)
        )


def _table_columns(batches: Sequence[pa.RecordBatch]) -> dict[str, NDArray[Any]] | None:
    """The rows of `batches` as numpy columns; None when there are none."""
    if not sum(b.num_rows for b in batches):
        return None
    table = pa.Table.from_batches(batches)
    return {
        name: np.asarray(table.column(name).to_numpy(zero_copy_only=False))
        for name in table.column_names
    }


def numpy_stage(stage: Callable[[dict[str, NDArray[Any]]], Iterable[Columns]]) -> ArrowFunction:
    """`stage` over all rows of one partition at once, as numpy columns (not called for
    a partition without rows), for `mapInArrow`."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        cols = _table_columns(list(batches))
        if cols is None:
            return
        for out in stage(cols):
            yield from _arrow_batches(out)

    return run


def file_stage(stage: Callable[[str, Buffer], Iterable[Columns]]) -> ArrowFunction:
    """`stage(path, content)` for each file Spark's `binaryFile` source read (its content
    not copied), for `mapInArrow`."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            paths = batch.column("path").to_pylist()
            for i, path in enumerate(paths):
                content = batch.column("content")[i].as_buffer()
                for out in stage(path, memoryview(content) if content else b""):
                    yield from _arrow_batches(out)

    return run
