"""A partition dir as an ordered set of segments (Kafka's LocalLog and the log-level parts
of UnifiedLog): appends, rolls, swaps, deletions, reads and the metadata snapshot.

Layout: `<log.dir>/<topic>-<partition>/` holding segments named by base offset (see
`segment.py`); the last one is the active segment, the only one appended to. The log
end offset is the active segment's next offset; the log start offset is the larger of
the dir's `log-start-offset-checkpoint` entry and the first segment's base offset.

Concurrency between cleanerd processes (the daemon and `cleanerd produce`): every
mutation (append, roll, swap, deletion) holds the partition's `PartitionLock` and,
under it, first re-reads the segment list (by inode, so a swapped segment is noticed)
and the active segment's size. Writers therefore always append at the true end of the
log, and an append can never interleave with another process's roll or swap. The bytes
after the active segment's last index entry are checked under the lock before writing:
a partial batch left by a writer that was killed mid-write is cut (quarantined first),
anything else refuses the append.

Symbolic links: a partition dir that is a link, or a link among its segment files, is
refused when the partition is opened and again whenever the segment list is re-read
(`SymlinkRefused`, see `recovery.py`), so no append, roll, swap or deletion ever goes
through one.

Crash safety of each mutation:

- append: batch bytes, then index entries (see `segment.py`);
- roll: the old segment gets its final time-index entry and is fsynced, then the new
  segment's empty index files and `.log` are created and the dir fsynced;
- swap (`cleanerd.compaction.swap`, under `lock`): `.cleaned` -> `.swap` -> old files
  `.deleted` -> final names; `recovery.py` completes or rolls back every prefix, and
  `refresh` notices the new segments by their inodes;
- deletion: files are renamed to `.deleted` and the dir fsynced; the caller unlinks them
  after `file.delete.delay.ms`, or at once under disk pressure.

Producer state (`producer_state.py`): read from the latest Kafka-format snapshot, then
kept current by walking only what was appended since; the writer of the dir writes a
snapshot at the log end offset on each roll, after each clean and at a clean stop, so an
open reads the snapshot instead of every batch.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import stat
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import NamedTuple

from cleanerd.clock import wall_clock_ms
from cleanerd.errors import (
    DAMAGE,
    CheckpointError,
    CleanerdError,
    CorruptIndexError,
    CorruptRecordError,
    InvalidTxnStateError,
    LogDirLockedError,
    NoSegmentYet,
    file_step,
)
from cleanerd.log.checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    RootCheckpoints,
)
from cleanerd.log.files import (
    DELETED_FILE_SUFFIX,
    METADATA_TOPIC,
    TopicPartition,
    is_log_file,
    log_file,
    offset_from_filename,
    parse_topic_partition,
)
from cleanerd.log.fsutil import fsync_dir, mkdir_like, safe_unlink
from cleanerd.log.index import (
    DEFAULT_INDEX_INTERVAL_BYTES,
    DEFAULT_MAX_INDEX_SIZE,
    IndexPastLogError,
)
from cleanerd.log.known_segments import KnownSegment
from cleanerd.log.lock import (
    DEFAULT_LOCK_TIMEOUT_S,
    LogDirLock,
    PartitionLock,
    default_state_dir,
    holds_log_dir_lock,
    state_subdir,
)
from cleanerd.log.meta import PartitionMeta, SegmentMeta, last_stable_offset
from cleanerd.log.ownership import AppenderOwner, SegmentsChanged
from cleanerd.log.producer_state import (
    ProducerState,
    latest_snapshot,
    snapshot_offsets,
    snapshot_offsets_in,
    snapshot_path,
    write_snapshot,
)
from cleanerd.log.recovery import (
    ProducerFold,
    RecoveryReport,
    SegmentOptions,
    check_unchecked,
    foresee_swap_damage,
    list_refusing_links,
    recover_partition,
    refuse_link,
    refuse_special,
    truncate_torn_tail,
    validate_segments,
)
from cleanerd.log.roll import (
    DEFAULT_MIN_ROLL_INTERVAL_MS,
    TimeRollLimit,
    jitter_of_segment,
    rolls_at_append,
    time_roll_limit,
)
from cleanerd.log.segment import LogSegment
from cleanerd.log.segment_reader import load_aborted
from cleanerd.log.tail import torn_tail_reason
from cleanerd.log.topic_config import TopicConfig
from cleanerd.log.txnindex import AbortedTxn
from cleanerd.logger import get_logger
from cleanerd.records.batch import encode_batch
from cleanerd.records.control import ControlRecordType, encode_end_txn_marker
from cleanerd.records.header import Compression, TimestampType
from cleanerd.records.record import Record
from cleanerd.records.scan import BatchInfo
from cleanerd.records.varint import INT64_MAX
from cleanerd.records.walker import (
    NO_DELETE_HORIZON,
    OffsetRange,
    Walker,
    delete_horizon,
    scan_batches,
    walk,
    walk_prefix,
)

log = get_logger(__name__)

DEFAULT_SEGMENT_BYTES = 1024 * 1024 * 1024
DEFAULT_SEGMENT_MS = 7 * 24 * 60 * 60 * 1000
_SETTLED_NS = 2_000_000_000
"""A dir mtime this much older than a listing is trusted to change with the next entry
change (far above the coarse kernel clock's tick)."""
DEFAULT_FILE_DELETE_DELAY_MS = 60_000


@dataclass(frozen=True, slots=True)
class LogConfig:
    """The per-topic settings the log layer needs (Kafka's names in the docstrings)."""

    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    """`segment.bytes`: roll before an append would make the active segment larger."""
    segment_index_bytes: int = DEFAULT_MAX_INDEX_SIZE
    """`segment.index.bytes`: index capacity; a full index forces a roll."""
    index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES
    """`index.interval.bytes`: bytes between offset-index entries."""
    file_delete_delay_ms: int = DEFAULT_FILE_DELETE_DELAY_MS
    """`file.delete.delay.ms`: how long `.deleted` files stay before being unlinked."""
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S
    """How long to wait for another cleanerd process's partition lock."""
    segment_ms: int = DEFAULT_SEGMENT_MS
    """`segment.ms`: roll before an append whose records are this much newer than the
    active segment's first batch (`roll.rolls_at_append`)."""
    segment_jitter_ms: int = 0
    """`segment.jitter.ms`: the bound of each segment's drawn jitter."""
    max_compaction_lag_ms: int = INT64_MAX
    """`max.compaction.lag.ms`: the roll limit instead of `segment.ms` when lower, for a
    compacted topic (`compact`)."""
    compact: bool = False
    """`compact` is in the topic's cleanup.policy."""
    min_roll_interval_ms: int = DEFAULT_MIN_ROLL_INTERVAL_MS
    """`rolls.min_interval_ms`: the floor of time rolls, counted from the last roll."""

    def __post_init__(self) -> None:
        limits = {
            "segment.bytes": (self.segment_bytes, 14),
            "segment.index.bytes": (self.segment_index_bytes, 4),
            "index.interval.bytes": (self.index_interval_bytes, 0),
            "file.delete.delay.ms": (self.file_delete_delay_ms, 0),
            "segment.ms": (self.segment_ms, 1),
            "segment.jitter.ms": (self.segment_jitter_ms, 0),
            "max.compaction.lag.ms": (self.max_compaction_lag_ms, 1),
            "rolls.min_interval_ms": (self.min_roll_interval_ms, 0),
        }
        for key, (value, minimum) in limits.items():
            if value < minimum:
                raise ValueError(f"invalid value {value} for {key}: must be at least {minimum}")
        if self.lock_timeout_s <= 0:
            raise ValueError(f"invalid lock timeout {self.lock_timeout_s}: must be positive")

    @classmethod
    def of_topic(
        cls, topic: TopicConfig, *, min_roll_interval_ms: int = DEFAULT_MIN_ROLL_INTERVAL_MS
    ) -> LogConfig:
        """The part of a topic's effective settings the log layer reads, with cleanerd's
        minimum roll interval (`rolls.min_interval_ms`)."""
        return cls(
            segment_bytes=topic.segment_bytes,
            segment_index_bytes=topic.segment_index_bytes,
            index_interval_bytes=topic.index_interval_bytes,
            file_delete_delay_ms=topic.file_delete_delay_ms,
            segment_ms=topic.segment_ms,
            segment_jitter_ms=topic.segment_jitter_ms,
            max_compaction_lag_ms=topic.max_compaction_lag_ms,
            compact=topic.compact,
            min_roll_interval_ms=min_roll_interval_ms,
        )

    @property
    def time_roll(self) -> TimeRollLimit:
        """Kafka's maxSegmentMs and the setting behind it."""
        return time_roll_limit(self.segment_ms, self.max_compaction_lag_ms, compact=self.compact)


class PartitionLog:
    """One partition dir. Build with `open` or `create`; see the module docstring."""

    def __init__(
        self,
        path: Path,
        segments: list[LogSegment],
        *,
        config: LogConfig,
        lock: PartitionLock | None,
        checkpoints: RootCheckpoints,
        report: RecoveryReport,
        quarantine_dir: Path | None,
        owner: AppenderOwner | None = None,
        listed: tuple[int, int] | None = None,
        stopped_cleanly: bool = False,
    ) -> None:
        self.dir = path
        self.dir_name = str(path)
        """`dir` as a str, for this object's frequent system calls."""
        self.owner = owner
        """The owner this process writes beside (shared mode): proven before each roll."""
        self.topic_partition = parse_topic_partition(path.name)
        self.config = config
        self._time_roll = config.time_roll
        self.recovery_report = report
        self._lock = lock
        self._quarantine_dir = quarantine_dir
        self._segments = segments
        self.stopped_cleanly = stopped_cleanly
        """Read-only: the dir holds the clean-shutdown marker and no writer, so its
        owner's open would cut no torn tail (`open`'s `clean_shutdown`, for `plan`)."""
        self._flushed_to = checkpoints.recovery_points.get(self.topic_partition, 0)
        """The recovery point the checkpoint names (`recovery_point` may come down to
        the log end as read): below it no append can be in flight."""
        self._mark_growing()
        self._dir_stamp: tuple[int, int] | None = None
        self._inodes: dict[int, int] = {}
        if listed is None:
            self._inodes = self._scan_dir()
        else:  # `open` just listed it, and its segments are what it found
            self._inodes = {s.base_offset: s.inode for s in segments}
            self._dir_stamp = listed
        tp = self.topic_partition
        self._log_start_offset = checkpoints.log_start_offsets.get(tp, 0)
        self.high_watermark = checkpoints.high_watermarks.get(tp)
        self.recovery_point = checkpoints.recovery_points.get(tp, 0)
        self._recovery_point_said: Path | None = None
        """The checkpoint file to name if the recovery point proves past the log end
        (an owner's open that cut no tail), until its end is known."""
        self._producers: ProducerState | None = None
        self._stable_end: tuple[int, tuple[int, int, int]] | None = None
        """(base offset, identity) of a last segment that a clean stop recorded with no
        transaction open at its end (`KnownSegment.stable_end`), until the state is read."""
        self._txn_scanned: tuple[int, int] = (-1, 0)  # (segment base, position) walked to
        self._view: _View | None = None
        """The last `meta()` and what vouches that it still describes the files."""
        self._listed_snapshots: tuple[tuple[int, int], list[int]] | None = None
        """(dir stamp, snapshot offsets) from the open's listing, good while the dir's
        stamp is that one (saves listing it again for the first producer state)."""
        self._strays: list[int] | None = None
        """After a crash, the snapshots to remove past the log end once the checks the
        open left (`check_unchecked`) find the partition sound."""

    # -- opening -----------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        config: LogConfig | None = None,
        state_dir: Path | None = None,
        read_only: bool = False,
        recover: bool | None = None,
        checkpoints: RootCheckpoints | None = None,
        full_check: bool = False,
        owner: AppenderOwner | None = None,
        clean_shutdown: bool = False,
        known: Mapping[int, KnownSegment] | None = None,
        prefetch: bool = True,
        check_later: bool = False,
    ) -> PartitionLog:
        """Open the partition dir `path`.

        Recovery (finishing interrupted swaps, repairing torn tails, see `recovery.py`) is
        only for the owner of the log dir: with `recover` None it runs if this process
        holds the log dir's `.lock` or can take it for the duration of the recovery, and
        is skipped when another process (the owning daemon, a broker) holds it.
        `full_check` CRC-checks every segment. The KRaft metadata log is always read-only.
        `checkpoints` defaults to reading the parent log dir's root checkpoint files.
        `state_dir` holds partition locks and quarantined bytes; without one, locks go to
        `default_state_dir()` and nothing is quarantined. A writable log with no segment
        gets an empty one at its log start offset, as a broker does. `owner` is the
        cleanerd process that holds the log dir when this one only appends beside it
        (shared mode): every roll first proves that it still does. `clean_shutdown`: the
        log dir's owner found Kafka's clean-shutdown marker, so recovery scans nothing
        (read-only: the dir holds the marker and no writer, `stopped_cleanly`); `known`:
        what cleanerd last kept of the segments (`known_segments.py`), taken for each
        segment that is still the file it describes (when recovering without
        `clean_shutdown`, only for those the validation trusted as kept:
        `RecoveryReport.as_kept`).
        `prefetch` (the default) asks the kernel to start reading the small segments whose
        metadata is not known, which the first cycle reads; without it, the caller has
        them read elsewhere (`take_known`). `check_later`: the cheap checks that need not
        come first (`recovery.py`) are the caller's, by readers or by `check_unchecked`,
        before anything else reads the partition.
        """
        config = LogConfig() if config is None else config
        tp = parse_topic_partition(path.name)
        read_only = read_only or tp.topic == METADATA_TOPIC
        log_dir = path.parent
        if checkpoints is None:
            checkpoints = RootCheckpoints.read(log_dir)
        lock = None
        if not read_only:
            lock_dir = default_state_dir() if state_dir is None else state_dir
            lock = PartitionLock(lock_dir, log_dir, tp, timeout_s=config.lock_timeout_s)
        quarantine = None
        if state_dir is not None:
            quarantine = state_subdir(state_dir, "quarantine", log_dir) / str(tp)
        options = SegmentOptions(
            config.index_interval_bytes, config.segment_index_bytes, read_only=read_only
        )
        with (
            lock if lock is not None else nullcontext(),
            _ownership(log_dir, False if read_only else recover) as owns,
        ):
            _, listed = _dir_stamp(path)  # before the listing of the recovery
            listing = list_refusing_links(path)
            snapshots = snapshot_offsets_in(e.name for e in listing)
            segments, report = recover_partition(
                path,
                options,
                recover=owns,
                recovery_point=checkpoints.recovery_points.get(tp, 0),
                full_check=full_check,
                quarantine_dir=quarantine,
                clean_shutdown=clean_shutdown,
                listing=listing,
                known=known,
                fold=None if snapshots else ProducerFold(),
                check_later=check_later,
            )
            if not segments and not read_only:
                start = checkpoints.log_start_offsets.get(tp, 0)
                segments = [cls._new_segment(path, start, config)]
                fsync_dir(path)
                listed = None
            if report.deleted or report.renamed:
                listed = None  # recovery changed the dir since
            if known and owns and not clean_shutdown:  # a crash: what the validation trusted
                known = {base: known[base] for base in report.as_kept}
            stable_end = _seed(segments, known, report) if known else None
        plog = cls(
            path,
            segments,
            config=config,
            lock=lock,
            checkpoints=checkpoints,
            report=report,
            quarantine_dir=quarantine,
            owner=owner,
            listed=listed,
            stopped_cleanly=read_only and clean_shutdown,
        )
        plog._refuse_log_start_past_the_end()
        if owns and not report.truncated:
            plog._recovery_point_said = path.parent / RECOVERY_POINT_OFFSET_CHECKPOINT
        plog._bring_the_recovery_point_to_the_log_end(read=not report.unchecked)
        if report.producers is not None and plog.corrupt is None:
            plog._adopt_producers(report.producers)
        # Only a crash leaves snapshots past the log end: a clean stop flushed the log
        # before its snapshot (and a damaged partition is left as it is).
        crashed = owns and not clean_shutdown and plog.corrupt is None
        if crashed and report.recovered and lock is not None:
            with lock:
                plog._rebuild_txn_indexes(report.recovered)
        if crashed and report.unchecked:
            plog._strays = snapshots  # once the checks left find no damage either
        elif crashed and plog._remove_snapshots_past_the_end(snapshots):
            listed = None
        if listed is not None:
            plog._listed_snapshots = (listed, snapshots)
        plog._stable_end = stable_end
        if prefetch:
            plog.prefetch()
        return plog

    @classmethod
    def create(
        cls,
        log_dir: Path,
        tp: TopicPartition,
        *,
        config: LogConfig | None = None,
        state_dir: Path | None = None,
        checkpoints: RootCheckpoints | None = None,
        owner: AppenderOwner | None = None,
    ) -> PartitionLog:
        """Open `<log_dir>/<topic>-<partition>`, creating the dir if needed."""
        if parse_topic_partition(str(tp)) != tp:
            raise ValueError(f"{tp.topic!r} / {tp.partition} cannot name a partition dir")
        path = log_dir / str(tp)
        # A dangling link is not "missing": `open` refuses it rather than mkdir failing.
        if not path.exists() and not path.is_symlink():
            mkdir_like(path, log_dir)
            fsync_dir(log_dir)
        return cls.open(
            path, config=config, state_dir=state_dir, checkpoints=checkpoints, owner=owner
        )

    @staticmethod
    def _new_segment(
        path: Path, base_offset: int, config: LogConfig, like: Path | None = None
    ) -> LogSegment:
        return LogSegment.create(
            path,
            base_offset,
            index_interval_bytes=config.index_interval_bytes,
            max_index_size=config.segment_index_bytes,
            like=like,
        )

    # -- state ---------------------------------------------------------------------------

    @property
    def log_dir(self) -> Path:
        """The log dir holding this partition dir."""
        return self.dir.parent

    @property
    def lock(self) -> PartitionLock:
        """The partition lock; hold it for any rename in the dir (swaps, deletions)."""
        if self._lock is None:
            raise PermissionError(f"partition {self.dir} is open read-only")
        return self._lock

    @property
    def read_only(self) -> bool:
        """True in observe mode: nothing is ever written."""
        return self._lock is None

    @property
    def is_metadata(self) -> bool:
        """The KRaft metadata log, which cleanerd only reads."""
        return self.topic_partition.topic == METADATA_TOPIC

    def foresee_open_damage(
        self, known: Mapping[int, KnownSegment] | None, *, walk: bool = True
    ) -> None:
        """Find, read-only, the damage the owner's open would find in this partition
        (opened read-only in a dir nobody holds and whose owner did not stop cleanly):
        `recovery.validate_segments` with the recovery point the checkpoint names and
        `known`, what cleanerd last kept of the segments, as that open runs it. The
        damage joins the open's (`corrupt`, `readable_meta`), so `plan` and `audit`
        say what `clean` then reports; indexes that open would rebuild are rebuilt in
        memory, as this read-only open rebuilds them where it reads them (so the cheap
        checks of the segments below the recovery point check their transaction
        indexes only: `index_checks`; they doubled a `plan` of 10,000 partitions).
        Without `walk`, for a caller that reads every batch itself, CRCs checked
        (`audit` of a compacted partition), only the transaction indexes are checked:
        the walk read 174 MB twice in an audit of one partition. (`plan` walks: its
        delete-horizon reads check no CRC, and a segment the walk read is not read again
        for them.)"""
        if self.stopped_cleanly or self.recovery_report.errors:
            return
        listed = self.recovery_report.txn_indexed  # no failed open for each other one
        if walk:
            found = validate_segments(
                list(self._segments),
                recovery_point=self._flushed_to,
                known=known,
                index_checks=False,
                txn_indexed=listed,
            )
            self.recovery_report.errors.extend(found.errors)
            return
        for segment in self._segments:
            try:
                if segment.base_offset in listed:
                    segment.txn_index.sanity_check()
            except DAMAGE as exc:
                self.recovery_report.errors.append(exc)

    def foresee_pass_damage(self, meta: PartitionMeta) -> str | None:
        """What a cleaning pass over the segments of `meta` fails on before it reads a
        batch, or None: a `.txnindex` that does not parse, read by the pass's own
        `load_aborted` (of the segments whose index the open's listing held, so that a
        partition without transactions costs nothing). The owner's open checks no
        segment it trusts, a clean stop's or one as cleanerd kept it, so that pass is
        where such damage is met (`plan` says so)."""
        listed = [s for s in meta.segments if s.base_offset in self.recovery_report.txn_indexed]
        try:
            load_aborted(self.dir, listed)
        except CorruptIndexError as exc:
            return str(exc)
        return None

    def foresee_swap_damage(self) -> None:
        """Raise, read-only, what the owner's open would raise for the interrupted swaps
        this open left as they are (`recovery.foresee_swap_damage`): `plan` of an owned
        dir says the open fails, as `clean` then reports it."""
        if self.recovery_report.leftovers:
            options = SegmentOptions(
                self.config.index_interval_bytes, self.config.segment_index_bytes, read_only=True
            )
            foresee_swap_damage(self.dir, options)

    @property
    def corrupt(self) -> CleanerdError | None:
        """Damage found when opening (the partition is then uncleanable), or None."""
        return self.recovery_report.corrupt

    def _named(self, path: str | None) -> int | None:
        """Which segment's `.log` `path` is (an error's file), or None."""
        if path is None:
            return None
        return next((i for i, s in enumerate(self._segments) if str(s.log_path) == path), None)

    def _damaged_base(self) -> int | None:
        """The base offset of the segment the open found damaged, or None."""
        i = self._named(getattr(self.corrupt, "path", None))
        return None if i is None else self._segments[i].base_offset

    def _stand_in(
        self, segments: tuple[SegmentMeta, ...], i: int, damage: str
    ) -> tuple[SegmentMeta, ...]:
        """`segments` with segment `i` known by its files only, for `damage` (as it was,
        if already so)."""
        if segments[i].damage is not None:
            return segments
        return (*segments[:i], self._segments[i].damaged_meta(damage), *segments[i + 1 :])

    @property
    def recovery_point_to_checkpoint(self) -> int:
        """The recovery point a checkpoint may record: never past a closed segment the
        open found damaged, so that the next open walks that segment again and finds the
        damage again. (A roll moved it past, and the damage was forgotten.) A damaged
        active segment leaves it where it is: every open after a crash walks the active
        segment from the recovery point on, and its reader checks the CRCs below it;
        brought down to the segment's base, the recovery point would make damage in its
        last batch pass for a torn append, which the next owner's open cuts."""
        damaged = self._damaged_base()
        if damaged is None or damaged == self.active_segment.base_offset:
            return self.recovery_point
        return min(self.recovery_point, damaged)

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        """Segments ascending by base offset."""
        return tuple(self._segments)

    @property
    def active_segment(self) -> LogSegment:
        """The last segment."""
        if not self._segments:
            raise CleanerdError(f"partition dir {self.dir} holds no segment")
        return self._segments[-1]

    @property
    def log_end_offset(self) -> int:
        """The offset the next appended record gets."""
        if not self._segments:
            return self._log_start_offset
        return self.active_segment.next_offset

    @property
    def unflushed(self) -> bool:
        """Whether offsets past the recovery point exist: what a flush or a clean stop
        would fsync."""
        return self.recovery_point < self.log_end_offset

    @property
    def log_start_offset(self) -> int:
        """max(checkpointed log start offset, first segment's base offset)."""
        first = self._segments[0].base_offset if self._segments else 0
        return max(self._log_start_offset, first)

    def _refuse_log_start_past_the_end(self) -> None:
        """A checkpointed log start offset past the log end is refused with an error
        naming the file, and the partition is not opened. Kafka's loader takes it to mean
        the segments were deleted behind its back and deletes all of them; retention here
        would delete every segment below it. Neither is done on the word of one number: a
        broker never writes a log start past its high watermark, and the checkpoint is read
        before the segments are listed, so a live broker's appends cannot cause this."""
        start = self._log_start_offset
        if not self._segments or start <= self._segments[-1].base_offset:
            return
        try:
            end = self.log_end_offset
        except CleanerdError:
            return  # a damaged active segment is reported where its end is read
        if start > end:
            raise CheckpointError(
                f"{self.topic_partition}: log start offset {start} is past the log end "
                f"offset {end}; nothing is deleted on its account (correct or remove the "
                "entry)",
                path=self.dir.parent / LOG_START_OFFSET_CHECKPOINT,
            )

    def _bring_the_recovery_point_to_the_log_end(self, *, read: bool) -> None:
        """As Kafka's loader: a recovery point never lies past the log end. One past it
        is wrong (edited, or restored with other data; a tail at offsets it calls
        flushed is damage, not cut, `tail.torn_tail_reason`): kept, it would be written back, and
        the offsets appended up to it would pass for flushed, so that a start after a
        crash would trust the segments holding them unread (`recovery.py`). An owner's
        open says so (an observer may have read the checkpoint after the broker's
        appends that its listing missed). Only a recovery point inside or past the
        active segment needs that segment's end; unless `read`, it is taken only when
        known without a read (the open leaves the active segment's check to readers
        after a clean stop: `check_unchecked` settles it then)."""
        active = self._segments[-1] if self._segments else None
        if active is None or self.recovery_point <= active.base_offset:
            self._recovery_point_said = None
            return
        end = active.known_next_offset()
        if end is None and read:
            try:
                end = active.next_offset
            except CleanerdError:
                end = None  # damaged: what reads it reports it
        if end is None:
            return
        said, self._recovery_point_said = self._recovery_point_said, None
        if self.recovery_point <= end:
            return
        if said is not None:
            log.warning(
                "checkpoint.recovery_point_past_log_end",
                path=str(said),
                partition=str(self.topic_partition),
                recovery_point=self.recovery_point,
                log_end_offset=end,
                action="brought back to the log end",
            )
        self.recovery_point = end

    def follow_checkpoints(self, checkpoints: RootCheckpoints) -> None:
        """Take up the dir's checkpoint files as re-read since the partition was opened:
        a log start offset raised there (a DeleteRecords result an application or a
        retired broker wrote) moves this one up, never down and never past the log end
        offset, as Kafka's maybeIncrementLogStartOffset; the high watermark follows the
        file."""
        tp = self.topic_partition
        start = checkpoints.log_start_offsets.get(tp)
        if start is not None:
            self._log_start_offset = max(self._log_start_offset, min(start, self.log_end_offset))
        self.high_watermark = checkpoints.high_watermarks.get(tp, self.high_watermark)

    def last_roll_ms(self) -> int | None:
        """When the active segment was rolled in, by the evidence on disk: the previous
        segment's last modification (a roll writes the old segment last; a cleaned
        segment keeps its sources' mtime). None for a lone segment."""
        if len(self._segments) < 2:
            return None
        return self._segments[-2].last_modified_ms

    @property
    def first_unstable_offset(self) -> int | None:
        """First offset of the earliest open transaction, or None."""
        if self._producers is None and self._stable_end is not None:
            last = self._segments[-1] if self._segments else None
            if last is not None and (last.base_offset, last.identity) == self._stable_end:
                return None  # the log as a clean stop left it, with no transaction open
            self._stable_end = None
        ongoing = self.producer_state().ongoing()
        return min(ongoing.values()) if ongoing else None

    def _scan_dir(self) -> dict[int, int]:
        """The `.log` files of the dir by base offset, with their inodes.

        A dir whose mtime has not changed since a listing that came well after it
        (`_SETTLED_NS`) is not listed again: creating, renaming or removing an entry sets
        the dir's mtime to the time of the change, which is then newer than the one kept
        (git's racy-timestamp rule keeps a change in the same clock tick as the listing
        from being missed)."""
        # Links were refused when the partition was opened; checked again on every re-read
        # (one lstat, and d_type for the files) so one put in place since is refused too,
        # before anything is written through it.
        st, stamp = _dir_stamp(self.dir_name)
        if stat.S_ISLNK(st.st_mode):
            refuse_link(self.dir, self.log_dir)
        if stamp is not None and stamp == self._dir_stamp:
            return self._inodes
        found: dict[int, int] = {}
        with os.scandir(self.dir) as entries:
            for entry in entries:
                if not is_log_file(entry.name):
                    continue
                if entry.is_symlink():
                    refuse_link(Path(entry.path), self.log_dir)
                refuse_special(entry)
                found[offset_from_filename(entry.name)] = entry.inode()
        self._dir_stamp = stamp
        return found

    def _locked(self) -> AbstractContextManager[object]:
        return self._lock if self._lock is not None else nullcontext()

    def refresh(self) -> None:
        """Catch up with other processes: re-list segments (by inode) and re-stat the
        active one."""
        current = self._scan_dir()
        if current == self._inodes:
            if self._segments:
                self._segments[-1].refresh()
            return
        old = {s.base_offset: s for s in self._segments}
        old_active = self._segments[-1].base_offset if self._segments else None
        segments = []
        for base in sorted(current):
            segment = old.get(base)
            if segment is None or self._inodes.get(base) != current[base] or base == old_active:
                try:
                    segment = LogSegment(
                        self.dir,
                        base,
                        index_interval_bytes=self.config.index_interval_bytes,
                        max_index_size=self.config.segment_index_bytes,
                        read_only=self.read_only,
                    )
                except FileNotFoundError:
                    continue  # deleted since the listing (a broker, in observe mode)
            segments.append(segment)
        scanned_base = self._txn_scanned[0]
        if scanned_base in self._inodes and current.get(scanned_base) != self._inodes[scanned_base]:
            self._producers = None  # the segment the walk stopped in was rewritten
        self._segments, self._inodes = segments, current
        self._mark_growing()

    def _mark_growing(self) -> None:
        """Read-only, the active segment is the one another writer may be appending to,
        whose torn tail its owner's open would cut, unless the dir stopped cleanly: then
        nobody writes, and a bad tail is damage, as the owner meets it; so is a bad last
        batch whose bytes are all there below the checkpoint's recovery point."""
        for segment in self._segments:
            segment.growing = False
        if self.read_only and self._segments:
            self._segments[-1].growing = not self.stopped_cleanly
            self._segments[-1].flushed_to = self._flushed_to

    # -- appending -------------------------------------------------------------------------

    @contextmanager
    def _write_lock(self, *, writes_active: bool = True) -> Iterator[None]:
        if self._lock is None:
            raise PermissionError(f"partition {self.dir} is open read-only")
        with self._lock:
            self.refresh()
            self._check_active_tail(refuse=writes_active)
            yield

    def _check_active_tail(self, *, refuse: bool = True) -> None:
        """Make sure the active segment ends with a whole valid batch before writing: cut
        a partial batch a killed writer left, rebuild an index that does not match, and
        refuse any other damage (`refuse`; a write that leaves the active segment alone,
        such as deleting older segments, goes on beside it)."""
        active = self.active_segment
        try:
            active.next_offset  # noqa: B018 - reading it scans and checks the tail
        except IndexPastLogError:
            if refuse:
                raise
        except DAMAGE:
            with active.open_buffer() as buf:
                scan = walk_prefix(buf, offsets=active.offsets)
                reason = torn_tail_reason(buf, scan, flushed_to=self.recovery_point)
            # What the open already called damage (a bad tail in a dir whose clean
            # stop left its marker) is not cut as a killed writer's partial batch by
            # the same run: one verdict a run.
            opened_damaged = getattr(self.corrupt, "path", None) == str(active.log_path)
            if scan.error is None:
                active.rebuild_indexes(reason="index does not match the log")
            elif reason is None or opened_damaged:
                if refuse:
                    raise scan.error.located(active.log_path) from None
            else:
                cut = truncate_torn_tail(active, scan, reason, self._quarantine_dir)
                self.recovery_report.truncated.append(cut)
                # A cut never reaches offsets the recovery point calls flushed (those
                # are damage, `torn_tail_reason`): the point stays at most the log end.
                self.recovery_point = min(self.recovery_point, active.next_offset)

    def append(
        self,
        records: Sequence[Record],
        *,
        compression: Compression = Compression.NONE,
        timestamp_type: TimestampType = TimestampType.CREATE_TIME,
        producer_id: int = -1,
        producer_epoch: int = -1,
        base_sequence: int = -1,
        is_transactional: bool = False,
        partition_leader_epoch: int = -1,
        now_ms: int | None = None,
    ) -> tuple[int, int]:
        """Append `records` as one v2 batch at the log end offset (their own offsets are
        ignored: offsets are assigned contiguously, as a leader does). Returns the first
        and last offset assigned. A non-transactional batch of a producer whose
        transaction is open is refused (InvalidTxnStateError), as Kafka refuses it. The
        active segment is rolled first when the batch would not fit it, or when its
        records are `segment.ms` newer than its first batch (`roll.rolls_at_append`;
        `now_ms`, default the clock, is when the minimum roll interval is counted to)."""
        if not records:
            raise ValueError("append needs at least one record")
        with self._write_lock():
            first = self.log_end_offset
            numbered = [dataclasses.replace(r, offset=first + i) for i, r in enumerate(records)]
            data = encode_batch(
                numbered,
                base_offset=first,
                compression=compression,
                timestamp_type=timestamp_type,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                base_sequence=base_sequence,
                is_transactional=is_transactional,
                partition_leader_epoch=partition_leader_epoch,
            )
            self._append_locked(data, now_ms=now_ms)
        return first, first + len(records) - 1

    def append_batches(self, data: bytes, *, now_ms: int | None = None) -> tuple[int, int]:
        """Append already-encoded batches (v2 or legacy) keeping their offsets, which must
        be at or above the log end offset (a follower's append). Returns the first and
        last offset. Refused whole, as `append` refuses it, when one batch writes outside
        its producer's open transaction. Rolls as `append` does, before each batch."""
        infos = list(scan_batches(data))
        if not infos:
            raise ValueError("append_batches needs at least one batch")
        with self._write_lock():
            self._append_locked(data, infos, now_ms=now_ms)
        return infos[0].base_offset, infos[-1].last_offset

    def append_end_txn_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        *,
        commit: bool,
        timestamp: int,
        coordinator_epoch: int = 0,
    ) -> int:
        """Append a COMMIT or ABORT marker for the producer's open transaction; an abort
        of a non-empty transaction is recorded in the `.txnindex`. Returns its offset."""
        kind = ControlRecordType.COMMIT if commit else ControlRecordType.ABORT
        with self._write_lock():
            offset = self.log_end_offset
            marker = encode_end_txn_marker(
                kind, coordinator_epoch, offset=offset, timestamp=timestamp
            )
            data = encode_batch(
                [marker],
                base_offset=offset,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                is_transactional=True,
                is_control=True,
            )
            self._append_locked(data)
        return offset

    def _append_locked(
        self, data: bytes, infos: Sequence[BatchInfo] | None = None, *, now_ms: int | None = None
    ) -> None:
        if infos is None:
            infos = list(scan_batches(data))
        self._refuse_writes_outside_open_txns(infos)
        for info in infos:
            active = self.active_segment
            why = active.roll_before_append(info.size, info.last_offset, self.config.segment_bytes)
            if why is None:
                why = self._time_roll_before(active, info.max_timestamp, now_ms)
            if why is not None:
                self._roll_locked(
                    max(self.log_end_offset, info.base_offset), reason=why, now_ms=now_ms
                )
                active = self.active_segment
            chunk = data[info.position : info.position + info.size]
            relative = _at_start(info)
            transactional = info.header is not None and info.header.is_transactional
            if transactional:
                self.producer_state()  # bring the state up to just before this batch
            active.append(chunk, relative)
            if transactional:
                self._apply_appended_txn_batch(active, chunk)

    def _time_roll_before(
        self, active: LogSegment, max_timestamp: int, now_ms: int | None
    ) -> str | None:
        """The setting behind a time roll before an append of records whose max timestamp
        is `max_timestamp` (`roll.rolls_at_append`), or None."""
        first = active.first_batch_timestamp if active.size else None
        limit = self._time_roll
        if first is None or max_timestamp - first <= limit.ms - self.config.segment_jitter_ms:
            return None  # not due even with the most jitter: the common case, decided here
        if self.is_metadata:
            return None
        tp, config = self.topic_partition, self.config
        jitter = jitter_of_segment(
            tp.topic, tp.partition, active.base_offset, config.segment_ms, config.segment_jitter_ms
        )
        if not rolls_at_append(
            first,
            max_timestamp,
            max_segment_ms=limit.ms,
            jitter_ms=jitter,
            now_ms=wall_clock_ms() if now_ms is None else now_ms,
            last_roll_ms=self.last_roll_ms(),
            min_roll_interval_ms=self.config.min_roll_interval_ms,
        ):
            return None
        return limit.reason.value

    def _refuse_writes_outside_open_txns(self, infos: Sequence[BatchInfo]) -> None:
        """Raise InvalidTxnStateError, before any of `infos` is appended, when one is a
        non-transactional data batch of a producer with an open transaction (Kafka's
        `ProducerAppendInfo` refuses it in every append, so no broker writes one)."""
        if not any(i.header is not None and i.header.producer_id >= 0 for i in infos):
            return
        ongoing = self.producer_state().ongoing()
        for info in infos:
            h = info.header
            if h is None or h.producer_id < 0:
                continue
            if h.is_control:
                ongoing.pop(h.producer_id, None)
            elif h.is_transactional:
                ongoing.setdefault(h.producer_id, info.base_offset)
            elif h.producer_id in ongoing:
                raise InvalidTxnStateError(
                    self.active_segment.log_path,
                    producer_id=h.producer_id,
                    offset=info.base_offset,
                    txn_first=ongoing[h.producer_id],
                )

    # -- producer state ------------------------------------------------------------------

    def _snapshot_offsets(self) -> list[int]:
        listed = self._listed_snapshots
        if listed is not None and _dir_stamp(self.dir_name)[1] == listed[0]:
            return listed[1]
        self._listed_snapshots = None
        return snapshot_offsets(self.dir)

    def _remove_snapshots_past_the_end(self, offsets: list[int]) -> bool:
        """Delete the producer snapshots above the recovered log end, as Kafka's loader
        does: they hold the state of batches a crash took back (a snapshot is written
        at the log end without waiting for the batches below it to be flushed), and
        would be read as the state of whatever is appended at those offsets next.
        Returns whether any was deleted."""
        if not self._segments or offsets[-1:] <= [self.active_segment.base_offset]:
            return False  # none above the active segment's base: none past the end
        end = self.log_end_offset
        stray = [o for o in offsets if o > end]
        for offset in stray:
            path = snapshot_path(self.dir, offset)
            safe_unlink(path)
            log.warning("producer_snapshot.past_log_end", path=str(path), log_end_offset=end)
        return bool(stray)

    def _state_at_snapshot(self) -> ProducerState:
        """The state in the latest usable producer snapshot (empty at 0 without one)."""
        state = latest_snapshot(
            self.dir,
            self._snapshot_offsets(),
            log_start=self.log_start_offset,
            log_end=self.log_end_offset,
            live=bool(self._segments) and self._segments[-1].live,
        )
        return ProducerState() if state is None else state

    def _rebuild_txn_indexes(
        self, recovered: Sequence[tuple[int, list[AbortedTxn] | None]]
    ) -> None:
        """Make the `.txnindex` of each segment recovery read after a crash what its
        batches say (`RecoveryReport.recovered`), as Kafka's `LogSegment.recover` does: an
        abort's entry is appended after its marker, so a crash between the two loses it,
        and a cleaner that reads no entry keeps the aborted records (and drops the
        committed ones they supersede). Where the validation's walk could not tell (its
        markers need the transactions open before the segment), they are found here from
        the producer state at the first such segment's base (the snapshot at or below it,
        then the batches between) and a walk of those segments. Damage met on the way is
        left to the reads that report it."""
        by_base = {s.base_offset: s for s in self._segments}
        found = {base: entries for base, entries in recovered if base in by_base}
        unknown = sorted(base for base, entries in found.items() if entries is None)
        try:
            if unknown:
                found.update(self._aborted_from(unknown))
        except DAMAGE as exc:
            log.debug("segment.txn_index_not_rebuilt", path=str(self.dir), error=str(exc))
            return
        for base, entries in found.items():
            index = by_base[base].txn_index
            if entries is not None and index.rebuild(entries):
                log.warning(
                    "segment.txn_index_rebuilt",
                    path=str(index.path),
                    aborted_transactions=len(entries),
                )

    def _aborted_from(self, bases: Sequence[int]) -> dict[int, list[AbortedTxn]]:
        """The aborted transactions of the segments at `bases` (ascending), from the
        producer state at the first one's base."""
        first = bases[0]
        state = (
            latest_snapshot(
                self.dir, self._snapshot_offsets(), log_start=self.log_start_offset, log_end=first
            )
            or ProducerState()
        )
        wanted = set(bases)
        found: dict[int, list[AbortedTxn]] = {}
        for n, segment in enumerate(self._segments):
            upper = self._segments[n + 1].base_offset if n + 1 < len(self._segments) else None
            if upper is not None and upper <= state.offset:
                continue  # below the snapshot: in its state already
            if segment.base_offset > bases[-1]:
                break
            aborted: list[AbortedTxn] = []
            with segment.open_buffer() as buf:
                walker = Walker(buf, verify_crc=False, offsets=segment.offsets)
                for chunk in walker:
                    if segment.base_offset in wanted:
                        aborted += state.aborted_in(chunk, buf)
                    state.apply(chunk, buf)
                error = walker.error
                del walker  # its view of `buf` must go before the mmap closes
            if error is not None:
                raise error.located(segment.log_path)
            if segment.base_offset in wanted:
                found[segment.base_offset] = aborted
        return found

    def _adopt_producers(self, state: ProducerState) -> None:
        """Take the producer state the open's validation rebuilt, at the log end."""
        self._producers = state
        last = self._segments[-1] if self._segments else None
        self._txn_scanned = (-1, 0) if last is None else (last.base_offset, last.size)

    def producer_state(self) -> ProducerState:
        """The producer state at the log end offset: the latest snapshot, then a walk of
        the batches after it (only what was appended since the last call)."""
        last = self._segments[-1] if self._segments else None
        if last is None or not last.live:
            return self._walk_producers()
        # Beside a live broker, a truncation (Kafka's `truncateTo`) can take back bytes
        # this state was walked from, and appends can follow past where the last walk
        # ended, which then lies inside a batch: either way the state is rebuilt from
        # the snapshot, where real damage still raises.
        scanned_base, scanned_pos = self._txn_scanned
        if last.base_offset == scanned_base and last.size < scanned_pos:
            self._producers = None
        incremental = self._producers is not None
        try:
            return self._walk_producers()
        except CorruptRecordError:
            if not incremental:
                raise
            self._producers = None
            return self._walk_producers()

    def _walk_producers(self) -> ProducerState:
        if self._producers is None:
            self._producers = self._state_at_snapshot()
            self._txn_scanned = (-1, 0)
        state = self._producers
        last = self._segments[-1] if self._segments else None
        if last is not None and self._txn_scanned == (last.base_offset, last.size):
            return state  # nothing appended since the last call
        scanned_base, scanned_pos = self._txn_scanned
        floor = state.offset
        for n, segment in enumerate(self._segments):
            upper = self._segments[n + 1].base_offset if n + 1 < len(self._segments) else None
            if segment.base_offset < scanned_base or (upper is not None and upper <= floor):
                continue
            if segment.base_offset == scanned_base:
                start = scanned_pos
            elif segment.base_offset < floor:
                if segment.next_offset <= floor:
                    continue  # the snapshot is at its end (a clean stop's): nothing after
                start = segment.position_for(floor)
            else:
                start = 0
            if start >= segment.size:
                continue  # nothing appended since the last walk
            horizon = (NO_DELETE_HORIZON, 0)
            with segment.open_buffer() as buf:
                walker = Walker(
                    buf,
                    start=start,
                    verify_crc=False,
                    offsets=OffsetRange.of_segment(segment.base_offset, upper),
                )
                try:
                    for chunk in walker:
                        state.apply(chunk, buf)
                        if start == 0:
                            earliest, found = delete_horizon(chunk)
                            horizon = (min(horizon[0], earliest), horizon[1] + found)
                except CorruptRecordError as exc:  # a marker whose record does not parse
                    walker.error = exc.with_traceback(None)
                error = walker.error
                del walker  # its view of `buf` must go before the mmap closes
            if error is not None:
                raise error.located(segment.log_path)
            if start == 0 and segment.delete_horizon is None:
                # A whole segment walked here is not walked again for its horizons.
                segment.delete_horizon = horizon
            self._txn_scanned = (segment.base_offset, segment.size)
        if last is not None:  # walked, or covered by the snapshot, to the end of the log
            self._txn_scanned = (last.base_offset, last.size)
        return state

    def _apply_appended_txn_batch(self, segment: LogSegment, chunk: bytes) -> None:
        # The entry an ABORT marker earns by the rule recovery rebuilds the index with.
        state = self._producers
        assert state is not None
        table = walk(chunk).table
        for txn in state.aborted_in(table, chunk):
            segment.append_aborted_txn(txn)
        state.apply(table, chunk)
        self._txn_scanned = (segment.base_offset, segment.size)

    def take_snapshot(self) -> Path | None:
        """Write the producer state at the log end offset as `<offset>.snapshot` (see
        `producer_state.py`), unless one is there already; the dir's writer only. A
        snapshot only saves the next open a walk, so a failure to write one is logged
        (naming the file) and returns None."""
        with self._write_lock():
            return self._take_snapshot_locked()

    def _take_snapshot_locked(self) -> Path | None:
        end = self.log_end_offset
        if end in snapshot_offsets(self.dir):
            return None
        state = ProducerState(end, self.producer_state().entries)
        try:
            return write_snapshot(
                self.dir,
                state,
                log_start_offset=self.log_start_offset,
                like=self.active_segment.log_path,
            )
        except OSError as exc:
            log.warning(
                "producer_snapshot.write_failed",
                path=str(snapshot_path(self.dir, end)),
                error=str(exc),
            )
            return None

    # -- rolling -----------------------------------------------------------------------------

    def roll(
        self,
        now_ms: int | None = None,
        *,
        reason: str = "requested",
        waited_ms: int | None = None,
    ) -> LogSegment | None:
        """Start a new empty active segment at the log end offset. The old one gets its
        final time-index entry and is fsynced. A roll of an empty active segment does
        nothing and returns None. `now_ms`, `reason` (the setting that made the roll
        due, e.g. `segment.ms`) and `waited_ms` (how long its time rule waited) are only
        reported in the `segment.rolled` line, the one line a roll logs."""
        with self._write_lock():
            if self.active_segment.size == 0:
                return None
            return self._roll_locked(
                self.log_end_offset, reason=reason, now_ms=now_ms, waited_ms=waited_ms
            )

    def _roll_locked(
        self,
        base_offset: int,
        *,
        reason: str,
        now_ms: int | None = None,
        waited_ms: int | None = None,
    ) -> LogSegment:
        if self.owner is not None:
            self.owner.verify()
        old = self.active_segment
        old.close_for_roll()  # fsynced too
        with file_step("creating the new active segment", log_file(self.dir, base_offset)):
            segment = self._new_segment(self.dir, base_offset, self.config, old.log_path)
            fsync_dir(self.dir)
        if self.recovery_point >= old.base_offset:  # no closed segment below is unflushed
            self.recovery_point = max(self.recovery_point, base_offset)
        self._segments.append(segment)
        self._inodes = self._scan_dir()
        self._take_snapshot_locked()  # at the new base offset, as Kafka does at a roll
        log.info(
            "segment.rolled",
            topic=self.topic_partition.topic,
            partition=self.topic_partition.partition,
            log_dir=str(self.log_dir),
            base_offset=old.base_offset,  # the segment rolled, as the event and reports say
            next_offset=base_offset,  # the new active segment's base
            size_bytes=old.size,
            reason=reason,
            now_ms=now_ms,
            **({} if waited_ms is None else {"waited_ms": waited_ms}),
        )
        return segment

    # -- reading -------------------------------------------------------------------------------

    def _segment_index(self, offset: int) -> int:
        bases = [s.base_offset for s in self._segments]
        return max(bisect.bisect_right(bases, offset) - 1, 0)

    def segment_for(self, offset: int) -> LogSegment:
        """The segment whose range holds `offset` (the first one below all bases)."""
        return self._segments[self._segment_index(offset)]

    def batches(
        self, from_offset: int | None = None, *, verify_crc: bool = True
    ) -> Iterator[tuple[LogSegment, BatchInfo]]:
        """Every batch from the one holding `from_offset` (all when None), with its
        segment, in offset order. Re-reads the dir first, so appends by other processes
        are seen."""
        with self._locked():
            self.refresh()
        start = 0 if from_offset is None else self._segment_index(from_offset)
        for segment in list(self._segments)[start:]:
            for info in segment.batches(from_offset, verify_crc=verify_crc):
                yield segment, info

    def records(self, from_offset: int | None = None) -> Iterator[Record]:
        """Every record at or after `from_offset` (all when None), in offset order."""
        with self._locked():
            self.refresh()
        start = 0 if from_offset is None else self._segment_index(from_offset)
        for segment in list(self._segments)[start:]:
            yield from segment.records(from_offset)

    def collect_aborted_transactions(
        self, start_offset: int, upper_bound_offset: int
    ) -> list[AbortedTxn]:
        """Aborted transactions overlapping `[start, upper)`, walking segments from the one
        holding `start` until an entry's LSO reaches the bound (Kafka's rule)."""
        found: list[AbortedTxn] = []
        for segment in list(self._segments)[self._segment_index(start_offset) :]:
            result = segment.collect_aborted(start_offset, upper_bound_offset)
            found.extend(result.aborted)
            if result.is_complete:
                break
        return found

    def settled_dir_stamp(self) -> tuple[int, int] | None:
        """The dir's (inode, mtime) now if that mtime is settled (see `_dir_stamp`): a
        later entry change will move it."""
        return _dir_stamp(self.dir_name)[1]

    def known_segments(self) -> list[KnownSegment]:
        """What is known of the segments without reading them again (those read so far;
        for `known_segments.py`), the last one saying whether a transaction is open at
        its end when that is known without reading."""
        known = [k for s in self._segments if (k := s.known()) is not None]
        if known and known[-1].base_offset == self._segments[-1].base_offset:
            known[-1] = known[-1]._replace(stable_end=self._stable_at_end())
        return known

    def prefetch(self) -> None:
        """Ask the kernel to start reading the closed segments whose metadata is not
        known yet, and the index files of those whose checks the open left
        (`LogSegment.prefetch`): what the next cycle reads."""
        unchecked = set(self.recovery_report.unchecked)
        for segment in self._segments[:-1]:
            segment.prefetch(indexes=segment.base_offset in unchecked)

    def take_known(self, known: Mapping[int, KnownSegment]) -> int:
        """Take `known` (read by another process since the open, `known_reader.py`) for
        each segment whose metadata is not known yet and whose `.log` is still the file
        described, as `open` takes a clean stop's; how many it took. The rest are read
        here when first needed. No lock: an entry is taken only for the very file
        (inode, size, mtime) this object saw, so what it says holds for those bytes."""
        rebuilt = self.recovery_report.rebuilt_offsets()
        return sum(s.unread and _seed_one(s, known, rebuilt) for s in self._segments)

    def check_unchecked(self, checked: Mapping[int, KnownSegment]) -> None:
        """Run the cheap check the open left (`check_later`) on each segment a reader did
        not check (`checked`: what readers that checked read, `known_reader.py`); damage
        it finds makes the partition `corrupt`, as the open's would, and otherwise the
        snapshots a crash left past the log end go, as the open's sound end removes them.
        Raises what the open would (an index that cannot be rebuilt); the checks stay
        left then."""
        if not self.recovery_report.unchecked:
            return
        with self._locked():
            check_unchecked(self._segments, self.recovery_report, checked)
            self._bring_the_recovery_point_to_the_log_end(read=True)
            strays, self._strays = self._strays, None
            if (
                strays is not None
                and self.corrupt is None
                and self._remove_snapshots_past_the_end(strays)
            ):
                self._listed_snapshots = None

    def _stable_at_end(self) -> bool:
        """Whether no transaction is open at the log end, as far as known without a read:
        the producer state walked to the end, or the clean stop's record still holding."""
        last = self._segments[-1]
        if self._producers is not None:
            scanned = self._txn_scanned == (last.base_offset, last.size)
            return scanned and not self._producers.ongoing()
        return self._stable_end == (last.base_offset, last.identity)

    def meta(self) -> PartitionMeta:
        """The plain snapshot every pure decision takes, as the files are now: the last
        one when two `stat`s show that nothing changed since (`_View`), else read anew
        under the partition lock (the dir re-read first)."""
        view = self._view
        if view is not None and view.holds(self):
            return view.meta
        with self._locked():
            self.refresh()
            segments = tuple(s.meta() for s in self._segments)
            misplaced = _misplaced(segments)
            if misplaced is not None:
                raise self._misplaced_error(*misplaced)
            first_unstable = self.first_unstable_offset
            meta = self._partition_meta(segments, first_unstable)
            self._view = _View.of(self, meta)
        return meta

    def _misplaced_error(self, i: int, reason: str) -> CorruptRecordError:
        """The damage `_misplaced` found in segment `i`, at the position of the batch
        it is in (or of damage before it): a walk of the segment, which only damage
        costs."""
        segment = self._segments[i]
        upper = self._segments[i + 1].base_offset if i + 1 < len(self._segments) else None
        with segment.open_buffer() as buf:
            scan = walk_prefix(buf, offsets=OffsetRange.of_segment(segment.base_offset, upper))
        if scan.error is not None:
            return scan.error.located(segment.log_path)
        return CorruptRecordError(reason, path=segment.log_path)

    def readable_meta(self) -> PartitionMeta:
        """`meta`, or, when a segment's batches cannot be read, the snapshot as far as it
        can be: each such segment stands as `SegmentMeta.damaged`, the log end offset is
        the active segment's base when that one is damaged, and the first unstable offset
        is None when the producer state cannot be walked past the damage (a segment
        whose head and tail read well but which that walk finds damaged is one too;
        damage the walk meets in no segment raises). Only retention and disk usage
        take it: they stop before the first damaged segment, so one bad batch does not
        keep the expired segments older than it, nor fail a device's disk-usage step."""
        try:
            return self._with_open_damage(self.meta())
        except DAMAGE:
            pass  # anything else (a race, a held lock, an OS error) fails as `meta` does
        with self._locked():
            self.refresh()
            segments = tuple(_readable(s) for s in self._segments)
            while (misplaced := _misplaced(segments)) is not None:
                i = misplaced[0]
                segments = self._stand_in(segments, i, str(self._misplaced_error(*misplaced)))
            try:
                first_unstable = self.first_unstable_offset
            except DAMAGE as exc:
                # The producer walk reads every batch: damage inside a segment whose
                # head and tail read well stops it there. The segment it names is
                # damaged; damage that names none fails the partition as `meta` does.
                named = self._named(exc.path)
                if named is None and all(s.damage is None for s in segments):
                    raise
                if named is not None:
                    segments = self._stand_in(segments, named, str(exc))
                first_unstable = None
            active = segments[-1]
            end = active.base_offset if active.damage is not None else None
            return self._with_open_damage(
                self._partition_meta(segments, first_unstable, log_end_offset=end)
            )

    def _with_open_damage(self, meta: PartitionMeta) -> PartitionMeta:
        """`meta` with the segment the open found damaged (inside, where a snapshot does
        not read) standing in as damaged too, so that retention stops before it as
        before any damage. (Retention deleted it, and every segment after it.)"""
        damaged = self._damaged_base()
        at = next((i for i, s in enumerate(meta.segments) if s.base_offset == damaged), None)
        if at is None or meta.segments[at].damage is not None:
            return meta
        segments = self._stand_in(meta.segments, at, str(self.corrupt))
        end = segments[-1].base_offset if at == len(segments) - 1 else meta.log_end_offset
        return dataclasses.replace(meta, segments=segments, log_end_offset=end)

    def stable_view(self) -> tuple[tuple[LogSegment, ...], int]:
        """The segments as the files are now and the last stable offset, read as `meta`
        reads them but without every segment's metadata (which costs a read of each small
        segment): what a reader of the records below the stable offset needs."""
        with self._locked():
            self.refresh()
            stable = last_stable_offset(
                self.high_watermark,
                self.log_start_offset,
                self.log_end_offset,
                self.first_unstable_offset,
            )
            return tuple(self._segments), stable

    def _partition_meta(
        self,
        segments: tuple[SegmentMeta, ...],
        first_unstable: int | None,
        *,
        log_end_offset: int | None = None,
    ) -> PartitionMeta:
        tp = self.topic_partition
        if not segments:  # only read-only: the owner's open creates the first segment
            raise NoSegmentYet
        return PartitionMeta(
            topic=tp.topic,
            partition=tp.partition,
            log_dir=str(self.log_dir),
            segments=segments,
            log_start_offset=self.log_start_offset,
            log_end_offset=self.log_end_offset if log_end_offset is None else log_end_offset,
            high_watermark=self.high_watermark,
            first_unstable_offset=first_unstable,
            is_metadata=self.is_metadata,
        )

    # -- durability, swaps and deletions ------------------------------------------------------

    def flush(self) -> None:
        """fsync the segments above the recovery point and the dir; everything appended
        so far is durable, so the recovery point moves to the log end offset."""
        with self._locked():
            self._flush_closed()
            self.active_segment.flush()
            fsync_dir(self.dir)
            self.recovery_point = self.log_end_offset

    def flush_rolled(self) -> None:
        """fsync the closed segments above the recovery point and move it to the active
        segment's base: the flush Kafka schedules after a roll, which the maintenance
        cycle runs at its end. A roll fsyncs only the segment it closes, so after an
        open of a crashed dir the segments above its recovery point are fsynced here,
        once, when the cycle is done with them; those a clean replaced in the meantime
        (written and fsynced by the swap) are not written twice. Until then the
        recovery point stays where the open found it."""
        if self.recovery_point >= self.active_segment.base_offset:
            return  # nothing rolled above it: no lock taken (a cycle asks every partition)
        with self._locked():
            if self.recovery_point >= self.active_segment.base_offset:
                return
            self._flush_closed()
            self.recovery_point = self.active_segment.base_offset

    def _flush_closed(self) -> None:
        """fsync every closed segment holding offsets at or above the recovery point,
        before the recovery point moves past it (a flush, the flush after a roll, a
        clean stop). cleanerd fsyncs a segment when it rolls it, so there is none unless
        the dir was opened after a crash: the segments a broker closed above its
        recovery point may never have been fsynced (Kafka's flush covers [recovery
        point, end) the same way)."""
        for segment, following in pairwise(self._segments):
            if following.base_offset > self.recovery_point:
                segment.flush()

    def prepare_clean_shutdown(self, *, snapshot: bool = True) -> None:
        """What a clean stop leaves behind (Kafka's LogManager.shutdown): everything
        appended is durable, so the recovery point is the log end offset, and (with
        `snapshot`) a producer snapshot is there at that offset."""
        # An error names the partition's dir: an fsync's error names no file.
        with self._write_lock(), file_step("preparing the partition for a clean stop", self.dir):
            unflushed = self.unflushed
            if unflushed:
                self._flush_closed()
                self.active_segment.flush()
            written = self._take_snapshot_locked() if snapshot else None
            if unflushed:
                # A snapshot's rename synced the dir, the flushed files' names with it.
                if written is None:
                    fsync_dir(self.dir)
                self.recovery_point = self.log_end_offset

    def delete_segments(self, segments: Sequence[LogSegment], *, reason: str) -> list[Path]:
        """Remove `segments` (never the active one) from the log, as retention does: their
        files are renamed to `.deleted` (durably) and the log start offset moves up to the
        first remaining segment. Returns the `.deleted` files, which the caller unlinks
        after `file.delete.delay.ms`, or at once under disk pressure. Raises
        SegmentsChanged, deleting nothing, when one of `segments` is no longer the file
        at its base (a swap replaced it since it was chosen)."""
        with self._write_lock(writes_active=False):
            active_base = self.active_segment.base_offset
            if any(s.base_offset == active_base for s in segments):
                raise ValueError(f"the active segment of {self.dir} cannot be deleted")
            current = {s.base_offset: s for s in self._segments}
            for s in segments:
                now = current.get(s.base_offset)
                if now is None or now.inode != s.inode:
                    raise SegmentsChanged(
                        f"{s.log_path} was replaced or removed since it was chosen for deletion"
                    )
            bases = {s.base_offset for s in segments}
            doomed = [s for s in self._segments if s.base_offset in bases]
            snapshots: list[Path] = []
            for segment in doomed:
                # Its producer snapshot (the state at its base) goes with it, as Kafka's
                # deleteProducerSnapshots does; the segment's rename fsyncs the dir.
                snapshot = snapshot_path(self.dir, segment.base_offset)
                if snapshot.exists():
                    snapshots.append(snapshot.with_name(snapshot.name + DELETED_FILE_SUFFIX))
                    snapshot.replace(snapshots[-1])
                segment.change_suffix(DELETED_FILE_SUFFIX)
                log.info(
                    "segment.deleted",
                    topic=self.topic_partition.topic,
                    partition=self.topic_partition.partition,
                    log_dir=str(self.log_dir),
                    path=str(segment.log_path),
                    base_offset=segment.base_offset,
                    size_bytes=segment.size,
                    reason=reason,
                )
            self._segments = [s for s in self._segments if s.base_offset not in bases]
            self._inodes = self._scan_dir()
            self._listed_snapshots = None
            self._log_start_offset = max(self._log_start_offset, self._segments[0].base_offset)
        return [p for s in doomed for p in s.paths if p.exists()] + snapshots


