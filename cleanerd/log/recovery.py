"""Startup recovery of a partition dir: Kafka's LogLoader leftover handling, then segment
validation with cleanerd's stricter rule for damaged data.

Leftovers of an interrupted rewrite, handled exactly as Kafka does (ref 4.12-4.13), so
cleanerd and a broker finish each other's interrupted swaps the same way. A swap
renames the new segment's files `.cleaned` -> `.swap` (highest base offset first),
renames the old segments' files to `.deleted`, then renames `.swap` to the final names.
Every prefix of that sequence is recovered by:

1. delete every `*.deleted` file (the old files were already replaced);
2. take the lowest base offset among `*.cleaned` files; every `*.swap` file at or above
   it belongs to an unfinished `.cleaned` -> `.swap` step (renames go high to low, so
   the lower ones had not been renamed yet) and is deleted; then every `*.cleaned` file
   is deleted. The old segments are still complete, so nothing is lost;
3. for the remaining `.log.swap` files, every non-swap file whose offset lies in
   [lowest swap base, highest swap next offset) is an old segment not yet renamed to
   `.deleted`, and is deleted;
4. every remaining `*.swap` (including a lone index `.swap`) is renamed to its final
   name, and the dir is fsynced. Index files without a `.log` are deleted, as Kafka does.

Before any of this, and in every mode (observe too), symbolic links are refused: if the
partition dir, or any file in it named like a segment file (log, index, time index,
transaction index or snapshot, with or without a state suffix), is a symlink, the link
and its target are reported and `SymlinkRefused` is raised, so the partition is skipped
and nothing is ever created, renamed, deleted or even read through the link. This holds
wherever the link points, inside the log dir or not: a partition whose files live
elsewhere is not one cleanerd may maintain, and telling a harmless link from a harmful
one would need the target's ownership rules, which cleanerd does not know. Other links
(a `leader-epoch-checkpoint` link, say) are never touched, so they do not matter. The log
dir itself may be a link: only what is inside it is checked.

Only well-formed segment file names (20 digits, a kind, at most one state suffix: see
`files.py`) take part in these steps. A file whose name ends like a segment file but
is not one (`00000000000000000abc.log`, `42.log.deleted`) was not written by Kafka or
cleanerd: it is reported with a warning each time the partition is opened, in every
mode, and never deleted or renamed, whatever its suffix.

Then the segments are validated. Every segment holding offsets at or above the recovery
point is walked in full with CRC checks (for the one holding the recovery point itself,
only its bytes from the recovery point on, when the rest passes the cheap check); the
others get the cheap check of `LogSegment.sanity_check`. After a clean shutdown (the
owner found Kafka's `.kafka_cleanshutdown` marker, see `log_dir.py`) only the active
segment gets the cheap check and the others none, as Kafka's loader skips recovery then;
the active one is spared it too when cleanerd's own clean stop recorded it
(`known_segments.py`) and its `.log` (inode, size, mtime) and both index sizes are still
as recorded: that stop had checked it, and two `stat`s replace reading both indexes and
the log's tail (about 0.2 ms a partition, 2 s of a start on 10,000 partitions).
After a crash, a segment wholly below the recovery point is trusted in the same way
when what cleanerd last kept of it (the daemon keeps it after each cycle that changed
the dir's segments) describes its very `.log` and both index sizes: those files were
flushed before the checkpoint named them, and were checked (or trusted by this rule, or
Kafka's) when cleanerd opened them. Kafka's loader, after a crash, checks no more of
such a segment than that its offset index exists and its transaction index is sound
(`LogSegment.sanityCheck`); cleanerd gives the others the cheap check.

The cheap checks that need not come first can run beside the opening (`check_later`,
for an opening of thousands of partitions): the active segment's after a clean shutdown,
and after a crash those of the segments wholly below the recovery point whose index
files the listing holds (flushed with their indexes before the checkpoint named them; a
missing index is rebuilt by the open, as before). The open then only lists them in
`report.unchecked`; reader processes run them (`known_reader.py`), and the owner runs
`check_unchecked` on those no reader passed, before anything reads the partition, so
what they find is reported as the open's.

The leftover steps below list the dir once and, finding nothing to do, change and fsync
nothing. Kafka truncates any
invalid tail; cleanerd only truncates what a crash mid-append can leave at the end of
the **active** segment, at offsets from the recovery point on (below it the bytes were
flushed whole, so any of these there is damage: `tail.torn_tail_reason`):

- a partial batch (fewer bytes than the header or the declared size),
- a last batch whose CRC fails with nothing but zeros (or nothing) after it,
- a run of zero bytes (a file extended but not yet written),

after copying the cut bytes to `<state dir>/quarantine/` when a state dir is given and
logging the file and byte count. Anything else (a bad CRC with valid data after it, a
damaged non-active segment, garbage, an index pointing past the end of its log) is
reported with the file and byte position, the files are left byte for byte as they
are, and the partition is flagged corrupt so callers mark it uncleanable. Indexes that
are missing or merely inconsistent are rebuilt from the log, and so are the active
segment's whose entries past the log's end name offsets from the recovery point on
(batches never flushed, or cut by a broker's `truncateTo`: `_lost_in_a_crash`).

A first open with no producer snapshot (none in the dir) and every segment walked in
full rebuilds the producer state in the same walk, as Kafka's loader updates it while
it recovers a segment: `ProducerFold` applies each valid batch in log order, and the
state is handed on only when every segment was walked from its start and nothing failed,
so what it holds is what a walk of the log as it now stands (tails cut) would give.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import NoReturn

from cleanerd.errors import DAMAGE, CleanerdError, CorruptIndexError, CorruptRecordError, file_step
from cleanerd.log.files import (
    CLEANED_FILE_SUFFIX,
    DELETED_FILE_SUFFIX,
    INDEX_FILE_SUFFIX,
    INDEX_NAMES,
    INDEX_SUFFIXES,
    LOG_FILE_SUFFIX,
    LOG_NAMES,
    MALFORMED_NAMES,
    STATE_NAMES,
    SWAP_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    TXN_INDEX_FILE_SUFFIX,
    filename_prefix_from_offset,
    is_index_file,
    is_segment_file_name,
    listing_text,
    log_file,
    looks_like_segment_file,
    malformed_segment_file_name,
    offset_from_filename,
    segment_file_parts,
)
from cleanerd.log.fsutil import atomic_write, fsync_dir, safe_unlink
from cleanerd.log.index import IndexPastLogError
from cleanerd.log.known_segments import KnownSegment
from cleanerd.log.producer_state import ProducerState
from cleanerd.log.segment import IndexCheck, IndexRebuild, LogSegment
from cleanerd.log.segment_reader import map_file
from cleanerd.log.tail import ZERO_TAIL, torn_tail_reason
from cleanerd.log.txnindex import AbortedTxn
from cleanerd.logger import get_logger
from cleanerd.records.header import Buffer
from cleanerd.records.walker import (
    NO_DELETE_HORIZON,
    BatchTable,
    OffsetRange,
    Walk,
    delete_horizon,
    walk_prefix,
)

log = get_logger(__name__)


class SymlinkRefused(CleanerdError):
    """A partition dir, or a segment file in one, that is a symbolic link: never followed,
    and the partition is skipped (see the module docstring)."""

    def __init__(self, path: Path | str, target: str) -> None:
        self.path = str(path)
        self.target = target
        super().__init__(
            f"{self.path} is a symlink to {target}: cleanerd never follows links in a log "
            "dir, so the partition is skipped"
        )


class SpecialFileRefused(CleanerdError):
    """A file named like a segment file that is no regular file (a FIFO, a socket, a
    device): opening or reading one could block the process for ever, so it is never
    opened, and the partition is skipped."""

    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        super().__init__(
            f"{self.path} is not a regular file (a FIFO, a socket or a device): it is "
            "never opened, so the partition is skipped"
        )


def refuse_special(entry: os.DirEntry[str]) -> None:
    """Raise SpecialFileRefused if `entry` (named like a segment file) is neither a
    regular file, a dir (which fails its open, named) nor a link (refused as one); the
    listing's file type answers, without a stat."""
    kinds = (entry.is_file, entry.is_dir)
    if not (entry.is_symlink() or any(kind(follow_symlinks=False) for kind in kinds)):
        raise SpecialFileRefused(entry.path)


