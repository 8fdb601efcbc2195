"""The proof a process gives before it changes a log dir in another process's name.

A log dir has one owner: the process holding the POSIX lock on its `.lock`
(`lock.LogDirLock`). Helper processes (a clean pass in a worker, a Spark job's output
installed later, an append through `cleanerd produce` beside a daemon) change the dir
in the owner's name, on a snapshot the owner planned. Their right to do so ends with
the owner: once it has died (the kernel dropped its lock) or let go of the dir, a new
owner may be recovering, rolling or cleaning the same partitions, and a stale swap
would destroy its work. So, under the partition lock and right before its first rename,
such a process proves two things:

1. **the owner still holds the dir** (`OwnerProof.verify`): the process that holds the
   lock on `.lock` is the owner named when the work was planned. The holder is asked of
   the kernel (`fcntl(F_GETLK)`, which reports the pid of a conflicting POSIX lock);
   the owner itself looks in its own registry of held locks instead, because opening
   and closing `.lock` in the owning process would drop its lock. A pid is matched with
   its start time (`ProcessId`), so a later process that reuses the owner's pid is not
   taken for it;
2. **its inputs are still the files on disk** (`verify_segments`): each segment it read
   is the same file (inode) with the same size (the active segment may have grown).
   Segment files are never modified in place once inactive, only replaced by renames,
   so inode and size name their content.

Neither proof can stop the owner from dying a moment after it was given; that is the
lifeline's job (`cleanerd.engine.lifeline`: helpers are killed with their owner), and
every change is a sequence of renames whose every prefix recovery completes or rolls
back, under the partition lock that the next owner's recovery also takes.
"""

from __future__ import annotations

import fcntl
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Self

from cleanerd.errors import CleanerdError
from cleanerd.log.files import LOCK_FILE_NAME, log_file
from cleanerd.log.lock import OwnerLock, flock_refused, holds_log_dir_lock, holds_replaced_lock
from cleanerd.log.meta import SegmentMeta

_FLOCK: Final = struct.Struct("hhqqi")
"""`struct flock` on Linux: l_type, l_whence, l_start, l_len, l_pid (native alignment)."""


class StaleWork(CleanerdError):
    """Work planned on a state of the log dir that no longer holds; nothing was changed.
    Not a fault of the partition: the owner plans it again."""


class OwnershipLost(StaleWork):
    """The owner named when the work was planned no longer holds the log dir."""


class SegmentsChanged(StaleWork):
    """A segment the work read was replaced, removed or changed size since."""


@dataclass(frozen=True, slots=True)
class ProcessId:
    """One process for the life of the machine: its pid and its start time (field 22 of
    `/proc/<pid>/stat`, clock ticks since boot). A pid alone is reused."""

    pid: int
    start_ticks: int | None

    @classmethod
    def current(cls) -> Self:
        """This process."""
        return cls(os.getpid(), start_ticks(os.getpid()))

    def alive(self) -> bool:
        """Whether this very process still runs (without `/proc`: whether any process has
        the pid)."""
        if self.start_ticks is None:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True
        return start_ticks(self.pid) == self.start_ticks


