"""The deletion-deadline audit: superseded records still on disk, how long, and who is late.

What counts. Over one compacted partition, the candidates are the keyed data records
below the last stable offset (records of open transactions have not yet superseded
anything), excluding aborted transactional data and control records. Records are
grouped by key hash (`keyhash`, as the offset map groups them) and ranked by the topic's
strategy (`strategy`, KIP-280): offset: the highest offset wins; timestamp/header: the
highest (has version, version, offset) wins. A record is *superseded* when another record
of its key outranks it; the winner of each key is what a complete compaction keeps.

When a record was superseded, and its deadline. Kafka's KIP-354 deadline counts from the
timestamp of the dirty record: once the record that supersedes a value is older than
`max.compaction.lag.ms`, its segment must have been cleaned, and with it the value.
For a superseded record r this audit takes

    superseded_at(r) = min over every s of r's key that outranks r of
                       s.timestamp  if s was written after r (s.offset > r.offset)
                       r.timestamp  if s was already there (s.offset < r.offset; only
                                    the timestamp and header strategies allow this:
                                    r is garbage from the moment it is written, and its
                                    own dirtiness forces the compaction that removes it)

the earliest moment r was garbage, on the producers' clocks. Its age is
`now - superseded_at`; it is a deadline violation when the age exceeds
`max.compaction.lag.ms + slack`, the slack being the time a correct cleanerd may
legitimately need after the deadline (the caller states it; see `audit_command`). A
record or superseder without a timestamp (negative, magic 0) gives no time: such a
record counts as superseded with an unknown age and is never a violation. A topic
without a max lag has no deadline: ages are reported, violations are not.

Tombstones and transaction markers whose delete horizon (KIP-534) has passed are
reported too, with how long ago it passed: the next pass removes them. They are not
deadline violations: the max-lag promise covers the values a tombstone deletes (those
are superseded records above), while the tombstone itself stays for
`delete.retention.ms` by design.

Shape. `audit_columns` is the pure core over plain per-record columns (`AuditColumns`),
so any engine that can produce the columns (the local reader below, or the Spark engine
over many log dirs) computes the same report. Every step is numpy, plus one compiled
kernel for `superseded_at` (a per-key sweep from the winner down, with a Fenwick tree of
prefix minima over the records' offset ranks, O(n log n)); Python runs per batch only,
never per record. `read_audit_columns` decodes a partition's segments with
`columns.segment_columns` (CRC checked) and `keyhash.hash_keys`.

Memory. The ranking needs every candidate row of a key at once, about `ROW_BYTES` a row
with its temporaries: 700 MB for a 1 GiB segment of 1-record batches, and it grows with
the partition. `audit_partition` therefore audits a partition in key buckets when it has
more rows than `memory_bytes` holds: bucket b of B takes the keys whose hash is b modulo
B, every bucket is read from the partition's segments in turn (nothing is written
anywhere: the audit only reads), and the buckets' results are merged (`merge_results`).
A key lies in one bucket, and every figure of the result is a sum, a maximum, a
minimum or the oldest listed violations over keys (the keyless records, which have no
key, are counted with bucket 0 only), so the merged result is the one-bucket result
exactly. B is chosen before reading (`first_buckets`): 1 when the partition's offsets
below its last stable offset are within the budget (a record has an offset of its own),
else from its records, counted by a walk of the batch headers (a few percent of a read;
legacy compressed wrappers are decompressed for their counts). The count includes
records that are not candidates (control, aborted, above the last stable offset), and
keys are not spread evenly, so a bucket's read also stops once its rows exceed the
budget: that
bucket alone is split in halves by one more bit of the hash (`KeyBucket.halves`) and
they are read in turn, the buckets done so far kept. A key's rows cannot be split, so a
key with more rows than the budget holds would make one half of every split overflow: a
bucket split `MAX_SPLITS` times is read whole, whatever it holds, so such a key costs at
most 2 x `MAX_SPLITS` more reads. The buckets are the
local scan's: the Spark audit ranks a partition's rows in one task.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from cleanerd._jit import jit
from cleanerd.compaction.cleanable import NO_MAX_COMPACTION_LAG
from cleanerd.compaction.keyhash import hash_keys
from cleanerd.compaction.strategy import ResolvedStrategy, resolve_strategy, segment_versions
from cleanerd.compaction.transactions import TransactionTracker
from cleanerd.errors import (
    CleanerdError,
    CorruptRecordError,
    FileChangedError,
    failure_text,
    reread_on_change,
)
from cleanerd.log.files import TopicPartition, partition_dir_gone
from cleanerd.log.partition_log import PartitionLog
from cleanerd.log.segment import LogSegment
from cleanerd.log.segment_reader import join_buffers
from cleanerd.log.topic_config import TopicConfig
from cleanerd.log.txnindex import AbortedTxn
from cleanerd.logger import get_logger
from cleanerd.records.columns import SegmentColumns, segment_columns
from cleanerd.records.control import control_type_column
from cleanerd.records.header import (
    CONTROL_MASK,
    DELETE_HORIZON_MASK,
    TRANSACTIONAL_MASK,
    Buffer,
)
from cleanerd.records.walker import DECODE_WINDOW_BYTES, OffsetRange, batch_windows

I64 = NDArray[np.int64]
U64 = NDArray[np.uint64]
Bools = NDArray[np.bool_]

log = get_logger(__name__)

NEVER: Final = 2**63 - 1
"""Sentinel time: not superseded, superseded at an unknown time, or no horizon."""
DEFAULT_MAX_LISTED: Final = 20
AUDIT_MEMORY_BYTES: Final = 512 << 20
"""The default memory budget of one partition's candidate rows (see the module docstring)."""
ROW_BYTES: Final = 128
"""What a candidate row costs at the peak of `audit_columns`: its columns (58 bytes) and
the ranking's temporaries (order, offsets, offset ranks, times, the kernel's tree, the
result): measured at 110 bytes a row on 5.6 million rows of the offset strategy (the
peak of a whole `cleanerd audit` less its 77 MB before any read), with some to spare."""
MAX_BUCKETS: Final = 4096
"""The most key buckets a partition is audited in at first."""
MAX_SPLITS: Final = 3
"""The splits of a bucket after which its halves are read whole (see the module
docstring)."""


