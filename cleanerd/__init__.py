"""cleanerd: a log maintenance daemon for Kafka-format log directories."""

__version__ = "0.1.0"
