"""Serving what the fleet warmed: the HTTP server on Ray Serve (`server`), its request and answer
wire formats (`codec`), and a replica's Prometheus metrics (`metrics`). The replica's model itself
is `orchestrator.runtime`."""
