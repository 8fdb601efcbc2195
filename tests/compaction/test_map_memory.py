"""Tests of cleanerd.compaction.map_memory: a cleaner thread's share of the dedupe
buffer, and whether its map can hold a key."""

from __future__ import annotations

import pytest

from cleanerd.compaction.map_memory import memory_per_thread, too_small


def test_memory_per_thread_is_split_and_capped() -> None:
    """Each thread gets the buffer divided by the thread count, at most 2^31 - 1 bytes."""
    assert memory_per_thread(100, 3) == 33
    assert memory_per_thread(8 * 1024**3, 2) == 2**31 - 1
    with pytest.raises(ValueError, match=r"log\.cleaner\.threads"):
        memory_per_thread(100, 0)


@pytest.mark.parametrize(
    ("memory", "entry", "load_factor", "fits"),
    [(47, 24, 0.9, False), (48, 24, 0.9, True), (63, 32, 0.9, False), (64, 32, 0.9, True)],
)
def test_a_map_holds_a_key_when_its_fillable_slots_exceed_one(
    memory: int, entry: int, load_factor: float, fits: bool
) -> None:
    """Kafka's rule: slots * load factor > 1; the reason names the keys to change."""
    why = too_small(memory, entry, load_factor)
    assert (why is None) == fits
    assert fits or "increase log.cleaner.dedupe.buffer.size" in str(why)
