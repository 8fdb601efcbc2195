"""Plain snapshots of a partition's segments: the input of every pure decision.

The log layer reads a partition dir once and produces a `PartitionMeta`; roll, retention,
disk-usage and cleanable-range decisions then run over it without touching files or
clocks. The snapshot holds only what Kafka's decisions read:

- per segment (`<20-digit base>.log` with its `.index` and `.timeindex`): base offset,
  the offset after its last batch, its `.log` size, Kafka's `largestTimestamp` (max
  record timestamp, or the `.log` mtime when the segment holds no timestamp), the first
  batch's maxTimestamp (KIP-354's rolling and max-lag clock), index sizes, mtime and
  the `.log` file's inode (which file was seen);
- per partition: the log start offset (max of `log-start-offset-checkpoint` and the
  first base), the log end offset, the high watermark from
  `replication-offset-checkpoint` when the dir has one, and the first offset of the
  earliest open transaction.

Segments are ascending by base offset and the last is the active segment, so a
snapshot always holds at least one segment, as a Kafka log always does.

A segment whose batches cannot be read (a bad CRC where its head or end is read, an
unreadable file) is known only by its file: `SegmentMeta.damaged` stands in for it, with
its damage named. Only retention and disk usage take such a snapshot
(`PartitionLog.readable_meta`): they stop before a damaged segment, so the healthy
segments older than it still go on time, and nothing is deleted because it is damaged.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

from cleanerd.log.files import TopicPartition

METADATA_TOPIC = "__cluster_metadata"


def bounded_high_watermark(
    high_watermark: int | None, log_start_offset: int, log_end_offset: int
) -> int:
    """The high watermark as Kafka's log holds it (`updateHighWatermark`): never below
    the log start offset nor past the log end offset (a checkpoint left stale by a
    DeleteRecords or a truncation says otherwise); the log end offset when none is
    known (see `PartitionMeta.high_watermark_or_end`)."""
    if high_watermark is None:
        return log_end_offset
    return min(max(high_watermark, log_start_offset), log_end_offset)


def last_stable_offset(
    high_watermark: int | None,
    log_start_offset: int,
    log_end_offset: int,
    first_unstable_offset: int | None,
) -> int:
    """min(high watermark, first unstable offset), the high watermark bounded as
    `bounded_high_watermark` bounds it."""
    hw = bounded_high_watermark(high_watermark, log_start_offset, log_end_offset)
    return hw if first_unstable_offset is None else min(hw, first_unstable_offset)


def _base_offset(segment: SegmentMeta) -> int:
    return segment.base_offset


@dataclass(frozen=True, slots=True)
class SegmentMeta:
    """One segment as the decisions see it (Kafka's LogSegment, minus its files)."""

    base_offset: int
    next_offset: int
    """Offset after the last batch; equals `base_offset` when the segment is empty."""
    size_bytes: int
    largest_timestamp_ms: int
    """Max record timestamp, or the `.log` mtime when there is none (largestTimestamp)."""
    first_batch_timestamp_ms: int | None
    """maxTimestamp of the first batch; None when the segment holds no batch."""
    offset_index_bytes: int
    time_index_bytes: int
    last_modified_ms: int
    inode: int | None = None
    """The `.log` file's inode number when read from disk: with the size, which file the
    snapshot saw (a cleaned or recovered segment is a new file at the same name)."""
    damage: str | None = None
    """Why the segment's batches could not be read (the error, naming the file and
    position), or None. A damaged segment's offsets and record timestamps are unknown:
    its next offset is its base offset, its largest timestamp the `.log` mtime (Kafka's
    stand-in for a segment without timestamps), and no decision deletes it."""

    @classmethod
    def damaged(
        cls,
        base_offset: int,
        damage: str,
        *,
        size_bytes: int,
        index_bytes: tuple[int, int],
        last_modified_ms: int,
        inode: int | None,
    ) -> SegmentMeta:
        """A segment known only by its files, for the `damage` its read met."""
        return cls(
            base_offset=base_offset,
            next_offset=base_offset,
            size_bytes=size_bytes,
            largest_timestamp_ms=last_modified_ms,
            first_batch_timestamp_ms=None,
            offset_index_bytes=index_bytes[0],
            time_index_bytes=index_bytes[1],
            last_modified_ms=last_modified_ms,
            inode=inode,
            damage=damage,
        )

    def __post_init__(self) -> None:
        if self.next_offset < self.base_offset:
            raise ValueError(
                f"segment {self.base_offset}: next offset {self.next_offset} "
                "is below its base offset"
            )
        if self.size_bytes < 0:
            raise ValueError(f"segment {self.base_offset}: negative size {self.size_bytes}")

    @property
    def is_empty(self) -> bool:
        """True when the `.log` file holds no bytes."""
        return self.size_bytes == 0

    @property
    def total_bytes(self) -> int:
        """Bytes on disk for the segment and its two indexes (what deleting it frees)."""
        return self.size_bytes + self.offset_index_bytes + self.time_index_bytes


@dataclass(frozen=True, slots=True)
class PartitionMeta:
    """A partition's segments and offsets at one instant (Kafka's UnifiedLog, read only)."""

    topic: str
    partition: int
    log_dir: str
    segments: tuple[SegmentMeta, ...]
    """Ascending by base offset; the last one is the active segment."""
    log_start_offset: int
    log_end_offset: int
    high_watermark: int | None
    """From `replication-offset-checkpoint`; None when the dir has no entry (no replication)."""
    first_unstable_offset: int | None
    """First offset of the earliest open transaction; None when none is open."""
    is_metadata: bool = False
    """`__cluster_metadata`: never rolled, cleaned or deleted by cleanerd."""

    def __post_init__(self) -> None:
        if not self.segments:
            raise ValueError(f"{self.topic_partition}: a partition has at least one segment")
        bases = [s.base_offset for s in self.segments]
        for prev, cur in itertools.pairwise(bases):
            if cur <= prev:
                raise ValueError(
                    f"{self.topic_partition}: segment base offsets not ascending ({prev}, {cur})"
                )

    @property
    def topic_partition(self) -> TopicPartition:
        """The partition's identity; `str()` of it is the partition dir's name."""
        return TopicPartition(self.topic, self.partition)

    @property
    def active(self) -> SegmentMeta:
        """The last segment, the only one appended to."""
        return self.segments[-1]

    @property
    def inactive(self) -> tuple[SegmentMeta, ...]:
        """Every segment but the active one, oldest first."""
        return self.segments[:-1]

    @property
    def size_bytes(self) -> int:
        """Sum of `.log` sizes (Kafka's UnifiedLog.size, what retention.bytes compares)."""
        return sum(s.size_bytes for s in self.segments)

    @property
    def damage(self) -> str | None:
        """The first damaged segment's damage (`SegmentMeta.damage`), or None. A snapshot
        with damage is one of `PartitionLog.readable_meta`: its log end offset and first
        unstable offset are only as far as they could be read, so only retention and
        disk usage, which stop before the damage, take it."""
        return next((s.damage for s in self.segments if s.damage is not None), None)

    @property
    def never_touched(self) -> bool:
        """True for the KRaft metadata log, which cleanerd only reads."""
        return self.is_metadata or self.topic == METADATA_TOPIC

    @property
    def high_watermark_or_end(self) -> int:
        """The high watermark, or the log end offset when none is known.

        A dir without a replication checkpoint belongs to an unreplicated writer (cleanerd's
        own producer), for which everything appended is committed.
        """
        return bounded_high_watermark(
            self.high_watermark, self.log_start_offset, self.log_end_offset
        )

    @property
    def last_stable_offset(self) -> int:
        """min(high watermark, first unstable offset): nothing at or above it is cleaned."""
        return last_stable_offset(
            self.high_watermark,
            self.log_start_offset,
            self.log_end_offset,
            self.first_unstable_offset,
        )

    def upper_bound(self, index: int) -> int:
        """Offset bound of segment `index`: the next segment's base, or the log end offset.

        Kafka bounds a segment by its successor's base rather than its own last offset, so
        gaps left by compaction belong to the segment before them.
        """
        if index + 1 < len(self.segments):
            return self.segments[index + 1].base_offset
        return self.log_end_offset

    def segment_index_for(self, offset: int) -> int:
        """Index of the segment holding `offset` (floor by base offset; 0 when below all)."""
        found = bisect.bisect_right(self.segments, offset, key=_base_offset)
        return max(found - 1, 0)
