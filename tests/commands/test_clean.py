"""Tests of `cleanerd clean` end to end on a real log dir."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import yaml

from cleanerd.cli import main
from cleanerd.commands.clean import render_text
from cleanerd.config import load_config
from cleanerd.engine import local
from cleanerd.engine.first_reads import ReaderPool
from cleanerd.engine.local import LocalEngine
from cleanerd.log.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleanerd.log.files import TopicPartition
from cleanerd.log.known_segments import decode
from cleanerd.log.lock import LogDirLock
from cleanerd.log.partition_log import PartitionLog
from cleanerd.log.producer_state import ProducerState, write_snapshot
from cleanerd.maintenance import cycle
from cleanerd.maintenance.cycle import Maintenance
from cleanerd.maintenance.report import StepError, Unreadable
from cleanerd.records.batch import encode_batch
from cleanerd.records.record import Record
from cleanerd.records.walker import walk
from tests.builders import build_log, cycle_report, kv, set_base_offset
from tests.compaction.conftest import TP, LogBuilder, k, read_batches, view
from tests.paths import REPO

NOW = 1_700_000_000_000
MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR


def write_config(tmp_path: Path, other: Any = None, **topic: object) -> Path:
    """Topic `t` compacted with `topic`'s settings; `other` deleted, with `other`'s."""
    cfg = {
        "log.dirs": [str(tmp_path / "logs")],
        "state_dir": str(tmp_path / "state"),
        "topics": {
            "t": {"cleanup.policy": "compact", **topic},
            "other": {"cleanup.policy": "delete", **(other or {})},
        },
    }
    path = tmp_path / "cleanerd.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def build(tmp_path: Path) -> Path:
    log = LogBuilder(tmp_path / "logs")
    for i in range(30):
        log.append([(k(i % 3), k(i))], timestamps=[NOW - 10_000])
        if i % 10 == 9:
            log.roll()
    log.append([(k(0), None)], timestamps=[NOW])
    log.roll()
    log.append([(k(9), b"active")], timestamps=[NOW])
    return log.write()


def test_clean_compacts_prints_stats_and_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`clean` runs a pass, prints Kafka's stats block, moves the checkpoint, unlinks old files."""
    d = build(tmp_path)
    assert main(["clean", "-c", str(write_config(tmp_path)), "--now-ms", str(NOW)]) == 0
    out = capsys.readouterr().out
    assert "Log cleaner thread 0 cleaned log t-0 (dirty section = [0, 31])" in out
    assert "1 cleaning pass, 0 partitions uncleanable" in out
    v = view(d)
    assert v.keys == [k(1), k(2), k(9)]
    checkpoint = OffsetCheckpointFile(tmp_path / "logs" / CLEANER_OFFSET_CHECKPOINT).read()
    assert checkpoint == {TP: 31}
    assert not [p for p in d.iterdir() if p.name.endswith(".deleted")]


def test_clean_removes_tombstone_after_horizon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A later run past delete.retention.ms removes the stamped tombstone (horizon rule)."""
    d = build(tmp_path)
    cfg = str(write_config(tmp_path, **{"delete.retention.ms": 1000}))
    main(["clean", "-c", cfg, "--now-ms", str(NOW)])
    assert 30 in view(d).last_offsets
    assert main(["clean", "-c", cfg, "--now-ms", str(NOW + 1001)]) == 0
    assert "dirty section = [31, 31]" in capsys.readouterr().out
    batches = view(d)
    assert batches.keys == [k(1), k(2), k(9)]
    assert (30, 30) in zip(batches.bases, batches.last_offsets, strict=True)  # kept empty


def test_clean_skips_ineligible_and_other_topics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ratio of 1.0 is never exceeded: nothing is cleaned."""
    d = build(tmp_path)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    cfg = write_config(tmp_path, **{"min.cleanable.dirty.ratio": 1.0})
    assert main(["clean", "-c", str(cfg), "--now-ms", str(NOW)]) == 0
    after = {p.name: p.read_bytes() for p in d.iterdir()}
    # The clean stop adds a producer snapshot at the log end; no segment file changed.
    snapshots = {name for name in after if name.endswith(".snapshot")}
    assert len(snapshots) == 1
    assert {n: b for n, b in after.items() if n not in snapshots} == before
    assert "0 cleaning passes" in capsys.readouterr().out


