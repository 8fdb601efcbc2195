"""Each retention path acts in the first cycle at or after its due time, in a real-time
daemon whose revisit interval (an hour) cannot explain it, and right after a SIGHUP too.

The time rules (`retention.ms`, `file.delete.delay.ms`, a delete horizon) are deadlines
of the daemon's schedule (`CycleReport.next_due_ms`); the size and log-start-offset rules
fall due when the files change, which the watcher sees. For each path the test records
every cycle's report and checks that no cycle acted before the due time and that the
first cycle starting at or after it did, and, for deadlines, that its lateness is within
the slack the run itself shows: a tick plus the longest cycle seen.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cleanerd.compaction.horizon import HorizonCache
from cleanerd.config import Config
from cleanerd.daemon.service import CycleOutcome, Daemon
from cleanerd.log.checkpoint import LOG_START_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleanerd.log.log_dir import LogDir
from cleanerd.maintenance.report import CycleReport
from tests.builders import build_log, kv, offsets_and_values
from tests.daemon.conftest import NotifyReceiver, eventually, running
from tests.daemon.test_service import EVENTS, FAST, HOUR, USERS, _daemon, _now_ms, _settings, _write

LEAD_MS = 2_500
"""How far ahead of the daemon's start a rule falls due."""


def _recorded(daemon: Daemon) -> list[CycleReport]:
    """The report of every cycle the daemon runs, in order."""
    reports: list[CycleReport] = []
    original = daemon._run_cycle

    def run_cycle(config: Config, *, act: bool) -> CycleOutcome:
        outcome = original(config, act=act)
        reports.append(outcome.report)
        return outcome

    daemon._run_cycle = run_cycle  # type: ignore[method-assign]
    return reports


def _acting(reports: list[CycleReport], acted: Callable[[CycleReport], bool]) -> CycleReport:
    acting = [r for r in reports if acted(r)]
    assert acting, "no cycle acted"
    return acting[0]


def _deleted(reason: str) -> Callable[[CycleReport], bool]:
    def acted(report: CycleReport) -> bool:
        return any(
            d.reason.value == reason
            for o in report.retention
            if o.topic == EVENTS.topic
            for d in o.deletions
        )

    return acted


def _check_first_at_or_after(
    reports: list[CycleReport], acted: Callable[[CycleReport], bool], due_ms: int
) -> CycleReport:
    """No cycle before `due_ms` acted, and the first one starting at or after it did."""
    report = _acting(reports, acted)
    first_after = next(r for r in reports if r.now_ms >= due_ms)
    assert report.now_ms >= due_ms, f"acted {due_ms - report.now_ms} ms early"
    assert report is first_after, "a cycle at or after the due time did not act"
    return report


def _check_by_first_after(
    reports: list[CycleReport], acted: Callable[[CycleReport], bool], changed_ms: int
) -> CycleReport:
    """A cycle acted on a change made by `changed_ms`: the first cycle starting after it,
    or one that read the files while they changed."""
    report = _acting(reports, acted)
    later = [r for r in reports if r.now_ms >= changed_ms]
    assert not later or report.now_ms <= later[0].now_ms, "the first cycle after did not act"
    return report


def _check_slack(reports: list[CycleReport], report: CycleReport, due_ms: int) -> None:
    """A deadline acts within a tick plus the longest cycle of the run of its due time."""
    longest = max(r.finished_ms - r.now_ms for r in reports)
    slack = int(FAST.tick_s * 1000) + longest + 50  # 50 ms: the event loop's own latency
    assert report.now_ms - due_ms <= slack, (report.now_ms - due_ms, slack)


async def _hup(daemon: Daemon, config_path: Path, tmp_path: Path, data: dict[str, Any]) -> None:
    """SIGHUP with a changed file (a live key), and wait for the reload to apply."""
    data["log.cleaner.backoff.ms"] = 250
    _write(config_path, data)
    daemon.handle_hup()
    await eventually(lambda: daemon.config.log_cleaner_backoff_ms == 250, "the reload")


def _events_log(tmp_path: Path, timestamp: int, segments: int = 3) -> None:
    batches = [[[kv(None, f"e{n}" * 20, timestamp=timestamp)]] for n in range(segments)]
    build_log(tmp_path / "data", batches, state_dir=tmp_path / "state", tp=EVENTS)


