"""In-process memory: conversations, scores and observations (PyRIT's CentralMemory, in-memory only)."""

from scoring.memory.central import CentralMemory, MemoryInterface

__all__ = ["CentralMemory", "MemoryInterface"]
