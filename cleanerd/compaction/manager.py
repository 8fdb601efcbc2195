"""Partitions the cleaner must skip, and why (the uncleanable part of Kafka's
LogCleanerManager).

A pass that fails (a corrupt batch in the range to clean, an I/O error, a full disk)
leaves the partition's segments as they were and marks it uncleanable with the reason,
so the scheduler does not retry it in a tight loop and the operator sees why (log line,
`kafka_log_logcleanermanager_uncleanable_partitions_count` / `_bytes`,
`partition.uncleanable` event). Kafka keeps the mark until the partition goes away or the
broker restarts; cleanerd also clears it when the partition's config changes (the operator
may have fixed the cause) and after a backoff (a full disk may have been freed), so a
long-running daemon recovers without a restart. Time is a parameter (`now_ms`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from cleanerd.compaction.cleaner import Cleaner, CleanerConfig, CleaningAborted, CleanResult
from cleanerd.errors import CleanerdError
from cleanerd.log.files import TopicPartition
from cleanerd.log.meta import SegmentMeta

_log = structlog.get_logger(__name__)

DEFAULT_UNCLEANABLE_BACKOFF_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class UncleanableMark:
    """Why and when a partition was marked, under which config fingerprint."""

    log_dir: str
    reason: str
    since_ms: int
    config_fingerprint: str


@dataclass(slots=True)
class UncleanablePartitions:
    """The registry; one per process, shared by every worker."""

    backoff_ms: int = DEFAULT_UNCLEANABLE_BACKOFF_MS
    _marks: dict[TopicPartition, UncleanableMark] = field(default_factory=dict)

    def mark(
        self,
        tp: TopicPartition,
        *,
        log_dir: str,
        reason: str,
        now_ms: int,
        config_fingerprint: str = "",
    ) -> None:
        """Mark `tp` uncleanable for `reason` (replacing an earlier mark)."""
        self._marks[tp] = UncleanableMark(log_dir, reason, now_ms, config_fingerprint)

    def is_uncleanable(
        self, tp: TopicPartition, *, now_ms: int, config_fingerprint: str = ""
    ) -> bool:
        """Whether `tp` is still to be skipped; an expired mark or one made under another
        config is dropped here."""
        mark = self._marks.get(tp)
        if mark is None:
            return False
        if (
            now_ms - mark.since_ms >= self.backoff_ms
            or mark.config_fingerprint != config_fingerprint
        ):
            del self._marks[tp]
            return False
        return True

    def reason(self, tp: TopicPartition) -> str | None:
        """The reason `tp` was marked, or None."""
        mark = self._marks.get(tp)
        return None if mark is None else mark.reason

    def clear(self, tp: TopicPartition) -> None:
        """Forget `tp` (partition deleted, or an operator's explicit retry)."""
        self._marks.pop(tp, None)

    def retain_only(self, existing: Iterable[TopicPartition]) -> None:
        """Drop marks of partitions that no longer exist (Kafka does this every loop)."""
        keep = set(existing)
        for tp in [tp for tp in self._marks if tp not in keep]:
            del self._marks[tp]

    def in_dir(self, log_dir: str) -> dict[TopicPartition, UncleanableMark]:
        """The marks of one log dir (for the per-dir metrics)."""
        return {tp: m for tp, m in self._marks.items() if m.log_dir == log_dir}

    def __len__(self) -> int:
        return len(self._marks)


def clean_or_mark(
    cleaner: Cleaner,
    registry: UncleanablePartitions,
    *,
    log_dir: Path,
    tp: TopicPartition,
    segments: Sequence[SegmentMeta],
    first_dirty: int,
    first_uncleanable: int,
    now_ms: int,
    config: CleanerConfig,
    config_fingerprint: str = "",
    swap_lock: AbstractContextManager[object] | None = None,
) -> CleanResult | None:
    """Run one pass; on a corrupt batch, an I/O error or a full disk, mark `tp`
    uncleanable with the reason and return None. The pass has already removed its
    `.cleaned` output and left the source segments as they were. CleaningAborted (a
    requested stop) propagates without a mark."""
    try:
        return cleaner.clean(
            log_dir=log_dir,
            tp=tp,
            segments=segments,
            first_dirty=first_dirty,
            first_uncleanable=first_uncleanable,
            now_ms=now_ms,
            config=config,
            swap_lock=swap_lock,
        )
    except CleaningAborted:
        raise
    except (CleanerdError, OSError) as exc:
        reason = f"{type(exc).__name__}: {exc}"
        registry.mark(
            tp,
            log_dir=str(log_dir),
            reason=reason,
            now_ms=now_ms,
            config_fingerprint=config_fingerprint,
        )
        _log.warning(
            "partition.uncleanable",
            topic=tp.topic,
            partition=tp.partition,
            log_dir=str(log_dir),
            reason=reason,
        )
        return None
