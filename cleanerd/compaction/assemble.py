"""Writing cleaned batches from the bytes of the source segment, without decoding and
re-encoding records (numba kernels).

A v2 record is ``length varint | attributes int8 | timestampDelta varlong | offsetDelta
varint | key | value | headers``. A record kept in a re-encoded batch keeps its bytes
from the offset delta on; only its timestamp delta changes (the batch's base timestamp
becomes the delete horizon, or the first kept record's timestamp), and with it the
length varint. The offset delta stays valid because the batch keeps its base offset.

`assemble_chunk` writes the whole output of a run of batches into one buffer: COPY
batches byte for byte; batches to re-encode with the header of Kafka's
`MemoryRecords.filterTo` (``batch_retention.py``) and, as records area, their kept
records rewritten as above (uncompressed v2) or the compressed area Python made of them
(the codecs are C libraries called per batch); and batches prebuilt whole in Python
(empty headers, legacy entries, both rare). It leaves the CRC of the batches it heads at
zero: CRC-32C runs in C (`crc32c`) afterwards, one call per batch. Bytes are moved with
LLVM's memcpy (`address.copy_bytes`), which a loop over bytes in numba does not become.
"""

from __future__ import annotations

from typing import TypeAlias

import numpy as np
from numpy.typing import NDArray

from cleanerd._jit import jit
from cleanerd.compaction.batch_retention import NO_HORIZON
from cleanerd.records.address import Int, bytes_address, copy_bytes, load_u8, store_u8
from cleanerd.records.header import (
    ATTRIBUTES_OFFSET,
    BASE_OFFSET_OFFSET,
    BASE_SEQUENCE_OFFSET,
    BASE_TIMESTAMP_OFFSET,
    CRC_OFFSET,
    DELETE_HORIZON_MASK,
    LAST_OFFSET_DELTA_OFFSET,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    MAX_TIMESTAMP_OFFSET,
    PARTITION_LEADER_EPOCH_OFFSET,
    PRODUCER_EPOCH_OFFSET,
    PRODUCER_ID_OFFSET,
    RECORD_BATCH_OVERHEAD,
    RECORDS_COUNT_OFFSET,
    TIMESTAMP_TYPE_MASK,
)


@jit
def _copy(at: Int, s: Int, to: Int, d: Int, n: Int) -> Int:
    """Copy the `n` bytes from `s` at address `at` to `d` at address `to` (no overlap);
    returns d + n."""
    copy_bytes(to + d, at + s, n)
    return d + n


@jit
def _skip_varint(at: Int, p: Int) -> Int:
    """The position after the varint at byte `p` of the bytes at address `at`."""
    while load_u8(at + p) >= 0x80:
        p += 1
    return p + 1


@jit
def _put_varint(to: Int, p: Int, value: Int) -> Int:
    """Write `value` zig-zag encoded at byte `p` of the bytes at address `to`; returns the
    position after it."""
    u = (value << 1) ^ (value >> 63)
    while True:
        b = u & 0x7F
        u = (u >> 7) & ((1 << 57) - 1)
        if u:
            store_u8(to + p, b | 0x80)
            p += 1
        else:
            store_u8(to + p, b)
            return p + 1


@jit
def _varint_size(value: Int) -> Int:
    """How many bytes `_put_varint` writes for `value`."""
    u = ((value << 1) ^ (value >> 63)) >> 7 & ((1 << 57) - 1)
    n = 1
    while u:
        u >>= 7
        n += 1
    return n


@jit
def _rewrite_record(at: Int, start: Int, end: Int, ts_delta: Int, to: Int, o: Int) -> Int:
    """Write the v2 record at bytes [start, end) of address `at` to byte `o` of address
    `to` with the timestamp delta `ts_delta`; returns where it ends. Only the length and
    timestamp-delta varints change: the offset delta stays valid because the batch keeps
    its base offset."""
    attr = _skip_varint(at, start)
    ts_end = _skip_varint(at, attr + 1)
    tail = end - ts_end
    o = _put_varint(to, o, 1 + _varint_size(ts_delta) + tail)
    store_u8(to + o, load_u8(at + attr))
    o = _put_varint(to, o + 1, ts_delta)
    return _copy(at, ts_end, to, o, tail)


@jit
def rewrite_records(
    buf: NDArray[np.uint8],
    rec_start: NDArray[np.int64],
    rec_end: NDArray[np.int64],
    new_ts_delta: NDArray[np.int64],
    out: NDArray[np.uint8],
    written: NDArray[np.int64],
) -> None:
    """Write the v2 records [rec_start, rec_end) of `buf` back to back into `out` with new
    timestamp deltas, `written[i]` receiving the end of record i in `out`."""
    at, to = bytes_address(buf), bytes_address(out)
    o: Int = 0
    for i in range(rec_start.shape[0]):
        o = _rewrite_record(at, rec_start[i], rec_end[i], new_ts_delta[i], to, o)
        written[i] = o


@jit
def _put_be(to: Int, p: Int, value: Int, width: Int) -> None:
    """Write the `width` low bytes of `value` big-endian at byte `p` of address `to`."""
    for k in range(width):
        store_u8(to + p + width - 1 - k, value >> (8 * k))


