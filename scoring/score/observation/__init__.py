"""Evidence capture and acquisition: trace clients, the in-memory exporter, and the trace source."""

from scoring.score.observation.client import (
    InMemoryTraceClient,
    TraceClient,
    TraceClientClosedError,
    TraceQueryResult,
)
from scoring.score.observation.exporter import InMemoryTraceExporter, UnboundedAttributeLimitsError
from scoring.score.observation.source import ObservationSource, OtelTraceSource, build_observation

__all__ = [
    "InMemoryTraceClient",
    "InMemoryTraceExporter",
    "ObservationSource",
    "OtelTraceSource",
    "TraceClient",
    "TraceClientClosedError",
    "TraceQueryResult",
    "UnboundedAttributeLimitsError",
    "build_observation",
]