@dataclass(frozen=True, slots=True)
class SegmentOptions:
    """How segments of the partition are opened."""

    index_interval_bytes: int
    max_index_size: int
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class TruncatedTail:
    """Bytes cut from the end of the active segment."""

    path: str
    position: int
    bytes_cut: int
    reason: str
    quarantined_to: str | None


@dataclass(slots=True)
class RecoveryReport:
    """What recovery did to a partition dir, and what it found wrong."""

    deleted: list[str] = field(default_factory=list)
    renamed: list[tuple[str, str]] = field(default_factory=list)
    truncated: list[TruncatedTail] = field(default_factory=list)
    rebuilt_indexes: list[str] = field(default_factory=list)
    errors: list[CleanerdError] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)
    """Files named like segment files that are not (reported, left alone)."""
    producers: ProducerState | None = None
    """The producer state at the log end, when the validation rebuilt it (see the
    module docstring), else None."""
    leftovers: bool = False
    """Whether the dir holds leftovers of an interrupted rewrite that the open left as
    they are (a read-only open: `foresee_swap_damage` checks them as an owner's would)."""
    txn_indexed: frozenset[int] = frozenset()
    """Base offsets of the segments whose `.txnindex` the open's listing held."""
    unchecked: list[int] = field(default_factory=list)
    """Base offsets of the segments whose cheap check the open left to
    `check_unchecked` (`check_later`)."""
    as_kept: list[int] = field(default_factory=list)
    """After a crash: base offsets of the segments trusted as cleanerd last kept them
    (`known`), whose metadata the open takes from there."""
    recovered: list[tuple[int, list[AbortedTxn] | None]] = field(default_factory=list)
    """After a crash: the sound segments read past the recovery point whose `.txnindex`
    its owner makes what the log says, as Kafka's recovery rebuilds it (an abort's entry
    is written after its marker, so a crash between the two loses it): (base offset, its
    aborted transactions, found in the validation's walk; None when that walk met
    markers but could not tell, `PartitionLog` then finds them)."""

    @property
    def corrupt(self) -> CleanerdError | None:
        """The first damage found (the partition is then uncleanable), or None."""
        return self.errors[0] if self.errors else None

    def rebuilt_offsets(self) -> set[int]:
        """The base offsets of the segments whose indexes were rebuilt: read anew, as
        what was known of them names the old index files."""
        return {offset_from_filename(Path(p).name) for p in self.rebuilt_indexes}


