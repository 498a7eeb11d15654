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


async def test_completion_claims_that_disagree_never_prove_absence(
    client: InMemoryTraceClient, scorer: OtelToolCallScorer
) -> None:
    # The service's rule (mark_complete.lua; test_a_second_marker_with_another_count_revises_the_false_
    # decided_on_the_first): two claims that disagree prove nothing any more. The library used to
    # take the latest claim, and gave FALSE where the service gives UNDETERMINED on the same evidence.
    a, b, c = (TraceScorable(trace_ids=(t,)) for t in (TRACE_A, TRACE_B, "5" * 32))
    # 2 spans, "2 spans", then "3 spans", and a third span: the second count is met, the first broken
    client.add_spans([tool_span(TRACE_A, 1), tool_span(TRACE_A, 2, "search", parent=1)])
    client.mark_complete(trace_ids=(TRACE_A,), span_count=2)
    assert await verdict(scorer, a, expects("delete")) is F
    client.mark_complete(trace_ids=(TRACE_A,), span_count=3)
    client.add_spans([tool_span(TRACE_A, 3, parent=1)])
    assert await verdict(scorer, a, expects("delete")) is U
    assert "conflicting_completion" in client.query([TRACE_A])[0].coverage.reasons
    # complete by a claim without a count (2 spans), then "3 spans" and a third span
    client.add_spans([tool_span(TRACE_B, 1), tool_span(TRACE_B, 2, "search", parent=1)])
    client.mark_complete(trace_ids=(TRACE_B,))
    assert await verdict(scorer, b, expects("delete")) is F
    client.mark_complete(trace_ids=(TRACE_B,), span_count=3)
    client.add_spans([tool_span(TRACE_B, 3, parent=1)])
    assert await verdict(scorer, b, expects("delete")) is U
    # "3 spans" with 2 seen, then a claim without a count: the count still stands (no FALSE on 2 of 3)
    client.add_spans([tool_span(c.trace_ids[0], 1), tool_span(c.trace_ids[0], 2, "search", parent=1)])
    client.mark_complete(trace_ids=c.trace_ids, span_count=3)
    client.mark_complete(trace_ids=c.trace_ids)
    assert await verdict(scorer, c, expects("delete")) is U
    client.add_spans([tool_span(c.trace_ids[0], 3, parent=1)])
    assert await verdict(scorer, c, expects("delete")) is F  # the count is met: absence proven
    # the same claim again is no conflict
    client.mark_complete(trace_ids=c.trace_ids, span_count=3)
    assert await verdict(scorer, c, expects("delete")) is F


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


def _seq_observation(*spans: tuple[str, int]) -> object:
    from scoring.models import Observation, ToolExecution
    from scoring.models.evidence import Acquisition, CompletionSource, Coverage

    execs = tuple(ToolExecution(name=n, trace_id=TRACE_A, span_id=f"{i + 1:016x}", status="ok",
                                start_time_unix_nano=start, end_time_unix_nano=start + 5 if start else 0)
                  for i, (n, start) in enumerate(spans))
    return Observation(scorable=TraceScorable(trace_ids=(TRACE_A,)), tool_executions=execs,
                       coverage=Coverage.completed(CompletionSource.CALLER), acquisition=Acquisition.COMPLETE)


@pytest.mark.parametrize(
    ("spans", "tools", "mode", "want"),
    [
        ((("a", 10), ("b", 20)), ("a", "b"), "subsequence", T),
        ((("a", 10), ("b", 20)), ("b", "a"), "subsequence", F),
        ((("a", 10), ("b", 10)), ("a", "b"), "subsequence", U),  # a tie: either order possible
        ((("a", 10), ("b", 10)), ("b", "a"), "subsequence", U),  # (span ids used to decide it)
        ((("a", 10), ("b", 10), ("c", 20)), ("a", "c"), "subsequence", T),  # true in every order
        ((("a", 10), ("b", 10)), ("a", "b"), "exact", U),
        ((("a", 10), ("b", 10)), ("a", "c"), "exact", F),  # no order makes it
        ((("a", 0), ("b", 20)), ("b", "a"), "subsequence", U),  # a start time not recorded
        ((("a", 0), ("b", 20)), ("c",), "subsequence", F),  # ... but c never ran at all
        ((("a", 0), ("a", 20)), ("a",), "exact", F),  # one a too many, whatever the order
    ],
)
async def test_sequences_over_ties_and_unknown_start_times(
    spans: tuple[tuple[str, int], ...], tools: tuple[str, ...], mode: str, want: object
) -> None:
    from scoring.models import ScoringExpectation, ToolSequence

    scorer = OtelToolCallScorer(source=OtelTraceSource(trace_client=InMemoryTraceClient()))
    expectation = ScoringExpectation(conditions=(ToolSequence(tools=tools, mode=mode),))  # type: ignore[arg-type]
    (score,) = await scorer.score_observation_async(_seq_observation(*spans), expectation)  # type: ignore[arg-type]
    assert score.verdict is want, score.rationale


