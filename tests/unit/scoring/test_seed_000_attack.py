"""Seed 000, "Score a tool call through an attack", run with only the import lines changed.

The first half of the seed (set-up, ``expects``, ``my_tool_call``) is reproduced as far as
the attack section uses it; the attack section itself is the seed's text. The printed lines
are compared with the seed's printed results.
"""

import asyncio

import httpx
import pytest
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from scoring.executor.attack import AttackScoringConfig, PromptSendingAttack
from scoring.memory import CentralMemory
from scoring.models import AttackOutcome, MessageScorable, ScoringExpectation, ToolCallRequirement, ToolsCalled
from scoring.prompt_target import HTTPTarget, TargetTraceConfig
from scoring.score import OtelToolCallScorer, SubStringScorer, TrueFalseCompositeScorer, TrueFalseScoreAggregator
from scoring.score.observation import InMemoryTraceClient, InMemoryTraceExporter, OtelTraceSource
from scoring.setup import IN_MEMORY, initialize_pyrit_async


async def test_seed_000_score_a_tool_call_through_an_attack(capsys: pytest.CaptureFixture[str]) -> None:
    # --- from the seed's first half: set-up, expects(), my_tool_call() ---
    await initialize_pyrit_async(  # type: ignore
        memory_db_type=IN_MEMORY,
        load_defaults=False,
        env_files=[],
        silent=True,
    )
    memory = CentralMemory.get_memory_instance()

    def expects(*names: str) -> ScoringExpectation:
        """Build a name-only condition."""
        return ScoringExpectation(conditions=(ToolsCalled(tools=tuple(ToolCallRequirement(name=name) for name in names)),))

    def my_tool_call() -> str:
        """Execute a deterministic tool with real SDK instrumentation."""
        with tracer.start_as_current_span(
            "my_tool_call",
            attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "my_tool_call"},
        ):
            return "Local result"

    # --- the seed's attack section, verbatim ---
    client = InMemoryTraceClient()
    provider = TracerProvider(sampler=ALWAYS_ON, span_limits=SpanLimits(max_span_attribute_length=SpanLimits.UNSET))
    provider.add_span_processor(SimpleSpanProcessor(InMemoryTraceExporter(trace_client=client)))
    tracer = provider.get_tracer("local-attack-agent")

    async def local_agent_async(request: httpx.Request) -> httpx.Response:
        """Execute the local agent under the received request context."""
        context = TraceContextTextMapPropagator().extract(dict(request.headers))
        prompt = request.content.decode()
        with tracer.start_as_current_span("agent", context=context) as root:
            if prompt == "my_tool_call":
                my_tool_call()
        if prompt != "pending":
            if not await asyncio.to_thread(provider.force_flush):
                raise RuntimeError("Local trace export did not finish.")
            client.mark_complete(trace_ids=(f"{root.get_span_context().trace_id:032x}",))
        return httpx.Response(200, text="done")

    target = HTTPTarget(
        http_request="POST / HTTP/1.1\nHost: local-agent.test\n\n{PROMPT}",
        transport=httpx.MockTransport(local_agent_async),
        trace_config=TargetTraceConfig(enabled=True),
    )
    tool_scorer = OtelToolCallScorer(source=OtelTraceSource(trace_client=client))
    attack = PromptSendingAttack(
        objective_target=target,
        attack_scoring_config=AttackScoringConfig(objective_scorer=tool_scorer),
        max_attempts_on_failure=0,
    )
    for prompt, expected in (
        ("my_tool_call", AttackOutcome.SUCCESS),
        ("no tool", AttackOutcome.FAILURE),
        ("pending", AttackOutcome.UNDETERMINED),
    ):
        result = await attack.execute_async(objective=prompt, expectation=expects("my_tool_call"))  # type: ignore
        assert result.outcome is expected
        assert isinstance(result.automated_score.scorable, MessageScorable)
        print(f"{prompt}: {result.outcome.value}")

    composite_attack = PromptSendingAttack(
        objective_target=target,
        attack_scoring_config=AttackScoringConfig(
            objective_scorer=TrueFalseCompositeScorer(
                aggregator=TrueFalseScoreAggregator.AND,
                scorers=[SubStringScorer(substring="done"), tool_scorer],
            ),
        ),
    )
    result = await composite_attack.execute_async(  # type: ignore
        objective="my_tool_call", expectation=expects("my_tool_call")
    )
    assert result.outcome is AttackOutcome.SUCCESS
    print(f"Message and tool evidence: {result.outcome.value}")
    saved = memory.get_observations(observation_ids=result.automated_score.observation_ids)[0]
    await asyncio.to_thread(provider.shutdown)  # type: ignore
    client.close()
    replayed = (  # type: ignore
        await tool_scorer.score_observation_async(observation=saved, expectation=expects("my_tool_call"))
    )[0]
    assert replayed.get_value() is True
    print(f"Saved attack tool evidence: {replayed.get_value()}")
    memory.dispose_engine()

    assert capsys.readouterr().out.splitlines() == [
        "my_tool_call: success",
        "no tool: failure",
        "pending: undetermined",
        "Message and tool evidence: success",
        "Saved attack tool evidence: True",
    ]


