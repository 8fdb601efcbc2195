"""What a clean stop keeps of each segment (`known_segments.py`): the next start takes it
for every `.log` that is still the file described (after a crash, only below the
recovery point), reads nothing of those segments, and ends up with exactly the metadata
a full read gives; anything else is read anew."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from cleanerd.compaction.horizon import HorizonCache
from cleanerd.log import producer_state
from cleanerd.log.files import CLEAN_SHUTDOWN_FILE_NAME, TopicPartition
from cleanerd.log.known_segments import (
    NOTHING_KNOWN,
    KnownDir,
    KnownSegment,
    decode,
    encode,
    known_segments_path,
    read_known_segments,
)
from cleanerd.log.log_dir import LogDir
from cleanerd.log.meta import PartitionMeta
from cleanerd.log.partition_log import LogConfig, PartitionLog
from cleanerd.log.producer_state import ProducerState
from cleanerd.log.segment import LogSegment
from cleanerd.records.batch import encode_batch
from cleanerd.records.crc32c_library import crc32c
from tests.builders import kv, settle_dir

TP = TopicPartition("orders", 0)
CONFIG = LogConfig(segment_bytes=4 * 1024, index_interval_bytes=512)
I64 = st.integers(-(2**63), 2**63 - 1)


def build(root: Path, state: Path) -> None:
    """Many small segments, with timestamps and a tombstone."""
    with LogDir.open(root, state_dir=state) as log_dir:
        plog = log_dir.create_partition(TP, config=CONFIG)
        for i in range(300):
            plog.append([kv(f"k{i % 40}", "v" * 50, timestamp=1_700_000_000_000 + i)])
        plog.append([kv("gone", None, timestamp=1_700_000_001_000)])


def stop_cleanly(root: Path, state: Path, *, read_first: bool = True) -> None:
    """What `Maintenance.checkpoint(clean_stop=True)` does for one partition."""
    with LogDir.open(root, state_dir=state) as log_dir:
        plog = log_dir.open_partition(TP, config=CONFIG)
        if read_first:
            plog.meta()
            HorizonCache().partition(plog)
        plog.prepare_clean_shutdown()
        log_dir.checkpoint_logs([plog])
        log_dir.keep_known_segments([plog])
        log_dir.mark_clean_shutdown()


def fresh_meta(root: Path) -> PartitionMeta:
    """The metadata read from the files alone (another state dir: nothing is known)."""
    with LogDir.open(root, observe=True, state_dir=root.parent / "elsewhere") as log_dir:
        return log_dir.open_partition(TP, config=CONFIG).meta()


def start(root: Path, state: Path) -> tuple[PartitionLog, PartitionMeta]:
    with LogDir.open(root, state_dir=state) as log_dir:
        plog = log_dir.open_partition(TP, config=CONFIG)
        return plog, plog.meta()


def test_a_start_after_a_clean_stop_reads_no_inactive_segment(
    tmp_path: Path, walked: list[int]
) -> None:
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state)
    stop_cleanly(root, state)
    assert known_segments_path(state, root).exists()
    expected = fresh_meta(root)
    assert len(expected.segments) > 5

    walked.clear()
    plog, meta = start(root, state)
    assert meta == expected
    # Not even the active segment: its `.log` and index sizes are as the stop recorded.
    assert sum(walked) == 0
    assert plog.active_segment._offset_index is None
    assert plog.active_segment._time_index is None
    horizons = HorizonCache()
    horizons.partition(plog)
    assert horizons.scans == 0  # kept from the stop too


def test_an_active_segment_whose_index_changed_since_the_stop_is_checked(
    tmp_path: Path, walked: list[int]
) -> None:
    """An offset-index entry added after the stop (pointing past the log's end) changes
    the index's size: the active segment gets the open's check, which finds it."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state)
    stop_cleanly(root, state)
    with LogDir.open(root, observe=True, state_dir=tmp_path / "peek") as peek:
        active = peek.open_partition(TP, config=CONFIG).active_segment
    index = active.offset_index_path
    entries = index.stat().st_size // 8
    with index.open("ab") as f:
        f.write((entries + 1000).to_bytes(4, "big") + (active.size + 4096).to_bytes(4, "big"))

    walked.clear()
    plog, _ = start(root, state)
    assert plog.corrupt is not None
    assert str(index) in str(plog.corrupt)


def test_a_segment_changed_since_the_stop_is_read_anew(tmp_path: Path, walked: list[int]) -> None:
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state)
    stop_cleanly(root, state)
    # Replace one inactive segment by a copy with another mtime and inode (what a swap
    # leaves); the marker is still there.
    with LogDir.open(root, observe=True, state_dir=tmp_path / "peek") as peek:
        segments = peek.open_partition(TP, config=CONFIG).segments
    victim = segments[2].log_path
    copy = victim.with_name(victim.name + ".copy")
    copy.write_bytes(victim.read_bytes())
    os.utime(copy, ns=(1_000_000_000, 1_000_000_000))
    copy.replace(victim)

    walked.clear()
    plog, meta = start(root, state)
    assert meta == fresh_meta(root)
    assert meta.segments[2].last_modified_ms == 1_000
    # That segment and the active one are read, no other.
    assert sum(walked) <= 2 * (victim.stat().st_size + plog.active_segment.size)
    again = plog.segments[2].known()
    assert again is not None
    assert again.identity[2] == 1_000_000_000


