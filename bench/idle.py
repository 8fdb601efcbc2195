"""Start-up and idle cost: the daemon on many partitions that nothing writes to.

`--partitions` idle partitions of `--segments` segments each (5-record batches, as
`bench/broker_dir.py` builds them: a clean stop left a producer snapshot, the recovery
point at the end and Kafka's clean-shutdown marker, and a cleaner checkpoint at the
active segment: compacted, nothing dirty) are written once into `--dir` (kept between
runs). Then `cleanerd run` starts as a subprocess on them: its start-up to the end of
its first cycle (wall, CPU, peak RSS of the process tree) is measured, first on the dir
as built (stopped cleanly by another tool, as a broker leaves it: nothing of cleanerd's
own is kept), then again after the daemon's own clean stop (SIGTERM), which keeps what
it read of every segment (`log/known_segments.py`), then once more after that daemon
was killed (SIGKILL) at the end of its first cycle: a crash, which leaves no marker, so
the start walks what lies past each recovery point and takes what was kept only for the
segments wholly below it (`log/recovery.py`). In between, the CPU time of the
daemon's process tree (the daemon, the worker pool's fork server and workers: psutil's
user + system time) over `--seconds` of idleness. A SIGHUP with a changed policy forces
one full cycle over every partition, the revisit the daemon runs every
`log.retention.check.interval.ms` (300 s by default), whose CPU is also shown amortised
over that interval.

    python -m bench.idle [--partitions 10000] [--segments 10] [--seconds 60]
                         [--dir /tmp/cleanerd-idle] [--cold]

`--cold` (root only) empties the page cache before each start, as a host's reboot does:
then every listing, `stat` and read of the start goes to the disk.

Targets (issue 12): on 10,000 partitions / 100,000 segments, start-up under 10 s, peak
RSS under 1 GB, idle CPU under 1% of a core.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

from bench.broker_dir import TOPIC, build

REPO = Path(__file__).resolve().parents[1]
RETENTION_CHECK_S = 300
SEGMENT_BYTES = 2048  # a few 5-record batches per segment


def write_partitions(data: Path, count: int, segments: int) -> None:
    """`count` partitions of `segments` segments, unless `data` already has them."""
    marker = data.parent / f".bench-idle-{count}x{segments}"
    if marker.exists():
        return
    build(
        data.parent,
        count,
        mb=segments * SEGMENT_BYTES / 1e6,
        segment_bytes=SEGMENT_BYTES,
        cleaned=True,
    )
    marker.touch()


def config(data: Path, state: Path, backoff_ms: int) -> dict[str, Any]:
    return {
        "log.dirs": [str(data)],
        "state_dir": str(state),
        "log.cleaner.backoff.ms": backoff_ms,
        "logging": {"format": "json", "level": "info"},
        "metrics": {"listen": "127.0.0.1:0"},
        "topics": {TOPIC: {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.99}},
    }


def tree_rss(proc: psutil.Process) -> int:
    """Resident bytes of `proc` and its live children."""
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


def tree_cpu(proc: psutil.Process) -> float:
    """User + system seconds of `proc` and its live children."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


_peak: dict[int, int] = {0: 0}


def wait_until_idle(proc: psutil.Process, timeout_s: float) -> float:
    """When `proc`'s tree went idle again (under 5% of a core over a 1 s window); the
    daemon logs a cycle that changed nothing at debug only, so its CPU tells."""
    deadline = time.monotonic() + timeout_s
    time.sleep(1)
    while time.monotonic() < deadline:
        t, cpu = time.monotonic(), tree_cpu(proc)
        time.sleep(1)
        if tree_cpu(proc) - cpu < 0.05:
            return t
    raise SystemExit(f"the daemon did not go idle within {timeout_s} s")


def wait_for_cycles(
    log: Path, count: int, timeout_s: float, proc: psutil.Process | None = None
) -> dict[str, Any]:
    """The `count`-th `cycle.done` line of the daemon's log (sampling the peak RSS of
    `proc`'s tree meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None:
            _peak[0] = max(_peak[0], tree_rss(proc))
        done: list[dict[str, Any]] = []
        for line in log.read_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("event") == "cycle.done":
                done.append(event)
        if len(done) >= count:
            return done[count - 1]
        time.sleep(0.05 if proc is not None else 0.2)
    raise SystemExit(f"no cycle.done #{count} within {timeout_s} s; see {log}")


def first_cycles(log: Path) -> int:
    """How many `cycle.done` lines the daemon's log holds so far."""
    return sum('"cycle.done"' in line for line in log.read_text().splitlines())


