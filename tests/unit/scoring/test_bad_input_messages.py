"""Misuse of the library's entry points fails at once with a message naming what was wrong."""

from __future__ import annotations

import pytest

from scoring.evaluation import evaluate_async
from scoring.memory import CentralMemory
from scoring.models import ScoringExpectation, ToolCallRequirement, ToolsCalled, TraceScorable
from scoring.score import FloatScaleThresholdScorer, OtelToolCallScorer, PlagiarismScorer, SubStringScorer
from scoring.score.observation import InMemoryTraceClient, OtelTraceSource
from scoring.setup import IN_MEMORY, initialize_pyrit_async

TRACE = "0af7651916cd43dd8448eb211c80319c"
EXPECT = ScoringExpectation(conditions=(ToolsCalled(tools=(ToolCallRequirement(name="t"),)),))


def _tools() -> OtelToolCallScorer:
    return OtelToolCallScorer(source=OtelTraceSource(trace_client=InMemoryTraceClient()))


async def test_a_bare_trace_id_is_not_a_scorable() -> None:
    with pytest.raises(TypeError, match=r"scorable must be a TraceScorable.*TraceScorable\(trace_ids=\(trace_id,\)\)"):
        await _tools().score_async(TRACE, EXPECT)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"SubStringScorer\.score_async: scorable must be"):
        await SubStringScorer(substring="x").score_async("hi")  # type: ignore[arg-type]


async def test_an_expectation_must_be_a_scoring_expectation() -> None:
    with pytest.raises(TypeError, match=r"expectation must be a ScoringExpectation.*got str"):
        await _tools().score_async(TraceScorable(trace_ids=(TRACE,)), "t")  # type: ignore[arg-type]


async def test_replay_needs_an_observation() -> None:
    for bad in ({"scorable": {}}, None):
        with pytest.raises(TypeError, match=r"observation must be an Observation"):
            await _tools().score_observation_async(bad, EXPECT)  # type: ignore[arg-type]


def test_a_trace_client_is_not_a_source() -> None:
    with pytest.raises(TypeError, match=r"OtelTraceSource\(trace_client=InMemoryTraceClient\(\.\.\.\)\)"):
        OtelToolCallScorer(source=InMemoryTraceClient())  # type: ignore[arg-type]


def test_threshold_must_be_a_number() -> None:
    with pytest.raises(TypeError, match=r"threshold must be a number in \[0, 1\], got '0.5'"):
        FloatScaleThresholdScorer(scorer=PlagiarismScorer(reference_text="a"), threshold="0.5")  # type: ignore[arg-type]


async def test_evaluate_names_a_non_scorer() -> None:
    with pytest.raises(TypeError, match=r"must have scorer_type and score_text_async.*got str"):
        await evaluate_async("substring", "data/*.csv")  # type: ignore[arg-type]


async def test_get_observations_needs_a_sequence() -> None:
    await initialize_pyrit_async(memory_db_type=IN_MEMORY)
    with pytest.raises(TypeError, match=r"get_observations\(observation_ids=\(an_id,\)\)"):
        CentralMemory.get_memory_instance().get_observations(observation_ids="abc")


async def test_a_message_with_no_linked_trace_says_so() -> None:
    from scoring.models import MessageScorable, ScoreStatus

    await initialize_pyrit_async(memory_db_type=IN_MEMORY)
    (score,) = await _tools().score_async(MessageScorable(message_id="m-1", trace_ids=()), EXPECT)
    assert score.status is ScoreStatus.UNDETERMINED
    assert score.metadata["coverage_reasons"] == "no_trace_linked"  # not "awaiting_completion"


async def test_a_trace_listed_twice_counts_once() -> None:
    from scoring.models import MessageScorable, Observation, ToolExecution
    from scoring.models.evidence import Acquisition, CompletionSource, Coverage

    other = "4bf92f3577b34da6a3ce929d0e0e4736"
    assert TraceScorable(trace_ids=(TRACE, other, TRACE)).trace_ids == (TRACE, other)
    scope = TraceScorable(trace_ids=(TRACE, TRACE))
    assert scope.trace_ids == (TRACE,)
    assert MessageScorable(message_id="m", trace_ids=(TRACE, TRACE)).trace_ids == (TRACE,)
    # at most one "search" ran: max_count=1 holds (it was FALSE with the trace counted twice)
    obs = Observation(scorable=scope, tool_executions=(ToolExecution(name="search", trace_id=TRACE, span_id="a" * 16),),
                      coverage=Coverage.completed(CompletionSource.CALLER), acquisition=Acquisition.COMPLETE)
    once = ScoringExpectation(conditions=(ToolsCalled(tools=(ToolCallRequirement(name="search", max_count=1),)),))
    (score,) = await _tools().score_observation_async(obs, once)
    assert score.get_value() is True
