"""The daemon's events and pass counters for what a cycle did (`daemon/reporting.py`)."""

from __future__ import annotations

from cleanerd.config import MetricsConfig
from cleanerd.daemon.metrics.exporter import MetricsExporter
from cleanerd.daemon.reporting import Reporter
from cleanerd.log.files import TopicPartition
from cleanerd.maintenance.report import CycleNews, FailedLog
from tests.daemon.conftest import RecordingPublisher

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
