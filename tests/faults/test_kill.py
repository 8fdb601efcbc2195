"""Killed and stopped processes lose nothing: the fault matrix, with real processes.

Each test runs the operator's sequence from the field report on a compacted partition
(200,000 records over 20,000 keys, 4 MiB segments): a throttled `cleanerd clean --pool`
(its pass in a worker process, as the daemon's are) or `cleanerd run` is broken at a
random point of its pass, then `cleanerd clean` runs with a 1 s `segment.ms`, `cleanerd
produce` appends 1,000 new keys, and another clean runs. Then an independent reader
(kafka-python) checks every key's latest record, that nothing compacted away came back,
the CRCs and that no `.cleaned`, `.swap` or `.deleted` file is left (`workload.verify`);
and no process of the broken run may still be alive a few seconds after it was killed. A
stale pass of a killed run once swapped its output in about 50 s later, so the kill
tests look again a minute after each kill (the random kills run in one test, so that
those minutes overlap).

The random kill points come from a seeded generator (`CLEANERD_FAULT_SEED` sets the
seed; the test prints it, with what was on disk at each kill).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from cleanerd.log.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleanerd.log.files import TopicPartition
from cleanerd.log.ownership import lock_holder
from cleanerd.log.partition_log import PartitionLog
from tests.faults.workload import (
    TP,
    Workload,
    cleanerd,
    dir_state,
    extra_records,
    started,
    verify,
    wait_for,
    write_config,
    write_partition,
)
from tests.tools import session_processes, wait_for_session_end

pytestmark = pytest.mark.slow

RECORDS, KEYS, SEGMENT_BYTES = 200_000, 20_000, 4 * 1024 * 1024
SLOW_RATE = 2_000_000
"""Bytes/s of the throttled pass: about 9 s for the workload's map and copy."""
PASS_S = 9.0
KILL_BEFORE_S = 6.0
"""Kills fall in [0.2, KILL_BEFORE_S) s after the worker started: inside the pass."""
LATER_S = 60.0
"""How long after a kill the partition is looked at again."""
SESSION_END_S = 5.0
"""The bound on how long anything of a killed run may live on."""
EXTRA = 1_000
NOW_MS = int(time.time() * 1000)


@dataclass
class Setup:
    """One copy of the workload and its two configs."""

    root: Path
    work: Workload
    slow: Path
    fast: Path

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def partition(self) -> Path:
        return self.data / str(TP)


@pytest.fixture(scope="module", name="pristine")
def _pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Workload]:
    root = tmp_path_factory.mktemp("pristine")
    work = write_partition(
        root / "data",
        root / "state",
        records=RECORDS,
        keys=KEYS,
        segment_bytes=SEGMENT_BYTES,
        ts=NOW_MS - 3_600_000,
    )
    return root, work


def setup(pristine: tuple[Path, Workload], where: Path, **fast: object) -> Setup:
    """A fresh copy of the workload at `where`, with `slow.yaml` (throttled) and
    `fast.yaml` (unthrottled, 1 s `segment.ms`)."""
    root, work = pristine
    shutil.copytree(root, where)
    data, state = where / "data", where / "state"
    common = {"log.segment.bytes": SEGMENT_BYTES, "metrics": {"listen": f"127.0.0.1:{free_port()}"}}
    slow = write_config(
        where / "slow.yaml",
        data,
        state,
        **common,
        **{"log.cleaner.io.max.bytes.per.second": SLOW_RATE},
    )
    fast_cfg = write_config(
        where / "fast.yaml",
        data,
        state,
        **common,
        **{"log.roll.ms": 1000, "log.cleaner.backoff.ms": 500, **fast},
    )
    return Setup(where, Workload(dict(work.latest)), slow, fast_cfg)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def on_disk(s: Setup) -> str:
    """What a kill interrupted, from the files: map (nothing written yet), copy
    (`.cleaned`), swap (`.swap` or `.deleted`)."""
    names = [p.name for p in s.partition.iterdir()]
    if any(n.endswith((".swap", ".deleted")) for n in names):
        return "swap"
    if any(n.endswith(".cleaned") for n in names):
        return "copy"
    return "map"


