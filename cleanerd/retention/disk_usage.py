"""KIP-61 disk-usage retention: free a device by deleting its globally oldest segments.

KIP-61 proposed `log.retention.disk.usage.percent` (never shipped by Kafka): after normal
retention, while a disk is above the percentage, delete the oldest segments across all
topics on it. For each device above its threshold, cleanerd plans:

- candidates are the partitions on that device (every log dir whose `st_dev` it is), of
  every cleanup policy, except `__cluster_metadata` and protected topics;
- each partition offers only its *first remaining* segment, so its segments go oldest
  first and the log start offset only moves forward; a segment is offered only if it is
  not the active segment, the high watermark covers it (HW >= next segment's base) and
  it is not damaged (`SegmentMeta.damage`: a partition offers nothing from its first
  damaged segment on, as retention stops there);
- the globally oldest offer goes first: by largest timestamp, then base offset, then
  topic-partition and log dir for a stable order. A largest timestamp in the future
  (clock skew, bad producer clocks) would make a segment look newest forever, so for
  ordering it falls back to the `.log` mtime, as Redpanda ignores future timestamps;
- each deletion frees the blocks of the segment's `.log` and indexes: each file's size
  rounded up to the device's block size (`freed_bytes`), as a file system allocates
  them, so a device of tiny segments (quiet topics) is not planned a hundred times too
  many deletions; planning stops as soon as the projected usage is at or below the
  target. A device that stays above it (nothing left to delete) is reported, so the
  caller can raise `disk.pressure`.

Overage and hysteresis: deletion starts when usage is above the threshold and, by
default, stops as soon as usage is at or below it. Every segment deleted is data lost
beyond what retention asked for, so cleanerd does not reclaim a multiple of the overage
as Redpanda does (twice the overage). Flapping is bounded instead by whole-segment granularity (each
round frees up to a segment more than needed) and by the check interval. An operator who
wants headroom sets `hysteresis_percent`: once triggered, deletion continues down to
`threshold - hysteresis_percent`.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Iterable, Set
from dataclasses import dataclass

from cleanerd.log.files import TopicPartition
from cleanerd.log.meta import PartitionMeta, SegmentMeta
from cleanerd.retention.policy import DeletionReason


def device_name(dev: int) -> str:
    """`MAJOR:MINOR`, as /proc/self/mountinfo and lsblk show a device number (and the
    metrics label it)."""
    return f"{os.major(dev)}:{os.minor(dev)}"


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    """One block device (`st_dev`) and its filesystem usage."""

    device: int
    total_bytes: int
    used_bytes: int
    threshold_percent: float
    """`log.retention.disk.usage.percent`; 100 or more turns the rule off."""
    block_bytes: int = 1
    """The file system's allocation unit (`statvfs` `f_frsize`): a file of n bytes
    takes n rounded up to it."""

    def limit_bytes(self, percent: float) -> int:
        """The used bytes that `percent` of the device allows."""
        return int(self.total_bytes * percent / 100)


@dataclass(frozen=True, slots=True)
class PartitionOnDevice:
    """A partition snapshot and the device its log dir lives on."""

    device: int
    meta: PartitionMeta


@dataclass(frozen=True, slots=True)
class DiskDeletion:
    """Delete one segment to free its device."""

    topic_partition: TopicPartition
    log_dir: str
    base_offset: int
    size_bytes: int
    """The `.log` file's size."""
    freed_bytes: int
    """`.log` plus index blocks: what the deletion gives back to the device
    (`freed_bytes`)."""
    device: int
    log_start_offset: int
    """The partition's log start offset once this segment is gone."""
    reason: DeletionReason = DeletionReason.DISK_USAGE


@dataclass(frozen=True, slots=True)
class DeviceOutcome:
    """A device's usage before and after the planned deletions."""

    device: int
    used_bytes_before: int
    used_bytes_after: int
    target_bytes: int
    """Deletion stops at or below this many used bytes."""
    limit_bytes: int
    """The threshold: above this many used bytes deletion starts."""

    @property
    def above_threshold(self) -> bool:
        """Still above the threshold after every deletion the plan could make."""
        return self.used_bytes_after > self.limit_bytes


@dataclass(frozen=True, slots=True)
class DiskUsagePlan:
    """The deletions, in order, and the projected usage of each device that needed them."""

    deletions: tuple[DiskDeletion, ...]
    devices: tuple[DeviceOutcome, ...]

    @property
    def still_above(self) -> tuple[int, ...]:
        """Devices that stay above their threshold: nothing deletable is left on them."""
        return tuple(d.device for d in self.devices if d.above_threshold)