class _View(NamedTuple):
    """A `PartitionMeta` and what vouches that it still describes the files without the
    partition lock or a re-read: the dir's settled stamp from the listing it was built
    from (an entry created, renamed or removed since moves the dir's mtime, see
    `_scan_dir`), the active `.log`'s identity (an append moves its size and mtime), and
    this object's own state it was built from. A cycle asks each partition for its
    metadata in every step; on 10,000 partitions the re-reads under the lock were a
    second of a start.

    What a writer in the middle of a change leaves is seen either as a change (then
    the caller waits for the lock and reads anew) or not at all (then the view is the
    state before the change began, which it was)."""

    meta: PartitionMeta
    dir_stamp: tuple[int, int]
    active_identity: tuple[int, int, int]
    segments: list[LogSegment]
    state: tuple[int, int, int | None]

    @classmethod
    def of(cls, plog: PartitionLog, meta: PartitionMeta) -> _View | None:
        """The view of `meta`, just read under the lock; None when the dir changed too
        recently for its stamp to vouch for anything."""
        if plog._dir_stamp is None or not plog._segments:
            return None
        identity = plog._segments[-1].identity
        return cls(meta, plog._dir_stamp, identity, plog._segments, _own_state(plog))

    def holds(self, plog: PartitionLog) -> bool:
        """Whether the files and `plog` are still as `meta` describes them."""
        if plog._segments is not self.segments or _own_state(plog) != self.state:
            return False
        try:
            if _dir_stamp(plog.dir_name)[1] != self.dir_stamp:
                return False
            return self.segments[-1].stat_identity() == self.active_identity
        except OSError:
            return False


