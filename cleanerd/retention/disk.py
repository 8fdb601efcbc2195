"""KIP-61 disk-usage retention on real devices: measure, plan, delete, measure again.

`disk_usage.py` plans which segments to delete; this module feeds it and carries it out.

Devices. A log dir's device is `os.stat(log_dir).st_dev`; several log dirs on one device
form one device, whose partitions compete together for the oldest-first order. Usage
comes from `psutil.disk_usage` (statvfs): used bytes, and as capacity `used + free`,
the space an unprivileged writer can fill (blocks reserved for root excluded), so the
percentage is the one `df` shows.

Order of one enforcement (owner-mode log dirs only, `log.retention.disk.usage.percent`
below 100), for every device above its threshold:

1. unlink the `.deleted` files waiting on that device in the process's one
   pending-deletion queue (`PendingDeletions.unlink_on_device`: data that retention or
   compaction removed and that only waits for `file.delete.delay.ms`): freeing them
   loses nothing, so it comes before deleting live segments. The queue skips files
   that are gone;
2. re-measure; plan with fresh snapshots (`plan_disk_usage_deletions`: the globally
   oldest non-active, high-watermark-covered segment first, across every policy,
   never `__cluster_metadata` nor a protected topic);
3. delete in plan order, each segment under its partition lock
   (`PartitionLog.delete_segments`: files renamed `.deleted`, dir fsynced, log start
   offset moved), then unlink its files at once (`fsutil.safe_unlink`, which frees
   space even on a full btrfs/ZFS) so the space really comes free. After each deletion
   the device is measured again, and deletion stops as soon as usage is at or below
   the target (the threshold, minus the optional hysteresis);
4. write `log-start-offset-checkpoint` for the partitions touched;
5. if the plan ran out while the device is still above (a producer kept writing, or
   blocks were freed more slowly than planned), plan again, up to `max_rounds`.

A device that stays above its threshold with nothing left to delete is logged as
`disk.pressure`. Every deletion is logged with its reason (`disk.usage`), device and
usage. `dry_run` measures and plans only, and reports what would be deleted with the
usage projected from the segment sizes; nothing is touched.

Crash consistency is that of `delete_segments`: a segment's files are renamed
`.deleted` durably before they are unlinked, and the log start offset is read back as
max(checkpoint, first segment base), so a crash anywhere leaves either the segment (to
be deleted again by the next check) or its leftover `.deleted` files (removed by
startup recovery), never a log with a hole.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cleanerd.errors import CleanerdError
from cleanerd.log.deletions import PendingDeletions
from cleanerd.log.files import TopicPartition
from cleanerd.log.fsutil import safe_unlink
from cleanerd.log.log_dir import LogDir, Mode
from cleanerd.log.partition_log import PartitionLog
from cleanerd.logger import get_logger
from cleanerd.retention.disk_usage import (
    DeviceUsage,
    DiskDeletion,
    DiskUsagePlan,
    PartitionOnDevice,
    device_name,
    plan_disk_usage_deletions,
)
from cleanerd.retention.policy import DeletionReason

log = get_logger(__name__)

DEFAULT_MAX_ROUNDS: Final = 8


@dataclass(frozen=True, slots=True)
class DiskSpace:
    """A file system's capacity (used + free for unprivileged writers) and used bytes."""

    total_bytes: int
    used_bytes: int
    block_bytes: int = 1
    """The allocation unit (`statvfs` `f_frsize`)."""


UsageProbe = Callable[[Path], DiskSpace]


def psutil_space(path: Path) -> DiskSpace:
    """Usage of the file system holding `path`, as `df` reports it."""
    import psutil  # here: a command that never measures a device spares its import

    usage = psutil.disk_usage(str(path))
    return DiskSpace(usage.used + usage.free, usage.used, os.statvfs(path).f_frsize)


def device_of(path: Path) -> int:
    """The device (`st_dev`) a log dir lives on."""
    return path.stat().st_dev


@dataclass(frozen=True, slots=True)
class Device:
    """One device and the log dirs on it (sorted)."""

    device: int
    log_dirs: tuple[Path, ...]


def group_devices(log_dirs: Iterable[Path]) -> tuple[Device, ...]:
    """The devices of `log_dirs`, each with its dirs; ordered by device number. A dir
    that cannot be looked at (gone, its disk unmounted) is on no device: the cycle finds
    it offline; one mounted again is on its new device at the next call."""
    by_device: dict[int, list[Path]] = {}
    for path in log_dirs:
        try:
            device = device_of(path)
        except OSError:
            continue
        by_device.setdefault(device, []).append(path)
    return tuple(Device(dev, tuple(sorted(dirs))) for dev, dirs in sorted(by_device.items()))


