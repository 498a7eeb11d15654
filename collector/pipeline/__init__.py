"""The pipeline: the engine (evaluate, decide, publish), the per-batch checkpoint, the sweeper, the service."""