# -- leftovers (Kafka's LogLoader) -------------------------------------------------------


Listing = list[os.DirEntry[str]]
"""A partition dir's entries, sorted by name: names, links, file types and inodes come
from the listing itself (d_type, d_ino), with no `stat` per file."""


def list_partition_dir(dir_path: Path) -> Listing:
    """One listing of `dir_path`, which the steps of an open share."""
    with os.scandir(dir_path) as entries:
        return sorted(entries, key=attrgetter("name"))


def _files(dir_path: Path) -> list[Path]:
    """The well-formed segment files of the dir, as listed now: nothing else is ever
    deleted or renamed."""
    entries = list_partition_dir(dir_path)
    return [Path(e.path) for e in entries if is_segment_file_name(e.name) and e.is_file()]


@dataclass(frozen=True, slots=True)
class ListedNames:
    """What an open needs of a listing's names, sorted out in one pass (`sort_names`): a
    start opens 10,000 dirs of tens of files, where a pass per question with several
    tests per name cost 0.1 ms a dir."""

    log_offsets: list[int]
    """Base offsets of the well-formed `.log` files (no state suffix), ascending."""
    malformed: list[tuple[str, str]]
    """(path, why) of each entry named like a segment file that is not one."""
    leftovers: bool
    """Whether steps 1-4 or the orphan-index rule have anything to do in the dir: a
    segment file with a state suffix, or an index file without its `.log`."""
    files: str
    """The names of the regular files, as `listing_text` joins them."""
    txn_indexed: frozenset[int] = frozenset()
    """Base offsets of the well-formed `.txnindex` files (no state suffix)."""

    def has(self, base_offset: int, kind: str) -> bool:
        """Whether the segment's file of `kind` (`.index`, say) was listed, as a file."""
        return f"/{filename_prefix_from_offset(base_offset)}{kind}/" in self.files


def sort_names(listing: Listing) -> ListedNames:
    """The listing's names sorted out for an open (see `ListedNames`): by a few regex
    passes over the names as one text when every entry is a regular file and none is
    malformed (a partition dir as Kafka and cleanerd leave it), else entry by entry."""
    text = listing_text([e.name for e in listing])
    if MALFORMED_NAMES.search(text) or not all([e.is_file() for e in listing]):
        return _sort_entries(listing)
    log_stems = LOG_NAMES.findall(text)
    index_names = INDEX_NAMES.findall(text)
    orphans = not {stem for stem, _ in index_names} <= set(log_stems)
    leftovers = orphans or STATE_NAMES.search(text) is not None
    txn = frozenset(int(stem) for stem, kind in index_names if kind == TXN_INDEX_FILE_SUFFIX)
    return ListedNames(sorted(map(int, log_stems)), [], leftovers, text, txn)


def _sort_entries(listing: Listing) -> ListedNames:
    log_offsets: list[int] = []
    malformed: list[tuple[str, str]] = []
    leftovers = False
    log_stems: set[str] = set()
    index_stems: set[str] = set()
    txn_indexed: set[int] = set()
    for entry in listing:
        name = entry.name
        parts = segment_file_parts(name)
        if parts is None:
            reason = malformed_segment_file_name(name)
            if reason is not None:
                malformed.append((entry.path, reason))
            continue
        stem, kind, state = parts
        if state is None and kind == LOG_FILE_SUFFIX:
            log_offsets.append(int(stem))
        if not entry.is_file():
            continue
        if state is not None:
            leftovers = True
        elif kind == LOG_FILE_SUFFIX:
            log_stems.add(stem)
        elif kind in INDEX_SUFFIXES:
            index_stems.add(stem)
            if kind == TXN_INDEX_FILE_SUFFIX:
                txn_indexed.add(int(stem))
    log_offsets.sort()
    files = listing_text([e.name for e in listing if e.is_file()])
    orphans = not index_stems <= log_stems
    return ListedNames(log_offsets, malformed, leftovers or orphans, files, frozenset(txn_indexed))


def _offset(path: Path) -> int:
    return offset_from_filename(path.name)


def refuse_link(link: Path, log_dir: Path) -> NoReturn:
    """Report the symlink `link` (its target, and whether that resolves inside `log_dir`)
    and raise SymlinkRefused."""
    target = str(link.readlink())
    # realpath, not Path.resolve: a link loop must be reported, not raise RuntimeError.
    resolved = Path(os.path.realpath(link))
    log.warning(
        "partition.symlink_refused",
        path=str(link),
        target=target,
        resolved=str(resolved),
        inside_log_dir=resolved.is_relative_to(os.path.realpath(log_dir)),
        action="partition skipped",
    )
    raise SymlinkRefused(link, target)


def list_refusing_links(dir_path: Path) -> Listing:
    """The partition dir's listing; raise SymlinkRefused if the dir or a file in it named
    like a segment file is a symlink, SpecialFileRefused if such a file is a FIFO, a
    socket or a device (the checks before anything else, in every mode)."""
    log_dir = dir_path.parent
    if dir_path.is_symlink():
        refuse_link(dir_path, log_dir)
    listing = list_partition_dir(dir_path)
    for entry in listing:
        if looks_like_segment_file(entry.name):
            if entry.is_symlink():
                refuse_link(Path(entry.path), log_dir)
            refuse_special(entry)
    return listing