def measure(
    devices: Iterable[Device], percent: float, probe: UsageProbe = psutil_space
) -> tuple[DeviceUsage, ...]:
    """Each device's usage, with `percent` as its threshold."""
    out = []
    for dev in devices:
        space = probe(dev.log_dirs[0])
        out.append(
            DeviceUsage(dev.device, space.total_bytes, space.used_bytes, percent, space.block_bytes)
        )
    return tuple(out)


def is_above(usage: DeviceUsage) -> bool:
    """Whether `usage` is above its threshold (a threshold of 100 is off)."""
    return usage.threshold_percent < 100 and usage.used_bytes > usage.limit_bytes(
        usage.threshold_percent
    )


@dataclass(frozen=True, slots=True)
class DiskUsageReport:
    """What one enforcement did (or, in dry-run mode, would do)."""

    dry_run: bool
    before: tuple[DeviceUsage, ...]
    """Usage of every device when the enforcement started."""
    after: tuple[DeviceUsage, ...]
    """Usage at the end (measured; projected from sizes in dry-run mode)."""
    deletions: tuple[DiskDeletion, ...]
    """Segments deleted (or that would be), in order."""
    freed_pending: tuple[Path, ...]
    """`.deleted` files unlinked before any live segment was deleted."""
    still_above: tuple[int, ...]
    """Devices left above their threshold: nothing deletable was left on them."""
    unreadable: tuple[tuple[str, TopicPartition, str], ...] = ()
    """(log dir, partition, error) of the partitions whose segments could not be read,
    which offered nothing (for the caller to log: it meets them every check)."""

    @property
    def freed_bytes(self) -> int:
        """Segment bytes (`.log` and indexes) the deletions gave back."""
        return sum(d.freed_bytes for d in self.deletions)

    @property
    def deleted(self) -> tuple[DiskDeletion, ...]:
        """The deletions done: none in a dry run, whose `deletions` only would be."""
        return () if self.dry_run else self.deletions

    def then(self, later: DiskUsageReport) -> DiskUsageReport:
        """This enforcement and a `later` one of the same cycle as one report: usage
        before this one and after the later one, the deletions of both (of a dry run,
        the later one's only: it projects from what is on disk, as this one did)."""
        return DiskUsageReport(
            dry_run=later.dry_run,
            before=self.before,
            after=later.after,
            deletions=later.deletions if later.dry_run else self.deletions + later.deletions,
            freed_pending=self.freed_pending + later.freed_pending,
            still_above=later.still_above,
            unreadable=later.unreadable,
        )


def _target_bytes(usage: DeviceUsage, hysteresis_percent: float) -> int:
    return usage.limit_bytes(max(usage.threshold_percent - hysteresis_percent, 0.0))


@dataclass(slots=True)
class _Enforcement:
    """State of one `enforce_disk_usage` call."""

    devices: tuple[Device, ...]
    logs: dict[tuple[str, TopicPartition], PartitionLog]
    dir_of: dict[str, LogDir]
    percent: float
    protected: frozenset[str]
    now_ms: int
    hysteresis_percent: float
    probe: UsageProbe
    unreadable: dict[tuple[str, TopicPartition], str] = dataclasses.field(default_factory=dict)

    def unreadable_partitions(self) -> tuple[tuple[str, TopicPartition, str], ...]:
        """`DiskUsageReport.unreadable`: what `partitions` could not read."""
        return tuple((d, tp, error) for (d, tp), error in self.unreadable.items())

    def device_of_dir(self) -> dict[str, int]:
        return {str(p): dev.device for dev in self.devices for p in dev.log_dirs}

    def measure(self) -> tuple[DeviceUsage, ...]:
        return measure(self.devices, self.percent, self.probe)

    def partitions(self, devices: set[int]) -> list[PartitionOnDevice]:
        where = self.device_of_dir()
        out = []
        for (log_dir, tp), plog in self.logs.items():
            device = where[log_dir]
            if device not in devices:
                continue
            try:
                meta = plog.readable_meta()
            except (CleanerdError, OSError) as exc:
                # The partition offers nothing this round; the others still free the device.
                self.unreadable[(log_dir, tp)] = str(exc)
                continue
            out.append(PartitionOnDevice(device, meta))
        return out

    def plan(self, over: Sequence[DeviceUsage]) -> DiskUsagePlan:
        return plan_disk_usage_deletions(
            over,
            self.partitions({u.device for u in over}),
            protected_topics=self.protected,
            now_ms=self.now_ms,
            hysteresis_percent=self.hysteresis_percent,
        )

    def delete(self, deletion: DiskDeletion) -> bool:
        """Delete one planned segment and unlink its files; False if it is gone."""
        plog = self.logs[(deletion.log_dir, deletion.topic_partition)]
        with plog.lock:
            plog.refresh()
            doomed = [s for s in plog.segments[:-1] if s.base_offset == deletion.base_offset]
            if not doomed:
                return False
            paths = plog.delete_segments(doomed, reason=DeletionReason.DISK_USAGE.value)
        for path in paths:
            try:
                safe_unlink(path)
            except FileNotFoundError:
                continue
        return True


