"""Clock-driven rolls of active segments (owner mode), and when each was first seen.

`roll.py` decides (`should_roll`); this module applies the decision to a `PartitionLog`:
under the partition lock the dir is re-read, the active segment's snapshot taken, the
rules evaluated at `now_ms` and, when due, the segment rolled with the same operation an
append uses (`PartitionLog.roll`). Holding the lock from the check to the roll means a
concurrent producer cannot slip a batch in between: the roll happens at the log end
offset the decision saw, or after batches that the decision would only have made more
due. An empty active segment never rolls, and `__cluster_metadata` or a read-only
partition is never rolled.

First-seen clock. `should_roll` clamps a first-batch timestamp in the future to the time
cleanerd first saw the segment (the minimum roll interval counts from the partition's
last roll instead, `PartitionLog.last_roll_ms`: evidence on disk).
`FirstSeen` keeps it per partition, for the active segment only (one base offset and one
time), and persists it so that a restart of the daemon does not restart the clock:

    <state_dir>/first-seen/<log dir key>.json
    {"version": 1, "log_dir": "/abs/log/dir",
     "segments": {"<topic>-<partition>": [<active base offset>, <first seen ms>], ...}}

Written with `fsutil.atomic_write` (tmp file, fsync, rename, dir fsync): a crash leaves
the old or the new file, never a mix. The file is advisory: losing it only weakens the clamp
of a future timestamp, so an unreadable file is logged and replaced, not fatal.

A segment counts as seen once it holds its first batch: the clamp replaces the first
batch's timestamp, so it must be a time at which that batch already existed (an empty
segment seen long before its first append would otherwise look as old as its file and
roll early). A non-empty segment cleanerd has not seen before gets
`min(now, mtime of its .log)`: its batches were all written by the file's last
modification, so that time is a valid clamp for a future timestamp, and it is never later
than the true first sighting. An empty segment is not recorded (it never rolls anyway).

Jitter: drawn once per segment from a seed naming the topic, partition and base offset
(`roll.jitter_of_segment`), so it is the same after every restart without storing it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cleanerd.log.files import METADATA_TOPIC, TopicPartition, parse_topic_partition
from cleanerd.log.fsutil import atomic_write
from cleanerd.log.lock import log_dir_key
from cleanerd.log.meta import SegmentMeta
from cleanerd.log.partition_log import PartitionLog
from cleanerd.log.roll import (
    DEFAULT_MIN_ROLL_INTERVAL_MS,
    RollDecision,
    SegmentAge,
    TimeRollLimit,
    jitter_of_segment,
    should_roll,
    time_roll_limit,
)
from cleanerd.log.topic_config import TopicConfig
from cleanerd.logger import get_logger

log = get_logger(__name__)

FIRST_SEEN_DIR: Final = "first-seen"
FIRST_SEEN_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class SeenSegment:
    """The active segment of a partition and when cleanerd first saw it."""

    base_offset: int
    first_seen_ms: int


def first_seen_path(state_dir: Path, log_dir: Path) -> Path:
    """Where the first-seen registry of `log_dir` lives in the state dir."""
    return state_dir / FIRST_SEEN_DIR / f"{log_dir_key(log_dir)}.json"


class FirstSeen:
    """When cleanerd first saw each partition's active segment (see the module docstring).

    One registry per log dir. `observe` answers and records; `save` persists changes.
    """

    def __init__(
        self,
        path: Path | None,
        log_dir: Path,
        entries: dict[TopicPartition, SeenSegment] | None = None,
    ) -> None:
        self.path = path
        self.log_dir = log_dir
        self._entries = {} if entries is None else entries
        self._changed = False

    @classmethod
    def load(cls, state_dir: Path, log_dir: Path) -> FirstSeen:
        """The registry of `log_dir` from `state_dir` (empty when there is none yet)."""
        path = first_seen_path(state_dir, log_dir)
        if not path.exists():
            return cls(path, log_dir)
        try:
            return cls(path, log_dir, _parse(path.read_bytes()))
        except (OSError, ValueError) as exc:
            log.warning(
                "first_seen.unreadable",
                path=str(path),
                error=str(exc),
                consequence="time rolls wait one minimum roll interval again",
            )
        registry = cls(path, log_dir)
        registry._changed = True
        return registry

    @property
    def changed(self) -> bool:
        """Whether there are changes that `save` would write."""
        return self._changed

    def get(self, tp: TopicPartition) -> SeenSegment | None:
        """The recorded active segment of `tp`, or None."""
        return self._entries.get(tp)

    def observe(self, tp: TopicPartition, active: SegmentMeta, now_ms: int) -> int:
        """When cleanerd first saw `active` (the active segment of `tp`) holding a batch,
        recording it if it is new: min(now, its `.log` mtime). An empty segment is
        answered the same way but not recorded."""
        first = self.peek(tp, active, now_ms)
        if not active.is_empty:
            self.record(tp, active.base_offset, first)
        return first

    def peek(self, tp: TopicPartition, active: SegmentMeta, now_ms: int) -> int:
        """What `observe` would answer, without recording anything (for `plan`)."""
        seen = self._entries.get(tp)
        if seen is not None and seen.base_offset == active.base_offset:
            return seen.first_seen_ms
        return min(now_ms, active.last_modified_ms)

    def record(self, tp: TopicPartition, base_offset: int, first_seen_ms: int) -> None:
        """Record that the active segment of `tp` at `base_offset` was first seen then."""
        entry = SeenSegment(base_offset, first_seen_ms)
        if self._entries.get(tp) != entry:
            self._entries[tp] = entry
            self._changed = True

    def retain_only(self, existing: Iterable[TopicPartition]) -> None:
        """Forget partitions that no longer exist."""
        keep = set(existing)
        for tp in [tp for tp in self._entries if tp not in keep]:
            del self._entries[tp]
            self._changed = True

    def save(self) -> None:
        """Persist the registry atomically if it changed (no-op for an in-memory one)."""
        if self.path is None or not self._changed:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, _format(self.log_dir, self._entries))
        self._changed = False


def _format(log_dir: Path, entries: dict[TopicPartition, SeenSegment]) -> bytes:
    segments = {
        str(tp): [seen.base_offset, seen.first_seen_ms] for tp, seen in sorted(entries.items())
    }
    doc = {"version": FIRST_SEEN_VERSION, "log_dir": str(log_dir.resolve()), "segments": segments}
    return json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n"


def _parse(data: bytes) -> dict[TopicPartition, SeenSegment]:
    doc = json.loads(data)
    if not isinstance(doc, dict) or doc.get("version") != FIRST_SEEN_VERSION:
        raise ValueError(f"not a version-{FIRST_SEEN_VERSION} first-seen registry")
    segments = doc.get("segments")
    if not isinstance(segments, dict):
        raise ValueError("'segments' is not a mapping")
    entries: dict[TopicPartition, SeenSegment] = {}
    for name, value in segments.items():
        if (
            not isinstance(value, list)
            or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        ):
            raise ValueError(f"entry {name!r}: expected [base offset, first seen ms]")
        entries[parse_topic_partition(name)] = SeenSegment(value[0], value[1])
    return entries


def time_rule(
    tp: TopicPartition, base_offset: int, topic: TopicConfig
) -> tuple[TimeRollLimit, int]:
    """Kafka's maxSegmentMs under `topic` (with the config behind it) and the jitter of
    the segment of `tp` at `base_offset`."""
    limit = time_roll_limit(topic.segment_ms, topic.max_compaction_lag_ms, compact=topic.compact)
    jitter = jitter_of_segment(
        tp.topic, tp.partition, base_offset, topic.segment_ms, topic.segment_jitter_ms
    )
    return limit, jitter


def roll_decision(
    tp: TopicPartition,
    active: SegmentMeta,
    topic: TopicConfig,
    *,
    now_ms: int,
    age: SegmentAge,
    min_roll_interval_ms: int = DEFAULT_MIN_ROLL_INTERVAL_MS,
) -> RollDecision | None:
    """Whether the active segment of `tp` must roll at `now_ms` under `topic`'s settings:
    `roll.should_roll` with Kafka's maxSegmentMs and the segment's stable jitter."""
    if tp.topic == METADATA_TOPIC:
        return None
    limit, jitter = time_rule(tp, active.base_offset, topic)
    return should_roll(
        active,
        now_ms=now_ms,
        segment_bytes=topic.segment_bytes,
        max_segment_ms=limit.ms,
        jitter_ms=jitter,
        age=age,
        min_roll_interval_ms=min_roll_interval_ms,
        time_reason=limit.reason,
    )


def segment_age(
    plog: PartitionLog, first_seen: FirstSeen, active: SegmentMeta, now_ms: int
) -> SegmentAge:
    """How old the active segment `active` of `plog` is (`roll.SegmentAge`), without
    recording anything (for `plan`)."""
    tp = plog.topic_partition
    return SegmentAge(first_seen.peek(tp, active, now_ms), plog.last_roll_ms())


def maybe_roll(
    plog: PartitionLog,
    topic: TopicConfig,
    first_seen: FirstSeen,
    *,
    now_ms: int,
    min_roll_interval_ms: int = DEFAULT_MIN_ROLL_INTERVAL_MS,
) -> RollDecision | None:
    """Roll the active segment of `plog` if it is due at `now_ms`; returns the decision
    acted on, or None. Read-only logs and `__cluster_metadata` are never rolled.

    `first_seen` records the active segment when it is first seen holding a batch; the
    caller saves the registry (once per cycle, not once per partition)."""
    if plog.read_only or plog.is_metadata:
        return None
    tp = plog.topic_partition
    # Decided first on the current metadata without the lock (`PartitionLog.meta`), as
    # nearly every partition of a cycle is not due; a due one is decided again under it.
    active = plog.meta().active
    age = SegmentAge(first_seen.observe(tp, active, now_ms), plog.last_roll_ms())
    if (
        roll_decision(
            tp, active, topic, now_ms=now_ms, age=age, min_roll_interval_ms=min_roll_interval_ms
        )
        is None
    ):
        return None
    with plog.lock:
        plog.refresh()
        active = plog.active_segment.meta()
        age = SegmentAge(first_seen.observe(tp, active, now_ms), plog.last_roll_ms())
        decision = roll_decision(
            tp, active, topic, now_ms=now_ms, age=age, min_roll_interval_ms=min_roll_interval_ms
        )
        if decision is None:
            return None
        rolled = plog.roll(now_ms, reason=decision.reason.value, waited_ms=decision.waited_ms)
        if rolled is None:
            return None
        return decision
