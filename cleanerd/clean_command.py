"""`cleanerd clean`: compact every eligible partition until nothing is eligible, then exit.

For each log dir of the config (owner mode; a dir whose `.lock` another process holds is
observed, not touched) and each partition whose topic has `compact` in its cleanup policy
(never `__cluster_metadata`), the partition is opened (finishing any interrupted swap),
its cleanable range computed (`cleanable.log_to_clean`) and, while it is eligible
(`cleanable.is_eligible`, including cleanerd's passed-delete-horizon rule), one pass after
another is run and its statistics printed in Kafka's stats block. A pass that fails marks
the partition uncleanable (the reason is printed) and the command goes on with the next
partition. Old segment files are unlinked before the command exits: a one-shot process
has nobody left to honour `file.delete.delay.ms` for it.

`--now-ms` is the instant every time rule is evaluated at (lags, horizons, expiry).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from cleanerd.compaction.cleanable import LogToClean, is_eligible, log_to_clean
from cleanerd.compaction.cleaner import Cleaner, CleanerConfig, CleanResult
from cleanerd.compaction.horizon import HorizonCache
from cleanerd.compaction.manager import UncleanablePartitions, clean_or_mark
from cleanerd.compaction.offset_map import OffsetMap
from cleanerd.compaction.stats import render_invalid_warning, render_stats
from cleanerd.compaction.strategy import CompactionStrategy, resolve_strategy
from cleanerd.compaction.swap import PendingDeletions
from cleanerd.compaction.throttle import Throttler
from cleanerd.config import Config, TopicConfig, load_config
from cleanerd.log.files import METADATA_TOPIC, TopicPartition
from cleanerd.log.log_dir import LogDir
from cleanerd.log.meta import PartitionMeta
from cleanerd.produce import log_config_for

MAX_PASSES_PER_PARTITION: Final = 10_000

ARGS: Final[tuple[tuple[tuple[str, ...], dict[str, Any]], ...]] = (
    (
        ("-c", "--config"),
        {"type": Path, "metavar": "FILE", "help": "the YAML config file"},
    ),
    (
        ("--now-ms",),
        {
            "type": int,
            "metavar": "T",
            "help": "evaluate lags, horizons and expiry at T (ms since the epoch; default now)",
        },
    ),
    (
        ("--topic",),
        {
            "action": "append",
            "metavar": "T",
            "help": "only this topic (repeatable; default every compacted topic)",
        },
    ),
)


def cleaner_config_for(topic: TopicConfig, *, producer_id_expiration_ms: int) -> CleanerConfig:
    """The settings a pass reads, from a topic's effective config."""
    return CleanerConfig(
        segment_bytes=topic.segment_bytes,
        max_index_size=topic.segment_index_bytes,
        index_interval_bytes=topic.index_interval_bytes,
        delete_retention_ms=topic.delete_retention_ms,
        producer_id_expiration_ms=producer_id_expiration_ms,
        strategy=resolve_strategy(topic.compaction_strategy, topic.compaction_strategy_header),
    )


