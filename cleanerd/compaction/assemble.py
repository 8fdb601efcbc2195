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
LLVM's memcpy, which a loop over bytes in numba does not become.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np
from numpy.typing import NDArray

from cleanerd._jit import jit, on_numba_load
from cleanerd.compaction.batch_retention import NO_HORIZON
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


def _memcpy_typer(
    typingctx: Any, dst: Any, dst_at: Any, src: Any, src_at: Any, n: Any
) -> tuple[Any, Any] | None:
    from numba import types
    from numba.core import cgutils

    # Byte arrays whose elements are adjacent only: the pointer arithmetic assumes it.
    for array in (dst, src):
        if not (isinstance(array, types.Array) and array.layout == "C" and array.ndim == 1):
            return None
        if array.dtype != types.uint8:
            return None
    sig = types.void(dst, dst_at, src, src_at, n)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        dst_v, dst_at_v, src_v, src_at_v, n_v = args
        d = context.make_array(signature.args[0])(context, builder, dst_v)
        s = context.make_array(signature.args[2])(context, builder, src_v)
        to, at = builder.gep(d.data, [dst_at_v]), builder.gep(s.data, [src_at_v])
        cgutils.raw_memcpy(builder, to, at, n_v, 1)  # type: ignore[no-untyped-call]
        return context.get_dummy_value()

    return sig, codegen


_memcpy_at: Any = None
"""memcpy(&dst[dst_at], &src[src_at], n) for two C-contiguous uint8 arrays (jit code only),
declared when numba is imported (kernels are compiled, or loaded from the cache, only
after that): a command that runs no kernel does not import numba for it."""


def _declare() -> None:
    global _memcpy_at
    from numba.extending import intrinsic

    _memcpy_at = intrinsic(_memcpy_typer)


on_numba_load(_declare)


@jit
def _memcpy(src: NDArray[np.uint8], s: int, dst: NDArray[np.uint8], d: int, n: int) -> int:
    """Copy src[s:s+n] to dst[d:d+n] (no overlap); returns d + n."""
    if n > 0:
        _memcpy_at(dst, d, src, s, n)
    return d + n


@jit
def _skip_varint(buf: NDArray[np.uint8], p: int) -> int:
    """The position after the varint at `p`."""
    while buf[p] >= 0x80:
        p += 1
    return p + 1


@jit
def _put_varint(out: NDArray[np.uint8], p: int, value: int) -> int:
    """Write `value` zig-zag encoded at `p`; returns the position after it."""
    u = (value << 1) ^ (value >> 63)
    while True:
        b = u & 0x7F
        u = (u >> 7) & ((1 << 57) - 1)
        if u:
            out[p] = b | 0x80
            p += 1
        else:
            out[p] = b
            return p + 1


@jit
def _varint_size(value: int) -> int:
    """How many bytes `_put_varint` writes for `value`."""
    u = ((value << 1) ^ (value >> 63)) >> 7 & ((1 << 57) - 1)
    n = 1
    while u:
        u >>= 7
        n += 1
    return n


@jit
def _rewrite_record(
    buf: NDArray[np.uint8],
    start: int,
    end: int,
    ts_delta: int,
    out: NDArray[np.uint8],
    o: int,
) -> int:
    """Write the v2 record buf[start:end] at out[o] with the timestamp delta `ts_delta`;
    returns where it ends. Only the length and timestamp-delta varints change: the
    offset delta stays valid because the batch keeps its base offset."""
    attr = _skip_varint(buf, start)
    ts_end = _skip_varint(buf, attr + 1)
    tail = end - ts_end
    o = _put_varint(out, o, 1 + _varint_size(ts_delta) + tail)
    out[o] = buf[attr]
    o = _put_varint(out, o + 1, ts_delta)
    return _memcpy(buf, ts_end, out, o, tail)


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
    o = 0
    for i in range(rec_start.shape[0]):
        o = _rewrite_record(buf, rec_start[i], rec_end[i], new_ts_delta[i], out, o)
        written[i] = o


@jit
def _put_be(out: NDArray[np.uint8], p: int, value: int, width: int) -> None:
    """Write the `width` low bytes of `value` big-endian at `p`."""
    for k in range(width):
        out[p + width - 1 - k] = (value >> (8 * k)) & 0xFF


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
) -> tuple[int, int, int]:
    """Write the output of batches [b0, b1) into `out`, back to back: COPY batches from
    `segment` as they are; a batch prebuilt whole (`prebuilt[i]` = (start, end, max
    timestamp, PREBUILT_BATCH) in `blob`; start -1 for none) from `blob`; the other
    REENCODE batches with the header of their kept records and, as records area, either
    their prebuilt (compressed) body from `blob` (PREBUILT_BODY) or their kept records
    rewritten here from `buf` (uncompressed v2), the CRC left zero. `heads` are the
    source batch table's columns (`BatchHeads`).

    Returns (bytes written, output batches, batches needing a CRC); `table[n]` = (end,
    base offset, last offset, max timestamp) of output batch n, `crc_rows` the output
    batches whose CRC is to be computed."""
    o = 0
    n = 0
    n_crc = 0
    for i in range(b0, b1):
        action = actions[i]
        if action == 0:  # SKIP
            continue
        base = heads[0][i]
        max_ts = heads[4][i]
        if prebuilt[i, 3] == PREBUILT_BATCH:
            o = _memcpy(blob, prebuilt[i, 0], out, o, prebuilt[i, 1] - prebuilt[i, 0])
            max_ts = prebuilt[i, 2]
        elif action == 1:  # COPY
            o = _memcpy(segment, heads[8][i], out, o, heads[9][i])
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
            q = o + RECORD_BATCH_OVERHEAD
            if prebuilt[i, 3] == PREBUILT_BODY:
                q = _memcpy(blob, prebuilt[i, 0], out, q, prebuilt[i, 1] - prebuilt[i, 0])
            else:
                for j in range(first, first + count):
                    if keep[j]:
                        q = _rewrite_record(
                            buf, record_pos[j], record_end[j], timestamps[j] - base_ts, out, q
                        )
            _put_be(out, o + BASE_OFFSET_OFFSET, base, 8)
            _put_be(out, o + LENGTH_OFFSET, q - o - LOG_OVERHEAD, 4)
            _put_be(out, o + PARTITION_LEADER_EPOCH_OFFSET, heads[1][i], 4)
            out[o + MAGIC_OFFSET] = 2
            _put_be(out, o + CRC_OFFSET, 0, 4)
            _put_be(out, o + ATTRIBUTES_OFFSET, attributes, 2)
            _put_be(out, o + LAST_OFFSET_DELTA_OFFSET, heads[3][i], 4)
            _put_be(out, o + BASE_TIMESTAMP_OFFSET, base_ts, 8)
            _put_be(out, o + MAX_TIMESTAMP_OFFSET, max_ts, 8)
            _put_be(out, o + PRODUCER_ID_OFFSET, heads[5][i], 8)
            _put_be(out, o + PRODUCER_EPOCH_OFFSET, heads[6][i], 2)
            _put_be(out, o + BASE_SEQUENCE_OFFSET, heads[7][i], 4)
            _put_be(out, o + RECORDS_COUNT_OFFSET, kept, 4)
            o = q
            crc_rows[n_crc] = n
            n_crc += 1
        table[n, 0] = o
        table[n, 1] = base
        table[n, 2] = base + heads[3][i]
        table[n, 3] = max_ts
        n += 1
    return o, n, n_crc