def report_malformed_names(names: ListedNames, report: RecoveryReport) -> None:
    """Warn about every file named like a segment file that is not one (see the module
    docstring); they are left as they are."""
    for path, reason in names.malformed:
        log.warning("partition.malformed_file_name", path=path, reason=reason, action="left alone")
        report.malformed.append(path)


def _delete(path: Path, report: RecoveryReport, why: str, *, pending: bool = False) -> None:
    # A `.deleted` file (`pending`) is a deletion an unclean stop left to finish: said at
    # debug, as Kafka's loader says it, and once per partition at info by the caller
    # (thousands of them after a kill of a busy daemon flooded the journal).
    (log.debug if pending else log.info)("recovery.file_deleted", path=str(path), reason=why)
    safe_unlink(path)
    report.deleted.append(str(path))


def _leftovers(dir_path: Path) -> tuple[list[Path], list[Path], list[Path]]:
    """The `.deleted`, `.cleaned` and `.swap` files of the dir, in that order."""
    deleted: list[Path] = []
    cleaned: list[Path] = []
    swaps: list[Path] = []
    for path in _files(dir_path):
        name = path.name
        if name.endswith(DELETED_FILE_SUFFIX):
            deleted.append(path)
        elif name.endswith(CLEANED_FILE_SUFFIX):
            cleaned.append(path)
        elif name.endswith(SWAP_FILE_SUFFIX):
            swaps.append(path)
    return deleted, cleaned, swaps


def _split_swaps(cleaned: list[Path], swaps: list[Path]) -> tuple[list[Path], list[Path]]:
    """The `.swap` files of an unfinished `.cleaned` -> `.swap` step (at or above the
    lowest `.cleaned` base: step 2), and the others, which step 4 completes."""
    min_cleaned = min(map(_offset, cleaned), default=None)
    unfinished = [p for p in swaps if min_cleaned is not None and _offset(p) >= min_cleaned]
    return unfinished, [p for p in swaps if p not in unfinished]


def foresee_swap_damage(dir_path: Path, options: SegmentOptions) -> None:
    """Raise what an owner's open of `dir_path` raises before it changes a file: the
    CorruptRecordError of a swap it would complete whose `.log.swap` does not walk clean
    (`_swap_range`). Reads only, for `plan`, which foresees an owned dir's open."""
    _, cleaned, swaps = _leftovers(dir_path)
    _swap_range(dir_path, _split_swaps(cleaned, swaps)[1], options, foreseen=True)


def _swap_range(
    dir_path: Path, swaps: list[Path], options: SegmentOptions, *, foreseen: bool = False
) -> tuple[int, int]:
    """[lowest base, highest next offset) over the `.log.swap` files (step 3). Each is
    walked in full with CRC checks first: a swap's segment replaces the old ones, so one
    that does not walk clean to its end (torn, or damaged since it was written) raises,
    naming the file and position, before recovery deletes or renames anything."""
    low, high = None, None
    for path in swaps:
        if not path.name.endswith(LOG_FILE_SUFFIX + SWAP_FILE_SUFFIX):
            continue
        base = _offset(path)
        segment = LogSegment(
            dir_path,
            base,
            suffix=SWAP_FILE_SUFFIX,
            index_interval_bytes=options.index_interval_bytes,
            max_index_size=options.max_index_size,
            read_only=True,
        )
        scanned = segment.scan(verify_crc=True)
        if scanned.error is not None:
            raise CorruptRecordError(
                f"{scanned.error.reason}; the interrupted swap is left as it is (the "
                "segments it replaces may be in .deleted files)",
                path=path,
                position=scanned.error.position,
            )
        table = scanned.table
        next_offset = table.final_offset + 1 if len(table) else base
        low = base if low is None else min(low, base)
        high = next_offset if high is None else max(high, next_offset)
        # Foreseen (`plan`), a swap found is the open's news, not the plan's.
        (log.debug if foreseen else log.info)(
            "recovery.swap_found", path=str(path), base_offset=base, next_offset=next_offset
        )
    if low is None or high is None:
        return (0, 0)
    return (low, high)


def leftover_bytes(dir_path: Path) -> int:
    """The bytes on disk (allocated blocks) of the partition dir's `.deleted` and
    `.cleaned` files: what an owner's open deletes (`recover_leftovers`) before anything
    else, so the space its cycle's KIP-61 step finds freed (`plan` predicts from it)."""
    total = 0
    with os.scandir(dir_path) as entries:
        for e in entries:
            if e.name.endswith((DELETED_FILE_SUFFIX, CLEANED_FILE_SUFFIX)) and e.is_file(
                follow_symlinks=False
            ):
                total += e.stat(follow_symlinks=False).st_blocks * 512
    return total


