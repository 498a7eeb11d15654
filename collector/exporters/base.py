"""The exporter contract."""

from __future__ import annotations

from typing import Protocol


class ExportError(RuntimeError):
    """Publishing failed; the batch is retried from its first offset (nothing committed)."""

    retriable = True


class Exporter(Protocol):
    name: str

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...
