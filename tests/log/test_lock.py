"""Tests of cleanerd.log.lock: the log dir lock, owner marker and partition locks."""

from __future__ import annotations

import errno
import multiprocessing
import os
import subprocess
import sys
import threading
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import pytest

from cleanerd.errors import LogDirLockedError
from cleanerd.log.files import TopicPartition
from cleanerd.log.lock import (
    LogDirLock,
    OwnerLock,
    PartitionLock,
    PartitionLockTimeout,
    partition_lock_path,
    partition_locks,
    remove_partition_lock,
)
from cleanerd.log.log_dir import LogDir, Mode
from cleanerd.log.ownership import lock_holder
from tests.conftest import NOGROUP, give_mode_and_group, mode_and_group
from tests.holders import HOLD_BROKER_LOCK, HOLD_FLOCK, held_by_other_process

_CTX = multiprocessing.get_context("spawn")
TP = TopicPartition("t", 0)


def _hold_dir_lock(log_dir: Path, held: Event, done: Event) -> None:
    with LogDirLock(log_dir):
        held.set()
        done.wait(30)


def _try_dir_lock(log_dir: Path, result: multiprocessing.SimpleQueue[str]) -> None:
    try:
        LogDirLock(log_dir).acquire()
    except LogDirLockedError:
        result.put("locked")
    else:
        result.put("acquired")


def _hold_partition_lock(state: Path, log_dir: Path, held: Event, done: Event) -> None:
    with PartitionLock(state, log_dir, TP):
        held.set()
        done.wait(30)


def _probe(log_dir: Path) -> str:
    result: multiprocessing.SimpleQueue[str] = _CTX.SimpleQueue()
    proc = _CTX.Process(target=_try_dir_lock, args=(log_dir, result))
    proc.start()
    proc.join(30)
    return result.get()


def test_dir_lock_held_by_another_process(tmp_path: Path) -> None:
    """A `.lock` held by another process cannot be taken: LogDirLockedError."""
    held, done = _CTX.Event(), _CTX.Event()
    proc = _CTX.Process(target=_hold_dir_lock, args=(tmp_path, held, done))
    proc.start()
    try:
        assert held.wait(30)
        with pytest.raises(LogDirLockedError, match=str(tmp_path)):
            LogDirLock(tmp_path).acquire()
    finally:
        done.set()
        proc.join(30)
    with LogDirLock(tmp_path) as lock:
        assert lock.held


def test_dir_lock_creates_lock_file_and_excludes_others(tmp_path: Path) -> None:
    """Taking the lock creates `.lock` like a broker; other processes are then refused
    until it is released."""
    lock = LogDirLock(tmp_path)
    lock.acquire()
    try:
        assert (tmp_path / ".lock").exists()
        assert _probe(tmp_path) == "locked"
    finally:
        lock.release()
    assert _probe(tmp_path) == "acquired"


def test_second_lock_in_same_process_is_refused_without_dropping_first(tmp_path: Path) -> None:
    """A second LogDirLock on the same dir in one process is refused, and the refusal does
    not release the first (POSIX locks die with any descriptor of the file)."""
    first = LogDirLock(tmp_path)
    first.acquire()
    try:
        with pytest.raises(LogDirLockedError):
            LogDirLock(tmp_path).acquire()
        assert _probe(tmp_path) == "locked"
    finally:
        first.release()


def test_partition_lock_lives_in_state_dir(tmp_path: Path) -> None:
    """Partition lock files are under `<state>/locks/`, never inside the log dir."""
    log_dir, state = tmp_path / "logs", tmp_path / "state"
    log_dir.mkdir()
    with PartitionLock(state, log_dir, TP) as lock:
        assert lock.path == partition_lock_path(state, log_dir, TP)
        assert lock.path.is_relative_to(state / "locks")
        assert lock.path.name == "t-0.lock"
    assert list(log_dir.iterdir()) == []


def test_partition_lock_times_out_when_held_elsewhere(tmp_path: Path) -> None:
    """Waiting for a partition lock another process holds ends in PartitionLockTimeout."""
    held, done = _CTX.Event(), _CTX.Event()
    proc = _CTX.Process(target=_hold_partition_lock, args=(tmp_path, tmp_path, held, done))
    proc.start()
    try:
        assert held.wait(30)
        with pytest.raises(PartitionLockTimeout, match=r"t-0\.lock"):
            PartitionLock(tmp_path, tmp_path, TP, timeout_s=0.05).acquire()
    finally:
        done.set()
        proc.join(30)
    with PartitionLock(tmp_path, tmp_path, TP, timeout_s=5):
        pass


def _take_and_note(lock: PartitionLock, order: list[str]) -> None:
    with lock:
        order.append("t")