def test_corrupt_segment_marks_partition_uncleanable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A corrupt batch in the range to clean: exit 1, reason printed, files unchanged."""
    d = build(tmp_path)
    seg = d / "00000000000000000010.log"
    data = bytearray(seg.read_bytes())
    data[100] ^= 0xFF
    seg.write_bytes(bytes(data))
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    assert main(["clean", "-c", str(write_config(tmp_path)), "--now-ms", str(NOW)]) == 1
    out = capsys.readouterr().out
    assert "t-0: uncleanable:" in out
    assert "00000000000000000010.log" in out
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before


@pytest.mark.parametrize("cut", [10, "zeros"], ids=["cut-short", "zeroed"])
def test_a_cleanly_stopped_active_segment_found_damaged_gets_one_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cut: int | str
) -> None:
    """A dir `clean` stopped cleanly, whose active segment's last batch was then cut
    short or zeroed: damage, and the next run says so again. The first run took the
    clean-shutdown marker away (and wrote none, having met damage), so the second opened
    the dir as after a crash and cut the flushed batch as a torn tail, exit 0."""
    d = build(tmp_path)
    cfg = str(write_config(tmp_path))
    assert main(["clean", "-c", cfg, "--now-ms", str(NOW)]) == 0
    assert (tmp_path / "logs" / ".kafka_cleanshutdown").exists()
    active = sorted(d.glob("*.log"))[-1]
    data = active.read_bytes()
    last = end = 0
    while end < len(data):  # to the last batch, by the batches' length fields
        last, end = end, end + 12 + int.from_bytes(data[end + 8 : end + 12], "big")
    active.write_bytes(data[:-10] if cut == 10 else data[:last] + bytes(len(data) - last))
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    capsys.readouterr()
    for _ in range(2):
        assert main(["clean", "-c", cfg, "--now-ms", str(NOW)]) == 1
        assert "t-0: uncleanable:" in capsys.readouterr().out
        assert {p.name: p.read_bytes() for p in d.iterdir()} == before


def test_a_lost_txnindex_keeps_no_aborted_record_over_a_committed_one(
    tmp_path: Path,
) -> None:
    """A crash lost the `.txnindex` of a segment whose aborted record supersedes a
    committed one of its key: the open rebuilds it from the ABORT marker, so the clean
    drops the aborted record and keeps the committed one. Without it, the clean kept
    `ABORTED` and deleted `good`, on either engine."""
    log = LogBuilder(tmp_path / "logs")
    log.append([(b"k", b"good")], timestamps=[NOW - DAY])
    log.append([(b"k", b"ABORTED")], pid=7, txn=True, timestamps=[NOW - DAY])
    log.abort(7)
    log.roll()
    log.append([(b"other", b"x")], timestamps=[NOW])
    d = log.write()
    (d / "00000000000000000000.txnindex").unlink()
    assert main(["clean", "-c", str(write_config(tmp_path)), "--now-ms", str(NOW)]) == 0
    plog = PartitionLog.open(d, read_only=True)
    assert [r.value for r in plog.records() if r.key == b"k"] == [b"good"]


def test_a_damaged_txnindex_is_the_partitions_error_not_a_checkpoints(tmp_path: Path) -> None:
    """A `.txnindex` that does not parse: the partition is uncleanable, said once with
    the file; the cycle's flush of its rolled segments meets the same damage, which is
    no failed checkpoint (it was logged as `checkpoint.flush_failed`, an error)."""
    d = build(tmp_path)
    (d / "00000000000000000010.txnindex").write_bytes(b"x" * 40)
    argv = [sys.executable, "-m", "cleanerd", "clean", "-c", str(write_config(tmp_path))]
    done = subprocess.run(
        [*argv, "--now-ms", str(NOW)], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert done.returncode == 1
    assert "t-0: uncleanable: corrupt index" in done.stdout
    assert "00000000000000000010.txnindex" in done.stdout
    assert "checkpoint.flush_failed" not in done.stderr
    assert "stop: checkpoint failed" not in done.stdout


def _symlink_outside(tmp_path: Path) -> str:
    victim = tmp_path / "outside" / "victim"
    victim.mkdir(parents=True)
    (victim / "00000000000000000000.log.deleted").write_bytes(b"keep me")
    (tmp_path / "logs" / "evil-0").symlink_to(victim)
    return "is a symlink to"


def _log_that_is_a_dir(tmp_path: Path) -> str:
    d = tmp_path / "logs" / "other-0"
    d.mkdir()
    (d / "00000000000000000000.log").mkdir()
    return "Is a directory"


@pytest.mark.parametrize(
    ("make", "name"), [(_symlink_outside, "evil-0"), (_log_that_is_a_dir, "other-0")]
)
def test_partition_that_cannot_be_opened_fails_the_command(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    make: Callable[[Path], str],
    name: str,
) -> None:
    """A partition that cannot be opened makes `clean` exit 1 with the partition and the
    reason printed (in --json too); the other partitions are still cleaned."""
    d = build(tmp_path)
    reason = make(tmp_path)
    cfg = str(write_config(tmp_path))
    assert main(["clean", "-c", cfg, "--now-ms", str(NOW)]) == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith(f"{name}: open failed: "))
    assert reason in line
    assert "1 cleaning pass, 0 partitions uncleanable, 1 step failed" in out
    assert view(d).keys == [k(1), k(2), k(9)]
    assert main(["clean", "-c", cfg, "--now-ms", str(NOW), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [(e["topic"], e["partition"], e["phase"]) for e in doc["errors"]] == [
        (name[:-2], 0, "open")
    ]
    assert reason in doc["errors"][0]["reason"]


def test_a_log_dir_with_a_malformed_root_checkpoint_is_offline_and_the_others_cleaned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One log dir's `cleaner-offset-checkpoint` is malformed: `clean` leaves that dir
    alone (the file as it is), cleans the other, names the dir and the file, exits 1."""
    d = build(tmp_path)
    other = tmp_path / "other-logs"
    shutil.copytree(tmp_path / "logs", other)
    bad = other / CLEANER_OFFSET_CHECKPOINT
    bad.write_text("0\n1\nt 0\n")
    cfg = yaml.safe_load(write_config(tmp_path).read_text())
    cfg["log.dirs"].append(str(other))
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["clean", "-c", str(path), "--now-ms", str(NOW)]) == 1
    out = capsys.readouterr().out
    assert f"{other}: offline, left alone: malformed checkpoint file {bad} line 3" in out
    assert "1 cleaning pass, 0 partitions uncleanable, 1 log dir offline" in out
    assert view(d).keys == [k(1), k(2), k(9)]
    assert bad.read_text() == "0\n1\nt 0\n"
    assert main(["clean", "-c", str(path), "--now-ms", str(NOW), "--json"]) == 1
    (offline,) = json.loads(capsys.readouterr().out)["offline"]
    assert offline["log_dir"] == str(other)
    assert str(bad) in offline["reason"]


