"""The Spark engine end to end: byte-identical to the local engine, no key cap per pass,
and a killed job leaves the originals as they were."""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from cleanerd.cli import main
from cleanerd.compaction.cleaner import Cleaner, CleanerConfig, CleaningAborted
from cleanerd.compaction.offset_map import OffsetMap
from cleanerd.compaction.swap import SwapProof
from cleanerd.engine.base import CleanJob
from cleanerd.engine.spark import engine as spark_engine
from cleanerd.engine.spark.clean_job import run_job
from cleanerd.engine.spark.engine import SparkEngine, SparkJobFailed, SparkSettings
from cleanerd.engine.spark.specs import MANIFEST, JobSpec, Manifest, PassOutcome, PassSpec
from cleanerd.errors import CleanerdError, FileStepError
from cleanerd.log.files import log_file
from cleanerd.log.ownership import ProcessId, StaleWork, start_ticks
from cleanerd.log.partition_log import PartitionLog
from cleanerd.records.walker import scan_batches
from tests.compaction.conftest import TP, LogBuilder, k, read_batches, segment_metas
from tests.engine.owned import own
from tests.engine.spark.support import (
    NOW,
    in_process_runner,
    random_partition,
    spark_fixture,
    tree,
    write_config,
)
from tests.tools import wait_for_session_end

pytestmark = pytest.mark.spark
spark = spark_fixture
WAIT_S = 120.0
"""A generous bound on waiting for the job process to reach a point (not a timing check)."""

TOPICS: dict[str, dict[str, Any]] = {
    "offs": {"cleanup.policy": "compact", "segment.bytes": 700},
    "ts": {
        "cleanup.policy": "compact",
        "segment.bytes": 2500,
        "compaction.strategy": "timestamp",
    },
    "hdr": {
        "cleanup.policy": "compact",
        "compaction.strategy": "header",
        "compaction.strategy.header": "v",
    },
    "horizon": {"cleanup.policy": "compact", "segment.bytes": 1500, "delete.retention.ms": 0},
}