# --------------------------------------------------------------------------------------------------
# "Configure tracing": the rules the seed states, one by one
# --------------------------------------------------------------------------------------------------


def _recording_transport(seen: list[httpx.Request], text: str = "done") -> httpx.MockTransport:
    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, text=text)

    return httpx.MockTransport(handler)


async def test_tracing_is_off_by_default_and_sends_no_trace_context() -> None:
    from scoring.models import Message, MessagePiece

    seen: list[httpx.Request] = []
    target = HTTPTarget(http_request="POST /x HTTP/1.1\nHost: agent.test\nX-Api: 1\n\n{PROMPT}",
                        transport=_recording_transport(seen))
    assert target.trace_config.enabled is False
    request = MessagePiece(role="user", original_value="hello")
    response = await target.send_prompt_async(message=Message(message_pieces=[request]))
    assert response.role == "assistant" and response.get_value() == "done"
    assert request.trace_id is None
    (sent,) = seen
    assert "traceparent" not in sent.headers and "tracestate" not in sent.headers
    assert str(sent.url) == "https://agent.test/x" and sent.headers["x-api"] == "1" and sent.content == b"hello"


async def test_a_fresh_traceparent_per_request_saved_on_the_request() -> None:
    from scoring.models import Message, MessagePiece

    seen: list[httpx.Request] = []
    target = HTTPTarget(http_request="POST / HTTP/1.1\r\nHost: agent.test\r\n\r\n{PROMPT}", use_tls=False,
                        transport=_recording_transport(seen), trace_config=TargetTraceConfig(enabled=True))
    pieces = [MessagePiece(role="user", original_value=p) for p in ("a", "b")]
    for piece in pieces:
        await target.send_prompt_async(message=Message(message_pieces=[piece]))
    ids = []
    for piece, sent in zip(pieces, seen, strict=True):
        version, trace_id, span_id, flags = sent.headers["traceparent"].split("-")
        assert (version, flags) == ("00", "01") and len(span_id) == 16
        assert piece.trace_id == trace_id
        ids.append(trace_id)
    assert ids[0] != ids[1]
    assert str(seen[0].url) == "http://agent.test/"


@pytest.mark.parametrize("header", ["traceparent", "TraceState"])
def test_manual_trace_headers_while_enabled_are_an_error(header: str) -> None:
    raw = f"POST / HTTP/1.1\nHost: agent.test\n{header}: 00-{'1' * 32}-{'2' * 16}-01\n\n{{PROMPT}}"
    with pytest.raises(ValueError, match="keep tracing disabled"):
        HTTPTarget(http_request=raw, trace_config=TargetTraceConfig(enabled=True))
    HTTPTarget(http_request=raw)  # fine with tracing disabled: the caller owns the context