def _misplaced(segments: Sequence[SegmentMeta]) -> tuple[int, str] | None:
    """The first readable segment whose end is out of its place, and why: its last
    offset is outside the segment's `OffsetRange` (it reaches the next segment's base
    offset, or, the active one, is more than 2^31 - 1 past its own). Either is a damaged
    base offset (no CRC covers one) in its last batch, which the metadata, read from the
    segment's tail, takes as its end. None when there is none."""
    for i, seg in enumerate(segments):
        if seg.damage is not None or seg.next_offset == seg.base_offset:
            continue
        upper = segments[i + 1].base_offset if i + 1 < len(segments) else None
        offsets = OffsetRange.of_segment(seg.base_offset, upper)
        why = offsets.refusal(seg.next_offset - 1, 0, v2=True)
        if why is not None:
            return i, why
    return None


def _readable(segment: LogSegment) -> SegmentMeta:
    """The segment's snapshot, or its damaged stand-in when its batches are damaged."""
    try:
        return segment.meta()
    except DAMAGE as exc:
        return segment.damaged_meta(str(exc))


def _seed_one(segment: LogSegment, known: Mapping[int, KnownSegment], rebuilt: set[int]) -> bool:
    entry = known.get(segment.base_offset)
    return entry is not None and segment.base_offset not in rebuilt and segment.seed(entry)


