"""Tests of the UncleanablePartitions registry."""

from __future__ import annotations

from cleanerd.compaction.manager import UncleanablePartitions
from cleanerd.log.files import TopicPartition

A = TopicPartition("a", 0)
B = TopicPartition("b", 1)


def test_mark_reason_and_backoff() -> None:
    """A mark holds its reason until the backoff has passed."""
    r = UncleanablePartitions(backoff_ms=1000)
    r.mark(A, log_dir="/d", reason="CorruptRecordError: bad", now_ms=0)
    assert r.is_uncleanable(A, now_ms=999)
    assert r.reason(A) == "CorruptRecordError: bad"
    assert not r.is_uncleanable(A, now_ms=1000)
    assert r.reason(A) is None
    assert not r.is_uncleanable(B, now_ms=0)


def test_config_change_clears_mark() -> None:
    """A mark made under another config fingerprint no longer applies."""
    r = UncleanablePartitions()
    r.mark(A, log_dir="/d", reason="x", now_ms=0, config_fingerprint="v1")
    assert r.is_uncleanable(A, now_ms=1, config_fingerprint="v1")
    assert not r.is_uncleanable(A, now_ms=1, config_fingerprint="v2")
    assert len(r) == 0


def test_per_dir_view_and_vanished_partitions() -> None:
    """Marks are listed per log dir; vanished partitions are dropped."""
    r = UncleanablePartitions()
    r.mark(A, log_dir="/d1", reason="x", now_ms=0)
    r.mark(B, log_dir="/d2", reason="y", now_ms=0)
    assert set(r.in_dir("/d1")) == {A}
    r.retain_only([B])
    assert len(r) == 1
    r.clear(B)
    assert len(r) == 0
