"""Memory of the one-shot commands on one big segment of 1-record batches.

One partition whose closed segment holds `--mb` MB of 1-record batches (100-byte values,
keys drawn from `--keys`, a producer id on every batch as Kafka's default producer
writes them: a quiet changelog or CDC topic), and no index files (as a copied or
restored dir has none), is generated once (`bench/compaction.py`) into `--dir` and
copied afresh for each command. Each command is a whole process:

- `clean`: a first `cleanerd clean` (recovery of the dir, a roll of the active segment
  if due, the pass over the big segment, the swap);
- `plan` and `audit`: on the uncleaned copy (observe the dir, read the segment whole);
  `audit` with its default `--memory-mb` (512) and with `--memory-mb 128`: a partition
  of more candidate rows than that holds is read once per key bucket.

Every 10 ms the process tree's resident memory is read from /proc: `anon` (RssAnon,
the memory a process cannot give back: decoded columns, the offset map, code) and
`file` (RssFile: mapped segment pages, which belong to the page cache and are dropped
under pressure); the table shows each one's peak. References measured in the same run:
the segment's size, and `cat` of it (the bytes are in the page cache).

    python -m bench.memory [--mb 1024] [--keys 200000] [--dir DIR]

Before segments were decoded in windows (issue 12's follow-up), a first `clean` of 1 GiB
of 1-record batches peaked at 1.27 GB anonymous, `plan` at 0.93 GB, `audit` at 1.62 GB.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml

from bench import compaction
from cleanerd.records.header import Compression

REPO = Path(__file__).resolve().parents[1]
BATCH_BYTES = 182  # a 1-record batch: 61-byte header, 12-byte key, 100-byte value
SAMPLE_S = 0.01


def generate(root: Path, mb: int, keys: int) -> Path:
    """The partition dir under `root` (written once, kept between runs)."""
    d = root / "source" / compaction.TOPIC_DIR
    marker = root / f".bench-memory-{mb}-{keys}"
    if marker.exists():
        return d
    shutil.rmtree(root / "source", ignore_errors=True)
    compaction.SEGMENT_BYTES = mb * 1_000_000 + 1_000_000  # one closed segment
    compaction.generate(
        root / "source",
        value_size=100,
        codec=Compression.NONE,
        records=mb * 1_000_000 // BATCH_BYTES,
        keys=keys,
        per_batch=1,
        idempotent=True,
    )
    marker.touch()
    return d


def _rss(proc: psutil.Process) -> tuple[int, int]:
    """(RssAnon, RssFile) in bytes of `proc` and its children."""
    anon = file = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            with open(f"/proc/{p.pid}/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        anon += int(line.split()[1]) * 1024
                    elif line.startswith("RssFile:"):
                        file += int(line.split()[1]) * 1024
        except OSError:
            continue
    return anon, file


def measure(argv: list[str]) -> tuple[float, int, int]:
    """(wall s, peak anon, peak file) of the command `argv`, run to its end."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ps = psutil.Process(proc.pid)
    peak_anon = peak_file = 0
    while proc.poll() is None:
        try:
            anon, file = _rss(ps)
        except psutil.NoSuchProcess:
            break
        peak_anon, peak_file = max(peak_anon, anon), max(peak_file, file)
        time.sleep(SAMPLE_S)
    wall = time.monotonic() - t0
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.wait() != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{err[-2000:]}")
    return wall, peak_anon, peak_file


def fresh_copy(source: Path, work: Path) -> Path:
    """A copy of the partition in a log dir of its own, and its config."""
    shutil.rmtree(work, ignore_errors=True)
    logs = work / "logs"
    logs.mkdir(parents=True)
    shutil.copytree(source, logs / source.name)
    config = {
        "log.dirs": [str(logs)],
        "state_dir": str(work / "state"),
        "topics": {compaction.TOPIC: {"cleanup.policy": "compact"}},
    }
    path = work / "cleanerd.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


COMMANDS = (("plan",), ("audit",), ("audit", "--memory-mb", "128"), ("clean",))
WIDTH = 24


def row(argv: list[str], name: str, size: int) -> None:
    wall, anon, file = measure(argv)
    print(f"{name:<{WIDTH}} {wall:7.2f} {anon / 1e6:13.0f} {file / 1e6:13.0f} {anon / size:8.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=1024, help="MB of the big segment")
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/cleanerd-bench-memory"))
    args = parser.parse_args()
    source = generate(args.dir, args.mb, args.keys)
    segment = max(source.glob("*.log"), key=lambda p: p.stat().st_size)
    size = segment.stat().st_size
    batches = size // BATCH_BYTES
    print(f"one segment of {size / 1e6:,.0f} MB, about {batches:,} 1-record batches")
    header = f"{'command':<{WIDTH}} {'wall s':>7} {'peak anon MB':>13} {'peak file MB':>13}"
    print(f"{header} {'anon/seg':>9}")
    row(["cat", str(segment)], "cat", size)
    for command, *options in COMMANDS:
        config = fresh_copy(source, args.dir / "work")
        argv = [sys.executable, "-m", "cleanerd", command, "-c", str(config), *options]
        row(argv, " ".join([command, *options]), size)
    shutil.rmtree(args.dir / "work", ignore_errors=True)


if __name__ == "__main__":
    main()
