"""Seed 000's attack scenario end to end through Kafka and Redis, against a local HTTP agent.

HTTPTarget (tracing on) → a real HTTP server on 127.0.0.1 that extracts ``traceparent`` and
runs the tool under the real OTel SDK, exporting to Kafka with ``KafkaSpanExporter`` → the
toolwitness service (in-process, unique topics) → scores on Kafka → ``StreamingToolScorer``
maps them to attack outcomes. The agent sends a completion marker with its span count for
every prompt except "pending", which therefore stays UNDETERMINED at its (short) deadline.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from collector.boundary.streaming import StreamingToolScorer
from collector.config import ScorerTreeConfig
from scoring.executor.attack import AttackScoringConfig, PromptSendingAttack
from scoring.memory import CentralMemory
from scoring.models import AttackOutcome, MessageScorable
from scoring.prompt_target import HTTPTarget, TargetTraceConfig
from scoring.score import OtelToolCallScorer, SubStringScorer, TrueFalseCompositeScorer, TrueFalseScoreAggregator
from scoring.score.observation import InMemoryTraceClient, OtelTraceSource
from scoring.setup import IN_MEMORY, initialize_pyrit_async
from tests.integration.harness import control_client, expects, make_agent, make_config, running_service
from tests.integration.local_agent import LocalHttpAgent, LocalRequest

pytestmark = pytest.mark.integration

DEADLINE = timedelta(seconds=4)


async def test_seed_000_attack_through_the_stream(kafka_bootstrap: str, redis_url: str) -> None:
    await initialize_pyrit_async(memory_db_type=IN_MEMORY)
    memory = CentralMemory.get_memory_instance()
    trees = {
        "tools": ScorerTreeConfig(type="otel_tool_call"),
        "done_and_tool": ScorerTreeConfig(
            type="composite", aggregator="and",
            scorers=(ScorerTreeConfig(type="substring", substring="done"), ScorerTreeConfig(type="otel_tool_call")),
        ),
    }
    cfg = make_config(kafka_bootstrap, redis_url, scorers=trees)
    agent = make_agent(cfg)  # real SDK provider: span counter + KafkaSpanExporter on the spans topic
    tracer = agent.tracer
    timings: dict[str, float] = {}

    def my_tool_call() -> str:
        with tracer.start_as_current_span(
            "my_tool_call",
            attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "my_tool_call"},
        ):
            return "Local result"

    async with running_service(cfg), control_client(cfg) as tw:

        async def local_agent(request: LocalRequest) -> tuple[int, str]:
            """Execute the local agent under the received request context (export is synchronous)."""
            context = TraceContextTextMapPropagator().extract(request.headers)
            prompt = request.body.decode()

            def run() -> str:
                with tracer.start_as_current_span("agent", context=context) as root:
                    if prompt == "my_tool_call":
                        my_tool_call()
                return f"{root.get_span_context().trace_id:032x}"

            trace_id = await asyncio.to_thread(run)
            if prompt != "pending":
                if not await asyncio.to_thread(agent.provider.force_flush):
                    raise RuntimeError("Local trace export did not finish.")
                await tw.mark_complete(trace_id, span_count=agent.counter.count(trace_id))
            return 200, "done"

        async with LocalHttpAgent(local_agent) as server:
            target = HTTPTarget(
                http_request=f"POST / HTTP/1.1\nHost: 127.0.0.1:{server.port}\n\n{{PROMPT}}",
                use_tls=False,
                trace_config=TargetTraceConfig(enabled=True),
            )
            tool_scorer = StreamingToolScorer(tw, deadline=DEADLINE)
            attack = PromptSendingAttack(
                objective_target=target,
                attack_scoring_config=AttackScoringConfig(objective_scorer=tool_scorer),
                max_attempts_on_failure=0,
            )
            seen: list[str] = []
            for prompt, expected, trigger in (
                ("my_tool_call", AttackOutcome.SUCCESS, ("span", "marker", "expectation")),
                ("no tool", AttackOutcome.FAILURE, ("marker", "expectation")),
                ("pending", AttackOutcome.UNDETERMINED, ("deadline",)),
            ):
                started = time.perf_counter()
                result = await attack.execute_async(objective=prompt, expectation=expects("my_tool_call"))
                timings[prompt] = time.perf_counter() - started
                assert result.outcome is expected, result.outcome_reason
                assert result.automated_score is not None
                assert isinstance(result.automated_score.scorable, MessageScorable)
                assert result.automated_score.metadata["trigger"] in trigger
                assert len(result.trace_ids) == 1
                seen.append(f"{prompt}: {result.outcome.value}")
            assert seen == ["my_tool_call: success", "no tool: failure", "pending: undetermined"]
            assert timings["pending"] >= DEADLINE.total_seconds() * 0.9, "undetermined only at the deadline"

            # The composite: message scorer (local) AND tool evidence (streamed), with the evidence saved.
            composite_attack = PromptSendingAttack(
                objective_target=target,
                attack_scoring_config=AttackScoringConfig(
                    objective_scorer=TrueFalseCompositeScorer(
                        aggregator=TrueFalseScoreAggregator.AND,
                        scorers=[SubStringScorer(substring="done"),
                                 StreamingToolScorer(tw, deadline=DEADLINE, save_observations=True)],
                    ),
                ),
            )
            started = time.perf_counter()
            result = await composite_attack.execute_async(objective="my_tool_call", expectation=expects("my_tool_call"))
            timings["composite"] = time.perf_counter() - started
            assert result.outcome is AttackOutcome.SUCCESS
            assert result.automated_score is not None
            saved = memory.get_observations(observation_ids=result.automated_score.observation_ids)[0]

            # The same composite as a tree configured in the service (response text travels inline).
            service_tree = PromptSendingAttack(
                objective_target=target,
                attack_scoring_config=AttackScoringConfig(
                    objective_scorer=StreamingToolScorer(tw, scorer="done_and_tool", deadline=DEADLINE)),
            )
            result = await service_tree.execute_async(objective="my_tool_call", expectation=expects("my_tool_call"))
            assert result.outcome is AttackOutcome.SUCCESS
            assert result.automated_score is not None
            assert result.automated_score.metadata["scorer_tree"] == "done_and_tool"
    agent.close()

    # Saved attack tool evidence replays offline, with the in-process scorer.
    closed = InMemoryTraceClient()
    closed.close()
    replayed = (
        await OtelToolCallScorer(source=OtelTraceSource(trace_client=closed)).score_observation_async(
            observation=saved, expectation=expects("my_tool_call"))
    )[0]
    assert replayed.get_value() is True
    print("\nattack through the stream, time per execute_async: "
          + ", ".join(f"{k}={v * 1000:.0f} ms" for k, v in timings.items()))
    memory.dispose_engine()
