"""Tests of the batch- and record-level retention rules (ref 4.7, 4.10)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.compaction.batch_retention import (
    NO_HORIZON,
    BatchDecision,
    BatchDecisions,
    BatchRetention,
    WriteAction,
    check_batch_retention,
    decide_batches,
    keep_records,
    plan_batch_writes,
)

DAY = 86_400_000


def decide(**kw: object) -> BatchDecision:
    args: dict[str, object] = {
        "is_control": False,
        "is_last_of_producer": False,
        "next_offset": 5,
        "upper_bound_offset": 100,
        "discardable": False,
        "delete_horizon_ms": NO_HORIZON,
        "now_ms": 1000,
    }
    args.update(kw)
    return check_batch_retention(**args)  # type: ignore[arg-type]


def test_batch_retention_order() -> None:
    """Producer's last batch and the round's last slot are retained; aborted data deleted."""
    assert (
        decide(is_last_of_producer=True, discardable=True).retention is BatchRetention.RETAIN_EMPTY
    )
    assert decide(next_offset=100, discardable=True).retention is BatchRetention.RETAIN_EMPTY
    assert decide(discardable=True).retention is BatchRetention.DELETE
    assert decide().retention is BatchRetention.DELETE_EMPTY


def test_marker_removed_only_after_horizon() -> None:
    """A discardable marker goes only once its horizon is set and has passed."""
    assert decide(is_control=True, discardable=True).retention is BatchRetention.DELETE_EMPTY
    assert (
        decide(is_control=True, discardable=True, delete_horizon_ms=2000).retention
        is BatchRetention.DELETE_EMPTY
    )
    d = decide(is_control=True, discardable=True, delete_horizon_ms=1000)
    assert d.retention is BatchRetention.DELETE
    assert d.marker_for_empty_txn


def plan(d: BatchDecision, **kw: object) -> tuple[WriteAction, int]:
    """plan_batch_writes over a single batch."""
    decisions = BatchDecisions.plain(np.array([0], np.int64), 99)
    decisions.set(0, d)
    arrays = {
        "kept": np.array([kw["kept"]], np.int64),
        "total": np.array([kw["total"]], np.int64),
        "kept_tombstone": np.array([kw["kept_tombstone"]]),
        "delete_horizon_ms": np.array([kw["delete_horizon_ms"]], np.int64),
    }
    actions, horizons = plan_batch_writes(decisions, now_ms=1000, delete_retention_ms=DAY, **arrays)
    return WriteAction(int(actions[0])), int(horizons[0])


def test_write_plans() -> None:
    """All kept copies; a kept tombstone or empty-txn marker is re-encoded with a horizon."""
    keep = decide()
    none = NO_HORIZON
    assert (
        plan(keep, kept=3, total=3, kept_tombstone=False, delete_horizon_ms=none)[0]
        is WriteAction.COPY
    )
    assert plan(keep, kept=3, total=3, kept_tombstone=True, delete_horizon_ms=none) == (
        WriteAction.REENCODE,
        1000 + DAY,
    )
    assert plan(keep, kept=2, total=3, kept_tombstone=True, delete_horizon_ms=500) == (
        WriteAction.REENCODE,
        500,
    )
    assert (
        plan(keep, kept=0, total=3, kept_tombstone=False, delete_horizon_ms=none)[0]
        is WriteAction.SKIP
    )
    retain = decide(is_last_of_producer=True)
    assert plan(retain, kept=0, total=3, kept_tombstone=False, delete_horizon_ms=none)[0] is (
        WriteAction.EMPTY_HEADER
    )
    marker = decide(is_control=True, discardable=True)
    assert plan(marker, kept=1, total=1, kept_tombstone=False, delete_horizon_ms=none) == (
        WriteAction.REENCODE,
        1000 + DAY,
    )
    gone = decide(discardable=True)
    assert (
        plan(gone, kept=0, total=1, kept_tombstone=False, delete_horizon_ms=none)[0]
        is WriteAction.SKIP
    )


def test_plain_decisions_match_the_scalar_rule() -> None:
    """The columnar default equals check_batch_retention for unflagged batches."""
    d = BatchDecisions.plain(np.array([5, 100], np.int64), 100)
    assert d.retention.tolist() == [
        decide(next_offset=5).retention,
        decide(next_offset=100).retention,
    ]
    assert not d.discard_records.any()
    assert not d.marker_for_empty_txn.any()


def test_keep_records_rules() -> None:
    """Keyless dropped and counted; superseded records and tombstones past their horizon
    dropped; records past the latest offset and control records kept."""
    keep, invalid = keep_records(
        rec_batch=np.array([0, 0, 0, 0, 1, 2, 2], dtype=np.int64),
        rec_offset=np.array([0, 1, 2, 3, 4, 5, 9], dtype=np.int64),
        rec_key_len=np.array([1, -1, 1, 1, 1, 1, -1], dtype=np.int32),
        rec_value_len=np.array([1, 1, -1, 1, 1, -1, 1], dtype=np.int32),
        rec_survives=np.array([False, True, True, True, False, True, False]),
        batch_discard=np.array([False, False, False]),
        batch_is_control=np.array([False, True, False]),
        batch_retain_deletes=np.array([False, True, True]),
        latest_offset=5,
    )
    assert keep.tolist() == [False, False, False, True, True, True, True]
    assert invalid == 1


def test_discarded_batches_keep_nothing() -> None:
    """A batch whose records are discarded (aborted data) keeps none, whatever the keys."""
    keep, invalid = keep_records(
        rec_batch=np.array([0, 0, 1], dtype=np.int64),
        rec_offset=np.array([0, 1, 2], dtype=np.int64),
        rec_key_len=np.array([1, -1, 1], dtype=np.int32),
        rec_value_len=np.ones(3, dtype=np.int32),
        rec_survives=np.ones(3, dtype=np.bool_),
        batch_discard=np.array([True, False]),
        batch_is_control=np.array([False, False]),
        batch_retain_deletes=np.array([True, True]),
        latest_offset=5,
    )
    assert keep.tolist() == [False, False, True]
    assert invalid == 0


def test_a_horizon_that_guards_nothing_is_dropped() -> None:
    """A batch whose tombstones are gone loses its horizon, copied batches included."""
    keep = decide()
    assert plan(keep, kept=2, total=3, kept_tombstone=False, delete_horizon_ms=500) == (
        WriteAction.REENCODE,
        NO_HORIZON,
    )
    assert plan(keep, kept=3, total=3, kept_tombstone=False, delete_horizon_ms=500) == (
        WriteAction.REENCODE,
        NO_HORIZON,
    )
    marker = decide(is_control=True, discardable=True, delete_horizon_ms=2000)
    assert plan(marker, kept=1, total=1, kept_tombstone=False, delete_horizon_ms=2000) == (
        WriteAction.COPY,
        2000,
    )


def _reference_decision(
    is_control: bool,
    is_last: bool,
    next_offset: int,
    upper: int,
    discardable: bool,
    horizon: int,
    now_ms: int,
) -> tuple[BatchRetention, bool, bool]:
    """Rules 1-4 of the module docstring, written out for one batch."""
    if is_control:
        discard = discardable and horizon != NO_HORIZON and horizon <= now_ms
    else:
        discard = discardable
    if is_last or next_offset == upper:
        retention = BatchRetention.RETAIN_EMPTY
    elif discard:
        retention = BatchRetention.DELETE
    else:
        retention = BatchRetention.DELETE_EMPTY
    return retention, discard, is_control and discardable


@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.booleans(),
            st.integers(0, 6),
            st.booleans(),
            st.sampled_from([NO_HORIZON, 0, 999, 1000, 1001]),
        ),
        max_size=30,
    ),
    st.integers(0, 6),
)
@settings(max_examples=200, deadline=None)
def test_decide_batches_matches_the_rules(
    rows: list[tuple[bool, bool, int, bool, int]], upper: int
) -> None:
    """The columnar rules give, batch by batch, what the rules give one batch at a time."""
    d = decide_batches(
        is_control=np.array([r[0] for r in rows], np.bool_),
        is_last_of_producer=np.array([r[1] for r in rows], np.bool_),
        next_offset=np.array([r[2] for r in rows], np.int64),
        upper_bound_offset=upper,
        discardable=np.array([r[3] for r in rows], np.bool_),
        delete_horizon_ms=np.array([r[4] for r in rows], np.int64),
        now_ms=1000,
    )
    for i, (control, last, nxt, discardable, horizon) in enumerate(rows):
        want = _reference_decision(control, last, nxt, upper, discardable, horizon, 1000)
        got = (d.retention[i], bool(d.discard_records[i]), bool(d.marker_for_empty_txn[i]))
        assert got == want
