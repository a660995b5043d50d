"""Metrics (Prometheus text format) and distributed tracing (OpenTelemetry): server-side only."""
