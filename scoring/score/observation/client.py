"""Trace clients: where neutral spans for a trace (or a session) are read from.

A client reports coverage honestly: pending capture stays available with
incomplete coverage; ``available=False`` only when it knows no evidence can be
retrieved (e.g. retention expired). An empty result alone is not unavailable.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from scoring.models.evidence import LATE_SPAN, RETENTION_EXPIRED, CompletionSource, Coverage
from scoring.models.scorables import check_trace_id
from scoring.normalize.spans import NeutralSpan
from scoring.normalize.trace import TraceAssembly


@dataclass(frozen=True, slots=True)
class TraceQueryResult:
    """The spans of one trace and the client's account of their coverage.

    ``TraceQueryResult(trace_id, available=False)``: the client knows no evidence can be
    retrieved (e.g. retention expired): the observation is unavailable, the score UNDETERMINED."""

    trace_id: str = ""
    available: bool = True
    spans: tuple[NeutralSpan, ...] = ()
    coverage: Coverage = field(default_factory=Coverage)


@runtime_checkable
class TraceClient(Protocol):
    def query(self, trace_ids: Sequence[str]) -> list[TraceQueryResult]: ...

    def query_session(self, session_id: str) -> list[TraceQueryResult]: ...


class TraceClientClosedError(RuntimeError):
    retriable = False


class InMemoryTraceClient:
    """Holds exported spans per trace, with per-trace completion, late and conflicting spans."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._traces: dict[str, TraceAssembly] = {}
        self._spans: dict[str, dict[str, NeutralSpan]] = {}
        self._expired: set[str] = set()
        self._extra_reasons: dict[str, set[str]] = {}
        self._sessions: dict[str, set[str]] = {}
        self._complete_sessions: set[str] = set()
        self._late_sessions: set[str] = set()
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise TraceClientClosedError("the trace client is closed")

    def add_spans(self, spans: Iterable[NeutralSpan]) -> None:
        with self._lock:
            self._check_open()
            for span in spans:
                asm = self._traces.setdefault(span.trace_id, TraceAssembly(span.trace_id))
                if asm.add(span):
                    self._spans.setdefault(span.trace_id, {})[span.span_id] = span
                    sid = span.session_id()
                    if sid:
                        traces = self._sessions.setdefault(sid, set())
                        if span.trace_id not in traces and sid in self._complete_sessions:
                            # a trace joins a session declared complete: that claim is broken
                            self._late_sessions.add(sid)
                        traces.add(span.trace_id)

    def add_trace_reason(self, trace_id: str, reason: str) -> None:
        """Record a coverage reason for a trace that no span carries (e.g. rejected export)."""
        with self._lock:
            self._extra_reasons.setdefault(trace_id, set()).add(reason)
            self._traces.setdefault(trace_id, TraceAssembly(trace_id))

    def mark_complete(self, *, trace_ids: Sequence[str], span_count: int | None = None) -> None:
        """Declare the traces complete: every span they will ever have has been exported.

        Without ``span_count`` a trace of which no span was seen stays incomplete (give
        ``span_count=0`` for a trace that really has none)."""
        if isinstance(trace_ids, str | bytes):
            raise TypeError(f"trace_ids must be a sequence of trace ids, not one {type(trace_ids).__name__}: "
                            f"mark_complete(trace_ids=({trace_ids!r},))")
        # Spans are kept under their 32-hex id: a claim about any other spelling would complete
        # no trace, and the scores it was meant to decide stay UNDETERMINED without a word.
        trace_ids = [check_trace_id(t) for t in trace_ids]
        with self._lock:
            self._check_open()
            for t in trace_ids:
                asm = self._traces.setdefault(t, TraceAssembly(t))
                asm.mark_complete(span_count, CompletionSource.CALLER)

    def mark_session_complete(self, *, session_id: str) -> None:
        with self._lock:
            self._check_open()
            self._complete_sessions.add(session_id)

    def expire(self, *, trace_ids: Sequence[str]) -> None:
        """Drop the traces' spans as retention would: they become unavailable, never absent."""
        with self._lock:
            for t in trace_ids:
                self._expired.add(t)
                self._traces.pop(t, None)
                self._spans.pop(t, None)

    def _result(self, trace_id: str) -> TraceQueryResult:
        if trace_id in self._expired:
            return TraceQueryResult(trace_id, False, (), Coverage.incomplete(RETENTION_EXPIRED))
        asm = self._traces.get(trace_id)
        if asm is None:
            return TraceQueryResult(trace_id, True, (), Coverage.incomplete())
        cov = asm.coverage()
        extra = self._extra_reasons.get(trace_id)
        if extra:
            cov = Coverage.incomplete(*cov.reasons, *extra)
        return TraceQueryResult(trace_id, True, tuple(self._spans.get(trace_id, {}).values()), cov)

    def query(self, trace_ids: Sequence[str]) -> list[TraceQueryResult]:
        with self._lock:
            self._check_open()
            return [self._result(t) for t in trace_ids]

    def query_session(self, session_id: str) -> list[TraceQueryResult]:
        with self._lock:
            self._check_open()
            results = [self._result(t) for t in sorted(self._sessions.get(session_id, ()))]
            if session_id in self._late_sessions:
                results = [
                    TraceQueryResult(
                        r.trace_id, r.available, r.spans, Coverage.incomplete(*r.coverage.reasons, LATE_SPAN)
                    )
                    for r in results
                ]
            if session_id not in self._complete_sessions:
                # Each trace may be complete, but more traces of the session may still come.
                results = [
                    TraceQueryResult(r.trace_id, r.available, r.spans, Coverage.incomplete(*r.coverage.reasons))
                    for r in results
                ] or [TraceQueryResult("", True, (), Coverage.incomplete())]
            return results

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._traces.clear()
            self._spans.clear()
