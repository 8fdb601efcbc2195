"""The Spark engine on a real cluster: a standalone master and one worker, separate
processes on loopback, started from the installed pyspark's `spark-class` with an
environment of their own (no `PYTHONPATH`: what they know of cleanerd is only what a
job tells them). The real `cleanerd clean --engine spark` and `cleanerd audit --engine
spark` processes run against `spark://127.0.0.1:PORT` (`engine.spark.master`), the
executors' interpreter named by `PYSPARK_PYTHON`. The cleaned files are byte-identical
to the local engine's on a copy of the same data, the audit's report equals the local
audit's, its progress line ends done, the master lists both applications as completed
(the work ran on the cluster, not in a local Spark) and the executors ran the named
interpreter."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.engine.spark.support import NOW, random_partition, require_spark, tree, write_config
from tests.paths import REPO
from tests.tools import free_port

pytestmark = [pytest.mark.spark, pytest.mark.slow]

WAIT_S = 240.0
"""A generous bound on the cluster's start (JVMs on a shared machine), not a timing check."""
TOPICS: dict[str, dict[str, Any]] = {
    "offs": {"cleanup.policy": "compact", "segment.bytes": 700},
    "ts": {"cleanup.policy": "compact", "segment.bytes": 2500, "compaction.strategy": "timestamp"},
    "hdr": {
        "cleanup.policy": "compact",
        "compaction.strategy": "header",
        "compaction.strategy.header": "v",
        "max.compaction.lag.ms": 600_000,
    },
}
CLUSTER_CONF = {
    "spark.executor.memory": "512m",
    "spark.cores.max": "1",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
}


def _master_state(webui: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{webui}/json/", timeout=5) as r:
        state: dict[str, Any] = json.loads(r.read())
    return state


def _tail(path: Path) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-20:])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process's whole session (the worker's executors too), SIGKILL what
    is left after a grace period, and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def standalone_cluster(work: Path) -> Iterator[tuple[str, int]]:
    """A master and one worker (1 core, 1 GiB) on loopback until the block ends; yields
    the master URL and its web UI port once the worker has registered."""
    require_spark()
    spec = importlib.util.find_spec("pyspark")
    assert spec is not None
    assert spec.origin is not None
    spark_home = Path(spec.origin).parent
    port, webui, worker_ui = free_port(), free_port(), free_port()
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        SPARK_HOME=str(spark_home),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_WORKER_DIR=str(work / "worker"),
        SPARK_LOCAL_DIRS=str(work / "local"),
        SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
    )
    spark_class = str(spark_home / "bin" / "spark-class")
    argvs = {
        "master": [
            spark_class,
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1",
            "--port", str(port),
            "--webui-port", str(webui),
        ],
        "worker": [
            spark_class,
            "org.apache.spark.deploy.worker.Worker",
            f"spark://127.0.0.1:{port}",
            "--host", "127.0.0.1",
            "--cores", "1",
            "--memory", "1g",
            "--webui-port", str(worker_ui),
        ],
    }  # fmt: skip
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, argv in argvs.items():
            with open(work / f"{name}.log", "wb") as out:
                procs[name] = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
        deadline = time.monotonic() + WAIT_S
        while True:
            for name, proc in procs.items():
                if proc.poll() is not None:
                    pytest.fail(f"the {name} exited: {_tail(work / f'{name}.log')}")
            with contextlib.suppress(OSError, ValueError):
                if _master_state(webui).get("aliveworkers") == 1:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"no worker registered: {_tail(work / 'worker.log')}")
            time.sleep(0.5)
        yield f"spark://127.0.0.1:{port}", webui
    finally:
        for proc in reversed(procs.values()):
            _stop(proc)


def cleanerd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cleanerd", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=900,
        check=False,
        env=env,
    )


def executor_python(tmp_path: Path) -> tuple[Path, Path]:
    """An interpreter for the executors (`PYSPARK_PYTHON`): this one, behind a script
    that leaves a mark when an executor starts it."""
    mark, script = tmp_path / "executor-python-ran", tmp_path / "executor-python"
    script.write_text(f'#!/bin/sh\ntouch "{mark}"\nexec "{sys.executable}" "$@"\n')
    script.chmod(0o755)
    return script, mark


def test_clean_and_audit_on_a_standalone_cluster(tmp_path: Path) -> None:
    rng = random.Random(5)
    (tmp_path / "a").mkdir()
    for topic in TOPICS:
        random_partition(tmp_path / "a" / f"{topic}-0", rng, roll=0.1)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    local = write_config(tmp_path / "a.yaml", tmp_path / "a", tmp_path / "st-a", topics=TOPICS)
    started = time.monotonic()
    with standalone_cluster(tmp_path / "cluster") as (master, webui):
        up_s = time.monotonic() - started
        engine = {"spark": {"master": master, "conf": CLUSTER_CONF}}
        cluster = write_config(
            tmp_path / "b.yaml", tmp_path / "b", tmp_path / "st-b", topics=TOPICS, engine=engine
        )
        now = ["--now-ms", str(NOW)]
        python, ran = executor_python(tmp_path)
        env = {**os.environ, "PYSPARK_PYTHON": str(python)}
        on_local = cleanerd("clean", "-c", str(local), *now, "--engine", "local", "--json")
        assert on_local.returncode == 0, on_local.stderr
        t0 = time.monotonic()
        on_cluster = cleanerd(
            "clean", "-c", str(cluster), *now, "--engine", "spark", "--json", env=env
        )
        clean_s = time.monotonic() - t0
        assert on_cluster.returncode == 0, on_cluster.stderr[-3000:]
        t0 = time.monotonic()
        audit = cleanerd("audit", "-c", str(cluster), *now, "--json", "--engine", "spark", env=env)
        audit_s = time.monotonic() - t0
        apps = [a["name"] for a in _master_state(webui)["completedapps"]]
    local_report, cluster_report = json.loads(on_local.stdout), json.loads(on_cluster.stdout)
    assert local_report["cleaned"], "the logs had something to clean"
    assert len(cluster_report["cleaned"]) == len(local_report["cleaned"])
    a, b = tree(tmp_path / "a"), tree(tmp_path / "b")
    assert sorted(a) == sorted(b)
    assert [name for name in a if a[name] != b[name]] == []

    local_audit = cleanerd("audit", "-c", str(cluster), *now, "--json", "--engine", "local")
    assert audit.returncode == local_audit.returncode, audit.stderr[-3000:]
    assert json.loads(audit.stdout) == json.loads(local_audit.stdout)
    assert " done in " in audit.stderr.splitlines()[-1]  # the progress line's last state
    assert sorted(apps) == ["cleanerd-audit", "cleanerd-clean"]
    assert ran.exists()  # the executors ran the interpreter PYSPARK_PYTHON named
    print(
        f"cluster up in {up_s:.0f} s, clean on it {clean_s:.0f} s, audit {audit_s:.0f} s, "
        f"{len(cluster_report['cleaned'])} passes"
    )