def build_cycle(tmp_path: Path) -> tuple[Path, Path]:
    """`t-0`: written an hour ago into its active segment and idle since (files aged to
    match); `other-0` (delete policy): an expired segment and a fresh one."""
    log = LogBuilder(tmp_path / "logs")
    for i in range(10):
        log.append([(k(i % 2), k(i))], timestamps=[NOW - HOUR])
    t = log.write()
    other = build_log(
        tmp_path / "logs",
        [[[kv("a", "1", timestamp=NOW - 2 * DAY)]], [[kv("a", "2", timestamp=NOW)]]],
        state_dir=tmp_path / "state",
        tp=TopicPartition("other", 0),
    ).dir
    for f in [*t.iterdir(), *other.iterdir()]:
        os.utime(f, ns=((NOW - HOUR) * 1_000_000,) * 2)
    return t, other


def cycle_config(tmp_path: Path) -> Path:
    topic: dict[str, object] = {"max.compaction.lag.ms": MINUTE, "min.cleanable.dirty.ratio": 1.0}
    return write_config(tmp_path, {"retention.ms": DAY}, **topic)


def test_clean_runs_one_full_cycle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Roll (max lag), retention (retention.ms) and cleaning by the deadline, all printed."""
    t, other = build_cycle(tmp_path)
    assert main(["clean", "-c", str(cycle_config(tmp_path)), "--now-ms", str(NOW)]) == 0
    out = capsys.readouterr().out
    assert "t-0: rolled segment 0 (max.compaction.lag.ms, first batch 3600000 ms old)" in out
    assert "other-0: deleted segment 0 (" in out
    assert "retention.ms); log start offset 1" in out
    assert f"t-0: cleaned (max.compaction.lag.ms, {HOUR - MINUTE} ms overdue)" in out
    assert "1 segment rolled, 1 deleted by retention, 0 deleted for disk usage" in out
    assert view(t).keys == [k(0), k(1)]
    assert not list(other.glob("00000000000000000000.*"))  # unlinked before the exit


def test_clean_json_reports_the_cycle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints one JSON document (log lines go to stderr) with every phase."""
    build_cycle(tmp_path)
    cfg = str(cycle_config(tmp_path))
    assert main(["clean", "-c", cfg, "--now-ms", str(NOW), "--json", "--engine", "local"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(r["topic"], r["reason"]) for r in doc["rolled"]] == [("t", "max.compaction.lag.ms")]
    assert [(d["topic"], d["base_offset"], d["reason"]) for d in doc["deleted"]] == [
        ("other", 0, "retention.ms")
    ]
    assert [(c["topic"], c["end_offset"]) for c in doc["cleaned"]] == [("t", 10)]
    assert doc["cleaned"][0]["stats"]["messages_written"] == 2
    assert any(p.endswith("00000000000000000000.log.deleted") for p in doc["unlinked"])


def test_clean_topic_limits_the_cycle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--topic t leaves every other topic alone, retention included."""
    _, other = build_cycle(tmp_path)
    before = {p.name: p.read_bytes() for p in other.iterdir()}
    cfg = str(cycle_config(tmp_path))
    assert main(["clean", "-c", cfg, "--now-ms", str(NOW), "--topic", "t"]) == 0
    assert "1 cleaning pass," in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before


def test_a_log_dir_that_is_a_file_is_named_as_check_config_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A log dir that cannot be opened is named with its key, as check-config and run
    name it, not by the open's error on its `.lock` ('afile/.lock: Not a directory')."""
    afile = tmp_path / "afile"
    afile.write_text("")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"log.dirs: [{afile}]\nstate_dir: {tmp_path / 'state'}\n")
    assert main(["clean", "-c", str(cfg), "--now-ms", str(NOW)]) == 1
    assert capsys.readouterr().err == (
        f"cleanerd clean: no log dir could be opened: log.dirs[0]: {str(afile)!r} is a "
        "file, not a directory\n"
    )


