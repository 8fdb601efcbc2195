"""Tests of cleanerd.log.log_dir: discovery, ownership modes and root checkpoints."""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import os
import time
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from cleanerd.errors import LogDirLockedError
from cleanerd.log.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
)
from cleanerd.log.files import TopicPartition
from cleanerd.log.lock import LogDirLock, OwnerLock
from cleanerd.log.log_dir import LogDir, Mode, ReadOnlyFileSystem
from cleanerd.log.ownership import Holder, OwnershipLost
from cleanerd.log.partition_log import LogConfig
from cleanerd.log.recovery import SymlinkRefused
from tests.builders import kv
from tests.holders import (
    HOLD_BROKER_LOCK,
    HOLD_OWNER_LOCK,
    HOLD_OWNER_MARKER,
    held_by_other_process,
)

_CTX = multiprocessing.get_context("spawn")
TP = TopicPartition("orders", 0)


def _hold_dir_lock(log_dir: Path, held: Event, done: Event) -> None:
    with LogDirLock(log_dir):
        held.set()
        done.wait(30)


def test_discovers_real_kafka_partitions(kafka_real: Path, tmp_path: Path) -> None:
    """Partition dirs of a broker's log dir are found; the metadata log is read-only."""
    root = kafka_real / "kraft-combined-logs"
    with LogDir.open(root, state_dir=tmp_path / "state") as log_dir:
        assert log_dir.mode is Mode.OWNER
        assert sorted(map(str, log_dir.partitions())) == ["__cluster_metadata-0", "foo-0"]
        meta = log_dir.meta_properties
        assert meta is not None
        assert meta.node_id == 1
        metadata = log_dir.open_partition(TopicPartition("__cluster_metadata", 0))
        assert metadata.is_metadata
        assert metadata.read_only
        assert metadata.meta().is_metadata
        with pytest.raises(PermissionError):
            log_dir.create_partition(TopicPartition("__cluster_metadata", 0))


def test_skips_special_and_foreign_entries(tmp_path: Path) -> None:
    """-delete, -future and -stray dirs, plain files and non-partition dirs are skipped."""
    root = tmp_path / "logs"
    for name in [
        "orders-0",
        "orders-1.0123456789abcdef0123456789abcdef-delete",
        "orders-2.0123456789abcdef0123456789abcdef-future",
        "orders-3.0123456789abcdef0123456789abcdef-stray",
        "lost+found",
    ]:
        (root / name).mkdir(parents=True)
    (root / "orders-9").write_text("not a dir")
    with LogDir.open(root, state_dir=tmp_path / "state") as log_dir:
        assert list(log_dir.partitions()) == [TP]


def test_forced_observe_when_another_process_holds_lock(tmp_path: Path) -> None:
    """A `.lock` held by a foreign process (a broker) forces observe mode with a warning;
    nothing can be written."""
    root = tmp_path / "logs"
    root.mkdir()
    held, done = _CTX.Event(), _CTX.Event()
    proc = _CTX.Process(target=_hold_dir_lock, args=(root, held, done))
    proc.start()
    try:
        assert held.wait(30)
        with capture_logs() as logs:
            log_dir = LogDir.open(root, allow_shared=True, state_dir=tmp_path / "state")
        assert log_dir.mode is Mode.OBSERVE
        assert any(e["event"] == "log_dir.observe_forced" for e in logs)
        with pytest.raises(PermissionError):
            log_dir.create_partition(TP)
    finally:
        done.set()
        proc.join(30)


