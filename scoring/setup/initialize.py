"""``initialize_pyrit_async``: create the process-wide in-memory store.

toolwitness keeps only the in-memory backend; other database types are refused
with a clear error instead of being silently replaced.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scoring.memory.central import CentralMemory, MemoryInterface

IN_MEMORY = "InMemory"


async def initialize_pyrit_async(
    memory_db_type: str = IN_MEMORY,
    *,
    load_defaults: bool = False,
    env_files: Sequence[str | Path] | None = None,
    silent: bool = False,
    **_unused: Any,
) -> MemoryInterface:
    """Install a fresh in-memory store as the central memory and return it."""
    if memory_db_type != IN_MEMORY:
        raise ValueError(f"memory_db_type {memory_db_type!r} is not supported; use IN_MEMORY")
    memory = MemoryInterface()
    CentralMemory.set_memory_instance(memory)
    return memory


initialize_async = initialize_pyrit_async