def drop_page_cache() -> None:
    """Write back and drop the page cache, dentries and inodes (needs root)."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def start(
    cfg_path: Path, log: Path, *, cycles: int, cold: bool = False
) -> tuple[dict[str, Any], float, float, int, subprocess.Popen[bytes], psutil.Process]:
    """Start `cleanerd run` (appending to `log`) and wait for the `cycles`-th cycle.done
    of the log: (that event, wall s, CPU s of the tree, peak RSS, the process); `cold`:
    with an empty page cache."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if cold:
        drop_page_cache()
    with open(log, "ab") as err:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "cleanerd", "run", "-c", str(cfg_path)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    proc = psutil.Process(daemon.pid)
    _peak[0] = 0
    t_start = time.monotonic()
    try:
        first = wait_for_cycles(log, cycles, timeout_s=1800, proc=proc)
    except BaseException:
        daemon.kill()
        raise
    return first, time.monotonic() - t_start, tree_cpu(proc), _peak[0], daemon, proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--segments", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/cleanerd-idle"))
    parser.add_argument("--cold", action="store_true", help="empty the page cache first")
    args = parser.parse_args()

    root = args.dir / f"{args.partitions}x{args.segments}"
    data, state = root / "logs", root / "state"
    t0 = time.monotonic()
    write_partitions(data, args.partitions, args.segments)
    built_s = time.monotonic() - t0
    cfg_path = root / "cleanerd.yaml"
    cfg_path.write_text(yaml.safe_dump(config(data, state, backoff_ms=15_000)))
    log = root / "cleanerd.log"
    log.write_bytes(b"")

    shutil.rmtree(state / "known-segments", ignore_errors=True)  # as another tool left it
    first, startup_s, startup_cpu, peak_rss, daemon, proc = start(
        cfg_path, log, cycles=1, cold=args.cold
    )
    try:
        time.sleep(5)  # let follow-ups of the startup cycle (if any) and the first scans pass

        cpu0, wall0 = tree_cpu(proc), time.monotonic()
        time.sleep(args.seconds)
        idle_cpu, idle_wall = tree_cpu(proc) - cpu0, time.monotonic() - wall0

        cfg_path.write_text(yaml.safe_dump(config(data, state, backoff_ms=15_001)))
        cpu2, wall2 = tree_cpu(proc), time.monotonic()
        daemon.send_signal(signal.SIGHUP)
        revisit_wall = wait_until_idle(proc, timeout_s=600) - wall2
        revisit_cpu = tree_cpu(proc) - cpu2
    finally:
        daemon.send_signal(signal.SIGTERM)
        status = daemon.wait(timeout=300)
    cfg_path.write_text(yaml.safe_dump(config(data, state, backoff_ms=15_000)))
    again = start(cfg_path, log, cycles=first_cycles(log) + 1, cold=args.cold)
    # Killed after that first cycle, as by the OOM killer or a power loss: no marker;
    # its checkpoints, snapshots and known segments are there.
    again[4].send_signal(signal.SIGKILL)
    again[4].wait(timeout=300)
    crashed = start(cfg_path, log, cycles=first_cycles(log) + 1, cold=args.cold)
    crashed[4].send_signal(signal.SIGTERM)
    status = max(status, crashed[4].wait(timeout=300))

    cache = ", page cache empty" if args.cold else ""
    rows = [
        ("build the partitions (once, cached)", built_s, None),
        (
            f"start to first cycle ({first['partitions']} partitions, "
            f"{args.partitions * args.segments} segments), as built{cache}",
            startup_s,
            startup_cpu,
        ),
        (f"start to first cycle after the daemon's clean stop{cache}", again[1], again[2]),
        (f"start to first cycle after the daemon was killed (SIGKILL){cache}", *crashed[1:3]),
        (f"idle, {idle_wall:.0f} s", idle_wall, idle_cpu),
        ("one revisit cycle (SIGHUP until idle again)", revisit_wall, revisit_cpu),
    ]
    print(f"{'phase':<86} {'wall s':>8} {'cpu s':>8} {'% core':>7}")
    for name, wall, cpu in rows:
        cpu_text = "" if cpu is None else f"{cpu:8.2f}"
        share = "" if cpu is None or not wall else f"{100 * cpu / wall:6.2f}%"
        print(f"{name:<86} {wall:8.2f} {cpu_text:>8} {share:>7}")
    amortised = 100 * revisit_cpu / RETENTION_CHECK_S
    print(
        "peak RSS of the daemon's process tree up to its first cycle: "
        f"{peak_rss / 2**20:.0f} MB as built, {again[3] / 2**20:.0f} MB after its clean stop, "
        f"{crashed[3] / 2**20:.0f} MB after it was killed"
    )
    print(
        f"idle CPU: {100 * idle_cpu / idle_wall:.2f}% of a core "
        f"(target < 1%); with the revisit cycle every {RETENTION_CHECK_S} s amortised in: "
        f"{100 * idle_cpu / idle_wall + amortised:.2f}%; daemon exit status {status}"
    )


if __name__ == "__main__":
    main()
