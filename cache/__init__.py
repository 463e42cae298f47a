"""Cache identity and local/remote stores; knows nothing of Ray, metrics or the CLI."""
