"""The boundary records every call that ran, whatever the model put in it: arguments nested past
what JSON encoding reaches, a tool name the dispatcher resolved, a failure reported from an
``except``. The oracle is what the dispatcher and the tool body were given."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import JsonValue

from collector.boundary import intercept_tool, make_tool_middleware
from scoring.models import CaptureState
from scoring.normalize.spans import from_readable_span, normalize_span

Tracing = tuple[TracerProvider, InMemorySpanExporter]


def nested(depth: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"to": "bob@example.com"}
    for _ in range(depth):
        doc = {"a": doc}
    return doc


async def test_arguments_nested_past_json_encoding_still_record_the_call(
    memory_tracer: Tracing, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, exporter = memory_tracer
    monkeypatch.setenv("TOOLWITNESS_TOOL_INTERCEPT", "true")
    received: list[Mapping[str, Any]] = []

    async def dispatch(name: str, arguments: Mapping[str, Any]) -> JsonValue:
        received.append(arguments)
        return "sent"

    tools = make_tool_middleware(dispatch, session_id="s", tracer=provider.get_tracer("agent"))
    assert await tools("send_email", {"body": nested(3000)}) == "sent"
    text = '{"to": ' + "[" * 5000 + "1" + "]" * 5000 + "}"
    assert await intercept_tool(tool_name="send_email", tool_arguments=text, result="sent", session_id="s",
                                tracer=provider.get_tracer("agent")) == "sent"
    assert len(received) == 1  # the tool ran, with what the model wrote
    executions = [normalize_span(from_readable_span(s)).execution for s in exporter.get_finished_spans()]
    assert [(e.name, e.arguments_state) for e in executions if e] == [("send_email", CaptureState.ABSENT)] * 2


async def test_the_middleware_names_the_tool_the_dispatcher_ran(
    memory_tracer: Tracing, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, exporter = memory_tracer
    monkeypatch.setenv("TOOLWITNESS_TOOL_INTERCEPT", "true")
    ran: list[str] = []

    def resolve(requested: str) -> str:
        return requested.strip().lower()

    async def dispatch(name: str, arguments: Mapping[str, Any]) -> JsonValue:
        ran.append(resolve(name))
        return "sent"

    tools = make_tool_middleware(dispatch, session_id="s", tracer=provider.get_tracer("agent"), resolve=resolve)
    await tools("Send_Email ", {"to": "x"})
    (span,) = exporter.get_finished_spans()
    a = dict(span.attributes or {})
    assert (a["gen_ai.tool.name"], a["toolwitness.tool.requested_name"]) == (ran[0], "Send_Email ")


async def test_a_failure_reported_from_the_except_path_is_a_failed_call(
    memory_tracer: Tracing, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, exporter = memory_tracer
    monkeypatch.setenv("TOOLWITNESS_TOOL_INTERCEPT", "true")
    try:
        raise TimeoutError("upstream down")
    except TimeoutError as exc:
        await intercept_tool(tool_name="fetch", tool_arguments="{}", result={"error": str(exc)}, error=exc,
                             session_id="s", tracer=provider.get_tracer("agent"))
    (span,) = exporter.get_finished_spans()
    execution = normalize_span(from_readable_span(span)).execution
    assert execution is not None and execution.status == "error"
    assert dict(span.attributes or {})["error.type"] == "TimeoutError"
