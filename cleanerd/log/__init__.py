"""Partition logs on disk: segments, indexes, checkpoints, locks and recovery."""
