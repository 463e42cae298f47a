"""Choosing buckets from the traffic a model gets (`orchestrate plan`)."""
