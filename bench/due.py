"""Time rules falling due one after another: the daemon on many partitions whose
segments expire each at its own instant.

`--partitions` partitions of a `delete` topic (`retention.ms` one day), each of
`--segments` segments of two 5-record batches, are written with cleanerd's log library
and stopped cleanly (recovery point, marker). Their segments' timestamps are spread so
that, from `--lead` seconds after the build begins, one segment expires every
`--step-ms` somewhere on the host (partition by partition, oldest segment first): the
shape of a host of thousands of partitions that roll and expire at scattered times.

Then `cleanerd run` (a whole process) is measured over `--seconds` from the first
expiry: the CPU of its process tree, the cycles it ran, the deletions it made and how
late each came after its due time (`segment.deleted`'s timestamp less the instant
`retention.ms` passed). Twice, in the same run: as configured (`log.cleaner.backoff.ms`
15 s, so cycles started by rules falling due wait nine times the last cycle's length,
at most 15 s: `steps.due_wait_ms`), and with `log.cleaner.backoff.ms: 0` as the
reference, which leaves those cycles unpaced (one after another, as soon as a rule is
due).

    python -m bench.due [--partitions 2000] [--segments 10] [--step-ms 15]
                        [--seconds 60] [--lead 120] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

from bench.idle import tree_cpu
from cleanerd.log.files import TopicPartition
from cleanerd.log.log_dir import LogDir
from cleanerd.log.partition_log import LogConfig
from cleanerd.log_setup import configure_logging
from cleanerd.records.batch import encode_batch
from cleanerd.records.record import Record

TOPIC = "events"
RETENTION_MS = 86_400_000
RECORDS_PER_SEGMENT = 10


def build(
    logs: Path, state: Path, *, partitions: int, segments: int, step_ms: int, t0: int
) -> None:
    """Segment k of partition n expires at `t0 + (k * partitions + n) * step_ms`."""
    with LogDir.open(logs, state_dir=state) as log_dir:
        plogs = []
        for n in range(partitions):
            tp = TopicPartition(TOPIC, n)
            plog = log_dir.create_partition(tp, config=LogConfig(segment_bytes=1500))
            data, offset = bytearray(), 0
            for k in range(segments + 1):  # the last one stays active
                ts = t0 - RETENTION_MS + (k * partitions + n) * step_ms
                for _ in range(2):
                    batch = [Record(offset + i, ts, b"k%d" % i, b"v" * 100) for i in range(5)]
                    data += encode_batch(batch, base_offset=offset)
                    offset += 5
            plog.append_batches(bytes(data))
            plog.prepare_clean_shutdown()
            plogs.append(plog)
        log_dir.checkpoint_logs(plogs)
        log_dir.mark_clean_shutdown()


def config(root: Path, logs: Path, backoff_ms: int) -> Path:
    cfg = {
        "log.dirs": [str(logs)],
        "state_dir": str(root / "state"),
        "log.cleaner.backoff.ms": backoff_ms,
        "log.retention.disk.usage.percent": 99,
        "logging": {"format": "json", "level": "info"},
        "metrics": {"listen": "127.0.0.1:0"},
        "topics": {TOPIC: {"cleanup.policy": "delete", "retention.ms": RETENTION_MS}},
    }
    path = root / f"cleanerd-{backoff_ms}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def events(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def measure(args: argparse.Namespace, root: Path, backoff_ms: int) -> dict[str, Any]:
    """Build the partitions afresh, run the daemon and measure it from the first expiry."""
    shutil.rmtree(root, ignore_errors=True)
    logs = root / "logs"
    logs.mkdir(parents=True)
    t0 = time.time_ns() // 1_000_000 + int(args.lead * 1000)
    build(
        logs,
        root / "state",
        partitions=args.partitions,
        segments=args.segments,
        step_ms=args.step_ms,
        t0=t0,
    )
    if time.time_ns() // 1_000_000 > t0 - 5_000:
        raise SystemExit(f"building took longer than --lead {args.lead} s less 5 s: raise it")
    log = root / "daemon.log"
    with open(log, "wb") as err:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "cleanerd", "run", "-c", str(config(root, logs, backoff_ms))],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    proc = psutil.Process(daemon.pid)
    try:
        while time.time_ns() // 1_000_000 < t0:
            if daemon.poll() is not None:
                raise SystemExit(f"cleanerd run exited {daemon.returncode}; see {log}")
            time.sleep(0.05)
        cpu, wall = tree_cpu(proc), time.perf_counter()
        time.sleep(args.seconds)
        cpu, wall = tree_cpu(proc) - cpu, time.perf_counter() - wall
        end_ms = time.time_ns() // 1_000_000
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=300)
    lines = events(log)
    late = []
    for e in lines:
        if e.get("event") != "segment.deleted":
            continue
        k = int(e["base_offset"]) // RECORDS_PER_SEGMENT
        due = t0 + (k * args.partitions + int(e["partition"])) * args.step_ms + 1
        at = round(time.mktime(time.strptime(e["timestamp"][:19], "%Y-%m-%dT%H:%M:%S")) * 1000)
        at += round(float("0" + e["timestamp"][19:-1]) * 1000) - round(time.timezone * 1000)
        if t0 <= due <= end_ms:
            late.append(at - due)
    due_in_window = min(args.seconds * 1000 // args.step_ms, args.partitions * args.segments)
    cycles = [e for e in lines if e.get("event") == "cycle.done" and e.get("trigger") != "startup"]
    return {
        "cpu": 100 * cpu / wall,
        "cycles": len(cycles),
        "cycle_s": statistics.median(c["duration_s"] for c in cycles) if cycles else 0.0,
        "deleted": len(late),
        "due": due_in_window,
        "late_median_s": statistics.median(late) / 1000 if late else float("nan"),
        "late_max_s": max(late) / 1000 if late else float("nan"),
        "exit": daemon.returncode,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=2000)
    parser.add_argument("--segments", type=int, default=10)
    parser.add_argument("--step-ms", type=int, default=15)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--lead", type=float, default=120.0, help="seconds from build to expiry")
    parser.add_argument("--dir", type=Path, default=None, help="scratch dir")
    args = parser.parse_args()
    configure_logging(level="warning")  # the build's rolls are not the measure
    print(
        f"{args.partitions} partitions x {args.segments} segments, one expiring every "
        f"{args.step_ms} ms; `cleanerd run` measured for {args.seconds} s from the first"
    )
    header = (
        f"{'cycles started by due rules':<36} {'% core':>7} {'cycles':>6} {'median s':>8} "
        f"{'deleted':>9} {'late median s':>13} {'late max s':>10} {'exit':>4}"
    )
    print(header)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for label, backoff_ms in (("paced (backoff 15 s)", 15_000), ("unpaced (backoff 0)", 0)):
            r = measure(args, Path(tmp) / "run", backoff_ms)
            print(
                f"{label:<36} {r['cpu']:>6.1f}% {r['cycles']:>6} {r['cycle_s']:>8.2f} "
                f"{r['deleted']:>4}/{r['due']:<4} {r['late_median_s']:>13.2f} "
                f"{r['late_max_s']:>10.2f} {r['exit']:>4}",
                flush=True,
            )


if __name__ == "__main__":
    main()
