"""``toolwitness demo``: the service and a small instrumented agent walking through seed 000.

Needs Kafka and Redis (``make demo`` starts them with scripts/services.py). The
agent uses the real OpenTelemetry SDK and exports its spans to Kafka; the
service scores them as they stream; each score is printed as it arrives.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from datetime import timedelta

from opentelemetry.context import Context
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from rich.console import Console
from rich.table import Table

from collector.client import ToolwitnessClient
from collector.config import ScorerTreeConfig, ServiceConfig, TopicsConfig, redact_urls
from collector.otel import KafkaSpanExporter, SpanCountingProcessor
from collector.pipeline.service import ToolwitnessService
from collector.telemetry.logs import quiet_retried_coordinator_lookups
from collector.wire.gen import score_pb2
from scoring.models import MessageScorable, ScoringExpectation, ToolCallRequirement, ToolsCalled, TraceScorable
from scoring.score import OtelToolCallScorer
from scoring.score.observation import InMemoryTraceClient, OtelTraceSource

VERDICT = {1: "[green]TRUE[/]", 2: "[red]FALSE[/]", 3: "[yellow]UNDETERMINED[/]"}


def expects(*names: str) -> ScoringExpectation:
    return ScoringExpectation(conditions=(ToolsCalled(tools=tuple(ToolCallRequirement(name=n) for n in names)),))


def demo_config() -> ServiceConfig:
    run = uuid.uuid4().hex[:8]
    return ServiceConfig.model_validate(
        {
            "kafka": {
                "bootstrap_servers": os.environ.get("TOOLWITNESS_KAFKA_BOOTSTRAP", "127.0.0.1:19092"),
                "group_id": f"toolwitness-demo-{run}",
                "topics": TopicsConfig(
                    spans=f"demo-{run}.otlp_spans",
                    control=f"demo-{run}.control",
                    scores=f"demo-{run}.scores",
                    observations=f"demo-{run}.observations",
                    dlq=f"demo-{run}.dlq",
                ).model_dump(),
                "poll_timeout_ms": 50,
            },
            "redis": {
                "url": os.environ.get("TOOLWITNESS_REDIS_URL", "redis://127.0.0.1:6390/0"),
                "key_prefix": f"demo{run}",
            },
            "completion": {"sweep_interval_ms": 100},
            "admin": {"port": 0},
            "scorers": {
                "tools": ScorerTreeConfig(type="otel_tool_call"),
                "done_and_tool": ScorerTreeConfig(
                    type="composite",
                    aggregator="and",
                    scorers=(
                        ScorerTreeConfig(type="substring", substring="done"),
                        ScorerTreeConfig(type="otel_tool_call"),
                    ),
                ),
            },
            "log_level": "WARNING",
        }
    )


async def run_demo() -> int:
    quiet_retried_coordinator_lookups()  # a broker just started has no group coordinator for a moment
    console = Console(width=max(Console().width, 130))
    cfg = demo_config()
    provider = TracerProvider(sampler=ALWAYS_ON, span_limits=SpanLimits(max_span_attribute_length=SpanLimits.UNSET))
    counter = SpanCountingProcessor()
    provider.add_span_processor(counter)
    provider.add_span_processor(
        SimpleSpanProcessor(
            KafkaSpanExporter(bootstrap_servers=cfg.kafka.bootstrap_servers, topic=cfg.kafka.topics.spans)
        )
    )
    tracer = provider.get_tracer("toolwitness-demo-agent")

    def my_tool_call() -> str:
        with tracer.start_as_current_span(
            "my_tool_call", attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "my_tool_call"}
        ):
            return "Local result"

    table = Table(title="toolwitness demo — scores as they arrive on the scores topic")
    for col in ("scenario", "expectation", "verdict", "trigger", "time to verdict", "coverage"):
        table.add_column(col)
    ok = True
    obs_id = ""  # the observation the replay step reads (printed at the end)

    def show(scenario: str, expect: str, ev: score_pb2.ScoreEvent, want: int) -> None:
        nonlocal ok
        ok &= ev.status == want
        cov = "complete" if ev.coverage.complete else ", ".join(ev.coverage.reasons)
        ttv = ev.time_to_verdict.ToTimedelta().total_seconds() * 1000
        table.add_row(scenario, expect, VERDICT.get(ev.status, "?"), ev.trigger, f"{ttv:.0f} ms", cov)
        console.print(f"  {scenario}: {expect} → {VERDICT.get(ev.status)} ({ev.trigger}, {ttv:.0f} ms, {cov})")

    service = ToolwitnessService(cfg, owns_process=True)
    redis = redact_urls(cfg.redis.url)
    console.print(f"[bold]toolwitness demo[/] — Kafka {cfg.kafka.bootstrap_servers}, Redis {redis}")
    await service.start()
    task = asyncio.create_task(service.run())
    try:
        async with ToolwitnessClient(bootstrap_servers=cfg.kafka.bootstrap_servers, topics=cfg.kafka.topics) as tw:
            # 1. Capture and score a real invocation: TRUE before any completion marker.
            with tracer.start_as_current_span("agent", context=Context()) as root:
                my_tool_call()
                trace_id = f"{root.get_span_context().trace_id:032x}"
            scope = TraceScorable(trace_ids=(trace_id,))
            e1 = await tw.expect(scope, expects("my_tool_call"))
            show("real invocation", "my_tool_call ran", await tw.wait_for(e1, timeout=60), 1)

            # 2. Missing evidence is not a negative result: nothing until the marker, then FALSE.
            e2 = await tw.expect(scope, expects("summarize"))
            key = service.store.k.expectation("default", e2)
            async with asyncio.timeout(30):
                while not await service.redis.exists(key):  # noqa: ASYNC110 - polling another process
                    await asyncio.sleep(0.02)
            async with service.batch_lock:  # the batch that registered it is fully processed
                pass
            await service.sweep()
            pending_note = "none" if not tw.events(e2) else "UNEXPECTED"
            ok &= not tw.events(e2)
            console.print(
                f"  missing tool: registered and evaluated, score so far: {pending_note} (trace may still grow)"
            )
            t0 = time.monotonic()
            await tw.mark_complete(trace_id, span_count=counter.pop(trace_id))
            ev2 = await tw.wait_for(e2, timeout=60)
            show("missing tool, after marker", "summarize ran", ev2, 2)
            console.print(f"    (FALSE arrived {1000 * (time.monotonic() - t0):.0f} ms after the marker)")

            # 3. A never-completed trace: UNDETERMINED at the deadline, never FALSE.
            with tracer.start_as_current_span("agent", context=Context()) as root3:
                pass
            open_scope = TraceScorable(trace_ids=(f"{root3.get_span_context().trace_id:032x}",))
            e3 = await tw.expect(open_scope, expects("summarize"), deadline=timedelta(seconds=2))
            show("never completed", "summarize ran", await tw.wait_for(e3, timeout=60), 3)

            # 4. A message-scoped composite: the response says "done" AND the tool ran.
            msg = MessageScorable(message_id="m-1", conversation_id="c-1", trace_ids=(trace_id,), response_text="done")
            e4 = await tw.expect(msg, expects("my_tool_call"), scorer="done_and_tool")
            show("message + tool (AND)", "'done' and my_tool_call", await tw.wait_for(e4, timeout=60), 1)

            # 5. Re-match saved evidence with the capture closed: replay the observation of (2).
            obs = await tw.get_observation(ev2.observation_ids[0], timeout=60)
            obs_id = obs.observation_id
        console.print(table)
        closed = InMemoryTraceClient()
        closed.close()
        replayed = await OtelToolCallScorer(source=OtelTraceSource(trace_client=closed)).score_observation_async(
            observation=obs, expectation=expects("my_tool_call")
        )
        console.print(
            f"  replay of observation {obs.observation_id[:12]}… (no Kafka, no Redis): "
            f"my_tool_call → {replayed[0].get_value()}"
        )
        ok &= replayed[0].get_value() is True
    finally:
        service.request_stop()
        await asyncio.wait_for(task, timeout=30)
        await service.shutdown()
        provider.shutdown()
    console.print("[bold green]demo OK[/]" if ok else "[bold red]demo: unexpected verdicts[/]")
    t = cfg.kafka.topics
    hint = f"  read them back: TOOLWITNESS_KAFKA__TOPICS__SCORES={t.scores} toolwitness scores"
    if obs_id:
        hint += (f"\n  and the evidence: TOOLWITNESS_KAFKA__TOPICS__OBSERVATIONS={t.observations} "
                 f"toolwitness observation {obs_id}")
    console.print(hint, markup=False, highlight=False, soft_wrap=True)
    return 0 if ok else 1
