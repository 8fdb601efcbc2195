"""Who may write a log dir, and one partition at a time.

`LogDirLock` is the broker's own lock: an exclusive POSIX record lock
(`fcntl.lockf`, which is `fcntl(F_SETLK)`, what the JVM's `FileChannel.tryLock` takes on
Linux) on `<log.dir>/.lock`, created if missing as a broker does. Holding it for the
life of the process means a broker cannot start on a dir cleanerd maintains, and
cleanerd sees a running broker (or another cleanerd) as `LogDirLockedError` and falls
back to observe mode.

POSIX record locks belong to the process and are released when *any* descriptor of the
file is closed, so a process must open each `.lock` once: the module keeps a registry of
held locks by device and inode, and a second acquisition in the same process is refused
rather than silently dropping the first lock.

`OwnerLock` tells cleanerd processes apart from a broker: the cleanerd process that owns
a log dir (holds its `.lock`) also holds an `flock` on
`<state dir>/locks/<log dir key>/owner.lock`. Another cleanerd process (`cleanerd
produce`) that finds `.lock` taken checks that file: held means a cleanerd owner, with
which appends are coordinated through partition locks; free means a broker or another
program, whose dir is only observed. The holder writes its command (`run`, `produce`)
into the file, so a daemon starting beside an application's `produce` of the same state
dir can tell a one-shot owner, which it waits for, from another daemon, even where the
other user's `/proc/<pid>` is hidden from it (a holder of another state dir is known by
its `/proc/<pid>/cmdline` only, where that can be read).

`checkpoint_lock` serializes the rewrites of a log dir's `cleaner-offset-checkpoint`
across processes: the file is rewritten whole (read, change one entry, tmp file, fsync,
rename) by every pass, in whichever worker process it runs, and by the manager's
resets, so without it one writer's entry could be lost to another's rewrite. It is an
`flock` on `<state dir>/locks/<log dir key>/cleaner-offset-checkpoint.lock` (not a
`<topic>-<partition>.lock` name, so it never collides with a partition lock), held for
the one small rewrite.

`PartitionLock` coordinates cleanerd processes (the daemon and `cleanerd produce`) on
one partition: appends, rolls, swaps and deletions take it for their short critical
section. It is an `flock` on `<state dir>/locks/<log dir key>/<topic>-<partition>.lock`,
outside the log dir so a Kafka broker never sees a foreign file. `flock` locks belong
to the open file description, so the lock also excludes other lock objects in the same
process; a thread lock on top makes it safe across threads, and a depth counter makes it
reentrant for the thread holding it. Waiting is bounded: polling with a short backoff up
to a timeout, after which `PartitionLockTimeout` names the lock file.

A partition's lock file goes with its partition (`remove_partition_lock`, once the
partition dir is gone: a topic deleted), so the state dir does not keep one file per
partition that ever was. Removal is safe beside acquirers because of how both work: the
remover unlinks the file only while it holds its `flock`, and an acquirer, once it has
the `flock`, checks that the path still names the file it locked (device and inode) and
starts again otherwise. Whoever holds a partition lock therefore holds it on the file
the path names, the one every later acquirer opens. (A process of a cleanerd from before
the check does not make it: the processes that share a state dir are upgraded together.)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import os
import re
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from cleanerd.errors import CleanerdError, LogDirLockedError
from cleanerd.log.files import LOCK_FILE_NAME, TopicPartition, parse_topic_partition
from cleanerd.log.fsutil import adopt_owner

DEFAULT_LOCK_TIMEOUT_S: Final = 30.0
_POLL_START_S: Final = 0.001
_POLL_MAX_S: Final = 0.05

_held_lock: dict[tuple[int, int], LogDirLock] = {}
_held_lock_guard = threading.Lock()


class PartitionLockTimeout(CleanerdError):
    """Another process held a partition lock for longer than the timeout."""

    def __init__(self, path: Path, timeout_s: float) -> None:
        self.path = str(path)
        super().__init__(f"timed out after {timeout_s:g} s waiting for partition lock {path}")


def log_dir_key(log_dir: Path) -> str:
    """A short stable name for a log dir, used for per-dir folders in the state dir."""
    return _key_of_resolved(str(log_dir.absolute()))


@functools.lru_cache(maxsize=1024)
def state_subdir(state_dir: Path, kind: str, log_dir: Path) -> Path:
    """`<state dir>/<kind>/<log dir key>`, made once per process and dir (a start that
    opens 10,000 partitions asks for their lock and quarantine dirs 20,000 times)."""
    return state_dir / kind / log_dir_key(log_dir)


@functools.lru_cache(maxsize=1024)
def _key_of_resolved(log_dir: str) -> str:
    # Resolved once per process and dir: opening 10,000 partitions asks 20,000 times.
    return hashlib.sha256(os.path.realpath(log_dir).encode()).hexdigest()[:16]


def default_state_dir() -> Path:
    """Where cleanerd keeps its state when none is configured.

    `$CLEANERD_STATE_DIR`, else `$XDG_RUNTIME_DIR/cleanerd`, else a per-user folder in
    the temp dir; every process of one user on one host finds the same locks there.
    """
    if env := os.environ.get("CLEANERD_STATE_DIR"):
        return Path(env)
    if runtime := os.environ.get("XDG_RUNTIME_DIR"):
        return Path(runtime) / "cleanerd"
    return Path(tempfile.gettempdir()) / f"cleanerd-{os.getuid()}"


class LogDirLock:
    """The exclusive POSIX lock on `<log.dir>/.lock`, and a `flock` lock on it too, held
    until `release`: a broker takes the first (Java's `FileChannel.tryLock`), a tool
    run under `flock(1)` the second, and the two kinds never conflict, so a holder of
    either keeps cleanerd out (and cleanerd keeps either out)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.path = log_dir / LOCK_FILE_NAME
        self._fd: int | None = None
        self._key: tuple[int, int] | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise LogDirLockedError if any process (this one included,
        through another object) holds it."""
        if self._fd is not None:
            return
        with _held_lock_guard:
            # Check before opening: closing any descriptor of a file this process has
            # locked would drop that lock.
            if self.path.exists() and _file_key(self.path.stat()) in _held_lock:
                raise LogDirLockedError(self.log_dir)
            fd = _open_lock_file(self.path)
            key = _file_key(os.fstat(fd))
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)  # drops the POSIX lock when only the flock was refused
                if exc.errno in (errno.EACCES, errno.EAGAIN):
                    raise LogDirLockedError(self.log_dir) from exc
                raise
            _held_lock[key] = self
        self._fd, self._key = fd, key

    def release(self) -> None:
        """Release the lock (closing the descriptor drops it)."""
        if self._fd is None:
            return
        with _held_lock_guard:
            if self._key is not None:
                _held_lock.pop(self._key, None)
            os.close(self._fd)
        self._fd = self._key = None

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


_COMMAND: Final = re.compile(r"[a-z][a-z-]{0,31}")


class OwnerLock:
    """The marker a log dir's cleanerd owner holds in the state dir (see above)."""

    def __init__(self, state_dir: Path, log_dir: Path) -> None:
        self.path = state_dir / "locks" / log_dir_key(log_dir) / "owner.lock"
        self._fd: int | None = None

    def acquire(self, command: str | None = None) -> bool:
        """Take the marker without waiting; False if another holder has it. It then
        holds `command`, the cleanerd command this process runs (`run`, `produce`), for
        `holder_command`: another user's `/proc/<pid>/cmdline` may be hidden from the
        one asking (the unit's `ProtectProc=invisible`), who shares this state dir."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        with contextlib.suppress(OSError):  # a full disk: the command goes unnamed
            os.ftruncate(fd, 0)
            if command is not None:
                os.pwrite(fd, command.encode(), 0)
        self._fd = fd
        return True

    def holder_command(self) -> str | None:
        """The command the marker's holder said it runs, when it can be read."""
        try:
            text = self.path.read_bytes()[:64].decode()
        except (OSError, UnicodeDecodeError):
            return None
        return text if _COMMAND.fullmatch(text) else None

    def release(self) -> None:
        """Drop the marker."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def held_elsewhere(self) -> bool:
        """Whether another holder (normally the owning daemon) has the marker. Creates
        nothing: a holder made the file, and a look from another user (`check-config`
        as root) must not leave one the service user cannot open."""
        return self._fd is None and flock_refused(self.path, fcntl.LOCK_EX)


def flock_refused(path: Path, operation: int) -> bool:
    """Whether another open file holds a `flock` on `path` that refuses one of
    `operation` (`LOCK_SH`, `LOCK_EX`) now; False when `path` cannot be opened to look
    (there is none, or it is not this user's to read). Creates nothing, and the probe's
    own lock, if it took it, goes with its descriptor at once. Never for a file this
    process holds a POSIX lock on: closing any descriptor of a file drops those."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)  # a read-only open may flock
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def holds_log_dir_lock(log_dir: Path) -> bool:
    """Whether this process holds the `.lock` of `log_dir` (through any LogDirLock)."""
    path = log_dir / LOCK_FILE_NAME
    with _held_lock_guard:
        return path.exists() and _file_key(path.stat()) in _held_lock


def holds_replaced_lock(log_dir: Path) -> bool:
    """Whether this process holds a lock on a `.lock` of `log_dir` that is no longer the
    file at that path (the dir replaced, or its disk unmounted and mounted again)."""
    path = log_dir / LOCK_FILE_NAME
    try:
        now: tuple[int, int] | None = _file_key(path.stat())
    except OSError:
        now = None
    with _held_lock_guard:
        return any(lock.path == path and key != now for key, lock in _held_lock.items())


def _file_key(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


def partition_lock_path(state_dir: Path, log_dir: Path, tp: TopicPartition) -> Path:
    """`<state dir>/locks/<log dir key>/<topic>-<partition>.lock`."""
    return state_subdir(state_dir, "locks", log_dir) / f"{tp}.lock"


class PartitionLock:
    """Reentrant, thread-safe, cross-process lock on one partition of one log dir."""

    def __init__(
        self,
        state_dir: Path,
        log_dir: Path,
        tp: TopicPartition,
        *,
        timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    ) -> None:
        self.path = partition_lock_path(state_dir, log_dir, tp)
        self.timeout_s = timeout_s
        self._thread_lock = threading.RLock()
        self._depth = 0
        self._fd: int | None = None

    def acquire(self) -> None:
        """Wait up to the timeout for the lock; raise PartitionLockTimeout otherwise."""
        deadline = time.monotonic() + self.timeout_s
        if not self._thread_lock.acquire(timeout=self.timeout_s):
            raise PartitionLockTimeout(self.path, self.timeout_s)
        try:
            if self._depth == 0:
                self._fd = self._flock(deadline)
            self._depth += 1
        except BaseException:
            self._thread_lock.release()
            raise

    def _flock(self, deadline: float) -> int:
        delay = _POLL_START_S
        fd = self._open()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass
            else:
                if _names(self.path, fd):
                    return fd
                os.close(fd)  # removed or replaced while it was waited for: lock the new one
                fd = self._open()
            if time.monotonic() >= deadline:
                os.close(fd)
                raise PartitionLockTimeout(self.path, self.timeout_s)
            time.sleep(delay)
            delay = min(delay * 2, _POLL_MAX_S)

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # the first lock of this log dir in this state dir
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)

    def release(self) -> None:
        """Release one level; the file lock goes when the outermost level does."""
        if self._depth == 0:
            raise RuntimeError(f"release of partition lock {self.path} that is not held")
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            os.close(self._fd)  # closing the description drops the flock
            self._fd = None
        self._thread_lock.release()

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def partition_locks(state_dir: Path, log_dir: Path) -> list[TopicPartition]:
    """The partitions of `log_dir` that have a lock file in `state_dir`."""
    try:
        names = os.listdir(state_subdir(state_dir, "locks", log_dir))  # noqa: PTH208 - names
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        if name.endswith(".lock"):
            with contextlib.suppress(ValueError):  # `owner.lock`, the checkpoint's lock
                found.append(parse_topic_partition(name.removesuffix(".lock")))
    return found


def remove_partition_lock(state_dir: Path, log_dir: Path, tp: TopicPartition) -> bool:
    """Remove the lock file of `tp` of `log_dir`, whose partition dir is gone; False,
    and nothing removed, while a process holds it (see the module docstring)."""
    path = partition_lock_path(state_dir, log_dir, tp)
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        if _names(path, fd):  # not replaced since it was opened (by another remover)
            path.unlink()
        return True
    finally:
        os.close(fd)  # closing the description drops the flock


def _names(path: Path, fd: int) -> bool:
    """Whether `path` names the file open as `fd`."""
    try:
        return _file_key(path.stat()) == _file_key(os.fstat(fd))
    except FileNotFoundError:
        return False


CHECKPOINT_LOCK_NAME: Final = "cleaner-offset-checkpoint.lock"
"""Not `<topic>-<partition>.lock`: it cannot collide with a partition lock."""


@contextmanager
def checkpoint_lock(state_dir: Path, log_dir: Path) -> Iterator[None]:
    """Hold the cross-process lock on `log_dir`'s cleaner checkpoint (blocking: every
    holder only rewrites one small file)."""
    path = state_dir / "locks" / log_dir_key(log_dir) / CHECKPOINT_LOCK_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the description drops the flock


def _open_lock_file(path: Path) -> int:
    """Open a log dir's `.lock` to write (a POSIX lock needs it), creating it with the
    dir's bits and group if it is not there: a broker must open it to write too."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        try:
            return os.open(path, os.O_RDWR)
        except PermissionError as exc:
            why = (
                f"{exc.strerror} (a lock needs its file open to write: make it writable by "
                "this user or its group, or remove it while no broker runs)"
            )
            raise PermissionError(exc.errno, why, str(path)) from exc
    try:
        adopt_owner(fd, path.parent)
    except BaseException:
        os.close(fd)
        raise
    return fd
