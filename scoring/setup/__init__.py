"""Process set-up with PyRIT's entry point names (in-memory only)."""

from scoring.setup.initialize import IN_MEMORY, initialize_async, initialize_pyrit_async

__all__ = ["IN_MEMORY", "initialize_async", "initialize_pyrit_async"]
