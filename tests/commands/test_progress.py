"""Progress lines of long CLI runs: a bar on a terminal, periodic plain lines otherwise."""

from __future__ import annotations

import io
from concurrent.futures import Future
from pathlib import Path

import pytest

from cleanerd.commands.progress import (
    PLAIN_INTERVAL_S,
    Progress,
    Snapshot,
    TrackedEngine,
    human_bytes,
    human_duration,
    render,
)
from cleanerd.compaction.cleaner import CleanerConfig, CleanResult
from cleanerd.compaction.stats import CleanerStats
from cleanerd.engine.base import CleanJob
from cleanerd.log.files import TopicPartition
from cleanerd.log.meta import SegmentMeta

GIB = 1 << 30


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_units() -> None:
    """Bytes get binary units, durations H:MM:SS."""
    assert human_bytes(512) == "512 B"
    assert human_bytes(1.5 * GIB) == "1.5 GiB"
    assert human_duration(3725.4) == "1:02:05"


def test_render_counts_rate_and_eta() -> None:
    """A line carries the bar, the share, segments, bytes, rate and ETA."""
    line = render(Snapshot("clean", 3, 10, GIB // 4, GIB, 10.0), bar=True)
    assert line == (
        "clean [######------------------]  25.0% 3/10 segments 256.0 MiB/1.0 GiB "
        "25.6 MiB/s ETA 0:00:30"
    )
    assert "ETA ?" in render(Snapshot("audit", 0, 1, 0, 10, 0.0), bar=False)
    assert "done in 0:00:02" in render(Snapshot("audit", 1, 1, 10, 10, 2.0), bar=False)


def test_plain_output_is_periodic_and_final() -> None:
    """Off a terminal, a line at most every interval, and always a final one."""
    out, clock = io.StringIO(), Clock()
    p = Progress("audit", segments=4, total_bytes=400, stream=out, tty=False, clock=clock)
    p.advance(segments=1, size=100)
    assert out.getvalue() == ""
    clock.t += PLAIN_INTERVAL_S
    p.advance(segments=1, size=100)
    p.finish()
    p.finish()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("audit  50.0% 2/4 segments")
    assert "\r" not in out.getvalue()


def test_work_beyond_the_totals_grows_them() -> None:
    """Segments a live broker wrote after the totals were counted are done beyond them:
    the totals grow, so the line never reads "5/4 segments" or more than 100%."""
    out, clock = io.StringIO(), Clock()
    p = Progress("audit", segments=4, total_bytes=400, stream=out, tty=False, clock=clock)
    p.advance(segments=5, size=520)
    p.finish()
    assert out.getvalue().startswith("audit 100.0% 5/5 segments 520 B/520 B")


def test_terminal_output_redraws_in_place() -> None:
    """On a terminal the line is redrawn with a carriage return and ends with a newline."""
    out, clock = io.StringIO(), Clock()
    with Progress("clean", segments=2, total_bytes=200, stream=out, tty=True, clock=clock) as p:
        clock.t += 1
        p.advance(segments=2, size=200)
    text = out.getvalue()
    assert text.count("\r") == 2
    assert text.endswith("done in 0:00:01\n")
    assert "[########################]" in text


def test_the_final_line_says_the_run_ended_whatever_its_counts() -> None:
    """A run ends where it ends: bytes listed in the total but never read (a torn tail
    `audit` stops before) leave it short of 100%, and its last line still says done, not
    an ETA of 0:00:00; a run that raised says it stopped."""
    out, clock = io.StringIO(), Clock()
    with Progress("audit", segments=2, total_bytes=1000, stream=out, tty=False, clock=clock) as p:
        clock.t += 2
        p.advance(segments=2, size=997)
    assert out.getvalue().splitlines()[-1].endswith("done in 0:00:02")
    out = io.StringIO()

    def failing_run() -> None:
        with Progress(
            "clean", segments=2, total_bytes=200, stream=out, tty=False, clock=clock
        ) as p:
            p.advance(segments=1, size=100)
            raise RuntimeError("the pass failed")

    with pytest.raises(RuntimeError):
        failing_run()
    assert out.getvalue().splitlines()[-1].endswith("stopped after 0:00:00")


class OneShotEngine:
    """Hands out futures that the test resolves."""

    name = "fake"
    workers = 1
    dead_workers = 0

    def __init__(self) -> None:
        self.futures: list[Future[CleanResult]] = []

    def submit_clean(self, job: CleanJob) -> Future[CleanResult]:
        self.futures.append(Future())
        return self.futures[-1]


def _tracked() -> tuple[TrackedEngine, OneShotEngine, Progress, io.StringIO]:
    out = io.StringIO()
    progress = Progress("clean", segments=0, total_bytes=0, stream=out, tty=False)
    inner = OneShotEngine()
    return TrackedEngine(inner, progress), inner, progress, out  # type: ignore[arg-type]


def _job(partition: int, first_uncleanable: int) -> CleanJob:
    segs = (SegmentMeta(0, 10, 100, 0, 0, 0, 0, 0), SegmentMeta(10, 20, 50, 0, 0, 0, 0, 0))
    tp = TopicPartition("t", partition)
    return CleanJob(Path("/l"), Path("/s"), tp, segs, 0, first_uncleanable, 0, CleanerConfig())


def _result(end: int) -> CleanResult:
    return CleanResult(0, end, CleanerStats(0, 0, 0, 0, 0, 0, 0, 0.0, 0, 0, 0), ())


def test_tracked_engine_expects_then_counts_each_pass() -> None:
    """A submitted pass grows the totals by its segments below the uncleanable offset;
    its end counts them done."""
    engine, inner, progress, _ = _tracked()
    future = engine.submit_clean(_job(0, 10))
    assert (progress.segments_total, progress.bytes_total, progress.bytes_done) == (1, 100, 0)
    inner.futures[0].set_result(_result(10))
    assert future.done()
    assert (progress.segments_done, progress.bytes_done) == (1, 100)


def test_a_pass_that_failed_counts_its_segments_as_failed() -> None:
    """The final line of a run whose pass raised says how many segments failed, so it
    never reads as plainly done."""
    engine, inner, progress, out = _tracked()
    for partition in (0, 1):
        engine.submit_clean(_job(partition, 20))
    inner.futures[0].set_exception(OSError("disk gone"))
    inner.futures[1].set_result(_result(20))
    progress.finish()
    assert (progress.segments_done, progress.segments_failed) == (4, 2)
    assert "4/4 segments (2 failed)" in out.getvalue().splitlines()[-1]
