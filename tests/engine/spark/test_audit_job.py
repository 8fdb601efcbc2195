"""`cleanerd audit --engine spark`: the local audit's report, record for record, plus
Parquet."""

from __future__ import annotations

import json
import random
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from cleanerd.cli import main
from cleanerd.compaction.audit import read_audit_columns
from cleanerd.compaction.strategy import resolve_strategy
from cleanerd.engine.spark import engine as spark_engine
from cleanerd.engine.spark.audit_job import audit_rows, audit_tasks, columns_of
from cleanerd.engine.spark.engine import SparkSettings, audit_on_spark
from cleanerd.engine.spark.specs import (
    REPORT,
    AuditPartition,
    AuditReport,
    AuditSpec,
    record_progress,
)
from cleanerd.errors import CorruptRecordError
from cleanerd.log.files import TopicPartition, log_file
from cleanerd.log.segment import LogSegment
from cleanerd.log.segment_reader import map_file
from tests.builders import build_log, kv, set_base_offset
from tests.compaction.conftest import segment_metas
from tests.engine.spark.support import (
    NOW,
    in_process_runner,
    random_partition,
    spark_fixture,
    write_config,
)

spark = spark_fixture
TOPICS: dict[str, dict[str, Any]] = {
    "offs": {"cleanup.policy": "compact", "max.compaction.lag.ms": 1000},
    "ts": {"cleanup.policy": "compact", "compaction.strategy": "timestamp"},
    "hdr": {
        "cleanup.policy": "compact",
        "compaction.strategy": "header",
        "compaction.strategy.header": "v",
        "max.compaction.lag.ms": 600_000,
    },
}


def fleet(tmp_path: Path) -> Path:
    """Two log dirs of random partitions, one of them with a corrupt segment."""
    rng = random.Random(11)
    dirs = [tmp_path / "d1", tmp_path / "d2"]
    for d in dirs:
        d.mkdir()
        for topic in TOPICS:
            random_partition(d / f"{topic}-{rng.randrange(3)}", rng, roll=0.2)
    corrupt = log_file(next(dirs[1].glob("offs-*")), 0)
    data = bytearray(corrupt.read_bytes())
    data[80] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    cfg = write_config(tmp_path / "c.yaml", dirs[0], tmp_path / "state", topics=TOPICS)
    doc = cfg.read_text().replace(f"- {dirs[0]}", f"- {dirs[0]}\n- {dirs[1]}")
    cfg.write_text(doc)
    return cfg


@pytest.mark.spark
def test_spark_audit_equals_local_and_writes_parquet(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Spark audit's JSON report equals the local one, partition for partition (a
    corrupt partition included), and the Parquet table holds the same numbers."""
    monkeypatch.setattr(spark_engine, "launch_job", in_process_runner(spark))
    cfg = fleet(tmp_path)
    base = ["audit", "-c", str(cfg), "--now-ms", str(NOW), "--json"]
    local_status = main(base)
    local = json.loads(capsys.readouterr().out)
    parquet = tmp_path / "report.parquet"
    spark_status = main([*base, "--engine", "spark", "--parquet", str(parquet)])
    on_spark = json.loads(capsys.readouterr().out)
    assert spark_status == local_status == 1  # the corrupt partition cannot be proved
    assert len(local["partitions"]) == 6
    assert on_spark == local
    assert any(p["error"] for p in local["partitions"])
    assert any(p["violations"] for p in local["partitions"] if p.get("violations"))
    table = pq.read_table(parquet).to_pylist()
    assert [(r["log_dir"], r["topic"], r["partition"]) for r in table] == [
        (p["log_dir"], p["topic"], p["partition"]) for p in local["partitions"]
    ]
    for row, p in zip(table, local["partitions"], strict=True):
        assert row["superseded"] == p["superseded"]  # null for one not audited
        assert row["error"] == p["error"]
        assert [v["offset"] for v in row["listed_violations"] or []] == [
            v["offset"] for v in p["listed_violations"] or []
        ]


def test_parquet_needs_the_spark_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--parquet` without `--engine spark` is refused with exit status 2."""
    cfg = write_config(tmp_path / "c.yaml", tmp_path / "logs", tmp_path / "state")
    (tmp_path / "logs").mkdir()
    assert main(["audit", "-c", str(cfg), "--parquet", str(tmp_path / "p")]) == 2
    assert "--parquet needs --engine spark" in capsys.readouterr().err


def test_segment_rows_rebuild_the_local_columns(tmp_path: Path) -> None:
    """A partition's per-segment rows, put back together, are the local audit's columns."""
    d = tmp_path / "logs" / "t-0"
    random_partition(d, random.Random(5), roll=0.3)
    strategy = resolve_strategy("header", "v")
    metas = segment_metas(d)
    part = AuditPartition(
        log_dir=d.parent,
        tp=TopicPartition("t", 0),
        segments=tuple(m.base_offset for m in metas),
        strategy=strategy,
        stable_offset=metas[-1].next_offset,
        aborted=(),
        max_compaction_lag_ms=1,
    )
    spec = AuditSpec((part,), now_ms=NOW, slack_ms=0, max_listed=5, staging=tmp_path)
    parts = [audit_rows(t, map_file(Path(t.path))) for t in audit_tasks(spec)]
    rows = {k: np.concatenate([p[k] for p in parts[::-1]]) for k in parts[0]}
    expected = read_audit_columns(
        [LogSegment(d, m.base_offset, read_only=True) for m in metas],
        strategy=strategy,
        stable_offset=part.stable_offset,
    )
    got = columns_of(rows)
    for name in expected.__dataclass_fields__:
        assert np.array_equal(getattr(got, name), getattr(expected, name)), name
    assert expected.keyless_count.sum() > 0