def recover_leftovers(
    dir_path: Path,
    options: SegmentOptions,
    report: RecoveryReport | None = None,
    listing: Listing | None = None,
) -> RecoveryReport:
    """Kafka's handling of `.deleted`, `.cleaned` and `.swap` leftovers (steps 1-4 of the
    module docstring), then removal of orphan index files. `listing`: the dir as just
    listed (listed here otherwise). The swaps that step 3 completes are checked before
    the first file is deleted (`_swap_range`)."""
    report = RecoveryReport() if report is None else report
    if not sort_names(list_partition_dir(dir_path) if listing is None else listing).leftovers:
        return report  # the common case: nothing renamed, nothing to fsync
    deleted, cleaned, swaps = _leftovers(dir_path)
    unfinished, complete = _split_swaps(cleaned, swaps)
    low, high = _swap_range(dir_path, complete, options)
    for path in deleted:
        _delete(path, report, "left over from a finished swap or deletion", pending=True)
    if deleted:
        log.info(
            "recovery.files_deleted",
            path=str(dir_path),
            files=len(deleted),
            reason="left over from a finished swap or deletion (.deleted)",
        )
    for path in unfinished:
        _delete(path, report, "swap of an unfinished .cleaned -> .swap step")
    for path in cleaned:
        _delete(path, report, "output of an unfinished rewrite")
    for path in _files(dir_path):
        if not path.name.endswith(SWAP_FILE_SUFFIX) and low <= _offset(path) < high:
            _delete(path, report, "old segment replaced by a swap but not yet renamed")
    for path in _files(dir_path):
        if path.name.endswith(SWAP_FILE_SUFFIX):
            final = path.with_name(path.name[: -len(SWAP_FILE_SUFFIX)])
            log.info("recovery.swap_renamed", path=str(path), to=str(final))
            path.replace(final)
            report.renamed.append((str(path), str(final)))
    for path in _files(dir_path):
        if is_index_file(path.name) and not log_file(dir_path, _offset(path)).exists():
            _delete(path, report, "orphan index without a .log")
    fsync_dir(dir_path)
    return report


# -- segments ---------------------------------------------------------------------------


def open_segments(dir_path: Path, options: SegmentOptions, bases: list[int]) -> list[LogSegment]:
    """The segments at `bases` (a listing's `.log` offsets, ascending) as LogSegments."""
    return [
        LogSegment(
            dir_path,
            base,
            index_interval_bytes=options.index_interval_bytes,
            max_index_size=options.max_index_size,
            read_only=options.read_only,
        )
        for base in bases
    ]


def _quarantine(
    segment: LogSegment, data: bytes, position: int, quarantine_dir: Path | None
) -> Path | None:
    """Durably copy `data` (cut from `position` of the segment) to the quarantine dir."""
    if quarantine_dir is None:
        return None
    stem = f"{segment.log_path.name}.{position}"
    target = quarantine_dir / f"{stem}.tail"
    step = f"quarantining the torn tail of {segment.log_path} (nothing was cut)"
    with file_step(step, quarantine_dir):
        quarantine_dir.mkdir(parents=True, exist_ok=True)
    n = 1
    while target.exists():
        target = quarantine_dir / f"{stem}.{n}.tail"
        n += 1
    with file_step(step, target):
        atomic_write(target, data)
    return target


def truncate_torn_tail(
    segment: LogSegment, scan: Walk, reason: str, quarantine_dir: Path | None
) -> TruncatedTail:
    """Copy the bytes after the valid prefix to the quarantine dir (unless they are all
    zero: nothing to keep), then cut them off."""
    position = scan.stop
    cut_bytes = segment.size - position
    saved = None
    if reason != ZERO_TAIL:
        saved = _quarantine(segment, segment.read(position, cut_bytes), position, quarantine_dir)
    segment.truncate_to_position(position)
    log.warning(
        "segment.tail_truncated",
        path=str(segment.log_path),
        position=position,
        bytes_cut=cut_bytes,
        reason=reason,
        quarantined_to=None if saved is None else str(saved),
    )
    return TruncatedTail(
        str(segment.log_path), position, cut_bytes, reason, None if saved is None else str(saved)
    )


def foreseen_torn_tail(segment: LogSegment) -> TruncatedTail | None:
    """What an owner's open would cut from the end of `segment`, an active segment open
    read-only (whose size is then the end of its last whole batch): the bytes after it
    when they are a torn tail, `quarantined_to` None (the open copies them there); None
    when there are none, or when they are damage, which the open reports instead."""
    position = segment.size
    if segment.log_path.stat().st_size <= position:
        return None  # the usual case: one stat, nothing mapped
    buf = map_file(segment.log_path)
    # Judged by the offsets before it, when known (nothing is read for them), as the
    # owner's open walking the whole segment judges it.
    offsets = segment.offsets_from(position, segment.known_next_offset())
    scan = walk_prefix(buf, start=position, offsets=offsets)
    reason = torn_tail_reason(buf, scan, flushed_to=segment.flushed_to)
    if reason is None or scan.stop != position:
        return None
    return TruncatedTail(str(segment.log_path), position, len(buf) - position, reason, None)


def _report(report: RecoveryReport, error: CleanerdError) -> None:
    # At debug: the caller reports the damage (`PartitionLog.corrupt`; the daemon's
    # `open.failed` or `partition.uncleanable`, once), and a partition not compacted is
    # opened again every cycle until it is repaired.
    log.debug("segment.corrupt", error=str(error))
    report.errors.append(error)


