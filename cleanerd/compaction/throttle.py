"""The shared I/O throttle of all cleaning passes (Kafka's Throttler).

`log.cleaner.io.max.bytes.per.second` bounds the bytes the cleaner reads (map build and
copy) and writes, together, across every worker. Callers report bytes as they go; once
more than the check interval (300 ms) has passed since the period began, or more bytes
were reported than the interval allows (a caller reporting a whole segment at once), the
observed rate is compared with the desired one and the caller sleeps just long enough to
bring the period's average down to it. The rate can be changed at any time (config reload) and
takes effect at the next check. The clock and the sleep are injected so tests never wait.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Final

CHECK_INTERVAL_MS: Final = 300
STOP_POLL_S: Final = 0.1
"""How often a throttled caller's sleep asks whether it is to stop."""
NS_PER_MS: Final = 1_000_000
NS_PER_S: Final = 1_000_000_000


class Throttler:
    """Sleeps callers so the observed byte rate stays at or below `desired_rate`.

    A rate of `math.inf` (Kafka's default Double.MAX) never sleeps.
    """

    def __init__(
        self,
        desired_rate: float,
        *,
        check_interval_ms: int = CHECK_INTERVAL_MS,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._desired_rate = self._validated(desired_rate)
        self._check_interval_ns = check_interval_ms * NS_PER_MS
        self._monotonic_ns = monotonic_ns
        self._sleep = sleep
        self._lock = threading.Lock()
        self._period_start_ns = monotonic_ns()
        self._observed = 0.0

    @staticmethod
    def _validated(rate: float) -> float:
        if not rate > 0:
            raise ValueError(f"throttle rate must be positive, got {rate}")
        return rate

    @property
    def desired_rate(self) -> float:
        """Bytes per second currently allowed."""
        return self._desired_rate

    def update_desired_rate(self, rate: float) -> None:
        """Change the allowed rate (a reconfiguration); effective from the next check."""
        self._desired_rate = self._validated(rate)

    def maybe_throttle(self, observed_bytes: int, stop: Callable[[], bool] | None = None) -> None:
        """Account `observed_bytes` and sleep if the period's rate is above the limit;
        with `stop`, a sleep ends early once it says so (polled every `STOP_POLL_S`): a
        pass being stopped does not wait out its throttle, seconds at a low rate, while
        the stop of the daemon or of `clean` waits for it."""
        if math.isinf(self._desired_rate):
            return
        with self._lock:
            self._observed += observed_bytes
            now = self._monotonic_ns()
            elapsed_ns = now - self._period_start_ns
            if self._observed <= 0:
                return
            # Kafka feeds its throttler a read buffer (256 KiB) at a time, so a check every
            # interval bounds the rate. Passes here report a whole segment per call (up to
            # 1 GiB): more than an interval's worth is checked at once, or a pass's last
            # segments, read within one interval, would never be paid for (measured: 4.6
            # MB/s through a 2 MB/s limit on five 4 MiB segments).
            within_budget = (
                self._observed <= self._desired_rate * self._check_interval_ns / NS_PER_S
            )
            if elapsed_ns <= self._check_interval_ns and within_budget:
                return
            rate = self._observed * NS_PER_S / max(elapsed_ns, 1)
            if rate > self._desired_rate:
                desired_per_ms = self._desired_rate / 1000.0
                sleep_ms = round(self._observed / desired_per_ms - elapsed_ns // NS_PER_MS)
                if sleep_ms > 0:
                    self._sleep_unless(sleep_ms / 1000.0, stop)
            self._period_start_ns = self._monotonic_ns()
            self._observed = 0.0

    def _sleep_unless(self, seconds: float, stop: Callable[[], bool] | None) -> None:
        if stop is None:
            self._sleep(seconds)
            return
        while seconds > 0 and not stop():
            step = min(seconds, STOP_POLL_S)
            self._sleep(step)
            seconds -= step
