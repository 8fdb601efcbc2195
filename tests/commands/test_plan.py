"""Tests of `cleanerd plan` as a whole process: its report on stdout, its log on stderr."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest

from cleanerd.log.files import TopicPartition
from tests.builders import DEFAULT_TP, build_log, kv
from tests.compaction.conftest import LogBuilder, k
from tests.holders import HOLD_BROKER_LOCK, HOLD_OWNER_LOCK, held_by_other_process
from tests.paths import REPO


def test_json_report_stays_parseable_when_a_warning_is_logged(tmp_path: Path) -> None:
    """A file named like a segment but not one is reported with a warning when its
    partition is opened; with `--json` that line goes to stderr and stdout holds the
    report alone (the log went to stdout before, in front of the JSON document)."""
    log = LogBuilder(tmp_path / "logs")
    log.append([(k("a"), b"1")])
    (log.write() / "00000000000000000abc.log").touch()
    config = tmp_path / "cleanerd.yaml"
    config.write_text(
        f"log.dirs: [{tmp_path / 'logs'}]\nstate_dir: {tmp_path / 'state'}\n"
        "topics:\n  t: {cleanup.policy: compact}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "cleanerd", "plan", "-c", str(config), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0
    assert "partition.malformed_file_name" in done.stderr
    assert "00000000000000000abc.log" in done.stderr
    assert [p["topic"] for p in json.loads(done.stdout)["partitions"]] == ["t"]


def _plan_command(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """`cleanerd plan` of `<tmp_path>/logs`, every topic compacted, and its environment."""
    config = tmp_path / "cleanerd.yaml"
    config.write_text(
        f"log.dirs: [{tmp_path / 'logs'}]\nstate_dir: {tmp_path / 'state'}\n"
        "log.cleanup.policy: compact\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return [sys.executable, "-m", "cleanerd", "plan", "-c", str(config)], env


def test_a_partition_with_a_bad_batch_is_listed_unreadable(tmp_path: Path) -> None:
    """A CRC mismatch in an old segment, where the partition's head is read, leaves
    nothing but retention before the damage to plan for that partition: it is still
    listed (text and JSON), with the error naming the file and position, beside the
    other partitions' plans, and the exit status is 1. It was left out of the report
    before."""
    log = LogBuilder(tmp_path / "logs")
    log.append([(k("a"), b"1")])
    log.roll()
    log.append([(k("a"), b"2")])
    part = log.write()
    good = LogBuilder(tmp_path / "logs")
    good.dir = tmp_path / "logs" / "u-0"
    good.dir.mkdir()
    good.append([(k("b"), b"1")])
    good.write()
    first = part / "00000000000000000000.log"
    data = bytearray(first.read_bytes())
    data[-1] ^= 0xFF  # the last value byte: the batch's CRC no longer matches
    first.write_bytes(bytes(data))
    command, env = _plan_command(tmp_path)
    text = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    doc = subprocess.run([*command, "--json"], capture_output=True, text=True, env=env, check=False)
    assert text.returncode == doc.returncode == 1
    lines = text.stdout.splitlines()
    at = lines.index(f"t-0 in {tmp_path / 'logs'} (compact)")
    assert lines[at + 1].startswith(
        "  unreadable, neither rolled nor cleaned: corrupt record batch in "
    )
    assert f"{first} at position 0: CRC mismatch" in lines[at + 1]
    # The cycle marks a damaged compacted partition uncleanable before its retention.
    assert lines[at + 2] == "  retention: skipped (partition is uncleanable)"
    assert sum(line.startswith("t-0 in ") for line in lines) == 1
    assert any(line.startswith("u-0 in ") for line in lines)
    assert doc.stderr.count("cleanerd plan: ") == 1  # each error named on stderr
    assert f"{first} at position 0: CRC mismatch" in doc.stderr
    report = json.loads(doc.stdout)
    damaged, healthy = report["partitions"]
    assert (damaged["topic"], healthy["topic"], healthy["damage"]) == ("t", "u", None)
    assert f"{first} at position 0: CRC mismatch" in damaged["damage"]
    assert damaged["roll"] is damaged["compaction"] is None
    assert damaged["retention"]["deletions"] == []
    assert damaged["retention"]["skipped"] == "partition is uncleanable"
    assert [(x["topic"], x["phase"]) for x in report["skipped"]] == [("t", "retention")]
    (unreadable,) = report["unreadable"]
    assert (unreadable["topic"], unreadable["partition"]) == ("t", 0)
    assert f"{first} at position 0: CRC mismatch" in unreadable["reason"]


def test_a_dir_held_by_another_process_is_said_to_be_only_observed(tmp_path: Path) -> None:
    """While a broker holds the dir's `.lock`, the plan says at its head that cleanerd
    only observes the dir (naming the holder's pid), and `--json` lists it under
    `observed`; without a holder neither does. Another cleanerd owner is named so."""
    log = LogBuilder(tmp_path / "logs")
    log.append([(k("a"), b"1")])
    log.write()
    command, env = _plan_command(tmp_path)

    def plan() -> tuple[str, list[dict[str, str]]]:
        text = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
        doc = subprocess.run(
            [*command, "--json"], capture_output=True, text=True, env=env, check=True
        )
        return text.stdout.splitlines()[0], json.loads(doc.stdout)["observed"]

    head, observed = plan()
    assert head.startswith("t-0 in ")
    assert observed == []
    with held_by_other_process(HOLD_BROKER_LOCK, tmp_path / "logs"):
        head, observed = plan()
    assert head.startswith(f"{tmp_path / 'logs'}: only observed (.lock held by pid ")
    assert "(a running Kafka broker?)): cleanerd changes nothing there" in head
    (entry,) = observed
    assert entry["log_dir"] == str(tmp_path / "logs")
    assert entry["reason"].startswith(".lock held by pid ")
    with held_by_other_process(HOLD_OWNER_LOCK, tmp_path / "logs", tmp_path / "state"):
        head, observed = plan()
    # Named as `clean` and `check-config` name it: another cleanerd, not a broker.
    assert head.startswith(f"{tmp_path / 'logs'}: only observed (.lock held by cleanerd (pid ")
    assert ": a running daemon or another command owns it)): cleanerd changes" in head
    assert observed[0]["reason"].startswith(".lock held by cleanerd (pid ")


def test_a_device_is_named_as_the_metrics_label_it(tmp_path: Path) -> None:
    """The text and the JSON name a log dir's device `MAJOR:MINOR`, as lsblk and the
    `device` label of `cleanerd_disk_usage_ratio` do (they gave the raw `st_dev`, 65024
    for 254:0)."""
    log = LogBuilder(tmp_path / "logs")
    log.append([(k("a"), b"1")])
    log.write()
    command, env = _plan_command(tmp_path)
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    dev = (tmp_path / "logs").stat().st_dev
    assert f"device {os.major(dev)}:{os.minor(dev)}: " in done.stdout
    done = subprocess.run([*command, "--json"], capture_output=True, text=True, env=env)
    assert [d["device"] for d in json.loads(done.stdout)["devices"]] == [
        f"{os.major(dev)}:{os.minor(dev)}"
    ]


def test_a_torn_tail_the_open_will_cut_is_foreseen_as_clean_cuts_it(tmp_path: Path) -> None:
    """A partial batch at the end of an owned dir's active segment: `plan` says the
    open will cut it (text and JSON), exactly as `clean` then reports the cut, and
    changes nothing itself. It said nothing, and `clean` cut it."""
    log = LogBuilder(tmp_path / "logs")
    log.append([(k("a"), b"1")])
    log.append([(k("b"), b"2")])
    part = log.write()
    active = sorted(part.glob("*.log"))[-1]
    whole = active.stat().st_size
    with open(active, "ab") as f:
        f.write(active.read_bytes()[:40])  # the first 40 bytes of a batch
    before = active.read_bytes()
    command, env = _plan_command(tmp_path)
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert (
        f"t-0: the open will cut a torn tail of 40 bytes at position {whole} of {active} "
        "(incomplete batch: " in done.stdout
    )
    done = subprocess.run([*command, "--json"], capture_output=True, text=True, env=env)
    (foreseen,) = json.loads(done.stdout)["truncated"]
    assert active.read_bytes() == before
    clean = [*command[:-3], "clean", "--json", *command[-2:]]
    done = subprocess.run(clean, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    (cut,) = json.loads(done.stdout)["truncated"]
    assert cut["quarantined_to"] is not None
    assert foreseen == {**cut, "quarantined_to": None}
    assert active.stat().st_size == whole


def test_an_eligible_partition_is_said_not_to_be_cleaned_with_the_cleaner_off(
    tmp_path: Path,
) -> None:
    """With `log.cleaner.enable: false` an eligible partition gets no pass: the plan says
    so, not "eligible, order None" (Python's None, which the cycle's order never is)."""
    log = LogBuilder(tmp_path / "logs")
    for n in range(3):
        log.append([(k("a"), b"%d" % n)])
        log.roll()
    log.write()
    command, env = _plan_command(tmp_path)
    config = Path(command[command.index("-c") + 1])
    config.write_text(config.read_text() + "log.cleaner.enable: false\n")
    text = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    (line,) = [x for x in text.stdout.splitlines() if x.startswith("  compaction: ")]
    assert line.startswith(
        "  compaction: eligible (min.cleanable.dirty.ratio) but not cleaned: "
        "log.cleaner.enable is false; "
    )
    doc = subprocess.run([*command, "--json"], capture_output=True, text=True, env=env, check=True)
    report = json.loads(doc.stdout)
    assert (report["cleaner_enabled"], report["cleaning_order"]) == (False, [])


def test_a_log_start_inside_the_active_segment_leaves_nothing_cleanable(tmp_path: Path) -> None:
    """A log start offset inside the active segment puts the first dirty offset past the
    first uncleanable one: the plan says nothing is cleanable, naming both, rather than
    an inverted range (`cleanable [4, 3)`)."""
    log = LogBuilder(tmp_path / "logs")
    for n in range(3):
        log.append([(k("a"), b"%d" % n)])
    log.roll()
    log.append([(k("a"), b"3")])
    log.append([(k("a"), b"4")])
    log.write()
    (tmp_path / "logs" / "log-start-offset-checkpoint").write_text("0\n1\nt 0 4\n")
    command, env = _plan_command(tmp_path)
    text = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    (line,) = [x for x in text.stdout.splitlines() if x.startswith("  compaction: ")]
    assert "; nothing cleanable (first dirty offset 4, first uncleanable 3), blocked by " in line


def test_a_partition_being_created_is_no_error(tmp_path: Path) -> None:
    """A partition dir with no segment yet, beside a broker (which is creating it) or in
    an owned dir (a crash left it so; the open creates the first segment), is nothing to
    plan and no error: `plan` exited 1 whenever a broker created a partition."""
    log = LogBuilder(tmp_path / "logs")
    log.append([(k("a"), b"1")])
    log.write()
    (tmp_path / "logs" / "t-1").mkdir()
    command, env = _plan_command(tmp_path)
    for hold in (HOLD_BROKER_LOCK, None):
        with held_by_other_process(hold, tmp_path / "logs") if hold else nullcontext():
            text = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
            doc = subprocess.run([*command, "--json"], capture_output=True, text=True, env=env)
        assert (text.returncode, doc.returncode) == (0, 0), text.stderr
        # As a word: the tmp path's "pytest-1N" holds the letters "t-1" too.
        assert re.search(r"\bt-1\b", text.stdout + text.stderr) is None
        report = json.loads(doc.stdout)
        assert (report["errors"], report["unreadable"]) == ([], [])
        assert [p["partition"] for p in report["partitions"]] == [0]


def test_a_topic_two_globs_match_is_an_error_and_the_others_are_planned(
    tmp_path: Path,
) -> None:
    """`plan` names the partition two globs match (as the cycle leaves it alone) and
    plans the others, exit 1; it refused the whole config before."""
    log = LogBuilder(tmp_path / "logs")
    log.append([(k("a"), b"1")])
    log.write()
    shutil.copytree(tmp_path / "logs" / "t-0", tmp_path / "logs" / "x-y-0")
    command, env = _plan_command(tmp_path)
    config = Path(command[-1])
    config.write_text(config.read_text() + "topics: {'x-*': {}, '*-y': {}}\n")
    done = subprocess.run([*command, "--json"], capture_output=True, text=True, env=env)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert [(p["topic"], p["partition"]) for p in report["partitions"]] == [("t", 0)]
    (error,) = report["errors"]
    assert "x-y-0" in error
    assert "matches more than one glob: 'x-*' and '*-y'" in error


def test_no_disk_usage_deletion_is_planned_in_a_dir_a_broker_holds(tmp_path: Path) -> None:
    """A device above `log.retention.disk.usage.percent` (1%: any host's is): `plan`
    lists the oldest segment for deletion in a dir cleanerd would own, and none in the
    same dir while a broker holds it, as the cycle deletes there nothing."""
    log = LogBuilder(tmp_path / "logs")
    log.append([(k("a"), b"1")])
    log.roll()
    log.append([(k("a"), b"2")])
    log.write()
    command, env = _plan_command(tmp_path)
    with (tmp_path / "cleanerd.yaml").open("a") as f:
        f.write("log.retention.disk.usage.percent: 1\n")

    def deletions() -> list[str]:
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
        return [x.strip() for x in done.stdout.splitlines() if "disk.usage: delete" in x]

    (deletion,) = deletions()  # its size rounded up to the file system's blocks
    assert deletion.startswith(f"disk.usage: delete t-0 segment 0 in {tmp_path / 'logs'} (")
    with held_by_other_process(HOLD_BROKER_LOCK, tmp_path / "logs"):
        assert deletions() == []


@pytest.mark.parametrize("stop", ["crash", "clean-shutdown"])
def test_a_damaged_index_is_foreseen_as_the_cycle_rebuilds_it(tmp_path: Path, stop: str) -> None:
    """A flipped bit in the offset index of an old segment (a last entry before the
    log's start): `plan` reads the partition from a rebuilt index, as `clean` then
    reads it, and both plan and do the same pass. `plan` called the partition
    unreadable (exit 1) while `clean` rebuilt the index (after a crash) or marked the
    partition uncleanable (after a clean shutdown, where the open checks no old
    segment)."""
    log = LogBuilder(tmp_path / "logs", index_interval=100)
    for n in range(3):
        log.records([(k(f"k{i}"), f"{n}".encode()) for i in range(20)])
        log.roll()
    log.append([(k("k0"), b"last")])
    part = log.write()
    if stop == "clean-shutdown":
        (tmp_path / "logs" / ".kafka_cleanshutdown").touch()
    index = part / "00000000000000000020.index"
    data = bytearray(index.read_bytes())
    data[-4] |= 0x80
    index.write_bytes(bytes(data))
    command, env = _plan_command(tmp_path)
    planned = subprocess.run([*command, "--json"], capture_output=True, text=True, env=env)
    assert planned.returncode == 0, planned.stderr
    assert "segment.index_rebuilt" in planned.stderr
    assert index.read_bytes() == bytes(data)  # `plan` writes nothing
    (partition,) = json.loads(planned.stdout)["partitions"]
    assert partition["damage"] is None
    clean = [*command[:-3], "clean", "--json", *command[-2:]]
    done = subprocess.run(clean, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["failed"] == report["errors"] == report["unreadable"] == []
    (cleaned,) = report["cleaned"]
    compaction = partition["compaction"]
    assert compaction["eligible"]
    assert (cleaned["first_dirty"], cleaned["end_offset"]) == (
        compaction["first_dirty_offset"],
        compaction["first_uncleanable_offset"],
    )


def test_an_interrupted_swap_the_open_cannot_finish_is_foreseen(tmp_path: Path) -> None:
    """A `.log.swap` that does not walk clean in an owned dir: the owner's open leaves it
    as it is and fails, and `plan` and `audit` now say so (exit 1, the swap named),
    where `plan` planned the partition and `audit` audited it, exiting 0. None changes
    the file."""
    log = LogBuilder(tmp_path / "logs")
    log.append([(k("a"), b"1")])
    log.roll()
    log.append([(k("a"), b"2")])
    part = log.write()
    swap = part / "00000000000000000000.log.swap"
    damaged = (part / "00000000000000000000.log").read_bytes()[:-1] + b"\xff"
    swap.write_bytes(damaged)
    command, env = _plan_command(tmp_path)
    planned = subprocess.run([*command, "--json"], capture_output=True, text=True, env=env)
    assert planned.returncode == 1
    (unreadable,) = json.loads(planned.stdout)["unreadable"]
    expected = f"corrupt record batch in {swap} at position 0: CRC mismatch"
    assert unreadable["reason"].startswith(expected)
    audit = [*command[:-3], "audit", "--json", *command[-2:]]
    audited = subprocess.run(audit, capture_output=True, text=True, env=env, check=False)
    assert audited.returncode == 1
    report = json.loads(audited.stdout)
    assert report["partitions"] == []
    (error,) = report["errors"]
    assert error.startswith(f"{part}: {expected}")
    clean = [*command[:-3], "clean", *command[-2:]]
    done = subprocess.run(clean, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 1
    assert f"t-0: open failed: {expected}" in done.stdout
    assert swap.read_bytes() == damaged


T0 = 1_700_000_000_000


def _big_segments_damaged_mid(tmp_path: Path, tp: TopicPartition) -> Path:
    """`tp` in `<tmp_path>/logs` as a crash leaves it: three segments of 400 1-KB
    records of one key (timestamps from `T0`, a second apart per segment) and an active
    one dated far ahead, a batch in the middle of the second segment failing its CRC
    (past what a metadata read reaches); that segment's `.log`."""
    records = [
        [[kv("k", "x" * 1000, timestamp=T0 + 1000 * n + i)] for i in range(400)] for n in range(3)
    ]
    last = [[kv("k", "v", timestamp=T0 + 10**7)]]
    build_log(tmp_path / "logs", [*records, last], state_dir=tmp_path / "state", tp=tp)
    damaged = tmp_path / "logs" / str(tp) / "00000000000000000400.log"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2 + 500] ^= 0xFF  # a value byte of a batch in the middle
    damaged.write_bytes(bytes(data))
    return damaged


@pytest.mark.parametrize("stop", ["crash", "clean-shutdown"])
def test_damage_the_owners_open_finds_is_foreseen(tmp_path: Path, stop: str) -> None:
    """A batch failing its CRC in the middle of a big segment of a `delete` topic, which
    no metadata read reaches (only its tail is read). After a crash the owner's open
    walks every segment past the recovery point and finds it: `plan` and `audit` now
    find it too, so all three keep the segment and the later ones, and delete the one
    before it. They planned and called due what `clean` then refused ("open failed").
    After a clean shutdown the open trusts the segments, and all three delete them."""
    state = tmp_path / "state"
    damaged = _big_segments_damaged_mid(tmp_path, TopicPartition("del", 0))
    if stop == "clean-shutdown":
        (tmp_path / "logs" / ".kafka_cleanshutdown").touch()
    config = tmp_path / "cleanerd.yaml"
    config.write_text(
        f"log.dirs: [{tmp_path / 'logs'}]\nstate_dir: {state}\n"
        "topics: {del: {cleanup.policy: delete, retention.ms: 100000}}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [
        sys.executable,
        "-m",
        "cleanerd",
        "plan",
        "-c",
        str(config),
        "--now-ms",
        str(T0 + 10**6),
    ]
    planned = subprocess.run([*command, "--json"], capture_output=True, text=True, env=env)
    (partition,) = json.loads(planned.stdout)["partitions"]
    deleted = [d["base_offset"] for d in partition["retention"]["deletions"]]
    audit = [*command[:-5], "audit", "--json", *command[-4:]]
    audited = subprocess.run(audit, capture_output=True, text=True, env=env, check=False)
    (retention,) = json.loads(audited.stdout)["retention"]
    clean = [*command[:-5], "clean", "--json", *command[-4:]]
    done = subprocess.run(clean, capture_output=True, text=True, env=env, check=False)
    report = json.loads(done.stdout)
    assert [d["base_offset"] for d in report["deleted"]] == deleted
    if stop == "crash":
        assert deleted == [0]
        crc = f"corrupt record batch in {damaged} at position "
        assert partition["damage"].startswith(crc)
        assert retention["hold"]["reason"] == "damage"
        assert retention["hold"]["damage"].startswith(crc)
        assert retention["due"] == 1
        (failed,) = report["errors"]
        assert (failed["phase"], failed["reason"][: len(crc)]) == ("open", crc)
    else:
        assert deleted == [0, 400, 800]
        assert partition["damage"] is None
        assert (retention["hold"], retention["due"]) == (None, 3)


def _three_segments(tmp_path: Path) -> Path:
    """t-0 as a crash leaves it: three segments of keys k0..k2; its dir."""
    log = LogBuilder(tmp_path / "logs")
    for i in range(20):
        log.append([(k(f"k{i % 3}"), b"v")])
        if i % 10 == 9:
            log.roll()
    log.append([(k("k0"), b"last")])
    part = log.write()
    return part


def test_damage_the_owners_open_finds_in_a_compacted_partition_is_foreseen(
    tmp_path: Path,
) -> None:
    """A batch failing its CRC in the middle of a big closed segment of a compacted
    topic (past what a metadata read reaches), after a crash: the owner's open walks
    the segment and holds the partition uncleanable (exit 1). `plan` reads such a
    partition's batch headers for its delete horizons, not their CRCs: it now runs the
    open's walk first, names the damage and exits 1 too. It planned the pass as
    eligible and exited 0."""
    damaged = _big_segments_damaged_mid(tmp_path, DEFAULT_TP)
    crc = f"corrupt record batch in {damaged} at position "
    command, env = _plan_command(tmp_path)
    planned = subprocess.run([*command, "--json"], capture_output=True, text=True, env=env)
    assert planned.returncode == 1
    (partition,) = json.loads(planned.stdout)["partitions"]
    assert partition["damage"].startswith(crc)
    assert partition["compaction"] is None
    clean = [*command[:-3], "clean", *command[-2:]]
    done = subprocess.run(clean, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 1
    assert f"{DEFAULT_TP}: uncleanable: {crc}" in done.stdout


def _with_a_garbage_txnindex(tmp_path: Path) -> tuple[Path, Path]:
    """t-0 after a crash: three segments, the second's `.txnindex` 40 bytes of garbage;
    the partition dir and that file."""
    part = _three_segments(tmp_path)
    txn_index = part / "00000000000000000010.txnindex"
    txn_index.write_bytes(b"x" * 40)
    return part, txn_index


def test_a_damaged_txnindex_the_owners_open_finds_is_foreseen(tmp_path: Path) -> None:
    """A `.txnindex` that does not parse, after a crash: the owner's open checks it and
    holds the partition uncleanable, and `plan` now says so, naming the file. It
    planned the pass as eligible."""
    txn_index = _with_a_garbage_txnindex(tmp_path)[1]
    command, env = _plan_command(tmp_path)
    planned = subprocess.run([*command, "--json"], capture_output=True, text=True, env=env)
    (partition,) = json.loads(planned.stdout)["partitions"]
    assert not partition["compaction"]["eligible"]
    assert partition["compaction"]["uncleanable"].startswith(f"corrupt index {txn_index}: ")
    clean = [*command[:-3], "clean", *command[-2:]]
    done = subprocess.run(clean, capture_output=True, text=True, env=env, check=False)
    assert f"t-0: uncleanable: corrupt index {txn_index}: " in done.stdout


def test_a_damaged_txnindex_of_a_delete_topic_is_the_opens_error_in_plan_too(
    tmp_path: Path,
) -> None:
    """A `.txnindex` that does not parse in a partition of a `delete` topic, after a
    crash: `clean`'s open reports it ("open failed", exit 1) after retention ran as
    planned; `plan` now names it and exits 1 too. It planned the partition and exited 0."""
    part, txn_index = _with_a_garbage_txnindex(tmp_path)
    command, env = _plan_command(tmp_path)
    config = Path(command[-1])
    config.write_text(
        config.read_text().replace("log.cleanup.policy: compact", "log.cleanup.policy: delete")
    )
    planned = subprocess.run(command, capture_output=True, text=True, env=env)
    assert planned.returncode == 1
    assert f"cleanerd plan: {part}: corrupt index {txn_index}: " in planned.stderr
    clean = [*command[:-3], "clean", *command[-2:]]
    done = subprocess.run(clean, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 1
    assert f"t-0: open failed: corrupt index {txn_index}: " in done.stdout


def test_a_pass_that_will_fail_on_a_damaged_txnindex_is_foreseen(tmp_path: Path) -> None:
    """A `.txnindex` of garbage in a dir a clean stop left: the owner's open trusts the
    segments and the cleaning pass fails on it when it loads the aborted transactions,
    so `clean` marks the partition uncleanable (exit 1). `plan` now says that pass will
    fail, naming the file, and exits 1 too; it said eligible and exited 0."""
    part = _three_segments(tmp_path)
    command, env = _plan_command(tmp_path)
    config = Path(command[-1])
    text = config.read_text()
    config.write_text(text + "log.cleaner.enable: false\n")
    clean = [*command[:-3], "clean", *command[-2:]]
    stop = subprocess.run(clean, capture_output=True, text=True, env=env, check=False)
    assert stop.returncode == 0, stop.stdout
    assert (tmp_path / "logs" / ".kafka_cleanshutdown").exists()
    config.write_text(text)
    txn_index = part / "00000000000000000010.txnindex"
    txn_index.write_bytes(b"x" * 40)
    planned = subprocess.run([*command, "--json"], capture_output=True, text=True, env=env)
    assert planned.returncode == 1
    (partition,) = json.loads(planned.stdout)["partitions"]
    compaction = partition["compaction"]
    assert (compaction["eligible"], compaction["pass_fails"]) == (False, True)
    assert compaction["uncleanable"].startswith(f"corrupt index {txn_index}: ")
    assert f"t-0: the pass will fail: corrupt index {txn_index}: " in planned.stderr
    done = subprocess.run(clean, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 1
    assert f"t-0: uncleanable: corrupt index {txn_index}: " in done.stdout