_DTYPES: Final[Mapping[str, type[Any]]] = MappingProxyType(
    {
        "hash_hi": np.uint64,
        "hash_lo": np.uint64,
        "offset": np.int64,
        "timestamp": np.int64,
        "version": np.int64,
        "has_version": np.bool_,
        "size": np.int64,
        "tombstone": np.bool_,
        "horizon": np.int64,
        "marker_horizon": np.int64,
        "keyless_count": np.int64,
        "keyless_first": np.int64,
    }
)
"""Each `AuditColumns` field's dtype."""


@dataclass(frozen=True, slots=True)
class AuditColumns:
    """One row per candidate record of a partition (see the module docstring)."""

    hash_hi: U64
    hash_lo: U64
    offset: I64
    timestamp: I64
    """Record timestamp; negative when unknown."""
    version: I64
    """Strategy version (0 where absent or for the offset strategy)."""
    has_version: Bools
    size: I64
    """Record bytes (the varint-framed record, uncompressed)."""
    tombstone: Bools
    horizon: I64
    """The record's batch delete horizon, or NEVER."""
    marker_horizon: I64
    """Delete horizons of control batches that carry one (one row per batch)."""
    keyless_count: I64
    """Keyless data records below the last stable offset, not aborted: not candidates (no
    key's record can supersede them), but a pass drops them, as Kafka's cleaner drops a
    record without a key from a compacted topic. A count, not a row each: one entry (none
    without such records), one per decoded range until `build` joins them."""
    keyless_first: I64
    """The first such record's offset, per entry of `keyless_count`."""

    @classmethod
    def empty(cls) -> AuditColumns:
        """No records."""
        return cls.concat([])

    @classmethod
    def build(cls, column: Callable[[str, type[Any]], NDArray[Any]]) -> AuditColumns:
        """The columns `column(name, dtype)` gives for each field, as that dtype."""
        fields = {name: column(name, dtype) for name, dtype in _DTYPES.items()}
        count, first = fields["keyless_count"], fields["keyless_first"]
        if count.size > 1:
            # Counted per decoded range: one entry for them all, so that the columns do
            # not depend on where a read cut the bytes.
            fields["keyless_count"] = np.array([count.sum()], np.int64)
            fields["keyless_first"] = np.array([first.min()], np.int64)
        return cls(**fields)

    @classmethod
    def concat(cls, parts: Sequence[AuditColumns]) -> AuditColumns:
        """The rows of `parts`, in order."""
        return cls.gather(list(parts))

    @classmethod
    def gather(cls, parts: list[AuditColumns]) -> AuditColumns:
        """The rows of `parts`, in order, emptying `parts`: a column's pieces are freed
        once it is joined, so joining costs one column more than the rows, not twice
        the rows (a partition of 1-record batches has 60 bytes of them per record)."""
        pieces = {name: [getattr(p, name) for p in parts] for name in _DTYPES}
        parts.clear()

        def take(name: str, dtype: type[Any]) -> NDArray[Any]:
            arrays = pieces.pop(name)
            if not arrays:
                return np.empty(0, dtype)
            return np.concatenate(arrays).astype(dtype, copy=False)

        return cls.build(take)

    def __len__(self) -> int:
        return len(self.offset)


