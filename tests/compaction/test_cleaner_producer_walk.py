"""The pass's producer walk (`cleaner._producer_columns`): the header columns of every
batch with a producer id, read by a kernel, against a walk header by header."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from cleanerd.compaction import cleaner
from cleanerd.compaction.cleaner import CleanerConfig, _producer_columns
from cleanerd.compaction.producers import ProducerBatch, ProducerColumns
from cleanerd.errors import CorruptRecordError
from cleanerd.log.partition_log import PartitionLog
from cleanerd.records.batch import decode_batch, encode_batch
from cleanerd.records.control import NO_CONTROL_RECORD, control_type
from cleanerd.records.header import LEGACY_V0_MIN_SIZE, LOG_OVERHEAD, Buffer, unpack_header
from cleanerd.records.record import Record
from cleanerd.records.walker import ANY_OFFSETS, OffsetRange, Window
from tests.compaction.conftest import TP, T, clean, k
from tests.compaction.test_cleaner_legacy import legacy

# (producer id or -1, epoch, transactional, control type or None for data, records)
_SPEC = st.tuples(
    st.sampled_from([-1, 0, 7, 2**40]),
    st.integers(0, 3),
    st.booleans(),
    st.sampled_from([None, None, 0, 1, 5]),
    st.integers(1, 3),
    st.booleans(),
)


def _segment(specs: list[tuple[int, int, bool, int | None, int, bool]], tail: int) -> bytes:
    parts, offset = [], 0
    for pid, epoch, txn, kind, n, old in specs:
        if old:  # a legacy entry, stepped over
            parts.append(legacy([(offset, b"k", b"v")], codec=0))
            offset += 1
            continue
        if kind is not None:
            records = [Record(offset, 9, kind.to_bytes(4, "big"), b"\x00" * 6)]
        else:
            records = [Record(offset + i, 10 + i, b"k%d" % i, b"v") for i in range(n)]
        parts.append(
            encode_batch(
                records,
                base_offset=offset,
                producer_id=pid,
                producer_epoch=epoch if pid >= 0 else -1,
                base_sequence=0 if pid >= 0 else -1,
                is_transactional=txn or kind is not None,
                is_control=kind is not None,
            )
        )
        offset += len(records)
    raw = b"".join(parts)
    first = LOG_OVERHEAD + int.from_bytes(raw[8:12], "big") if raw else 0
    return raw + raw[: min(tail, first - 1)]  # an incomplete entry ends the walk


def _reference(raw: bytes) -> list[ProducerBatch]:
    out, p = [], 0
    while len(raw) - p >= LOG_OVERHEAD + 4:
        size = LOG_OVERHEAD + int.from_bytes(raw[p + 8 : p + 12], "big", signed=True)
        if size < LEGACY_V0_MIN_SIZE or size > len(raw) - p:
            break
        if raw[p + 16] == 2:
            h = unpack_header(raw, p)
            if h.producer_id >= 0:
                kind = None
                if h.is_control:
                    kind = int(control_type(decode_batch(raw, p).records[0]))
                out.append(
                    ProducerBatch(
                        h.producer_id,
                        h.producer_epoch,
                        h.last_offset,
                        h.max_timestamp,
                        h.is_transactional,
                        h.is_control,
                        kind,
                    )
                )
        p += size
    return out


@given(st.lists(_SPEC, max_size=12), st.integers(0, 70))
@settings(max_examples=150, deadline=None)
def test_producer_columns_match_a_header_walk(
    specs: list[tuple[int, int, bool, int | None, int, bool]], tail: int
) -> None:
    """Every v2 batch with a producer id, in order, with its marker's type; legacy entries
    and batches without producer id skipped; the walk stops at an incomplete entry."""
    raw = _segment(specs, tail)
    got = _producer_columns(raw, Window(0, len(raw), ANY_OFFSETS), Path("seg.log"))
    want = ProducerColumns.of(_reference(raw))
    for name in ("producer_id", "producer_epoch", "last_offset", "max_timestamp"):
        assert getattr(got, name).tolist() == getattr(want, name).tolist(), name
    assert got.is_transactional.tolist() == want.is_transactional.tolist()
    assert got.is_control.tolist() == want.is_control.tolist()
    controls = want.is_control
    assert got.control_type[controls].tolist() == want.control_type[controls].tolist()
    assert NO_CONTROL_RECORD not in got.control_type[controls].tolist()
    assert np.all(got.producer_id >= 0)


def _batch(offset: int, producer_id: int = 7) -> bytes:
    return encode_batch(
        [Record(offset, 10, b"k", b"v")],
        base_offset=offset,
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=0,
    )


@pytest.mark.parametrize(
    ("offsets", "window", "message"),
    [
        ([5, 6, 6], OffsetRange.of_segment(5, 10), "base offset 6 is not above the previous"),
        ([5, 6, 10], OffsetRange.of_segment(5, 10), "not below the next segment's base offset 10"),
        ([5, 6, 3], OffsetRange.of_segment(5, 10), "base offset 3 is not above the previous"),
        ([4, 5, 6], OffsetRange.of_segment(5, 10), "last offset 4 is below the segment's base"),
        ([5, 6, 2**40], OffsetRange.of_segment(5), f"more than {2**31 - 1} past the segment's"),
    ],
)
def test_the_producer_walk_refuses_offsets_outside_the_segment(
    offsets: list[int], window: OffsetRange, message: str
) -> None:
    """No CRC covers a base offset: the producer walk, which reads batches no decode of
    the pass reaches (the uncleanable end of the log), checks every batch's offsets as
    every other walk of a segment does, and names the file and the batch's position."""
    batches = [_batch(offset, producer_id=-1 if i == 0 else 7) for i, offset in enumerate(offsets)]
    raw = b"".join(batches)
    position = len(raw) - len(batches[-1]) if offsets[0] >= window.base else 0
    with pytest.raises(CorruptRecordError) as caught:
        _producer_columns(raw, Window(0, len(raw), window), Path("/logs/t-0/0005.log"))
    assert message in str(caught.value)
    assert f"/logs/t-0/0005.log at position {position}:" in str(caught.value)


