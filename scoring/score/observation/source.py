"""Observation sources: acquire an immutable evidence snapshot for a scorable."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Protocol, TypeVar

from scoring.models.evidence import (
    AWAITING_COMPLETION,
    NO_TRACE_LINKED,
    RETENTION_EXPIRED,
    Acquisition,
    CompletionSource,
    Coverage,
    Observation,
    ToolExecution,
    execution_order,
)
from scoring.models.scorables import MessageScorable, SessionScorable, TraceScorable
from scoring.normalize.spans import normalize_span
from scoring.score.observation.client import TraceClient, TraceQueryResult

EvidenceScorable = TraceScorable | SessionScorable | MessageScorable


#: the scorable type a source serves (``ObservationSource[TraceScorable]``, seed 000)
S_contra = TypeVar("S_contra", bound=EvidenceScorable, contravariant=True)


class ObservationSource(Protocol[S_contra]):
    """``acquire`` returns the evidence for a scorable; it must report coverage honestly."""

    async def acquire(self, scorable: S_contra, trace_ids: Sequence[str] | None = None) -> Observation: ...


def build_observation(
    scorable: EvidenceScorable,
    results: Sequence[TraceQueryResult],
    *,
    captured_at: datetime | None = None,
) -> Observation:
    """Merge per-trace query results into one observation (spans normalized here)."""
    executions: dict[tuple[str, str], ToolExecution] = {}
    reasons: set[str] = set()
    sources: set[CompletionSource] = set()
    unavailable = 0
    for r in results:
        if not r.available:
            unavailable += 1
            reasons.update(r.coverage.reasons or (RETENTION_EXPIRED,))
            continue
        reasons.update(r.coverage.reasons)
        if r.coverage.source is not None:
            sources.add(r.coverage.source)
        for span in r.spans:
            facts = normalize_span(span)
            reasons.update(facts.reasons)
            if facts.execution is not None:
                executions[(span.trace_id, span.span_id)] = facts.execution
    if not results:
        # Nothing to wait for but a link: "awaiting completion" would send the user looking for
        # a marker. (A session's client answers with a placeholder until the session completes.)
        reasons.add(NO_TRACE_LINKED)
    if reasons:
        coverage = Coverage.incomplete(*reasons)
    else:
        coverage = Coverage.completed(min(sources, key=lambda s: s.value) if sources else CompletionSource.CALLER)
    if results and unavailable == len(results):
        acquisition = Acquisition.UNAVAILABLE
    elif coverage.complete:
        acquisition = Acquisition.COMPLETE
    else:
        acquisition = Acquisition.PARTIAL
    ordered = sorted(executions.values(), key=execution_order)
    return Observation(
        scorable=scorable,
        tool_executions=tuple(ordered),
        coverage=coverage,
        acquisition=acquisition,
        captured_at=captured_at or datetime.now(UTC),
    )


class OtelTraceSource:
    """Reads neutral spans from a TraceClient and normalizes GenAI / OpenInference executions."""

    def __init__(self, *, trace_client: TraceClient) -> None:
        self._client = trace_client

    async def acquire(self, scorable: EvidenceScorable, trace_ids: Sequence[str] | None = None) -> Observation:
        if isinstance(scorable, SessionScorable):
            return build_observation(scorable, self._client.query_session(scorable.session_id))
        ids = trace_ids if trace_ids is not None else getattr(scorable, "trace_ids", None) or ()
        return build_observation(scorable, _answered(list(ids), self._client.query(list(ids))))


def _answered(ids: list[str], results: list[TraceQueryResult]) -> list[TraceQueryResult]:
    """``results``, plus an empty, still incomplete result for each requested trace the client
    did not answer for (a backend search returns the traces it found): a trace nobody reported
    on is evidence still missing, never a complete absence."""
    wanted = list(dict.fromkeys(ids))
    # a result that does not name its trace answers for the traces of its spans
    answered = {r.trace_id for r in results if r.trace_id} | {s.trace_id for r in results if not r.trace_id
                                                              for s in r.spans}
    missing = [t for t in wanted if t not in answered]
    if any(not r.trace_id and not r.spans for r in results):  # unnamed and empty: only their number tells
        missing = missing[: max(0, len(wanted) - len(results))]
    return [*results, *(TraceQueryResult(t, True, (), Coverage.incomplete(AWAITING_COMPLETION)) for t in missing)]
