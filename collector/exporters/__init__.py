"""Exporters: score events, observations and dead letters to Kafka."""
