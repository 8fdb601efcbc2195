"""State the log layer derives from walked batch tables (producer state, index
entries) equals the batch-at-a-time rules it replaces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.log.index import IndexBuilder, OffsetIndex, TimeIndex
from cleanerd.log.partition_log import PartitionLog
from cleanerd.log.producer_state import ProducerEntry, ProducerState
from cleanerd.records.batch import encode_batch, encode_empty_batch, iter_records
from cleanerd.records.control import ControlRecordType, encode_end_txn_marker
from cleanerd.records.record import Record
from cleanerd.records.scan import BatchInfo
from cleanerd.records.walker import walk

PRODUCER_ID = st.one_of(st.integers(-1, 3), st.sampled_from([2**20, 2**40, 2**40 + 1, 2**62 + 3]))
"""Few producers (so that each has several batches), and ids a hash of their low bits
would collide (the fold finds producers through a hash table)."""
BATCH = st.tuples(PRODUCER_ID, st.booleans(), st.booleans(), st.integers(0, 2))


def kafka_rules(state: dict[int, ProducerEntry], info: BatchInfo, data: bytes) -> None:
    """Kafka's ProducerAppendInfo and ProducerStateEntry, one batch at a time (the
    reference): an epoch change drops the entry's batch metadata; a control batch
    without a record changes nothing."""
    h = info.header
    assert h is not None
    if h.producer_id < 0 or (h.is_control and h.records_count == 0):
        return
    e = state.setdefault(h.producer_id, ProducerEntry(h.producer_id))
    if e.epoch != h.producer_epoch:
        e.last_sequence, e.last_offset, e.offset_delta = -1, -1, 0
    e.epoch, e.timestamp = h.producer_epoch, h.max_timestamp
    if h.is_control:
        value = next(iter_records(data, info)).value
        assert value is not None
        e.coordinator_epoch = int.from_bytes(value[2:6], "big", signed=True)
        e.txn_first_offset = -1
        return
    e.last_sequence = (h.base_sequence + h.last_offset_delta) % 2**31
    e.last_offset, e.offset_delta = h.last_offset, h.last_offset_delta
    if h.is_transactional and e.txn_first_offset < 0:
        e.txn_first_offset = h.base_offset


def _batch(i: int, pid: int, txn: bool, control: bool, epoch: int) -> bytes:
    offset = 100 + 2 * i
    producer_epoch = epoch if pid >= 0 else -1
    if control and pid >= 0 and i % 4 == 3:  # a marker a cleaner emptied
        return encode_empty_batch(
            base_offset=offset,
            last_offset_delta=0,
            max_timestamp=10 + i,
            producer_id=pid,
            producer_epoch=producer_epoch,
            is_transactional=True,
            is_control=True,
        )
    if control and pid >= 0:
        record = encode_end_txn_marker(
            ControlRecordType.COMMIT, 7 + i, offset=offset, timestamp=10 + i
        )
        return encode_batch(
            [record],
            base_offset=offset,
            is_transactional=True,
            is_control=True,
            producer_id=pid,
            producer_epoch=producer_epoch,
        )
    records = [Record(offset=offset + j, timestamp=i, key=b"k", value=b"v") for j in range(2)]
    seq = 2**31 - 2 if i % 5 == 4 else i
    return encode_batch(
        records,
        base_offset=offset,
        is_transactional=txn and pid >= 0,
        base_sequence=seq if pid >= 0 else -1,
        producer_id=pid,
        producer_epoch=producer_epoch,
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(BATCH, max_size=25), st.integers(0, 25))
def test_producer_state_from_a_table_follows_kafkas_rules_batch_by_batch(
    specs: list[tuple[int, bool, bool, int]], split: int
) -> None:
    """Epoch changes by data batches or markers, emptied markers, and a table applied
    whole or in two parts (as a walk in chunks, or a walk after a snapshot, applies it)."""
    batches = [_batch(i, *spec) for i, spec in enumerate(specs)]
    data = b"".join(batches)
    table = walk(data).table
    expected: dict[int, ProducerEntry] = {}
    for info in table.infos():
        kafka_rules(expected, info, data)
    state = ProducerState()
    state.apply(table, data)
    assert state.entries == expected
    restored = ProducerState.from_bytes(state.to_bytes(), state.offset, Path("x.snapshot"))
    assert restored.entries == expected
    cut = min(split, len(batches))
    parts = ProducerState()
    parts.apply(table.head(cut), data)
    parts.apply(table, data)  # rows below the state's offset are not applied twice
    assert parts.entries == expected


@settings(max_examples=60, deadline=None)
@given(
    st.lists(BATCH, min_size=1, max_size=25),
    st.sets(st.integers(1, 24), max_size=3),
    st.integers(0, 40),
)
def test_the_opens_validation_walk_rebuilds_the_producer_state(
    tmp_path_factory: pytest.TempPathFactory,
    specs: list[tuple[int, bool, bool, int]],
    bounds: set[int],
    torn: int,
) -> None:
    """A first open (no producer snapshot, no recovery point) rebuilds the producer state
    in the walk that checks the CRCs, over every segment, a torn tail cut first: the
    state Kafka's rules give for the batches kept, and the state a walk of its own (a
    read-only open's) finds."""
    batches = [_batch(i, *spec) for i, spec in enumerate(specs)]
    part = tmp_path_factory.mktemp("logs") / "t-0"
    part.mkdir()
    starts = sorted({0, *(b for b in bounds if b < len(batches))})
    for lo, hi in zip(starts, [*starts[1:], len(batches)], strict=True):
        last = hi == len(batches)
        tail = _batch(len(batches), 1, False, False, 0)[:torn] if last else b""
        (part / f"{100 + 2 * lo:020d}.log").write_bytes(b"".join(batches[lo:hi]) + tail)
    data = b"".join(batches)
    table = walk(data).table
    expected: dict[int, ProducerEntry] = {}
    for info in table.infos():
        kafka_rules(expected, info, data)

    plog = PartitionLog.open(part, state_dir=part.parent / "state", recover=True)
    assert plog.recovery_report.producers is not None
    assert len(plog.recovery_report.truncated) == (torn > 0)
    assert plog.producer_state().entries == expected
    assert plog.producer_state().offset == int(table.last_offset[-1]) + 1
    walked = PartitionLog.open(part, read_only=True)
    assert walked.recovery_report.producers is None
    assert walked.producer_state().entries == expected


