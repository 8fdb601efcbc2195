"""Retention: Kafka's time, size and start-offset rules, and KIP-61 disk usage."""