def enforce_disk_usage(
    log_dirs: Sequence[LogDir],
    logs: Iterable[PartitionLog],
    *,
    percent: float,
    protects: Callable[[str], bool],
    now_ms: int,
    dry_run: bool = False,
    hysteresis_percent: float = 0.0,
    probe: UsageProbe = psutil_space,
    max_rounds: int = DEFAULT_MAX_ROUNDS,
    pending: PendingDeletions | None = None,
) -> DiskUsageReport:
    """Bring every device of the owned `log_dirs` back to `percent` used by deleting
    the globally oldest segments of `logs` (the open partitions of those dirs); see the
    module docstring. `protects(topic)` excludes a topic (`cfg.disk_usage.protects`).
    `pending` is the process's pending-deletion queue, whose files on a device above its
    threshold are unlinked first (None: no file is waiting)."""
    owned = [d for d in log_dirs if d.mode is Mode.OWNER]
    by_key = {(str(p.log_dir), p.topic_partition): p for p in logs}
    dir_of = {str(d.path): d for d in owned}
    run = _Enforcement(
        devices=group_devices(d.path for d in owned),
        logs={key: p for key, p in by_key.items() if key[0] in dir_of and not p.read_only},
        dir_of=dir_of,
        percent=percent,
        protected=frozenset(tp.topic for _d, tp in by_key if protects(tp.topic)),
        now_ms=now_ms,
        hysteresis_percent=hysteresis_percent,
        probe=probe,
    )
    before = run.measure()
    over = [u for u in before if is_above(u)]
    if not over:
        return DiskUsageReport(dry_run, before, before, (), (), ())
    if dry_run:
        return _dry_run(run, before, over)

    freed: list[Path] = []
    if pending is not None:
        for above in over:
            why = f"device {device_name(above.device)} is above its threshold"
            freed += pending.unlink_on_device(above.device, why)
    done: list[DiskDeletion] = []
    for _ in range(max_rounds):
        usage = run.measure()
        over = [u for u in usage if is_above(u)]
        if not over:
            break
        deleted = _execute(run, run.plan(over).deletions, over)
        if not deleted:
            break
        done += deleted
    after = run.measure()
    still = tuple(u.device for u in after if is_above(u))
    return DiskUsageReport(
        False, before, after, tuple(done), tuple(freed), still, run.unreadable_partitions()
    )


def _execute(
    run: _Enforcement, plan: Sequence[DiskDeletion], over: Sequence[DeviceUsage]
) -> list[DiskDeletion]:
    """Carry out `plan` in order, re-measuring after each deletion and skipping the rest
    of a device's deletions once it is at or below its target."""
    targets = {u.device: _target_bytes(u, run.hysteresis_percent) for u in over}
    devices = {dev.device: dev for dev in run.devices}
    done: list[DiskDeletion] = []
    satisfied: set[int] = set()
    touched: dict[str, list[PartitionLog]] = {}
    for deletion in plan:
        if deletion.device in satisfied:
            continue
        if not run.delete(deletion):
            continue
        done.append(deletion)
        plog = run.logs[(deletion.log_dir, deletion.topic_partition)]
        touched.setdefault(deletion.log_dir, []).append(plog)
        used = run.probe(devices[deletion.device].log_dirs[0]).used_bytes
        log.info(
            "disk_usage.segment_deleted",
            topic=deletion.topic_partition.topic,
            partition=deletion.topic_partition.partition,
            log_dir=deletion.log_dir,
            base_offset=deletion.base_offset,
            freed_bytes=deletion.freed_bytes,
            log_start_offset=plog.log_start_offset,
            device=device_name(deletion.device),
            used_bytes=used,
            target_bytes=targets[deletion.device],
            reason=deletion.reason.value,
        )
        if used <= targets[deletion.device]:
            satisfied.add(deletion.device)
    for log_dir, plogs in touched.items():
        run.dir_of[log_dir].checkpoint_logs(dict.fromkeys(plogs))
    return done


def _dry_run(
    run: _Enforcement, before: tuple[DeviceUsage, ...], over: Sequence[DeviceUsage]
) -> DiskUsageReport:
    planned = run.plan(over)
    projected = {o.device: o.used_bytes_after for o in planned.devices}
    after = tuple(
        dataclasses.replace(u, used_bytes=projected.get(u.device, u.used_bytes)) for u in before
    )
    return DiskUsageReport(
        True, before, after, planned.deletions, (), planned.still_above, run.unreadable_partitions()
    )
