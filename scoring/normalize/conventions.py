"""Which attributes carry a tool call, per instrumentation: the one table every decoder reads.

A span records a tool execution under one of two markers: GenAI semconv
(``gen_ai.operation.name == "execute_tool"``) or OpenInference (``openinference.span.kind ==
"TOOL"``). Which attributes then hold the tool's name, call id, arguments and result, which
wrapper (envelope) an instrumentation puts around the arguments, and which spans under the
marker are no execution at all, differ per instrumentation: a row of ``CONVENTIONS`` each,
found by the span's instrumentation scope name, with one default row per marker for scopes not
listed. ``scoring.normalize.spans.span_rules`` is the only reader; the streaming service's
fused decode calls it too, so a new framework is one row here plus a conformance scenario.

Arguments whose shape the row does not know (an envelope the row does not declare, a bare
value, a wrapper that does not fit) are kept as text for the canary search but are not
matchable: argument checks on them are UNDETERMINED, never FALSE.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Marker = Literal["gen_ai", "openinference"]


@dataclass(frozen=True, slots=True)
class Envelope:
    """A wrapper an instrumentation records around a call's arguments.

    The recorded JSON is an object whose keys are all in ``keys``; ``holds`` names the one whose
    value (an object) is the call's arguments. A key of ``must_be_empty`` holds arguments whose
    names were not recorded (positional ones): when it is not empty the arguments cannot be read.
    """

    holds: str
    keys: frozenset[str]
    must_be_empty: frozenset[str] = frozenset()
    #: where in the wrapper the call id is, when the instrumentation keeps it there
    call_id_path: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Convention:
    """How one instrumentation records a tool execution (one row of the table)."""

    #: the row's name, as the compatibility matrix lists it
    name: str
    marker: Marker
    #: instrumentation scope names this row is for; empty: the default row of its marker
    scopes: tuple[str, ...]
    tool_name: tuple[str, ...]
    call_id: tuple[str, ...]
    arguments: tuple[str, ...]
    result: tuple[str, ...]
    envelope: Envelope | None = None
    #: read when no ``arguments`` key is set: may be the tool's parameter *schema*, never matchable
    arguments_fallback: tuple[str, ...] = ()
    #: a path into the JSON result holding the call id (the framework's own tool message)
    call_id_in_result: tuple[str, ...] = ()
    #: a path into the JSON result and the value there that says the tool failed (a framework that
    #: handled the tool's exception ends the span without an error status)
    failed_in_result: tuple[tuple[str, ...], str] | None = None
    #: values written where no call id was known: not an id
    placeholder_call_ids: frozenset[str] = frozenset()
    #: (attribute, value) pairs that mark a span under the marker that is no execution (a call
    #: rejected before the tool body ran, an aggregate over other calls); value None: any value
    not_execution: tuple[tuple[str, str | None], ...] = ()
    #: a span under the marker with no tool name whose span name starts with this is no execution
    #: (e.g. a handoff between agents recorded as a tool span)
    unnamed_span_prefixes: tuple[str, ...] = ()
    #: why a trace this instrumentation wrote may hold executions it did not record (absence on
    #: it is then unprovable); empty: it records every execution
    misses_executions: str = ""
    #: why its records do not count executions one for one (counts and orders built on them are
    #: then unprovable); empty: one record per execution
    counts_unreliable: str = ""
    #: what the matrix says about the row (settings, limits)
    note: str = ""


_GEN_AI_NAME = ("gen_ai.tool.name",)
_GEN_AI_CALL_ID = ("gen_ai.tool.call.id",)
_GEN_AI_ARGUMENTS = ("gen_ai.tool.call.arguments",)
_GEN_AI_RESULT = ("gen_ai.tool.call.result",)
_OI_NAME = ("tool.name",)
_OI_CALL_ID = ("tool.id", "tool_call.id")
_OI_ARGUMENTS = ("input.value",)
_OI_RESULT = ("output.value",)
_OI_PARAMETERS = ("tool.parameters",)
#: ADK: no call id known (a call that raised); ``(merged tools)``: the aggregate of parallel calls
_ADK_PLACEHOLDERS = frozenset({"<not specified>"})
_ADK_MERGED = (("gen_ai.tool.name", "(merged tools)"),)

GEN_AI_DEFAULT = Convention(
    name="GenAI semantic conventions",
    marker="gen_ai",
    scopes=(),
    tool_name=_GEN_AI_NAME,
    call_id=_GEN_AI_CALL_ID,
    arguments=_GEN_AI_ARGUMENTS,
    result=_GEN_AI_RESULT,
)
OPENINFERENCE_DEFAULT = Convention(
    name="OpenInference",
    marker="openinference",
    scopes=(),
    tool_name=_OI_NAME,
    call_id=_OI_CALL_ID,
    arguments=_OI_ARGUMENTS,
    result=_OI_RESULT,
    arguments_fallback=_OI_PARAMETERS,
)

CONVENTIONS: tuple[Convention, ...] = (
    GEN_AI_DEFAULT,
    OPENINFERENCE_DEFAULT,
    Convention(
        name="pydantic-ai (native)",
        marker="gen_ai",
        scopes=("pydantic-ai",),
        tool_name=_GEN_AI_NAME,
        call_id=_GEN_AI_CALL_ID,
        # instrumentation version 2 wrote ``tool_arguments`` / ``tool_response``
        arguments=(*_GEN_AI_ARGUMENTS, "tool_arguments"),
        result=(*_GEN_AI_RESULT, "tool_response"),
        not_execution=(("pydantic_ai.tool.failure_stage", "validation"),),
        note="a tool whose only parameter is an object type takes that object's fields as its arguments: "
        "match `$.city`, not `$.trip.city`",
    ),
    Convention(
        name="Google ADK (native)",
        marker="gen_ai",
        scopes=("gcp.vertex.agent",),
        tool_name=_GEN_AI_NAME,
        call_id=_GEN_AI_CALL_ID,
        # the legacy schema (ADK_TELEMETRY_SCHEMA_VERSION_OPT_IN=1) writes ``gcp.vertex.agent.*``
        arguments=(*_GEN_AI_ARGUMENTS, "gcp.vertex.agent.tool_call_args"),
        result=(*_GEN_AI_RESULT, "gcp.vertex.agent.tool_response"),
        placeholder_call_ids=_ADK_PLACEHOLDERS,
        not_execution=_ADK_MERGED,
        note="arguments only with content capture: OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY "
        "(or SPAN_AND_EVENT); the legacy schema captures them by default",
    ),
    Convention(
        name="Google ADK + OpenInference (GenAI side)",
        marker="gen_ai",
        scopes=("openinference.instrumentation.google_adk",),
        tool_name=_GEN_AI_NAME,
        call_id=_GEN_AI_CALL_ID,
        arguments=_GEN_AI_ARGUMENTS,
        result=_GEN_AI_RESULT,
        placeholder_call_ids=_ADK_PLACEHOLDERS,
        not_execution=_ADK_MERGED,
    ),
    Convention(
        name="Google ADK + OpenInference",
        marker="openinference",
        scopes=("openinference.instrumentation.google_adk",),
        tool_name=_OI_NAME,
        call_id=_OI_CALL_ID,
        arguments=_OI_ARGUMENTS,
        result=_OI_RESULT,
        placeholder_call_ids=_ADK_PLACEHOLDERS,
        not_execution=(("tool.name", "(merged tools)"),),
    ),
    Convention(
        name="OpenLLMetry LangChain",
        marker="gen_ai",
        scopes=("opentelemetry.instrumentation.langchain",),
        tool_name=_GEN_AI_NAME,
        call_id=_GEN_AI_CALL_ID,
        arguments=_GEN_AI_ARGUMENTS,
        result=_GEN_AI_RESULT,
        # LangChain's on_tool_start: the tool input as text, the run's tags and metadata, the
        # input as an object, and the callback's keyword arguments (the call id among them)
        envelope=Envelope(
            holds="inputs",
            keys=frozenset({"input_str", "tags", "metadata", "inputs", "kwargs"}),
            call_id_path=("kwargs", "tool_call_id"),
        ),
        failed_in_result=(("output", "kwargs", "status"), "error"),
        note="arguments need TRACELOOP_TRACE_CONTENT=true (the default)",
    ),
    Convention(
        name="OpenInference LangChain",
        marker="openinference",
        scopes=("openinference.instrumentation.langchain",),
        tool_name=_OI_NAME,
        call_id=_OI_CALL_ID,
        arguments=_OI_ARGUMENTS,
        result=_OI_RESULT,
        # the ToolMessage the tool call produced: its tool_call_id is the call's; its status says
        # whether the tool failed (a tool with handle_tool_error ends its span without an error)
        call_id_in_result=("data", "tool_call_id"),
        failed_in_result=(("data", "status"), "error"),
        note="a tool with one string parameter is recorded as the bare value, without the parameter's name: "
        "its arguments are not matchable",
    ),
    Convention(
        name="OpenInference smolagents",
        marker="openinference",
        scopes=("openinference.instrumentation.smolagents",),
        tool_name=_OI_NAME,
        call_id=_OI_CALL_ID,
        arguments=_OI_ARGUMENTS,
        result=_OI_RESULT,
        # Tool.__call__(*args, sanitize_inputs_outputs, **kwargs) as bound
        envelope=Envelope(
            holds="kwargs",
            keys=frozenset({"args", "kwargs", "sanitize_inputs_outputs"}),
            must_be_empty=frozenset({"args"}),
        ),
    ),
    Convention(
        name="OpenInference LlamaIndex",
        marker="openinference",
        scopes=("openinference.instrumentation.llama_index",),
        tool_name=_OI_NAME,
        call_id=_OI_CALL_ID,
        arguments=_OI_ARGUMENTS,
        result=_OI_RESULT,
        envelope=Envelope(holds="kwargs", keys=frozenset({"args", "kwargs"}), must_be_empty=frozenset({"args"})),
    ),
    Convention(
        name="OpenInference OpenAI Agents",
        marker="openinference",
        scopes=("openinference.instrumentation.openai_agents",),
        tool_name=_OI_NAME,
        call_id=_OI_CALL_ID,
        arguments=_OI_ARGUMENTS,
        result=_OI_RESULT,
        arguments_fallback=_OI_PARAMETERS,
        unnamed_span_prefixes=("handoff to ",),
    ),
    Convention(
        name="OpenInference CrewAI (wrappers)",
        marker="openinference",
        scopes=("openinference.instrumentation.crewai",),
        tool_name=_OI_NAME,
        call_id=_OI_CALL_ID,
        arguments=_OI_ARGUMENTS,
        result=_OI_RESULT,
        misses_executions="CrewAI's text (ReAct) tool path runs tools without the wrapped BaseTool.run: "
        "CrewAIInstrumentor(use_event_listener=True) records it",
    ),
    Convention(
        name="OpenInference CrewAI (event listener)",
        marker="openinference",
        scopes=("openinference.instrumentation.crewai._event_listener",),
        tool_name=_OI_NAME,
        call_id=_OI_CALL_ID,
        arguments=_OI_ARGUMENTS,
        result=_OI_RESULT,
        counts_unreliable="a tool-usage event stands for up to two runs of the tool body (CrewAI retries "
        "with unfiltered arguments), and a cached result is reported as a usage although the body did not run",
    ),
)

_BY_SCOPE: dict[tuple[Marker, str], Convention] = {(c.marker, s): c for c in CONVENTIONS for s in c.scopes}
_DEFAULTS: dict[Marker, Convention] = {"gen_ai": GEN_AI_DEFAULT, "openinference": OPENINFERENCE_DEFAULT}
_BY_NAME: dict[str, Convention] = {s: c for c in CONVENTIONS for s in c.scopes}

#: every envelope the table knows: a default row's JSON object shaped like one of them is ambiguous
ENVELOPES: tuple[Envelope, ...] = tuple(c.envelope for c in CONVENTIONS if c.envelope is not None)
#: every attribute a row reads for a span fact (what the decoders must convert of a span): results
#: only where a row finds the call id in them (a span fact does not keep results)
ATTRIBUTE_KEYS: frozenset[str] = frozenset(
    k
    for c in CONVENTIONS
    for k in (
        *c.tool_name,
        *c.call_id,
        *c.arguments,
        *c.arguments_fallback,
        *(a for a, _ in c.not_execution),
        *(c.result if c.call_id_in_result or c.failed_in_result else ()),
    )
)


def convention(marker: Marker, scope: str) -> Convention:
    """The row for spans of instrumentation scope ``scope`` under ``marker``."""
    return _BY_SCOPE.get((marker, scope)) or _DEFAULTS[marker]


def misses_executions(scope: str) -> str:
    """Why spans of this scope may leave executions unrecorded (empty: they do not)."""
    row = _BY_NAME.get(scope)
    return row.misses_executions if row is not None else ""


def counts_unreliable(recorder: str | None) -> str:
    """Why this recorder's records do not count executions one for one (empty: they do)."""
    row = _BY_NAME.get(recorder) if recorder else None
    return row.counts_unreliable if row is not None else ""


