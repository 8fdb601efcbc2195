"""Error types shared across cleanerd.

Every error that concerns a file names the file and, where there is one, the byte
position or offset, so an operator can find the bad bytes with `cleanerd dump`.
"""

from __future__ import annotations

import errno as errno_codes
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final, TypeVar

T = TypeVar("T")


class CleanerdError(Exception):
    """Base class of cleanerd's own errors.

    Errors cross process boundaries (a worker process's pass fails in the daemon's
    future), and the subclasses' keyword-only constructors cannot be re-called from
    `args`, so pickling restores the attributes instead of calling `__init__`."""

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_error, (type(self), self.args, self.__dict__))


def _rebuild_error(
    cls: type[CleanerdError], args: tuple[object, ...], state: dict[str, object]
) -> CleanerdError:
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


class CorruptRecordError(CleanerdError):
    """A record batch (or legacy message set) that cannot be decoded or fails its CRC."""

    def __init__(
        self, reason: str, *, path: Path | str | None = None, position: int | None = None
    ) -> None:
        self.reason = reason
        self.path = str(path) if path is not None else None
        self.position = position
        where = ""
        if self.path is not None:
            where = f" in {self.path}"
        if position is not None:
            where += f" at position {position}"
        super().__init__(f"corrupt record batch{where}: {reason}")

    def located(self, path: Path | str, base_position: int = 0) -> CorruptRecordError:
        """Return a copy that names `path` and shifts the position by `base_position`."""
        pos = None if self.position is None else self.position + base_position
        return CorruptRecordError(self.reason, path=path, position=pos)


class CorruptIndexError(CleanerdError):
    """An offset, time or transaction index that disagrees with its segment or itself, or
    a producer snapshot (`.snapshot`) that cannot be read: files derived from the log."""

    def __init__(self, reason: str, *, path: Path | str) -> None:
        self.reason = reason
        self.path = str(path)
        kind = "producer snapshot" if self.path.endswith(".snapshot") else "index"
        super().__init__(f"corrupt {kind} {self.path}: {reason}")


CHANGED_READ_ATTEMPTS: Final = 3
"""Reads of a partition whose files another process (a live broker) changes meanwhile,
at least: each attempt lists the partition again."""
CHANGED_READ_SECONDS: Final = 2.0
"""How long the reads of a partition whose files keep changing go on, after the first
CHANGED_READ_ATTEMPTS, before the change is an error (see `reread_on_change`)."""
CHANGED_READ_PAUSE_SECONDS: Final = (0.005, 0.2)
"""The pause before the second read, doubled before each further one up to the second
value: long enough for a swap or a deletion the broker is in the middle of to end."""


class FileChangedError(CleanerdError):
    """A file another process replaced or cut while it was read: a live broker's
    segment swapped in or truncated under an observer. Not corruption: the reader skips
    it for this round and reads it again."""

    def __init__(self, reason: str, *, path: Path | str) -> None:
        self.reason = reason
        self.path = str(path)
        super().__init__(f"{self.path} changed while read: {reason}")