def start_ticks(pid: int) -> int | None:
    """The start time of `pid` in clock ticks since boot, or None when no such process
    exists (or there is no `/proc`)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its end.
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[19])


def lock_holder(log_dir: Path) -> int | None:
    """The pid of the process holding `log_dir`'s `.lock`: its POSIX lock (a broker's,
    cleanerd's), else a `flock` lock on it (a tool run under `flock(1)`); None when
    nobody holds it (or it does not exist). 0 for a holder whose pid cannot be seen: the
    kernel gives -1 for an open file description lock (`F_OFD_SETLK`), which belongs to
    no process."""
    if holds_log_dir_lock(log_dir):
        return os.getpid()
    try:
        fd = os.open(log_dir / LOCK_FILE_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        probe = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        kind, _, _, _, pid = _FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_GETLK, probe))
        st = os.fstat(fd)
    finally:
        os.close(fd)  # this process holds no lock on the file: closing drops nothing
    if kind != fcntl.F_UNLCK:
        return max(int(pid), 0)
    return flock_holder(log_dir / LOCK_FILE_NAME, st.st_dev, st.st_ino)


def flock_holder(path: Path, dev: int, ino: int) -> int | None:
    """The pid holding a `flock` lock on the file `path` (`dev`, `ino`), from
    `/proc/locks` (F_GETLK cannot see one: the two kinds of lock never conflict); None
    when none does. Its lines read `N: FLOCK ADVISORY WRITE <pid> <major>:<minor>:<inode>
    0 EOF`, major and minor in hex; a waiter's has `->` after the number. Where
    `/proc/locks` is hidden (the unit's `ProcSubset=pid`), or names the file by another
    device number, a shared `flock` that is refused says an exclusive one is held: 0, a
    holder whose pid cannot be seen."""
    try:
        text = Path("/proc/locks").read_text()
    except OSError:
        text = ""
    file = f"{os.major(dev):02x}:{os.minor(dev):02x}:{ino}"
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == file:
            return int(fields[4])
    # Hidden, or no line names the file by the device `stat` gives, which is not always
    # the one /proc/locks prints (btrfs gives a subvolume's): held by a holder not seen,
    # or not. The probe drops no lock of this process's: it holds no POSIX lock on the
    # file (`lock_holder` checked for `.lock`; the owner marker is only ever flocked).
    return 0 if flock_refused(path, fcntl.LOCK_SH) else None


@dataclass(frozen=True, slots=True)
class Holder:
    """Another process holding a log dir's `.lock`: a cleanerd owner (it holds the owner
    marker in the same state dir), or anything else (a Kafka broker)."""

    log_dir: Path
    pid: int | None
    """None or 0 when its pid cannot be seen from here (another pid namespace, `/proc`
    hidden) or it let go since."""
    cleanerd: bool
    command: str | None = None
    """The cleanerd command the holder runs (`run`, `clean`, `produce`...), when it is a
    cleanerd process (of this state dir or another) and that can be read."""

    @classmethod
    def of(cls, log_dir: Path, state_dir: Path) -> Holder:
        """Who holds `log_dir`'s `.lock` now (pid None: nobody, or it let go since), and
        whether it is a cleanerd owner of `state_dir`."""
        pid = lock_holder(log_dir)
        if pid is None:
            return cls(log_dir, pid, cleanerd=False)
        marker = OwnerLock(state_dir, log_dir)
        # The owner is the process that holds `.lock` and the marker: the marker held by
        # another (a momentary look by another command) is no owner of a broker's dir.
        # Where either holder cannot be seen (0), that the marker is held must do.
        seen = _marker_holder(state_dir, log_dir)
        ours = marker.held_elsewhere() if seen == 0 or pid == 0 else seen == pid
        # A cleanerd process of another state dir is no owner of this one, but is named
        # as what it is, and a one-shot one is waited for all the same.
        command = (marker.holder_command() if ours else None) or (
            cleanerd_command(pid) if pid else None
        )
        return cls(log_dir, pid, cleanerd=ours, command=command)

    @property
    def ends_by_itself(self) -> bool:
        """A cleanerd holder running a one-shot command (`produce`, `clean`), which lets
        go of the dir when it is done, unlike a daemon."""
        return self.command is not None and self.command != "run"

    @property
    def who(self) -> str:
        """`pid N`, or what stands for a pid that cannot be seen."""
        return f"pid {self.pid}" if self.pid else "a process whose pid is not visible here"

    @property
    def described(self) -> str:
        """Who it is, for an operator: cleanerd, or what a holder that is not is likely
        to be."""
        if self.cleanerd:
            return f"cleanerd ({self.who}: {self._running} owns it)"
        if self.command is not None:
            return f"{self.who} ({self._running}, of another state_dir)"
        return f"{self.who} (a running Kafka broker?)"

    @property
    def _running(self) -> str:
        if self.command is None:
            return "a running daemon or another command"
        return f"`cleanerd {self.command}`"

    def __str__(self) -> str:
        return f"{self.log_dir / LOCK_FILE_NAME} is held by {self.described}: observed only"

    def refusal(self) -> str:
        """Why a second cleanerd owner is refused (a cleanerd holder only), or waits."""
        if self.ends_by_itself:
            return (
                f"log dir {self.log_dir} is owned for now by another cleanerd process "
                f"({self.who}: {self._running}), which lets go when it is done"
            )
        return (
            f"log dir {self.log_dir} is owned by another cleanerd process ({self.who}: "
            f"{self._running}); only one may own it: stop that one first "
            "(`cleanerd plan` and `cleanerd audit` only read and can run beside it)"
        )


def cleanerd_command(pid: int) -> str | None:
    """The cleanerd command process `pid` runs (`cleanerd run ...`, `python -m cleanerd
    produce ...`: `run`, `produce`), from `/proc/<pid>/cmdline`; None when it cannot be
    read or names none."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    words = [a.decode(errors="replace") for a in args]
    for i, word in enumerate(words):
        if word == "cleanerd" or word.endswith("/cleanerd"):
            return next((w for w in words[i + 1 :] if w and not w.startswith("-")), None)
    return None


