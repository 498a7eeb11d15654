"""``toolwitness smoke``: is a running deployment scoring, end to end? (``helm test`` runs it.)

Against the service a config describes (it does not start one), a small agent instrumented with
the real OpenTelemetry SDK runs one tool and exports its spans, under its own tenant, to the
spans topic or (``OtlpTarget``) over OTLP/gRPC to the sidecar agents use. Two expectations are
registered on its trace: the tool it ran (TRUE, before any marker) and a tool it never ran
(FALSE, once the completion marker with the span count arrives). The observation the FALSE
cites is read back and checked against its id. Exit 0 when all of it happened within the
timeout, else 1, saying which step did not.

The principal it runs as writes the control topic (and the spans topic, without the sidecar) and
reads scores and observations: with the chart's Kafka ACLs, the control plane's (given
span-producer rights too when the spans go to Kafka directly).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import grpc  # type: ignore[import-untyped]
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from rich.console import Console

from collector.client import ToolwitnessClient
from collector.config import ServiceConfig
from collector.otel import KafkaSpanExporter, SpanCountingProcessor
from collector.tail import status_name
from collector.wire.gen import score_pb2
from scoring.models import ScoringExpectation, ToolCallRequirement, ToolsCalled, TraceScorable

#: the tenant the smoke test's spans and expectations belong to: apart from real ones
SMOKE_TENANT = "toolwitness-smoke"
RAN = "toolwitness_smoke_tool"
NEVER_RAN = "toolwitness_smoke_absent_tool"


class SmokeError(RuntimeError):
    """A step of the smoke test did not happen; the message says which, and what to check."""


@dataclass
class SmokeReport:
    trace_id: str = ""
    steps: list[tuple[str, str, float]] = field(default_factory=list)  # (step, result, ms since start)


def tool_call_tree(cfg: ServiceConfig) -> str:
    """The name of a configured tree whose root is the tool-call scorer (the smoke test's judge)."""
    for name, tree in cfg.scorers.items():
        if tree.type == "otel_tool_call":
            return name
    trees = ", ".join(f"{n} ({t.type})" for n, t in cfg.scorers.items()) or "none"
    raise SmokeError(f"no scorer tree of type otel_tool_call in the config (scorers: {trees}): add one to smoke-test")


@dataclass(frozen=True)
class OtlpTarget:
    """Send the agent's spans over OTLP/gRPC (to the sidecar) instead of to Kafka directly."""

    endpoint: str  # host:port
    #: PEM file of the CA that signed the endpoint's certificate; empty: plaintext
    ca_file: str = ""
    #: bearer token the endpoint requires (the sidecar's --token-env), if any
    token: str = ""


def _span_exporter(
    cfg: ServiceConfig, tenant: str, otlp: OtlpTarget | None, timeout_s: float, spans_sasl_env: tuple[str, str] | None
) -> SpanExporter:
    k = cfg.kafka
    if otlp is None:
        # With Kafka ACLs the control plane (which registers the expectations) may not write spans:
        # a span producer's credentials write them, as an agent's exporter would.
        security = k.security if spans_sasl_env is None else k.security.model_copy(
            update={"sasl_username_env": spans_sasl_env[0], "sasl_password_env": spans_sasl_env[1]})
        return KafkaSpanExporter(
            bootstrap_servers=k.bootstrap_servers, topic=k.topics.spans, tenant=tenant,
            tenant_header=cfg.tenant.header, security=security, encoding=k.encoding,
        )
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    credentials = grpc.ssl_channel_credentials(Path(otlp.ca_file).read_bytes()) if otlp.ca_file else None
    return OTLPSpanExporter(
        endpoint=otlp.endpoint, insecure=credentials is None, credentials=credentials,
        headers={"authorization": f"Bearer {otlp.token}"} if otlp.token else None, timeout=int(max(1, timeout_s)),
    )


async def run_smoke(
    cfg: ServiceConfig,
    *,
    timeout_s: float = 60.0,
    out: Console | None = None,
    otlp: OtlpTarget | None = None,
    tenant: str = SMOKE_TENANT,
    spans_sasl_env: tuple[str, str] | None = None,
) -> SmokeReport:
    """Run the smoke test; raise ``SmokeError`` naming the step that did not happen.

    ``otlp``: the agent exports over OTLP/gRPC there (the sidecar), its tenant in the resource
    attribute the service reads; a sidecar that stamps a tenant of its own needs ``tenant`` to be
    that one. ``spans_sasl_env``: the environment variables of a span producer's SASL username and
    password, for the spans written to Kafka (the config's credentials register the expectations)."""
    console = out or Console()
    k = cfg.kafka
    tree = tool_call_tree(cfg)
    report = SmokeReport()
    started = time.monotonic()

    def step(what: str, result: str) -> None:
        ms = (time.monotonic() - started) * 1000
        report.steps.append((what, result, ms))
        console.print(f"  {what}: {result} ({ms:.0f} ms)")

    attribute = cfg.tenant.resource_attribute
    provider = TracerProvider(
        sampler=ALWAYS_ON, span_limits=SpanLimits(max_span_attribute_length=SpanLimits.UNSET),
        resource=Resource.create({attribute: tenant} if attribute else {}),
    )
    counter = SpanCountingProcessor()
    provider.add_span_processor(counter)
    exporter = _span_exporter(cfg, tenant, otlp, timeout_s, spans_sasl_env)
    via = f"OTLP/gRPC {otlp.endpoint}" if otlp else f"Kafka {k.bootstrap_servers}, spans topic {k.topics.spans}"
    finished = InMemorySpanExporter()  # exported below, so that a failed write is known here
    provider.add_span_processor(SimpleSpanProcessor(finished))
    tracer = provider.get_tracer("toolwitness-smoke")
    console.print(f"[bold]toolwitness smoke[/] — spans via {via}; scores topic {k.topics.scores} on "
                  f"{k.bootstrap_servers}, tenant {tenant}, scorer tree {tree!r}")
    try:
        async with ToolwitnessClient.from_kafka_config(k, tenant=tenant, timeout_s=min(timeout_s, 30.0)) as tw:
            with tracer.start_as_current_span("toolwitness smoke agent", context=Context()) as root:
                with tracer.start_as_current_span(
                    f"execute_tool {RAN}",
                    attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": RAN,
                                "gen_ai.tool.call.id": uuid.uuid4().hex},
                ):
                    pass
                report.trace_id = f"{root.get_span_context().trace_id:032x}"
            spans = finished.get_finished_spans()
            where = otlp.endpoint if otlp else k.topics.spans
            if await asyncio.to_thread(exporter.export, spans) is not SpanExportResult.SUCCESS:
                raise SmokeError(f"writing the agent's spans to {where} failed (the exporter's warning: why)")
            step("agent", f"trace {report.trace_id}: {len(spans)} spans written to {where}")
            scope = TraceScorable(trace_ids=(report.trace_id,))

            def ask(tool: str) -> ScoringExpectation:
                return ScoringExpectation(conditions=(ToolsCalled(tools=(ToolCallRequirement(name=tool),)),))

            ran = await tw.expect(scope, ask(RAN), scorer=tree)
            never = await tw.expect(scope, ask(NEVER_RAN), scorer=tree)
            step("expectations", f"{RAN} ran ({ran}), {NEVER_RAN} ran ({never}) registered on {k.topics.control}")
            ev = await _wait(tw, ran, timeout_s, f"'{RAN} ran' (TRUE expected)", cfg)
            if ev.status != 1:
                raise SmokeError(f"{RAN} ran: {status_name(ev.status)} ({ev.rationale}), expected TRUE")
            step("score", f"{RAN} ran → TRUE, {ev.time_to_verdict.ToTimedelta().total_seconds() * 1000:.0f} ms "
                          "after registration, before any completion marker")
            await tw.mark_complete(report.trace_id, span_count=counter.pop(report.trace_id))
            ev = await _wait(tw, never, timeout_s, f"'{NEVER_RAN} ran' (FALSE expected after the marker)", cfg)
            if ev.status != 2:
                raise SmokeError(f"{NEVER_RAN} ran: {status_name(ev.status)} ({ev.rationale}), expected FALSE")
            step("score", f"{NEVER_RAN} ran → FALSE once the marker completed the trace")
            try:
                obs = await tw.get_observation(ev.observation_ids[0], timeout=timeout_s)
            except TimeoutError:
                raise SmokeError(
                    f"observation {ev.observation_ids[0]} (cited by the FALSE) is not on {k.topics.observations}"
                ) from None
            names = sorted(e.name for e in obs.tool_executions)
            step("observation", f"{obs.observation_id[:12]}… read back, content checked: executions {names}")
    finally:
        provider.shutdown()
        exporter.shutdown()
    console.print(f"[bold green]toolwitness smoke: passed[/] in {(time.monotonic() - started) * 1000:.0f} ms")
    return report


async def _wait(
    tw: ToolwitnessClient, expectation_id: str, timeout_s: float, what: str, cfg: ServiceConfig
) -> score_pb2.ScoreEvent:
    try:
        return await tw.wait_for(expectation_id, timeout=timeout_s)
    except TimeoutError:
        raise SmokeError(
            f"no score for {what} on {cfg.kafka.topics.scores} within {timeout_s:.0f}s: is the service running "
            "and consuming "
            f"{cfg.kafka.topics.spans} + {cfg.kafka.topics.control} (group {cfg.kafka.group_id})? "
            f"Look for a dead letter of expectation {expectation_id} (toolwitness dlq) and at the service's log; "
            "spans sent through a sidecar that stamps its own tenant need --tenant set to it"
        ) from None
