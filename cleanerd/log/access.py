"""What an owner needs to be allowed in a log dir's partitions, looked at ahead of time
(`cleanerd check-config`) as the user the check runs as.

An owner creates, renames and deletes files in every partition dir (a pass's `.cleaned`
and `.swap` files, a roll's new segment, retention's `.deleted` renames, producer
snapshots), so it needs write and search permission on each; and it opens the active
segment's `.log`, `.index` and `.timeindex` to write (appends, the roll that trims the
indexes, the cut of a torn tail). A closed segment is only renamed, replaced or deleted,
never written in place, so its files' own bits do not matter.

A log dir a broker had (a retired broker's disk, a restored archive) often keeps the
broker user's partition dirs and files, 0755 and 0644: the log dir itself can be made
writable and every step inside it still fails with EACCES, at run time, partition by
partition, while retention deadlines pass. Looking costs a listing of every partition
dir and an access check of a few names in each.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cleanerd.log.files import (
    list_partitions,
    log_file,
    log_file_offsets,
    offset_index_file,
    time_index_file,
)

SHOWN: Final = 3
"""Paths a problem names before it counts the rest."""

Access = Callable[[Path, int], bool]
"""Whether the checking user may access a path in a mode (`os.access`'s)."""


@dataclass(frozen=True, slots=True)
class PartitionAccess:
    """What an owner could not do in one log dir's partitions."""

    partitions: int
    unwritable_dirs: tuple[Path, ...]
    """Partition dirs in which files cannot be created, renamed or deleted."""
    unwritable_files: tuple[Path, ...]
    """Active segments' files that cannot be opened to write."""

    def problems(self, key: str, log_dir: Path, user: str) -> list[str]:
        """One line per kind of problem, naming `key` (the log dir's config key), the
        first paths and how many there are."""
        found = []
        if self.unwritable_dirs:
            found.append(
                f"{key}: {_some(self.unwritable_dirs, log_dir)} of the {self.partitions} "
                f"partition dirs in {str(log_dir)!r} are not writable by user {user}, and "
                "mode: owner creates, renames and deletes segment files in them (give the "
                "dirs to this user or to a group of it, with write permission)"
            )
        if self.unwritable_files:
            found.append(
                f"{key}: {_some(self.unwritable_files, log_dir)} active segment files in "
                f"{str(log_dir)!r} cannot be opened to write by user {user}, and mode: owner "
                "appends to them and trims their indexes when it rolls them (give them to "
                "this user or to a group of it, with write permission)"
            )
        return found


def check_partitions(log_dir: Path, may: Access) -> PartitionAccess:
    """Look at every partition dir of `log_dir` (see the module docstring); a partition
    dir that cannot be listed counts as not writable."""
    dirs: list[Path] = []
    files: list[Path] = []
    partitions = list_partitions(log_dir)
    for path in partitions.values():
        try:
            with os.scandir(path) as listing:
                names = [entry.name for entry in listing]
        except OSError:
            dirs.append(path)
            continue
        if not may(path, os.W_OK | os.X_OK):
            dirs.append(path)
        offsets = log_file_offsets(names)
        if not offsets:
            continue
        active = offsets[-1]
        present = set(names)
        for file in (log_file, offset_index_file, time_index_file):
            p = file(path, active)
            if p.name in present and not may(p, os.W_OK):
                files.append(p)
    return PartitionAccess(len(partitions), tuple(dirs), tuple(files))


def _some(paths: tuple[Path, ...], log_dir: Path) -> str:
    """`N (a, b, c, ...)`: how many, and the first `SHOWN` relative to `log_dir`."""
    shown = ", ".join(repr(str(p.relative_to(log_dir))) for p in paths[:SHOWN])
    more = ", ..." if len(paths) > SHOWN else ""
    return f"{len(paths)} ({shown}{more})"
