"""Builders of Kafka-format partition dirs for tests.

Every builder writes real files through cleanerd's own log layer, so segments, indexes
and names are exactly what the daemon reads:

- `kv` makes a record (offsets are assigned on append);
- `build_log` creates `<log_dir>/<topic>-<partition>` with one segment per inner list of
  batches, rolling between segments;
- `write_segment` writes a single segment (optionally under a `.cleaned`/`.swap` suffix)
  from encoded batches, for leftover and recovery tests;
- `offsets_and_values` lists what a log holds, for assertions;
- `set_base_offset` damages a batch where no CRC sees it, its base offset;
- `settle_dir` dates a partition dir's last change back, and `partition_flocks` records
  the partition locks taken, for tests of what is decided without the lock.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from cleanerd.log.files import TopicPartition
from cleanerd.log.lock import PartitionLock
from cleanerd.log.partition_log import LogConfig, PartitionLog
from cleanerd.log.segment import LogSegment
from cleanerd.maintenance.report import CycleReport
from cleanerd.records.batch import encode_batch
from cleanerd.records.header import compute_crc
from cleanerd.records.record import Record, RecordHeader
from cleanerd.records.walker import scan_batches

DEFAULT_TP = TopicPartition("topic", 0)


def kv(
    key: str | bytes | None,
    value: str | bytes | None,
    *,
    timestamp: int = 0,
    headers: Sequence[tuple[str, bytes | None]] = (),
) -> Record:
    """A record with `key` and `value` (str is UTF-8 encoded; None stays null) and offset
    0, which `PartitionLog.append` replaces."""
    return Record(
        0,
        timestamp,
        key.encode() if isinstance(key, str) else key,
        value.encode() if isinstance(value, str) else value,
        tuple(RecordHeader(k, v) for k, v in headers),
    )


def build_log(
    log_dir: Path,
    segments: Sequence[Sequence[Sequence[Record]]],
    *,
    state_dir: Path,
    tp: TopicPartition = DEFAULT_TP,
    config: LogConfig | None = None,
) -> PartitionLog:
    """A partition whose segment i holds the batches `segments[i]` (each a list of
    records appended as one batch); every segment but the last is rolled. Offsets are
    contiguous from 0."""
    log_dir.mkdir(parents=True, exist_ok=True)
    plog = PartitionLog.create(log_dir, tp, config=config, state_dir=state_dir)
    for n, batches in enumerate(segments):
        for batch in batches:
            plog.append(batch)
        if n + 1 < len(segments):
            plog.roll()
    return plog


def write_segment(
    dir_path: Path,
    base_offset: int,
    batches: Sequence[bytes],
    *,
    suffix: str = "",
    index_interval_bytes: int = 4096,
    inactive: bool = True,
) -> LogSegment:
    """Write a segment at `base_offset` holding the encoded `batches`, with Kafka's
    indexes (final time-index entry included when `inactive`)."""
    segment = LogSegment.create(
        dir_path, base_offset, suffix=suffix, index_interval_bytes=index_interval_bytes
    )
    for data in batches:
        segment.append(data, list(scan_batches(data)))
    if inactive:
        segment.close_for_roll()
    return segment


def set_base_offset(path: Path, batch: int, value: int) -> int:
    """Overwrite the base offset of the `batch`-th batch (-1: the last) of the segment
    at `path` (which no CRC covers); returns the batch's position."""
    data = bytearray(path.read_bytes())
    position = [info.position for info in scan_batches(bytes(data), verify_crc=False)][batch]
    data[position : position + 8] = value.to_bytes(8, "big", signed=True)
    path.write_bytes(bytes(data))
    return position


def encode_records(records: Sequence[Record], base_offset: int) -> bytes:
    """One uncompressed v2 batch of `records` renumbered from `base_offset`."""
    numbered = [
        Record(base_offset + i, r.timestamp, r.key, r.value, r.headers)
        for i, r in enumerate(records)
    ]
    return encode_batch(numbered, base_offset=base_offset)


def offsets_and_values(plog: PartitionLog) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record of the log, in order."""
    return [(r.offset, r.key, r.value) for r in plog.records()]


def settle_dir(path: Path) -> None:
    """Date the dir's last change back ten seconds, as on a dir untouched for a while:
    a change within the last seconds vouches for nothing (`partition_log._dir_stamp`)."""
    past = path.stat().st_mtime_ns - 10_000_000_000
    os.utime(path, ns=(past, past))


def partition_flocks(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The partition lock files locked from now on (a re-entry locks nothing)."""
    taken: list[Path] = []
    real = PartitionLock._flock

    def counted(self: PartitionLock, deadline: float) -> int:
        taken.append(self.path)
        return real(self, deadline)

    monkeypatch.setattr(PartitionLock, "_flock", counted)
    return taken


def cycle_report(now_ms: int, **fields: Any) -> CycleReport:
    """A cycle's report at `now_ms` that did nothing, but for `fields`."""
    nothing: dict[str, Any] = {
        "rolled": (),
        "retention": (),
        "disk_usage": None,
        "cleaned": (),
        "failed": (),
        "skipped": (),
        "unlinked": (),
        "states": (),
    }
    return CycleReport(now_ms=now_ms, finished_ms=now_ms, **(nothing | fields))


def control_bit_on_first_batch(seg: Path) -> None:
    """Set the control bit on the segment's first batch, its CRC made to match: a
    framed, CRC-valid batch whose record is no control record."""
    data = bytearray(seg.read_bytes())
    size = 12 + int.from_bytes(data[8:12], "big")
    data[21:23] = (int.from_bytes(data[21:23], "big") | 0x20).to_bytes(2, "big")
    data[17:21] = compute_crc(bytes(data[:size])).to_bytes(4, "big")
    seg.write_bytes(bytes(data))