def test_audit_on_spark_reports_progress_while_the_job_runs(tmp_path: Path) -> None:
    """`audit_on_spark` hands its caller the segments and bytes the executors marked
    done while the job still runs (the job here waits until the caller has seen its
    first marks), then the rest once it has ended; each segment counted once."""
    seen: list[tuple[int, int]] = []
    first_seen = threading.Event()

    def on_progress(segments: int, size: int) -> None:
        seen.append((segments, size))
        if segments:
            first_seen.set()

    def job(spec_path: Path, staging: Path, kill: threading.Event, *, module: str = "") -> None:
        record_progress(staging, 0, 0, 100)
        record_progress(staging, 0, 1, 50)
        assert first_seen.wait(60), "no progress while the job ran"
        record_progress(staging, 0, 1, 50)  # a retried task marks its segment again
        record_progress(staging, 1, 0, 7)
        AuditReport((), 0).write(staging / REPORT)

    audits = audit_on_spark(
        [],
        now_ms=NOW,
        slack_ms=0,
        max_listed=1,
        parquet=None,
        settings=SparkSettings(),
        staging=tmp_path / "staging",
        runner=job,
        on_progress=on_progress,
    )
    assert audits == []
    assert sum(s for s, _ in seen) == 3
    assert sum(b for _, b in seen) == 157
    assert seen.index(next(x for x in seen if x[0])) < len(seen) - 1  # before the end


@pytest.mark.spark
def test_spark_audit_command_shows_progress(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cleanerd audit --engine spark` writes the progress line the local audit writes,
    counting every segment the executors decoded (the corrupt one included)."""
    monkeypatch.setattr(spark_engine, "launch_job", in_process_runner(spark))
    cfg = fleet(tmp_path)
    main(["audit", "-c", str(cfg), "--now-ms", str(NOW), "--json"])
    local = capsys.readouterr().err.strip().splitlines()[-1]
    main(["audit", "-c", str(cfg), "--now-ms", str(NOW), "--json", "--engine", "spark"])
    on_spark = capsys.readouterr().err.strip().splitlines()[-1]
    done = re.compile(r"^audit +100\.0% (\d+)/\1 segments (\S+ \S+)/\2 .* done in ")
    local_done, spark_done = done.match(local), done.match(on_spark)
    assert local_done is not None, local
    assert spark_done is not None, on_spark
    assert spark_done.groups() == local_done.groups()
    assert int(local_done[1]) > 6


def test_a_spark_audit_with_nothing_to_scan_starts_no_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`audit --engine spark` of log dirs without a compacted partition reports what the
    local audit reports (the retention deadline of a `delete` partition, which takes
    segment metadata only, audited on the driver), and starts no Spark application (it
    spent 10 s starting a JVM to scan nothing)."""

    def no_job(*args: object, **kwargs: object) -> None:
        raise AssertionError("a Spark job was started")

    monkeypatch.setattr(spark_engine, "launch_job", no_job)
    old = [[kv("k", "v", timestamp=NOW - 7_200_000)]]
    build_log(tmp_path / "logs", [old, old], state_dir=tmp_path / "s", tp=TopicPartition("e", 0))
    cfg = tmp_path / "cleanerd.yaml"
    cfg.write_text(
        f"log.dirs: [{tmp_path / 'logs'}]\nstate_dir: {tmp_path / 'state'}\n"
        "topics: {e: {cleanup.policy: delete, retention.ms: 60000}}\n"
    )
    capsys.readouterr()
    for engine in ("local", "spark"):
        status = main(["audit", "-c", str(cfg), "--now-ms", str(NOW), "--engine", engine])
        assert status == 1
    out = capsys.readouterr().out
    local, on_spark = out[: len(out) // 2], out[len(out) // 2 :]
    assert local == on_spark
    assert local.endswith("1 partition audited, 0 deadline violations, 2 retention violations\n")


def test_a_segment_task_refuses_a_base_offset_out_of_its_segment(tmp_path: Path) -> None:
    """An executor decodes a segment against the offsets it may hold, as the local audit
    does: a first batch below the segment's base offset names the file and position."""
    d = tmp_path / "logs" / "t-0"
    random_partition(d, random.Random(5), roll=0.3)
    metas = segment_metas(d)
    assert len(metas) > 2
    second = log_file(d, metas[1].base_offset)
    set_base_offset(second, 0, metas[1].base_offset - 1)
    part = AuditPartition(
        log_dir=d.parent,
        tp=TopicPartition("t", 0),
        segments=tuple(m.base_offset for m in metas),
        strategy=resolve_strategy("offset", None),
        stable_offset=metas[-1].next_offset,
        aborted=(),
        max_compaction_lag_ms=1,
    )
    tasks = audit_tasks(AuditSpec((part,), now_ms=NOW, slack_ms=0, max_listed=5, staging=tmp_path))
    with pytest.raises(CorruptRecordError) as caught:
        audit_rows(tasks[1], map_file(second))
    assert caught.value.path == str(second)
    assert caught.value.position == 0
    assert "is below the segment's base offset" in str(caught.value)