def test_a_broker_is_no_owner_to_share_with_whoever_holds_the_marker(tmp_path: Path) -> None:
    """A broker holds the dir while another process holds the state dir's owner marker
    (a momentary look by another cleanerd command does): an opener that may share with
    a cleanerd owner observes the dir, as beside any broker. It shared it with the
    broker, as if the broker were the owner, and appended and rolled there."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    marker = OwnerLock(state, root)
    assert marker.acquire("run")  # made as an owner leaves it
    marker.release()
    with (
        held_by_other_process(HOLD_BROKER_LOCK, root),
        held_by_other_process(HOLD_OWNER_MARKER, root, state),
    ):
        log_dir = LogDir.open(root, allow_shared=True, state_dir=state)
        assert log_dir.mode is Mode.OBSERVE


def test_an_owner_whose_locks_are_listed_under_another_device_is_still_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On btrfs, `stat` gives a file a subvolume's device number and /proc/locks another,
    so no /proc/locks line names the owner marker: the owner holding it, not seen, is
    still the dir's owner, and a second one is refused. It passed for a broker (a second
    daemon observed the dir, and `clean` beside the daemon too)."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    with held_by_other_process(HOLD_OWNER_LOCK, root, state):
        real = os.minor
        monkeypatch.setattr(os, "minor", lambda dev: real(dev) + 1)
        assert Holder.of(root, state).cleanerd
        with pytest.raises(LogDirLockedError, match="owned by another cleanerd process"):
            LogDir.open(root, state_dir=state)


def test_shared_mode_appends_without_recovery(tmp_path: Path) -> None:
    """With a cleanerd owner holding the dir, a second opener in shared mode may append
    but never recovers (the owner's in-flight `.cleaned` files are left alone)."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    with LogDir.open(root, state_dir=state) as owner:
        owner_log = owner.create_partition(TP)
        owner_log.append([kv("a", "1")])
        in_flight = owner_log.dir / "00000000000000000000.log.cleaned"
        in_flight.write_bytes(b"partial output")
        with LogDir.open(root, allow_shared=True, state_dir=state) as producer:
            assert producer.mode is Mode.SHARED
            plog = producer.open_partition(TP)
            assert plog.append([kv("b", "2")]) == (1, 1)
            assert in_flight.exists()
        assert owner_log.append([kv("c", "3")]) == (2, 2)
        with pytest.raises(LogDirLockedError) as refused:
            LogDir.open(root, state_dir=state)
        assert f"owned by another cleanerd process (pid {os.getpid()}" in str(refused.value)


def test_a_second_owner_is_refused_without_an_observe_warning(tmp_path: Path) -> None:
    """A second would-be owner (a second daemon, `clean` beside the daemon) gets an error
    naming the owner, not observe mode and a warning about a broker."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    refused = pytest.raises(LogDirLockedError, match=f"pid {os.getpid()}: a running daemon")
    with LogDir.open(root, state_dir=state), capture_logs() as logs, refused:
        LogDir.open(root, state_dir=state)
    assert logs == []


def _own_dir(root: Path, state: Path, held: Event) -> None:
    with LogDir.open(root, state_dir=state) as owner:
        owner.create_partition(TP)
        held.set()
        time.sleep(60)  # until killed


@pytest.mark.parametrize("after", ["nobody", "a-broker"])
def test_shared_mode_roll_proves_the_owner_still_holds_the_dir(tmp_path: Path, after: str) -> None:
    """An appender beside a cleanerd owner (shared mode) rolls only while that owner
    still holds the log dir: once the owner is gone, the roll is refused naming the lock,
    and no segment is created. So too when a broker took the dir while another process
    holds the state dir's owner marker (a momentary look by another cleanerd command
    does): a marker held by someone made the appender follow the broker, and roll in its
    dir from then on."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    held = _CTX.Event()
    owner = _CTX.Process(target=_own_dir, args=(root, state, held))
    owner.start()
    try:
        assert held.wait(30)
        with LogDir.open(root, allow_shared=True, state_dir=state) as producer:
            assert producer.mode is Mode.SHARED
            plog = producer.open_partition(TP, config=LogConfig(segment_bytes=200))
            plog.append([kv("a", "x" * 100)])
            owner.kill()
            owner.join(30)
            with contextlib.ExitStack() as holding:
                if after == "a-broker":
                    holding.enter_context(held_by_other_process(HOLD_BROKER_LOCK, root))
                    holding.enter_context(held_by_other_process(HOLD_OWNER_MARKER, root, state))
                with pytest.raises(OwnershipLost, match=r"\(pid \d+\) has exited"):
                    plog.append([kv("b", "y" * 100)])
            assert [p.name for p in plog.dir.glob("*.log")] == ["00000000000000000000.log"]
    finally:
        owner.kill()
        owner.join(30)


