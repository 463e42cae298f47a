"""What a warmup tells people and tools: the JSON report and its typed records, the table, the
HTML page, the JSON Schemas of config and report, and the Prometheus metrics."""