def stopped(tmp_path: Path) -> tuple[Path, Path]:
    """The log dir and state dir of a partition `build` wrote, stopped cleanly."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state)
    stop_cleanly(root, state)
    return root, state


def peek(tmp_path: Path, root: Path) -> tuple[LogSegment, ...]:
    """The partition's segments, seen by an observer that keeps nothing."""
    with LogDir.open(root, observe=True, state_dir=tmp_path / "peek") as observer:
        return observer.open_partition(TP, config=CONFIG).segments


def crash_after_a_stop(root: Path, state: Path, *, recovery_point: int | None = None) -> None:
    """A dir as a crash after `stop_cleanly` leaves it (no marker); `recovery_point`: as
    if the checkpoint had been written before the last segments were flushed."""
    (root / CLEAN_SHUTDOWN_FILE_NAME).unlink()
    if recovery_point is not None:
        (root / "recovery-point-offset-checkpoint").write_text(
            f"0\n1\n{TP.topic} 0 {recovery_point}\n"
        )


def test_after_a_crash_what_was_kept_is_taken_below_the_recovery_point(
    tmp_path: Path, walked: list[int]
) -> None:
    """Kafka's loader trusts the segments wholly below the recovery point after a crash:
    cleanerd takes what it kept of them (their files unchanged, index sizes included),
    neither reading nor checking them, and walks the active one."""
    root, state = stopped(tmp_path)
    crash_after_a_stop(root, state)
    expected = fresh_meta(root)

    walked.clear()
    plog, meta = start(root, state)
    assert meta == expected
    closed = [s.base_offset for s in plog.segments[:-1]]
    assert plog.recovery_report.as_kept == closed
    assert 0 < sum(walked) <= 2 * plog.active_segment.size
    assert all(s._offset_index is None for s in plog.segments[:-1])  # not even checked


def test_after_a_crash_nothing_kept_is_taken_from_the_recovery_point_on(
    tmp_path: Path, walked: list[int]
) -> None:
    """A segment holding offsets at or past the recovery point may have kept an append's
    size and mtime but not its bytes: it is walked, whatever was kept of it."""
    root, state = stopped(tmp_path)
    segments = peek(tmp_path, root)
    point = segments[3].base_offset + 1  # inside the fourth segment
    crash_after_a_stop(root, state, recovery_point=point)
    expected = fresh_meta(root)

    walked.clear()
    plog, meta = start(root, state)
    assert meta == expected
    assert plog.recovery_report.as_kept == [s.base_offset for s in segments[:3]]
    unflushed = sum(s.size for s in segments[3:])
    assert sum(walked) >= unflushed - segments[3].position_for(point)