def test_clean_names_a_topic_no_log_dir_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --topic that matches no partition (a typo, a partition's dir name) is named in
    the report, text and JSON, and does nothing; the one that matches is not named."""
    t, other = build_cycle(tmp_path)
    before = {d: {p.name: p.read_bytes() for p in d.iterdir()} for d in (t, other)}
    cfg = str(cycle_config(tmp_path))
    argv = ["clean", "-c", cfg, "--now-ms", str(NOW), "--topic", "nosuch", "--topic", "t-0"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "cycle: left alone: --topic nosuch matches no partition in the log dirs\n" in out
    assert (
        "--topic t-0 matches no partition in the log dirs (it names a partition of topic t)" in out
    )
    assert "0 cleaning passes" in out
    assert {d: {p.name: p.read_bytes() for p in d.iterdir()} for d in (t, other)} == before
    assert main([*argv, "--topic", "t", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    absent = [s["reason"] for s in doc["skipped"] if "matches no partition" in s["reason"]]
    assert [r.split(" matches")[0] for r in absent] == ["--topic nosuch", "--topic t-0"]
    assert len(doc["cleaned"]) == 1


def test_clean_names_no_absent_topic_while_a_log_dir_is_offline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A log dir that could not be listed may hold the topic: nothing is named."""
    build(tmp_path)
    cfg = yaml.safe_load(write_config(tmp_path).read_text())
    cfg["log.dirs"].append(str(tmp_path / "not-a-dir"))
    (tmp_path / "not-a-dir").write_text("a file")
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["clean", "-c", str(path), "--now-ms", str(NOW), "--topic", "nosuch"]) == 1
    out = capsys.readouterr().out
    assert "1 log dir offline" in out
    assert "matches no partition" not in out


