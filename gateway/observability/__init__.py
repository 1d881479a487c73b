"""Observability: structured logs, Prometheus metrics, OpenTelemetry traces and their roots, the event loop's lag, and
the timed response store."""
