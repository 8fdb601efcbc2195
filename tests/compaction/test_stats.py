"""Tests of CleanerStats and Kafka's stats block."""

from __future__ import annotations

from cleanerd.compaction.stats import StatsAccumulator, render_invalid_warning, render_stats


def test_render_block_matches_kafka_layout() -> None:
    """The block carries Kafka's lines with sizes, rates and reductions."""
    acc = StatsAccumulator(start_ms=0, bytes_read=2 * 1024 * 1024, bytes_written=1024 * 1024)
    acc.messages_read, acc.messages_written = 2000, 500
    acc.map_bytes_read = 1024 * 1024
    acc.buffer_utilization = 0.25
    acc.map_complete_ms = 500
    s = acc.freeze(2000)
    text = render_stats(thread_id=0, log_name="t-0", first_dirty_offset=5, end_offset=9, stats=s)
    lines = text.split("\n")
    assert lines[1] == "\tLog cleaner thread 0 cleaned log t-0 (dirty section = [5, 9])"
    assert lines[2] == "\t2.0 MB of log processed in 2.0 seconds (1.0 MB/sec)."
    assert lines[3] == "\tIndexed 1.0 MB in 0.5 seconds (2.0 Mb/sec, 25.0% of total time)"
    assert lines[4] == "\tBuffer utilization: 25.0%"
    assert lines[5] == "\tCleaned 2.0 MB in 1.5 seconds (1.3 Mb/sec, 75.0% of total time)"
    assert lines[6] == "\tStart size: 2.0 MB (2,000 messages)"
    assert lines[7] == "\tEnd size: 1.0 MB (500 messages)"
    assert lines[8] == "\t50.0% size reduction (75.0% fewer messages)"
    assert render_invalid_warning(s) is None


def test_zero_time_prints_java_nan_and_infinity() -> None:
    """Zero durations render as Java prints them, not as a Python error."""
    s = StatsAccumulator(start_ms=0, bytes_read=1024 * 1024, invalid_messages_read=3).freeze(0)
    text = render_stats(thread_id=1, log_name="t-0", first_dirty_offset=0, end_offset=0, stats=s)
    assert "(Infinity MB/sec)" in text
    assert "NaN% of total time" in text
    assert render_invalid_warning(s) == "\tFound 3 invalid messages during compaction."


def test_fields_give_durations_not_bare_timestamps() -> None:
    """The log line's and event's numbers: counts, and how long the pass and its map
    build took (not the monotonic instants start_ms / end_ms, meaningless outside)."""
    acc = StatsAccumulator(start_ms=1_000_000, messages_read=7, messages_written=3)
    acc.map_complete_ms = 1_000_400
    fields = acc.freeze(1_001_500).fields()
    assert (fields["duration_ms"], fields["map_duration_ms"]) == (1500, 400)
    assert (fields["messages_read"], fields["messages_written"]) == (7, 3)
    assert not {"start_ms", "end_ms", "map_complete_ms"} & set(fields)
