"""The component contract every receiver, processor and exporter follows."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Component(Protocol):
    """A pipeline stage with a unique ``name`` (used in logs and metrics labels)."""

    name: str

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...
