"""The memory of one cleaner thread's offset map, and whether it can hold a key.

Kafka splits `log.cleaner.dedupe.buffer.size` evenly over `log.cleaner.threads`, each
share capped at 2^31 - 1 bytes (the map's buffer is sized with an Int). A map of M bytes
has M // E slots of E bytes (24: a 16-byte key hash and an 8-byte offset; 32 where the
strategy adds an 8-byte version), of which the load factor's share may fill; a map that
cannot fill even one never makes progress.

Plain arithmetic, without numpy: the config's checks ask it too, before any map exists.
"""

from __future__ import annotations

from typing import Final

from cleanerd.wording import count

OFFSET_ENTRY_BYTES: Final = 24
"""A slot of the `offset` strategy's map: key hash (16 bytes) and offset (8)."""
VERSIONED_ENTRY_BYTES: Final = 32
"""A slot of the `timestamp` and `header` strategies' map: with the version (8)."""
MAX_MEMORY_PER_THREAD: Final = 2**31 - 1


def memory_per_thread(dedupe_buffer_size: int, threads: int) -> int:
    """Kafka's split of log.cleaner.dedupe.buffer.size: each cleaner thread gets
    ``min(dedupe_buffer_size / threads, 2^31 - 1)`` bytes."""
    if threads < 1:
        raise ValueError(f"log.cleaner.threads must be >= 1, got {threads}")
    return min(dedupe_buffer_size // threads, MAX_MEMORY_PER_THREAD)


def map_slots(memory_bytes: int, entry_bytes: int) -> int:
    """The slots of a map of `memory_bytes` in slots of `entry_bytes`."""
    return max(memory_bytes, 0) // entry_bytes


def too_small(memory_bytes: int, entry_bytes: int, load_factor: float) -> str | None:
    """Why a map of `memory_bytes` in slots of `entry_bytes` cannot hold a single key at
    `load_factor` (None: it can)."""
    slots = map_slots(memory_bytes, entry_bytes)
    if slots * load_factor > 1:
        return None
    return (
        f"offset map of {memory_bytes} bytes ({count(slots, 'slot')} of {entry_bytes} bytes "
        f"at load factor {load_factor}) is too small to fit even a single key, so log cleaning "
        "would never make progress; increase log.cleaner.dedupe.buffer.size or decrease "
        "log.cleaner.threads"
    )
