"""dagrl metrics service: the OTLP receiver, per-step aggregation and the query API and dashboard."""