def test_an_appender_goes_on_beside_the_owner_that_took_the_dir_after_its_own(
    tmp_path: Path,
) -> None:
    """The owner an appender writes beside stops, and another cleanerd owner of the same
    state dir takes the dir (the daemon restarted): the appender's rolls go on beside the
    new one. Every roll after the restart failed with OwnershipLost until the
    application opened the log again."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    first, second = (_CTX.Event() for _ in range(2))
    owners = [_CTX.Process(target=_own_dir, args=(root, state, first))]
    owners[0].start()
    try:
        assert first.wait(30)
        with LogDir.open(root, allow_shared=True, state_dir=state) as producer:
            plog = producer.open_partition(TP, config=LogConfig(segment_bytes=200))
            plog.append([kv("a", "x" * 100)])
            owners[0].kill()
            owners[0].join(30)
            owners.append(_CTX.Process(target=_own_dir, args=(root, state, second)))
            owners[1].start()
            assert second.wait(30)
            for _ in range(3):
                plog.append([kv("b", "y" * 100)])  # each rolls
            assert len(list(plog.dir.glob("*.log"))) == 4
            owners[1].kill()
            owners[1].join(30)
            with pytest.raises(OwnershipLost, match=r"\(pid \d+\) has exited"):
                plog.append([kv("c", "z" * 100)])  # and nobody holds the dir now
    finally:
        for owner in owners:
            owner.kill()
            owner.join(30)


def test_cleaner_offsets_round_trip_and_drop_vanished(tmp_path: Path) -> None:
    """Cleaner offsets are written atomically; entries of partitions that no longer exist
    are dropped, as Kafka's cleaner does."""
    root = tmp_path / "logs"
    root.mkdir()
    gone = TopicPartition("gone", 3)
    OffsetCheckpointFile(root / CLEANER_OFFSET_CHECKPOINT).write({gone: 5})
    with LogDir.open(root, state_dir=tmp_path / "state") as log_dir:
        log_dir.create_partition(TP)
        log_dir.update_cleaner_offset(TP, 42)
        assert OffsetCheckpointFile(root / CLEANER_OFFSET_CHECKPOINT).read() == {TP: 42}
        assert log_dir.checkpoints.cleaner_offsets == {TP: 42}


def test_checkpoint_logs(tmp_path: Path) -> None:
    """Recovery points are written per log; a log start offset only when it is above the
    first segment's base; replication-offset-checkpoint is never written."""
    root = tmp_path / "logs"
    root.mkdir()
    other = TopicPartition("other", 1)
    with LogDir.open(root, state_dir=tmp_path / "state") as log_dir:
        plog = log_dir.create_partition(TP)
        plog.append([kv("a", "1"), kv("b", "2")])
        plog.flush()
        log_dir.create_partition(other)
        OffsetCheckpointFile(root / LOG_START_OFFSET_CHECKPOINT).write({other: 0})
        log_dir.reload_checkpoints()
        log_dir.checkpoint_logs([plog])
        assert OffsetCheckpointFile(root / RECOVERY_POINT_OFFSET_CHECKPOINT).read() == {TP: 2}
        assert OffsetCheckpointFile(root / LOG_START_OFFSET_CHECKPOINT).read() == {other: 0}
    assert not (root / "replication-offset-checkpoint").exists()


def test_observe_mode_writes_nothing(tmp_path: Path) -> None:
    """Observe mode opens partitions read-only and refuses checkpoint writes."""
    root = tmp_path / "logs"
    root.mkdir()
    with LogDir.open(root, state_dir=tmp_path / "state") as owner:
        owner.create_partition(TP).append([kv("a", "1")])
    with LogDir.open(root, observe=True, state_dir=tmp_path / "state") as log_dir:
        plog = log_dir.open_partition(TP)
        assert plog.read_only
        assert [r.key for r in plog.records()] == [b"a"]
        with pytest.raises(PermissionError):
            log_dir.update_cleaner_offset(TP, 1)
    assert not (root / CLEANER_OFFSET_CHECKPOINT).exists()


