"""The workload `cleanerd build-kernels` runs before it compiles (`python -m` this module,
in a process of its own, with `CLEANERD_AOT=0`).

The build compiles each kernel for the argument types numba's cache holds, which are the
ones this host's processes called it with. A host that has run little (a first start, a
new image, only `clean`s of dirs as a crash leaves them) misses types its next runs use,
and a process that meets one loads numba after all (0.1-0.2 s). So the build first runs
the commands an operator runs, here, through numba (which caches every signature it
compiles), on small logs of every shape, written through the log library into a
temporary dir under the kernel cache root (the one dir the build may write to):

- one compacted topic per codec and batch size (1 and 20 records per batch), with keys
  that repeat, tombstones, headers, and idempotent producers on every other batch; one
  under the timestamp strategy and one under the header strategy; one with committed
  and aborted transactions; one whose segment is bigger than a decode window, so the
  windowed paths run; one under a delete policy whose old segments retention deletes;
- `clean` of the dir as a crash leaves it (segment files only: every batch validated,
  indexes rebuilt), then more records appended (a writer's reopen), then `clean` of the
  dir as the first clean's stop left it (recovery point, snapshots, clean-shutdown
  marker), then `plan`, `audit`, and `dump` of each kind of file.

The dir is removed at the end, whatever happened. Exit status 0, or 1 with what failed
(the build then compiles what the cache holds, and says the warm-up failed).
"""

from __future__ import annotations

import contextlib
import io
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from cleanerd import _aot
from cleanerd.commands.produce import open_for_append
from cleanerd.compaction import offset_map
from cleanerd.config import load_config
from cleanerd.log.partition_log import PartitionLog
from cleanerd.records.header import Compression
from cleanerd.records.record import Record, RecordHeader
from cleanerd.records.walker import DECODE_WINDOW_BYTES

NOW_MS: Final = 1_800_000_000_000
DAY_MS: Final = 86_400_000
FIRST_MS: Final = NOW_MS - 10 * DAY_MS  # the records' first timestamp: past retention
RECORDS: Final = 120  # per partition and writing round
SEGMENTS: Final = 3  # per partition and writing round
TXN_TOPIC: Final = "warm-txn"
DELETE_TOPIC: Final = "warm-delete"
BIG_TOPIC: Final = "warm-big"
BIG_SEGMENT_BYTES: Final = DECODE_WINDOW_BYTES + 2 * 1024 * 1024


def _compacted_topics() -> dict[str, tuple[Compression, int, str]]:
    """Topic -> (codec, records per batch, topic settings) of the compacted topics."""
    topics = {
        f"warm-{codec.name.lower()}-{per_batch}": (codec, per_batch, "{}")
        for codec in Compression
        for per_batch in (1, 20)
    }
    topics["warm-timestamp"] = (Compression.NONE, 20, "{compaction.strategy: timestamp}")
    topics["warm-header"] = (
        Compression.LZ4,
        20,
        "{compaction.strategy: header, compaction.strategy.header: version}",
    )
    return topics


def config_text(root: Path) -> str:
    """The config the warm-up's commands run under, its log dir `root/logs`."""
    topics = {name: settings for name, (_, _, settings) in _compacted_topics().items()}
    topics[BIG_TOPIC] = "{}"
    topics[TXN_TOPIC] = "{}"
    topics[DELETE_TOPIC] = "{cleanup.policy: delete}"
    return "\n".join(
        [
            f"log.dirs: [{root / 'logs'}]",
            f"state_dir: {root / 'state'}",
            "log.cleanup.policy: compact",
            "log.cleaner.min.cleanable.ratio: 0.0",
            f"log.retention.ms: {7 * DAY_MS}",
            "topics:",
            *(f"  {name}: {settings}" for name, settings in topics.items()),
            "",
        ]
    )


def _records(round_: int) -> Iterator[Record]:
    """`RECORDS` records over 13 keys, one in 11 a tombstone, every third with a version
    header, timestamps a second apart from `FIRST_MS`."""
    for i in range(RECORDS):
        n = round_ * RECORDS + i
        value = None if n % 11 == 10 else b"value-%d" % n
        headers = (RecordHeader("version", b"%d" % (n % 7)),) if n % 3 == 0 else ()
        yield Record(0, FIRST_MS + 1000 * n, b"key-%d" % (n % 13), value, headers)