def _seed(
    segments: list[LogSegment], known: Mapping[int, KnownSegment], report: RecoveryReport
) -> tuple[int, tuple[int, int, int]] | None:
    """Seed `segments` from `known` (see `LogSegment.seed`); the last segment's (base
    offset, identity) when its entry says no transaction was open at its end."""
    rebuilt = report.rebuilt_offsets()
    for segment in segments:
        seeded = _seed_one(segment, known, rebuilt)
        if seeded and segment is segments[-1] and known[segment.base_offset].stable_end:
            return (segment.base_offset, segment.identity)
    return None


def _own_state(plog: PartitionLog) -> tuple[int, int, int | None]:
    return (len(plog._segments), plog._log_start_offset, plog.high_watermark)


def _dir_stamp(path: Path | str) -> tuple[os.stat_result, tuple[int, int] | None]:
    """The dir's `lstat`, and its (inode, mtime) if that mtime is settled: old enough that
    any later entry change gives the dir another one (`PartitionLog._scan_dir`). Taken
    before a listing, it vouches for that listing until it changes."""
    started = time.time_ns()
    st = os.lstat(path)
    settled = st.st_mtime_ns < started - _SETTLED_NS
    return st, (st.st_ino, st.st_mtime_ns) if settled else None


@contextmanager
def _ownership(log_dir: Path, recover: bool | None) -> Iterator[bool]:
    """Whether to recover: as told, or (None) if this process owns the log dir's `.lock`
    or can hold it while recovering."""
    if recover is not None or holds_log_dir_lock(log_dir):
        yield recover is not False
        return
    dir_lock = LogDirLock(log_dir)
    try:
        dir_lock.acquire()
    except LogDirLockedError:
        yield False
        return
    try:
        yield True
    finally:
        dir_lock.release()


def _at_start(info: BatchInfo) -> BatchInfo:
    """`info` moved to position 0 (of a buffer holding just this batch)."""
    header = None if info.header is None else dataclasses.replace(info.header, position=0)
    return dataclasses.replace(info, position=0, header=header)
