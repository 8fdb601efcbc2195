"""The daemon's events and pass counters for what a cycle did (`daemon/reporting.py`)."""

from __future__ import annotations

from cleanerd.config import MetricsConfig
from cleanerd.daemon.metrics.exporter import MetricsExporter
from cleanerd.daemon.reporting import Reporter
from cleanerd.log.files import TopicPartition
from cleanerd.maintenance.report import CleanedLog, CycleNews, FailedLog
from tests.builders import cycle_report
from tests.daemon.conftest import RecordingPublisher
from tests.daemon.metrics.test_model import meta, state, stats

NOW_MS = 1_700_000_000_000


def test_damage_found_before_any_pass_is_no_failed_pass() -> None:
    """A partition marked uncleanable by a pass that failed counts as a failed pass; one
    marked before any pass (damage its open or its metadata showed) does not, though
    both are announced uncleanable. Every damaged partition counted a failed pass, so
    a dir with damage and no pass at all read as a cleaner that fails."""
    exporter = MetricsExporter(MetricsConfig(listen="127.0.0.1:0"))
    events = RecordingPublisher()
    reporter = Reporter(exporter, lambda: events, lambda: NOW_MS)
    failed = (
        FailedLog("/d", TopicPartition("a", 0), "corrupt record batch", during_pass=False),
        FailedLog("/d", TopicPartition("b", 0), "the pass failed", during_pass=True),
    )
    reporter.happened(CycleNews(failed=failed), workers=1)
    passes = "cleanerd_cleaner_passes_total"
    assert exporter.registry.get_sample_value(passes, {"result": "error"}) == 1
    assert [e.topic for e in events.of("partition.uncleanable")] == ["a", "b"]


def test_the_states_follow_each_pass_not_only_each_cycle() -> None:
    """A partition's state for the metrics is the one its last pass left, told as the
    pass ended, until a cycle takes its states again (before its passes): a cycle's
    report has the states from before its cleaning. Before, a partition cleaned early
    in a cycle of hours kept its delay, growing, until the cycle after it ended."""
    exporter = MetricsExporter(MetricsConfig(listen="127.0.0.1:0"))
    events = RecordingPublisher()
    reporter = Reporter(exporter, lambda: events, lambda: NOW_MS)
    ma, mb = meta("a", "/d", [NOW_MS - 3_600_000, NOW_MS]), meta("b", "/d", [NOW_MS])
    a_before, b_before = state(ma), state(mb)
    a_after, b_after = state(ma, checkpoint=10), state(mb, checkpoint=5)
    a_again = state(ma, checkpoint=7)
    first = cycle_report(NOW_MS, states=(a_before, b_before))
    reporter.happened(CycleNews(taken=first), workers=1)
    reporter.happened(CycleNews(later_states=(a_after,)), workers=1)
    assert reporter.states(first) == (a_after, b_before)
    second = cycle_report(NOW_MS, states=(a_again, b_before))
    reporter.happened(CycleNews(taken=second), workers=1)  # after the first one's passes
    assert reporter.states(second) == (a_again, b_before)
    reporter.happened(CycleNews(later_states=(b_after,)), workers=1)
    assert reporter.states(second) == (a_again, b_after)


def test_the_pass_statistics_follow_each_pass() -> None:
    """The statistics the cleaner gauges are made of (Kafka's: over each worker's last
    round) are those of the last passes, one per worker, whichever cycle ran them, as
    each pass ends; they changed only at a cycle's end, which could be hours away."""
    exporter = MetricsExporter(MetricsConfig(listen="127.0.0.1:0"))
    events = RecordingPublisher()
    reporter = Reporter(exporter, lambda: events, lambda: NOW_MS)
    passes = [stats(read, read // 2, 0.1, 10) for read in (100, 200, 300)]
    tp = TopicPartition("a", 0)
    cleaned = [
        CleanedLog("/d", tp, "min.cleanable.dirty.ratio", None, 0, 0, 5, s, NOW_MS, NOW_MS)
        for s in passes
    ]
    reporter.happened(CycleNews(cleaned=(cleaned[0],)), workers=2)
    assert list(reporter.last_stats) == passes[:1]
    reporter.happened(CycleNews(cleaned=tuple(cleaned[1:])), workers=2)
    assert list(reporter.last_stats) == passes[1:]