@pytest.fixture(name="in_process")
def _in_process(spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark jobs of this test run in-process on the module's session."""
    monkeypatch.setattr(spark_engine, "launch_job", in_process_runner(spark))


def clean(tmp_path: Path, name: str, engine: str) -> None:
    cfg = write_config(
        tmp_path / f"{name}.yaml", tmp_path / name, tmp_path / f"st-{name}", topics=TOPICS
    )
    argv = ["clean", "-c", str(cfg), "--now-ms", str(NOW), "--engine", engine, "--json"]
    assert main(argv) == 0


def two_copies(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    (tmp_path / "a").mkdir()
    for topic in TOPICS:
        random_partition(tmp_path / "a" / f"{topic}-0", rng, roll=rng.choice([0.03, 0.1, 0.3]))
    shutil.copytree(tmp_path / "a", tmp_path / "b")


@pytest.mark.usefixtures("in_process")
@pytest.mark.parametrize("seed", [1, 2], ids=["seed1", "seed2"])
def test_spark_and_local_write_identical_files(
    tmp_path: Path, seed: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """`clean --engine spark` and `--engine local` leave byte-identical segments, indexes
    and checkpoints on random logs (every strategy and codec, tombstones, transactions)."""
    two_copies(tmp_path, seed)
    clean(tmp_path, "a", "local")
    local_report = json.loads(capsys.readouterr().out)
    clean(tmp_path, "b", "spark")
    spark_report = json.loads(capsys.readouterr().out)
    assert local_report["cleaned"], "the logs had something to clean"
    assert len(spark_report["cleaned"]) == len(local_report["cleaned"])
    a, b = tree(tmp_path / "a"), tree(tmp_path / "b")
    assert sorted(a) == sorted(b)
    assert [name for name in a if a[name] != b[name]] == []
    assert any(name.endswith("cleaner-offset-checkpoint") for name in a)


def records(dir_path: Path) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for b in read_batches(dir_path) for r in b.records]


@pytest.mark.usefixtures("in_process")
def test_spark_cleans_past_the_key_map_in_one_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With more keys than the local map holds, Spark cleans in one pass, local in
    several, and the records then agree."""
    for name in ("a", "b"):
        log = LogBuilder(tmp_path / f"build-{name}")
        for round_ in range(3):
            for i in range(300):
                log.append([(k(i), k(f"{round_}-{i}"))], timestamps=[NOW - 10_000])
            log.roll()
        log.append([(k("x"), b"active")], timestamps=[NOW])
        (tmp_path / name).mkdir()
        shutil.move(log.write(), tmp_path / name / "offs-0")
    # 90 keys at load 0.9; every dirty byte makes the log eligible, so local goes on
    # pass after pass until the dirty range is consumed.
    topics = {"offs": {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0}}
    cfg = {"topics": topics, "log.cleaner.dedupe.buffer.size": 100 * 24}
    for name, engine in (("a", "local"), ("b", "spark")):
        path = write_config(
            tmp_path / f"{name}.yaml", tmp_path / name, tmp_path / f"st-{name}", **cfg
        )
        argv = ["clean", "-c", str(path), "--now-ms", str(NOW), "--engine", engine, "--json"]
        assert main(argv) == 0
    local_report, spark_report = (json.loads(doc) for doc in _json_docs(capsys.readouterr().out))
    assert len(local_report["cleaned"]) > 1
    assert len(spark_report["cleaned"]) == 1
    assert spark_report["cleaned"][0]["end_offset"] == 900
    assert records(tmp_path / "a" / "offs-0") == records(tmp_path / "b" / "offs-0")
    assert [r[0] for r in records(tmp_path / "b" / "offs-0")] == [*range(600, 900), 900]


def _json_docs(out: str) -> list[str]:
    """The documents of two `--json` outputs printed one after the other."""
    decoder = json.JSONDecoder()
    docs, pos = [], 0
    while pos < len(out.rstrip()):
        doc, end = decoder.raw_decode(out, pos)
        docs.append(json.dumps(doc))
        pos = end
        while pos < len(out) and out[pos].isspace():
            pos += 1
    return docs


def job_for(log_dir: Path, state: Path) -> CleanJob:
    own(log_dir)
    dir_path = log_dir / str(TP)
    metas = tuple(segment_metas(dir_path))
    return CleanJob(
        log_dir=log_dir,
        state_dir=state,
        tp=TP,
        segments=metas,
        first_dirty=0,
        first_uncleanable=metas[-1].base_offset,
        now_ms=NOW,
        config=CleanerConfig(segment_bytes=4000, producer_id_expiration_ms=2**63 - 1),
    )


def _kill_job_when_running(stop: threading.Event) -> None:
    """SIGKILL the job process group once its JVM runs."""
    me = psutil.Process()
    deadline = time.monotonic() + WAIT_S
    while not stop.is_set() and time.monotonic() < deadline:
        for child in me.children(recursive=True):
            try:
                cmd = child.cmdline()
            except psutil.Error:
                continue
            if any("clean_job" in part for part in cmd) and child.children(recursive=True):
                os.killpg(child.pid, signal.SIGKILL)
                return
        time.sleep(0.05)


@pytest.mark.slow
def test_spark_job_dies_with_its_owner(spark: Any, tmp_path: Path) -> None:
    """`cleanerd clean --engine spark` killed (SIGKILL) while its job runs: the job's
    whole session (the driver, its JVM, Spark's Python workers) ends within seconds, and
    the partition is as it was."""
    random_partition(tmp_path / "logs" / str(TP), random.Random(5), batches=200)
    before = tree(tmp_path / "logs")
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "log.dirs": [str(tmp_path / "logs")],
                "state_dir": str(tmp_path / "state"),
                "log.cleanup.policy": ["compact"],
                "log.cleaner.min.cleanable.ratio": 0.01,
                "engine": {"spark": {"master": "local[1]"}},
            }
        )
    )
    owner = subprocess.Popen(
        [sys.executable, "-m", "cleanerd", "clean", "-c", str(config), "--engine", "spark"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        job = _wait_for_job_jvm(psutil.Process(owner.pid))
        owner.kill()
        owner.wait()
        wait_for_session_end(job, 20)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
    recovered = PartitionLog.open(tmp_path / "logs" / str(TP), state_dir=tmp_path / "state")
    assert not recovered.recovery_report.errors
    assert tree(tmp_path / "logs") == before


def _wait_for_job_jvm(owner: psutil.Process) -> int:
    """The pid of `owner`'s Spark job process (a session leader) once its JVM runs."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for child in owner.children():
            try:
                if any("clean_job" in part for part in child.cmdline()) and any(
                    "java" in c.name() for c in child.children(recursive=True)
                ):
                    return child.pid
            except psutil.Error:
                continue
        time.sleep(0.05)
    pytest.fail("the spark job never started its JVM")


@pytest.mark.slow
def test_killed_job_leaves_originals_and_next_pass_cleans(spark: Any, tmp_path: Path) -> None:
    """A job process killed mid-pass fails as an aborted pass with the originals
    byte-identical and no `.cleaned` file; the next pass cleans as local does."""
    random_partition(tmp_path / "logs" / str(TP), random.Random(7), batches=200)
    shutil.copytree(tmp_path / "logs", tmp_path / "local")
    before = tree(tmp_path / "logs")
    settings = SparkSettings(master="local[2]", conf=(("spark.ui.showConsoleProgress", "false"),))
    stop = threading.Event()
    killer = threading.Thread(target=_kill_job_when_running, args=(stop,))
    killer.start()
    with SparkEngine(settings) as engine:
        future = engine.submit_clean(job_for(tmp_path / "logs", tmp_path / "state"))
        error = future.exception(timeout=WAIT_S)
    stop.set()
    killer.join()
    assert isinstance(error, SparkJobFailed)
    assert "signal 9" in str(error)
    assert tree(tmp_path / "logs") == before
    with SparkEngine(settings, runner=in_process_runner(spark)) as engine:
        result = engine.submit_clean(job_for(tmp_path / "logs", tmp_path / "state")).result(WAIT_S)
    assert result.end_offset == job_for(tmp_path / "logs", tmp_path / "state").first_uncleanable
    job = job_for(tmp_path / "local", tmp_path / "state-local")
    Cleaner(OffsetMap(1 << 20)).clean(
        log_dir=job.log_dir,
        tp=TP,
        segments=job.segments,
        first_dirty=0,
        first_uncleanable=job.first_uncleanable,
        now_ms=NOW,
        config=job.config,
    )
    a, b = tree(tmp_path / "local"), tree(tmp_path / "logs")
    assert [n for n in a if not n.endswith(".deleted")] == [
        n for n in b if not n.endswith(".deleted")
    ]
    assert all(a[n] == b[n] for n in a if not n.endswith(".deleted"))


def test_a_job_killed_by_an_aborting_shutdown_aborts_its_passes(tmp_path: Path) -> None:
    """`shutdown(abort=True)` kills the running job: its passes fail as aborted, as asked
    (`requested`), not as a failed job, which the cycle reports as a failed step: a stop
    of the daemon during a Spark pass would have logged a clean failure."""
    random_partition(tmp_path / "logs" / str(TP), random.Random(5))
    running = threading.Event()

    def until_killed(
        spec_path: Path, staging: Path, kill: threading.Event, *, module: str = "clean_job"
    ) -> None:
        running.set()
        assert kill.wait(WAIT_S)
        raise CleanerdError("job process ended by signal 9")

    engine = SparkEngine(SparkSettings(linger_s=0.0), runner=until_killed)
    future = engine.submit_clean(job_for(tmp_path / "logs", tmp_path / "state"))
    assert running.wait(WAIT_S)
    engine.shutdown(abort=True)
    error = future.exception(WAIT_S)
    assert isinstance(error, CleaningAborted)
    assert error.requested


def _counting_runner(jobs: list[int]) -> spark_engine.JobRunner:
    """A job runner that notes how many passes each job was given, then fails the job."""

    def count(
        spec_path: Path, staging: Path, kill: threading.Event, *, module: str = "clean_job"
    ) -> None:
        jobs.append(len(JobSpec.read(spec_path).passes))
        raise CleanerdError("job process ended by signal 9")

    return count


def test_a_round_of_passes_submitted_slowly_goes_into_one_job(tmp_path: Path) -> None:
    """Passes submitted some time apart, then flushed (as the cycle does after a round,
    where the `auto` engine sampled ranges between its Spark-bound passes), share one job:
    a job used to start 0.2 s after the first submission, and these went into two, a JVM
    start each. The flush starts the job: nothing else would for an hour."""
    jobs: list[int] = []
    futures = []
    with SparkEngine(SparkSettings(linger_s=3600), runner=_counting_runner(jobs)) as engine:
        for name in ("a", "b"):
            random_partition(tmp_path / name / str(TP), random.Random(5))
            futures.append(engine.submit_clean(job_for(tmp_path / name, tmp_path / "state")))
            time.sleep(0.3)  # the routing of the next candidate: its key sample
        engine.flush()
        for future in futures:
            assert isinstance(future.exception(WAIT_S), SparkJobFailed)
    assert jobs == [2]


def test_passes_nobody_flushes_start_after_the_linger(tmp_path: Path) -> None:
    """A caller that never flushes still gets its pass run, once `linger_s` passed
    without another submission."""
    jobs: list[int] = []
    random_partition(tmp_path / "logs" / str(TP), random.Random(5))
    with SparkEngine(SparkSettings(linger_s=0.05), runner=_counting_runner(jobs)) as engine:
        future = engine.submit_clean(job_for(tmp_path / "logs", tmp_path / "state"))
        assert isinstance(future.exception(WAIT_S), SparkJobFailed)
    assert jobs == [1]


def test_a_staging_dir_that_cannot_be_made_fails_the_passes_not_the_engine(
    tmp_path: Path,
) -> None:
    """A staging dir that cannot be made (here `state/spark` is a file; out of inodes,
    elsewhere) fails the job's passes naming it, and the engine takes the next job: the
    dispatcher thread died on it, and every pass waited for ever."""
    jobs: list[int] = []
    random_partition(tmp_path / "logs" / str(TP), random.Random(5))
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "spark").write_text("")
    with SparkEngine(SparkSettings(), runner=_counting_runner(jobs)) as engine:
        future = engine.submit_clean(job_for(tmp_path / "logs", tmp_path / "state"))
        engine.flush()
        error = future.exception(WAIT_S)
        assert isinstance(error, SparkJobFailed)
        assert "while creating the Spark job's staging dir" in str(error)
        (tmp_path / "state" / "spark").unlink()
        future = engine.submit_clean(job_for(tmp_path / "logs", tmp_path / "state"))
        engine.flush()
        assert isinstance(future.exception(WAIT_S), SparkJobFailed)
    assert jobs == [1]


def test_aborting_every_pass_of_a_running_job_kills_it(tmp_path: Path) -> None:
    """Once every pass of the running job is aborted (a stop of the daemon aborts them
    all), the job is killed and they end as aborted: the job ran on to its end, and the
    daemon's stop gave up waiting for it. The next job is not killed."""
    random_partition(tmp_path / "logs" / str(TP), random.Random(5))
    running = threading.Event()
    killed: list[tuple[bool, bool]] = []  # (at its start, at its end)

    def until_killed(
        spec_path: Path, staging: Path, kill: threading.Event, *, module: str = "clean_job"
    ) -> None:
        at_start = kill.is_set()
        running.set()
        killed.append((at_start, kill.wait(WAIT_S)))
        raise CleanerdError("job process ended by signal 9")

    with SparkEngine(SparkSettings(), runner=until_killed) as engine:
        future = engine.submit_clean(job_for(tmp_path / "logs", tmp_path / "state"))
        engine.flush()
        assert running.wait(WAIT_S)
        assert engine.abort(TP)
        error = future.exception(WAIT_S)
        assert isinstance(error, CleaningAborted)
        assert error.requested
        running.clear()
        future = engine.submit_clean(job_for(tmp_path / "logs", tmp_path / "state"))
        engine.flush()
        assert running.wait(WAIT_S)
        engine.shutdown(abort=True)
        assert isinstance(future.exception(WAIT_S), CleaningAborted)
    assert killed == [(False, True), (False, True)]
    assert engine.dead_workers == 0  # killed as asked: no worker died


def test_a_job_that_failed_counts_as_a_dead_worker(tmp_path: Path) -> None:
    """A job that ended in an error (its process died) is the engine's dead worker."""
    random_partition(tmp_path / "logs" / str(TP), random.Random(5))

    def dies(
        spec_path: Path, staging: Path, kill: threading.Event, *, module: str = "clean_job"
    ) -> None:
        raise CleanerdError("killed by signal 9")

    with SparkEngine(SparkSettings(), runner=dies) as engine:
        future = engine.submit_clean(job_for(tmp_path / "logs", tmp_path / "state"))
        engine.flush()
        assert isinstance(future.exception(WAIT_S), spark_engine.SparkJobFailed)
    assert engine.dead_workers == 1


def _failing_outcome(error: str, errno: int | None, before: Any = None) -> spark_engine.JobRunner:
    """A job runner that calls `before` (if any), then reports every pass failed."""

    def fail(
        spec_path: Path, staging: Path, kill: threading.Event, *, module: str = "clean_job"
    ) -> None:
        if before is not None:
            before()
        spec = JobSpec.read(spec_path)
        outcomes = tuple(
            PassOutcome(end_offset=p.first_uncleanable, error=error, errno=errno)
            for p in spec.passes
        )
        Manifest(outcomes=outcomes).write(staging / MANIFEST)

    return fail


def test_a_pass_failed_in_the_job_keeps_its_kind(tmp_path: Path) -> None:
    """A pass that failed in the job as its partition changed under it (a segment
    replaced as it was read) is stale work, planned again, and one whose file operation
    failed there a FileStepError, a full disk said so (the cycle frees space and tries
    again): both came back as a plain CleanerdError, which marks the partition."""
    dir_path = tmp_path / "logs" / str(TP)
    random_partition(dir_path, random.Random(5))
    job = job_for(tmp_path / "logs", tmp_path / "state")
    first = log_file(dir_path, job.segments[0].base_offset)

    def replace() -> None:
        copy = first.with_suffix(".copy")
        shutil.copyfile(first, copy)
        copy.replace(first)

    replaced = _failing_outcome(f"{first} was replaced since it was read", None, replace)
    with SparkEngine(SparkSettings(), runner=replaced) as engine:
        future = engine.submit_clean(job)
        engine.flush()
        assert isinstance(future.exception(WAIT_S), StaleWork)
    job = job_for(tmp_path / "logs", tmp_path / "state")
    full = _failing_outcome("No space left on device (ENOSPC) while ...", errno.ENOSPC)
    with SparkEngine(SparkSettings(), runner=full) as engine:
        future = engine.submit_clean(job)
        engine.flush()
        error = future.exception(WAIT_S)
    assert isinstance(error, FileStepError)
    assert error.no_space


def test_tampered_output_is_refused(spark: Any, tmp_path: Path) -> None:
    """Output that disagrees with the job's manifest is not swapped in: the pass fails
    with a CleanerdError, its `.cleaned` files go and the originals stay."""
    random_partition(tmp_path / "logs" / str(TP), random.Random(3))
    before = tree(tmp_path / "logs")
    inner = in_process_runner(spark)

    def tamper(
        spec_path: Path, staging: Path, kill: threading.Event, *, module: str = "clean_job"
    ) -> None:
        inner(spec_path, staging, kill, module=module)
        cleaned = sorted((tmp_path / "logs" / str(TP)).glob("*.log.cleaned"))
        cleaned[0].write_bytes(cleaned[0].read_bytes()[:-1])

    with SparkEngine(SparkSettings(), runner=tamper) as engine:
        error = engine.submit_clean(job_for(tmp_path / "logs", tmp_path / "st")).exception(WAIT_S)
    assert isinstance(error, CleanerdError)
    assert not isinstance(error, SparkJobFailed)
    assert tree(tmp_path / "logs") == before


def pass_spec(log_dir: Path, *, read_root: str | None = None) -> PassSpec:
    job = job_for(log_dir, log_dir)
    return PassSpec(
        log_dir=log_dir,
        tp=TP,
        segments=job.segments,
        first_dirty=0,
        first_uncleanable=job.first_uncleanable,
        now_ms=NOW,
        config=job.config,
        read_root=read_root,
    )


def test_uri_reads_and_a_corrupt_segment_fail_only_their_pass(spark: Any, tmp_path: Path) -> None:
    """Segments read through a Hadoop filesystem URI give the local output; a corrupt
    segment fails its own pass (named in the manifest) and no other."""
    for name in ("uri", "local", "bad"):
        random_partition(tmp_path / name / str(TP), random.Random(21), batches=80)
    bad = sorted((tmp_path / "bad" / str(TP)).glob("*.log"))[1]
    data = bytearray(bad.read_bytes())
    data[70] ^= 0x55
    bad.write_bytes(bytes(data))
    uri = (tmp_path / "uri" / str(TP)).as_uri()
    spec = JobSpec(
        passes=(pass_spec(tmp_path / "uri", read_root=uri), pass_spec(tmp_path / "bad")),
        staging=tmp_path / "staging",
    )
    manifest = run_job(spec, spark=spark)
    good, failed = manifest.outcomes
    assert failed.error is not None
    assert bad.name in failed.error
    assert not list((tmp_path / "bad" / str(TP)).glob("*.cleaned"))
    assert good.error is None
    uri_segments = tuple(segment_metas(tmp_path / "uri" / str(TP)))
    Cleaner(None).install(
        log_dir=tmp_path / "uri",
        tp=TP,
        cleaned=good.cleaned,
        end_offset=good.end_offset,
        proof=SwapProof(tmp_path / "uri", TP, uri_segments, None),
    )
    job = job_for(tmp_path / "local", tmp_path)
    Cleaner(OffsetMap(1 << 20)).clean(
        log_dir=job.log_dir,
        tp=TP,
        segments=job.segments,
        first_dirty=0,
        first_uncleanable=job.first_uncleanable,
        now_ms=NOW,
        config=job.config,
    )
    assert tree(tmp_path / "uri") == tree(tmp_path / "local")


def test_the_output_check_reads_a_window_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver checks a job's `.cleaned` output a window of batches at a time (an
    output is up to a segment, 1 GiB): a good output passes whatever the window, and
    batches out of offset order are refused also when they meet across windows."""
    log = LogBuilder(tmp_path / "logs")
    for i in range(20):
        log.append([(k(i % 7), b"v%d" % i)])
    log.roll()
    d = log.write()
    result = Cleaner(OffsetMap(1 << 16)).clean(
        log_dir=d.parent,
        tp=TP,
        segments=segment_metas(d),
        first_dirty=0,
        first_uncleanable=log.segments[-1].base,
        now_ms=NOW,
        config=CleanerConfig(),
        install=False,
    )
    (group,) = result.cleaned
    monkeypatch.setattr(spark_engine, "DECODE_WINDOW_BYTES", 100)  # a batch a window
    spark_engine._check_group(d, group, CleanerConfig().max_index_size)
    output = d / f"{group.base:020d}.log.cleaned"
    data = output.read_bytes()
    spans = [data[b.position : b.position + b.size] for b in scan_batches(data)]
    output.write_bytes(b"".join([spans[1], spans[0], *spans[2:]]))
    with pytest.raises(CleanerdError, match="not above the previous batch"):
        spark_engine._check_group(d, group, CleanerConfig().max_index_size)


def test_a_job_whose_jvm_does_not_start_says_why_not_where(tmp_path: Path) -> None:
    """A job whose JVM refuses its settings fails its pass with what the JVM said and
    the exception that ended the job, not the traceback of a Python it never reached."""
    random_partition(tmp_path / "logs" / str(TP), random.Random(3))
    settings = SparkSettings(master="local[1]", conf=(("spark.driver.memory", "lots"),))
    with SparkEngine(settings) as engine:
        error = engine.submit_clean(job_for(tmp_path / "logs", tmp_path / "st")).exception(WAIT_S)
    assert isinstance(error, SparkJobFailed)
    text = str(error)
    assert "Invalid maximum heap size: -Xmxlots" in text
    assert "PySparkRuntimeError: [JAVA_GATEWAY_EXITED]" in text
    assert "Traceback" not in text
    assert 'File "' not in text


def test_a_failed_jobs_log_is_summed_up() -> None:
    """The lines before the traceback and the exception's last line, its type named
    without its module; a log without a traceback by its last lines."""
    lines = [
        "INFO starting",
        "Error: Could not create the Java Virtual Machine.",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "ValueError: first",
        "During handling of the above exception, another exception occurred:",
        "Traceback (most recent call last):",
        '  File "y.py", line 2, in <module>',
        "    raise pkg.errors.Boom('x')",
        "pkg.errors.Boom: second",
    ]
    assert spark_engine.job_log_summary(lines) == (
        "INFO starting | Error: Could not create the Java Virtual Machine. | Boom: second"
    )
    assert spark_engine.job_log_summary(["a", "b"]) == "log tail: a | b"
    assert spark_engine.job_log_summary([]) == "no output"
    py4j = [
        'Setting default log level to "WARN".',
        "25/11/29 15:00:00 INFO SparkContext: Running Spark version 4.0.1",
        "Traceback (most recent call last):",
        '  File "job.py", line 9, in <module>',
        "py4j.protocol.Py4JJavaError: An error occurred while calling o52.collect.",
        ": org.apache.spark.SparkException: Job aborted due to stage failure: boom",
        "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages",
        "25/11/29 15:00:01 INFO ShutdownHookManager: Deleting directory /tmp/spark-1",
    ]
    assert spark_engine.job_log_summary(py4j) == (
        "Py4JJavaError: An error occurred while calling o52.collect. "
        ": org.apache.spark.SparkException: Job aborted due to stage failure: boom"
    )
    cut = ["Traceback (most recent call last):", '  File "job.py", line 9, in <module>']
    assert spark_engine.job_log_summary(cut).startswith("log tail: Traceback")
    gateway = [
        "Traceback (most recent call last):",
        "PySparkRuntimeError: [JAVA_GATEWAY_EXITED] Java gateway process exited.",
    ]
    assert "Spark 4 needs Java 17" in spark_engine.job_log_summary(gateway)
    said = ["Invalid maximum heap size: -Xmxlots", *gateway]
    assert "Java 17" not in spark_engine.job_log_summary(said)  # the JVM said why
    # spark-submit's exception, not its stack frames (they filled the three lines kept).
    master = [
        'Exception in thread "main" org.apache.spark.SparkException: Master must either be'
        " yarn or start with spark, k8s, or local",
        "\tat org.apache.spark.deploy.SparkSubmit.error(SparkSubmit.scala:1080)",
        "\tat org.apache.spark.deploy.SparkSubmit$$anon$2.doSubmit(SparkSubmit.scala:1171)",
        "\tat org.apache.spark.deploy.SparkSubmit.main(SparkSubmit.scala)",
        "\t... 3 more",
        *gateway,
    ]
    assert spark_engine.job_log_summary(master).startswith(
        'Exception in thread "main" org.apache.spark.SparkException: Master must either be'
        " yarn or start with spark, k8s, or local | PySparkRuntimeError:"
    )


def test_a_dead_driver_is_named_without_the_start_up_noise() -> None:
    """A job whose driver JVM was killed: its Python side's connection refused is said
    to mean the JVM is gone, and what every start prints (the JDK's incubator note,
    PySpark's pandas warning and the line it quotes, socketserver's banner) is left out.
    Before, those lines came first and nothing said the JVM had died."""
    lines = [
        "WARNING: Using incubator modules: jdk.incubator.vector",
        "/venv/lib/python3.11/site-packages/pyspark/sql/pandas/utils.py:42: FutureWarning: "
        "pandas is old",
        "  require_minimum_pandas_version()",
        "----------------------------------------",
        "Exception occurred during processing of request from ('127.0.0.1', 55032)",
        "Traceback (most recent call last):",
        '  File "socketserver.py", line 317, in _handle_request_noblock',
        "ConnectionRefusedError: [Errno 111] Connection refused",
    ]
    assert spark_engine.job_log_summary(lines) == (
        "ConnectionRefusedError: [Errno 111] Connection refused "
        "(the Spark driver's JVM is gone: killed, or out of memory)"
    )


def test_a_job_log_on_a_full_state_dir_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's log lives in its staging dir: on a full file system it is cut short,
    often before any Python error, so the failure says the state dir is full and where."""
    log = tmp_path / "job.log"
    log.write_text("\tat org.apache.spark.rdd.RDD.iterator(RDD.scala:338)\n")
    full = shutil._ntuple_diskusage(4 << 20, 4 << 20, 0)
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: full)
    assert spark_engine._tail(log).startswith(
        f"the state dir's file system is full (0 bytes free at {tmp_path}), which cut the "
        "job's log short; log tail: "
    )