# (producer, epoch, transactional, what follows: None, or commit/abort marker)
_TXN_STEP = st.tuples(
    st.sampled_from([3, 4, 5]),
    st.integers(0, 1),
    st.booleans(),
    st.sampled_from([None, True, False]),
    st.integers(0, 4),
)


def _producer_log(
    root: Path, steps: list[tuple[int, int, bool, bool | None, int]], roll_every: int
) -> Path:
    """A partition written through the log library (a producer snapshot at each roll):
    idempotent and transactional batches of a few producers over a few keys, markers
    with epoch bumps, tombstones. A producer with an open transaction writes only
    transactional batches until its marker, as Kafka's broker requires (it refuses any
    other write, InvalidTxnStateException)."""
    (root / "logs").mkdir(parents=True)
    plog = PartitionLog.create(root / "logs", TP, state_dir=root / "state")
    seq: dict[tuple[int, int], int] = {}
    open_txn: set[int] = set()
    for i, (pid, epoch, txn, marker, key) in enumerate(steps):
        value = None if key == 4 else b"v%d" % i
        record = [Record(offset=0, timestamp=T - 1000 + i, key=k(key % 3), value=value)]
        n = seq.get((pid, epoch), 0)
        seq[(pid, epoch)] = n + 1
        txn = txn or pid in open_txn
        plog.append(
            record, producer_id=pid, producer_epoch=epoch, base_sequence=n, is_transactional=txn
        )
        if txn:
            open_txn.add(pid)
        if marker is not None:
            plog.append_end_txn_marker(pid, epoch, commit=marker, timestamp=T - 1000 + i)
            open_txn.discard(pid)
        if i % roll_every == roll_every - 1:
            plog.roll()
    plog.roll()
    return plog.dir


@given(st.lists(_TXN_STEP, min_size=1, max_size=30), st.integers(1, 8))
@settings(max_examples=40, deadline=None)
def test_a_pass_from_the_latest_snapshot_writes_what_a_walk_of_every_batch_writes(
    steps: list[tuple[int, int, bool, bool | None, int]], roll_every: int
) -> None:
    """The pass takes producer state from the partition's latest snapshot and walks only
    the batches after it; its output equals that of a pass which, without snapshots,
    walks every batch."""
    with tempfile.TemporaryDirectory() as tmp:
        built = _producer_log(Path(tmp) / "built", steps, roll_every)
        walked_all = Path(tmp) / "all" / built.name
        shutil.copytree(built, walked_all)
        for snapshot in walked_all.glob("*.snapshot"):
            snapshot.unlink()
        config = CleanerConfig(
            segment_bytes=1024 * 1024, delete_retention_ms=0, producer_id_expiration_ms=985
        )  # producers idle since the first 15 steps expire, unless a transaction is open
        for d in (built, walked_all):
            clean(d, config=config)
            clean(d, config=config, now_ms=T + 1)  # past the horizons the first one set
        logs = sorted(p.name for p in built.glob("*.log"))
        assert logs == sorted(p.name for p in walked_all.glob("*.log"))
        for name in logs:
            assert (built / name).read_bytes() == (walked_all / name).read_bytes(), name


_STEPS = [(3 + i % 3, 0, i % 2 == 0, i % 4 == 0 if i % 2 == 0 else None, i) for i in range(24)]
"""Three producers, every other batch transactional, a commit or abort after some."""


def _walked_last_offsets(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The last offsets of the batches whose producer headers the pass reads (filled
    as it reads them)."""
    walked: list[int] = []
    real = cleaner._producer_columns

    def counting(raw: Buffer, window: Window, path: Path) -> ProducerColumns:
        columns = real(raw, window, path)
        walked.extend(columns.last_offset.tolist())
        return columns

    monkeypatch.setattr(cleaner, "_producer_columns", counting)
    return walked


def test_the_pass_walks_only_the_batches_after_the_latest_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition written through the log library has a snapshot at its last roll: the
    pass reads the producer headers of the batch appended since, and of no other."""
    d = _producer_log(tmp_path, _STEPS, 6)
    snapshot_at = max(int(p.stem) for p in d.glob("*.snapshot"))
    plog = PartitionLog.open(d, state_dir=tmp_path / "state")
    plog.append([Record(offset=0, timestamp=T, key=k(1), value=b"tail")], producer_id=3)
    walked = _walked_last_offsets(monkeypatch)
    clean(d)
    assert walked == [snapshot_at]  # the tail batch: no segment below the snapshot is read


def test_a_damaged_snapshot_is_named_and_the_pass_takes_the_one_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot whose CRC fails is logged by name and skipped, as the log skips it:
    the pass starts from the previous snapshot and walks the batches after that."""
    d = _producer_log(tmp_path, _STEPS, 6)
    older, newest = sorted(d.glob("*.snapshot"))[-2:]
    newest.write_bytes(newest.read_bytes()[:-1] + b"\x00")
    walked = _walked_last_offsets(monkeypatch)
    with capture_logs() as logs:
        clean(d)
    warnings = [e for e in logs if e["event"] == "producer_snapshot.unreadable"]
    assert [e["path"] for e in warnings] == [str(newest)]
    assert "CRC mismatch" in warnings[0]["error"]
    assert min(walked) == int(older.stem)  # from the older snapshot on
