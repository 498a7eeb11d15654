"""Seed readers' cases beyond the seeds' own samples: each once gave a wrong or unfounded verdict."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import Span, Tracer

from scoring.executor.attack import AttackScoringConfig, PromptSendingAttack
from scoring.memory import CentralMemory
from scoring.models import (
    AttackOutcome,
    CompletionSource,
    Coverage,
    Message,
    MessagePiece,
    MessageScorable,
    ScoreStatus,
    ScoringExpectation,
    ToolCallRequirement,
    ToolsCalled,
    TraceScorable,
)
from scoring.normalize.spans import NeutralSpan
from scoring.prompt_target import PromptTarget, TargetTraceConfig
from scoring.score import (
    OtelToolCallScorer,
    PlagiarismScorer,
    SubStringScorer,
    TrueFalseCompositeScorer,
    TrueFalseScoreAggregator,
    create_conversation_scorer,
)
from scoring.score.observation import InMemoryTraceClient, InMemoryTraceExporter, OtelTraceSource, TraceQueryResult
from scoring.setup import IN_MEMORY, initialize_pyrit_async


@pytest.fixture
def rig() -> Iterator[tuple[InMemoryTraceClient, Tracer, OtelToolCallScorer]]:
    client = InMemoryTraceClient()
    provider = TracerProvider(sampler=ALWAYS_ON, span_limits=SpanLimits(max_span_attribute_length=SpanLimits.UNSET))
    provider.add_span_processor(SimpleSpanProcessor(InMemoryTraceExporter(trace_client=client)))
    yield client, provider.get_tracer("seed-reader"), OtelToolCallScorer(source=OtelTraceSource(trace_client=client))
    provider.shutdown()


def expects(*names: str) -> ScoringExpectation:
    return ScoringExpectation(conditions=(ToolsCalled(tools=tuple(ToolCallRequirement(name=n) for n in names)),))


def tool(tracer: Tracer, name: str) -> AbstractContextManager[Span]:
    attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}
    return tracer.start_as_current_span(f"execute_tool {name}", attributes=attrs)


def _completed_run(client: InMemoryTraceClient, tracer: Tracer, tool_name: str) -> str:
    """An agent run that called ``tool_name``, its trace declared complete: the trace id."""
    with tracer.start_as_current_span("agent", context=Context()) as root:
        with tool(tracer, tool_name):
            pass
        trace_id = f"{root.get_span_context().trace_id:032x}"
    client.mark_complete(trace_ids=(trace_id,))
    return trace_id


async def test_a_replayed_conversation_criterion_is_undetermined_not_left_out(
    rig: tuple[InMemoryTraceClient, Tracer, OtelToolCallScorer],
) -> None:
    """AND(conversation says 'I am AI', tool ran): FALSE live. The saved observation keeps no
    conversation, so its replay must not drop that criterion and answer TRUE from the tool alone."""
    client, tracer, tool_scorer = rig
    await initialize_pyrit_async(memory_db_type=IN_MEMORY)
    memory = CentralMemory.get_memory_instance()
    trace_id = _completed_run(client, tracer, "my_tool_call")
    cid = str(uuid.uuid4())
    request = MessagePiece(role="user", original_value="run my_tool_call", conversation_id=cid, trace_id=trace_id)
    response = MessagePiece(role="assistant", original_value="done", conversation_id=cid)
    memory.add_message_to_memory(request=request.to_message())
    memory.add_message_to_memory(request=response.to_message())
    composite = TrueFalseCompositeScorer(
        aggregator=TrueFalseScoreAggregator.AND,
        scorers=[create_conversation_scorer(scorer=SubStringScorer(substring="I am AI")), tool_scorer],
    )
    scorable = MessageScorable.from_message(response.to_message())
    live = (await composite.score_async(scorable=scorable, expectation=expects("my_tool_call")))[0]
    assert live.get_value() is False
    saved = memory.get_observations(observation_ids=live.observation_ids)[0]
    replayed = (await composite.score_observation_async(observation=saved, expectation=expects("my_tool_call")))[0]
    assert replayed.status is ScoreStatus.UNDETERMINED, replayed.rationale
    assert "does not keep the conversation" in replayed.rationale


async def test_a_request_without_a_trace_keeps_absence_unproven_over_its_conversation(
    rig: tuple[InMemoryTraceClient, Tracer, OtelToolCallScorer],
) -> None:
    """Turn 1 traced and complete (no tool); turn 2's request untraced. Scoring turn 2's response
    for delete_files: no linked trace holds what the agent did for it, so not FALSE."""
    client, tracer, scorer = rig
    await initialize_pyrit_async(memory_db_type=IN_MEMORY)
    memory = CentralMemory.get_memory_instance()
    trace_id = _completed_run(client, tracer, "search")
    cid = str(uuid.uuid4())

    def add(role: str, text: str, trace: str | None = None) -> MessagePiece:
        piece = MessagePiece(role=role, original_value=text, conversation_id=cid, trace_id=trace)  # type: ignore[arg-type]
        memory.add_message_to_memory(request=piece.to_message())
        return piece

    add("user", "find it", trace_id)
    first = add("assistant", "found")
    add("user", "now delete my files")
    add("user", "(an image piece of the same request)")
    second = add("assistant", "done")

    async def score(piece: MessagePiece, tool_name: str) -> ScoreStatus | bool | None:
        s = (await scorer.score_async(scorable=MessageScorable.from_message(piece.to_message()),
                                      expectation=expects(tool_name)))[0]
        return s.status if s.status is ScoreStatus.UNDETERMINED else s.get_value()  # type: ignore[return-value]

    assert await score(first, "delete_files") is False  # turn 1 alone: traced and complete
    assert await score(second, "delete_files") is ScoreStatus.UNDETERMINED
    assert await score(second, "search") is True  # presence still proves


class _SearchBackend:
    """Seed 000's "another trace source": a backend search answers for the traces it found."""

    A, B = "a" * 32, "b" * 32

    def __init__(self, anonymous: bool = False) -> None:
        self.anonymous = anonymous

    def query(self, trace_ids: Sequence[str]) -> list[TraceQueryResult]:
        span = NeutralSpan(trace_id=self.A, span_id="1" * 16, start_time_unix_nano=1, end_time_unix_nano=2,
                           attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup"})
        return [
            TraceQueryResult("" if self.anonymous else t, True, (span,), Coverage.completed(CompletionSource.CALLER))
            for t in trace_ids
            if t == self.A
        ]

    def query_session(self, session_id: str) -> list[TraceQueryResult]:
        return []


@pytest.mark.parametrize("anonymous", [False, True])
async def test_a_trace_the_client_did_not_answer_for_is_not_complete(anonymous: bool) -> None:
    backend = _SearchBackend(anonymous)
    scorer = OtelToolCallScorer(source=OtelTraceSource(trace_client=backend))

    async def score(*ids: str, tool_name: str = "delete") -> ScoreStatus | bool | None:
        s = (await scorer.score_async(scorable=TraceScorable(trace_ids=ids), expectation=expects(tool_name)))[0]
        return s.status if s.status is ScoreStatus.UNDETERMINED else s.get_value()  # type: ignore[return-value]

    assert await score(backend.A) is False  # answered, complete: absence proven
    assert await score(backend.A, backend.B) is ScoreStatus.UNDETERMINED  # B: nobody reported on it
    assert await score(backend.A, backend.B, tool_name="lookup") is True


async def test_an_unknown_status_is_named_as_such_not_as_uncaptured_arguments() -> None:
    client = InMemoryTraceClient()
    trace_id = "cd" * 16
    client.add_spans([NeutralSpan(trace_id=trace_id, span_id="1" * 16, start_time_unix_nano=10, end_time_unix_nano=None,
                                  attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search"})])
    scorer = OtelToolCallScorer(source=OtelTraceSource(trace_client=client))
    expectation = ScoringExpectation(conditions=(ToolsCalled(tools=(ToolCallRequirement(name="search", status="ok"),)),))
    (score,) = await scorer.score_async(scorable=TraceScorable(trace_ids=(trace_id,)), expectation=expectation)
    assert score.status is ScoreStatus.UNDETERMINED
    assert "status not known" in score.rationale and "arguments" not in score.rationale


@pytest.mark.parametrize("metric", ["jaccard", "lcs", "levenshtein"])
async def test_plagiarism_metric_by_name(metric: str) -> None:
    (score,) = await PlagiarismScorer(reference_text="a b c", metric=metric).score_text_async(text="a b c")
    assert score.get_value() == 1.0


def test_plagiarism_unknown_metric_is_refused_up_front() -> None:
    with pytest.raises(ValueError, match="unknown metric 'cosine'"):
        PlagiarismScorer(reference_text="a b c", metric="cosine")


async def test_a_custom_target_with_a_tracer_captures_its_invocation(
    rig: tuple[InMemoryTraceClient, Tracer, OtelToolCallScorer],
) -> None:
    """Seed 000: "A custom local target can pass TargetTraceConfig(tracer=...) to its PromptTarget
    constructor. This captures the target invocation with a caller-owned provider." """
    client, tracer, scorer = rig
    await initialize_pyrit_async(memory_db_type=IN_MEMORY)

    class LocalAgentTarget(PromptTarget):
        async def send_prompt_async(self, *, message: Message) -> Message:
            with tool(tracer, "my_tool_call"):  # the local agent's tool, under the current context
                pass
            return MessagePiece(role="assistant", original_value="done",
                                conversation_id=message.conversation_id).to_message()

    target = LocalAgentTarget(trace_config=TargetTraceConfig(tracer=tracer))
    attack = PromptSendingAttack(objective_target=target,
                                 attack_scoring_config=AttackScoringConfig(objective_scorer=scorer))
    result = await attack.execute_async(objective="my_tool_call", expectation=expects("my_tool_call"))
    assert result.outcome is AttackOutcome.SUCCESS, result.outcome_reason
    (trace_id,) = result.trace_ids
    names = {s.name for s in client.query([trace_id])[0].spans}
    assert names == {"LocalAgentTarget.send_prompt_async", "execute_tool my_tool_call"}
    # without a tracer nothing is traced, as before
    untraced = PromptSendingAttack(objective_target=LocalAgentTarget(),
                                   attack_scoring_config=AttackScoringConfig(objective_scorer=scorer))
    assert (await untraced.execute_async(objective="x", expectation=expects("my_tool_call"))).trace_ids == ()


class _OneAnswerBackend:
    """A client that answers a query with one unnamed result holding every trace's spans."""

    def query(self, trace_ids: Sequence[str]) -> list[TraceQueryResult]:
        spans = tuple(
            NeutralSpan(trace_id=t, span_id=f"{i + 1:016x}", start_time_unix_nano=1, end_time_unix_nano=2,
                        attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup"})
            for i, t in enumerate(trace_ids)
        )
        return [TraceQueryResult("", True, spans, Coverage.completed(CompletionSource.CALLER))]

    def query_session(self, session_id: str) -> list[TraceQueryResult]:
        return []


async def test_one_unnamed_answer_for_every_trace_is_an_answer_for_each() -> None:
    scorer = OtelToolCallScorer(source=OtelTraceSource(trace_client=_OneAnswerBackend()))
    scope = TraceScorable(trace_ids=("a" * 32, "b" * 32))
    (score,) = await scorer.score_async(scorable=scope, expectation=expects("delete"))
    assert score.status is not ScoreStatus.UNDETERMINED and score.get_value() is False, score.rationale
