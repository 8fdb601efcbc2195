"""What the bytes after a segment's last whole batch are.

A writer appends a batch with one write; a reader of the file while it happens (an
observer beside a live broker), or a loader after a crash in the middle of one, finds a
valid prefix followed by part of a batch: zeros (blocks allocated, not yet written), a
batch whose declared length runs past the end of the file, a last batch whose bytes
are all there but whose CRC does not match yet, or such a batch followed by zeros to
the end of the file (the write cut short in a file extended past it), or only the first
bytes of a batch header followed by zeros (so in a preallocated file).
`torn_tail_reason` tells such a tail from damage: a tail is an append in flight (or cut
short) only when nothing valid follows it and it has one of those shapes; anything else
is corruption to report, never to cut or skip. A whole batch whose offsets are out of
place (`walker.BadOffsetError`) is such damage, wherever it is: a torn append fails its
structure or its CRC, and a base offset is written before them. So is a last batch
of any of those shapes where offsets below the recovery point belong: the checkpoint named
those offsets only after they were flushed, so a crash cannot have cut them, and bytes
that changed or went missing since (a batch failing its CRC, cut short, zeros) are damage,
whatever a run before knew of the dir. (Kafka's loader cuts them after an unclean stop:
cleanerd reports them and leaves them, so that the same bytes get the same verdict after a
clean stop and after a crash.)
"""

from __future__ import annotations

from typing import Final

import numpy as np

from cleanerd.records.header import (
    INT32_MAX,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    PREFIX_SIZE,
    RECORD_BATCH_OVERHEAD,
    Buffer,
    base_offset_at,
)
from cleanerd.records.walker import U8, BadOffsetError, Walk, walk

ZERO_TAIL: Final = "zero bytes after the last batch"


def torn_tail_reason(buf: Buffer, scan: Walk, *, flushed_to: int = 0) -> str | None:
    """Why the bytes after the valid prefix are a crash-interrupted append, or None when
    they are something else (corruption that must be reported, not cut). `flushed_to`:
    the recovery point its partition's checkpoint names."""
    if scan.error is None or isinstance(scan.error, BadOffsetError):
        return None
    start = scan.stop
    if _first_offset_after(scan) < flushed_to:
        return None  # flushed whole, then changed or lost: no append was in flight
    data = np.frombuffer(buf, dtype=np.uint8)
    if not data[start:].any():
        return ZERO_TAIL
    if _valid_batch_after(buf, start) is not None:
        return None
    if scan.incomplete_tail:
        return f"incomplete batch: {scan.error.reason}"
    if len(buf) - start >= PREFIX_SIZE:
        at = start + LENGTH_OFFSET
        size = int.from_bytes(buf[at : at + 4], "big", signed=True) + LOG_OVERHEAD
        if size == len(buf) - start:
            if walk(buf, start=start, verify_crc=False).error is None:
                return f"last batch fails its CRC: {scan.error.reason}"
            if not _header_cut_before_zeros(data, start, size, scan):
                return None
            # The file was extended to the batch's end (a crash left its blocks
            # allocated), but only the first fields of its header were written.
            return f"a batch header cut short, zero bytes after it: {scan.error.reason}"
        if (
            RECORD_BATCH_OVERHEAD <= size < len(buf) - start
            and data[start + MAGIC_OFFSET] == 2
            and not data[start + size :].any()
        ):
            # Blocks allocated past the batch and never written: the write of the batch
            # itself was cut (some of its pages may be zeros too), as when a crash
            # interrupts an append to a preallocated or extended file.
            return f"last batch fails its CRC, zero bytes after it: {scan.error.reason}"
        if _header_cut_before_zeros(data, start, size, scan):
            # The same with less of the batch written: only its first bytes (the base
            # offset, maybe the length), as a reader beside a broker appending to a
            # preallocated segment (`log.preallocate`) sees it, or a crash leaves it.
            return f"a batch header cut short, zero bytes after it: {scan.error.reason}"
    return None


def _header_cut_before_zeros(data: U8, start: int, size: int, scan: Walk) -> bool:
    """Whether the bytes at `start` are the first fields of a batch header, written in
    their order, before the magic byte, and nothing but zeros follows them to the end:
    a base offset the batch after the walk may have (above its last offset, in its
    range), then either no length yet (nor anything after it) or a length (`size` with
    the log overhead) that fits."""
    if data[start + MAGIC_OFFSET :].any():
        return False  # a written magic byte is the rule above's
    base = base_offset_at(data.data, start)
    if base <= scan.last_offset or scan.offsets.refusal(base, 0, v2=True) is not None:
        return False
    if base - scan.offsets.base > INT32_MAX:
        return False  # past what the active segment's index holds, whatever range was given
    if size == LOG_OVERHEAD:  # no length yet: nothing written after the base offset
        return not data[start + LENGTH_OFFSET :].any()
    return RECORD_BATCH_OVERHEAD <= size <= len(data) - start


def _first_offset_after(scan: Walk) -> int:
    """The least offset the bytes after the valid prefix may hold: one past the prefix's
    last, or, when the walk found no batch before them, the least its range allows (a
    segment's base, or one past what a walk from an index entry knows is before it): not
    what their own header says, which zeros or damage make up."""
    if scan.last_offset >= 0:
        return scan.last_offset + 1
    return max(scan.offsets.low, scan.offsets.base)


def _valid_batch_after(buf: Buffer, start: int) -> int | None:
    """Position of the first whole v2 batch with a valid CRC starting after `start`.

    A crash mid-append leaves one partial batch as the very last bytes, so a valid batch
    further on means the bytes at `start` are damage in the middle, not a torn tail."""
    data = np.frombuffer(buf, dtype=np.uint8)
    end = data.size
    if end - start < RECORD_BATCH_OVERHEAD + 1:
        return None
    candidates = np.flatnonzero(
        data[start + 1 + MAGIC_OFFSET : end - RECORD_BATCH_OVERHEAD + 1 + MAGIC_OFFSET] == 2
    )
    positions = candidates + start + 1
    at = positions + LENGTH_OFFSET
    lengths = (
        data[at].astype(np.int64) << 24
        | data[at + 1].astype(np.int64) << 16
        | data[at + 2].astype(np.int64) << 8
        | data[at + 3].astype(np.int64)
    )
    sizes = lengths + LOG_OVERHEAD
    plausible = (sizes >= RECORD_BATCH_OVERHEAD) & (positions + sizes <= end)
    for position, size in zip(
        positions[plausible].tolist(), sizes[plausible].tolist(), strict=True
    ):
        if walk(buf, start=position, end=position + size).error is None:
            return int(position)
    return None
