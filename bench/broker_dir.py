"""A broker-sized log dir: whole `cleanerd` commands on many partitions of small batches,
against `cat` of the same bytes, measured in the same run.

For each `--partitions` count, one template partition of `--total-mb` / partitions MB is
written with cleanerd's log library (5-record batches, 100-byte values, keys drawn from
2,000, segments of `--segment-mb`, indexes as a broker writes them, then a clean stop:
recovery point at the end, a producer snapshot, Kafka's clean-shutdown marker), and
copied to every partition. Then, each command a whole process (wall time; peak RSS of
the process and the workers it waited for):

- `cat`: read every `.log` file (the floor: the bytes are in the page cache);
- `plan, empty dir`: the fixed cost of a one-shot command;
- `plan, no snapshots/recovery point`: the dir as a broker that crashed leaves it
  (snapshots, checkpoints and marker removed): every batch is walked;
- `clean, first`: on that same dir (owner: recovery walks every segment, CRC checked,
  then compaction; it ends with a clean stop);
- `plan, later`: after that clean (snapshots, recovery point, marker): O(segments);
- `audit, after the clean`: every record of every segment decoded, CRC checked, and its
  key grouped (the deletion-deadline audit);
- `run, start to first cycle` with and without snapshots, recovery point and marker:
  the daemon from exec to its first `cycle.done`;
- `plan`, `audit` and `run` beside a live broker: the bench holds `.lock` (so cleanerd observes),
  there is no marker, and each active segment's two indexes are preallocated to 10 MiB
  as a running broker keeps them (a sparse tail after the written entries).

`ms/partition` is the time above the empty-dir plan, per partition; `x cat` is that
time over `cat`'s. Targets (issue 12): a later `plan` at most 5 ms per partition or 2x
`cat`, whichever is larger; a first open at 1 GB/s per core or better.

    python -m bench.broker_dir [--partitions 200,2000] [--total-mb 400] [--segment-mb 1]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gc
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import yaml

from cleanerd.log.files import CLEAN_SHUTDOWN_FILE_NAME, TopicPartition
from cleanerd.log.log_dir import LogDir
from cleanerd.log.partition_log import LogConfig
from cleanerd.records.batch import encode_batch
from cleanerd.records.record import Record

REPO = Path(__file__).resolve().parents[1]
TOPIC = "changelog"
NOW = time.time_ns() // 1_000_000 - 3_600_000
"""Record timestamps start an hour ago: a fresh dir, so no time rule (segment.ms) is due."""
_RSS = (
    "import resource, subprocess, sys\n"
    "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
    "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)


def template(root: Path, state: Path, mb: float, segment_bytes: int) -> int:
    """One partition of `mb` MB; its log bytes."""
    rng = random.Random(1)
    data, offset = bytearray(), 0
    while len(data) < mb * 1e6:
        records = [
            Record(offset + i, NOW + offset + i, b"key-%05d" % rng.randrange(2000), b"v" * 100)
            for i in range(5)
        ]
        data += encode_batch(records, base_offset=offset)
        offset += 5
    config = LogConfig(segment_bytes=segment_bytes)
    with LogDir.open(root, state_dir=state) as log_dir:
        plog = log_dir.create_partition(TopicPartition(TOPIC, 0), config=config)
        plog.append_batches(bytes(data))
        plog.prepare_clean_shutdown()
        log_dir.checkpoint_logs([plog])
        return sum(s.size for s in plog.segments)


def build(root: Path, count: int, mb: float, segment_bytes: int, *, cleaned: bool = False) -> int:
    """`count` copies of the template partition under `root / "logs"`, checkpointed as a
    clean stop leaves them; with `cleaned`, also as if compacted up to the active segment
    (`cleaner-offset-checkpoint`), so nothing is dirty."""
    shutil.rmtree(root, ignore_errors=True)
    logs, state = root / "logs", root / "state"
    logs.mkdir(parents=True)
    size = template(logs, state, mb, segment_bytes)
    first = logs / f"{TOPIC}-0"
    for n in range(1, count):
        shutil.copytree(first, logs / f"{TOPIC}-{n}")
    checkpoint = logs / "recovery-point-offset-checkpoint"
    lines = checkpoint.read_text().splitlines()
    entry = lines[2].split()
    body = [f"{TOPIC} {n} {entry[2]}" for n in range(count)]
    checkpoint.write_text("\n".join(["0", str(count), *body]) + "\n")
    if cleaned:
        active = max(int(p.name.split(".")[0]) for p in first.glob("*.log"))
        done = [f"{TOPIC} {n} {active}" for n in range(count)]
        (logs / "cleaner-offset-checkpoint").write_text("\n".join(["0", str(count), *done]) + "\n")
    (logs / CLEAN_SHUTDOWN_FILE_NAME).write_text('{"version":0,"brokerEpoch":-1}')
    return size * count


def crash_state(logs: Path) -> None:
    """What a crashed broker leaves: no snapshot, no checkpoint, no marker."""
    for snapshot in logs.glob("*/*.snapshot"):
        snapshot.unlink()
    for name in ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint"):
        (logs / name).unlink(missing_ok=True)
    (logs / CLEAN_SHUTDOWN_FILE_NAME).unlink(missing_ok=True)


@contextlib.contextmanager
def live_broker(logs: Path) -> Iterator[None]:
    """The dir as a running broker keeps it: `.lock` held (`lockf`, as the JVM takes it),
    no clean-shutdown marker, active segments' indexes preallocated (Java's
    `setLength` to `segment.index.bytes` in whole entries: a sparse extension)."""
    (logs / CLEAN_SHUTDOWN_FILE_NAME).unlink(missing_ok=True)
    for partition in logs.glob(f"{TOPIC}-*"):
        active = max(partition.glob("*.log"), key=lambda p: int(p.name.split(".")[0]))
        for suffix, entry in ((".index", 8), (".timeindex", 12)):
            # Kafka rounds segment.index.bytes down to whole entries.
            os.truncate(active.with_suffix(suffix), 10 * 2**20 // entry * entry)
    with open(logs / ".lock", "a") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield


def config(root: Path, logs: Path) -> Path:
    cfg = {
        "log.dirs": [str(logs)],
        "state_dir": str(root / "state"),
        "log.retention.disk.usage.percent": 99,
        "logging": {"format": "json", "level": "info"},
        "metrics": {"listen": "127.0.0.1:0"},
        "topics": {TOPIC: {"cleanup.policy": "compact"}},
    }
    path = root / "cleanerd.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def timed(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of `argv` as a whole process."""
    t = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", _RSS, *argv], capture_output=True, text=True, check=True
    )
    wall = time.perf_counter() - t
    status, rss_kb = out.stdout.split()
    if status not in ("0", "1"):
        raise SystemExit(f"{argv} exited {status}")
    return wall, int(rss_kb) / 1024


