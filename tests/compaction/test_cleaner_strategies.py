"""KIP-280 strategies through the whole pass: versions decide, the clean section can win,
and the round's last offset slot survives when an older record wins."""

from __future__ import annotations

import struct

import pytest

from cleanerd.compaction.cleaner import CleanerConfig
from cleanerd.compaction.strategy import resolve_strategy
from cleanerd.records.record import RecordHeader
from tests.compaction.conftest import LONG_MAX, LogBuilder, clean, k, read_batches, view


def config(name: str) -> CleanerConfig:
    return CleanerConfig(producer_id_expiration_ms=LONG_MAX, strategy=resolve_strategy(name, "v"))


def version(v: int | bytes) -> tuple[RecordHeader, ...]:
    raw = v if isinstance(v, bytes) else struct.pack(">q", v)
    return (RecordHeader("v", raw),)


def test_timestamp_strategy_older_clean_record_beats_newer_dirty(log: LogBuilder) -> None:
    """An older record in the clean section with a higher timestamp wins; the newer dirty
    one goes, and the round's last slot stays as an empty batch."""
    log.append([(k(1), b"old-high")], timestamps=[9_000])
    log.append([(k(2), b"x")], timestamps=[1_000])
    log.roll()
    log.append([(k(9), b"y")], timestamps=[1_000])
    d = log.write()
    end = clean(d, config=config("timestamp")).end_offset
    assert end == 2
    log.segments = log.segments[-1:]
    log.append([(k(1), b"new-low")], timestamps=[2_000])
    log.roll()
    log.append([(k(7), b"z")], timestamps=[1_000])
    log.write()
    clean(d, first_dirty=end, config=config("timestamp"))
    batches = read_batches(d)
    values = {r.key: r.value for b in batches for r in b.records}
    assert values[k(1)] == b"old-high"
    assert [(b.header.last_offset, len(b.records)) for b in batches][-3:] == [
        (2, 1),
        (3, 0),
        (4, 1),
    ]


@pytest.mark.parametrize("name", ["timestamp", "header"])
def test_aborted_data_below_the_dirty_range_beats_no_winner(log: LogBuilder, name: str) -> None:
    """An aborted record in the clean section, with a higher timestamp or version than
    its key's live record in the dirty range, is no contender: it goes (aborted data
    always does) and the live record stays. It won, and the live record was deleted."""
    log.append([(k(1), b"aborted")], pid=7, txn=True, timestamps=[9_000], headers=[version(9)])
    log.abort(7)
    log.roll()
    log.append([(k(1), b"live")], timestamps=[1_000], headers=[version(1)])
    log.append([(k(2), b"x")], timestamps=[1_000])
    log.roll()
    log.append([(k(9), b"y")], timestamps=[1_000])
    d = log.write()
    clean(d, first_dirty=2, config=config(name))
    values = [(r.key, r.value) for b in read_batches(d) for r in b.records if r.key == k(1)]
    assert values == [(k(1), b"live")]


def test_header_strategy_rules(log: LogBuilder) -> None:
    """Header versions: present beats absent, higher wins, ties go to the later offset,
    the last occurrence counts and a non-8-byte value counts as absent."""
    log.append([(k(1), b"v5")], headers=[version(5)])
    log.append([(k(1), b"none")])
    log.append([(k(2), b"v3-first")], headers=[version(3)])
    log.append([(k(2), b"v3-second")], headers=[version(3)])
    log.append([(k(3), b"last-counts")], headers=[version(9) + version(1)])
    log.append([(k(3), b"v2")], headers=[version(2)])
    log.append([(k(4), b"v0")], headers=[version(0)])
    log.append([(k(4), b"short")], headers=[version(b"\x07")])
    log.append([(k(8), b"end")])
    log.roll()
    d = log.write()
    clean(d, config=config("header"))
    values = {r.key: r.value for b in read_batches(d) for r in b.records}
    assert values == {k(1): b"v5", k(2): b"v3-second", k(3): b"v2", k(4): b"v0", k(8): b"end"}


def test_offset_strategy_ignores_versions(log: LogBuilder) -> None:
    """The default strategy keeps the latest offset whatever the timestamps."""
    log.append([(k(1), b"a")], timestamps=[9_000])
    log.append([(k(1), b"b")], timestamps=[1_000])
    log.roll()
    d = log.write()
    clean(d, config=config("offset"))
    assert view(d).keys == [k(1)]
    assert read_batches(d)[0].records[0].value == b"b"