def test_no_pass_once_every_passed_horizon_is_acted_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Once the tombstones past their horizon are gone, later cycles run no pass."""
    # The demo topic's shape: 40 keys updated again and again, every 15th write a
    # tombstone, batches of 20 records; a pass keeps stamped batches whose tombstones a
    # later pass drops, and their horizon must not make the log look due again.
    log = LogBuilder(tmp_path / "logs")
    for b in range(15):
        kvs = [(k((b * 20 + i) * 7 % 40), None if i % 15 == 14 else b"v") for i in range(20)]
        log.append(kvs, timestamps=[NOW - HOUR + b * MINUTE] * 20)
        if b in (6, 13):
            log.roll()
    log.write()
    path = write_config(tmp_path, **{"delete.retention.ms": MINUTE})

    def passes(now_ms: int) -> int:
        assert main(["clean", "-c", str(path), "--now-ms", str(now_ms), "--json"]) == 0
        return len(json.loads(capsys.readouterr().out)["cleaned"])

    assert passes(NOW) == 1  # stamps horizons at NOW + 1 min
    assert passes(NOW + 2 * MINUTE) == 1  # drops the tombstones past their horizon
    assert passes(NOW + 4 * MINUTE) == 0
    assert passes(NOW + HOUR) == 0


def test_dir_a_broker_holds_is_observed_and_fails_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A log dir whose `.lock` another program holds (a broker: no cleanerd owner marker)
    is observed only: `clean` says who holds it, changes nothing and exits 1."""
    d = build(tmp_path)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    holder = LogDirLock(tmp_path / "logs")  # this process, without cleanerd's owner marker
    holder.acquire()
    try:
        assert main(["clean", "-c", str(write_config(tmp_path))]) == 1
    finally:
        holder.release()
    out = capsys.readouterr().out
    lock = tmp_path / "logs" / ".lock"
    assert f"is held by pid {os.getpid()} (a running Kafka broker?): observed only" in out
    assert f"{tmp_path / 'logs'}: left alone: {lock} is held by pid" in out  # not jargon
    assert str(lock) in out
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before


_CHILDREN_AFTER = """
import json, sys
import psutil
from cleanerd.cli import main
status = main(sys.argv[1:])
sys.stdout.flush()
children = [p.name() for p in psutil.Process().children(recursive=True)]
print(json.dumps({"status": status, "children": children}), file=sys.stderr)
"""


def test_one_shot_clean_of_one_partition_starts_no_process(tmp_path: Path) -> None:
    """`clean` runs its one pass in its own process: no fork server, resource tracker or
    worker is started; the files are those a pass in a pool worker writes."""
    d = build(tmp_path)
    pooled = build(tmp_path / "pooled")
    config = write_config(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", _CHILDREN_AFTER, "clean", "-c", str(config), "--now-ms", str(NOW)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=REPO,
        timeout=300,
        check=False,
    )
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report == {"status": 0, "children": []}, done.stderr
    assert "1 cleaning pass," in done.stdout

    pool_config = write_config(tmp_path / "pooled")
    with (
        LocalEngine.from_config(load_config(pool_config)) as engine,
        Maintenance(load_config(pool_config), engine, clock=lambda: NOW) as maintenance,
    ):
        assert len(maintenance.run_once().cleaned) == 1
        engine.shutdown()
        maintenance.close(unlink_pending=True)
    assert engine.runs[0].pid != os.getpid()

    def contents(part: Path) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(part.iterdir())}

    assert contents(d) == contents(pooled)