@dataclass(frozen=True, slots=True)
class OwnerProof:
    """The owner of `log_dir` named when work on it was planned (picklable)."""

    log_dir: Path
    owner: ProcessId

    @classmethod
    def of_this_process(cls, log_dir: Path) -> Self:
        """Work planned by this process, which must hold `log_dir`."""
        return cls(log_dir, ProcessId.current())

    def verify(self) -> None:
        """Raise OwnershipLost unless the owner is alive and holds the dir's `.lock`."""
        if not self.owner.alive():
            raise OwnershipLost(
                f"the owner of {self.log_dir} (pid {self.owner.pid}) has exited: "
                "nothing is changed in its name"
            )
        holder = lock_holder(self.log_dir)
        if holder is None and self.owner.pid == os.getpid() and holds_replaced_lock(self.log_dir):
            raise OwnershipLost(
                f"{self.log_dir / LOCK_FILE_NAME} is no longer the file this process "
                "locked, and nobody holds it: the dir or its .lock was replaced or removed, "
                "or its disk unmounted and mounted again; nothing is changed in its name (a "
                "restart of cleanerd takes it again, the operator's word that it is the "
                "same dir)"
            )
        if holder != self.owner.pid:
            held = "nobody holds it" if holder is None else f"pid {holder} holds it"
            raise OwnershipLost(
                f"{self.log_dir / LOCK_FILE_NAME} is no longer held by its owner "
                f"(pid {self.owner.pid}): {held}; nothing is changed in its name"
            )


class AppenderOwner:
    """The cleanerd owner that an appender beside it (shared mode: `cleanerd produce`, an
    application's log library) writes beside, proven before each of its rolls. When that
    owner is gone and another cleanerd owner of the same state dir holds the dir (the
    daemon restarted), the appender goes on beside the new one: the partition locks
    coordinate it with any owner of the state dir. A dir nobody holds, or that another
    program (a broker) holds, is written nothing in anyone's name (OwnershipLost)."""

    def __init__(self, proof: OwnerProof, state_dir: Path) -> None:
        self.proof = proof
        self.state_dir = state_dir

    def verify(self) -> None:
        """Raise OwnershipLost unless the owner, or a cleanerd owner of the state dir
        that took the dir after it, is alive and holds the dir's `.lock`."""
        try:
            self.proof.verify()
        except OwnershipLost:
            log_dir = self.proof.log_dir
            pid = lock_holder(log_dir)
            # The very process that holds `.lock` must be seen holding the state dir's
            # owner marker: nothing is written in the name of one that cannot be seen.
            if not pid or _marker_holder(self.state_dir, log_dir) != pid:
                raise
            followed = OwnerProof(log_dir, ProcessId(pid, start_ticks(pid)))
            followed.verify()
            self.proof = followed


def _marker_holder(state_dir: Path, log_dir: Path) -> int | None:
    """The pid holding the owner marker of `log_dir` in `state_dir` (`flock_holder`: 0
    when it cannot be seen); None when nobody does or there is none."""
    path = OwnerLock(state_dir, log_dir).path
    try:
        st = path.stat()
    except OSError:
        return None
    return flock_holder(path, st.st_dev, st.st_ino)


def verify_segments(dir_path: Path, segments: Sequence[SegmentMeta]) -> None:
    """Raise SegmentsChanged unless every segment of `segments` (a snapshot, ascending,
    the active one last) is still the same `.log` file: the same inode where the
    snapshot has one, the same size (the last, active one: at least that size)."""
    for n, seg in enumerate(segments):
        path = log_file(dir_path, seg.base_offset)
        try:
            st = path.stat()
        except FileNotFoundError:
            raise SegmentsChanged(f"{path} was removed since it was read") from None
        check_same_file(path, st, seg, active=n == len(segments) - 1)


def check_same_file(path: Path, st: os.stat_result, seg: SegmentMeta, *, active: bool) -> None:
    """Raise SegmentsChanged unless `st` (of `path`) is the `.log` file the snapshot `seg`
    saw: the same inode where the snapshot has one, the same size (the `active` segment,
    the only one appended to: at least that size)."""
    if seg.inode is not None and st.st_ino != seg.inode:
        raise SegmentsChanged(f"{path} was replaced since it was read")
    grown = active and st.st_size > seg.size_bytes
    if st.st_size != seg.size_bytes and not grown:
        raise SegmentsChanged(f"{path} is {st.st_size} bytes, {seg.size_bytes} when it was read")