def test_after_a_crash_a_segment_past_the_recovery_point_is_read_whatever_was_kept(
    tmp_path: Path,
) -> None:
    """Its size and mtime may have outlived its bytes (here its last batch's max timestamp
    is rewritten, with its CRC, and the mtime set back: the same inode, size and mtime
    as kept): its metadata comes from its bytes, not from what was kept."""
    root, state = stopped(tmp_path)
    segments = peek(tmp_path, root)
    victim = segments[4].log_path
    before = victim.stat()
    data = bytearray(victim.read_bytes())
    pos = last = 0
    while pos < len(data):  # to the last batch: base offset (8), length (4), then length
        last, pos = pos, pos + 12 + int.from_bytes(data[pos + 8 : pos + 12], "big")
    max_ts = int.from_bytes(data[last + 35 : last + 43], "big") + 1000
    data[last + 35 : last + 43] = max_ts.to_bytes(8, "big")
    data[last + 17 : last + 21] = crc32c(bytes(data[last + 21 : pos])).to_bytes(4, "big")
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert victim.stat().st_ino == before.st_ino
    crash_after_a_stop(root, state, recovery_point=segments[3].base_offset + 1)

    plog, meta = start(root, state)
    assert segments[4].base_offset not in plog.recovery_report.as_kept
    assert meta == fresh_meta(root)
    assert meta.segments[4].largest_timestamp_ms == max_ts


def test_after_a_crash_a_kept_segment_whose_index_changed_is_checked(
    tmp_path: Path, walked: list[int]
) -> None:
    """An offset-index entry added to a closed segment after the keep (pointing past its
    log's end) changes the index's size: the segment is not taken as kept, and the
    open's check finds the damage."""
    root, state = stopped(tmp_path)
    crash_after_a_stop(root, state)
    victim = peek(tmp_path, root)[2]
    index = victim.offset_index_path
    entries = index.stat().st_size // 8
    with index.open("ab") as f:
        f.write((entries + 1000).to_bytes(4, "big") + (victim.size + 4096).to_bytes(4, "big"))

    with LogDir.open(root, state_dir=state) as log_dir:
        plog = log_dir.open_partition(TP, config=CONFIG)
    assert victim.base_offset not in plog.recovery_report.as_kept
    assert plog.corrupt is not None
    assert str(index) in str(plog.corrupt)


def test_a_damaged_file_is_reported_and_ignored(tmp_path: Path) -> None:
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state)
    stop_cleanly(root, state)
    path = known_segments_path(state, root)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40
    path.write_bytes(bytes(data))

    with capture_logs() as logs:
        assert read_known_segments(state, root) == NOTHING_KNOWN
    assert [e["path"] for e in logs if e["event"] == "known_segments.unreadable"] == [str(path)]
    _, meta = start(root, state)
    assert meta == fresh_meta(root)


def test_segments_never_read_are_not_kept(tmp_path: Path) -> None:
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state)
    stop_cleanly(root, state, read_first=False)
    kept = read_known_segments(state, root).segments[str(TP)]
    # The stop reads only the active segment (to flush and snapshot it).
    with LogDir.open(root, observe=True, state_dir=tmp_path / "peek") as peek:
        active = peek.open_partition(TP, config=CONFIG).active_segment.base_offset
    assert set(kept) <= {active}


@given(
    st.lists(
        st.tuples(
            st.integers(0, 2**62),
            st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**62), I64),
            I64,
            I64,
            I64,
            st.none() | I64,
            st.integers(0, 2**31),
            st.integers(0, 2**31),
            st.none() | st.tuples(I64, st.integers(0, 2**31)),
            st.booleans(),
        ),
        max_size=20,
    ),
    st.integers(1, 3),
)
def test_the_format_round_trips(rows: list[tuple[object, ...]], partitions: int) -> None:
    known = {
        f"t-{p}": {k.base_offset: k for k in (KnownSegment(*r) for r in rows[p::partitions])}  # type: ignore[arg-type]
        for p in range(partitions)
    }
    assert decode(encode((name, segs.values()) for name, segs in known.items())).segments == known


def test_a_stop_that_cannot_keep_them_still_stops_cleanly(tmp_path: Path) -> None:
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state)
    (state / "known-segments").write_bytes(b"")  # a file where the dir should be
    with capture_logs() as logs:
        stop_cleanly(root, state)
    # The start finds no file it can read either, and says so.
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
        "known_segments.unreadable",
        "known_segments.not_kept",
    ]
    assert (root / CLEAN_SHUTDOWN_FILE_NAME).exists()
    _, meta = start(root, state)
    assert meta == fresh_meta(root)


