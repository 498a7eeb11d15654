"""An OpenTelemetry SDK span exporter that captures spans into an InMemoryTraceClient.

It refuses spans recorded under finite or unknown attribute-length limits: a
truncated tool name cannot prove which tool ran. Such a trace is recorded with
the ``attribute_length_limited`` coverage reason so it can never become complete.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from scoring.models.evidence import ATTRIBUTE_LIMITS
from scoring.normalize.spans import from_readable_span
from scoring.score.observation.client import InMemoryTraceClient

log = logging.getLogger("toolwitness.scoring.exporter")


class UnboundedAttributeLimitsError(ValueError):
    """A span was recorded with finite or unknown attribute-length limits."""

    retriable = False


def check_attribute_limits(span: ReadableSpan) -> None:
    """Raise unless the span's attributes were recorded without a length limit.

    The SDK hands exporters a ReadableSpan whose attribute map is the span's
    ``BoundedAttributes``; its ``max_value_len`` is the limit in force (None =
    unlimited). A plain mapping means the limit is unknown.
    """
    attrs = getattr(span, "_attributes", None)
    if attrs is None or not hasattr(attrs, "max_value_len"):
        raise UnboundedAttributeLimitsError(
            f"span {span.name!r} has unknown attribute-length limits; use a TracerProvider with "
            "SpanLimits(max_span_attribute_length=SpanLimits.UNSET)"
        )
    length = attrs.max_value_len
    if length is not None:
        raise UnboundedAttributeLimitsError(
            f"span {span.name!r} was recorded with max_span_attribute_length={length}: truncated tool names "
            "cannot prove which tool ran; use SpanLimits(max_span_attribute_length=SpanLimits.UNSET)"
        )


class InMemoryTraceExporter(SpanExporter):
    """Capture finished SDK spans into ``trace_client``."""

    def __init__(self, *, trace_client: InMemoryTraceClient) -> None:
        self._client = trace_client
        self._shutdown = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown:
            return SpanExportResult.FAILURE
        accepted = []
        refused = False
        for span in spans:
            try:
                check_attribute_limits(span)
            except UnboundedAttributeLimitsError as exc:
                refused = True
                ctx = span.get_span_context()
                if ctx is not None:
                    self._client.add_trace_reason(f"{ctx.trace_id:032x}", ATTRIBUTE_LIMITS)
                log.error("refusing span: %s", exc)
                continue
            accepted.append(from_readable_span(span))
        self._client.add_spans(accepted)
        return SpanExportResult.FAILURE if refused else SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._shutdown = True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
