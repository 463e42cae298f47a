"""Command line, config, planning and reports of the warmup orchestrator."""

__version__ = "0.1.0"