def _write(log: PartitionLog, codec: Compression, per_batch: int, round_: int) -> None:
    """Writing round `round_` of a topic: `per_batch` records a batch in `codec`, every
    other batch by an idempotent producer, rolled into `SEGMENTS` segments."""
    records = list(_records(round_))
    per_segment = -(-len(records) // SEGMENTS)
    for n, start in enumerate(range(0, len(records), per_batch)):
        producer = (9, 0, round_ * RECORDS + start) if n % 2 else (-1, -1, -1)
        log.append(
            records[start : start + per_batch],
            compression=codec,
            producer_id=producer[0],
            producer_epoch=producer[1],
            base_sequence=producer[2],
        )
        if (start + per_batch) % per_segment < per_batch:
            log.roll()


def _write_transactions(log: PartitionLog, round_: int) -> None:
    """Transactions of 10 records by two producers in turn, every third aborted."""
    records = list(_records(round_))
    for n, start in enumerate(range(0, len(records), 10)):
        pid = 20 + n % 2
        log.append(
            records[start : start + 10],
            producer_id=pid,
            producer_epoch=0,
            base_sequence=round_ * RECORDS + start,
            is_transactional=True,
        )
        log.append_end_txn_marker(pid, 0, commit=n % 3 != 2, timestamp=NOW_MS - DAY_MS)
        if n % 4 == 3:
            log.roll()


def _write_big(log: PartitionLog) -> None:
    """One segment bigger than a decode window (so the windowed paths run), then roll."""
    value = bytes(1000)
    n = 0
    while log.active_segment.size < BIG_SEGMENT_BYTES:
        batch = [Record(0, FIRST_MS + n + i, b"key-%d" % ((n + i) % 100), value) for i in range(50)]
        log.append(batch, compression=Compression.NONE)
        n += len(batch)
    log.roll()


def write_logs(root: Path, round_: int) -> None:
    """Append writing round `round_` of every topic's partition 0."""
    config = load_config(root / "cleanerd.yaml")
    for topic, (codec, per_batch, _) in _compacted_topics().items():
        with open_for_append(config, f"{topic}-0") as log:
            _write(log, codec, per_batch, round_)
    if round_ == 0:
        with open_for_append(config, f"{BIG_TOPIC}-0") as log:
            _write_big(log)
    with open_for_append(config, f"{TXN_TOPIC}-0") as log:
        _write_transactions(log, round_)
    with open_for_append(config, f"{DELETE_TOPIC}-0") as log:
        _write(log, Compression.ZSTD, 20, round_)


def as_a_crash_leaves_it(logs: Path) -> None:
    """Remove all but the segment files: no index, checkpoint, snapshot or marker."""
    for path in sorted(logs.rglob("*")):
        if path.is_file() and path.suffix != ".log":
            path.unlink()


def _command(*words: str) -> None:
    """Run a cleanerd command in this process, its output discarded; raise if it fails."""
    from cleanerd.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = main(list(words))
    if status != 0:
        raise RuntimeError(f"`cleanerd {' '.join(words)}` exited {status}:\n{out.getvalue()}")


def warm_up(root: Path) -> None:
    """The whole workload (see the module docstring) in the empty dir `root`. Offset
    maps start with a few slots, so that their growth (which a round of more than
    `FIRST_ACTIVE_SLOTS / 2` keys meets) runs on these few keys too."""
    offset_map.FIRST_ACTIVE_SLOTS = 16
    config = root / "cleanerd.yaml"
    config.write_text(config_text(root))
    (root / "logs").mkdir()
    common = ("-c", str(config), "--now-ms", str(NOW_MS))
    write_logs(root, 0)
    as_a_crash_leaves_it(root / "logs")
    _command("clean", *common, "--engine", "local")
    write_logs(root, 1)
    _command("clean", *common, "--engine", "local")
    _command("plan", *common)
    _command("audit", *common, "--engine", "local")
    for topic in ("warm-zstd-20-0", f"{TXN_TOPIC}-0", f"{BIG_TOPIC}-0"):
        files = sorted(str(p) for p in (root / "logs" / topic).iterdir() if p.is_file())
        _command("dump", "--deep-iteration", *files)
        _command("dump", "--json", "--print-data-log", *files)


def main() -> int:
    """Warm up in a temporary dir under the kernel cache root (argv[1])."""
    parent = Path(sys.argv[1])
    parent.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=_aot.scratch_prefix("warm-up"), dir=parent))
    try:
        warm_up(root)
    except Exception as exc:  # noqa: BLE001 - reported whole to the build, which goes on
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