def cleanerd(*args: str) -> list[str]:
    return [sys.executable, "-m", "cleanerd", *args]


def first_cycle(cfg: Path, log: Path) -> tuple[float, float]:
    """Seconds from exec to the daemon's first `cycle.done`; its peak RSS (MB)."""
    t = time.perf_counter()
    with open(log, "wb") as err:
        daemon = subprocess.Popen(
            cleanerd("run", "-c", str(cfg)), stdout=subprocess.DEVNULL, stderr=err
        )
    proc, peak = psutil.Process(daemon.pid), 0
    try:
        while True:
            peak = max(peak, proc.memory_info().rss)
            if any(_is_cycle_done(line) for line in log.read_text().splitlines()):
                return time.perf_counter() - t, peak / 2**20
            if daemon.poll() is not None:
                raise SystemExit(f"cleanerd run exited {daemon.returncode}; see {log}")
            time.sleep(0.05)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=300)


def _is_cycle_done(line: str) -> bool:
    try:
        event: dict[str, Any] = json.loads(line)
    except json.JSONDecodeError:
        return False
    return event.get("event") in ("cycle.done", "cycle.idle")


def metadata_memory(logs: Path, state: Path) -> tuple[float, float, int]:
    """Bytes the log layer keeps per partition and per segment once every partition was
    opened and its metadata read (what the daemon caches between cycles), in process."""
    with LogDir.open(logs, observe=True, state_dir=state) as log_dir:
        partitions = list(log_dir.partitions())
        log_dir.open_partition(partitions[0]).meta()  # kernels loaded before counting
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        plogs = [log_dir.open_partition(tp) for tp in partitions]
        metas = [p.meta() for p in plogs]
        gc.collect()  # what stays, not what a collection would free
        used = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
    segments = sum(len(m.segments) for m in metas)
    return used / len(plogs), used / segments, segments


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", default="200,2000")
    parser.add_argument("--total-mb", type=float, default=400.0)
    parser.add_argument("--segment-mb", type=float, default=1.0)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = str(REPO)
    if args.dir:
        args.dir.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="cleanerd-broker-dir-", dir=args.dir))
    print(
        f"{'partitions':>10} {'case':<40} {'wall s':>8} {'ms/part':>8} {'x cat':>7} {'RSS MB':>7}"
    )
    try:
        for count in (int(x) for x in args.partitions.split(",")):
            root = base / str(count)
            total = build(root, count, args.total_mb / count, int(args.segment_mb * 2**20))
            logs = root / "logs"
            cfg = config(root, logs)
            empty = root / "empty"
            empty.mkdir()
            empty_cfg = config(empty, empty / "logs")
            (empty / "logs").mkdir()
            files = sorted(str(p) for p in logs.glob("*/*.log"))
            cat_s = min(
                timed(["sh", "-c", 'cat "$@" > /dev/null', "cat", *files])[0] for _ in range(3)
            )
            fixed_s, fixed_rss = timed(cleanerd("plan", "-c", str(empty_cfg)))
            rows = [("cat every .log", cat_s, None), ("plan, empty dir", fixed_s, fixed_rss)]
            crash_state(logs)
            rows.append(
                ("plan, no snapshots/recovery point", *timed(cleanerd("plan", "-c", str(cfg))))
            )
            rows.append(
                ("clean, first (recovery + compaction)", *timed(cleanerd("clean", "-c", str(cfg))))
            )
            rows.append(
                ("plan, later (after a clean stop)", *timed(cleanerd("plan", "-c", str(cfg))))
            )
            rows.append(("audit, after the clean", *timed(cleanerd("audit", "-c", str(cfg)))))
            rows.append(("run, start to first cycle", *first_cycle(cfg, root / "run1.log")))
            crash_state(logs)
            rows.append(
                ("run, start to first cycle, no snapshots", *first_cycle(cfg, root / "run2.log"))
            )
            # What the daemon keeps of a dir it stopped cleanly in; then a live broker's.
            per_partition, per_segment, segments = metadata_memory(logs, root / "state")
            with live_broker(logs):
                rows.append(
                    ("plan, beside a live broker", *timed(cleanerd("plan", "-c", str(cfg))))
                )
                rows.append(
                    ("audit, beside a live broker", *timed(cleanerd("audit", "-c", str(cfg))))
                )
                rows.append(
                    (
                        "run beside a live broker, to first cycle",
                        *first_cycle(cfg, root / "run3.log"),
                    )
                )
            print(
                f"{count:>10} ({total / 1e6:.0f} MB of .log in {segments} segments; metadata "
                f"cached: {per_partition / 1024:.1f} KiB per partition, that is "
                f"{per_segment / 1024:.1f} KiB per segment)"
            )
            for name, wall, rss in rows:
                per = "" if rss is None else f"{1000 * (wall - fixed_s) / count:8.2f}"
                ratio = "" if rss is None else f"{(wall - fixed_s) / cat_s:7.1f}"
                mem = "" if rss is None else f"{rss:7.0f}"
                print(f"{count:>10} {name:<40} {wall:8.2f} {per:>8} {ratio:>7} {mem:>7}")
            shutil.rmtree(root)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