def _indexes_exist(segment: LogSegment) -> bool:
    return segment.offset_index_path.exists() and segment.time_index_path.exists()


class ProducerFold:
    """The producer state rebuilt from the batches the validation walks (see the module
    docstring), and each whole segment's KIP-534 delete horizons, which the walk of
    `PartitionLog.producer_state` would otherwise find."""

    def __init__(self) -> None:
        self.state: ProducerState | None = ProducerState()
        """None once a marker's record did not parse (the producer state's own walk then
        reports it, at its file and position). A segment not walked whole is
        `validate_segments`' to see: it drops the fold."""
        self._horizon = (NO_DELETE_HORIZON, 0)
        self.aborted: list[AbortedTxn] = []
        """The aborted transactions of the segment walked (`ProducerState.aborted_in`)."""

    def start(self) -> None:
        """A segment's walk begins (at its first byte)."""
        self._horizon = (NO_DELETE_HORIZON, 0)
        self.aborted = []

    def add(self, table: BatchTable, buf: Buffer) -> None:
        """Apply the next valid batches, walked in `buf`."""
        if self.state is None:
            return
        try:
            self.aborted += self.state.aborted_in(table, buf)
            self.state.apply(table, buf)
        except CorruptRecordError:
            self.state = None
            return
        earliest, found = delete_horizon(table)
        self._horizon = (min(self._horizon[0], earliest), self._horizon[1] + found)

    def finish(self, segment: LogSegment) -> None:
        """The segment's walk reached the end of its valid bytes."""
        if self.state is not None and segment.delete_horizon is None:
            segment.delete_horizon = self._horizon


def _validate_full(
    segment: LogSegment,
    *,
    offsets: OffsetRange,
    is_active: bool,
    recovery_point: int,
    quarantine_dir: Path | None,
    report: RecoveryReport,
    fold: ProducerFold | None = None,
) -> tuple[bool, bool]:
    """Walk the whole segment, CRCs checked; whether it is sound (a torn tail cut), and
    whether it holds a control batch (a transaction marker)."""
    # One walk checks the CRCs and, as it goes, the indexes against the batches (or
    # rebuilds missing ones in memory); what it found is acted on only once the walk
    # is known to be clean, as if the indexes were read after it.
    indexes: IndexCheck | IndexRebuild | None = None
    unreadable: CleanerdError | None = None
    try:
        indexes = IndexCheck(segment) if _indexes_exist(segment) else IndexRebuild(segment)
    except (IndexPastLogError, CorruptIndexError) as exc:
        unreadable = exc
    markers = False
    with segment.open_buffer() as buf:

        def each(table: BatchTable) -> None:
            nonlocal markers
            if indexes is not None:
                indexes.add(table)
            if fold is not None:
                fold.add(table, buf)
            markers = markers or bool(table.is_control.any())

        if fold is not None:
            fold.start()
        scan = walk_prefix(buf, offsets=offsets, each=each)
        reason = torn_tail_reason(buf, scan, flushed_to=recovery_point) if is_active else None
    if scan.error is not None and reason is None:
        _report(report, scan.error.located(segment.log_path))
        return False, markers
    # Entries past the end are only the active segment's to explain by a crash, as only
    # its torn tail is a crash's to cut.
    crash_point = recovery_point if is_active else None
    sound = _settle_indexes(
        segment, indexes, unreadable, scan, reason, quarantine_dir, report, crash_point
    )
    return sound, markers


def _settle_indexes(
    segment: LogSegment,
    indexes: IndexCheck | IndexRebuild | None,
    unreadable: CleanerdError | None,
    scan: Walk,
    reason: str | None,
    quarantine_dir: Path | None,
    report: RecoveryReport,
    crash_point: int | None,
) -> bool:
    """After a full walk that found no damage: act on what it found of the indexes (and
    the torn tail, `reason`); whether the segment is sound. Index entries past the log's
    end are damage unless a crash explains them (`_lost_in_a_crash` at `crash_point`,
    the recovery point, given for the active segment): then the indexes are rebuilt, as
    Kafka's recovery rebuilds them."""
    try:
        segment.txn_index.sanity_check()
        if isinstance(indexes, IndexRebuild):
            if reason is None:
                indexes.finish(reason="missing")
                report.rebuilt_indexes.append(str(segment.log_path))
                return True
        else:
            segment.offset_index.check_within(segment.size, segment.log_path)
            if reason is None:
                if unreadable is not None:
                    raise unreadable
                assert indexes is not None
                indexes.finish()
    except IndexPastLogError as exc:
        if unreadable is not None and not isinstance(unreadable, IndexPastLogError):
            why = str(unreadable)  # entries out of order (`IndexCheck`): garbage
        elif crash_point is not None and _lost_in_a_crash(segment, scan, crash_point):
            why = f"{exc} (past the recovery point)"
        else:
            _report(report, exc)
            return False
        if reason is None:
            segment.rebuild_indexes(reason=why)
            report.rebuilt_indexes.append(str(segment.log_path))
            return True
        # Else cutting the torn tail below rebuilds the indexes.
    except CorruptIndexError as exc:
        if exc.path == str(segment.txn_index_path):
            _report(report, exc)
            return False
        segment.rebuild_indexes(reason=str(exc))
        report.rebuilt_indexes.append(str(segment.log_path))
        return True
    if reason is None:
        return True
    if segment.read_only:
        log.warning("segment.torn_tail_seen", path=str(segment.log_path), reason=reason)
        return False
    report.truncated.append(truncate_torn_tail(segment, scan, reason, quarantine_dir))
    report.rebuilt_indexes.append(str(segment.log_path))
    return True


