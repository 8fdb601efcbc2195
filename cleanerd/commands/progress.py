"""Progress of long command-line runs (`cleanerd clean`, `cleanerd audit`).

On a terminal: one line redrawn in place (carriage return), at most every
`TTY_INTERVAL_S`: a bar, segments and bytes done of the total, the rate and the ETA.
Anywhere else (a pipe, a log file, systemd): the same facts as a plain line every
`PLAIN_INTERVAL_S`, so a long run in a log shows it is alive without flooding it. The
final line is always written. Progress goes to stderr, leaving stdout to the report.

`render` is the pure formatting; `Progress` adds the clock and the stream. The clock is
injected, so tests need no sleeping. A run whose work is found as it goes (`clean`: the
passes a cycle schedules) grows the totals with `expect`; `TrackedEngine` does that for
every pass submitted to an engine, counting the segments each pass rewrites.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Final, TextIO

from cleanerd.compaction.cleaner import CleaningAborted, CleanResult
from cleanerd.engine.base import CleanJob, Engine
from cleanerd.log.files import TopicPartition

BAR_WIDTH: Final = 24
TTY_INTERVAL_S: Final = 0.2
PLAIN_INTERVAL_S: Final = 10.0
_UNITS: Final = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(n: float) -> str:
    """`n` bytes with a binary unit, e.g. `1.5 GiB`."""
    for unit in _UNITS:
        if abs(n) < 1024 or unit == _UNITS[-1]:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_duration(seconds: float) -> str:
    """`seconds` as H:MM:SS."""
    s = max(0, round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Where a run stands."""

    label: str
    segments_done: int
    segments_total: int
    bytes_done: int
    bytes_total: int
    elapsed_s: float
    segments_failed: int = 0


def render(s: Snapshot, *, bar: bool, ended: str | None = None) -> str:
    """One progress line: optional bar, counts, rate and ETA (`?` before any rate);
    `ended` ("done", "stopped") for the final line of a run, which ends there whatever
    its counts say (a torn tail's bytes are listed in the total, never read)."""
    share = s.bytes_done / s.bytes_total if s.bytes_total else 1.0
    share = min(max(share, 0.0), 1.0)
    parts = [s.label]
    if bar:
        filled = round(share * BAR_WIDTH)
        parts.append("[" + "#" * filled + "-" * (BAR_WIDTH - filled) + "]")
    parts.append(f"{share * 100:5.1f}%")
    noun = "segment" if s.segments_total == 1 else "segments"
    failed = f" ({s.segments_failed} failed)" if s.segments_failed else ""
    parts.append(f"{s.segments_done}/{s.segments_total} {noun}{failed}")
    parts.append(f"{human_bytes(s.bytes_done)}/{human_bytes(s.bytes_total)}")
    rate = s.bytes_done / s.elapsed_s if s.elapsed_s > 0 else 0.0
    parts.append(f"{human_bytes(rate)}/s")
    if ended == "stopped":
        parts.append(f"stopped after {human_duration(s.elapsed_s)}")
    elif ended == "done" or s.bytes_done >= s.bytes_total:
        parts.append(f"done in {human_duration(s.elapsed_s)}")
    elif rate > 0:
        parts.append(f"ETA {human_duration((s.bytes_total - s.bytes_done) / rate)}")
    else:
        parts.append("ETA ?")
    return " ".join(parts)


class Progress:
    """Reports a run of known size; `advance` as work is done, `finish` at the end.

    Args:
        label: what runs (`clean`, `audit`).
        segments: segments the run will read.
        total_bytes: their bytes.
        stream: where lines go (stderr by default).
        tty: draw the in-place bar; default: whether `stream` is a terminal.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        label: str,
        *,
        segments: int,
        total_bytes: int,
        stream: TextIO | None = None,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.segments_total = segments
        self.bytes_total = total_bytes
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.clock = clock
        self.started = clock()
        self.segments_done = 0
        self.segments_failed = 0
        self.bytes_done = 0
        self._last_draw = self.started
        self._finished = False

    def snapshot(self) -> Snapshot:
        """The current numbers."""
        return Snapshot(
            self.label,
            self.segments_done,
            self.segments_total,
            self.bytes_done,
            self.bytes_total,
            self.clock() - self.started,
            self.segments_failed,
        )

    def expect(self, *, segments: int = 0, size: int = 0) -> None:
        """Grow the totals by work just found."""
        self.segments_total += segments
        self.bytes_total += size

    def advance(self, *, segments: int = 0, size: int = 0, failed: bool = False) -> None:
        """Count `segments` and `size` bytes more as done (`failed`: their work failed,
        counted apart so that the line never calls a run with failures plainly done);
        redraw when due. Work done beyond the totals (segments a live broker wrote after
        they were counted) grows them: "257/249 segments" read as a bug."""
        self.segments_done += segments
        if failed:
            self.segments_failed += segments
        self.bytes_done += size
        self.segments_total = max(self.segments_total, self.segments_done)
        self.bytes_total = max(self.bytes_total, self.bytes_done)
        now = self.clock()
        if now - self._last_draw >= (TTY_INTERVAL_S if self.tty else PLAIN_INTERVAL_S):
            self._last_draw = now
            self._draw(final=False)

    def finish(self, *, failed: bool = False) -> None:
        """Write the final line (once): the run is done, or `failed` stopped it."""
        if not self._finished:
            self._finished = True
            self._draw(final=True, ended="stopped" if failed else "done")

    def _draw(self, *, final: bool, ended: str | None = None) -> None:
        line = render(self.snapshot(), bar=self.tty, ended=ended)
        if self.tty:
            self.stream.write("\r\x1b[2K" + line + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish(failed=exc[0] is not None)


def _failed(future: Future[CleanResult]) -> bool:
    """Whether a pass failed: it raised, but not because it was stopped (an interrupted
    `clean`, `CleaningAborted`), nor was it cancelled before it began."""
    if future.cancelled():
        return False
    error = future.exception()
    return error is not None and not isinstance(error, CleaningAborted)


class TrackedEngine:
    """An `Engine` that reports its clean passes to a `Progress`: a pass's segments below
    its first uncleanable offset are expected when it is submitted and done when it ends
    (whether it succeeded or not: the work is over either way; a pass that raised counts
    its segments as failed, one stopped does not)."""

    def __init__(self, engine: Engine, progress: Progress) -> None:
        self.engine = engine
        self.progress = progress

    @property
    def name(self) -> str:
        return self.engine.name

    @property
    def workers(self) -> int:
        return self.engine.workers

    @property
    def dead_workers(self) -> int:
        return self.engine.dead_workers

    def submit_clean(self, job: CleanJob) -> Future[CleanResult]:
        segs = [s for s in job.segments if s.base_offset < job.first_uncleanable]
        count, size = len(segs), sum(s.size_bytes for s in segs)
        self.progress.expect(segments=count, size=size)
        future = self.engine.submit_clean(job)
        future.add_done_callback(
            lambda f: self.progress.advance(segments=count, size=size, failed=_failed(f))
        )
        return future

    def flush(self) -> None:
        self.engine.flush()

    def abort(self, tp: TopicPartition) -> bool:
        return self.engine.abort(tp)

    def shutdown(self, *, abort: bool = False) -> None:
        self.engine.shutdown(abort=abort)
