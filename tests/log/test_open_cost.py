"""Opening a log reads what the dir says it must, as Kafka's loader does: after a clean
stop (producer snapshot, recovery point at the end, `.kafka_cleanshutdown`) it walks no
segment in full; without the marker, only the bytes past the recovery point; without a
snapshot, every batch (to rebuild the producer state)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from cleanerd.cli import main
from cleanerd.compaction.horizon import HorizonCache
from cleanerd.log.checkpoint import RECOVERY_POINT_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleanerd.log.files import CLEAN_SHUTDOWN_FILE_NAME, TopicPartition, offset_from_filename
from cleanerd.log.known_reader import read_dir, read_dirs
from cleanerd.log.known_segments import decode, read_known_segments
from cleanerd.log.log_dir import LogDir
from cleanerd.log.partition_log import LogConfig, PartitionLog
from cleanerd.log.txnindex import AbortedTxn
from cleanerd.records import walker
from tests.builders import kv

TP = TopicPartition("orders", 0)
CONFIG = LogConfig(segment_bytes=16 * 1024, index_interval_bytes=1024)


def build(root: Path, state: Path) -> int:
    """A partition of many segments with an open transaction; its log bytes."""
    with LogDir.open(root, state_dir=state) as log_dir:
        plog = log_dir.create_partition(TP, config=CONFIG)
        for i in range(600):
            plog.append([kv(f"k{i % 50}", "v" * 60)])
        plog.append([kv("t", "open")], producer_id=7, producer_epoch=0, is_transactional=True)
        for i in range(100):
            plog.append([kv(f"k{i}", "w" * 60)])
        return sum(s.size for s in plog.segments)


def stop_cleanly(root: Path, state: Path) -> None:
    with LogDir.open(root, state_dir=state) as log_dir:
        plog = log_dir.open_partition(TP, config=CONFIG)
        plog.prepare_clean_shutdown()
        log_dir.checkpoint_logs([plog])
        log_dir.mark_clean_shutdown()


def reopen(root: Path, state: Path) -> tuple[PartitionLog, bool]:
    with LogDir.open(root, state_dir=state) as log_dir:
        plog = log_dir.open_partition(TP, config=CONFIG)
        plog.meta()
        return plog, log_dir.had_clean_shutdown


def test_after_a_clean_stop_an_open_walks_no_segment(tmp_path: Path, walked: list[int]) -> None:
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    total = build(root, state)
    stop_cleanly(root, state)
    assert (root / CLEAN_SHUTDOWN_FILE_NAME).exists()
    assert list((root / str(TP)).glob("*.snapshot"))

    walked.clear()
    plog, clean = reopen(root, state)
    assert clean
    assert not (root / CLEAN_SHUTDOWN_FILE_NAME).exists()  # taken before any write
    segments = len(plog.segments)
    assert segments > 5
    # Each segment's tail after its last index entry, nothing more.
    assert sum(walked) <= segments * (CONFIG.index_interval_bytes + 200)
    assert sum(walked) < total / 5
    assert plog.first_unstable_offset == 600


def test_without_the_marker_only_bytes_past_the_recovery_point_are_walked(
    tmp_path: Path, walked: list[int]
) -> None:
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    total = build(root, state)
    stop_cleanly(root, state)
    (root / CLEAN_SHUTDOWN_FILE_NAME).unlink()

    walked.clear()
    plog, clean = reopen(root, state)
    assert not clean
    assert sum(walked) < total / 5
    assert plog.first_unstable_offset == 600


def test_without_a_snapshot_the_producer_state_is_rebuilt_from_every_batch(
    tmp_path: Path, walked: list[int]
) -> None:
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    total = build(root, state)
    stop_cleanly(root, state)
    for snapshot in (root / str(TP)).glob("*.snapshot"):
        snapshot.unlink()

    walked.clear()
    plog, _ = reopen(root, state)
    assert sum(walked) >= total
    assert plog.first_unstable_offset == 600


def test_damage_past_the_recovery_point_is_still_found(tmp_path: Path) -> None:
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state)
    with LogDir.open(root, state_dir=state) as log_dir:
        plog = log_dir.open_partition(TP, config=CONFIG)
        active = plog.active_segment
        plog.recovery_point = active.base_offset + 1
        log_dir.checkpoint_logs([plog])
    data = bytearray(active.log_path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    active.log_path.write_bytes(bytes(data))
    with LogDir.open(root, state_dir=state) as log_dir:
        assert log_dir.open_partition(TP, config=CONFIG).corrupt is not None


def test_clean_writes_the_marker_and_the_next_clean_takes_it(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    root.mkdir()
    build(root, tmp_path / "state")
    config = tmp_path / "cleanerd.yaml"
    config.write_text(
        f"log.dirs: [{root}]\nstate_dir: {tmp_path / 'state'}\n"
        "log.retention.disk.usage.percent: 99\n"
        "topics: {orders: {cleanup.policy: compact, segment.bytes: 16384}}\n"
    )
    assert main(["clean", "-c", str(config)]) == 0
    assert (root / CLEAN_SHUTDOWN_FILE_NAME).read_bytes() == b'{"version":0,"brokerEpoch":-1}'
    kept = read_known_segments(tmp_path / "state", root).segments[str(TP)]
    assert len(kept) >= 2  # every segment the clean read, kept for the next start
    snapshots: Any = sorted(p.name for p in (root / str(TP)).glob("*.snapshot"))
    assert snapshots

    # A damaged partition in the dir: the stop is not clean, so no marker.
    other = root / "orders-1"
    other.mkdir()
    (other / "00000000000000000000.log").write_bytes(b"\x00" * 10 + b"\xff" * 80)
    assert main(["clean", "-c", str(config)]) == 1
    assert not (root / CLEAN_SHUTDOWN_FILE_NAME).exists()


def test_a_cycle_reads_only_the_bytes_appended_since_the_last(
    tmp_path: Path, walked: list[int]
) -> None:
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state)
    with LogDir.open(root, observe=True, state_dir=state) as observer:
        seen = observer.open_partition(TP, config=CONFIG)
        seen.meta()
        active = seen.active_segment
        with LogDir.open(root, state_dir=state) as owner:
            writer = owner.open_partition(TP, config=CONFIG)
            size_before = writer.active_segment.size
            writer.append([kv("late", "x" * 60, timestamp=10**13)])
            appended = writer.active_segment.size - size_before
        walked.clear()
        meta = seen.meta()
        assert seen.active_segment is active  # same segment object, its head kept
        # The segment's end and the producer state each walk the new batch, only it.
        assert walked == [appended, appended]
        assert meta.log_end_offset == writer.log_end_offset
        assert meta.segments[-1].largest_timestamp_ms == 10**13
        walked.clear()
        seen.meta()
        assert walked == []  # nothing changed, nothing read


def test_two_growths_between_reads_are_both_walked(tmp_path: Path, walked: list[int]) -> None:
    """A segment that grows twice before its end is read again keeps the first growth:
    the largest timestamp appended in it still counts."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state)
    with LogDir.open(root, observe=True, state_dir=state) as observer:
        seen = observer.open_partition(TP, config=CONFIG)
        seen.meta()
        with LogDir.open(root, state_dir=state) as owner:
            writer = owner.open_partition(TP, config=CONFIG)
            before = writer.active_segment.size
            writer.append([kv("late", "x", timestamp=10**13)])
            seen.active_segment.refresh()
            writer.append([kv("later", "y", timestamp=5)])
            appended = writer.active_segment.size - before
        walked.clear()
        meta = seen.meta()
        assert meta.segments[-1].largest_timestamp_ms == 10**13
        assert meta.log_end_offset == writer.log_end_offset
        assert walked[0] == appended  # both growths, in one walk


