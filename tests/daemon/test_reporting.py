"""The daemon's events and pass counters for what a cycle did (`daemon/reporting.py`)."""

from __future__ import annotations

from cleanerd.config import MetricsConfig
from cleanerd.daemon.metrics.exporter import MetricsExporter
from cleanerd.daemon.reporting import Reporter
from cleanerd.log.files import TopicPartition
from cleanerd.maintenance.report import CycleNews, FailedLog
from tests.builders import cycle_report
from tests.daemon.conftest import RecordingPublisher
from tests.daemon.metrics.test_model import meta, state

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
    reporter.happened(CycleNews(failed=failed))
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
    reporter.happened(CycleNews(taken=first))
    reporter.happened(CycleNews(later_states=(a_after,)))
    assert reporter.states(first) == (a_after, b_before)
    reporter.cycle(first, workers=1)  # it ended: the state its pass left still holds
    assert reporter.states(first) == (a_after, b_before)
    second = cycle_report(NOW_MS, states=(a_again, b_before))
    reporter.happened(CycleNews(taken=second))  # taken after the first cycle's passes
    assert reporter.states(second) == (a_again, b_before)
    reporter.happened(CycleNews(later_states=(b_after,)))
    assert reporter.states(second) == (a_again, b_after)
