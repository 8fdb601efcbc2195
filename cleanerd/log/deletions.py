"""The queue of `.deleted` files waiting for `file.delete.delay.ms`.

Swaps and retention rename the files they remove to `.deleted` (durably, under the
partition lock) and hand them here; one queue, owned by whoever owns the process
lifetime (the daemon, or a one-shot command, which empties it before it exits), unlinks
each once its delay has passed. The delay exists for readers that still have an old file
open; under disk pressure it yields: `unlink_on_device` frees at once the files waiting
on one device (the KIP-61 enforcement, a pass that ran out of space), `unlink_all`
everything (process exit).

Unlinking is the slow part of a big queue: an unlink frees the file's blocks through the
file system's journal (about 0.15 ms for a small segment file on ext4), and a clean of
1,000 partitions leaves 34,000 files. Files of different directories go to
`UNLINK_THREADS` threads, one directory at a time per thread, so the file system
overlaps them (unlinks in one directory serialize on its lock anyway).

Crash consistency: nothing here is persisted. A file still waiting when the process dies
is a `.deleted` leftover, which the next open of its partition removes (startup
recovery, as Kafka's loader does): the rename made the deletion durable already.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from cleanerd.log.fsutil import safe_unlink
from cleanerd.logger import get_logger

log = get_logger(__name__)


UNLINK_THREADS: Final = 8
"""Threads unlinking the files of a big batch (see the module docstring)."""
UNLINK_IN_THREADS_FROM: Final = 64
"""The fewest files worth starting threads for; fewer are unlinked in this thread."""

NO_DEVICE = -1
"""The device of a file whose directory was already gone when it was scheduled."""


@dataclass(frozen=True, slots=True)
class _Pending:
    due_ms: int
    path: Path
    device: int


def _due_ms(item: _Pending) -> int:
    return item.due_ms


def _device_of_dir(path: Path) -> int:
    try:
        return path.stat().st_dev
    except FileNotFoundError:
        return NO_DEVICE


@dataclass(slots=True)
class PendingDeletions:
    """`.deleted` files, the time each may be unlinked (`file.delete.delay.ms`) and the
    device (`st_dev` of its directory, taken when scheduled) it frees space on."""

    _queue: list[_Pending] = field(default_factory=list)

    def schedule(self, paths: Sequence[Path], *, now_ms: int, delay_ms: int) -> None:
        """Unlink `paths` at or after `now_ms + delay_ms`."""
        due = now_ms + delay_ms
        devices: dict[Path, int] = {}
        items = []
        for path in paths:
            if path.parent not in devices:
                devices[path.parent] = _device_of_dir(path.parent)
            items.append(_Pending(due, path, devices[path.parent]))
        # The queue stays in due order, files of one due time in the order scheduled;
        # sorting it whole on every swap was quadratic in the files waiting (a clean of
        # 1,000 partitions queues 33,000 of them).
        at = bisect.bisect_right(self._queue, due, key=_due_ms)
        self._queue[at:at] = items

    def __len__(self) -> int:
        return len(self._queue)

    def next_due_ms(self) -> int | None:
        """When the next file may be unlinked (None: nothing waits)."""
        return self._queue[0].due_ms if self._queue else None

    def run_due(self, now_ms: int) -> list[Path]:
        """Unlink every file due at `now_ms`; returns them."""
        due = [p for p in self._queue if p.due_ms <= now_ms]
        self._queue = [p for p in self._queue if p.due_ms > now_ms]
        return self._unlink(due)

    def unlink_all(self) -> list[Path]:
        """Unlink everything now (process exit); returns the files."""
        due, self._queue = self._queue, []
        return self._unlink(due)

    def unlink_on_device(self, device: int, why: str) -> list[Path]:
        """Unlink now every file waiting on `device` (an `st_dev`), whatever its due
        time: the space is needed (`why`: disk pressure, a pass out of space), and each
        file is logged with it, since it goes before its delay; returns the files."""
        due = [p for p in self._queue if p.device == device]
        self._queue = [p for p in self._queue if p.device != device]
        unlinked = self._unlink(due)
        for path in unlinked:
            log.info("segment.unlinked_early", path=str(path), reason=why)
        return unlinked

    def _unlink(self, items: list[_Pending]) -> list[Path]:
        """Unlink `items`; returns those unlinked, in the order given."""
        by_dir: dict[Path, list[int]] = {}
        for n, item in enumerate(items):
            by_dir.setdefault(item.path.parent, []).append(n)
        unlinked = [False] * len(items)

        def unlink_dir(indexes: list[int]) -> None:
            for n in indexes:
                unlinked[n] = _unlink_one(items[n].path)

        if len(items) < UNLINK_IN_THREADS_FROM or len(by_dir) == 1:
            unlink_dir(list(range(len(items))))
        else:
            workers = min(UNLINK_THREADS, len(by_dir))
            with ThreadPoolExecutor(workers, thread_name_prefix="cleanerd-unlink") as pool:
                # list(): a failure other than those `_unlink_one` handles is raised here
                list(pool.map(unlink_dir, by_dir.values()))
        return [item.path for item, done in zip(items, unlinked, strict=True) if done]


def _unlink_one(path: Path) -> bool:
    """Unlink `path`; False if it was gone already or could not be unlinked (logged)."""
    try:
        safe_unlink(path)
    except FileNotFoundError:
        return False  # recovery on a restart, or an operator, removed it already
    except OSError as exc:
        # A read-only or failing file system: the file stays, and the next open of its
        # partition (startup recovery) removes it; the others still go.
        log.error("segment.unlink_failed", path=str(path), error=str(exc))
        return False
    return True
