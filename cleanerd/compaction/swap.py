"""Installing cleaned segments crash-safely (Kafka's replaceSegments).

Every file operation of a pass goes through a `FileOps` object (create, write, fsync,
close, rename, unlink, directory fsync, mtime), so tests can stop a pass at any single
operation and check what recovery makes of the leftovers.

The swap of one group, whose cleaned output `<base>.{log,index,timeindex,txnindex}.cleaned`
is complete and fsynced (one segment, or several when the output overflowed one):

1. rename the output's files `.cleaned` -> `.swap`, the highest base first and each
   segment's `.log` first, then fsync the dir;
2. rename every old segment's files to `.deleted`, then fsync the dir;
3. rename the output's files `.swap` -> final names, then fsync the dir.

Before step 1, under the partition lock, the pass proves that it may swap (`SwapProof`,
`cleanerd.log.ownership`): the owner it works for still holds the log dir, every segment
it read is still the same file, and the partition's `cleaner-offset-checkpoint` entry is
the one it started from. A pass planned on a state that no longer holds (its owner died
or another process cleaned the partition meanwhile) then removes its `.cleaned` output
and changes nothing (`StaleWork`). The proof is given again, under the checkpoint lock,
before the checkpoint entry is moved.

Why each prefix recovers (Kafka's LogLoader, `cleanerd.log.recovery`): a crash in step 1
leaves at least one `.cleaned` file of the output, at a base no higher than any `.swap`
of it (renames go high to low), and recovery deletes every `.swap` at or above the
lowest `.cleaned` base and every `.cleaned`: the old segments are untouched, the pass
never happened. After step 1 only `.swap` files remain of the output; recovery deletes
every non-swap file whose offset lies in [lowest swap base, highest swap next offset)
and every `.deleted` file, then renames `.swap` to final names: the pass completed. The
output segments never overlap, so in step 3 one already renamed is outside the range of
those still `.swap`. Old segments whose base is at or past the output's next offset
(nothing of them survived) are not in that range, so step 2 renames them first; a crash
during step 2 then leaves only old files that recovery removes. Kafka renames in
ascending order, which can leave such a segment behind after a crash; the order here
closes that window except for a crash in the middle of those first renames. Step 3's
dir fsync makes the final names durable before the cleaner checkpoint moves past the
cleaned range.

The `.deleted` files a swap leaves are unlinked later by the owner's
`cleanerd.log.deletions.PendingDeletions`, as retention's are.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cleanerd.errors import file_step
from cleanerd.log.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleanerd.log.files import (
    CLEANED_FILE_SUFFIX,
    DELETED_FILE_SUFFIX,
    INDEX_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    PRODUCER_SNAPSHOT_FILE_SUFFIX,
    SWAP_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    TXN_INDEX_FILE_SUFFIX,
    TopicPartition,
    is_segment_file_name,
    segment_file,
)
from cleanerd.log.fsutil import TMP_SUFFIX, adopt_owner, fsync_dir, model_for, safe_unlink
from cleanerd.log.meta import SegmentMeta
from cleanerd.log.ownership import OwnerProof, StaleWork, verify_segments

SEGMENT_KINDS = (LOG_FILE_SUFFIX, INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX, TXN_INDEX_FILE_SUFFIX)


class FileOps:
    """The real file operations of a pass; tests substitute a counting subclass."""

    def create(self, path: Path, like: Path | None = None) -> int:
        """Open `path` for writing, truncating it, with the bits and group of `like`
        (`fsutil.adopt_owner`); returns a descriptor."""
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644
        )
        if like is not None:
            try:
                adopt_owner(fd, like)
            except BaseException:
                os.close(fd)
                raise
        return fd

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        """Write all of `data` (a short write is continued)."""
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]

    def fsync(self, fd: int) -> None:
        """Make the file's data durable."""
        os.fsync(fd)

    def close(self, fd: int) -> None:
        """Close the descriptor."""
        os.close(fd)

    def rename(self, src: Path, dst: Path) -> None:
        """Rename `src` over `dst`."""
        src.replace(dst)

    def unlink(self, path: Path) -> None:
        """Remove `path`, freeing space even on a full disk."""
        safe_unlink(path)

    def fsync_dir(self, path: Path) -> None:
        """Make renames and unlinks in the directory durable."""
        fsync_dir(path)

    def set_mtime(self, path: Path, mtime_ns: int) -> None:
        """Set the file's modification (and access) time."""
        os.utime(path, ns=(mtime_ns, mtime_ns))

    def write_file(self, path: Path, data: bytes, like: Path | None = None) -> None:
        """Create `path` with `data`, fsynced (`like`: as `create`)."""
        fd = self.create(path, like)
        try:
            if data:
                self.write(fd, data)
            self.fsync(fd)
        finally:
            self.close(fd)

    def atomic_write(self, path: Path, data: bytes) -> None:
        """Replace `path` by `data`: `<path>.tmp`, fsync, rename, fsync the dir; the new
        file takes the old one's bits and group, else its dir's (`fsutil.adopt_owner`)."""
        tmp = path.with_name(path.name + TMP_SUFFIX)
        self.write_file(tmp, data, model_for(path))
        self.rename(tmp, path)
        self.fsync_dir(path.parent)