def _base(tmp_path: Path, **events: Any) -> dict[str, Any]:
    data = _settings(tmp_path, **{"log.retention.check.interval.ms": HOUR})
    data["topics"]["events"].update(events)
    return data


@pytest.mark.parametrize("hup", [False, True], ids=["plain", "after-sighup"])
async def test_retention_ms_acts_at_its_due_time(
    tmp_path: Path, notify_socket: NotifyReceiver, hup: bool
) -> None:
    """Segments whose `retention.ms` falls due LEAD_MS after start are deleted by the
    first cycle at or after that instant, within the run's slack."""
    retention = 60_000
    timestamp = _now_ms() - retention + LEAD_MS
    _events_log(tmp_path, timestamp)
    data = _base(tmp_path, **{"retention.ms": retention})
    config_path = _write(tmp_path / "c.yaml", data)
    due = timestamp + retention + 1
    daemon, _ = _daemon(config_path, notify_socket)
    reports = _recorded(daemon)
    async with running(daemon):
        if hup:
            await asyncio.sleep(max(0.0, (due - _now_ms() - 400) / 1000))
            await _hup(daemon, config_path, tmp_path, data)
        await eventually(lambda: any(map(_deleted("retention.ms"), reports)), "the deletion")
    report = _check_first_at_or_after(reports, _deleted("retention.ms"), due)
    _check_slack(reports, report, due)


@pytest.mark.parametrize("hup", [False, True], ids=["plain", "after-sighup"])
async def test_file_delete_delay_unlinks_at_its_due_time(
    tmp_path: Path, notify_socket: NotifyReceiver, hup: bool
) -> None:
    """The `.deleted` files of the startup cycle's deletions are unlinked by the first
    cycle at or after `file.delete.delay.ms`, and not before."""
    _events_log(tmp_path, _now_ms() - 3 * HOUR)
    data = _base(tmp_path, **{"file.delete.delay.ms": LEAD_MS})
    config_path = _write(tmp_path / "c.yaml", data)
    daemon, _ = _daemon(config_path, notify_socket)
    reports = _recorded(daemon)
    async with running(daemon):
        await eventually(lambda: any(map(_deleted("retention.ms"), reports)), "the deletion")
        deleting = _acting(reports, _deleted("retention.ms"))
        due = deleting.now_ms + LEAD_MS
        assert list((tmp_path / "data" / str(EVENTS)).glob("*.deleted"))
        if hup:
            await asyncio.sleep(max(0.0, (due - _now_ms() - 400) / 1000))
            await _hup(daemon, config_path, tmp_path, data)
        await eventually(lambda: any(r.unlinked for r in reports), "the unlink")
    report = _check_first_at_or_after(reports, lambda r: bool(r.unlinked), due)
    _check_slack(reports, report, due)
    assert not list((tmp_path / "data" / str(EVENTS)).glob("*.deleted"))


@pytest.mark.parametrize("hup", [False, True], ids=["plain", "after-sighup"])
async def test_delete_horizon_removes_tombstones_at_its_due_time(
    tmp_path: Path, notify_socket: NotifyReceiver, hup: bool
) -> None:
    """The startup pass keeps the tombstones and stamps their horizon (now +
    `delete.retention.ms`); the first cycle at or after the horizon cleans again, with no
    new write, and removes them."""
    now = _now_ms()
    values = [[[kv(f"k{i}", f"v{n}", timestamp=now) for i in range(10)]] for n in range(2)]
    tombstones = [[kv(f"k{i}", None, timestamp=now) for i in range(5)]]
    active = [[kv("k9", "v3", timestamp=now)]]
    build_log(
        tmp_path / "data", [*values, tombstones, active], state_dir=tmp_path / "state", tp=USERS
    )
    data = _base(tmp_path)
    data["topics"]["users"]["delete.retention.ms"] = LEAD_MS
    config_path = _write(tmp_path / "c.yaml", data)
    daemon, _ = _daemon(config_path, notify_socket)
    reports = _recorded(daemon)

    def cleaned(r: CycleReport) -> bool:
        return any(c.tp == USERS for c in r.cleaned)

    with LogDir.open(tmp_path / "data", observe=True, state_dir=tmp_path / "reader") as reader:
        async with running(daemon):
            await eventually(lambda: any(map(cleaned, reports)), "the first pass")
            plog = reader.open_partition(USERS)
            horizons = [h.earliest_ms for h in HorizonCache().partition(plog)]
            due = min(h for h in horizons if h is not None)
            assert any(v is None for _, _, v in offsets_and_values(plog)), "tombstones kept"
            if hup:
                await asyncio.sleep(max(0.0, (due - _now_ms() - 400) / 1000))
                await _hup(daemon, config_path, tmp_path, data)
            await eventually(
                lambda: any(cleaned(r) and r.now_ms >= due for r in reports), "the second pass"
            )
            plog.refresh()
            assert all(v is not None for _, _, v in offsets_and_values(plog)), "tombstones left"
    first_pass = _acting(reports, cleaned)
    report = _check_first_at_or_after([r for r in reports if r is not first_pass], cleaned, due)
    _check_slack(reports, report, due)