def kill_owner(pid: int) -> float:
    """SIGKILL the process `pid` (a session leader); how long its session outlived it."""
    os.kill(pid, signal.SIGKILL)
    return wait_for_session_end(pid, SESSION_END_S)


def append_extra(s: Setup) -> int:
    """`cleanerd produce` of EXTRA records of new keys at the log end; returns that end."""
    end = log_end(s)
    appended = cleanerd(
        "produce",
        "-c",
        str(s.fast),
        "--batch-size",
        "100",
        str(TP),
        stdin=extra_records(s.work, end, EXTRA, NOW_MS),
    )
    assert appended.returncode == 0, appended.stderr
    return end


def then_clean_append_clean(s: Setup) -> None:
    """The rest of the field report's sequence, each command checked."""
    done = cleanerd("clean", "-c", str(s.fast))
    assert done.returncode == 0, done.stdout + done.stderr
    append_extra(s)
    time.sleep(1.5)  # past segment.ms: the next clean rolls the appended segment
    done = cleanerd("clean", "-c", str(s.fast))
    assert done.returncode == 0, done.stdout + done.stderr
    verify(s.partition, s.work)


def log_end(s: Setup) -> int:
    return PartitionLog.open(s.partition, read_only=True).log_end_offset


Killed = tuple[Setup, dict[str, tuple[int, int]], float]
"""A partition whose run was killed, its state after the rest of the sequence, and the
`time.monotonic()` of the kill."""


def later(killed: list[Killed]) -> None:
    """A minute after each kill (`LATER_S`), in the order of the kills: its partition
    unchanged and still sound."""
    for s, state, at in sorted(killed, key=lambda k: k[2]):
        time.sleep(max(0.0, at + LATER_S - time.monotonic()))
        assert dir_state(s.partition) == state, f"{s.partition} changed after the run ended"
        verify(s.partition, s.work)


@pytest.fixture(name="rng")
def _rng() -> random.Random:
    seed = int(os.environ.get("CLEANERD_FAULT_SEED", random.randrange(1 << 32)))
    print(f"fault seed: CLEANERD_FAULT_SEED={seed}")
    return random.Random(seed)


def wait_for_worker(pid: int, timeout_s: float = 60) -> None:
    """Until the run led by `pid` has started its fork server and a worker."""
    wait_for(lambda: len(session_processes(pid)) >= 3, timeout_s, "the pass's worker")


def wait_for_owner(s: Setup, pid: int, timeout_s: float = 60) -> None:
    """Until the run `pid` holds the log dir (its pass, in its own process, follows)."""
    wait_for(lambda: lock_holder(s.data) == pid, timeout_s, "the run to own the dir")


def kill_run_and_restart(
    pristine: tuple[Path, Workload], where: Path, rng: random.Random
) -> Killed:
    """`cleanerd run` killed in its first (throttled) pass and started again: nothing of
    the killed daemon lives on, the new one cleans, appends are cleaned too."""
    s = setup(pristine, where)
    with started("run", "-c", str(s.slow)) as proc:
        wait_for_worker(proc.pid)
        time.sleep(rng.uniform(0.2, KILL_BEFORE_S))
        lived = kill_owner(proc.pid)
    killed = time.monotonic()
    print(f"the killed daemon's session outlived it by {lived:.3f} s")
    with started("run", "-c", str(s.fast)) as daemon:
        try:
            checkpoint = s.data / CLEANER_OFFSET_CHECKPOINT
            wait_for(lambda: _checkpoint(checkpoint).get(TP, 0) >= RECORDS, 120, "the first clean")
            end = append_extra(s)
            wait_for(
                lambda: _checkpoint(checkpoint).get(TP, 0) >= end + EXTRA, 120, "the appends' clean"
            )
        finally:
            daemon.send_signal(signal.SIGTERM)
            out, _ = daemon.communicate(timeout=60)
    assert daemon.returncode == 0, out[-4000:]
    verify(s.partition, s.work)
    return s, dir_state(s.partition), killed