def cleaner_offset(log_dir: Path, tp: TopicPartition) -> int | None:
    """`tp`'s entry in `log_dir`'s `cleaner-offset-checkpoint`, None when it has none."""
    path = log_dir / CLEANER_OFFSET_CHECKPOINT
    return OffsetCheckpointFile(path).read().get(tp) if path.exists() else None


@dataclass(frozen=True, slots=True)
class SwapProof:
    """What a pass shows, under the partition lock, before it changes the partition:
    see the module docstring (picklable: a Spark pass is proven by the owner).

    `owner` is None for a pass run by the owning process without one (tests, and the
    owner's own in-process passes hold the dir by construction)."""

    log_dir: Path
    tp: TopicPartition
    segments: tuple[SegmentMeta, ...]
    """The snapshot the pass read (ascending, the active segment last)."""
    checkpoint_offset: int | None
    """The partition's `cleaner-offset-checkpoint` entry when the pass began."""
    owner: OwnerProof | None = None

    def verify(self, from_base: int = 0) -> None:
        """Raise a StaleWork error (OwnershipLost, SegmentsChanged) if the pass may not
        change the partition: before swapping the group that starts at `from_base`
        (the segments below it are the pass's own earlier groups)."""
        if self.owner is not None:
            self.owner.verify()
        verify_segments(
            self.log_dir / str(self.tp), [s for s in self.segments if s.base_offset >= from_base]
        )
        self.verify_checkpoint()

    def verify_checkpoint(self) -> None:
        """Raise StaleWork if the partition's cleaner checkpoint entry moved."""
        now = cleaner_offset(self.log_dir, self.tp)
        if now != self.checkpoint_offset:
            raise StaleWork(
                f"{self.log_dir / CLEANER_OFFSET_CHECKPOINT}: the entry of {self.tp} moved "
                f"from {self.checkpoint_offset} to {now} during the pass (another cleaner?)"
            )


def cleaned_files(dir_path: Path, base_offset: int) -> list[Path]:
    """The four `.cleaned` files of an output segment."""
    return [segment_file(dir_path, base_offset, k, CLEANED_FILE_SUFFIX) for k in SEGMENT_KINDS]


def remove_cleaned(dir_path: Path, base_offset: int, ops: FileOps) -> None:
    """Delete whatever `.cleaned` files of the output at `base_offset` exist."""
    for path in cleaned_files(dir_path, base_offset):
        if path.exists():
            ops.unlink(path)


def remove_stale_cleaned(dir_path: Path, ops: FileOps) -> list[Path]:
    """Delete every `.cleaned` file of the partition dir: what a pass that died left
    (a killed process or engine job; an output split at an overflow has bases no source
    segment has). A partition has one pass at a time, so none is in use. Left in place,
    such a file would make recovery after a crash mid-swap take a later swap for an
    unfinished one. Only names Kafka gives segment files are touched; any other is an
    operator's, which recovery reports and nothing removes. Returns the files."""
    stale = sorted(
        p for p in dir_path.glob(f"*{CLEANED_FILE_SUFFIX}") if is_segment_file_name(p.name)
    )
    for path in stale:
        ops.unlink(path)
    return stale


def _existing_files(dir_path: Path, base_offset: int, *, with_snapshot: bool) -> list[Path]:
    kinds = SEGMENT_KINDS + ((PRODUCER_SNAPSHOT_FILE_SUFFIX,) if with_snapshot else ())
    return [p for k in kinds if (p := segment_file(dir_path, base_offset, k)).exists()]


def _add_suffix(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def replace_segments(
    dir_path: Path,
    *,
    new_bases: Sequence[int],
    new_next_offset: int,
    old_bases: Sequence[int],
    ops: FileOps,
) -> list[Path]:
    """Install the cleaned segments `new_bases` (ascending; several when the output
    overflowed one segment), which end at `new_next_offset`, in place of the segments
    `old_bases` (ascending); returns the `.deleted` files to unlink later. See the module
    docstring. A failed file operation raises FileStepError naming the file and step."""

    def rename(src: Path, dst: Path, step: str) -> None:
        with file_step(step, src):
            ops.rename(src, dst)

    def sync(step: str) -> None:
        with file_step(step, dir_path):
            ops.fsync_dir(dir_path)

    for base in sorted(new_bases, reverse=True):
        for path in cleaned_files(dir_path, base):
            if path.exists():
                swap = _add_suffix(path.with_suffix(""), SWAP_FILE_SUFFIX)
                rename(path, swap, "renaming cleaned output to .swap")
    sync("syncing the .swap renames")

    uncovered = [b for b in old_bases if b >= new_next_offset and b not in new_bases]
    covered = [b for b in old_bases if b not in uncovered]
    deleted: list[Path] = []
    for base in [*reversed(uncovered), *covered]:
        for path in _existing_files(dir_path, base, with_snapshot=base not in new_bases):
            target = _add_suffix(path, DELETED_FILE_SUFFIX)
            rename(path, target, "renaming a replaced segment to .deleted")
            deleted.append(target)
    sync("syncing the .deleted renames")

    for base in new_bases:
        for kind in SEGMENT_KINDS:
            swap = segment_file(dir_path, base, kind, SWAP_FILE_SUFFIX)
            if swap.exists():
                rename(swap, segment_file(dir_path, base, kind), "renaming .swap into place")
    sync("syncing the swapped-in segments")
    return deleted
