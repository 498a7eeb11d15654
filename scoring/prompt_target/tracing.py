"""W3C trace context for prompt targets: one fresh trace per request, when the caller opts in."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from opentelemetry.context import Context
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import SpanKind, StatusCode, Tracer

__all__ = ["TRACE_HEADERS", "RequestTrace", "TargetTraceConfig", "request_trace"]

#: the W3C Trace Context headers a traced target sends itself.
TRACE_HEADERS = frozenset({"traceparent", "tracestate"})
_IDS = RandomIdGenerator()


@dataclass(frozen=True, kw_only=True)
class TargetTraceConfig:
    """Tracing of a prompt target's requests. Off by default.

    ``enabled``: send a fresh W3C ``traceparent`` with every request (for an endpoint that
    accepts trace context and exports its tool spans) and save its trace id on the request
    piece. Keep it off when you supply ``traceparent`` / ``tracestate`` headers yourself.

    ``tracer``: record the target invocation as a span on a caller-owned provider; its trace
    is the request's trace. No global provider or exporter is installed.
    """

    enabled: bool = False
    tracer: Tracer | None = None

    @property
    def active(self) -> bool:
        return self.enabled or self.tracer is not None


@dataclass(slots=True)
class RequestTrace:
    """The trace of one request: its id (32 hex) and the headers to send (empty unless enabled)."""

    trace_id: str
    headers: dict[str, str] = field(default_factory=dict)
    status_code: int | None = None
    error: str | None = None


@contextlib.contextmanager
def request_trace(config: TargetTraceConfig | None, name: str) -> Iterator[RequestTrace | None]:
    """A fresh trace for one request (None when tracing is off); the span, if any, ends on exit."""
    if config is None or not config.active:
        yield None
        return
    span = None
    if config.tracer is not None:
        span = config.tracer.start_span(name, context=Context(), kind=SpanKind.CLIENT)
    ctx = span.get_span_context() if span is not None else None
    if ctx is not None and ctx.is_valid:
        trace_id, span_id, flags = ctx.trace_id, ctx.span_id, int(ctx.trace_flags)
    else:  # no tracer, or a no-op one: fresh random ids, sampled
        trace_id, span_id, flags = _IDS.generate_trace_id(), _IDS.generate_span_id(), 1
    rt = RequestTrace(trace_id=f"{trace_id:032x}")
    if config.enabled:
        rt.headers["traceparent"] = f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"
    try:
        yield rt
    finally:
        if span is not None:
            if rt.status_code is not None:
                span.set_attribute("http.response.status_code", rt.status_code)
            if rt.error is not None:
                span.set_attribute("error.type", rt.error)
                span.set_status(StatusCode.ERROR, rt.error)
            span.end()
