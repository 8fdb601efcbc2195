"""KIP-280 compaction strategies: which record of a key survives compaction.

KIP-280 was accepted but never shipped by Apache Kafka; cleanerd implements it as an
extension and pins this encoding:

- ``compaction.strategy`` is ``offset`` (the default, also when empty: Kafka's rule, the
  highest offset wins), ``timestamp`` or ``header``.
- Every strategy but ``offset`` gives a record a *version* (int64) or none, and a record
  beats another of the same key when: it has a version and the other has none; both have
  one and its version is higher; or the versions are equal, or neither has one, and its
  offset is higher.
- ``timestamp``: the version is the record's timestamp, always present. In a batch with
  LogAppendTime, every record's timestamp is the batch's maxTimestamp (the stored deltas
  are ignored, as Kafka's readers do).
- ``header``: the header key is ``compaction.strategy.header``; when that is unset or
  blank the strategy falls back to ``offset`` and the resolution carries a warning for
  the caller to log. In the record's header area (Kafka's record format: per header a
  zig-zag varint key length, the UTF-8 key bytes, a zig-zag varint value length with -1
  for null, the value bytes) the *last* header whose key equals the name, byte for byte,
  counts. Its value is the version if it is exactly 8 bytes, read as a big-endian signed
  long; a null value or any other length means the record has no version. Earlier
  occurrences are ignored even when the last one is unusable.

Header areas are checked as they are walked: a varint longer than 5 bytes, a negative key
length, a value length below -1, or a field running past the record's header area raises
CorruptRecordError with the byte position in the buffer given.

Which strategy computes versions how is one registry, `STRATEGIES`; the local pass, the
Spark clean job and the audit all rank records through it (`segment_versions`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, TypeAlias

import numpy as np
from numpy.typing import ArrayLike, NDArray

from cleanerd._jit import jit
from cleanerd.errors import ConfigError, CorruptRecordError
from cleanerd.log.segment_reader import JoinedBuffer
from cleanerd.records.address import Int, be_i64, bytes_address, load_u8
from cleanerd.records.columns import SegmentColumns
from cleanerd.records.header import TIMESTAMP_TYPE_MASK

STRATEGY_KEY: Final = "compaction.strategy"
STRATEGY_HEADER_KEY: Final = "compaction.strategy.header"


class CompactionStrategy(enum.StrEnum):
    """The values of ``compaction.strategy``."""

    OFFSET = "offset"
    TIMESTAMP = "timestamp"
    HEADER = "header"


@dataclass(frozen=True, slots=True)
class ResolvedStrategy:
    """The strategy a log is compacted with, after the header fallback.

    `header` is the UTF-8 header key for HEADER, else None; `warning` is set when the
    configured strategy could not be used as given and says why.
    """

    strategy: CompactionStrategy
    header: bytes | None = None
    warning: str | None = None

    @property
    def versioned(self) -> bool:
        """Whether records carry a version (every strategy but offset)."""
        return is_versioned(self.strategy)


def is_versioned(strategy: CompactionStrategy) -> bool:
    """Whether the records of `strategy` carry versions (`STRATEGIES`)."""
    return STRATEGIES[strategy] is not None


def resolve_strategy(name: str, header: str | None) -> ResolvedStrategy:
    """Resolve the configured ``compaction.strategy`` and ``compaction.strategy.header``.

    An empty name means offset. Raises ConfigError for an unknown name.
    """
    if name == "":
        return ResolvedStrategy(CompactionStrategy.OFFSET)
    try:
        strategy = CompactionStrategy(name)
    except ValueError:
        choices = ", ".join(s.value for s in CompactionStrategy)
        raise ConfigError(
            [f"Invalid value {name!r} for configuration {STRATEGY_KEY}: must be one of {choices}"]
        ) from None
    if strategy is not CompactionStrategy.HEADER:
        return ResolvedStrategy(strategy)
    if header is None or not header.strip():
        return ResolvedStrategy(
            CompactionStrategy.OFFSET,
            warning=(
                f"{STRATEGY_KEY}=header but {STRATEGY_HEADER_KEY} is unset or blank; "
                "compacting with the offset strategy"
            ),
        )
    return ResolvedStrategy(strategy, header=header.encode("utf-8"))


def timestamp_versions(
    timestamps: ArrayLike,
    batch_max_timestamps: ArrayLike,
    log_append_time: ArrayLike,
) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
    """Versions for the timestamp strategy, one per record: the record's timestamp, or
    its batch's maxTimestamp where the batch uses LogAppendTime. All are present."""
    versions = np.where(log_append_time, batch_max_timestamps, timestamps).astype(np.int64)
    return versions, np.ones(versions.shape, dtype=np.bool_)


_ERR_NONE: Final = 0
_ERR_COUNT: Final = 1
_ERR_VARINT_LONG: Final = 2
_ERR_TRUNCATED: Final = 3
_ERR_KEY_LEN: Final = 4
_ERR_VALUE_LEN: Final = 5
_ERR_AREA: Final = 6