@dataclass(slots=True)
class ShapedArguments:
    """Recorded arguments read by a row: the text to keep, whether it is the call's arguments
    object (matchable), and the call id found inside it, if any."""

    text: str
    matchable: bool
    call_id: str | None = None


class _DuplicateKeyError(ValueError):
    pass


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _DuplicateKeyError
    return out


def _object(text: str) -> dict[str, Any] | None:
    """``text`` as a JSON object, or None (not JSON, not an object, a key twice, nested too deep)."""
    try:
        doc = json.loads(text, object_pairs_hook=_unique)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _at(doc: Any, path: tuple[str, ...]) -> str | None:
    for key in path:
        if not isinstance(doc, Mapping):
            return None
        doc = doc.get(key)
    return doc if isinstance(doc, str) and doc else None


def _fits(doc: Mapping[str, Any], env: Envelope) -> bool:
    return (
        env.holds in doc
        and isinstance(doc[env.holds], dict)
        and all(k in env.keys for k in doc)
        and not any(doc.get(k) for k in env.must_be_empty)
    )


#: the keys an envelope's ``holds`` may be: a default row's object that has one of them is parsed
_ENVELOPE_HINTS = tuple(f'"{e.holds}"' for e in ENVELOPES)
#: arguments nested deeper than this are not matchable: the judges read parsed arguments, and a
#: model fits 500 levels of brackets in 1 KB (no tool's real arguments come near 64)
MAX_ARGUMENT_DEPTH = 64
#: a JSON string, whose brackets are no nesting
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def too_deep(text: str) -> bool:
    """Whether JSON text nests objects and arrays deeper than ``MAX_ARGUMENT_DEPTH`` (counted
    without recursion; text that is not JSON is counted the same way)."""
    if text.count("{") + text.count("[") <= MAX_ARGUMENT_DEPTH:
        return False  # the common case, at C speed
    depth = 0
    for ch in _JSON_STRING.sub("", text):
        if ch in "{[":
            depth += 1
            if depth > MAX_ARGUMENT_DEPTH:
                return True
        elif ch in "}]":
            depth -= 1
    return False