def test_plan_reads_nothing_of_a_cleanly_stopped_dir(tmp_path: Path, walked: list[int]) -> None:
    """Observe mode (`plan`, `audit`, a daemon beside a broker) takes what is known while
    the marker says nobody owned the dir since the stop, and leaves the marker there."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state)
    stop_cleanly(root, state)
    expected = fresh_meta(root)

    walked.clear()
    with LogDir.open(root, observe=True, state_dir=state) as observer:
        assert observer.open_partition(TP, config=CONFIG).meta() == expected
    assert sum(walked) == 0
    assert (root / CLEAN_SHUTDOWN_FILE_NAME).exists()

    (root / CLEAN_SHUTDOWN_FILE_NAME).unlink()  # an owner started since
    with LogDir.open(root, observe=True, state_dir=state) as observer:
        assert observer.open_partition(TP, config=CONFIG).meta() == expected
    assert sum(walked) > 0


def test_no_open_transaction_at_the_stop_spares_the_snapshot_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clean stop with no transaction open records it on the last segment; the next
    start knows there is no first unstable offset without reading the producer snapshot,
    until the log changes: a transaction begun since is found."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state)
    stop_cleanly(root, state)
    kept = read_known_segments(state, root).segments[str(TP)]
    assert [k.stable_end for k in kept.values()] == [False] * (len(kept) - 1) + [True]

    reads: list[Path] = []
    real = producer_state.read_snapshot

    def counted(path: Path) -> ProducerState:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(producer_state, "read_snapshot", counted)
    with LogDir.open(root, state_dir=state) as log_dir:
        plog = log_dir.open_partition(TP, config=CONFIG)
        assert plog.meta().first_unstable_offset is None
        assert reads == []
        # Another writer (an application beside the owner) begins a transaction.
        first = plog.log_end_offset
        batch = encode_batch(
            [dataclasses.replace(kv("t", "1"), offset=first)],
            base_offset=first,
            producer_id=7,
            producer_epoch=0,
            base_sequence=0,
            is_transactional=True,
        )
        with plog.active_segment.log_path.open("ab") as f:
            f.write(batch)
        assert plog.meta().first_unstable_offset == first
        assert len(reads) == 1


def test_a_transaction_open_at_the_stop_is_read_at_the_start(tmp_path: Path) -> None:
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state)
    with LogDir.open(root, state_dir=state) as log_dir:
        first, _ = log_dir.open_partition(TP, config=CONFIG).append(
            [kv("t", "1")],
            producer_id=7,
            producer_epoch=0,
            base_sequence=0,
            is_transactional=True,
        )
    stop_cleanly(root, state)
    kept = read_known_segments(state, root).segments[str(TP)]
    assert not any(k.stable_end for k in kept.values())
    _, meta = start(root, state)
    assert meta.first_unstable_offset == first


def test_a_settled_dir_of_known_segments_is_kept_for_the_watcher(tmp_path: Path) -> None:
    """A clean stop keeps the dir's stamp when its mtime is settled and every segment is
    known: the watcher's view of the dir (bases, active size and mtime) comes back."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    build(root, state)
    stop_cleanly(root, state)
    assert read_known_segments(state, root).dirs == {}  # just written: not settled
    part = root / str(TP)
    settle_dir(part)
    stop_cleanly(root, state)
    kept = read_known_segments(state, root)
    st = part.stat()
    bases = tuple(sorted(kept.segments[str(TP)]))
    active = (part / f"{bases[-1]:020d}.log").stat()
    assert kept.dirs == {
        str(TP): KnownDir(st.st_ino, st.st_mtime_ns, bases, active.st_size, active.st_mtime_ns)
    }
    assert len(bases) > 5

    known_segments_path(state, root).unlink()
    settle_dir(part)
    stop_cleanly(root, state, read_first=False)  # segments not read: not all known
    assert read_known_segments(state, root).dirs == {}