@dataclass
class _Run:
    """State of one `cleanerd clean` invocation."""

    config: Config
    now_ms: int
    topics: set[str] | None
    registry: UncleanablePartitions = field(default_factory=UncleanablePartitions)
    pending: PendingDeletions = field(default_factory=PendingDeletions)
    maps: dict[CompactionStrategy, OffsetMap] = field(default_factory=dict)
    horizons: HorizonCache = field(default_factory=HorizonCache)
    passes: int = 0
    failures: int = 0

    def __post_init__(self) -> None:
        self.throttler = Throttler(self.config.log_cleaner_io_max_bytes_per_second)

    def cleaner(self, strategy: CompactionStrategy) -> Cleaner:
        """A cleaner whose map has the entry layout of `strategy` (one map per layout)."""
        m = self.maps.get(strategy)
        if m is None:
            m = OffsetMap.for_config(
                self.config.log_cleaner_dedupe_buffer_size,
                self.config.log_cleaner_threads,
                self.config.log_cleaner_io_buffer_load_factor,
                strategy,
            )
            self.maps[strategy] = m
        return Cleaner(m, throttler=self.throttler)

    def clean_log_dir(self, log_dir: LogDir) -> None:
        for tp in log_dir.partitions():
            if tp.topic == METADATA_TOPIC or (
                self.topics is not None and tp.topic not in self.topics
            ):
                continue
            topic = self.config.topic_config(tp.topic)
            if topic.compact:
                self.clean_partition(log_dir, tp, topic)

    def clean_partition(self, log_dir: LogDir, tp: TopicPartition, topic: TopicConfig) -> None:
        plog = log_dir.open_partition(tp, config=log_config_for(topic))
        if plog.corrupt is not None:
            self.registry.mark(
                tp, log_dir=str(log_dir.path), reason=str(plog.corrupt), now_ms=self.now_ms
            )
            print(f"{tp}: uncleanable: {plog.corrupt}")
            self.failures += 1
            return
        config = cleaner_config_for(
            topic, producer_id_expiration_ms=self.config.producer_id_expiration_ms
        )
        if config.strategy.warning is not None:
            print(f"{tp}: warning: {config.strategy.warning}")
        for _ in range(MAX_PASSES_PER_PARTITION):
            meta = plog.meta()
            ltc = self.candidate(log_dir, tp, meta, topic)
            due = self.horizons.horizon_due(
                plog, now_ms=self.now_ms, end_offset=ltc.first_uncleanable
            )
            if not is_eligible(ltc, topic.min_cleanable_dirty_ratio, horizon_due=due):
                return
            result = clean_or_mark(
                self.cleaner(config.strategy.strategy),
                self.registry,
                log_dir=log_dir.path,
                tp=tp,
                segments=meta.segments,
                first_dirty=ltc.first_dirty,
                first_uncleanable=ltc.first_uncleanable,
                now_ms=self.now_ms,
                config=config,
                swap_lock=plog.lock,
            )
            if result is None:
                print(f"{tp}: uncleanable: {self.registry.reason(tp)}")
                self.failures += 1
                return
            self.report(tp, result, topic)
            if ltc.first_dirty == ltc.first_uncleanable:
                return  # a pass for passed horizons only: once is enough

    def candidate(
        self, log_dir: LogDir, tp: TopicPartition, meta: PartitionMeta, topic: TopicConfig
    ) -> LogToClean:
        checkpoint = log_dir.reload_checkpoints().cleaner_offsets.get(tp)
        ltc = log_to_clean(
            meta,
            checkpoint=checkpoint,
            now_ms=self.now_ms,
            min_compaction_lag_ms=topic.min_compaction_lag_ms,
            max_compaction_lag_ms=topic.max_compaction_lag_ms,
        )
        if ltc.cleanable_range.checkpoint_reset:
            log_dir.update_cleaner_offset(tp, ltc.first_dirty)
        return ltc

    def report(self, tp: TopicPartition, result: CleanResult, topic: TopicConfig) -> None:
        self.passes += 1
        self.pending.schedule(
            list(result.deleted_files), now_ms=self.now_ms, delay_ms=topic.file_delete_delay_ms
        )
        print(
            render_stats(
                thread_id=0,
                log_name=str(tp),
                first_dirty_offset=result.first_dirty,
                end_offset=result.end_offset,
                stats=result.stats,
            )
        )
        warning = render_invalid_warning(result.stats)
        if warning is not None:
            print(warning)


def run(args: argparse.Namespace) -> int:
    """The `clean` subcommand; exit status 1 if any partition could not be cleaned."""
    config = load_config(args.config)
    now_ms = args.now_ms if args.now_ms is not None else time.time_ns() // 1_000_000
    state = _Run(config, now_ms, set(args.topic) if args.topic else None)
    try:
        for path in config.log_dirs:
            log_dir = LogDir.open(
                Path(path), observe=config.mode == "observe", state_dir=config.state_dir
            )
            with log_dir:
                if log_dir.read_only:
                    print(f"{path}: observed, not cleaned ({log_dir.mode.value} mode)")
                    continue
                state.clean_log_dir(log_dir)
    finally:
        state.pending.unlink_all()
    print(f"{state.passes} cleaning passes, {state.failures} partitions uncleanable")
    return 1 if state.failures else 0
