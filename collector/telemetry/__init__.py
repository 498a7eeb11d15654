"""Self-telemetry of the service: every internal metric is declared in metrics.py."""
