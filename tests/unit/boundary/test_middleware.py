"""make_tool_middleware: one wrapper around a tool dispatcher, gated, with an optional allowlist."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from pydantic import JsonValue

from collector.boundary import make_tool_middleware
from collector.poisoning.campaigns import Campaign, CampaignRegistry
from collector.poisoning.service import PoisoningConfig, PoisoningServer
from scoring.normalize.spans import from_readable_span, normalize_span

Tracing = tuple[TracerProvider, InMemorySpanExporter]
RESULTS: dict[str, JsonValue] = {"fetch_page": {"id": "p", "body": "Report text"}, "clock": "12:00"}


async def dispatch(name: str, arguments: Mapping[str, Any]) -> JsonValue:
    if name == "explode":
        raise RuntimeError("tool failed")
    return RESULTS[name]


async def test_gate_off_passes_everything_through(memory_tracer: Tracing) -> None:
    provider, exporter = memory_tracer
    tools = make_tool_middleware(dispatch, session_id="s", tracer=provider.get_tracer("agent"))
    assert await tools("fetch_page", {"url": "u"}) is RESULTS["fetch_page"]
    with pytest.raises(RuntimeError):
        await tools("explode", {})
    assert exporter.get_finished_spans() == ()


async def test_allowlist_scopes_tracing(memory_tracer: Tracing, monkeypatch: pytest.MonkeyPatch) -> None:
    provider, exporter = memory_tracer
    monkeypatch.setenv("TOOLWITNESS_TOOL_INTERCEPT", "true")
    sessions = iter(["s-1", "s-2"])
    tools = make_tool_middleware(dispatch, session_id=lambda: next(sessions), allowlist={"fetch_page"},
                                 tracer=provider.get_tracer("agent"))
    assert await tools("clock", {}) is RESULTS["clock"]
    assert exporter.get_finished_spans() == ()
    assert await tools("fetch_page", {"url": "u"}) is RESULTS["fetch_page"]
    (span,) = exporter.get_finished_spans()
    a = dict(span.attributes or {})
    assert a["gen_ai.tool.name"] == "fetch_page" and a["gen_ai.tool.call.arguments"] == '{"url": "u"}'
    assert a["gen_ai.conversation.id"] == "s-1"


async def test_a_failing_tool_is_recorded_as_a_failed_execution(
    memory_tracer: Tracing, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, exporter = memory_tracer
    monkeypatch.setenv("TOOLWITNESS_TOOL_INTERCEPT", "true")
    tools = make_tool_middleware(dispatch, session_id="s", tracer=provider.get_tracer("agent"))
    with pytest.raises(RuntimeError, match="tool failed"):
        await tools("explode", {"x": 1})
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    execution = normalize_span(from_readable_span(span)).execution
    assert execution is not None and execution.name == "explode" and execution.status == "error"


async def test_only_traced_tools_can_be_poisoned(memory_tracer: Tracing, monkeypatch: pytest.MonkeyPatch) -> None:
    provider, _ = memory_tracer
    reg = CampaignRegistry([Campaign(campaign_id="c", payload_template="do X {canary}", sessions=frozenset({"s"}))])
    async with PoisoningServer(reg, PoisoningConfig(listen="127.0.0.1:0")) as server:
        monkeypatch.setenv("TOOLWITNESS_TOOL_INTERCEPT", "true")
        monkeypatch.setenv("TOOLWITNESS_POISONING_ENDPOINT", server.endpoint)
        tools = make_tool_middleware(dispatch, session_id="s", allowlist={"fetch_page"},
                                     tracer=provider.get_tracer("agent"), timeout_s=5)
        assert await tools("clock", {}) == "12:00", "not in the allowlist: never reaches the service"
        poisoned = await tools("fetch_page", {"url": "u"})
        assert isinstance(poisoned, dict) and reg.canaries_for("s")[0] in str(poisoned["body"])
        assert server.calls == 1


async def test_the_span_covers_the_tool_and_the_tools_it_calls_are_its_children(
    memory_tracer: Tracing, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, exporter = memory_tracer
    monkeypatch.setenv("TOOLWITNESS_TOOL_INTERCEPT", "true")
    ran: dict[str, tuple[int, int]] = {}

    async def slow(name: str, arguments: Mapping[str, Any]) -> JsonValue:
        start = time.time_ns()
        if name == "plan":
            await tools("lookup", {})
        await asyncio.sleep(0.02)
        ran[name] = (start, time.time_ns())
        return name

    tools = make_tool_middleware(slow, session_id="s", tracer=provider.get_tracer("agent"))
    # started first, finished last: a span opened after the tool would list "execute" first
    await asyncio.gather(tools("plan", {}), tools("execute", {}))
    spans = {dict(s.attributes or {})["gen_ai.tool.name"]: s for s in exporter.get_finished_spans()}
    for name, (start, end) in ran.items():
        s = spans[name]
        assert s.start_time is not None and s.end_time is not None
        assert s.start_time <= start and end <= s.end_time, name
    assert spans["lookup"].parent is not None
    assert spans["lookup"].parent.span_id == spans["plan"].context.span_id
    assert spans["plan"].start_time is not None and spans["execute"].start_time is not None
    assert spans["plan"].start_time <= spans["execute"].start_time


async def test_a_cancelled_tool_is_recorded_as_a_failed_execution(
    memory_tracer: Tracing, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, exporter = memory_tracer
    monkeypatch.setenv("TOOLWITNESS_TOOL_INTERCEPT", "true")

    async def stuck(name: str, arguments: Mapping[str, Any]) -> JsonValue:
        await asyncio.sleep(60)
        return "never"

    tools = make_tool_middleware(stuck, session_id="s", tracer=provider.get_tracer("agent"))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(tools("send_email", {"body": "tw-canary-x"}), timeout=0.05)
    (span,) = exporter.get_finished_spans()
    execution = normalize_span(from_readable_span(span)).execution
    assert execution is not None and execution.name == "send_email" and execution.status == "error"
    assert execution.arguments == '{"body": "tw-canary-x"}'


@pytest.mark.parametrize(
    "result",
    [{1: "some text", 2: "more"}, ("some text", "more"), b"some text", float("nan")],
    ids=["int-keys", "tuple", "bytes", "nan"],
)
async def test_a_result_json_cannot_carry_back_unchanged_is_not_offered_for_poisoning(
    memory_tracer: Tracing, monkeypatch: pytest.MonkeyPatch, result: Any
) -> None:
    provider, exporter = memory_tracer
    reg = CampaignRegistry([Campaign(campaign_id="c", payload_template="do X {canary}", sessions=frozenset({"s"}))])
    async with PoisoningServer(reg, PoisoningConfig(listen="127.0.0.1:0")) as server:
        monkeypatch.setenv("TOOLWITNESS_TOOL_INTERCEPT", "true")
        monkeypatch.setenv("TOOLWITNESS_POISONING_ENDPOINT", server.endpoint)

        async def odd(name: str, arguments: Mapping[str, Any]) -> JsonValue:
            return result  # type: ignore[no-any-return]

        tools = make_tool_middleware(odd, session_id="s", tracer=provider.get_tracer("agent"), timeout_s=5)
        assert await tools("fetch_page", {}) is result  # the agent's own value, same keys and type
        assert server.calls == 0 and reg.deliveries() == []  # nothing logged as delivered
    (span,) = exporter.get_finished_spans()
    a = dict(span.attributes or {})
    assert a["toolwitness.tool.intercept.skipped"] == "result_not_plain_json"
    assert "toolwitness.tool.intercept.error" not in a


async def test_a_session_that_cannot_be_read_costs_the_exchange_not_the_span(
    memory_tracer: Tracing, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, exporter = memory_tracer
    monkeypatch.setenv("TOOLWITNESS_TOOL_INTERCEPT", "true")

    def no_session() -> str:
        raise LookupError("no session in this context")

    middleware = make_tool_middleware(dispatch, session_id=no_session, tracer=provider.get_tracer("agent"))
    assert await middleware("clock", {"tz": "UTC"}) == "12:00"
    (span,) = exporter.get_finished_spans()
    facts = normalize_span(from_readable_span(span))
    assert facts.execution is not None and facts.execution.name == "clock"
    assert (span.attributes or {})["toolwitness.tool.intercept.skipped"] == "invalid_call"


async def test_inside_a_frameworks_tool_span_the_middleware_keeps_the_frameworks_call_id(
    memory_tracer: Tracing, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, exporter = memory_tracer
    monkeypatch.setenv("TOOLWITNESS_TOOL_INTERCEPT", "true")
    tracer = provider.get_tracer("agent")
    middleware = make_tool_middleware(dispatch, session_id="s", tracer=tracer)
    framework = {"openinference.span.kind": "TOOL", "tool.name": "clock", "tool_call.id": "call_abc"}
    with tracer.start_as_current_span("clock", attributes=framework):
        await middleware("clock", {})
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "execute_tool clock"]
    assert (span.attributes or {})["gen_ai.tool.call.id"] == "call_abc"
