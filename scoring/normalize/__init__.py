"""Where spans become tool executions: one module for SDK spans and OTLP protobuf spans alike.

The streaming service reuses this module; it never re-implements the rules.
"""

from scoring.normalize.spans import (
    NeutralSpan,
    SpanFacts,
    from_otlp_span,
    from_readable_span,
    iter_otlp_request,
    normalize_span,
)
from scoring.normalize.trace import TraceAssembly

__all__ = [
    "NeutralSpan",
    "SpanFacts",
    "TraceAssembly",
    "from_otlp_span",
    "from_readable_span",
    "iter_otlp_request",
    "normalize_span",
]