def test_partition_dirs_hold_only_kafka_files(tmp_path: Path) -> None:
    """cleanerd writes only Kafka's segment files in a partition dir; its locks live in
    the state dir."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    with LogDir.open(root, state_dir=state) as log_dir:
        plog = log_dir.create_partition(TP)
        plog.append([kv("a", "1")])
        plog.roll()
    names = sorted(p.name for p in (root / "orders-0").iterdir())
    assert all(n.endswith((".log", ".index", ".timeindex", ".snapshot")) for n in names)
    assert sorted(p.name for p in root.iterdir()) == [".lock", "orders-0"]
    assert any(state.rglob("orders-0.lock"))


# What an interrupted swap leaves, and index files without a `.log`: recovery would
# delete or rename every one of these, and create an empty segment, in a partition dir.
VICTIM_FILES = {
    "00000000000000000000.log.deleted": b"old",
    "00000000000000000000.log.cleaned": b"half-written",
    "00000000000000000005.log.swap": b"swap",
    "00000000000000000007.index": b"index",
    "00000000000000000007.timeindex": b"timeindex",
}


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "outside" / "victim"
    victim.mkdir(parents=True)
    for name, data in VICTIM_FILES.items():
        (victim / name).write_bytes(data)
    return victim


def _contents(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.mark.parametrize("observe", [False, True], ids=["owner", "observe"])
def test_symlinked_partition_dir_outside_is_reported_and_never_followed(
    tmp_path: Path, observe: bool
) -> None:
    """`evil-0 -> <outside>/victim` is listed (so it is reported), but opening it, or
    asking to create it, raises SymlinkRefused after a warning naming the link and its
    target; the target's files are left byte for byte and nothing is added there."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    victim = _victim(tmp_path)
    evil = TopicPartition("evil", 0)
    (root / "evil-0").symlink_to(victim)
    with LogDir.open(root, observe=observe, state_dir=state) as log_dir:
        assert list(log_dir.partitions()) == [evil]
        with capture_logs() as logs, pytest.raises(SymlinkRefused, match="evil-0 is a symlink"):
            log_dir.open_partition(evil)
        if not observe:
            with pytest.raises(SymlinkRefused):
                log_dir.create_partition(evil)
    assert _contents(victim) == VICTIM_FILES
    warning = next(e for e in logs if e["event"] == "partition.symlink_refused")
    assert warning["log_level"] == "warning"
    assert (warning["path"], warning["target"]) == (str(root / "evil-0"), str(victim))
    assert warning["inside_log_dir"] is False


def test_symlinked_partition_dir_inside_the_log_dir_is_refused_too(tmp_path: Path) -> None:
    """A link that resolves inside the log dir (`alias-0 -> orders-0`) is refused the same
    way: the rule is about links, not where they point. The real dir opens as usual."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    with LogDir.open(root, state_dir=state) as log_dir:
        log_dir.create_partition(TP).append([kv("a", "1")])
        (root / "alias-0").symlink_to("orders-0")
        before = _contents(root / "orders-0")
        with capture_logs() as logs, pytest.raises(SymlinkRefused):
            log_dir.open_partition(TopicPartition("alias", 0))
        assert [r.key for r in log_dir.open_partition(TP).records()] == [b"a"]
    assert _contents(root / "orders-0") == before
    warning = next(e for e in logs if e["event"] == "partition.symlink_refused")
    assert warning["inside_log_dir"] is True


def test_dangling_partition_link_is_listed_and_refused(tmp_path: Path) -> None:
    """A link to nothing with a partition dir's name is reported, not silently skipped,
    and `create_partition` does not create its target."""
    root, state = tmp_path / "logs", tmp_path / "state"
    root.mkdir()
    gone = tmp_path / "outside" / "gone"
    (root / "orders-0").symlink_to(gone)
    with LogDir.open(root, state_dir=state) as log_dir:
        assert list(log_dir.partitions()) == [TP]
        with pytest.raises(SymlinkRefused):
            log_dir.create_partition(TP)
    assert not gone.exists()


@pytest.mark.parametrize(
    ("refusal", "offline"), [(errno.EROFS, True), (errno.EPERM, False), (errno.EACCES, False)]
)
def test_the_write_probe_takes_only_a_read_only_file_system_for_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refusal: int, offline: bool
) -> None:
    """`verify_writable` touches `.lock`; only EROFS says the file system refuses writes.
    A `.lock` that is kafka's, which cleanerd writes through the group, cannot be given
    explicit times by another user (EPERM): that took every such dir offline."""
    with LogDir.open(tmp_path, state_dir=tmp_path / "state") as owned:

        def refused(path: Path, *args: object, **kwargs: object) -> None:
            raise OSError(refusal, os.strerror(refusal), str(path))

        monkeypatch.setattr(os, "utime", refused)
        if offline:
            with pytest.raises(ReadOnlyFileSystem, match="refuses writes"):
                owned.verify_writable()
        else:
            owned.verify_writable()
