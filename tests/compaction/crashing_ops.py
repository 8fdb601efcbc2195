"""A FileOps that dies at a chosen operation: by raising `SimulatedCrash` (which derives
from BaseException, so no cleanup handler of the pass catches it) or by SIGKILL."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from cleanerd.compaction.swap import FileOps


class SimulatedCrash(BaseException):
    """The process "died" at a file operation."""


class CrashingOps(FileOps):
    """Counts every primitive file operation; at index `crash_at` the process dies."""

    def __init__(self, crash_at: int | None = None, *, sigkill: bool = False) -> None:
        self.crash_at = crash_at
        self.sigkill = sigkill
        self.count = 0
        self.trace: list[str] = []
        self.open_fds: set[int] = set()

    def _tick(self, what: str) -> None:
        if self.count == self.crash_at:
            if self.sigkill:
                os.kill(os.getpid(), signal.SIGKILL)
            raise SimulatedCrash(f"op {self.count}: {what}")
        self.trace.append(what)
        self.count += 1

    def die(self) -> None:
        """What the kernel does for a dead process: close its descriptors."""
        for fd in self.open_fds:
            os.close(fd)
        self.open_fds.clear()

    def create(self, path: Path, like: Path | None = None) -> int:
        self._tick(f"create {path.name}")
        fd = super().create(path, like)
        self.open_fds.add(fd)
        return fd

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        self._tick("write")
        super().write(fd, data)

    def fsync(self, fd: int) -> None:
        self._tick("fsync")
        super().fsync(fd)

    def close(self, fd: int) -> None:
        self.open_fds.discard(fd)
        super().close(fd)

    def rename(self, src: Path, dst: Path) -> None:
        self._tick(f"rename {src.name} -> {dst.name}")
        super().rename(src, dst)

    def unlink(self, path: Path) -> None:
        self._tick(f"unlink {path.name}")
        super().unlink(path)

    def fsync_dir(self, path: Path) -> None:
        self._tick("fsync_dir")
        super().fsync_dir(path)

    def set_mtime(self, path: Path, mtime_ns: int) -> None:
        self._tick(f"mtime {path.name}")
        super().set_mtime(path, mtime_ns)