@dataclass(frozen=True, slots=True)
class KeyBucket:
    """The keys of bucket `index` of `count`: those whose key hash's high word is `index`
    modulo `count` (see the module docstring)."""

    index: int = 0
    count: int = 1

    def holds(self, hash_hi: U64) -> Bools:
        """Per key hash: whether its key is in this bucket."""
        if self.count == 1:
            return np.ones(hash_hi.shape, np.bool_)
        held: Bools = hash_hi % np.uint64(self.count) == np.uint64(self.index)
        return held

    def halves(self) -> tuple[KeyBucket, KeyBucket]:
        """This bucket's keys split by one more bit of their hash: b of B into b and
        b + B of 2 B (a hash is b modulo B exactly when it is one of those modulo 2 B)."""
        return KeyBucket(self.index, 2 * self.count), KeyBucket(
            self.index + self.count, 2 * self.count
        )


WHOLE: Final = KeyBucket()
"""Every key: the partition in one bucket."""


@dataclass(frozen=True, slots=True)
class Violation:
    """A superseded record past its deadline plus slack."""

    offset: int
    superseded_at_ms: int
    age_ms: int


@dataclass(frozen=True, slots=True)
class AuditResult:
    """The audit of one partition's columns."""

    records: int
    """Candidate records (keyed data, below the last stable offset, not aborted)."""
    keys: int
    superseded: int
    superseded_bytes: int
    superseded_unknown_age: int
    """Superseded records whose supersession time is unknown (no timestamps)."""
    oldest_superseded_age_ms: int | None
    violations: int
    listed_violations: tuple[Violation, ...]
    """The oldest violations, at most `max_listed`, oldest first."""
    tombstones: int
    tombstones_past_horizon: int
    oldest_tombstone_overdue_ms: int | None
    """now - the earliest passed tombstone horizon."""
    markers_past_horizon: int
    oldest_marker_overdue_ms: int | None
    keyless_records: int = 0
    """Records without a key (not candidates): the next pass over them drops them."""
    first_keyless_offset: int | None = None


