"""Seed 000 ("Trace-backed tool-call scoring"), run with only the import lines changed.

The code inside each test is the seed's walkthrough text; the printed lines are
compared with the seed's printed results.
"""

import asyncio

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from scoring.memory import CentralMemory
from scoring.models import ScoreStatus, ScoringExpectation, ToolCallRequirement, ToolsCalled, TraceScorable
from scoring.score import OtelToolCallScorer
from scoring.score.observation import InMemoryTraceClient, InMemoryTraceExporter, OtelTraceSource
from scoring.setup import IN_MEMORY, initialize_pyrit_async


async def test_seed_000_capture_missing_and_replay(capsys: pytest.CaptureFixture[str]) -> None:
    await initialize_pyrit_async(  # type: ignore
        memory_db_type=IN_MEMORY,
        load_defaults=False,
        env_files=[],
        silent=True,
    )
    memory = CentralMemory.get_memory_instance()
    client = InMemoryTraceClient()
    provider = TracerProvider(sampler=ALWAYS_ON, span_limits=SpanLimits(max_span_attribute_length=SpanLimits.UNSET))
    provider.add_span_processor(SimpleSpanProcessor(InMemoryTraceExporter(trace_client=client)))
    tracer = provider.get_tracer("pyrit-tool-example")
    scorer = OtelToolCallScorer(source=OtelTraceSource(trace_client=client))

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

    # Capture and score a real invocation
    with tracer.start_as_current_span("agent", context=Context()) as root:
        my_tool_call()
        trace_id = f"{root.get_span_context().trace_id:032x}"

    scope = TraceScorable(trace_ids=(trace_id,))
    positive = (await scorer.score_async(scorable=scope, expectation=expects("my_tool_call")))[0]  # type: ignore
    assert positive.get_value() is True
    assert positive.scorable == scope
    print(f"Observed my_tool_call: {positive.get_value()}")

    # Missing evidence is not a negative result
    unknown = (await scorer.score_async(scorable=scope, expectation=expects("summarize")))[0]  # type: ignore
    assert unknown.status is ScoreStatus.UNDETERMINED
    print(f"Missing tool before completion: {unknown.status.value}")

    flushed = await asyncio.to_thread(provider.force_flush)  # type: ignore
    assert flushed
    client.mark_complete(trace_ids=(trace_id,))
    negative = (await scorer.score_async(scorable=scope, expectation=expects("summarize")))[0]  # type: ignore
    assert negative.get_value() is False
    print(f"Missing tool after controlled completion: {negative.get_value()}")

    # Re-match saved evidence with capture closed
    saved = memory.get_observations(observation_ids=negative.observation_ids)[0]
    assert saved.scorable == scope
    before_replay = saved.model_dump_json()
    await asyncio.to_thread(provider.shutdown)  # type: ignore
    client.close()

    replayed = (await scorer.score_observation_async(observation=saved, expectation=expects("my_tool_call")))[0]  # type: ignore
    assert replayed.get_value() is True
    assert replayed.observation_ids == negative.observation_ids
    assert memory.get_observations(observation_ids=negative.observation_ids)[0].model_dump_json() == before_replay
    print(f"my_tool_call in saved evidence after capture is closed: {replayed.get_value()}")

    assert capsys.readouterr().out.splitlines() == [
        "Observed my_tool_call: True",
        "Missing tool before completion: undetermined",
        "Missing tool after controlled completion: False",
        "my_tool_call in saved evidence after capture is closed: True",
    ]
