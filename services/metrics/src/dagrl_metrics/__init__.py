"""dagrl metrics service: OTLP receiver, per-step aggregation, query API and dashboard."""
