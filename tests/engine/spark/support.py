"""Shared pieces of the Spark engine's tests: one Spark session per test module (import
the `spark` fixture), the jobs run in-process on it, random logs and tree comparison.

The tests skip, saying why, when PySpark, PyArrow or Java is missing, unless `CI` is set:
there a missing Spark fails the run, so CI cannot pass without running them.
"""

from __future__ import annotations

import random
import shutil
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cleanerd.engine.spark import engine as spark_engine
from cleanerd.engine.spark.engine import JobRunner
from cleanerd.engine.spark.specs import AuditSpec, JobSpec
from cleanerd.engine.spark.tasks import AUDIT_JOB, CLEAN_JOB
from cleanerd.records.header import Compression
from cleanerd.records.record import RecordHeader
from tests.compaction.conftest import TP, LogBuilder
from tests.tools import unavailable

NOW = 1_700_000_000_000
SPARK_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "1g",
}


def spark_unavailable() -> str | None:
    """Why the Spark tests cannot run here, or None."""
    try:
        spark_engine.check_spark_available()
    except spark_engine.SparkUnavailable as exc:
        return str(exc)
    return None


def require_spark() -> None:
    """Skip (fail under CI) when Spark cannot run."""
    reason = spark_unavailable()
    if reason is not None:
        unavailable(reason)


@pytest.fixture(scope="module", name="spark")
def spark_fixture() -> Iterator[Any]:
    """One `local[2]` session for the whole test module."""
    require_spark()
    from cleanerd.engine.spark.session import spark_session

    session = spark_session("local[2]", SPARK_CONF, "cleanerd-tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def in_process_runner(session: Any) -> JobRunner:
    """A `JobRunner` that runs the job (clean or audit) on `session` in this process."""
    from cleanerd.engine.spark.audit_job import run_audit
    from cleanerd.engine.spark.clean_job import run_job

    def run(
        spec_path: Path,
        staging: Path,
        kill: threading.Event,
        *,
        module: str = CLEAN_JOB,
    ) -> None:
        if module == AUDIT_JOB:
            run_audit(AuditSpec.read(spec_path), spark=session)
        else:
            run_job(JobSpec.read(spec_path), spark=session)

    return run


def random_partition(
    dest: Path, rng: random.Random, *, batches: int = 120, keys: int = 30, roll: float = 0.08
) -> None:
    """A random partition dir at `dest`: every codec, tombstones, records without a key,
    version headers, plain and idempotent batches, committed and aborted transactions,
    random rolls."""
    root = dest.parent / f".build-{dest.name}"
    b = LogBuilder(root)
    for _ in range(batches):
        pid = rng.choice([-1, -1, 5])
        txn = pid == 5 and rng.random() < 0.5
        n = rng.randrange(1, 4)
        kvs = [
            (
                None if rng.random() < 0.03 else str(rng.randrange(keys)).encode(),
                None if rng.random() < 0.1 else bytes(rng.randrange(24)),
            )
            for _ in range(n)
        ]
        headers = [
            (RecordHeader("v", struct.pack(">q", rng.randrange(4))),) if rng.random() < 0.7 else ()
            for _ in range(n)
        ]
        b.append(
            kvs,
            pid=pid,
            txn=txn,
            codec=rng.choice(list(Compression)),
            headers=headers,
            timestamps=[NOW - 10**6 + rng.randrange(10**5) for _ in range(n)],
        )
        if txn and rng.random() < 0.5:
            (b.abort if rng.random() < 0.5 else b.commit)(5)
        if rng.random() < roll:
            b.roll()
    if 5 in b.open_txn:
        b.commit(5)
    b.roll()
    b.append([(b"active", b"x")], timestamps=[NOW])
    b.write()
    shutil.move(root / str(TP), dest)
    shutil.rmtree(root)


def write_config(path: Path, log_dir: Path, state: Path, **extra: Any) -> Path:
    """A config with one log dir and `extra` top-level settings (`topics` among them)."""
    cfg = {"log.dirs": [str(log_dir)], "state_dir": str(state), **extra}
    path.write_text(yaml.safe_dump(cfg))
    return path


def tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` but locks, by relative path, with its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }
