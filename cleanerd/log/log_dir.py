"""One Kafka log dir (an entry of `log.dirs`): its partitions, root checkpoints, identity
and ownership.

Layout of the root (Kafka's LogManager)::

    .lock                              POSIX-locked by whoever owns the dir
    .kafka_cleanshutdown               present only while nobody owns the dir after a
                                       clean stop (Kafka's marker)
    meta.properties                    identity (read only)
    cleaner-offset-checkpoint          first dirty offset per compacted partition
    log-start-offset-checkpoint        log start offsets above the first segment base
    recovery-point-offset-checkpoint   offsets known flushed
    replication-offset-checkpoint      high watermarks (the broker's; only read)
    <topic>-<partition>/               partition dirs
    <topic>-<partition>.<uuid>-delete  (and -future, -stray): never touched

Ownership (DESIGN section 2):

- `OWNER`: this process holds `.lock` (and the owner marker in the state dir); it may
  recover, roll, clean, delete and write the root checkpoints.
- `SHARED`: `.lock` is held by another cleanerd process (its owner marker is held);
  this process may only append, coordinated by partition locks (`cleanerd produce`),
  and proves before each roll that the owner, or a cleanerd owner of the same state dir
  that took the dir after it, holds the dir (`ownership.AppenderOwner`).
- `OBSERVE`: read only. Chosen, or forced when `.lock` is held by anything else (a live
  broker), with a warning naming the dir.

A second would-be owner when a cleanerd process already owns the dir (a second daemon
on the same state dir, or `cleanerd clean` beside the daemon) is refused with
`LogDirLockedError` naming the owner's pid, not demoted to observe mode: observing would
let it exit 0 having done nothing.

Clean shutdown (Kafka's rule): an owner that stops cleanly flushes every partition it
opened, writes a producer snapshot and the root checkpoints, then writes
`.kafka_cleanshutdown` (`{"version":0,"brokerEpoch":-1}`: the JSON of Kafka's
CleanShutdownFileHandler, whose reader matches the field name case-sensitively,
with no broker epoch). The next owner (cleanerd or a broker) that finds it skips the
recovery walk of unflushed segments; cleanerd's stop also keeps what it knew of every
segment in the state dir (`known_segments.py`), which its next start (and, while the
marker is there, an observer such as `plan`) takes instead of reading each segment
again. The daemon keeps it after each cycle that changed the segments too, and a start
after a crash takes it for the segments wholly below the recovery point (`recovery.py`).
cleanerd removes the marker (and fsyncs the dir) as soon
as it owns the dir, before any write, so a crash after that start is never taken for a
clean stop, and trusts it only for the first open of each partition. A stop that
failed to flush or checkpoint a partition, or that did not open every partition of the
dir (one was refused or damaged), or whose process met damage in any of them since,
writes no marker.

`__cluster_metadata` is always opened read-only, and nothing of cleanerd's own is ever
written inside a partition dir: locks and quarantined bytes live in the state dir.

Symbolic links: the log dir itself may be one (a data disk mounted elsewhere). Inside it,
an entry named `<topic>-<partition>` that is a link (to a dir or not, inside the log dir
or not) is listed by `partitions` so that opening it reports it: `PartitionLog.open`
refuses it with a warning naming the link and its target (`SymlinkRefused`), in every
mode, and the partition is skipped. Nothing is ever created, renamed or deleted through
such a link, so a link to a foreign dir can never turn recovery or retention on it.
"""

from __future__ import annotations

import enum
import errno
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

from cleanerd.errors import CleanerdError, LogDirLockedError, file_step
from cleanerd.log.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
    RootCheckpoints,
)
from cleanerd.log.files import (
    CLEAN_SHUTDOWN_FILE_NAME,
    LOCK_FILE_NAME,
    METADATA_TOPIC,
    TopicPartition,
    list_partitions,
)
from cleanerd.log.fsutil import atomic_write, fsync_dir
from cleanerd.log.known_segments import (
    Known,
    KnownDir,
    KnownFile,
    known_segments_path,
    read_known_segments,
    write_known_segments,
)
from cleanerd.log.lock import LogDirLock, OwnerLock, default_state_dir
from cleanerd.log.ownership import (
    AppenderOwner,
    Holder,
    OwnerProof,
    ProcessId,
    cleanerd_command,
    lock_holder,
    start_ticks,
)
from cleanerd.log.partition_log import LogConfig, PartitionLog
from cleanerd.log.properties import META_PROPERTIES, MetaProperties, read_meta_properties
from cleanerd.logger import get_logger

log = get_logger(__name__)


class ReadOnlyFileSystem(CleanerdError):
    """An owned log dir whose file system is mounted read-only (`LogDir.verify_writable`)."""


class Mode(enum.Enum):
    """What this process may do to the log dir."""

    OWNER = "owner"
    SHARED = "shared"
    OBSERVE = "observe"