def test_sigkill_at_random_points_loses_nothing(
    pristine: tuple[Path, Workload], tmp_path: Path, rng: random.Random
) -> None:
    """`cleanerd run` killed in its first pass and started again
    (`kill_run_and_restart`), then `cleanerd clean` killed at random points of a
    throttled pass, run by a worker (`--pool`) or by the command's own process, and the
    field report's sequence: every key intact at once and a minute after each kill, and
    nothing of a killed run alive a few seconds after its kill. One test, so that the
    minutes after the kills overlap."""
    done = [kill_run_and_restart(pristine, tmp_path / "run", rng)]
    points = []
    for where in ("pool", "in-process"):
        for n in range(4):
            s = setup(pristine, tmp_path / f"{where}{n}")
            pool = ["--pool"] if where == "pool" else []
            with started("clean", *pool, "-c", str(s.slow)) as proc:
                if pool:
                    wait_for_worker(proc.pid)
                else:
                    wait_for_owner(s, proc.pid)
                time.sleep(rng.uniform(0.2, KILL_BEFORE_S))
                phase = on_disk(s)
                lived = kill_owner(proc.pid)
            killed = time.monotonic()
            points.append((where, phase, round(lived, 3)))
            then_clean_append_clean(s)
            done.append((s, dir_state(s.partition), killed))
    print(f"kill points (where, phase, seconds the session outlived the owner): {points}")
    later(done)


def test_sigkill_of_a_worker_alone_loses_nothing(
    pristine: tuple[Path, Workload], tmp_path: Path, rng: random.Random
) -> None:
    """The worker running the pass is killed, its owner lives: the owner recovers the
    partition, retries the pass and exits 0; every key intact."""
    s = setup(pristine, tmp_path / "run")
    with started("clean", "--pool", "-c", str(s.slow)) as proc:
        owner = psutil.Process(proc.pid)

        def worker() -> psutil.Process | None:
            grandchildren = [c for c in owner.children(recursive=True) if c.ppid() != owner.pid]
            return grandchildren[0] if grandchildren else None

        wait_for(lambda: worker() is not None, 30, "the pass's worker")
        time.sleep(rng.uniform(0.2, KILL_BEFORE_S))
        victim = worker()
        assert victim is not None, "the pass ended before the kill"
        victim.kill()
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "clean.worker_died" in out
    then_clean_append_clean(s)


def test_stopped_owner_keeps_the_dir_and_a_second_clean_says_so(
    pristine: tuple[Path, Workload], tmp_path: Path
) -> None:
    """The owner is stopped (SIGSTOP) for longer than a pass: its worker finishes the
    pass in its name (the owner still holds the dir), a second `cleanerd clean` is
    refused with the holder named and changes nothing, and once continued the first
    run ends normally."""
    s = setup(pristine, tmp_path / "run")
    with started("clean", "--pool", "-c", str(s.slow)) as proc:
        # The worker is in the pass once it writes the `.cleaned` output (a fork server
        # and a resource tracker start before any job is handed out).
        wait_for(lambda: on_disk(s) != "map", 3 * PASS_S + 30, "the pass's output")
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            checkpoint = s.data / CLEANER_OFFSET_CHECKPOINT
            # the worker's pass ends in the stopped owner's name: the checkpoint moves
            wait_for(lambda: TP in _checkpoint(checkpoint), 3 * PASS_S + 30, "the worker's swap")
            before = dir_state(s.partition)
            second = cleanerd("clean", "-c", str(s.fast))
            assert second.returncode != 0
            assert f"pid {proc.pid}" in second.stdout + second.stderr
            assert dir_state(s.partition) == before
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    then_clean_append_clean(s)


def _checkpoint(path: Path) -> dict[TopicPartition, int]:
    return OffsetCheckpointFile(path).read() if path.exists() else {}