def test_segments_the_first_cycle_reads_are_prefetched_at_open(
    tmp_path: Path, advised: list[str]
) -> None:
    """An open asks the kernel to start reading each small inactive segment whose
    metadata the first cycle will read (so that cold reads overlap); after a clean stop
    that kept what it read, there is nothing to prefetch."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state)
    advised.clear()
    with LogDir.open(root, state_dir=state) as log_dir:
        plog = log_dir.open_partition(TP, config=CONFIG)
        assert sorted(advised) == [s.log_path.name for s in plog.segments[:-1]]
        plog.meta()
        plog.prepare_clean_shutdown()
        log_dir.checkpoint_logs([plog])
        log_dir.keep_known_segments([plog])
        log_dir.mark_clean_shutdown()
    advised.clear()
    reopen(root, state)
    assert advised == []


@pytest.mark.parametrize("indexes", ["kept", "missing"])
def test_after_a_crash_every_batch_is_walked_once(
    tmp_path: Path, walked: list[int], indexes: str
) -> None:
    """No snapshot, no recovery point, no marker: one walk checks every CRC and, as it
    goes, checks the indexes against the batches (or rebuilds missing ones), rebuilds the
    producer state, and finds the delete horizons the cleaner needs."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    total = build(root, state)
    stop_cleanly(root, state)
    part = root / str(TP)
    originals = {p: p.read_bytes() for p in part.glob("*index")}
    removed = [*part.glob("*.snapshot"), root / CLEAN_SHUTDOWN_FILE_NAME]
    removed.append(root / RECOVERY_POINT_OFFSET_CHECKPOINT)
    removed += list(originals) if indexes == "missing" else []
    for path in removed:
        path.unlink(missing_ok=True)

    walked.clear()
    plog, clean = reopen(root, state)
    assert not clean
    assert plog.recovery_report.errors == []
    cache = HorizonCache()
    cache.partition(plog)
    assert cache.scans == 0
    assert plog.first_unstable_offset == 600
    tails = len(plog.segments) * (CONFIG.index_interval_bytes + 200)
    assert total <= sum(walked) <= total + tails
    assert {p: p.read_bytes() for p in originals} == originals