@dataclass(slots=True)
class _Cursor:
    """A partition's next deletable segment."""

    meta: PartitionMeta
    index: int = 0

    def offer(self) -> SegmentMeta | None:
        if self.index >= len(self.meta.segments) - 1:
            return None  # only the active segment is left
        if self.meta.high_watermark_or_end < self.meta.upper_bound(self.index):
            return None
        seg = self.meta.segments[self.index]
        return None if seg.damage is not None else seg


_HeapEntry = tuple[int, int, TopicPartition, str, int]


def freed_bytes(seg: SegmentMeta, block_bytes: int) -> int:
    """What deleting `seg` gives back to a device allocating `block_bytes` at a time:
    its `.log` and index sizes, each rounded up to a whole block (an empty file takes
    none)."""
    files = (seg.size_bytes, seg.offset_index_bytes, seg.time_index_bytes)
    return sum(-(-size // block_bytes) * block_bytes for size in files)


def _age_ms(seg: SegmentMeta, now_ms: int) -> int:
    if seg.largest_timestamp_ms > now_ms:
        return seg.last_modified_ms
    return seg.largest_timestamp_ms


def _push(heap: list[_HeapEntry], cursors: list[_Cursor], i: int, now_ms: int) -> None:
    cursor = cursors[i]
    seg = cursor.offer()
    if seg is not None:
        meta = cursor.meta
        key = (_age_ms(seg, now_ms), seg.base_offset, meta.topic_partition, meta.log_dir, i)
        heapq.heappush(heap, key)


def _plan_device(
    usage: DeviceUsage,
    partitions: list[PartitionMeta],
    *,
    now_ms: int,
    hysteresis_percent: float,
) -> tuple[list[DiskDeletion], DeviceOutcome]:
    limit = usage.limit_bytes(usage.threshold_percent)
    target = usage.limit_bytes(max(usage.threshold_percent - hysteresis_percent, 0.0))
    cursors = [_Cursor(meta) for meta in partitions]
    heap: list[_HeapEntry] = []
    for i in range(len(cursors)):
        _push(heap, cursors, i, now_ms)
    used = usage.used_bytes
    deletions: list[DiskDeletion] = []
    while used > target and heap:
        i = heapq.heappop(heap)[-1]
        cursor = cursors[i]
        seg = cursor.meta.segments[cursor.index]
        cursor.index += 1
        meta = cursor.meta
        freed = freed_bytes(seg, usage.block_bytes)
        deletions.append(
            DiskDeletion(
                topic_partition=meta.topic_partition,
                log_dir=meta.log_dir,
                base_offset=seg.base_offset,
                size_bytes=seg.size_bytes,
                freed_bytes=freed,
                device=usage.device,
                log_start_offset=max(
                    meta.log_start_offset, meta.segments[cursor.index].base_offset
                ),
            )
        )
        used -= freed
        _push(heap, cursors, i, now_ms)
    return deletions, DeviceOutcome(usage.device, usage.used_bytes, used, target, limit)


def plan_disk_usage_deletions(
    devices: Iterable[DeviceUsage],
    partitions: Iterable[PartitionOnDevice],
    *,
    protected_topics: Set[str],
    now_ms: int,
    hysteresis_percent: float = 0.0,
) -> DiskUsagePlan:
    """The segments to delete so that every device is back at or below its threshold."""
    by_device: dict[int, list[PartitionMeta]] = {}
    for p in partitions:
        if p.meta.never_touched or p.meta.topic in protected_topics:
            continue
        by_device.setdefault(p.device, []).append(p.meta)
    deletions: list[DiskDeletion] = []
    outcomes: list[DeviceOutcome] = []
    for usage in devices:
        if usage.threshold_percent >= 100 or usage.total_bytes <= 0:
            continue
        if usage.used_bytes <= usage.limit_bytes(usage.threshold_percent):
            continue
        planned, outcome = _plan_device(
            usage,
            by_device.get(usage.device, []),
            now_ms=now_ms,
            hysteresis_percent=hysteresis_percent,
        )
        deletions.extend(planned)
        outcomes.append(outcome)
    return DiskUsagePlan(tuple(deletions), tuple(outcomes))