def test_a_clean_of_many_first_opens_reads_segments_beside_its_opening(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`clean` of a dir with `MANY_OPENS` partitions that nothing is kept of (a retired
    broker's) has reader processes read their segments while it opens them, and takes
    what they read."""
    for n in range(3):
        build_log(
            tmp_path / "logs",
            [[[kv("a", str(i), timestamp=NOW)]] for i in range(4)],
            state_dir=tmp_path / "elsewhere",
            tp=TopicPartition("other", n),
        )
    monkeypatch.setattr(cycle, "MANY_OPENS", 3)
    answers: list[int] = []
    finished, stop = ReaderPool.finished, ReaderPool.stop

    def counted(futures: list[Future[bytes]]) -> list[Future[bytes]]:
        answers.extend(
            sum(map(len, decode(f.result(timeout=60)).segments.values()))
            for f in futures
            if not f.cancelled()
        )
        return futures

    # An answer is handed out once: by `finished` when it came during the opening,
    # else by `stop`.
    monkeypatch.setattr(ReaderPool, "finished", lambda pool: counted(finished(pool)))
    monkeypatch.setattr(ReaderPool, "stop", lambda pool: counted(stop(pool)))
    monkeypatch.setattr(local, "usable_cpus", lambda: 2)
    taken: list[int] = []
    take = PartitionLog.take_known

    def taking(plog: PartitionLog, known: Any) -> int:
        taken.append(take(plog, known))
        return taken[-1]

    monkeypatch.setattr(PartitionLog, "take_known", taking)

    assert main(["clean", "-c", str(write_config(tmp_path)), "--now-ms", str(NOW)]) == 0

    # One job, handed to the reader process at once (so never taken back): 4 segments,
    # the active one's too, in each of 3 partitions.
    assert answers == [12]
    assert sum(taken) == 12


def test_a_log_whose_markers_the_cleaner_emptied_opens_without_its_snapshots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Passes past the delete horizon empty a fencing marker (a control batch without a
    record, kept as its producer's last batch). With the producer snapshots gone (a
    retired dir copied without them, say), the next open walks that batch for producer
    state: `plan`, `audit` and `clean` all still run (they used to fail on it as a
    corrupt record)."""
    (tmp_path / "logs").mkdir()
    plog = PartitionLog.create(tmp_path / "logs", TP, state_dir=tmp_path / "state")
    for i in range(6):
        record = [Record(offset=0, timestamp=NOW - 10_000, key=k(i % 2), value=k(i))]
        plog.append(record, producer_id=9, producer_epoch=0, base_sequence=i, is_transactional=True)
        plog.append_end_txn_marker(9, 0, commit=i % 3 != 0, timestamp=NOW - 10_000)
    plog.append_end_txn_marker(9, 1, commit=False, timestamp=NOW - 10_000)  # a fence
    plog.roll()
    cfg = str(write_config(tmp_path, **{"delete.retention.ms": 0, "min.cleanable.dirty.ratio": 0}))
    for n in range(3):
        assert main(["clean", "-c", cfg, "--now-ms", str(NOW + n)]) == 0
    d = plog.dir
    table = walk((d / "00000000000000000000.log").read_bytes()).table
    assert (table.is_control & (table.records_count == 0)).any()  # the emptied marker
    for snapshot in d.glob("*.snapshot"):
        snapshot.unlink()
    capsys.readouterr()
    for command in ("plan", "audit", "clean"):
        assert main([command, "-c", cfg, "--now-ms", str(NOW + 3)]) == 0, command
        printed = capsys.readouterr()
        assert "corrupt" not in printed.out + printed.err, command


def test_a_torn_tail_the_open_cuts_is_in_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A torn last batch in the active segment (a crash mid-append) is cut when the dir
    is opened; the report says so, naming the file, position, bytes and the quarantine
    copy, in text and in `--json` (only a log line said it)."""
    d = build(tmp_path)
    active = sorted(d.glob("*.log"))[-1]
    size = active.stat().st_size
    with open(active, "ab") as f:
        f.write(active.read_bytes()[:40])  # a batch's first 40 bytes: a partial batch
    config = str(write_config(tmp_path))
    assert main(["clean", "-c", config, "--now-ms", str(NOW), "--json"]) == 0
    (cut,) = json.loads(capsys.readouterr().out)["truncated"]
    assert (cut["topic"], cut["partition"], cut["path"]) == ("t", 0, str(active))
    assert (cut["position"], cut["bytes_cut"]) == (size, 40)
    assert Path(cut["quarantined_to"]).read_bytes() == active.read_bytes()[:40]
    (tmp_path / "logs" / ".kafka_cleanshutdown").unlink()  # as a crash leaves it
    with open(active, "ab") as f:
        f.write(bytes(7) + b"\x01")
    assert main(["clean", "-c", config, "--now-ms", str(NOW)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"t-0: cut a torn tail of 8 bytes at position {size} of {active}" in "\n".join(lines)


def test_the_text_report_names_unreadable_partitions_once() -> None:
    """A partition that could not be read gets its own line, unless a failed step's line
    already gives its error."""
    opened, read = TopicPartition("a", 0), TopicPartition("b", 1)
    report = cycle_report(
        NOW,
        errors=(StepError("/l", opened, "open", "link refused"),),
        unreadable=(
            Unreadable("/l", opened, ("delete",), "link refused"),
            Unreadable("/l", read, ("compact",), "bad CRC at 0 in /l/b-1/0.log"),
        ),
    )
    lines = render_text(report)
    assert "a-0: open failed: link refused" in lines
    assert "b-1: unreadable: bad CRC at 0 in /l/b-1/0.log" in lines
    assert not [line for line in lines if line.startswith("a-0: unreadable")]


def test_damage_the_open_finds_stops_retention_and_is_found_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A deleted (not compacted) partition whose open finds a bad batch inside an old
    segment, where its metadata does not read (a big segment: only its tail): the cycle
    deletes the expired segments before it, keeps it and those after, and checkpoints
    no recovery point past it, so the next clean walks it and reports it again.
    Retention deleted it with every segment after it, and the recovery point moved
    past: the next clean exited 0, the damage gone unsaid."""
    log = LogBuilder(tmp_path / "logs")
    for i in range(2010):  # segment 10 is big: its metadata reads only its tail
        log.append([(k(i % 3), bytes(200))], timestamps=[NOW - 10_000])
        if i in (9, 2009):
            log.roll()
    log.append([(k(9), b"active")], timestamps=[NOW - 10_000])
    d = log.write()
    # A producer snapshot at the log end, as a clean stop leaves: the producer state is
    # read from it, and only the open's validation walks the old segments.
    write_snapshot(d, ProducerState(offset=2011), log_start_offset=0)
    seg = d / "00000000000000000010.log"
    position = set_base_offset(seg, 500, 10**12)
    data = seg.read_bytes()
    cfg = str(write_config(tmp_path, **{"cleanup.policy": "delete", "retention.ms": 1000}))
    for _ in range(2):
        assert main(["clean", "-c", cfg, "--now-ms", str(NOW + DAY)]) == 1
        assert f"{seg} at position {position}" in capsys.readouterr().out
        assert sorted(p.name for p in d.glob("*.log"))[0] == seg.name
        assert seg.read_bytes() == data
        checkpoint = (tmp_path / "logs" / "recovery-point-offset-checkpoint").read_text()
        assert int(checkpoint.split("\n")[2].split()[2]) <= 10


def test_a_clean_stopped_after_its_passes_ends_its_progress_as_stopped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C after a pass ran: the progress line ends "stopped", never "done"."""
    build(tmp_path)

    def interrupted(*_: object, **__: object) -> list[OSError]:
        raise KeyboardInterrupt

    monkeypatch.setattr(Maintenance, "checkpoint", interrupted)
    assert main(["clean", "-c", str(write_config(tmp_path)), "--now-ms", str(NOW)]) == 130
    last = capsys.readouterr().err.splitlines()[-1]
    assert "stopped after" in last
    assert "done" not in last


def test_a_tombstone_with_no_delete_retention_goes_in_one_clean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With `delete.retention.ms: 0` the horizon a pass stamps has passed at once, so the
    partition is eligible again: the same `clean` runs the second pass that removes the
    tombstone (it ended with `plan` still calling the partition eligible)."""
    d = build(tmp_path)
    cfg = str(write_config(tmp_path, **{"delete.retention.ms": 0}))
    assert main(["clean", "-c", cfg, "--now-ms", str(NOW)]) == 0
    out = capsys.readouterr().out
    assert "2 cleaning passes, 0 partitions uncleanable" in out
    assert "cleaned (delete.retention.ms" in out
    tombstones = [r for b in read_batches(d) for r in b.records if r.value is None]
    assert tombstones == []
    assert main(["plan", "-c", cfg, "--now-ms", str(NOW)]) == 0
    assert "compaction: not eligible" in capsys.readouterr().out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_clean_stops_its_passes_and_still_reports(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """Ctrl-C (or SIGTERM) during a pass: the pass stops before its swap, the log is left
    as it was, and the report of what the cycle did (its roll) is printed before the
    command exits as the signal says (128 + its number); the progress line does not count
    the stopped pass as failed. It printed nothing, with the pass counted as failed."""
    log = LogBuilder(tmp_path / "logs")
    for i in range(6000):
        log.append([(k(i % 100), b"v" * 100)], timestamps=[NOW - DAY])
        if i % 2000 == 1999:
            log.roll()
    log.append([(k(0), b"active")], timestamps=[NOW])
    d = log.write()
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.suffix == ".log"}
    config = write_config(tmp_path)
    data = yaml.safe_load(config.read_text())
    data["log.cleaner.io.max.bytes.per.second"] = 100_000  # a pass of seconds
    data["logging"] = {"level": "debug"}  # `clean.submitted`: the pass has begun
    config.write_text(yaml.safe_dump(data))
    argv = [sys.executable, "-m", "cleanerd", "clean", "-c", str(config), "--now-ms", str(NOW)]
    proc = subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        err = ""
        while "clean.submitted" not in err:  # then its map build sleeps in the throttle
            line = proc.stderr.readline()
            assert line, proc.communicate()
            err += line
        proc.send_signal(sig)
        out, rest = proc.communicate(timeout=60)
        err += rest
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, err
    assert "interrupted: the passes in flight were stopped" in out
    assert "0 segments rolled, 0 deleted by retention" in out
    assert "0 cleaning passes" in out
    assert "failed)" not in err
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.name in before} == before
    assert not [p for p in d.iterdir() if p.name.endswith((".cleaned", ".swap"))]


@pytest.mark.parametrize("time_index", ["missing", "emptied"])
def test_retention_dates_a_segment_whose_time_index_has_no_entries_by_its_batches(
    tmp_path: Path, time_index: str
) -> None:
    """After a clean shutdown (the open checks no old segment), a segment whose newest
    record is 30 minutes old, first in the segment, and whose `.timeindex` is gone or
    empty: with retention.ms one hour, neither `plan` nor `clean` deletes it, and 31
    minutes later both do. They took its newest record to be that of the batches after
    the last offset-index entry, 9 hours old, and deleted it 8.5 hours early."""
    log = LogBuilder(tmp_path / "logs", index_interval=100)
    log.append([(k(0), b"newest")], timestamps=[NOW - 30 * MINUTE])
    for i in range(1, 20):
        log.append([(k(i), b"old")], timestamps=[NOW - 9 * HOUR])
    log.roll()
    log.append([(k(99), b"active")], timestamps=[NOW])
    part = log.write()
    (tmp_path / "logs" / ".kafka_cleanshutdown").touch()
    first = part / "00000000000000000000.log"
    index = part / "00000000000000000000.timeindex"
    if time_index == "missing":
        index.unlink()
    else:
        index.write_bytes(b"")
    config = write_config(tmp_path, **{"cleanup.policy": "delete", "retention.ms": HOUR})
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def deleted(command: str, now_ms: int) -> list[int]:
        argv = [sys.executable, "-m", "cleanerd", command, "-c", str(config), "--json"]
        done = subprocess.run([*argv, "--now-ms", str(now_ms)], capture_output=True, env=env)
        assert done.returncode == 0, done.stderr
        return [d["base_offset"] for d in json.loads(done.stdout)["deleted"]]

    assert deleted("plan", NOW) == deleted("clean", NOW) == []
    assert first.exists()
    later = NOW + 31 * MINUTE
    assert deleted("plan", later) == deleted("clean", later) == [0]
    assert not first.exists()


def test_a_torn_tail_after_a_clean_shutdown_stays_damage_through_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Half a batch at the end of the active segment of a dir a clean stop left (its
    marker there: no writer of cleanerd's was in flight) is damage, as the open reports
    it, and the run leaves the bytes where they are, while retention deletes the
    expired segments before it. The retention step's write lock judged the tail by the
    recovery point alone and cut it as a killed writer's partial batch, in the run that
    had reported it as damage."""
    build(tmp_path)
    config = tmp_path / "cleanerd.yaml"
    head = f"log.dirs: [{tmp_path / 'logs'}]\nstate_dir: {tmp_path / 'state'}\n"
    config.write_text(head + "topics: {t: {cleanup.policy: delete, retention.ms: -1}}\n")
    assert main(["clean", "-c", str(config), "--now-ms", str(NOW)]) == 0
    assert (tmp_path / "logs" / ".kafka_cleanshutdown").exists()
    active = sorted((tmp_path / "logs" / "t-0").glob("*.log"))[-1]
    end = PartitionLog.open(active.parent, read_only=True).log_end_offset
    whole = encode_batch([Record(end, 0, b"k", b"t" * 500, ())], base_offset=end)
    with active.open("ab") as f:
        f.write(whole[: len(whole) // 2])
    torn = active.read_bytes()
    config.write_text(head + "topics: {t: {cleanup.policy: delete, retention.ms: 5000}}\n")
    capsys.readouterr()
    assert main(["clean", "-c", str(config), "--now-ms", str(NOW)]) == 1
    out = capsys.readouterr().out
    assert "t-0: deleted segment 20 " in out
    assert f"t-0: open failed: corrupt record batch in {active} at position " in out
    assert "cut a torn tail" not in out
    assert active.read_bytes() == torn
