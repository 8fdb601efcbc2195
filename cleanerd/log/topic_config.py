"""A topic's effective settings: Kafka's LogConfig, what every layer below the
configuration reads.

`cleanerd.config` parses and validates the YAML file (broker defaults under
`server.properties` names, per-topic overrides by exact name or glob) and resolves a
topic to one `TopicConfig`; the log layer (rolls), retention and compaction take that
plain, immutable value and never see the file. The fields carry Kafka's topic-config
names in snake case (`segment.ms` is `segment_ms`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cleanerd.log.roll import max_segment_ms

CleanupPolicy = Literal["delete", "compact"]
CompactionStrategyName = Literal["offset", "timestamp", "header"]


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """The effective settings of one topic, under Kafka's topic-config names in snake case."""

    cleanup_policy: tuple[CleanupPolicy, ...]
    segment_bytes: int
    segment_ms: int
    segment_jitter_ms: int
    segment_index_bytes: int
    index_interval_bytes: int
    retention_ms: int
    retention_bytes: int
    min_compaction_lag_ms: int
    max_compaction_lag_ms: int
    min_cleanable_dirty_ratio: float
    delete_retention_ms: int
    file_delete_delay_ms: int
    max_message_bytes: int
    compaction_strategy: CompactionStrategyName
    compaction_strategy_header: str
    preallocate: bool

    @property
    def compact(self) -> bool:
        """`compact` is in cleanup.policy."""
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        """`delete` is in cleanup.policy."""
        return "delete" in self.cleanup_policy

    @property
    def max_segment_ms(self) -> int:
        """KIP-354's roll limit: min(segment.ms, max.compaction.lag.ms) when compacted."""
        return max_segment_ms(self.segment_ms, self.max_compaction_lag_ms, compact=self.compact)
