"""The pass's producer walk (`cleaner._producer_columns`): the header columns of every
batch with a producer id, read by a kernel, against a walk header by header."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.compaction.cleaner import _producer_columns
from cleanerd.compaction.producers import ProducerBatch, ProducerColumns
from cleanerd.records.batch import decode_batch, encode_batch
from cleanerd.records.control import NO_CONTROL_RECORD, control_type
from cleanerd.records.header import LEGACY_V0_MIN_SIZE, LOG_OVERHEAD, unpack_header
from cleanerd.records.record import Record
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
    return raw + raw[:tail]  # an incomplete entry ends the walk


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
    got = _producer_columns(raw)
    want = ProducerColumns.of(_reference(raw))
    for name in ("producer_id", "producer_epoch", "last_offset", "max_timestamp"):
        assert getattr(got, name).tolist() == getattr(want, name).tolist(), name
    assert got.is_transactional.tolist() == want.is_transactional.tolist()
    assert got.is_control.tolist() == want.is_control.tolist()
    controls = want.is_control
    assert got.control_type[controls].tolist() == want.control_type[controls].tolist()
    assert NO_CONTROL_RECORD not in got.control_type[controls].tolist()
    assert np.all(got.producer_id >= 0)