def test_a_marker_that_bumps_the_epoch_leaves_no_last_batch() -> None:
    """Kafka's snapshot of a producer fenced by a marker of a new epoch: lastSequence -1,
    lastOffset -1, offsetDelta 0 (ProducerStateEntry.maybeUpdateProducerEpoch)."""
    data = _batch(0, 7, True, False, 0) + _batch(1, 7, True, True, 1)
    state = ProducerState()
    state.apply(walk(data).table, data)
    assert state.entries[7] == ProducerEntry(7, 1, -1, -1, 0, 11, 8, -1)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(61, 3000), st.integers(-1, 50)), max_size=60),
    st.integers(0, 4096),
)
def test_index_entries_from_a_table_match_batch_by_batch(
    batches: list[tuple[int, int]], interval: int
) -> None:
    sizes = np.array([s for s, _ in batches], np.int64)
    position = (np.cumsum(sizes) - sizes).astype(np.int64)
    last = np.arange(len(batches), dtype=np.int64) * 2 + 1
    ts = np.array([t for _, t in batches], np.int64)

    def builder() -> IndexBuilder:
        d = Path("/nonexistent")
        return IndexBuilder(OffsetIndex(d / "a", 0), TimeIndex(d / "b", 0), interval)

    one, bulk = builder(), builder()
    for p, s, lo, t in zip(
        position.tolist(), sizes.tolist(), last.tolist(), ts.tolist(), strict=True
    ):
        one.add_batch(p, s, lo, t)
    bulk.add_batches(position, sizes, last, ts)
    for index in ("offset_index", "time_index"):
        a, b = getattr(one, index), getattr(bulk, index)
        assert [a.entry_at(n) for n in range(a.entries)] == [
            b.entry_at(n) for n in range(b.entries)
        ]
    assert (one.max_timestamp, one.offset_of_max_timestamp, one.bytes_since_last_entry) == (
        bulk.max_timestamp,
        bulk.offset_of_max_timestamp,
        bulk.bytes_since_last_entry,
    )
