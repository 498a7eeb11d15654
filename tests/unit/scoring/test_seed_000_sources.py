"""Seed 000's "Use another trace source" in the forms its prose shows: a client reporting
``TraceQueryResult(available=False)``, and ``ObservationSource[TraceScorable]`` as the contract."""

from __future__ import annotations

from collections.abc import Sequence

from scoring.models import ScoringExpectation, ToolCallRequirement, ToolsCalled, TraceScorable
from scoring.models.evidence import Acquisition
from scoring.score import OtelToolCallScorer
from scoring.score.observation import ObservationSource, OtelTraceSource
from scoring.score.observation.client import TraceQueryResult

TRACE = "0af7651916cd43dd8448eb211c80319c"
#: the seed's name for the contract, evaluated (a non-generic Protocol raised TypeError here)
TraceSource = ObservationSource[TraceScorable]


class ExpiredBackend:
    """A trace backend whose retention has passed: it knows nothing can be retrieved."""

    def query(self, trace_ids: Sequence[str]) -> list[TraceQueryResult]:
        return [TraceQueryResult(trace_id, available=False) for trace_id in trace_ids]

    def query_session(self, session_id: str) -> list[TraceQueryResult]:
        return [TraceQueryResult(available=False)]


async def test_an_unavailable_result_is_undetermined_never_false() -> None:
    source: TraceSource = OtelTraceSource(trace_client=ExpiredBackend())
    scope = TraceScorable(trace_ids=(TRACE,))
    observation = await source.acquire(scope)
    assert observation.acquisition is Acquisition.UNAVAILABLE and not observation.coverage.complete
    expectation = ScoringExpectation(conditions=(ToolsCalled(tools=(ToolCallRequirement(name="search"),)),))
    [score] = await OtelToolCallScorer(source=source).score_async(scope, expectation)
    assert score.get_value() is None  # UNDETERMINED