def _most(values: Iterator[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _least(values: Iterator[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def merge_results(parts: Sequence[AuditResult], *, max_listed: int) -> AuditResult:
    """The result of a partition audited in key buckets, from each bucket's result: what
    `audit_columns` gives for all the rows at once (see the module docstring). Violations
    are listed oldest first, ties in offset order, as `audit_columns` lists them (its rows
    are in offset order)."""
    if len(parts) == 1:
        return parts[0]
    listed = sorted(
        (v for r in parts for v in r.listed_violations),
        key=lambda v: (v.superseded_at_ms, v.offset),
    )
    return AuditResult(
        records=sum(r.records for r in parts),
        keys=sum(r.keys for r in parts),
        superseded=sum(r.superseded for r in parts),
        superseded_bytes=sum(r.superseded_bytes for r in parts),
        superseded_unknown_age=sum(r.superseded_unknown_age for r in parts),
        oldest_superseded_age_ms=_most(r.oldest_superseded_age_ms for r in parts),
        violations=sum(r.violations for r in parts),
        listed_violations=tuple(listed[:max_listed]),
        tombstones=sum(r.tombstones for r in parts),
        tombstones_past_horizon=sum(r.tombstones_past_horizon for r in parts),
        oldest_tombstone_overdue_ms=_most(r.oldest_tombstone_overdue_ms for r in parts),
        markers_past_horizon=sum(r.markers_past_horizon for r in parts),
        oldest_marker_overdue_ms=_most(r.oldest_marker_overdue_ms for r in parts),
        keyless_records=sum(r.keyless_records for r in parts),
        first_keyless_offset=_least(r.first_keyless_offset for r in parts),
    )


@jit
def _superseded_at_kernel(starts: I64, ts: I64, offsets: I64, offpos: I64, out: I64) -> None:
    """For rows sorted by key group then rank ascending: out[i] = superseded_at (NEVER
    for the winner or when unknown). `offpos[i]` is row i's offset rank in its group."""
    fenwick = np.empty(ts.shape[0], dtype=np.int64)
    for g in range(starts.shape[0] - 1):
        a = starts[g]
        m = starts[g + 1] - a
        for j in range(m):
            fenwick[a + j] = NEVER
        min_offset = NEVER
        for i in range(a + m - 1, a - 1, -1):
            # Outranking rows seen so far with a larger offset sit at reversed offset
            # ranks below r: a prefix-minimum query over [0, r).
            r = m - 1 - offpos[i]
            best = NEVER
            k = r
            while k > 0:
                best = min(best, fenwick[a + k - 1])
                k -= k & -k
            if min_offset < offsets[i]:
                best = min(best, ts[i])
            out[i] = best
            k = r + 1
            while k <= m:
                fenwick[a + k - 1] = min(fenwick[a + k - 1], ts[i])
                k += k & -k
            min_offset = min(min_offset, offsets[i])


def _rank_order(cols: AuditColumns, versioned: bool) -> I64:
    """Row order by key hash, then rank ascending (the winner last in each group)."""
    if not versioned and bool(np.all(cols.offset[1:] > cols.offset[:-1])):
        # Rows in offset order (as a log reads): a stable sort by the hash's high word
        # alone is the order by (hash, offset), unless two keys share that word, which
        # the check below sees. Half the time of the three-key sort.
        order = np.argsort(cols.hash_hi, kind="stable")
        hi, lo = cols.hash_hi[order], cols.hash_lo[order]
        if not np.any((hi[1:] == hi[:-1]) & (lo[1:] != lo[:-1])):
            return order.astype(np.int64, copy=False)
        del hi, lo, order
    keys: tuple[NDArray[Any], ...] = (cols.offset, cols.hash_lo, cols.hash_hi)
    if versioned:
        keys = (cols.offset, cols.version, cols.has_version, cols.hash_lo, cols.hash_hi)
    return np.lexsort(keys).astype(np.int64)


def superseded_at(cols: AuditColumns, *, versioned: bool) -> tuple[Bools, I64]:
    """(winner mask, superseded_at) per row, in row order (see the module docstring)."""
    n = len(cols)
    if n == 0:
        return np.zeros(0, np.bool_), np.zeros(0, np.int64)
    # Every temporary is a row per record (a partition of 1-record batches has millions):
    # each is dropped as soon as it is used.
    order = _rank_order(cols, versioned)
    hi, lo = cols.hash_hi[order], cols.hash_lo[order]
    new_group = np.ones(n, np.bool_)
    new_group[1:] = (hi[1:] != hi[:-1]) | (lo[1:] != lo[:-1])
    del hi, lo
    starts = np.append(np.flatnonzero(new_group), n).astype(np.int64)
    gid = np.cumsum(new_group) - 1
    del new_group
    offsets = cols.offset[order]
    if versioned:
        by_offset = np.lexsort((offsets, gid))
        offpos = np.empty(n, np.int64)
        offpos[by_offset] = np.arange(n) - starts[gid[by_offset]]
        del by_offset
    else:
        # Ranked by offset: a row's offset rank in its group is its place there (the
        # second sort, a third of the ranking's time, is not needed).
        offpos = np.arange(n) - starts[gid]
    del gid
    known_ts = cols.timestamp[order]
    known_ts[known_ts < 0] = NEVER
    out_sorted = np.empty(n, np.int64)
    _superseded_at_kernel(starts, known_ts, offsets, offpos, out_sorted)
    winner_sorted = np.zeros(n, np.bool_)
    winner_sorted[starts[1:] - 1] = True
    winner = np.empty(n, np.bool_)
    winner[order] = winner_sorted
    at = np.empty(n, np.int64)
    at[order] = out_sorted
    at[winner] = NEVER
    return winner, at


def _overdue(horizons: I64, now_ms: int) -> tuple[int, int | None]:
    passed = horizons[horizons <= now_ms]
    if passed.size == 0:
        return 0, None
    return int(passed.size), now_ms - int(passed.min())


def audit_columns(
    cols: AuditColumns,
    *,
    versioned: bool,
    now_ms: int,
    max_compaction_lag_ms: int,
    slack_ms: int,
    max_listed: int = DEFAULT_MAX_LISTED,
) -> AuditResult:
    """Audit one partition's candidate records at `now_ms` (pure; see the module
    docstring). `versioned` is False for the offset strategy."""
    winner, at = superseded_at(cols, versioned=versioned)
    superseded = ~winner
    known = superseded & (at != NEVER)
    ages = now_ms - at[known]
    violating = np.zeros(len(cols), np.bool_)
    if max_compaction_lag_ms < NO_MAX_COMPACTION_LAG:
        # age > lag + slack  <=>  superseded_at < now - lag - slack (Python ints: no overflow)
        cutoff = now_ms - max_compaction_lag_ms - slack_ms
        if cutoff > -(2**63):
            violating = known & (at < cutoff)
    rows = np.flatnonzero(violating)
    oldest_first = rows[np.argsort(at[rows], kind="stable")][:max_listed]
    listed = tuple(
        Violation(int(cols.offset[i]), int(at[i]), now_ms - int(at[i])) for i in oldest_first
    )
    tomb_passed, tomb_overdue = _overdue(cols.horizon[cols.tombstone], now_ms)
    markers_passed, marker_overdue = _overdue(cols.marker_horizon, now_ms)
    return AuditResult(
        records=len(cols),
        keys=int(np.count_nonzero(winner)),
        superseded=int(np.count_nonzero(superseded)),
        superseded_bytes=int(cols.size[superseded].sum()),
        superseded_unknown_age=int(np.count_nonzero(superseded & ~known)),
        oldest_superseded_age_ms=int(ages.max()) if ages.size else None,
        violations=int(rows.size),
        listed_violations=listed,
        tombstones=int(np.count_nonzero(cols.tombstone)),
        tombstones_past_horizon=tomb_passed,
        oldest_tombstone_overdue_ms=tomb_overdue,
        markers_past_horizon=markers_passed,
        oldest_marker_overdue_ms=marker_overdue,
        keyless_records=int(cols.keyless_count.sum()),
        first_keyless_offset=int(cols.keyless_first.min()) if cols.keyless_first.size else None,
    )


# ---------------------------------------------------------------------------------------
# Reading a partition into columns


def _aborted_batches(sc: SegmentColumns, tracker: TransactionTracker | None) -> Bools:
    """Per batch: transactional data of an aborted transaction. Only transactional and
    control batches go to the tracker: it consumes aborted-transaction entries by offset,
    so skipping the others changes nothing."""
    aborted = np.zeros(sc.num_batches, np.bool_)
    if tracker is None:
        if (sc.attributes & CONTROL_MASK).any():
            control_type_column(sc)  # a malformed control record is damage all the same
        return aborted
    attrs = sc.attributes.astype(np.int64)
    flagged = np.flatnonzero(attrs & (CONTROL_MASK | TRANSACTIONAL_MASK))
    if not flagged.size:
        return aborted
    is_control = (attrs[flagged] & CONTROL_MASK) != 0
    discardable = tracker.on_batches(
        producer_id=sc.producer_id[flagged],
        is_control=is_control,
        is_transactional=np.ones(flagged.size, np.bool_),
        control_type=control_type_column(sc)[flagged],
        last_offset=(sc.base_offset + sc.last_offset_delta)[flagged],
    )
    aborted[flagged] = discardable & ~is_control
    return aborted


def segment_audit_columns(
    sc: SegmentColumns,
    *,
    strategy: ResolvedStrategy,
    stable_offset: int,
    tracker: TransactionTracker | None = None,
    bucket: KeyBucket = WHOLE,
) -> AuditColumns:
    """The candidate rows of one decoded segment whose keys are in `bucket` (the
    transaction markers' horizons and the keyless records with bucket 0 only). `tracker`
    (None when the partition has no aborted transaction) is carried across the
    partition's segments in order."""
    attrs = sc.attributes.astype(np.int64)
    control = (attrs & CONTROL_MASK) != 0
    aborted = _aborted_batches(sc, tracker)
    horizon_of_batch = np.where(
        (attrs & DELETE_HORIZON_MASK) != 0, sc.base_timestamp, NEVER
    ).astype(np.int64)
    bi = sc.batch_index.astype(np.int64)
    data = ~control[bi] & ~aborted[bi] & (sc.offset < stable_offset)
    rows = np.flatnonzero(data & (sc.key_len >= 0)).astype(np.int64)
    keyless = sc.offset[data & (sc.key_len < 0)] if bucket.index == 0 else sc.offset[:0]
    some = keyless.size > 0
    joined = join_buffers(sc)
    hashes = hash_keys(joined.buf, joined.key_pos[rows], sc.key_len[rows])
    if bucket.count > 1:
        mine = bucket.holds(hashes[:, 0])
        rows, hashes = rows[mine], hashes[mine]
    versions, has = segment_versions(strategy, sc, joined, rows)
    markers = control & (sc.base_offset < stable_offset) & (horizon_of_batch != NEVER)
    if bucket.index != 0:
        markers[:] = False
    return AuditColumns(
        hash_hi=hashes[:, 0].copy(),
        hash_lo=hashes[:, 1].copy(),
        offset=sc.offset[rows].astype(np.int64),
        timestamp=sc.timestamp[rows].astype(np.int64),
        version=versions,
        has_version=has,
        size=sc.record_size[rows].astype(np.int64),
        tombstone=sc.value_len[rows] < 0,
        horizon=horizon_of_batch[bi[rows]],
        marker_horizon=horizon_of_batch[markers],
        keyless_count=np.array([keyless.size] if some else [], np.int64),
        keyless_first=np.array([keyless.min()] if some else [], np.int64),
    )


SMALL_SEGMENT_BYTES: Final = 1 << 18
"""Segments of at most this size are decoded together (see `read_audit_columns`)."""
JOINED_READ_BYTES: Final = 1 << 22
"""The most bytes of small segments decoded in one call."""


def _runs(segments: Sequence[LogSegment]) -> list[list[LogSegment]]:
    """`segments` in order, cut into runs decoded in one call each: consecutive small
    segments together (up to JOINED_READ_BYTES), every other segment alone."""
    runs: list[list[LogSegment]] = []
    joined: int | None = None  # the bytes of the last run, when it takes small segments
    for segment in segments:
        small = segment.size <= SMALL_SEGMENT_BYTES
        if small and joined is not None and joined + segment.size <= JOINED_READ_BYTES:
            runs[-1].append(segment)
            joined += segment.size
        else:
            runs.append([segment])
            joined = segment.size if small else None
    return runs


@contextmanager
def _run_buffer(run: Sequence[LogSegment]) -> Iterator[Buffer]:
    """The bytes of `run`: a lone segment's own buffer, small ones' bytes joined."""
    if len(run) == 1:
        with run[0].open_buffer() as buf:
            yield buf
        return
    parts = []
    for segment in run:
        with segment.open_buffer() as buf:
            parts.append(bytes(buf))
    yield b"".join(parts)


class RowsOverflow(Exception):
    """A read kept more rows than its limit (see the module docstring)."""


def read_audit_columns(
    segments: Sequence[LogSegment],
    *,
    strategy: ResolvedStrategy,
    stable_offset: int,
    aborted: Sequence[AbortedTxn] = (),
    bucket: KeyBucket = WHOLE,
    row_limit: int | None = None,
) -> AuditColumns:
    """Decode `segments` (ascending, of one partition) into the candidate rows of
    `bucket`'s keys; CRCs are checked and a corrupt batch raises CorruptRecordError
    naming the file and byte position. RowsOverflow once more than `row_limit` rows are
    kept (None: no limit).

    A partition of many small segments (a quiet topic rolled by `segment.ms`) would pay
    the fixed cost of a decode per segment, many times the cost of its bytes, so runs of
    small segments are decoded in one call over their bytes joined: segments hold whole
    batches, so the joined bytes hold the same batches in the same order. When such a
    call meets a corrupt batch, the partition is read again one segment at a time, which
    names the file and position as before."""
    try:
        runs = _runs(segments)
        return _read_runs(runs, strategy, stable_offset, aborted, bucket, _RowLimit(row_limit))
    except CorruptRecordError:
        pass  # read again below, once this attempt's rows (the traceback's) are freed
    singly = [[s] for s in segments]
    return _read_runs(singly, strategy, stable_offset, aborted, bucket, _RowLimit(row_limit))


@dataclass(slots=True)
class _RowLimit:
    """The rows a read kept so far, against its limit."""

    limit: int | None
    rows: int = 0

    def add(self, rows: int) -> None:
        self.rows += rows
        if self.limit is not None and self.rows > self.limit:
            raise RowsOverflow(f"{self.rows} rows, more than {self.limit}")


def _read_runs(
    runs: Sequence[Sequence[LogSegment]],
    strategy: ResolvedStrategy,
    stable_offset: int,
    aborted: Sequence[AbortedTxn],
    bucket: KeyBucket,
    limit: _RowLimit,
) -> AuditColumns:
    tracker: TransactionTracker | None = None
    if aborted:
        tracker = TransactionTracker()
        tracker.add_aborted(list(aborted))
    parts: list[AuditColumns] = []
    for i, run in enumerate(runs):
        # Up to the next run's base offset (a joined run's segments only as a whole;
        # the last run, maybe joined too, with no bound above).
        base = max(0, run[0].base_offset)
        ranges = (
            OffsetRange.of_segment(base, runs[i + 1][0].base_offset)
            if i + 1 < len(runs)
            else OffsetRange(0, base)
        )
        with _run_buffer(run) as buf:
            # A big segment is decoded a window of whole batches at a time.
            for start, end, offsets in batch_windows(buf, DECODE_WINDOW_BYTES, ranges):
                try:
                    sc = segment_columns(buf, start=start, end=end, offsets=offsets)
                    part = segment_audit_columns(
                        sc,
                        strategy=strategy,
                        stable_offset=stable_offset,
                        tracker=tracker,
                        bucket=bucket,
                    )
                except CorruptRecordError as exc:
                    if len(run) > 1:
                        raise  # joined bytes cannot name the file: read them singly
                    raise exc.located(run[0].log_path) from exc
                del sc  # no view of the mapping may outlive it
                parts.append(part)
                limit.add(len(part))
                del part
    return AuditColumns.gather(parts)


_RESULT_FIELDS: Final = tuple(f.name for f in fields(AuditResult))


@dataclass(frozen=True, slots=True)
class PartitionAudit:
    """The audit of one partition, with what it was measured against."""

    log_dir: str
    topic: str
    partition: int
    strategy: str
    now_ms: int
    max_compaction_lag_ms: int | None
    """None when the topic has no max lag (no deadline)."""
    slack_ms: int
    result: AuditResult | None
    error: str | None = None
    """Why the partition could not be audited (a corrupt segment), else None."""

    @property
    def violations(self) -> int:
        """Deadline violations found."""
        return 0 if self.result is None else self.result.violations

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the `--json` output of `cleanerd audit`)."""
        out: dict[str, Any] = {
            "log_dir": self.log_dir,
            "topic": self.topic,
            "partition": self.partition,
            "strategy": self.strategy,
            "now_ms": self.now_ms,
            "max_compaction_lag_ms": self.max_compaction_lag_ms,
            "slack_ms": self.slack_ms,
            "error": self.error,
        }
        # A partition not audited has every figure, as null: one shape for a script.
        out.update(dict.fromkeys(_RESULT_FIELDS) if self.result is None else asdict(self.result))
        return out

    @property
    def name(self) -> str:
        """The partition's dir, as messages name it."""
        return str(Path(self.log_dir) / f"{self.topic}-{self.partition}")


@dataclass(frozen=True, slots=True)
class AuditScope:
    """What the audit of a partition needs of the whole partition: the segments to read
    (the active one too), the last stable offset and the aborted transactions below it."""

    segments: tuple[LogSegment, ...]
    stable_offset: int
    aborted: tuple[AbortedTxn, ...]


def audit_scope(plog: PartitionLog) -> AuditScope:
    """`plog`'s audit scope now; CleanerdError if its metadata cannot be read."""
    segments, stable = plog.stable_view()
    aborted = plog.collect_aborted_transactions(plog.log_start_offset, stable)
    return AuditScope(segments, stable, tuple(aborted))


def partition_audit(
    log_dir: str,
    tp: TopicPartition,
    strategy: ResolvedStrategy,
    max_compaction_lag_ms: int,
    read: AuditColumns | AuditResult | str,
    *,
    now_ms: int,
    slack_ms: int,
    max_listed: int = DEFAULT_MAX_LISTED,
) -> PartitionAudit:
    """The audit of partition `tp` of `log_dir` at `now_ms`: of its candidate rows `read`
    (or their result, audited already), or, when they could not be read, an audit whose
    `error` is `read`."""
    lag = max_compaction_lag_ms
    audit = PartitionAudit(
        log_dir=log_dir,
        topic=tp.topic,
        partition=tp.partition,
        strategy=strategy.strategy.value,
        now_ms=now_ms,
        max_compaction_lag_ms=None if lag >= NO_MAX_COMPACTION_LAG else lag,
        slack_ms=slack_ms,
        result=None,
    )
    if isinstance(read, str):
        return dataclasses.replace(audit, error=read)
    if isinstance(read, AuditResult):
        return dataclasses.replace(audit, result=read)
    result = audit_columns(
        read,
        versioned=strategy.versioned,
        now_ms=now_ms,
        max_compaction_lag_ms=lag,
        slack_ms=slack_ms,
        max_listed=max_listed,
    )
    return dataclasses.replace(audit, result=result)


def audit_partition(
    plog: PartitionLog,
    topic: TopicConfig,
    *,
    now_ms: int,
    slack_ms: int,
    max_listed: int = DEFAULT_MAX_LISTED,
    memory_bytes: int = AUDIT_MEMORY_BYTES,
) -> PartitionAudit:
    """Audit every segment of `plog` (the active one too) under `topic`'s strategy and
    max lag, holding about `memory_bytes` of rows at a time (see the module docstring).
    A corrupt segment gives a PartitionAudit with `error` set."""
    strategy = resolve_strategy(topic.compaction_strategy, topic.compaction_strategy_header)
    reads = 0

    def audit() -> AuditResult:
        nonlocal reads
        reads += 1
        if reads > 1:
            try:
                plog.refresh()  # list again, and read what is there now
            except OSError as exc:
                reason = f"listing it again failed: {failure_text(exc)}"
                raise FileChangedError(reason, path=plog.dir) from exc
        return _audit_in_buckets(
            plog,
            audit_scope(plog),
            strategy,
            lambda cols: audit_columns(
                cols,
                versioned=strategy.versioned,
                now_ms=now_ms,
                max_compaction_lag_ms=topic.max_compaction_lag_ms,
                slack_ms=slack_ms,
                max_listed=max_listed,
            ),
            row_limit=max(1, memory_bytes // ROW_BYTES),
            max_listed=max_listed,
        )

    read: AuditResult | str
    try:
        # A live broker (observe mode) swaps or deletes segments between the listing
        # and the read; a dir this process owns has no other writer.
        read = reread_on_change(audit, gone=partial(_unchangeable, plog))
    except (FileChangedError, FileNotFoundError) as exc:
        read = f"{exc} (changed by another process while read)"
    except CleanerdError as exc:
        read = str(exc)
    return partition_audit(
        str(plog.log_dir),
        plog.topic_partition,
        strategy,
        topic.max_compaction_lag_ms,
        read,
        now_ms=now_ms,
        slack_ms=slack_ms,
        max_listed=max_listed,
    )


def _unchangeable(plog: PartitionLog) -> bool:
    """Whether no further read of `plog` can get past a change: a dir this process owns
    (no other writer), or a partition dir deleted meanwhile (a topic deletion)."""
    return not plog.read_only or partition_dir_gone(plog.dir)


def _audit_in_buckets(
    plog: PartitionLog,
    scope: AuditScope,
    strategy: ResolvedStrategy,
    audit: Callable[[AuditColumns], AuditResult],
    *,
    row_limit: int,
    max_listed: int,
) -> AuditResult:
    """`audit` of the candidate rows of `scope`, read in as many key buckets as keep each
    within `row_limit` rows, the buckets' results merged (see the module docstring)."""
    count = first_buckets(scope, row_limit)
    if count > 1:
        log.info(
            "audit.in_buckets",
            topic=plog.topic_partition.topic,
            partition=plog.topic_partition.partition,
            log_dir=str(plog.log_dir),
            buckets=count,
            row_limit=row_limit,
        )
    todo = [(KeyBucket(index, count), 0) for index in reversed(range(count))]
    results = []
    while todo:
        bucket, splits = todo.pop()
        whole = splits >= MAX_SPLITS
        try:
            cols = read_audit_columns(
                scope.segments,
                strategy=strategy,
                stable_offset=scope.stable_offset,
                aborted=scope.aborted,
                bucket=bucket,
                row_limit=None if whole else row_limit,
            )
        except RowsOverflow:
            low, high = bucket.halves()
            todo += [(high, splits + 1), (low, splits + 1)]
            log.info(
                "audit.bucket_split",
                topic=plog.topic_partition.topic,
                partition=plog.topic_partition.partition,
                bucket=f"{bucket.index}/{bucket.count}",
                halves_read_whole=splits + 1 >= MAX_SPLITS,
            )
            continue
        results.append(audit(cols))
        del cols
    return merge_results(results, max_listed=max_listed)


def first_buckets(scope: AuditScope, row_limit: int) -> int:
    """The key buckets to read `scope` in first (see the module docstring)."""
    if not scope.segments or scope.stable_offset - scope.segments[0].base_offset <= row_limit:
        return 1
    records = 0
    for segment in scope.segments:
        for table in segment.walked(verify_crc=False):
            records += int(table.records_count.sum())
    # Buckets of `row_limit` for the records and a quarter to spare, a power of two.
    wanted = max(1, math.ceil(1.25 * records / row_limit))
    return min(MAX_BUCKETS, 1 << (wanted - 1).bit_length())