def _lost_in_a_crash(segment: LogSegment, scan: Walk, recovery_point: int) -> bool:
    """Whether the index entries past the end of the active segment's valid bytes
    (`scan`) name only offsets at or above the recovery point, where the log ends too:
    batches never flushed, which a crash loses whole while their entries stay, or which
    a broker's truncation (`truncateTo`, its entry count in memory only) cut from a
    preallocated index before a crash. An entry past the end naming a flushed offset
    says that the log lost flushed bytes: damage."""
    end = scan.last_offset + 1 if scan.last_offset >= 0 else segment.base_offset
    offsets, positions = segment.offset_index.entry_arrays()
    past = offsets[positions >= scan.stop]
    return end >= recovery_point and (past.size == 0 or int(past.min()) >= recovery_point)


def _validate_cheap(
    segment: LogSegment,
    report: RecoveryReport,
    *,
    indexes: bool = True,
    txn_indexed: Collection[int] | None = None,
) -> bool:
    """The cheap check (see the module docstring); whether the segment passed it.
    Without `indexes`, of its transaction index only, if `txn_indexed` lists it (see
    `validate_segments`)."""
    try:
        if not indexes:
            if txn_indexed is None or segment.base_offset in txn_indexed:
                segment.txn_index.sanity_check()
            return True
        rebuilt = segment.sanity_check()
    except DAMAGE as exc:
        _report(report, exc)
        return False
    if rebuilt:
        report.rebuilt_indexes.append(str(segment.log_path))
    return True


def validate_segments(
    segments: list[LogSegment],
    *,
    recovery_point: int,
    full_check: bool = False,
    quarantine_dir: Path | None = None,
    report: RecoveryReport | None = None,
    clean_shutdown: bool = False,
    known: Mapping[int, KnownSegment] | None = None,
    fold: ProducerFold | None = None,
    check_later: bool = False,
    names: ListedNames | None = None,
    index_checks: bool = True,
    txn_indexed: Collection[int] | None = None,
) -> RecoveryReport:
    """Validate every segment (see the module docstring); never raises for damage found
    in the data, which goes to `report.errors` instead. `known`: what cleanerd last kept
    of the segments (`known_segments.py`). Without `index_checks`, a segment the cheap
    check would take has only its transaction index checked: for a read-only caller
    whose reads check the offset and time indexes where they read them, as the owner's
    open would (`LogSegment._tail`), so that checking them here would read them twice
    (`PartitionLog.foresee_open_damage`); `txn_indexed`, the segments whose
    `.txnindex` the dir's listing held, spares a failed open for each other one (110,000
    in a `plan` of 10,000 partitions of 11 segments). With `fold`, the producer state is
    rebuilt in the same walk when every segment is walked whole.
    `check_later`: the cheap checks that need not come first (the active segment's after
    a clean shutdown; after a crash, each segment's wholly below the recovery point whose
    index files `names`, the dir's listing, holds and that is not as kept) are left to
    `check_unchecked` (`report.unchecked`), for readers to run them beside the opening."""
    report = RecoveryReport() if report is None else report
    for n, segment in enumerate(segments):
        is_active = n == len(segments) - 1
        upper = segments[n + 1].base_offset if not is_active else None
        offsets = OffsetRange.of_segment(segment.base_offset, upper)
        unflushed = upper is None or upper > recovery_point
        recovering = unflushed and not clean_shutdown
        head = None
        if recovering and not full_check:
            head = _flushed_head(segment, recovery_point, offsets, index_checks=index_checks)
        if full_check or (recovering and head is None):
            sound, markers = _validate_full(
                segment,
                offsets=offsets,
                is_active=is_active,
                recovery_point=recovery_point,
                quarantine_dir=quarantine_dir,
                report=report,
                fold=fold,
            )
            if sound and recovering:
                if fold is not None and fold.state is not None:
                    aborted: list[AbortedTxn] | None = fold.aborted
                else:
                    aborted = None if markers else []  # None: to find from the log
                report.recovered.append((segment.base_offset, aborted))
            if fold is not None and sound:
                fold.finish(segment)
                continue
        elif clean_shutdown:
            if is_active and not _as_known(segment, known):
                if check_later:
                    report.unchecked.append(segment.base_offset)
                else:
                    _validate_cheap(segment, report)
            # else: trusted, as Kafka's loader trusts a cleanly stopped dir (the active
            # segment only when what cleanerd last kept describes it as it still is);
            # its indexes are read when first used (their last entries checked against
            # the log then), its batches when its metadata is first read (CRCs checked).
        elif not unflushed and _as_known(segment, known):
            report.as_kept.append(segment.base_offset)  # after a crash (see above)
        elif (
            check_later and not unflushed and names is not None and _indexes_listed(segment, names)
        ):
            report.unchecked.append(segment.base_offset)  # `check_unchecked` checks it
        else:
            passed = _validate_cheap(segment, report, indexes=index_checks, txn_indexed=txn_indexed)
            if passed and head:  # markers past the recovery point
                report.recovered.append((segment.base_offset, None))
        fold = None  # not walked whole, or damaged: the producer state needs its own walk
    if fold is not None and not report.errors:
        report.producers = fold.state
    return report