def shape_arguments(text: str, row: Convention) -> ShapedArguments:
    """What ``text`` (recorded under ``row``) says of the call's arguments.

    A row with an envelope: the wrapper must fit it, and its ``holds`` object is the arguments.
    A row without: the text must be a JSON object, and not one shaped like a known envelope (it
    might be one another instrumentation wrote: ambiguous). Anything else, and anything nested
    deeper than ``MAX_ARGUMENT_DEPTH``, is not matchable.
    """
    env = row.envelope
    if too_deep(text):
        return ShapedArguments(text, False)
    if env is None:
        head = text.lstrip()[:1]
        if head != "{":
            return ShapedArguments(text, False)  # a bare value: the parameter's name is not recorded
        if not any(h in text for h in _ENVELOPE_HINTS):
            return ShapedArguments(text, True)  # the common case, without parsing
        doc = _object(text)
        if doc is not None and any(_fits(doc, e) for e in ENVELOPES):
            return ShapedArguments(text, False)
        return ShapedArguments(text, True)
    doc = _object(text)
    if doc is None or not _fits(doc, env):
        return ShapedArguments(text, False)
    inner = json.dumps(doc[env.holds], ensure_ascii=False, separators=(",", ":"))
    return ShapedArguments(inner, True, _at(doc, env.call_id_path) if env.call_id_path else None)


def read_result(result: str | None, row: Convention) -> tuple[str | None, bool]:
    """The call id a row finds in the recorded result, and whether the result says the tool failed."""
    if not (row.call_id_in_result or row.failed_in_result) or not result or not result.lstrip().startswith("{"):
        return None, False
    doc = _object(result)
    call_id = _at(doc, row.call_id_in_result) if row.call_id_in_result else None
    failed = row.failed_in_result is not None and _at(doc, row.failed_in_result[0]) == row.failed_in_result[1]
    return call_id, failed
