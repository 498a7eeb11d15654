"""Evidence that must not steer an in-process verdict (found by an adversarial review)."""

from __future__ import annotations

import pytest

from scoring.models import SessionScorable, TraceScorable
from scoring.score import OtelToolCallScorer
from scoring.score.observation import InMemoryTraceClient, OtelTraceSource
from tests.unit.scoring.test_capture import TRACE_A, TRACE_B, F, T, U, expects, tool_span, verdict


@pytest.fixture
def client() -> InMemoryTraceClient:
    return InMemoryTraceClient()


@pytest.fixture
def scorer(client: InMemoryTraceClient) -> OtelToolCallScorer:
    return OtelToolCallScorer(source=OtelTraceSource(trace_client=client))


async def test_a_span_id_reused_for_other_tool_evidence_is_a_conflict(
    client: InMemoryTraceClient, scorer: OtelToolCallScorer
) -> None:
    a, b = TraceScorable(trace_ids=(TRACE_A,)), TraceScorable(trace_ids=(TRACE_B,))
    client.add_spans([tool_span(TRACE_A, 1), tool_span(TRACE_A, 2, "search", parent=1)])
    client.add_spans([tool_span(TRACE_A, 2, "delete", parent=1)])  # the same id, another tool
    client.add_spans([tool_span(TRACE_B, 1), tool_span(TRACE_B, 2, "search", parent=1)])
    client.add_spans([tool_span(TRACE_B, 2, "search", parent=1)])  # an exact replay
    client.mark_complete(trace_ids=(TRACE_A, TRACE_B), span_count=2)
    assert await verdict(scorer, a, expects("delete")) is U  # was FALSE: the first copy won silently
    assert await verdict(scorer, a, expects("search")) is T
    assert await verdict(scorer, b, expects("delete")) is F


async def test_a_trace_joining_a_completed_session_breaks_its_completeness(
    client: InMemoryTraceClient, scorer: OtelToolCallScorer
) -> None:
    session = SessionScorable(session_id="s-1")
    client.add_spans([tool_span(TRACE_A, 1, session="s-1"), tool_span(TRACE_A, 2, "search", parent=1, session="s-1")])
    client.mark_complete(trace_ids=(TRACE_A,), span_count=2)
    client.mark_session_complete(session_id="s-1")
    assert await verdict(scorer, session, expects("delete")) is F
    client.add_spans([tool_span(TRACE_B, 1, session="s-1"), tool_span(TRACE_B, 2, "delete", parent=1, session="s-1")])
    client.mark_complete(trace_ids=(TRACE_B,), span_count=2)
    assert await verdict(scorer, session, expects("delete")) is T
    assert await verdict(scorer, session, expects("email")) is U  # the claim is broken: absence unprovable


async def test_replaying_a_message_composite_gives_the_live_verdict() -> None:
    # seed 000's AND of a message check and the tool scorer: replay has no memory, so the saved
    # evidence must carry the response text the text scorer judged.
    from scoring.memory import CentralMemory
    from scoring.models import MessageScorable
    from scoring.models.message import Message, MessagePiece
    from scoring.score import SubStringScorer, TrueFalseCompositeScorer, TrueFalseScoreAggregator
    from scoring.setup import IN_MEMORY, initialize_pyrit_async

    await initialize_pyrit_async(memory_db_type=IN_MEMORY)
    memory = CentralMemory.get_memory_instance()
    client = InMemoryTraceClient()
    client.add_spans([tool_span(TRACE_A, 1), tool_span(TRACE_A, 2, "my_tool_call", parent=1)])
    client.mark_complete(trace_ids=(TRACE_A,), span_count=2)
    piece = MessagePiece(role="assistant", original_value="not finished", conversation_id="c-1", trace_id=TRACE_A)
    memory.add_message_to_memory(request=Message(message_pieces=[piece]))
    composite = TrueFalseCompositeScorer(
        aggregator=TrueFalseScoreAggregator.AND,
        scorers=[SubStringScorer(substring="done"), OtelToolCallScorer(source=OtelTraceSource(trace_client=client))],
    )
    (live,) = await composite.score_async(MessageScorable.from_message(Message(message_pieces=[piece])),
                                          expects("my_tool_call"))
    assert live.verdict is F  # "done" is not in the response
    (observation,) = memory.get_observations(observation_ids=live.observation_ids)
    assert observation.scorable.response_text == "not finished"  # type: ignore[union-attr]
    client.close()
    (replayed,) = await composite.score_observation_async(observation, expects("my_tool_call"))
    assert replayed.verdict is F  # it was TRUE ("AND of 1": the text scorer dropped out)
