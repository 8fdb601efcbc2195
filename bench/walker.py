"""The batch walker and its CRC-32C: GB/s per core on 1-, 10-, 100- and 1000-record
batches, against references measured in the same run.

For each batch size, `--mb` MB of back-to-back v2 batches (100-byte values, no
compression) are held in memory and timed (CPU time of this process, best of
`--repeat`):

- `walker, CRC checked`: `Walker` over the buffer, tables of 64k rows reused, CRC-32C
  from the `crc32c` package's C routine called by the kernel (what every log-layer
  reader runs);
- `C routine CRC per batch (kernel)`: that CRC alone, no walk;
- `walker, no CRC`: the walk alone (what `verify_crc=False` callers pay);
- `walk() full table`: one table for the whole buffer (what the compaction pass gets);
- `crc32c per batch from Python`: a Python loop calling `crc32c.crc32c` on each batch,
  no walk at all (the floor of any per-batch-Python design);
- `memory read`: `numpy.sum` of the buffer as uint64 (the memory-bandwidth floor).

    python -m bench.walker [--mb 200] [--repeat 3]

Target (issue 12): at least 1 GB/s per core on every batch size, CRC included.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import crc32c
import numpy as np

from cleanerd._jit import jit
from cleanerd.records.batch import encode_batch
from cleanerd.records.crc import ROUTINE, crc32c_at
from cleanerd.records.header import ATTRIBUTES_OFFSET
from cleanerd.records.record import Record
from cleanerd.records.walker import Walker, walk


def segment(records_per_batch: int, mb: float) -> tuple[bytes, int]:
    """`mb` MB of batches of `records_per_batch` records; (bytes, batch size)."""
    records = [
        Record(offset=i, timestamp=1_700_000_000_000 + i, key=b"key-%06d" % i, value=b"v" * 100)
        for i in range(records_per_batch)
    ]
    batch = encode_batch(records, base_offset=0)
    n = max(1, int(mb * 1e6) // len(batch))
    rows = np.frombuffer(batch * n, dtype=np.uint8).reshape(n, len(batch)).copy()
    # Each copy at its own offsets (no CRC covers the base offset): walks check they ascend.
    offsets = (np.arange(n, dtype=np.int64) * records_per_batch).astype(">i8")
    rows[:, :8] = offsets.view(np.uint8).reshape(n, 8)
    return rows.tobytes(), len(batch)


@jit
def _library_crcs(buf: Any, size: int) -> Any:
    """Every batch's CRC through the kernels' C routine, stepping by the batch size (the
    CRC alone, without the walk)."""
    base = buf.ctypes.data
    bad = np.int64(0)
    for p in range(0, buf.shape[0], size):
        bad += crc32c_at(base + p + ATTRIBUTES_OFFSET, size - ATTRIBUTES_OFFSET) < 0
    return bad


def _cases(data: bytes, arr: Any, size: int) -> list[tuple[str, Callable[[], object]]]:
    view = memoryview(data)

    def python_crc() -> None:
        for p in range(0, len(data), size):
            crc32c.crc32c(view[p + ATTRIBUTES_OFFSET : p + size])

    def walked(verify: bool) -> Callable[[], None]:
        def run() -> None:
            for _ in Walker(arr, verify_crc=verify):
                pass

        return run

    return [
        ("walker, CRC checked", walked(True)),
        ("walker, no CRC", walked(False)),
        ("C routine CRC per batch (kernel)", lambda: _library_crcs(arr, size)),
        ("walk() full table, CRC checked", lambda: walk(arr)),
        ("crc32c per batch from Python", python_crc),
        ("memory read (numpy sum)", lambda: arr[: len(arr) // 8 * 8].view(np.uint64).sum()),
    ]


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(
        f"CRC-32C in kernels: {ROUTINE}; {args.mb:.0f} MB per case, CPU time, best of {args.repeat}"
    )
    print(f"{'records/batch':>13} {'batch B':>8}  {'method':<32} {'GB/s':>7} {'ns/batch':>9}")
    for per in (1, 10, 100, 1000):
        data, size = segment(per, args.mb)
        arr = np.frombuffer(data, np.uint8)
        batches = len(data) // size

        cases = _cases(data, arr, size)
        walk(arr[: 2 * size])  # kernels loaded before timing
        _library_crcs(arr[: 2 * size], size)
        for name, fn in cases:
            seconds = best(fn, args.repeat)
            rate = len(data) / seconds / 1e9
            print(f"{per:>13} {size:>8}  {name:<32} {rate:>7.2f} {1e9 * seconds / batches:>9.0f}")


if __name__ == "__main__":
    main()