def test_partition_lock_is_reentrant_and_excludes_threads(tmp_path: Path) -> None:
    """The holder may re-enter; another thread waits until the outermost release."""
    lock = PartitionLock(tmp_path, tmp_path, TP, timeout_s=5)
    order: list[str] = []
    with lock:
        with lock:
            order.append("inner")
        thread = threading.Thread(target=_take_and_note, args=(lock, order))
        thread.start()
        thread.join(0.05)
        order.append("outer done")
    thread.join(10)
    assert order == ["inner", "outer done", "t"]


def test_release_without_acquire_is_an_error(tmp_path: Path) -> None:
    """Releasing a lock that is not held raises."""
    with pytest.raises(RuntimeError, match="not held"):
        PartitionLock(tmp_path, tmp_path, TP).release()


def test_a_free_partition_lock_file_is_removed_and_a_held_one_kept(tmp_path: Path) -> None:
    """`remove_partition_lock` removes the lock file of a partition nobody holds, and
    leaves the one of a partition a process holds (it says so); the checkpoint's and
    the owner's lock files are no partition's."""
    log_dir, state = tmp_path / "logs", tmp_path / "state"
    free, held = TopicPartition("gone", 0), TopicPartition("gone", 1)
    with PartitionLock(state, log_dir, free):
        pass
    (state / "locks" / partition_lock_path(state, log_dir, TP).parent.name / "owner.lock").touch()
    with PartitionLock(state, log_dir, held):
        assert sorted(partition_locks(state, log_dir)) == [free, held]
        assert remove_partition_lock(state, log_dir, free)
        assert not remove_partition_lock(state, log_dir, held)
        assert partition_locks(state, log_dir) == [held]
    assert remove_partition_lock(state, log_dir, held)
    assert remove_partition_lock(state, log_dir, held)  # none left: nothing to do
    assert partition_locks(state, log_dir) == []


def test_a_lock_file_removed_while_it_was_waited_for_is_not_held_in_vain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An acquirer that opened the lock file just before another process removed it
    locks the new file at the path, not the unlinked one: a third process opening the
    path would otherwise take the lock too, and two would hold one partition."""
    log_dir, state = tmp_path / "logs", tmp_path / "state"
    with PartitionLock(state, log_dir, TP):
        pass
    lock = PartitionLock(state, log_dir, TP, timeout_s=5)
    opened = lock._open
    removed: list[bool] = []

    def opened_then_removed() -> int:
        fd = opened()
        if not removed:  # the first open: the remover comes in between
            removed.append(remove_partition_lock(state, log_dir, TP))
        return fd

    monkeypatch.setattr(lock, "_open", opened_then_removed)
    with lock:
        assert removed == [True]
        with pytest.raises(PartitionLockTimeout):
            PartitionLock(state, log_dir, TP, timeout_s=0.05).acquire()
    with PartitionLock(state, log_dir, TP, timeout_s=5):
        pass


def test_owner_marker(tmp_path: Path) -> None:
    """The owner marker is seen as held elsewhere by a second object while one holds it."""
    owner = OwnerLock(tmp_path / "state", tmp_path)
    probe = OwnerLock(tmp_path / "state", tmp_path)
    assert not probe.held_elsewhere()
    # A look creates nothing: `check-config` run as root left a root-owned marker the
    # service user could not open, and the daemon could never own the dir.
    assert not (tmp_path / "state").exists()
    assert owner.acquire()
    assert probe.held_elsewhere()
    assert not probe.acquire()
    owner.release()
    assert not probe.held_elsewhere()


def test_the_owner_marker_names_its_holders_command(tmp_path: Path) -> None:
    """The marker holds the command of its holder, the latest one's only, which a user
    who cannot see the holder's `/proc` entry reads; a holder that named none, or a
    file that is not a command name, names nothing."""
    first, probe = OwnerLock(tmp_path / "state", tmp_path), OwnerLock(tmp_path / "state", tmp_path)
    assert first.acquire("build-kernels")
    assert probe.holder_command() == "build-kernels"
    first.release()
    second = OwnerLock(tmp_path / "state", tmp_path)
    assert second.acquire("run")
    assert probe.holder_command() == "run"
    second.release()
    assert second.acquire()
    assert probe.holder_command() is None
    second.release()
    second.path.write_bytes(b"../../etc\n")
    assert probe.holder_command() is None


@pytest.mark.usefixtures("umask_0027")
def test_a_new_lock_file_is_one_a_broker_can_open_to_write(tmp_path: Path) -> None:
    """A `.lock` cleanerd creates takes its dir's bits (less execute) and group: made
    0640 in cleanerd's group, it kept a broker (in the dir's group) out of the dir. One
    that is there keeps its own."""
    give_mode_and_group([tmp_path], 0o775, NOGROUP)
    with LogDirLock(tmp_path):
        pass
    assert mode_and_group(tmp_path / ".lock") == (0o664, NOGROUP)
    (tmp_path / ".lock").chmod(0o600)
    with LogDirLock(tmp_path):
        pass
    assert mode_and_group(tmp_path / ".lock") == (0o600, NOGROUP)


def test_a_lock_file_this_user_cannot_write_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker's `.lock` (0644, its user's) cannot be opened to write by cleanerd's
    user: the error says why a lock needs that and what to change."""
    (tmp_path / ".lock").write_bytes(b"")
    real_open = os.open

    def refused(path: str | Path, flags: int, *args: int) -> int:
        if flags == os.O_RDWR:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refused)
    with pytest.raises(PermissionError, match="a lock needs its file open to write"):
        LogDirLock(tmp_path).acquire()


