"""The conventions table on the shapes the real frameworks' spans do not show in the conformance
suite: an envelope that does not fit its row, envelope-shaped arguments from a scope no row names,
and the spans that are no execution. (What the frameworks do emit is in ``tests/conformance``.)"""

from __future__ import annotations

import json
from typing import Any

import pytest

from scoring.models.evidence import EXECUTIONS_NOT_RECORDED, CaptureState
from scoring.normalize.conventions import CONVENTIONS, shape_arguments
from scoring.normalize.spans import UNNAMED_TOOL, SpanRules, span_rules

GEN_AI = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t"}
OI = {"openinference.span.kind": "TOOL", "tool.name": "t"}


def rules(attrs: dict[str, Any], scope: str = "", span_name: str = "") -> SpanRules:
    return span_rules(attrs, status_error=False, ended=True, sampled=True, dropped=False, scope=scope,
                      span_name=span_name)


def oi_args(value: object, scope: str) -> SpanRules:
    return rules({**OI, "input.value": json.dumps(value)}, scope)


@pytest.mark.parametrize(
    ("value", "scope", "state", "arguments"),
    [
        # smolagents binds Tool.__call__(*args, sanitize_inputs_outputs, **kwargs)
        ({"args": [], "sanitize_inputs_outputs": True, "kwargs": {"a": 1}},
         "openinference.instrumentation.smolagents", CaptureState.CAPTURED, '{"a":1}'),
        # positional arguments: their parameter names were not recorded
        ({"args": ["x"], "kwargs": {}}, "openinference.instrumentation.smolagents", CaptureState.TRUNCATED, None),
        # a key the wrapper never writes: not that wrapper
        ({"kwargs": {"a": 1}, "other": 2}, "openinference.instrumentation.llama_index", CaptureState.TRUNCATED, None),
        ({"kwargs": {"a": 1}}, "openinference.instrumentation.llama_index", CaptureState.CAPTURED, '{"a":1}'),
        # a wrapper's shape from a scope no row names: maybe a wrapper, maybe the arguments
        ({"kwargs": {"a": 1}}, "my.tracer", CaptureState.TRUNCATED, None),
        ({"kwargs": {"a": 1}, "city": "Paris"}, "my.tracer", CaptureState.CAPTURED, None),
        ({"city": "Paris"}, "my.tracer", CaptureState.CAPTURED, None),
        # a bare value: the parameter's name is not recorded
        ("boom", "openinference.instrumentation.langchain", CaptureState.TRUNCATED, None),
        ([1, 2], "", CaptureState.TRUNCATED, None),
    ],
)
def test_arguments_are_matchable_only_in_a_shape_their_row_knows(
    value: object, scope: str, state: CaptureState, arguments: str | None
) -> None:
    r = oi_args(value, scope)
    assert r.arguments_state is state
    if arguments is not None:
        assert r.arguments == arguments


def test_a_wrapper_keeps_the_call_id_and_the_real_arguments() -> None:
    envelope = {"input_str": "{'city': 'Paris'}", "tags": [], "metadata": {}, "inputs": {"city": "Paris"},
                "kwargs": {"tool_call_id": "call_7"}}
    r = rules({**GEN_AI, "gen_ai.tool.call.arguments": json.dumps(envelope)}, "opentelemetry.instrumentation.langchain")
    assert (r.arguments, r.arguments_state, r.call_id) == ('{"city":"Paris"}', CaptureState.CAPTURED, "call_7")


def test_a_text_that_is_not_json_is_not_matchable_but_kept_for_the_canary_search() -> None:
    shaped = shape_arguments("send to tw-canary-0123", CONVENTIONS[0])
    assert (shaped.text, shaped.matchable) == ("send to tw-canary-0123", False)


@pytest.mark.parametrize(
    ("attrs", "scope", "span_name"),
    [
        ({**GEN_AI, "pydantic_ai.tool.failure_stage": "validation"}, "pydantic-ai", ""),
        ({**GEN_AI, "gen_ai.tool.name": "(merged tools)"}, "gcp.vertex.agent", ""),
        ({"openinference.span.kind": "TOOL", "input.value": "triage"}, "openinference.instrumentation.openai_agents",
         "handoff to worker"),
    ],
    ids=["rejected-by-validation", "aggregate-of-parallel-calls", "handoff"],
)
def test_spans_under_the_marker_that_are_no_execution(attrs: dict[str, Any], scope: str, span_name: str) -> None:
    r = rules(attrs, scope, span_name)
    assert r.name is None and UNNAMED_TOOL not in r.reasons


def test_an_unnamed_tool_span_elsewhere_still_makes_absence_unprovable() -> None:
    r = rules({"openinference.span.kind": "TOOL"}, "openinference.instrumentation.openai_agents", "get_weather")
    assert r.name is None and UNNAMED_TOOL in r.reasons


def test_a_placeholder_is_no_call_id() -> None:
    r = rules({**GEN_AI, "gen_ai.tool.call.id": "<not specified>"}, "gcp.vertex.agent")
    assert r.name == "t" and r.call_id is None
    assert rules({**GEN_AI, "gen_ai.tool.call.id": "<not specified>"}).call_id == "<not specified>"


def test_older_attribute_names_are_read_where_their_row_says() -> None:
    assert rules({**GEN_AI, "tool_arguments": '{"a": 1}'}, "pydantic-ai").arguments_state is CaptureState.CAPTURED
    legacy = {**GEN_AI, "gcp.vertex.agent.tool_call_args": '{"a": 1}'}
    assert rules(legacy, "gcp.vertex.agent").arguments == '{"a": 1}'
    assert rules(legacy, "another.scope").arguments is None  # not a key of the default row


def test_both_markers_on_one_span_read_openinference_arguments_where_genai_has_none() -> None:
    r = rules({**GEN_AI, **OI, "input.value": '{"a": 1}'}, "openinference.instrumentation.google_adk")
    assert (r.arguments, r.arguments_state) == ('{"a": 1}', CaptureState.CAPTURED)


def test_a_failure_the_framework_handled_is_read_from_its_tool_message() -> None:
    result = {"type": "tool", "data": {"content": "boom", "tool_call_id": "call_4", "status": "error"}}
    attrs = {**OI, "input.value": "boom", "output.value": json.dumps(result)}
    r = rules(attrs, "openinference.instrumentation.langchain")
    assert (r.failed, r.call_id) == (True, "call_4")


def test_an_instrumentation_that_misses_executions_makes_absence_unprovable_on_its_traces() -> None:
    chain = rules({"openinference.span.kind": "CHAIN"}, "openinference.instrumentation.crewai")
    assert chain.name is None and EXECUTIONS_NOT_RECORDED in chain.reasons