async def test_a_caller_owned_tracer_captures_the_target_invocation() -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from scoring.models import Message, MessagePiece

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    seen: list[httpx.Request] = []
    target = HTTPTarget(http_request="GET /{PROMPT} HTTP/1.1\nHost: agent.test\n\n",
                        transport=_recording_transport(seen),
                        trace_config=TargetTraceConfig(enabled=True, tracer=provider.get_tracer("caller")))
    piece = MessagePiece(role="user", original_value="q")
    await target.send_prompt_async(message=Message(message_pieces=[piece]))
    (span,) = exporter.get_finished_spans()
    assert piece.trace_id == f"{span.context.trace_id:032x}"
    assert seen[0].headers["traceparent"].split("-")[2] == f"{span.context.span_id:016x}"
    assert str(seen[0].url) == "https://agent.test/q" and (span.attributes or {})["http.response.status_code"] == 200
    provider.shutdown()


def test_request_templates_are_validated() -> None:
    with pytest.raises(ValueError, match="request line"):
        HTTPTarget(http_request="nonsense")
    with pytest.raises(ValueError, match="Host"):
        HTTPTarget(http_request="POST / HTTP/1.1\n\n{PROMPT}")


async def test_retries_only_on_failure_and_validates_before_sending() -> None:
    from scoring.score import ScorerConfigurationError

    await initialize_pyrit_async(memory_db_type=IN_MEMORY)
    client = InMemoryTraceClient()
    seen: list[httpx.Request] = []
    target = HTTPTarget(http_request="POST / HTTP/1.1\nHost: a.test\n\n{PROMPT}", transport=_recording_transport(seen),
                        trace_config=TargetTraceConfig(enabled=True))
    scorer = OtelToolCallScorer(source=OtelTraceSource(trace_client=client))
    expectation = ScoringExpectation(conditions=(ToolsCalled(tools=(ToolCallRequirement(name="t"),)),))
    with pytest.raises(ScorerConfigurationError):  # no condition for a trace scorer: refused before sending
        await PromptSendingAttack(objective_target=target, attack_scoring_config=AttackScoringConfig(
            objective_scorer=scorer)).execute_async(objective="x")
    assert seen == []

    # Each request's empty trace is declared complete (0 spans) by the transport -> FAILURE -> retried.
    async def complete_then_done(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        client.mark_complete(trace_ids=(request.headers["traceparent"].split("-")[1],), span_count=0)
        return httpx.Response(200, text="done")

    retrying = PromptSendingAttack(
        objective_target=HTTPTarget(http_request="POST / HTTP/1.1\nHost: a.test\n\n{PROMPT}",
                                    transport=httpx.MockTransport(complete_then_done),
                                    trace_config=TargetTraceConfig(enabled=True)),
        attack_scoring_config=AttackScoringConfig(objective_scorer=scorer),
        max_attempts_on_failure=2,
    )
    result = await retrying.execute_async(objective="go", expectation=expectation)
    assert result.outcome is AttackOutcome.FAILURE and result.executed_turns == 3 and len(set(result.trace_ids)) == 3
    # undetermined is not a failure: no retry
    seen.clear()
    result = await PromptSendingAttack(objective_target=target, attack_scoring_config=AttackScoringConfig(
        objective_scorer=scorer), max_attempts_on_failure=2).execute_async(objective="go", expectation=expectation)
    assert result.outcome is AttackOutcome.UNDETERMINED and result.executed_turns == 1 and len(seen) == 1
    memory = CentralMemory.get_memory_instance()
    pieces = memory.get_message_pieces(conversation_id=result.conversation_id)
    assert [p.role for p in pieces] == ["user", "assistant"] and pieces[0].trace_id == result.trace_ids[0]
    client.close()