def test_starvation_is_one_spell_of_warnings_lasting_the_limit() -> None:
    """Warnings at most the gap apart make one spell; the limit counts from its first;
    a pause longer than the gap (the tasks were taken) ends it."""
    gap, limit = spark_engine._STARVED_GAP_S, spark_engine.STARVED_S
    s = spark_engine.Starvation()
    assert not s.seen(0, 0.0)
    assert not s.seen(1, 15.0)
    t, n = 15.0, 1
    while t < 15.0 + limit - 15:
        t, n = t + 15, n + 1
        assert not s.seen(n, t)
    assert s.seen(n + 1, 15.0 + limit)
    quiet = spark_engine.Starvation()
    assert not quiet.seen(1, 0.0)
    assert not quiet.seen(1, gap + 1)  # no new warning for longer than the gap
    assert not quiet.seen(2, limit + 1)  # a new spell starts here
    t, n = limit + 1, 2
    while t + 15 < 2 * limit + 1:
        t, n = t + 15, n + 1
        assert not quiet.seen(n, t)
    assert quiet.seen(n + 1, 2 * limit + 1)


def test_a_job_no_executor_takes_is_stopped_and_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job whose tasks no executor takes (no worker, or none with the memory it asks
    for) is stopped, its whole session, with an error that says so: it waited for ever,
    and with it the pass and every later one of the batch."""
    monkeypatch.setattr(spark_engine, "STARVED_S", 0.6)
    monkeypatch.setattr(spark_engine, "_STARVED_GAP_S", 0.5)
    monkeypatch.setattr(spark_engine, "_STARVED_CHECK_S", 0.1)
    spec = tmp_path / "spec.json"
    spec.write_text("{}")
    started = time.monotonic()
    with pytest.raises(CleanerdError, match="no Spark executor took the job's tasks"):
        spark_engine.launch_job(
            spec, tmp_path, threading.Event(), module="tests.engine.spark._starving_job"
        )
    assert time.monotonic() - started < 30


def test_staging_dirs_a_killed_process_left_are_removed_by_the_next_job(
    tmp_path: Path,
) -> None:
    """A process killed while its job ran cannot remove its staging dir (bitmaps and
    columns, up to gigabytes): the next job made in the same state dir removes those whose
    process is gone, named by pid and start time (one of an earlier process with this
    one's pid too: a container's daemon is pid 1 at every start), and old-named ones a
    day old; it leaves a running process's, a new old-named one, and anything else."""
    random_partition(tmp_path / "logs" / str(TP), random.Random(6))
    staging_root = tmp_path / "state" / "spark"
    ended = subprocess.Popen(["true"])
    ended.wait()
    running = subprocess.Popen(["sleep", "600"])
    me = ProcessId.current()
    try:
        ticks = start_ticks(running.pid)
        left = [
            staging_root / f"job-{ended.pid}-{ticks}-3",
            staging_root / f"audit-{ended.pid}-{ticks}-1",
            staging_root / f"job-{me.pid}-{(me.start_ticks or 0) + 1}-5",
            staging_root / "audit-1700000000000000000",
            staging_root / f"audit-{running.pid}-1",  # old-named, a day old
        ]
        kept = [
            staging_root / f"job-{running.pid}-{ticks}-1",
            staging_root / f"job-{running.pid}-2",  # old-named, but new
            staging_root / "notes",
        ]
        for path in left + kept:
            (path / "pass-0").mkdir(parents=True)
            (path / "pass-0" / "00000000000000000000.superseded").write_bytes(b"\0" * 64)
        two_days_ago = time.time() - 2 * 86_400
        for old in ("audit-1700000000000000000", f"audit-{running.pid}-1"):
            os.utime(staging_root / old, (two_days_ago, two_days_ago))
        seen: list[set[str]] = []

        def listing(
            spec_path: Path, staging: Path, kill: threading.Event, *, module: str = ""
        ) -> None:
            seen.append({p.name for p in staging_root.iterdir()})
            raise CleanerdError("job process ended by signal 9")

        with SparkEngine(SparkSettings(linger_s=0.0), runner=listing) as engine:
            future = engine.submit_clean(job_for(tmp_path / "logs", tmp_path / "state"))
            assert isinstance(future.exception(WAIT_S), SparkJobFailed)
        own = f"job-{me.pid}-{me.start_ticks}-1"
        assert seen == [{p.name for p in kept} | {own}]
        assert sorted(p.name for p in staging_root.iterdir()) == sorted(p.name for p in kept)
    finally:
        running.kill()
        running.wait()
