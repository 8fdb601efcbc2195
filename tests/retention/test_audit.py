"""The retention-deadline audit over plain segment metadata (`retention.audit`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from cleanerd.config import BrokerConfig
from cleanerd.log.meta import PartitionMeta, SegmentMeta
from cleanerd.log.topic_config import TopicConfig
from cleanerd.retention.audit import (
    DamagedSegment,
    Hold,
    HoldReason,
    OverdueSegment,
    PendingFile,
    audit_retention,
    audits_retention,
)
from tests.retention.test_policy import HOUR, NOW, partition, seg

SLACK = 10 * 60_000


def topic(**overrides: Any) -> TopicConfig:
    base = dataclasses.replace(
        BrokerConfig().topic_defaults(), cleanup_policy=("delete",), retention_ms=24 * HOUR
    )
    return dataclasses.replace(base, **overrides)


def audit(meta: PartitionMeta, *, max_listed: int = 20, **overrides: Any) -> Any:
    return audit_retention(
        meta, topic(**overrides), now_ms=NOW, slack_ms=SLACK, max_listed=max_listed
    )


def test_segments_past_their_deadline_by_more_than_the_slack_are_violations() -> None:
    """Deadline = largest timestamp + retention.ms: a segment 5 minutes past it is past
    retention but within the slack; those past it by hours are violations, listed the
    most overdue first; the rules, run now, delete all three (due, nothing kept)."""
    meta = partition([30, 26, 0])
    meta = dataclasses.replace(
        meta,
        segments=(
            *meta.segments[:2],
            seg(20, 30, ts=NOW - 24 * HOUR - 5 * 60_000),
            *meta.segments[3:],
        ),
    )
    a = audit(meta)
    assert (a.segments, a.past_retention, a.past_retention_bytes) == (4, 3, 300)
    assert a.violations == 2
    assert a.most_overdue_ms == 6 * HOUR
    assert a.listed == (
        OverdueSegment(0, 100, NOW - 30 * HOUR, 6 * HOUR),
        OverdueSegment(10, 100, NOW - 26 * HOUR, 2 * HOUR),
    )
    assert (a.due, a.hold, a.damaged, a.failed) == (3, None, (), True)
    assert audit(meta, max_listed=1).listed == a.listed[:1]


def test_nothing_past_retention_is_no_violation() -> None:
    a = audit(partition([20, 10]))
    assert (a.past_retention, a.violations, a.most_overdue_ms, a.due, a.failed) == (
        0,
        0,
        None,
        0,
        False,
    )


def test_a_future_timestamp_keeps_every_later_segment_past_its_deadline() -> None:
    """Kafka's walk stops at a segment whose largest timestamp is in the future: the
    older data after it stays past its deadline, and the audit says where and why."""
    meta = partition([1, 48, 30])
    future = seg(0, 10, ts=NOW + HOUR)
    meta = dataclasses.replace(meta, segments=(future, *meta.segments[1:]))
    a = audit(meta)
    assert (a.violations, a.due) == (2, 0)
    end = meta.log_end_offset
    assert a.hold == Hold(0, HoldReason.FUTURE_TIMESTAMP, NOW + HOUR, 100, 10, end)


def test_a_segment_not_yet_expired_before_older_ones_keeps_them() -> None:
    """Timestamps that go back in time from one segment to the next: the walk stops at
    the first segment not past retention.ms."""
    a = audit(partition([1, 48, 30]))
    assert (a.violations, a.due) == (2, 0)
    assert a.hold is not None
    assert (a.hold.base_offset, a.hold.reason) == (0, HoldReason.NOT_EXPIRED)


def test_a_damaged_segment_keeps_the_later_ones_and_is_not_dated() -> None:
    meta = partition([48, 30])
    first = meta.segments[0]
    damaged = SegmentMeta.damaged(
        0,
        "corrupt record batch",
        size_bytes=first.size_bytes,
        index_bytes=(0, 0),
        last_modified_ms=NOW,
        inode=None,
    )
    a = audit(dataclasses.replace(meta, segments=(damaged, *meta.segments[1:])))
    assert (a.segments, a.violations, a.failed) == (2, 1, True)
    assert a.damaged == (DamagedSegment(0, "corrupt record batch"),)
    assert a.hold is not None
    assert (a.hold.base_offset, a.hold.reason) == (0, HoldReason.DAMAGE)
    assert a.hold.damage == "corrupt record batch"


def test_a_high_watermark_behind_keeps_what_it_does_not_cover() -> None:
    """A replica whose high watermark is inside the first segment: Kafka deletes
    nothing of it, however old."""
    a = audit(partition([48, 30], hw=5))
    assert (a.violations, a.due) == (2, 0)
    assert a.hold == Hold(0, HoldReason.HIGH_WATERMARK, NOW - 48 * HOUR, 100, 10, 5)


def test_an_active_segment_past_its_deadline_is_due_at_the_roll_the_rules_make() -> None:
    """Every segment past retention.ms, the active one too: the rules roll and delete
    them all, so nothing is kept."""
    meta = partition([48])
    active = seg(10, 11, ts=NOW - 30 * HOUR)
    a = audit(dataclasses.replace(meta, segments=(meta.segments[0], active)))
    assert (a.violations, a.due, a.hold) == (2, 2, None)


def test_an_empty_segment_has_no_deadline() -> None:
    """An empty active segment (its mtime an old roll's) holds no data to delete."""
    meta = partition([48], active_records=0)
    old_roll = dataclasses.replace(meta.segments[1], largest_timestamp_ms=NOW - 48 * HOUR)
    a = audit(dataclasses.replace(meta, segments=(meta.segments[0], old_roll)))
    assert (a.segments, a.violations, a.due) == (1, 1, 1)


@pytest.mark.parametrize(
    ("policy", "retention_ms", "audited"),
    [
        (("delete",), 0, True),
        (("compact", "delete"), 1, True),
        (("delete",), -1, False),
        (("compact",), 1, False),
    ],
)
def test_a_deadline_needs_delete_in_the_policy_and_a_retention_ms(
    policy: tuple[Any, ...], retention_ms: int, audited: bool
) -> None:
    assert audits_retention(topic(cleanup_policy=policy, retention_ms=retention_ms)) is audited


def test_files_pending_deletion_longer_than_the_delay_and_slack_are_stuck() -> None:
    """`file.delete.delay.ms` (one minute here) plus the slack after its rename, a
    `.deleted` file should be gone; the longest pending is listed first."""
    pending = [
        PendingFile("/d/b.log.deleted", 7, NOW - 60_000 - SLACK),
        PendingFile("/d/a.log.deleted", 5, NOW - 60_001 - SLACK),
    ]
    a = audit_retention(
        partition([1]),
        topic(file_delete_delay_ms=60_000),
        now_ms=NOW,
        slack_ms=SLACK,
        max_listed=20,
        pending=pending,
    )
    assert a.pending == (pending[1], pending[0])
    assert (a.stuck, a.violations, a.failed) == (1, 0, True)
