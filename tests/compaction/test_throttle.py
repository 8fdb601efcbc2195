"""Tests of the shared Throttler (ref 4.15, scenario 44)."""

from __future__ import annotations

import math

import pytest

from cleanerd.compaction.throttle import Throttler


class Clock:
    def __init__(self) -> None:
        self.ns = 0
        self.slept: list[float] = []

    def now(self) -> int:
        return self.ns

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.ns += int(s * 1e9)


def test_sleeps_to_bring_rate_down() -> None:
    """After the check interval, a rate above the limit sleeps to the desired average."""
    c = Clock()
    t = Throttler(1000.0, monotonic_ns=c.now, sleep=c.sleep)
    c.ns = 400_000_000
    t.maybe_throttle(1000)
    assert c.slept == [pytest.approx(0.6)]


def test_a_caller_that_is_to_stop_sleeps_no_longer() -> None:
    """With `stop`, the sleep goes by slices of 0.1 s, and ends once `stop` says so: a
    pass being stopped (a daemon's or an interrupted `clean`'s) does not wait out a
    throttle of seconds. Without it the sleep is whole, as Kafka's."""
    c = Clock()
    t = Throttler(1000.0, monotonic_ns=c.now, sleep=c.sleep)
    c.ns = 400_000_000
    t.maybe_throttle(3000, stop=lambda: len(c.slept) >= 3)
    assert c.slept == [pytest.approx(0.1)] * 3
    c.slept.clear()
    c.ns += 400_000_000
    t.maybe_throttle(1000, stop=lambda: False)
    assert sum(c.slept) == pytest.approx(0.6)
    assert max(c.slept) == pytest.approx(0.1)


def test_no_sleep_below_rate_or_before_interval() -> None:
    """No sleep before the interval ends (bytes within its allowance) or when under the
    limit."""
    c = Clock()
    t = Throttler(1000.0, monotonic_ns=c.now, sleep=c.sleep)
    c.ns = 100_000_000
    t.maybe_throttle(300)
    assert c.slept == []
    c.ns = 10_000_000_000
    t.maybe_throttle(1)
    assert c.slept == []


def test_more_than_an_interval_allows_is_paid_for_at_once() -> None:
    """Whole segments reported within one interval (a pass's last reads) sleep at once:
    five chunks of 4 MB 50 ms apart at 2 MB/s take 10 s, as the limit says (counted from
    the throttler's start: the idle second before the pass is in its first period, as in
    Kafka). Checked only every interval, the last four went through unpaid, in 2.2 s."""
    c = Clock()
    t = Throttler(2_000_000, monotonic_ns=c.now, sleep=c.sleep)
    c.ns = 1_000_000_000  # made a second before the pass
    for _ in range(5):
        c.ns += 50_000_000
        t.maybe_throttle(4_000_000)
    assert c.ns / 1e9 == pytest.approx(10.0, abs=0.1)


def test_reconfigure_changes_rate_and_inf_never_sleeps() -> None:
    """Scenario 44: the desired rate can change at runtime; inf never sleeps."""
    c = Clock()
    t = Throttler(10_000_000, monotonic_ns=c.now, sleep=c.sleep)
    t.update_desired_rate(20_000_000)
    assert t.desired_rate == 20_000_000
    t.update_desired_rate(math.inf)
    c.ns = 10**9
    t.maybe_throttle(10**12)
    assert c.slept == []
    with pytest.raises(ValueError, match="positive"):
        t.update_desired_rate(0)
