"""Compaction: the offset map, KIP-280 strategies, the cleaner pass, cleanable ranges,
eligibility and the deadline-first cleaning order."""