def _indexes_listed(segment: LogSegment, names: ListedNames) -> bool:
    return names.has(segment.base_offset, INDEX_FILE_SUFFIX) and names.has(
        segment.base_offset, TIME_INDEX_FILE_SUFFIX
    )


def check_unchecked(
    segments: list[LogSegment], report: RecoveryReport, checked: Mapping[int, KnownSegment]
) -> None:
    """The cheap check of each segment the open left unchecked (`check_later`), but for
    one that a reader checked (`known_reader.py`, with `check`: its entry in `checked`
    describes the very `.log`, whose indexes nobody rebuilt since, in a dir where the
    open finished no swap); damage goes to `report`, in segment order with the open's.
    Raises what the open would have (an index that cannot be rebuilt), the checks then
    still left."""
    by_base = {s.base_offset: s for s in segments}
    rebuilt = report.rebuilt_offsets()
    if report.renamed:
        checked = {}  # the open finished a swap: files the readers may have read before
    found = RecoveryReport()
    for base in report.unchecked:
        segment, entry = by_base.get(base), checked.get(base)
        if segment is None:
            continue
        if entry is None or base in rebuilt or entry.identity != segment.identity:
            _validate_cheap(segment, found)
    # In segment order, as the open's own checks would have found them: the first
    # damage is the lowest segment's (`corrupt`, where retention stops).
    report.errors[:] = sorted([*report.errors, *found.errors], key=_error_offset)
    report.rebuilt_indexes += found.rebuilt_indexes
    report.unchecked.clear()


def _error_offset(exc: CleanerdError) -> int:
    """The base offset of the segment file an error names (the last, if it names none)."""
    name = Path(getattr(exc, "path", None) or "").name
    return offset_from_filename(name) if is_segment_file_name(name) else 2**63


def _as_known(segment: LogSegment, known: Mapping[int, KnownSegment] | None) -> bool:
    entry = None if known is None else known.get(segment.base_offset)
    return entry is not None and segment.indexes_as_known(entry)


def _flushed_head(
    segment: LogSegment, recovery_point: int, offsets: OffsetRange, *, index_checks: bool
) -> bool | None:
    """When the segment holding the recovery point is sound up to it (the cheap check,
    or its transaction index's alone without `index_checks`) and its bytes after it walk
    clean, CRCs checked (then only that unflushed tail needed reading): whether that
    tail holds a control batch (a marker whose `.txnindex` entry a crash may have lost).
    None sends the segment to the full validation, which tells a torn tail from damage."""
    if recovery_point <= segment.base_offset:
        return None
    try:
        if not index_checks:
            segment.txn_index.sanity_check()
        elif segment.sanity_check():
            return None  # indexes rebuilt: the full validation re-reads it all anyway
        start = segment.position_for(recovery_point)
    except DAMAGE:
        return None
    markers = False

    def each(table: BatchTable) -> None:
        nonlocal markers
        markers = markers or bool(table.is_control.any())

    with segment.open_buffer() as buf:
        # no table kept: only the verdict, and whether a marker was met
        if walk_prefix(buf, start=start, offsets=offsets, each=each).error is not None:
            return None
    return markers


def recover_partition(
    dir_path: Path,
    options: SegmentOptions,
    *,
    recover: bool,
    recovery_point: int = 0,
    full_check: bool = False,
    quarantine_dir: Path | None = None,
    clean_shutdown: bool = False,
    listing: Listing | None = None,
    known: Mapping[int, KnownSegment] | None = None,
    fold: ProducerFold | None = None,
    check_later: bool = False,
) -> tuple[list[LogSegment], RecoveryReport]:
    """Open a partition dir's segments. Links are refused first (SymlinkRefused; or the
    caller did, making `listing` with `list_refusing_links`). With `recover` (the caller
    owns the log dir), then finish interrupted swaps, validate and repair what a crash
    can leave; without it, only check (nothing on disk changes). `fold`: rebuild the
    producer state in the validation's walk, for a dir with no producer snapshot
    (`report.producers`, with `recover` only)."""
    listing = list_refusing_links(dir_path) if listing is None else listing
    names = sort_names(listing)
    report = RecoveryReport()
    report_malformed_names(names, report)
    if recover and not options.read_only and names.leftovers:
        recover_leftovers(dir_path, options, report, listing)
        if report.deleted or report.renamed:
            names = sort_names(list_partition_dir(dir_path))
    else:
        report.leftovers = names.leftovers
    segments = open_segments(dir_path, options, names.log_offsets)
    report.txn_indexed = names.txn_indexed
    if recover or full_check:
        read_only = dataclasses.replace(options, read_only=True)
        validate_segments(
            segments if recover else open_segments(dir_path, read_only, names.log_offsets),
            recovery_point=recovery_point,
            full_check=full_check,
            quarantine_dir=quarantine_dir,
            report=report,
            clean_shutdown=clean_shutdown and recover,
            known=known,
            fold=fold if recover else None,
            check_later=check_later and recover,
            names=names,
        )
    return segments, report
