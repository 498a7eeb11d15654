"""Per-trace assembly of normalized spans: dedup, orphans, completion claims, late spans.

The in-memory trace client keeps one ``TraceAssembly`` per trace. (The streaming
service keeps the same facts in Redis; it reuses ``normalize_span`` per span.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scoring.models.evidence import (
    AWAITING_COMPLETION,
    CONFLICTING_COMPLETION,
    CONFLICTING_EVIDENCE,
    LATE_SPAN,
    ORPHAN_PARENT,
    CompletionSource,
    Coverage,
    ToolExecution,
)
from scoring.normalize.spans import NeutralSpan, normalize_span


@dataclass(slots=True)
class TraceAssembly:
    """Evidence of one trace as spans arrive. Adding a span is idempotent by span id."""

    trace_id: str
    span_ids: set[str] = field(default_factory=set)
    parents: set[str] = field(default_factory=set)
    executions: dict[str, ToolExecution] = field(default_factory=dict)
    span_reasons: set[str] = field(default_factory=set)
    sticky_reasons: set[str] = field(default_factory=set)
    results: dict[str, str] = field(default_factory=dict)
    session_ids: set[str] = field(default_factory=set)
    complete_claimed: bool = False
    expected_span_count: int | None = None
    completion_source: CompletionSource = CompletionSource.CALLER

    def add(self, span: NeutralSpan) -> bool:
        """Add a span; return False if it was already seen (a replay).

        A repeated span id with other tool evidence (another tool, other arguments or status, a
        tool where there was none) is a conflict, not a replay: whichever came first must not win
        silently (the trace gets ``conflicting_evidence``)."""
        if span.span_id in self.span_ids:
            if self.executions.get(span.span_id) != normalize_span(span).execution:
                self.sticky_reasons.add(CONFLICTING_EVIDENCE)
            return False
        if self.complete_claimed and self._count_satisfied():
            # A span after the scope was declared complete breaks the claim for good.
            self.sticky_reasons.add(LATE_SPAN)
        self.span_ids.add(span.span_id)
        if span.parent_span_id and not span.parent_is_remote:
            self.parents.add(span.parent_span_id)
        facts = normalize_span(span)
        self.span_reasons |= facts.reasons
        if facts.execution is not None:
            self.executions[span.span_id] = facts.execution
            if facts.result is not None:
                self.results[span.span_id] = facts.result
        sid = span.session_id()
        if sid:
            self.session_ids.add(sid)
        return True

    def mark_complete(self, span_count: int | None = None, source: CompletionSource = CompletionSource.CALLER) -> None:
        """Record the producer's claim that the trace is complete (optionally with its span count).

        The streaming service's rule (``mark_complete.lua``): a count that disagrees with an earlier
        one, or with the spans a claim without a count already completed, breaks the claims for
        good (neither proves absence any more); a claim without a count leaves a count standing."""
        if span_count is not None:
            earlier = self.expected_span_count
            if (earlier is not None and earlier != span_count) or (
                earlier is None and self.complete_claimed and self.span_ids and span_count != len(self.span_ids)
            ):
                self.sticky_reasons |= {CONFLICTING_COMPLETION, LATE_SPAN}
            self.expected_span_count = span_count
        self.complete_claimed = True
        self.completion_source = source

    def _count_satisfied(self) -> bool:
        return self.expected_span_count is None or len(self.span_ids) >= self.expected_span_count

    def coverage(self) -> Coverage:
        reasons = set(self.span_reasons) | self.sticky_reasons
        if self.parents - self.span_ids:
            reasons.add(ORPHAN_PARENT)
        if self.expected_span_count is not None and len(self.span_ids) > self.expected_span_count:
            reasons.add(LATE_SPAN)
        if not self.complete_claimed or not self._count_satisfied():
            reasons.add(AWAITING_COMPLETION)
        elif not self.span_ids and self.expected_span_count is None:
            # "Complete" with no span seen and no count proves nothing (spans unsampled, never
            # exported, a mistyped trace id): only an explicit ``span_count=0`` says "empty".
            reasons.add(AWAITING_COMPLETION)
        if reasons:
            return Coverage.incomplete(*reasons)
        return Coverage.completed(self.completion_source)

    def tool_executions(self) -> list[ToolExecution]:
        return sorted(self.executions.values(), key=lambda e: (e.start_time_unix_nano, e.span_id))
