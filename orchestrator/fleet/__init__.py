"""A warmup on Ray: the plan (ranks by GPU class, a compile unit per class and bucket), the
driver that runs it, what it produced, and the environment its processes get."""
