"""Processors: normalization (scoring library), trace state in Redis, completion, and the decision step."""
