"""Tests of cleanerd.compaction.assemble: records rewritten with new timestamp deltas."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.compaction.assemble import rewrite_records
from cleanerd.records.varint import encode_varint, encode_varlong

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def v2_record(ts_delta: int, offset_delta: int, key: bytes, value: bytes | None) -> bytes:
    """A v2 record as Kafka's DefaultRecord writes it (no headers)."""
    body = b"\x00" + encode_varlong(ts_delta) + encode_varint(offset_delta)
    body += encode_varint(len(key)) + key
    body += encode_varint(-1) if value is None else encode_varint(len(value)) + value
    body += encode_varint(0)
    return encode_varint(len(body)) + body


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            INT64,
            INT64,
            st.integers(0, 2**31 - 1),
            st.binary(max_size=200),
            st.none() | st.binary(max_size=300),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_a_rewritten_record_is_the_record_written_with_its_new_delta(
    records: list[tuple[int, int, int, bytes, bytes | None]],
) -> None:
    """Every record rewritten with a new timestamp delta (any int64: the varlong and the
    length prefix change size) is byte for byte the record encoded with that delta."""
    source = [v2_record(old, off, k, v) for old, _, off, k, v in records]
    buf = np.frombuffer(b"".join(source), np.uint8)
    ends = np.cumsum([len(r) for r in source], dtype=np.int64)
    starts = np.concatenate([np.zeros(1, np.int64), ends[:-1]])
    deltas = np.array([new for _, new, _, _, _ in records], np.int64)
    out = np.zeros(buf.size + 16 * len(records), np.uint8)
    written = np.empty(len(records), np.int64)
    rewrite_records(buf, starts, ends, deltas, out, written)
    expected = [v2_record(new, off, k, v) for _, new, off, k, v in records]
    assert written.tolist() == np.cumsum([len(r) for r in expected]).tolist()
    assert out[: written[-1]].tobytes() == b"".join(expected)