_ERROR_REASONS: Final = {
    _ERR_COUNT: "negative header count",
    _ERR_VARINT_LONG: "varint longer than 5 bytes in the header area",
    _ERR_TRUNCATED: "header field runs past the end of the record's header area",
    _ERR_KEY_LEN: "negative header key length",
    _ERR_VALUE_LEN: "header value length below -1",
    _ERR_AREA: "header area lies outside the buffer",
}

_VARINT_MAX_BYTES: Final = 5
_VERSION_BYTES: Final = 8


@jit
def _read_varint(at: Int, pos: int, end: int) -> tuple[int, int, int]:
    """Decode the zig-zag varint at byte `pos` of the bytes at address `at` (reading no
    further than `end`): (value, next position, error code)."""
    raw = 0
    for i in range(_VARINT_MAX_BYTES):
        if pos + i >= end:
            return 0, pos, _ERR_TRUNCATED
        b = int(load_u8(at + pos + i))
        raw |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            raw &= 0xFFFFFFFF  # bits past 32 fall away, as in Kafka's int arithmetic
            return (raw >> 1) ^ -(raw & 1), pos + i + 1, _ERR_NONE
    return 0, pos, _ERR_VARINT_LONG


@jit
def _matches(at: Int, pos: int, name_at: Int, name_len: int) -> bool:
    """Whether the `name_len` bytes from `pos` at address `at` are those at `name_at`."""
    for i in range(name_len):  # noqa: SIM110 - numba compiles no generator in all()
        if load_u8(at + pos + i) != load_u8(name_at + i):
            return False
    return True


@jit
def _header_versions_kernel(
    buf: NDArray[np.uint8],
    headers_pos: NDArray[np.int64],
    header_count: NDArray[np.int64],
    headers_end: NDArray[np.int64],
    name: NDArray[np.uint8],
) -> tuple[NDArray[np.int64], NDArray[np.bool_], int, int, int]:
    """Walk each record's headers; returns (versions, has_version, error code, error
    position, record index of the error). The helpers read at the arrays' addresses
    (`address.py`; both are C-contiguous, and held here)."""
    at, name_at = bytes_address(buf), bytes_address(name)
    n = headers_pos.shape[0]
    versions = np.zeros(n, dtype=np.int64)
    has = np.zeros(n, dtype=np.bool_)
    name_len = name.shape[0]
    for r in range(n):
        pos = headers_pos[r]
        end = headers_end[r]
        if header_count[r] < 0:
            return versions, has, _ERR_COUNT, pos, r
        if header_count[r] == 0:  # no version; a legacy record has no header area at all
            continue
        if pos < 0 or end > buf.shape[0] or pos > end:
            return versions, has, _ERR_AREA, pos, r
        value_pos = -1
        value_len = -1
        for _ in range(header_count[r]):
            key_len, next_pos, err = _read_varint(at, pos, end)
            if err != _ERR_NONE:
                return versions, has, err, pos, r
            if key_len < 0:
                return versions, has, _ERR_KEY_LEN, pos, r
            if key_len > end - next_pos:
                return versions, has, _ERR_TRUNCATED, next_pos, r
            key_pos = next_pos
            pos = next_pos + key_len
            vlen, next_pos, err = _read_varint(at, pos, end)
            if err != _ERR_NONE:
                return versions, has, err, pos, r
            if vlen < -1:
                return versions, has, _ERR_VALUE_LEN, pos, r
            if vlen > end - next_pos:
                return versions, has, _ERR_TRUNCATED, next_pos, r
            if key_len == name_len and _matches(at, key_pos, name_at, name_len):
                value_pos = next_pos
                value_len = vlen
            pos = next_pos + max(vlen, 0)
        if value_len == _VERSION_BYTES:
            versions[r] = be_i64(at, value_pos)
            has[r] = True
    return versions, has, _ERR_NONE, 0, 0


def header_versions(
    buf: ArrayLike,
    headers_pos: ArrayLike,
    header_count: ArrayLike,
    name: bytes,
    headers_end: ArrayLike | None = None,
) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
    """Versions for the header strategy, one per record.

    Record i's headers start at ``headers_pos[i]`` in `buf` (just after the header-count
    varint), number ``header_count[i]`` and must end by ``headers_end[i]`` (the record's
    end; the end of `buf` if not given). Returns (versions, has_version); versions are 0
    where absent. Raises CorruptRecordError (position within `buf`) on malformed headers.
    """
    data = np.ascontiguousarray(buf, dtype=np.uint8).reshape(-1)
    pos = np.ascontiguousarray(headers_pos, dtype=np.int64).reshape(-1)
    count = np.ascontiguousarray(header_count, dtype=np.int64).reshape(-1)
    if headers_end is None:
        end = np.full(pos.shape, data.size, dtype=np.int64)
    else:
        end = np.ascontiguousarray(headers_end, dtype=np.int64).reshape(-1)
    if not pos.shape == count.shape == end.shape:
        raise ValueError("headers_pos, header_count and headers_end differ in length")
    versions, has, err, err_pos, record = _header_versions_kernel(
        data, pos, count, end, np.frombuffer(name, dtype=np.uint8)
    )
    if err != _ERR_NONE:
        raise CorruptRecordError(f"record {record}: {_ERROR_REASONS[err]}", position=err_pos)
    return versions, has


