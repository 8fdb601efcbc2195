"""Statistics of one cleaning pass (Kafka's CleanerStats) and Kafka's stats log block.

Counted as Kafka counts them: the map build reads the dirty range (`map_bytes_read`,
`map_messages_read`, records before the start offset in the first segment included); the
copy phase reads every segment from the log start up to the map's end offset
(`bytes_read`, `messages_read`, so the clean section counts again every pass) and writes
the cleaned segments (`bytes_written`, `messages_written`: records, not empty headers);
keyless records met in the copy phase are `invalid_messages_read`. Times are monotonic
milliseconds from an injected clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class CleanerStats:
    """One pass's numbers, for the log line, metrics and events."""

    bytes_read: int
    bytes_written: int
    map_bytes_read: int
    map_messages_read: int
    messages_read: int
    messages_written: int
    invalid_messages_read: int
    buffer_utilization: float
    start_ms: int
    map_complete_ms: int
    end_ms: int

    def fields(self) -> dict[str, int | float]:
        """The numbers as the `log.cleaned` line, its event and `clean --json` give them:
        the counts and the durations `duration_ms` (the whole pass) and
        `map_duration_ms` (building the offset map). The three instants they come from
        are read from a monotonic clock, meaningless outside the pass, so they are not
        given (the line's own timestamp says when the pass ended)."""
        return {
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "map_bytes_read": self.map_bytes_read,
            "map_messages_read": self.map_messages_read,
            "messages_read": self.messages_read,
            "messages_written": self.messages_written,
            "invalid_messages_read": self.invalid_messages_read,
            "buffer_utilization": self.buffer_utilization,
            "duration_ms": self.end_ms - self.start_ms,
            "map_duration_ms": self.map_complete_ms - self.start_ms,
        }

    @property
    def elapsed_secs(self) -> float:
        """Whole pass, seconds."""
        return (self.end_ms - self.start_ms) / 1000.0

    @property
    def elapsed_index_secs(self) -> float:
        """Map build, seconds."""
        return (self.map_complete_ms - self.start_ms) / 1000.0

    @property
    def elapsed_copy_secs(self) -> float:
        """Copy phase (grouping, filtering, writing, swapping), seconds."""
        return self.elapsed_secs - self.elapsed_index_secs


@dataclass(slots=True)
class StatsAccumulator:
    """The mutable counters a pass adds to; `freeze` gives the CleanerStats."""

    start_ms: int
    bytes_read: int = 0
    bytes_written: int = 0
    map_bytes_read: int = 0
    map_messages_read: int = 0
    messages_read: int = 0
    messages_written: int = 0
    invalid_messages_read: int = 0
    buffer_utilization: float = 0.0
    map_complete_ms: int | None = None

    def freeze(self, end_ms: int) -> CleanerStats:
        """The final numbers, with the pass ending at `end_ms`."""
        map_done = self.map_complete_ms if self.map_complete_ms is not None else end_ms
        return CleanerStats(
            bytes_read=self.bytes_read,
            bytes_written=self.bytes_written,
            map_bytes_read=self.map_bytes_read,
            map_messages_read=self.map_messages_read,
            messages_read=self.messages_read,
            messages_written=self.messages_written,
            invalid_messages_read=self.invalid_messages_read,
            buffer_utilization=self.buffer_utilization,
            start_ms=self.start_ms,
            map_complete_ms=map_done,
            end_ms=end_ms,
        )


def _div(a: float, b: float) -> float:
    """Java double division: x/0 is +-Infinity, 0/0 is NaN."""
    if b != 0:
        return a / b
    if a == 0 or math.isnan(a):
        return math.nan
    return math.copysign(math.inf, a)


def _java(x: float, spec: str) -> str:
    """Format `x` with `spec` the way Java's String.format prints NaN and Infinity."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return format(x, spec)


def render_stats(
    *, thread_id: int, log_name: str, first_dirty_offset: int, end_offset: int, stats: CleanerStats
) -> str:
    """Kafka's INFO block for one pass (LogCleaner.recordStats), line by line."""
    s = stats
    secs = s.elapsed_secs
    index_secs = s.elapsed_index_secs
    copy_secs = s.elapsed_copy_secs
    read_mb = s.bytes_read / MB
    map_mb = s.map_bytes_read / MB
    lines = [
        "",
        f"\tLog cleaner thread {thread_id} cleaned log {log_name} "
        f"(dirty section = [{first_dirty_offset}, {end_offset}])",
        f"\t{_java(read_mb, ',.1f')} MB of log processed in {_java(secs, ',.1f')} seconds "
        f"({_java(_div(read_mb, secs), ',.1f')} MB/sec).",
        f"\tIndexed {_java(map_mb, ',.1f')} MB in {_java(index_secs, '.1f')} seconds "
        f"({_java(_div(map_mb, index_secs), ',.1f')} Mb/sec, "
        f"{_java(_div(100 * index_secs, secs), '.1f')}% of total time)",
        f"\tBuffer utilization: {_java(100 * s.buffer_utilization, '.1f')}%",
        f"\tCleaned {_java(read_mb, ',.1f')} MB in {_java(copy_secs, '.1f')} seconds "
        f"({_java(_div(read_mb, copy_secs), ',.1f')} Mb/sec, "
        f"{_java(_div(100 * copy_secs, secs), '.1f')}% of total time)",
        f"\tStart size: {_java(read_mb, ',.1f')} MB ({s.messages_read:,d} messages)",
        f"\tEnd size: {_java(s.bytes_written / MB, ',.1f')} MB ({s.messages_written:,d} messages)",
        f"\t{_java(100.0 * (1.0 - _div(s.bytes_written, s.bytes_read)), '.1f')}% size reduction "
        f"({_java(100.0 * (1.0 - _div(s.messages_written, s.messages_read)), '.1f')}% "
        "fewer messages)",
        "",
    ]
    return "\n".join(lines)


def render_invalid_warning(stats: CleanerStats) -> str | None:
    """Kafka's WARN line when keyless records were met, else None."""
    if stats.invalid_messages_read == 0:
        return None
    return f"\tFound {stats.invalid_messages_read} invalid messages during compaction."