class LogDir:
    """A log dir opened in one of the three modes; use `open`, and `close` when done."""

    def __init__(
        self,
        path: Path,
        mode: Mode,
        *,
        state_dir: Path,
        dir_lock: LogDirLock | None = None,
        owner_lock: OwnerLock | None = None,
        owner: AppenderOwner | None = None,
        held_by: Holder | None = None,
    ) -> None:
        self.path = path
        self.mode = mode
        self.owner = owner
        """Shared mode: the cleanerd process that owns the dir, proven before each roll."""
        self.held_by = held_by
        """Observe mode forced by another holder of `.lock`: who it is."""
        self.state_dir = state_dir
        self._dir_lock = dir_lock
        self._owner_lock = owner_lock
        self.checkpoints = RootCheckpoints.read(path)
        self.had_clean_shutdown = False
        """Owner mode: the previous owner stopped cleanly (its marker was found)."""
        self.owner_trusts = False
        """Observe mode, set by `plan` for a dir a cycle would own that holds the
        clean-shutdown marker: its owner's open would trust the segments as they are, and
        nobody writes them (a bad active tail is damage, not an append in flight)."""
        self._known: Known = {}
        """What cleanerd last kept of the segments (`known_segments.py`), taken by the
        first open of each partition (owner mode, or observe mode while the clean-shutdown
        marker is there)."""
        self.known_dirs: dict[str, KnownDir] = {}
        """The partition dirs as cleanerd last kept them, by name (`KnownDir`)."""
        self._opened: set[TopicPartition] = set()
        self.marked_clean = False
        """Observe mode: the clean-shutdown marker was there at the open."""
        self._kept: Known | None = None
        """Observe mode: what cleanerd last kept of the segments, read for
        `foresee_open_damage` (the first open of each partition takes `_known`)."""

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        observe: bool = False,
        allow_shared: bool = False,
        state_dir: Path | None = None,
    ) -> LogDir:
        """Open `path`: owner mode unless `observe`; if another process holds `.lock`,
        shared mode when `allow_shared` and that process is a cleanerd owner, else
        observe mode (with a warning)."""
        state = default_state_dir() if state_dir is None else state_dir
        if observe:
            observer = cls(path, Mode.OBSERVE, state_dir=state)
            observer.marked_clean = (path / CLEAN_SHUTDOWN_FILE_NAME).exists()
            if observer.marked_clean:  # nobody owned it since the stop
                observer._take_known(read_known_segments(state, path))
            return observer
        if lock_holder(path) not in (None, os.getpid()):
            # Held (a broker's, most likely): asked read-only, so that not even an open
            # for writing reaches the holder's dir (a lock attempt needs one), and a dir
            # this process may not write (a read-only mount, the broker user's files) is
            # observed as any held dir is.
            return cls._beside_holder(path, state, allow_shared=allow_shared)
        dir_lock = LogDirLock(path)
        try:
            dir_lock.acquire()
        except LogDirLockedError:
            return cls._beside_holder(path, state, allow_shared=allow_shared)
        owner_lock = OwnerLock(state, path)
        if not owner_lock.acquire(cleanerd_command(os.getpid())):
            dir_lock.release()
            raise LogDirLockedError(path)
        try:
            owned = cls(path, Mode.OWNER, state_dir=state, dir_lock=dir_lock, owner_lock=owner_lock)
        except BaseException:  # a root checkpoint file that cannot be read
            owner_lock.release()
            dir_lock.release()
            raise
        try:
            owned.had_clean_shutdown = owned._take_clean_shutdown_marker()
            # After a crash too: each open takes only what still describes its files, and
            # then only below the recovery point (`PartitionLog.open`).
            owned._take_known(read_known_segments(state, path))
        except BaseException:
            owned.close()
            raise
        return owned

    @classmethod
    def _beside_holder(cls, path: Path, state: Path, *, allow_shared: bool) -> LogDir:
        """`path`, whose `.lock` another process holds, as `open` takes it: shared with a
        cleanerd owner when `allow_shared`, refused when that holder is a cleanerd owner
        of `state` or a one-shot command, else observed (with a warning)."""
        held = Holder.of(path, state)
        if allow_shared and held.pid is not None and held.cleanerd:
            log.info("log_dir.shared", log_dir=str(path), owner_pid=held.pid)
            owner = OwnerProof(path, ProcessId(held.pid, start_ticks(held.pid)))
            return cls(path, Mode.SHARED, state_dir=state, owner=AppenderOwner(owner, state))
        if held.cleanerd or held.ends_by_itself:
            # Two cleanerd owners of one state dir would each believe they own the dir,
            # and observing it would look like success: refuse, naming the first. A
            # one-shot command (of any state dir) lets go: its caller may try again.
            refused = LogDirLockedError(path, held.refusal(), ends_by_itself=held.ends_by_itself)
            raise refused from None  # `open` may be handling the lock's refusal
        observed = cls(path, Mode.OBSERVE, state_dir=state, held_by=held)
        log.warning("log_dir.observe_forced", log_dir=str(path), reason=str(held))
        return observed

    def _take_known(self, kept: KnownFile) -> None:
        self._known, self.known_dirs = kept.segments, kept.dirs

    def _take_clean_shutdown_marker(self) -> bool:
        """Remove the clean-shutdown marker before anything is written; whether it was
        there."""
        marker = self.path / CLEAN_SHUTDOWN_FILE_NAME
        if not marker.exists():
            return False
        with file_step("removing the clean-shutdown marker", marker):
            marker.unlink()
            fsync_dir(self.path)
        log.info("log_dir.clean_shutdown_found", log_dir=str(self.path))
        return True

    def keep_known_segments(self, logs: Iterable[PartitionLog]) -> bool:
        """Keep what is known of the segments of `logs` for the next owner's start (owner
        mode: at a clean stop, before the marker, and by the daemon after a cycle that
        changed them; see `known_segments.py`); whether it was kept. A failure is
        logged, naming the file, and stops nothing: the next start then reads the
        segments (what an older file says is only taken for files it still describes)."""
        if self.mode is not Mode.OWNER:
            raise PermissionError(f"only the owner keeps what it knew of {self.path}")
        known = []
        dirs: dict[str, tuple[int, int]] = {}
        for plog in logs:
            name, segments = str(plog.topic_partition), plog.known_segments()
            known.append((name, segments))
            stamp = plog.settled_dir_stamp()
            if stamp is not None and len(segments) == len(plog.segments):
                dirs[name] = stamp
        try:
            write_known_segments(self.state_dir, self.path, known, dirs)
        except OSError as exc:
            path = known_segments_path(self.state_dir, self.path)
            log.warning("known_segments.not_kept", path=str(path), error=str(exc))
            return False
        return True

    def mark_clean_shutdown(self) -> None:
        """Write the clean-shutdown marker (owner mode; the caller has flushed and
        checkpointed every partition of the dir)."""
        if self.mode is not Mode.OWNER:
            raise PermissionError(f"only the owner marks {self.path} cleanly stopped")
        marker = self.path / CLEAN_SHUTDOWN_FILE_NAME
        with file_step("writing the clean-shutdown marker", marker):
            atomic_write(marker, b'{"version":0,"brokerEpoch":-1}')

    def close(self) -> None:
        """Release the locks (owner mode)."""
        if self._owner_lock is not None:
            self._owner_lock.release()
        if self._dir_lock is not None:
            self._dir_lock.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def read_only(self) -> bool:
        """True in observe mode."""
        return self.mode is Mode.OBSERVE

    @property
    def meta_properties(self) -> MetaProperties | None:
        """`meta.properties`, or None when the dir has none (not yet used by a broker)."""
        path = self.path / META_PROPERTIES
        return read_meta_properties(path) if path.exists() else None

    # -- partitions ----------------------------------------------------------------------

    def partitions(self) -> dict[TopicPartition, Path]:
        """Every live partition dir, by topic-partition (`list_partitions`)."""
        return list_partitions(self.path)

    def opens_cleanly(self, tp: TopicPartition) -> bool:
        """Whether `open_partition(tp)` would open it as after a clean shutdown (the
        marker was found and `tp` not opened since, or `owner_trusts`)."""
        return (self.had_clean_shutdown and tp not in self._opened) or self.owner_trusts

    def foresee_open_damage(self, plog: PartitionLog, *, walk: bool = True) -> None:
        """Observe mode, in a dir a cycle would own (nobody holds it): have `plog`, just
        opened here, find the damage the owner's open would find
        (`PartitionLog.foresee_open_damage`, `walk` as its), with what cleanerd last
        kept of its segments; nothing to find after a clean stop, whose open trusts the
        segments."""
        if self.owner_trusts or self.marked_clean:
            return
        if self._kept is None:
            self._kept = read_known_segments(self.state_dir, self.path).segments
        plog.foresee_open_damage(self._kept.get(str(plog.topic_partition)), walk=walk)

    def knows(self, tp: TopicPartition) -> bool:
        """Whether what cleanerd last kept of `tp`'s segments is there (a segment at
        least), not yet taken."""
        return bool(self._known.get(str(tp)))

    def open_partition(
        self,
        tp: TopicPartition,
        *,
        config: LogConfig | None = None,
        full_check: bool = False,
        prefetch: bool = True,
        check_later: bool = False,
    ) -> PartitionLog:
        """Open an existing partition with this dir's mode (the metadata log is always
        read-only; only the owner recovers); `prefetch` and `check_later` as
        `PartitionLog.open`'s."""
        read_only = self.read_only or tp.topic == METADATA_TOPIC
        first_open = tp not in self._opened
        clean_shutdown = self.opens_cleanly(tp)
        self._opened.add(tp)
        known = self._known.pop(str(tp), None)
        return PartitionLog.open(
            self.path / str(tp),
            config=config,
            state_dir=self.state_dir,
            read_only=read_only,
            recover=self.mode is Mode.OWNER and not read_only,
            checkpoints=self.checkpoints,
            full_check=full_check,
            owner=self.owner,
            clean_shutdown=clean_shutdown,
            known=known if first_open else None,
            prefetch=prefetch,
            check_later=check_later,
        )

    def create_partition(
        self, tp: TopicPartition, *, config: LogConfig | None = None
    ) -> PartitionLog:
        """Open a partition, creating its dir and first segment if missing."""
        if self.read_only or tp.topic == METADATA_TOPIC:
            raise PermissionError(f"cannot create {tp} in {self.path} ({self.mode.value} mode)")
        if (self.path / str(tp)).exists():
            return self.open_partition(tp, config=config)
        return PartitionLog.create(
            self.path,
            tp,
            config=config,
            state_dir=self.state_dir,
            checkpoints=self.checkpoints,
            owner=self.owner,
        )

    def verify_writable(self) -> None:
        """Raise ReadOnlyFileSystem when the dir's file system refuses writes: mounted
        read-only, or made so by the kernel after an I/O error (`errors=remount-ro`, which
        recent kernels apply without the read-only mount flag, so `statvfs` cannot tell),
        and an owner could then only fail every step there, each with its own error, the
        dir looking online. As Kafka takes a log dir offline at its first failed write,
        the owner's cycle takes it offline until the file system takes writes again
        (observe mode writes nothing).

        The probe touches `.lock` (its times set to now, which any user who may write the
        file may do, its owner or not: a broker's `.lock` is kafka's, cleanerd writes it
        through the group): a write that either kind of read-only file system refuses
        with EROFS, which changes nothing else, and which does not open the file (closing
        any descriptor of it would drop this process's lock). Any other refusal is not
        this check's to judge."""
        try:
            os.utime(self.path / LOCK_FILE_NAME)
        except OSError as exc:
            if exc.errno != errno.EROFS:
                return
            raise ReadOnlyFileSystem(
                f"{self.path}: its file system refuses writes, read-only (mounted so, or "
                "made so by the kernel after an I/O error, errors=remount-ro): nothing can "
                "be rolled, deleted, cleaned or checkpointed there until it takes writes "
                "again"
            ) from None

    # -- root checkpoints --------------------------------------------------------------------

    def reload_checkpoints(self) -> RootCheckpoints:
        """Re-read the root checkpoint files (a broker or the cleaner may have moved them)."""
        self.checkpoints = RootCheckpoints.read(self.path)
        return self.checkpoints

    def _write(self, name: str, offsets: Mapping[TopicPartition, int]) -> None:
        if self.mode is not Mode.OWNER:
            raise PermissionError(f"only the owner writes {name} in {self.path}")
        live = self.partitions()
        path = self.path / name
        with file_step(f"writing {name}", path):
            OffsetCheckpointFile(path).write({tp: o for tp, o in offsets.items() if tp in live})

    def write_cleaner_offsets(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Replace `cleaner-offset-checkpoint` (entries of vanished partitions dropped)."""
        self._write(CLEANER_OFFSET_CHECKPOINT, offsets)
        self.checkpoints = RootCheckpoints.read(self.path)

    def update_cleaner_offset(self, tp: TopicPartition, offset: int) -> None:
        """Set one partition's first dirty offset, keeping the other entries."""
        current = OffsetCheckpointFile(self.path / CLEANER_OFFSET_CHECKPOINT).read()
        current[tp] = offset
        self.write_cleaner_offsets(current)

    def checkpoint_logs(self, logs: Iterable[PartitionLog]) -> None:
        """Write `recovery-point-offset-checkpoint` and `log-start-offset-checkpoint` for
        `logs` (the latter only where the start is above the first base, as Kafka does);
        entries of partitions not in `logs` are kept."""
        logs = list(logs)
        recovery = dict(self.checkpoints.recovery_points)
        starts = dict(self.checkpoints.log_start_offsets)
        for plog in logs:
            tp = plog.topic_partition
            recovery[tp] = plog.recovery_point_to_checkpoint
            starts.pop(tp, None)
            if plog.segments and plog.log_start_offset > plog.segments[0].base_offset:
                starts[tp] = plog.log_start_offset
        self._write(RECOVERY_POINT_OFFSET_CHECKPOINT, recovery)
        self._write(LOG_START_OFFSET_CHECKPOINT, starts)
        self.checkpoints = RootCheckpoints.read(self.path)