Versions: TypeAlias = tuple[NDArray[np.int64], NDArray[np.bool_]]
"""(versions, has_version), one row per record."""


@dataclass(frozen=True, slots=True)
class VersionInputs:
    """The per-record columns a strategy's versions are computed from; None where the
    caller has not supplied one (a strategy that needs it raises ValueError)."""

    timestamps: ArrayLike | None = None
    batch_max_timestamps: ArrayLike | None = None
    log_append_time: ArrayLike | None = None
    buf: ArrayLike | None = None
    headers_pos: ArrayLike | None = None
    header_count: ArrayLike | None = None
    headers_end: ArrayLike | None = None


def _by_timestamp(resolved: ResolvedStrategy, cols: VersionInputs) -> Versions:
    if cols.timestamps is None or cols.batch_max_timestamps is None or cols.log_append_time is None:
        raise ValueError(
            "the timestamp strategy needs timestamps, batch_max_timestamps and log_append_time"
        )
    return timestamp_versions(cols.timestamps, cols.batch_max_timestamps, cols.log_append_time)


def _by_header(resolved: ResolvedStrategy, cols: VersionInputs) -> Versions:
    if (
        cols.buf is None
        or cols.headers_pos is None
        or cols.header_count is None
        or resolved.header is None
    ):
        raise ValueError(
            "the header strategy needs a header name, buf, headers_pos and header_count"
        )
    return header_versions(
        cols.buf, cols.headers_pos, cols.header_count, resolved.header, cols.headers_end
    )


VersionRule: TypeAlias = Callable[[ResolvedStrategy, VersionInputs], Versions]

STRATEGIES: Final[Mapping[CompactionStrategy, VersionRule | None]] = MappingProxyType(
    {
        CompactionStrategy.OFFSET: None,
        CompactionStrategy.TIMESTAMP: _by_timestamp,
        CompactionStrategy.HEADER: _by_header,
    }
)
"""The strategy registry: how each strategy computes its records' versions (None: its
records have none, and the highest offset wins). Every engine and the audit rank records
through it (`record_versions`, `segment_versions`), so a new strategy is a
`CompactionStrategy` value (and its resolution in `resolve_strategy`) plus an entry here."""


def record_versions(
    resolved: ResolvedStrategy,
    *,
    timestamps: ArrayLike | None = None,
    batch_max_timestamps: ArrayLike | None = None,
    log_append_time: ArrayLike | None = None,
    buf: ArrayLike | None = None,
    headers_pos: ArrayLike | None = None,
    header_count: ArrayLike | None = None,
    headers_end: ArrayLike | None = None,
) -> Versions | None:
    """The (versions, has_version) columns of a run of records under `resolved`, or None
    for a strategy without versions (offset).

    The timestamp strategy needs `timestamps`, `batch_max_timestamps` and
    `log_append_time` (per record); the header strategy needs `buf`, `headers_pos` and
    `header_count` (and takes `headers_end`). Raises ValueError if those are missing.
    """
    rule = STRATEGIES[resolved.strategy]
    if rule is None:
        return None
    inputs = VersionInputs(
        timestamps=timestamps,
        batch_max_timestamps=batch_max_timestamps,
        log_append_time=log_append_time,
        buf=buf,
        headers_pos=headers_pos,
        header_count=header_count,
        headers_end=headers_end,
    )
    return rule(resolved, inputs)


def segment_versions(
    resolved: ResolvedStrategy,
    sc: SegmentColumns,
    joined: JoinedBuffer,
    rows: NDArray[np.int64],
) -> Versions:
    """The versions of the records `rows` (record table rows) of the decoded segment `sc`,
    whose bytes are all in `joined` (`segment_reader.join_buffers(sc)`): those of
    `record_versions`, or none (all 0, absent) for a strategy without versions."""
    if not resolved.versioned:
        return np.zeros(rows.size, np.int64), np.zeros(rows.size, np.bool_)
    bi = sc.batch_index[rows]
    versions = record_versions(
        resolved,
        timestamps=sc.timestamp[rows],
        batch_max_timestamps=sc.max_timestamp[bi],
        log_append_time=(sc.attributes[bi] & TIMESTAMP_TYPE_MASK) != 0,
        buf=joined.buf,
        headers_pos=joined.headers_pos[rows],
        header_count=sc.header_count[rows],
        headers_end=joined.record_pos[rows] + sc.record_size[rows],
    )
    assert versions is not None, "a versioned strategy has a version rule"
    return versions
