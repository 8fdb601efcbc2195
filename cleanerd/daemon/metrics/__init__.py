"""Prometheus metrics: the pure model of what is exported (`model`) and the exporter."""