def test_a_dir_a_broker_holds_is_never_opened_to_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An owner-mode open of a dir a broker holds observes it without opening `.lock`
    to write (a lock attempt needs that): a watch of the broker's dir saw cleanerd's
    write-opens of its `.lock`, though no byte changed."""
    opened: list[int] = []
    real_open = os.open

    def watching(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith(".lock"):
            opened.append(flags)
        return real_open(path, flags, *args, **kwargs)

    with held_by_other_process(HOLD_BROKER_LOCK, tmp_path):
        monkeypatch.setattr(os, "open", watching)
        observed = LogDir.open(tmp_path, state_dir=tmp_path / "state")
        observed.close()
    assert observed.mode is Mode.OBSERVE
    assert opened
    assert all(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) == 0 for flags in opened)


def test_an_open_file_description_lock_is_held_by_a_pid_not_visible(tmp_path: Path) -> None:
    """A `.lock` held with an open file description lock (`F_OFD_SETLK`) keeps cleanerd
    out; its holder, whose pid the kernel gives as -1, was named "pid -1"."""
    take = (
        "import fcntl, os, struct, sys; "
        "fd = os.open(os.path.join(sys.argv[1], '.lock'), os.O_RDWR | os.O_CREAT, 0o644); "
        "fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack('hhqqi', fcntl.F_WRLCK, 0, 0, 0, 0)); "
        "print('ready', flush=True); sys.stdin.read()"
    )
    with held_by_other_process(take, tmp_path):
        assert lock_holder(tmp_path) == 0
        observed = LogDir.open(tmp_path, state_dir=tmp_path / "state")
        try:
            assert observed.mode is Mode.OBSERVE
            assert observed.held_by is not None
            assert observed.held_by.who == "a process whose pid is not visible here"
        finally:
            observed.close()


def test_a_flock_on_the_lock_file_keeps_cleanerd_out_and_is_kept_out(tmp_path: Path) -> None:
    """A tool run under `flock(1)` takes a `flock` lock on `.lock`, which never conflicts
    with a POSIX lock (Kafka's, cleanerd's): cleanerd took such a dir, and in a trial cut
    the tails the tool was still writing. A `flock` holder now keeps cleanerd out, the
    dir is observed and the holder named; while cleanerd holds the dir, a `flock` on it
    is refused."""
    with held_by_other_process(HOLD_FLOCK, tmp_path):
        with pytest.raises(LogDirLockedError):
            LogDirLock(tmp_path).acquire()
        pid = lock_holder(tmp_path)
        assert pid is not None
        assert pid != os.getpid()
        assert b"fcntl.flock" in Path(f"/proc/{pid}/cmdline").read_bytes()
        observed = LogDir.open(tmp_path, state_dir=tmp_path / "state")
        try:
            assert observed.mode is Mode.OBSERVE
            assert observed.held_by is not None
            assert observed.held_by.pid == pid
        finally:
            observed.close()
        # Where /proc/locks is hidden (the unit's ProcSubset=pid), still seen as held.
        real_read_text = Path.read_text

        def hidden(self: Path, *args: Any, **kwargs: Any) -> str:
            if self == Path("/proc/locks"):
                raise PermissionError(13, "Permission denied", str(self))
            return real_read_text(self, *args, **kwargs)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Path, "read_text", hidden)
            assert lock_holder(tmp_path) == 0
    assert lock_holder(tmp_path) is None
    take = (
        "import fcntl, os, sys; "
        "fcntl.flock(os.open(sys.argv[1], os.O_RDONLY), fcntl.LOCK_EX | fcntl.LOCK_NB)"
    )
    with LogDirLock(tmp_path):
        refused = subprocess.run(
            [sys.executable, "-c", take, str(tmp_path / ".lock")], capture_output=True, check=False
        )
    assert refused.returncode != 0
    assert b"BlockingIOError" in refused.stderr
    freed = subprocess.run([sys.executable, "-c", take, str(tmp_path / ".lock")], check=False)
    assert freed.returncode == 0