BatchHeads: TypeAlias = tuple[
    NDArray[np.int64],  # base offset
    NDArray[np.int32],  # partition leader epoch
    NDArray[np.int16],  # attributes
    NDArray[np.int32],  # last offset delta
    NDArray[np.int64],  # max timestamp
    NDArray[np.int64],  # producer id
    NDArray[np.int16],  # producer epoch
    NDArray[np.int32],  # base sequence
    NDArray[np.int64],  # position in the segment
    NDArray[np.int64],  # size
    NDArray[np.int64],  # first record row
    NDArray[np.int32],  # record count
]
"""The columns of a segment's batch table that `assemble_chunk` reads, as they are
(a tuple of arrays: gathering them into one table costs more than the assembly)."""

PREBUILT_BATCH = 0
"""`prebuilt[i, 3]`: the blob holds batch i whole."""
PREBUILT_BODY = 1
"""`prebuilt[i, 3]`: the blob holds batch i's records area (compressed); the kernel
writes its header."""


@jit
def assemble_chunk(
    segment: NDArray[np.uint8],
    buf: NDArray[np.uint8],
    b0: int,
    b1: int,
    actions: NDArray[np.int64],
    heads: BatchHeads,
    horizons: NDArray[np.int64],
    keep: NDArray[np.bool_],
    record_pos: NDArray[np.int64],
    record_end: NDArray[np.int64],
    timestamps: NDArray[np.int64],
    prebuilt: NDArray[np.int64],
    blob: NDArray[np.uint8],
    out: NDArray[np.uint8],
    table: NDArray[np.int64],
    crc_rows: NDArray[np.int64],
) -> tuple[Int, int, int]:
    """Write the output of batches [b0, b1) into `out`, back to back: COPY batches from
    `segment` as they are; a batch prebuilt whole (`prebuilt[i]` = (start, end, max
    timestamp, PREBUILT_BATCH) in `blob`; start -1 for none) from `blob`; the other
    REENCODE batches with the header of their kept records and, as records area, either
    their prebuilt (compressed) body from `blob` (PREBUILT_BODY) or their kept records
    rewritten here from `buf` (uncompressed v2), the CRC left zero. `heads` are the
    source batch table's columns (`BatchHeads`).

    Returns (bytes written, output batches, batches needing a CRC); `table[n]` = (end,
    base offset, last offset, max timestamp) of output batch n, `crc_rows` the output
    batches whose CRC is to be computed. The helpers read and write at the arrays'
    addresses (`address.py`; the arrays are C-contiguous, and held here)."""
    seg_at, buf_at, blob_at, to = (
        bytes_address(segment),
        bytes_address(buf),
        bytes_address(blob),
        bytes_address(out),
    )
    o: Int = 0
    n = 0
    n_crc = 0
    for i in range(b0, b1):
        action = actions[i]
        if action == 0:  # SKIP
            continue
        base = heads[0][i]
        max_ts = heads[4][i]
        if prebuilt[i, 3] == PREBUILT_BATCH:
            o = _copy(blob_at, prebuilt[i, 0], to, o, prebuilt[i, 1] - prebuilt[i, 0])
            max_ts = prebuilt[i, 2]
        elif action == 1:  # COPY
            o = _copy(seg_at, heads[8][i], to, o, heads[9][i])
        else:  # REENCODE
            first, count = heads[10][i], heads[11][i]
            attributes = heads[2][i]
            horizon = horizons[i]
            base_ts = horizon
            kept_max = np.int64(-(2**63))
            kept = 0
            for j in range(first, first + count):
                if keep[j]:
                    if kept == 0 and horizon == NO_HORIZON:
                        base_ts = timestamps[j]
                    kept_max = max(kept_max, timestamps[j])
                    kept += 1
            if attributes & TIMESTAMP_TYPE_MASK == 0:
                max_ts = kept_max
            if horizon != NO_HORIZON:
                attributes |= DELETE_HORIZON_MASK
            else:
                attributes &= ~DELETE_HORIZON_MASK
            q: Int = o + RECORD_BATCH_OVERHEAD
            if prebuilt[i, 3] == PREBUILT_BODY:
                q = _copy(blob_at, prebuilt[i, 0], to, q, prebuilt[i, 1] - prebuilt[i, 0])
            else:
                for j in range(first, first + count):
                    if keep[j]:
                        q = _rewrite_record(
                            buf_at, record_pos[j], record_end[j], timestamps[j] - base_ts, to, q
                        )
            _put_be(to, o + BASE_OFFSET_OFFSET, base, 8)
            _put_be(to, o + LENGTH_OFFSET, q - o - LOG_OVERHEAD, 4)
            _put_be(to, o + PARTITION_LEADER_EPOCH_OFFSET, heads[1][i], 4)
            store_u8(to + o + MAGIC_OFFSET, 2)
            _put_be(to, o + CRC_OFFSET, 0, 4)
            _put_be(to, o + ATTRIBUTES_OFFSET, attributes, 2)
            _put_be(to, o + LAST_OFFSET_DELTA_OFFSET, heads[3][i], 4)
            _put_be(to, o + BASE_TIMESTAMP_OFFSET, base_ts, 8)
            _put_be(to, o + MAX_TIMESTAMP_OFFSET, max_ts, 8)
            _put_be(to, o + PRODUCER_ID_OFFSET, heads[5][i], 8)
            _put_be(to, o + PRODUCER_EPOCH_OFFSET, heads[6][i], 2)
            _put_be(to, o + BASE_SEQUENCE_OFFSET, heads[7][i], 4)
            _put_be(to, o + RECORDS_COUNT_OFFSET, kept, 4)
            o = q
            crc_rows[n_crc] = n
            n_crc += 1
        table[n, 0] = o
        table[n, 1] = base
        table[n, 2] = base + heads[3][i]
        table[n, 3] = max_ts
        n += 1
    return o, n, n_crc