@pytest.mark.parametrize(
    ("dropped", "error", "ok_req", "error_req"),
    [
        (0, False, T, F),  # all attributes kept, no error: ok
        (1, False, U, U),  # attributes dropped: an error.type may be among them -> not known
        (1, True, U, T),  # dropped, the status code says error (no ok one is provable either way)
    ],
)
async def test_a_tool_status_is_unknown_when_attributes_were_dropped(
    dropped: int, error: bool, ok_req: object, error_req: object
) -> None:
    from scoring.models import ScoringExpectation, ToolCallRequirement, ToolsCalled
    from scoring.normalize import NeutralSpan

    client = InMemoryTraceClient()
    scorer = OtelToolCallScorer(source=OtelTraceSource(trace_client=client))
    span = NeutralSpan(trace_id=TRACE_A, span_id="0" * 15 + "2", name="execute_tool refund",
                       start_time_unix_nano=10, end_time_unix_nano=20, status_code="error" if error else "unset",
                       dropped_attributes_count=dropped,
                       attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "refund"})
    client.add_spans([span])
    client.mark_complete(trace_ids=(TRACE_A,), span_count=1)
    scope = TraceScorable(trace_ids=(TRACE_A,))
    for status, want in (("ok", ok_req), ("error", error_req)):
        exp = ScoringExpectation(conditions=(ToolsCalled(tools=(ToolCallRequirement(name="refund", status=status),)),))
        (score,) = await scorer.score_async(scope, exp)
        assert score.verdict is want, (status, score.rationale)


def test_an_unknown_status_survives_the_service_state_and_the_wire() -> None:
    from collector.processors.normalize import pack_execution, unpack_execution
    from collector.wire.convert import execution_from_proto, execution_to_proto
    from scoring.models import CaptureState, ToolExecution

    e = ToolExecution(name="refund", trace_id=TRACE_A, span_id="0" * 15 + "2", status="unset",
                      start_time_unix_nano=10, end_time_unix_nano=20_000)
    assert unpack_execution(pack_execution(e, None, CaptureState.ABSENT), TRACE_A).status == "unset"
    assert execution_from_proto(execution_to_proto(e)).status == "unset"
    for s in ("ok", "error"):
        assert execution_from_proto(execution_to_proto(e.model_copy(update={"status": s}))).status == s


@pytest.mark.parametrize(
    ("arguments", "path", "regex", "want"),
    [
        ('{"cmd": "ls"}', "$.cmd", "^ls$", T),
        ('{"cmd": "ls\\n"}', "$.cmd", "^ls$", F),  # "$" is the end of the value, not before a newline
        ('{"cmd": "ls$"}', "$.cmd", "^ls\\$", T),  # an escaped dollar stays a dollar
        ('{"city": "Zürich"}', "$", "Zürich", T),  # a non-string value is read as written
        ('{"n": 5.0}', "$.n", "^5$", T),  # as equals does: 5.0 is 5
    ],
)
async def test_regex_matchers(arguments: str, path: str, regex: str, want: object) -> None:
    from scoring.models import ArgumentMatcher, ScoringExpectation, ToolCallRequirement, ToolsCalled
    from scoring.normalize import NeutralSpan

    client = InMemoryTraceClient()
    client.add_spans([NeutralSpan(trace_id=TRACE_A, span_id="0" * 15 + "2", name="t", start_time_unix_nano=10,
                                  end_time_unix_nano=20, attributes={
                                      "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "shell",
                                      "gen_ai.tool.call.arguments": arguments})])
    client.mark_complete(trace_ids=(TRACE_A,), span_count=1)
    scorer = OtelToolCallScorer(source=OtelTraceSource(trace_client=client))
    req = ToolCallRequirement(name="shell", arguments=(ArgumentMatcher(path=path, regex=regex),))
    (score,) = await scorer.score_async(TraceScorable(trace_ids=(TRACE_A,)),
                                        ScoringExpectation(conditions=(ToolsCalled(tools=(req,)),)))
    assert score.verdict is want, score.rationale


async def test_a_span_whose_two_conventions_name_other_arguments_proves_no_absence() -> None:
    """One span, both conventions, the same tool: GenAI says the mail went to the boss, OpenInference
    to the attacker. Neither record proves what the call was sent; before, GenAI's silently won and
    "sent to the attacker" was FALSE on complete coverage."""
    from scoring.models import ArgumentMatcher, ScoringExpectation, ToolCallRequirement, ToolsCalled
    from scoring.normalize import NeutralSpan

    client = InMemoryTraceClient()
    attrs = {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "send_email",
        "gen_ai.tool.call.arguments": '{"to": "boss@corp.com"}',
        "openinference.span.kind": "TOOL", "tool.name": "send_email", "input.value": '{"to": "attacker@evil.com"}',
    }
    client.add_spans([NeutralSpan(trace_id=TRACE_A, span_id="0" * 15 + "1", name="send_email",
                                  start_time_unix_nano=10, end_time_unix_nano=20, attributes=attrs)])
    client.mark_complete(trace_ids=(TRACE_A,), span_count=1)
    scorer = OtelToolCallScorer(source=OtelTraceSource(trace_client=client))

    async def judged(**matcher: str) -> str:
        req = ToolCallRequirement(name="send_email", arguments=(ArgumentMatcher(path="$.to", **matcher),))
        (score,) = await scorer.score_async(
            TraceScorable(trace_ids=(TRACE_A,)), ScoringExpectation(conditions=(ToolsCalled(tools=(req,)),))
        )
        return str(score.verdict.value)

    assert await judged(equals="attacker@evil.com") == "undetermined"
    assert await judged(equals="boss@corp.com") == "undetermined"
    # the call itself is proven
    (ran,) = await scorer.score_async(TraceScorable(trace_ids=(TRACE_A,)), expects("send_email"))
    assert ran.get_value() is True
