"""Kafka's record formats: record batches v2 (magic 2), legacy message sets (magic 0/1),
compression codecs and varints. Nothing here touches files."""
