"""The receiver contract: a named component that brings records into the pipeline."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Receiver(Protocol):
    """Receivers: ``receiver/kafka_otlp`` (spans + control from Kafka), ``otlp_grpc`` (sidecar).

    ``name`` is unique and appears in logs and metric labels; ``start``/``shutdown`` are
    idempotent.
    """

    name: str

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...