def reread_on_change(
    read: Callable[[], T],
    *,
    gone: Callable[[], bool] = lambda: False,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`read()` (a read that lists the partition anew each time), again while another
    process changes the files under it (FileChangedError, FileNotFoundError: a live
    broker swapped or deleted a segment between the listing and the read), after a
    short pause: CHANGED_READ_ATTEMPTS times at least, and on until CHANGED_READ_SECONDS
    have passed since the first read. A count alone gave up on a busy broker that
    swapped segments faster than three reads. The last read's error is raised, and at
    once when `gone()` says the partition itself is no longer there (a topic deletion,
    which no further read gets past)."""
    start, pause = clock(), CHANGED_READ_PAUSE_SECONDS[0]
    attempt = 1
    while True:
        try:
            return read()
        except (FileChangedError, FileNotFoundError):
            spent = attempt >= CHANGED_READ_ATTEMPTS and clock() - start >= CHANGED_READ_SECONDS
            if spent or gone():
                raise
        sleep(pause)
        pause = min(2 * pause, CHANGED_READ_PAUSE_SECONDS[1])
        attempt += 1


class NoSegmentYet(CleanerdError):
    """A partition dir with no segment, read without owning it: a partition a broker is
    creating, or one a crash left so (its owner's open creates the first segment). Not
    damage: there is nothing to read or plan in it yet."""

    def __init__(self) -> None:
        super().__init__(
            "no segment yet (a partition being created, or one a crash left so: its "
            "owner's open creates the first segment)"
        )


class CheckpointError(CleanerdError):
    """A checkpoint file whose text is not in Kafka's checkpoint format."""

    def __init__(self, reason: str, *, path: Path | str, line: int | None = None) -> None:
        self.reason = reason
        self.path = str(path)
        self.line = line
        at = f" line {line}" if line is not None else ""
        super().__init__(f"malformed checkpoint file {self.path}{at}: {reason}")


class InvalidTxnStateError(CleanerdError):
    """An append of a non-transactional batch from a producer whose transaction is open:
    Kafka refuses it (InvalidTxnStateException), and its loader cannot read such a log."""

    def __init__(self, path: Path | str, *, producer_id: int, offset: int, txn_first: int) -> None:
        self.path = str(path)
        self.producer_id = producer_id
        self.offset = offset
        super().__init__(
            f"refused append at offset {offset} of {self.path}: a non-transactional batch "
            f"from producer {producer_id}, whose transaction is open since offset "
            f"{txn_first} (commit or abort it first); nothing was appended"
        )


class LogDirLockedError(CleanerdError):
    """A log dir whose `.lock` another process (a broker, another cleanerd) holds."""

    def __init__(
        self, path: Path | str, detail: str | None = None, *, ends_by_itself: bool = False
    ) -> None:
        self.path = str(path)
        self.ends_by_itself = ends_by_itself
        """The holder is a one-shot cleanerd command, which lets go when it is done."""
        super().__init__(detail or f"log dir {self.path} is locked by another process")


class ConfigError(CleanerdError):
    """An invalid configuration: `errors` holds one line per problem, each naming the key."""

    def __init__(self, errors: list[str], *, path: Path | str | None = None) -> None:
        self.errors = errors
        self.path = str(path) if path is not None else None
        head = f"invalid configuration {self.path}" if self.path else "invalid configuration"
        super().__init__(head + ":\n" + "\n".join(f"  {e}" for e in errors))

    @property
    def reason(self) -> str:
        """The problems on one line, for a report about one partition."""
        return "; ".join(self.errors)


def os_error_text(e: OSError) -> str:
    """`e` as "file: reason" when it names a file (the text of an `OSError` raised with
    a file name already holds both, but "[Errno 13]" first), else its own text."""
    if e.filename is not None and e.strerror:
        return f"{e.filename}: {e.strerror}"
    return e.strerror or str(e)


DAMAGE: Final = (CorruptRecordError, CorruptIndexError)
"""What a read meets in damaged data (as opposed to a full disk, a refused file or a
lock that is held): the errors a snapshot can stand a damaged segment in for."""


def failure_text(e: BaseException) -> str:
    """Why a step failed, for a report or a mark: the text of cleanerd's own errors and
    of OS errors, which name the file and what is wrong with it; any other exception
    (a bug) with its type, which its text alone may not say."""
    if isinstance(e, CleanerdError):
        return str(e)
    if isinstance(e, OSError):
        return os_error_text(e)
    return f"{type(e).__name__}: {e}"


class FileStepError(CleanerdError):
    """A file operation that failed (a full disk, a read-only file system, an I/O
    error), naming the file and the step of the work it was part of."""

    def __init__(self, step: str, path: Path | str, cause: OSError) -> None:
        self.step = step
        self.path = str(path)
        self.errno = cause.errno
        name = errno_codes.errorcode.get(cause.errno or 0, "error")
        reason = cause.strerror or str(cause)
        super().__init__(f"{reason} ({name}) while {step}: {self.path}")

    @property
    def no_space(self) -> bool:
        """The disk (or a quota) was full."""
        return self.errno in (errno_codes.ENOSPC, errno_codes.EDQUOT)


@contextmanager
def file_step(step: str, path: Path | str) -> Iterator[None]:
    """Turn an OSError raised in the block into a FileStepError naming `step` and
    `path` (an error that already names its step passes through)."""
    try:
        yield
    except FileStepError:
        raise
    except OSError as exc:
        raise FileStepError(step, path, exc) from exc