def test_the_walk_past_the_recovery_point_keeps_no_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check that the bytes past the recovery point walk clean wants a verdict only:
    it keeps no table of their batches (72 bytes a batch, for up to a whole segment)."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state)
    stop_cleanly(root, state)
    (root / CLEAN_SHUTDOWN_FILE_NAME).unlink()
    kept: list[int] = []
    original = walker.Walker.__init__

    def spying(self: walker.Walker, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if self.own:
            kept.append(self.end - self.start)

    monkeypatch.setattr(walker.Walker, "__init__", spying)
    plog, clean = reopen(root, state)
    assert not clean
    assert plog.recovery_report.errors == []
    assert kept == []


def crashed(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The partition as a crash after a clean stop's checkpoints leaves it: the recovery
    point at the log end, the snapshot, the indexes, no marker. The log dir, the state
    dir and the partition's dir."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state)
    stop_cleanly(root, state)
    (root / CLEAN_SHUTDOWN_FILE_NAME).unlink()
    return root, state, root / str(TP)


def open_leaving_checks(log_dir: LogDir) -> PartitionLog:
    """An open whose checks of the segments below the recovery point readers run."""
    return log_dir.open_partition(TP, config=CONFIG, prefetch=False, check_later=True)


def test_after_a_crash_readers_check_the_segments_below_the_recovery_point(
    tmp_path: Path, walked: list[int]
) -> None:
    """The cheap check of the segments wholly below the recovery point (flushed, with
    their indexes, before the checkpoint named them) can run in a reader beside the
    opening: the open reads none of their files, and what a reader that checked them
    read is taken for them, nothing read twice."""
    root, state, part = crashed(tmp_path)
    with LogDir.open(root, state_dir=state) as log_dir:
        assert not log_dir.had_clean_shutdown
        walked.clear()
        plog = open_leaving_checks(log_dir)
        inactive = plog.segments[:-1]
        assert len(inactive) >= 5
        assert all(s.unread for s in inactive)
        assert sum(walked) <= plog.active_segment.size
        assert plog.recovery_report.unchecked == [s.base_offset for s in inactive]
        read = decode(read_dirs([str(part)], check=True)).segments[str(TP)]
        walked.clear()
        assert plog.take_known(read) == len(inactive)
        plog.check_unchecked(read)
        assert walked == []
        assert plog.recovery_report.unchecked == []
        assert plog.corrupt is None
        meta = plog.meta()
    with LogDir.open(root, state_dir=state) as log_dir:
        assert log_dir.open_partition(TP, config=CONFIG, full_check=True).meta() == meta


def test_the_index_files_a_left_check_reads_are_prefetched_too(
    tmp_path: Path, advised: list[str]
) -> None:
    """Cold, a check waited a disk round trip for each segment's index files: the owner
    (`PartitionLog.prefetch`) and a reader that checks (`read_dir(check=True)`) ask for
    them with the `.log`, but never for a preallocated index (megabytes of holes)."""
    root, state, part = crashed(tmp_path)
    big = sorted(part.glob("*.timeindex"))[0]
    os.truncate(big, 10 * 1024 * 1024)  # as preallocated; past the last entry it is zeros
    advised.clear()  # what building it asked for
    with LogDir.open(root, state_dir=state) as log_dir:
        plog = open_leaving_checks(log_dir)
        assert advised == []
        plog.prefetch()
        closed = plog.segments[:-1]
        expected = {s.log_path.name for s in closed}
        expected |= {s.offset_index_path.name for s in closed if s.offset_index_path.stat().st_size}
        expected |= {s.time_index_path.name for s in closed} - {big.name}
        assert set(advised) == expected
        assert len(advised) == len(expected)
    advised.clear()
    read_dir(str(part), check=True)
    assert expected <= set(advised)
    assert big.name not in advised
    advised.clear()
    read_dir(str(part))  # no checks but the active segment's: no index asked for
    assert all(name.endswith(".log") for name in advised)


def test_after_a_crash_the_checks_no_reader_ran_are_run_by_the_owner(
    tmp_path: Path, walked: list[int]
) -> None:
    root, state, _ = crashed(tmp_path)
    with LogDir.open(root, state_dir=state) as log_dir:
        plog = open_leaving_checks(log_dir)
        walked.clear()
        plog.check_unchecked({})
        assert len(walked) == len(plog.segments) - 1  # each one's tail
        assert plog.recovery_report.unchecked == []
        assert plog.corrupt is None


def test_after_a_crash_a_missing_index_below_the_recovery_point_is_rebuilt_at_open(
    tmp_path: Path,
) -> None:
    root, state, part = crashed(tmp_path)
    index = part / "00000000000000000000.index"
    original = index.read_bytes()
    index.unlink()
    with LogDir.open(root, state_dir=state) as log_dir:
        plog = open_leaving_checks(log_dir)
        assert plog.recovery_report.rebuilt_indexes == [str(part / "00000000000000000000.log")]
        assert 0 not in plog.recovery_report.unchecked
    assert index.read_bytes() == original


@pytest.mark.parametrize("damage", ["batch", "transaction index"])
def test_after_a_crash_damage_below_the_recovery_point_is_found_before_any_read(
    tmp_path: Path, damage: str
) -> None:
    """Damage a check left to the readers would have found at the open: no reader row for
    that segment, so the owner's check finds it, and the partition is corrupt before any
    step reads it; the files stay as they are."""
    root, state, part = crashed(tmp_path)
    if damage == "batch":
        damaged = part / "00000000000000000000.log"
        data = bytearray(damaged.read_bytes())
        data[-10] ^= 0xFF  # a value byte of the last batch, past the last index entry
        damaged.write_bytes(bytes(data))
    else:
        with LogDir.open(root, state_dir=state) as log_dir:
            second = log_dir.open_partition(TP, config=CONFIG).segments[1]
        damaged = part / f"{second.log_path.stem}.txnindex"
        # An aborted transaction whose last offset lies below the segment's base offset.
        damaged.write_bytes(AbortedTxn(0, 7, 1, 0).to_bytes())
    before = {p: p.read_bytes() for p in part.iterdir()}
    with LogDir.open(root, state_dir=state) as log_dir:
        plog = open_leaving_checks(log_dir)
        assert plog.corrupt is None
        read = decode(read_dirs([str(part)], check=True)).segments[str(TP)]
        assert len(read) == len(plog.segments) - 1  # all but the damaged one
        plog.take_known(read)
        plog.check_unchecked(read)
        assert plog.corrupt is not None
        assert str(damaged) in str(plog.corrupt)
    assert {p: p.read_bytes() for p in part.iterdir()} == before


@pytest.mark.parametrize("topic_policy", ["compact", "delete"])
def test_a_clean_after_a_crash_names_damage_below_the_recovery_point_and_keeps_it(
    tmp_path: Path, topic_policy: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A `clean` of a few partitions (no readers: its open checks them itself) names the
    damage below the recovery point and exits 1; the files stay byte for byte, and the
    stop writes no marker."""
    root, state, part = crashed(tmp_path)
    first = part / "00000000000000000000.log"
    data = bytearray(first.read_bytes())
    data[-10] ^= 0xFF
    first.write_bytes(bytes(data))
    config = tmp_path / "cleanerd.yaml"
    config.write_text(
        f"log.dirs: [{root}]\nstate_dir: {state}\n"
        f"topics: {{orders: {{cleanup.policy: {topic_policy}, segment.bytes: 16384}}}}\n"
    )
    assert main(["clean", "-c", str(config), "--json"]) == 1
    assert str(first) in capsys.readouterr().out
    assert first.read_bytes() == bytes(data)
    assert not (root / CLEAN_SHUTDOWN_FILE_NAME).exists()


def test_a_recovery_point_past_the_end_waits_for_the_active_segments_check(
    tmp_path: Path, walked: list[int]
) -> None:
    """After a clean stop whose active segment nothing kept describes, an open that
    leaves that segment's check to readers reads nothing, not even to bring a recovery
    point checkpointed past the log end back to it: the check left does, and says so."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state)
    stop_cleanly(root, state)
    checkpoint = root / RECOVERY_POINT_OFFSET_CHECKPOINT
    OffsetCheckpointFile(checkpoint).write({TP: 10**6})
    with LogDir.open(root, state_dir=state) as log_dir, capture_logs() as logs:
        walked.clear()
        plog = open_leaving_checks(log_dir)
        assert walked == []
        assert plog.recovery_point == 10**6
        plog.check_unchecked({})
        assert plog.recovery_point == plog.log_end_offset < 10**6
    (warned,) = [e for e in logs if e["event"] == "checkpoint.recovery_point_past_log_end"]
    assert warned["path"] == str(checkpoint)


def test_after_a_clean_stop_a_reader_checks_the_active_segment(
    tmp_path: Path, walked: list[int]
) -> None:
    """The one check an open after a clean stop runs (the active segment's, when no clean
    stop of cleanerd's recorded it) can run in a reader too; damage there is found before
    any read of the partition all the same."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state)
    stop_cleanly(root, state)
    part = root / str(TP)
    with LogDir.open(root, state_dir=state) as log_dir:
        assert log_dir.had_clean_shutdown
        walked.clear()
        plog = open_leaving_checks(log_dir)
        assert walked == []
        assert plog.recovery_report.unchecked == [plog.active_segment.base_offset]
        read = decode(read_dirs([str(part)])).segments[str(TP)]
        walked.clear()
        assert plog.take_known(read) == len(plog.segments)
        plog.check_unchecked(read)
        assert walked == []
        assert plog.corrupt is None
        meta = plog.meta()
    with LogDir.open(root, state_dir=state) as log_dir:
        assert log_dir.open_partition(TP, config=CONFIG, full_check=True).meta() == meta

    stop_cleanly(root, state)
    active = max(part.glob("*.log"))
    data = bytearray(active.read_bytes())
    data[-10] ^= 0xFF
    active.write_bytes(bytes(data))
    with LogDir.open(root, state_dir=state) as log_dir:
        plog = open_leaving_checks(log_dir)
        read = decode(read_dirs([str(part)])).segments[str(TP)]
        assert active.name.replace(".log", "") not in {f"{b:020d}" for b in read}
        plog.take_known(read)
        plog.check_unchecked(read)
        assert plog.corrupt is not None
        assert str(active) in str(plog.corrupt)
    assert active.read_bytes() == bytes(data)


def flip_last_batch(log: Path) -> bytes:
    """A value byte of the segment's last batch flipped (past its last index entry);
    the damaged bytes."""
    data = bytearray(log.read_bytes())
    data[-10] ^= 0xFF
    log.write_bytes(bytes(data))
    return bytes(data)


def test_the_first_damage_is_the_lowest_segments_whoever_found_it(tmp_path: Path) -> None:
    """Damage the open found past the recovery point and damage a left check found below
    it: `corrupt` (where retention stops) is the lower one's, as an open finding both
    would say."""
    root, state, part = crashed(tmp_path)
    logs = sorted(part.glob("*.log"))
    # The recovery point at the third segment: the ones from there on are walked whole.
    OffsetCheckpointFile(root / RECOVERY_POINT_OFFSET_CHECKPOINT).write(
        {TP: offset_from_filename(logs[2].name)}
    )
    flip_last_batch(logs[3])
    flip_last_batch(logs[0])
    with LogDir.open(root, state_dir=state) as log_dir:
        plog = open_leaving_checks(log_dir)
        assert plog.recovery_report.unchecked == [0, offset_from_filename(logs[1].name)]
        assert plog.corrupt is not None
        assert str(logs[3]) in str(plog.corrupt)
        plog.check_unchecked({})
        assert [Path(str(getattr(e, "path", ""))).name for e in plog.recovery_report.errors] == [
            logs[0].name,
            logs[3].name,
        ]
        assert str(logs[0]) in str(plog.corrupt)


@pytest.mark.parametrize("damaged", [False, True])
def test_the_snapshots_a_crash_left_past_the_end_go_once_the_checks_find_no_damage(
    tmp_path: Path, damaged: bool
) -> None:
    root, state, part = crashed(tmp_path)
    stray = part / "00000000000000099999.snapshot"
    stray.write_bytes(max(part.glob("*.snapshot")).read_bytes())
    if damaged:
        flip_last_batch(sorted(part.glob("*.log"))[0])
    with LogDir.open(root, state_dir=state) as log_dir:
        plog = open_leaving_checks(log_dir)
        assert stray.exists()  # not before the checks the open left
        plog.check_unchecked({})
        assert (plog.corrupt is not None) == damaged
    assert stray.exists() == damaged  # a damaged partition is left as it is


def test_rows_read_before_the_open_changed_files_are_not_taken_for_checks(
    tmp_path: Path, walked: list[int]
) -> None:
    root, state, part = crashed(tmp_path)
    with LogDir.open(root, state_dir=state) as log_dir:
        plog = open_leaving_checks(log_dir)
        read = decode(read_dirs([str(part)], check=True)).segments[str(TP)]
        # As if the open had finished a swap (renamed a leftover) after the reads.
        plog.recovery_report.renamed.append(("x.txnindex.swap", "x.txnindex"))
        walked.clear()
        plog.check_unchecked(read)
        assert len(walked) == len(plog.segments) - 1  # each checked here