@pytest.mark.parametrize("hup", [False, True], ids=["plain", "after-sighup"])
async def test_retention_bytes_acts_in_the_first_cycle_after_the_append(
    tmp_path: Path, notify_socket: NotifyReceiver, hup: bool
) -> None:
    """A producer (`cleanerd produce`, its own process, through the owner's partition
    lock) takes the partition over `retention.bytes`: the first cycle starting after its
    last append deletes the oldest segment, if an earlier one did not already."""
    _events_log(tmp_path, _now_ms(), segments=2)
    with LogDir.open(tmp_path / "data", observe=True, state_dir=tmp_path / "r") as reader:
        meta = reader.open_partition(EVENTS).meta()
    oldest, total = meta.segments[0].size_bytes, sum(s.size_bytes for s in meta.segments)
    data = _base(tmp_path, **{"retention.bytes": total + 100})
    config_path = _write(tmp_path / "c.yaml", data)
    daemon, _ = _daemon(config_path, notify_socket)
    reports = _recorded(daemon)
    async with running(daemon):
        await eventually(lambda: bool(reports), "the startup cycle")
        assert not any(map(_deleted("retention.bytes"), reports))
        lines = [
            json.dumps({"key": None, "value": "p" * 100}) for _ in range((oldest + 200) // 100)
        ]
        producer = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cleanerd", "produce", "-c", str(config_path), str(EVENTS),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        await producer.communicate("\n".join(lines).encode())
        assert producer.returncode == 0
        written = _now_ms()
        if hup:
            await _hup(daemon, config_path, tmp_path, data)
        await eventually(lambda: any(map(_deleted("retention.bytes"), reports)), "the deletion")
    _check_by_first_after(reports, _deleted("retention.bytes"), written)


@pytest.mark.parametrize("hup", [False, True], ids=["plain", "after-sighup"])
async def test_log_start_offset_acts_in_the_first_cycle_after_the_checkpoint(
    tmp_path: Path, notify_socket: NotifyReceiver, hup: bool
) -> None:
    """A log start offset raised in `log-start-offset-checkpoint` (a DeleteRecords
    result) while the daemon runs: the first cycle starting after the write deletes the
    segments below it, and the new start survives the daemon's stop."""
    _events_log(tmp_path, _now_ms(), segments=4)
    data = _base(tmp_path)
    config_path = _write(tmp_path / "c.yaml", data)
    daemon, _ = _daemon(config_path, notify_socket)
    reports = _recorded(daemon)
    checkpoint = OffsetCheckpointFile(tmp_path / "data" / LOG_START_OFFSET_CHECKPOINT)
    async with running(daemon):
        await eventually(lambda: bool(reports), "the startup cycle")
        checkpoint.write({EVENTS: 2})
        written = _now_ms()
        if hup:
            await _hup(daemon, config_path, tmp_path, data)
        await eventually(lambda: any(map(_deleted("log.start.offset"), reports)), "the deletion")
    report = _check_by_first_after(reports, _deleted("log.start.offset"), written)
    (outcome,) = [o for o in report.retention if o.topic == EVENTS.topic]
    assert [d.base_offset for d in outcome.deletions] == [0, 1]
    with LogDir.open(tmp_path / "data", state_dir=tmp_path / "state") as reopened:
        assert reopened.open_partition(EVENTS).log_start_offset == 2
