"""Applies Kafka's retention (`policy.deletable_segments`) to a partition, crash-safely.

One call, for one partition of an owned log dir, under the partition lock:

1. snapshot the partition (`PartitionLog.readable_meta`: a segment whose batches cannot
   be read stands as damaged, and every pass stops before it) and plan with the topic's
   settings (`retention.ms`, `retention.bytes`, `cleanup.policy`; the start-offset pass
   runs for every policy, the other two only with `delete`);
2. remove the planned segments with `PartitionLog.delete_segments`, one call per
   reason, oldest first: each segment's files are renamed to `.deleted` and the dir
   fsynced, and the log start offset moves up to the first remaining segment;
3. when the plan would take the active segment too, roll it (Kafka rolls an empty
   segment when every segment would go), plan again over the new snapshot, so the old
   active segment is then an ordinary inactive one and the new empty one stays, and
   repeat step 2 for it. Kafka rolls before it deletes; the end state is the
   same, and deleting first frees a full disk whose lack of space fails the roll (its
   final index entries): the failure is then reported with the deletions done;
4. hand the `.deleted` files to the `PendingDeletions` queue, which unlinks them after
   `file.delete.delay.ms` (Kafka's delay, so readers that still have the old files open
   finish).

The caller then writes `log-start-offset-checkpoint` (and the recovery points) once per
log dir for every partition the step changed (`LogDir.checkpoint_logs`: tmp file, fsync,
rename, dir fsync), as Kafka writes it on a schedule rather than at each deletion: the
file holds every partition of the dir, and one write per changed partition made a
step over N partitions with expired segments cost N^2 (with its listing of the dir).

Crash consistency: the renames are durable before the checkpoint is written, and the
log start offset is read back as max(checkpoint, first segment base), which after a
deletion of whole segments is the start offset the checkpoint would hold (a start
offset above the first survivor's base was checkpointed before, and stays), so a crash
before the checkpoint loses nothing: on restart the first remaining segment gives the
same start offset, and startup recovery removes leftover `.deleted` files. A crash
before step 2's dir fsync leaves the segments in place, and the next check deletes them
again. The high watermark bounds every deletion when one is known, and the active
segment is never deleted. A segment whose largest timestamp lies in the future blocks
time retention, as in Kafka, and a damaged segment stops a pass which would otherwise
have taken it: the outcome names either (`future_timestamp_base`, `damaged_base`), for
the caller to say once (the daemon meets them every cycle until they change).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from cleanerd.errors import CleanerdError
from cleanerd.log.deletions import PendingDeletions
from cleanerd.log.partition_log import PartitionLog
from cleanerd.log.topic_config import TopicConfig
from cleanerd.retention.policy import (
    Deletion,
    RetentionRoll,
    retention_plan,
)


@dataclass(frozen=True, slots=True)
class RetentionOutcome:
    """What one retention check did to one partition."""

    log_dir: str
    topic: str
    partition: int
    deletions: tuple[Deletion, ...]
    """Oldest first, each with its reason."""
    roll: RetentionRoll | None
    """The roll of the active segment done first, because a rule took every segment;
    None when there was none."""
    log_start_offset: int
    future_timestamp_base: int | None
    """Base of a segment whose future largest timestamp stopped time retention."""
    deleted_files: tuple[Path, ...]
    """The `.deleted` files handed to the pending-deletion queue."""
    future_timestamp_ms: int | None = None
    """The largest timestamp of the segment at `future_timestamp_base`."""
    damaged_base: int | None = None
    """Base of a damaged segment that stopped a pass which would have taken it."""
    failure: CleanerdError | OSError | None = None
    """What stopped the check after `deletions` were done (the roll on a full disk);
    the caller reports it as the partition's failed step."""


def apply_retention(
    plog: PartitionLog,
    topic: TopicConfig,
    *,
    now_ms: int,
    pending: PendingDeletions,
) -> RetentionOutcome:
    """Run one retention check on `plog` (a partition of an owned log dir; the caller
    checkpoints it when it changed); see the module docstring. `__cluster_metadata` is
    left alone; any other read-only partition raises PermissionError."""
    tp = plog.topic_partition
    if plog.is_metadata:
        return RetentionOutcome(
            str(plog.log_dir), tp.topic, tp.partition, (), None, plog.log_start_offset, None, ()
        )
    roll: RetentionRoll | None = None
    # Decided first on the current metadata without the lock (`PartitionLog.meta`), as
    # nearly every partition of a cycle has nothing to delete; then again under it.
    plan = retention_plan(plog.readable_meta(), topic, now_ms=now_ms)
    quiet = plan.future_timestamp_base is None and plan.damaged_base is None
    if not plan.deletions and plan.roll_for is None and quiet:
        return RetentionOutcome(
            str(plog.log_dir), tp.topic, tp.partition, (), None, plog.log_start_offset, None, ()
        )
    deleted: list[Deletion] = []
    files: list[Path] = []
    failure: CleanerdError | OSError | None = None
    with plog.lock:
        try:
            plan = retention_plan(plog.readable_meta(), topic, now_ms=now_ms)
            # The due inactive segments go before the roll: they need no space, and on a
            # full disk (where the roll's index write fails) they are what frees it.
            _delete(plog, plan.deletions, deleted, files)
            if plan.roll_for is not None:
                # Kafka rolls so that retention can take the whole log; the line names
                # the rule.
                active_base = plog.active_segment.base_offset
                if plog.roll(now_ms, reason=plan.roll_for.value) is not None:
                    roll = RetentionRoll(active_base, plan.roll_for)
                plan = retention_plan(plog.readable_meta(), topic, now_ms=now_ms)
                _delete(plog, plan.deletions, deleted, files)
        except (CleanerdError, OSError) as exc:
            if not deleted and roll is None:
                raise
            failure = exc  # reported with what was deleted (or rolled) before it
        finally:
            # Renamed `.deleted` files are unlinked when due even when a later group or
            # the roll failed (a full disk): else they waited for the next start.
            pending.schedule(files, now_ms=now_ms, delay_ms=topic.file_delete_delay_ms)
    return RetentionOutcome(
        log_dir=str(plog.log_dir),
        topic=tp.topic,
        partition=tp.partition,
        deletions=tuple(deleted),
        roll=roll,
        log_start_offset=plog.log_start_offset,
        future_timestamp_base=plan.future_timestamp_base,
        future_timestamp_ms=plan.future_timestamp_ms,
        deleted_files=tuple(files),
        damaged_base=plan.damaged_base,
        failure=failure,
    )


def _delete(
    plog: PartitionLog,
    deletions: tuple[Deletion, ...],
    deleted: list[Deletion],
    files: list[Path],
) -> None:
    """Delete `deletions` (one call per reason, oldest first), adding to `deleted` and
    `files` as each group's renames are done."""
    by_base = {s.base_offset: s for s in plog.segments}
    for reason, group in itertools.groupby(deletions, key=lambda d: d.reason):
        chosen = [d for d in group if d.base_offset in by_base]
        files += plog.delete_segments([by_base[d.base_offset] for d in chosen], reason=reason.value)
        deleted += chosen
