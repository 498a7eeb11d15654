"""Neutral spans and the rules that turn one span into a tool execution plus coverage reasons.

A tool execution is a span that is either
- GenAI semconv: ``gen_ai.operation.name == "execute_tool"``, or
- OpenInference: ``openinference.span.kind == "TOOL"``,
with its name, call id, arguments and result where ``scoring.normalize.conventions`` says the
instrumentation that wrote it keeps them. Both markers naming different tools is *conflicting*
evidence: a coverage reason, never a crash and never an execution. Chat spans that merely
*request* a call are not evidence. Names match exactly.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, NamedTuple, cast

from scoring.models.evidence import (
    ATTRIBUTE_LIMITS,
    ATTRIBUTES_DROPPED,
    CONFLICTING_EVIDENCE,
    EXECUTIONS_NOT_RECORDED,
    SPAN_NOT_ENDED,
    SPAN_UNSAMPLED,
    CaptureState,
    ToolExecution,
)
from scoring.normalize import conventions
from scoring.normalize.conventions import Convention

if TYPE_CHECKING:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import Span as OtlpSpan
    from opentelemetry.proto.trace.v1.trace_pb2 import TracesData
    from opentelemetry.sdk.trace import ReadableSpan

AttrValue = str | bool | int | float | Sequence[str] | Sequence[bool] | Sequence[int] | Sequence[float] | None

UNNAMED_TOOL = "unnamed_tool_execution"
TRUNCATED_FLAG = "toolwitness.tool.call.arguments.truncated"
#: set (true) by an exporter whose SDK recorded the span under a finite or unknown attribute-length
#: limit (``KafkaSpanExporter``): any attribute, the tool name included, may be cut.
LENGTH_LIMITED_FLAG = "toolwitness.attribute_length_limited"

GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_ARGUMENTS = "gen_ai.tool.call.arguments"
GEN_AI_RESULT = "gen_ai.tool.call.result"
OI_KIND = "openinference.span.kind"
OI_TOOL_NAME = "tool.name"
OI_CALL_IDS = ("tool.id", "tool_call.id")
#: On a TOOL span ``input.value`` is the call's input. OpenInference defines ``tool.parameters`` as
#: the tool's parameter *definition* (``{"a": "int"}``); DESIGN §1 lists it as an arguments source,
#: so it is read only when the span has no ``input.value``, and never as fully captured arguments
#: (it may be a schema): argument checks on it are UNDETERMINED, a canary found in it still counts.
OI_INPUT = "input.value"
OI_PARAMETERS = "tool.parameters"
OI_ARGUMENTS = (OI_INPUT, OI_PARAMETERS)
#: what OpenInference writes for a hidden input (``OPENINFERENCE_HIDE_INPUTS``): not the input
OI_REDACTED = "__REDACTED__"
OI_RESULT = "output.value"
SESSION_KEYS = ("gen_ai.conversation.id", "session.id")
ERROR_TYPE = "error.type"
#: set by the tool boundary on a tool span whose result it poisoned: the canary it delivered
POISONING_CANARY = "toolwitness.poisoning.canary"
#: a longer value is no canary this project writes (``tw-canary-`` + 20 hex): no delivery on record
MAX_CANARY_CHARS = 128
#: every attribute ``span_rules`` reads for a span fact (the conventions table's, which leaves out
#: results it does not read a call id from), plus the session keys: all a span fact depends on
#: (``fact_attributes`` reads only these).
FACT_KEYS = frozenset(
    {GEN_AI_OPERATION, OI_KIND, ERROR_TYPE, TRUNCATED_FLAG, LENGTH_LIMITED_FLAG, POISONING_CANARY, *SESSION_KEYS}
    | conventions.ATTRIBUTE_KEYS
)

# OTLP Span.flags bits (opentelemetry-proto trace.proto SpanFlags).
_FLAG_SAMPLED = 0x01
_FLAG_HAS_IS_REMOTE = 0x100
_FLAG_IS_REMOTE = 0x200


@dataclass(slots=True)
class NeutralSpan:
    """What scoring needs of a span, independent of where it came from."""

    trace_id: str
    span_id: str
    name: str = ""
    parent_span_id: str | None = None
    parent_is_remote: bool = False
    start_time_unix_nano: int = 0
    end_time_unix_nano: int | None = None
    sampled: bool = True
    status_code: Literal["unset", "ok", "error"] = "unset"
    attributes: Mapping[str, AttrValue] = field(default_factory=dict)
    resource_attributes: Mapping[str, AttrValue] = field(default_factory=dict)
    dropped_attributes_count: int = 0
    #: the instrumentation scope (tracer) name that wrote the span
    scope_name: str = ""

    @property
    def ended(self) -> bool:
        return self.end_time_unix_nano is not None and self.end_time_unix_nano > 0

    def session_id(self) -> str | None:
        return session_of(self.attributes, self.resource_attributes)


def session_of(attributes: Mapping[str, AttrValue], resource_attributes: Mapping[str, AttrValue]) -> str | None:
    """A span's session id: the first non-empty string of SESSION_KEYS, span attributes first."""
    for source in (attributes, resource_attributes):
        for key in SESSION_KEYS:
            v = source.get(key)
            if isinstance(v, str) and v:
                return v
    return None


@dataclass(frozen=True, slots=True)
class SpanFacts:
    """Normalized facts about one span."""

    execution: ToolExecution | None
    reasons: frozenset[str]
    result: str | None = None


def _str(v: AttrValue) -> str | None:
    if v is None:
        return None
    if isinstance(v, str):
        return v
    if isinstance(v, bool | int | float):
        return json.dumps(v)
    return json.dumps(list(v))


def _first(attrs: Mapping[str, AttrValue], keys: Sequence[str]) -> str | None:
    for k in keys:
        s = _str(attrs.get(k))
        if s:
            return s
    return None


class SpanRules(NamedTuple):
    """What the normalization rules make of one span, without building a model.

    ``name`` is None when the span is not a tool execution (then only ``reasons`` matter).
    """

    name: str | None
    call_id: str | None
    arguments: str | None
    result: str | None
    arguments_state: CaptureState
    convention: Literal["gen_ai", "openinference"]
    #: True: the tool failed; False: it did not; None: not known (attributes were dropped, so an
    #: ``error.type`` may be among them)
    failed: bool | None
    #: coverage reasons, sorted, each once
    reasons: tuple[str, ...]
    #: the poisoning canary the tool's result delivered (``POISONING_CANARY``), if any
    delivered: str | None = None
    #: the instrumentation scope that recorded it (None: not known)
    recorder: str | None = None


_NOT_A_TOOL = SpanRules(None, None, None, None, CaptureState.ABSENT, "gen_ai", False, (), None, None)
_ABSENT, _TRUNCATED, _CAPTURED = CaptureState.ABSENT, CaptureState.TRUNCATED, CaptureState.CAPTURED
#: ``_new_rules(SpanRules, (all fields in order))``: a SpanRules at half the cost of its
#: keyword-capable constructor (the one per tool execution on the hot path)
_new_rules = tuple.__new__


def _no_tool(reasons: list[str]) -> SpanRules:
    return _NOT_A_TOOL._replace(reasons=tuple(sorted(set(reasons)))) if reasons else _NOT_A_TOOL


def _rejected(attrs: Mapping[str, AttrValue], row: Convention) -> bool:
    return any(attrs.get(k) == v if v is not None else k in attrs for k, v in row.not_execution)


def _call_id(attrs: Mapping[str, AttrValue], row: Convention) -> str | None:
    for k in row.call_id:
        v = _str(attrs.get(k))
        if v and v not in row.placeholder_call_ids:
            return v
    return None


def _arguments(attrs: Mapping[str, AttrValue], row: Convention) -> tuple[str | None, bool]:
    """The recorded arguments under ``row`` and whether they may be a schema, not the call's."""
    for k in row.arguments:
        v = _str(attrs.get(k))
        if v and v != OI_REDACTED:  # OpenInference's hidden input is not the input
            return v, False
        if v == OI_REDACTED:
            return None, False
    fallback = _first(attrs, row.arguments_fallback)
    return fallback, fallback is not None


def span_rules(
    attrs: Mapping[str, AttrValue],
    *,
    status_error: bool,
    ended: bool,
    sampled: bool,
    dropped: bool,
    scope: str = "",
    span_name: str = "",
) -> SpanRules:
    """THE normalization rules: one span's attributes and flags → tool execution facts + reasons.

    ``dropped``: the span says attributes were dropped (``dropped_attributes_count > 0``).
    ``scope``: the instrumentation scope that wrote the span; with ``span_name`` it picks the
    row of ``scoring.normalize.conventions`` that says where the call's facts are.
    Reads only FACT_KEYS of ``attrs``.
    """
    reasons: list[str] = []
    if not sampled:
        reasons.append(SPAN_UNSAMPLED)
    if not ended:
        reasons.append(SPAN_NOT_ENDED)
    if dropped:
        reasons.append(ATTRIBUTES_DROPPED)
    if scope and conventions.misses_executions(scope):
        reasons.append(EXECUTIONS_NOT_RECORDED)
    if attrs.get(LENGTH_LIMITED_FLAG) is True:
        # Any attribute may be cut: "execute_tool" itself (any span may hide a tool execution) and
        # the tool name ("search_items_v2" recorded as "search_items" proves neither tool ran).
        reasons.append(ATTRIBUTE_LIMITS)
        return _no_tool(reasons)
    is_gen_ai = attrs.get(GEN_AI_OPERATION) == "execute_tool"
    is_oi = attrs.get(OI_KIND) == "TOOL"
    if not (is_gen_ai or is_oi):
        return _no_tool(reasons)
    gen_row = conventions.convention("gen_ai", scope) if is_gen_ai else None
    oi_row = conventions.convention("openinference", scope) if is_oi else None
    if (gen_row is not None and _rejected(attrs, gen_row)) or (oi_row is not None and _rejected(attrs, oi_row)):
        return _no_tool(reasons)  # rejected before the tool ran, or an aggregate of other calls
    gen_name = _first(attrs, gen_row.tool_name) if gen_row is not None else None
    oi_name = _first(attrs, oi_row.tool_name) if oi_row is not None else None
    if gen_row is not None and oi_row is not None and gen_name != oi_name:
        reasons.append(CONFLICTING_EVIDENCE)
        return _no_tool(reasons)
    name = gen_name if gen_row is not None else oi_name
    row = gen_row or oi_row
    assert row is not None
    if not name:
        if any(span_name.startswith(p) for p in row.unnamed_span_prefixes):
            return _no_tool(reasons)  # e.g. a handoff between agents: no tool ran
        # Some tool ran and we cannot say which: absence of any tool is unprovable.
        reasons.append(UNNAMED_TOOL)
        return _no_tool(reasons)
    call_id = _call_id(attrs, row)
    arguments, partial = _arguments(attrs, row)
    result = _first(attrs, row.result)
    shaped_row = row
    if arguments is None and gen_row is not None and oi_row is not None:
        # Both conventions on one span: where GenAI's record has no arguments, OpenInference's may.
        arguments, partial = _arguments(attrs, oi_row)
        shaped_row = oi_row
    if call_id is None and oi_row is not None and gen_row is not None:
        call_id = _call_id(attrs, oi_row)
    matchable = True
    if arguments is not None and not partial:
        shaped = conventions.shape_arguments(arguments, shaped_row)
        arguments, matchable = shaped.text, shaped.matchable
        call_id = call_id or shaped.call_id
    result_call_id, failed_in_result = conventions.read_result(result, row)
    call_id = call_id or result_call_id
    failed: bool | None = (
        True if status_error or attrs.get(ERROR_TYPE) or failed_in_result else (None if dropped else False)
    )
    # Both conventions on one span, naming the same tool: GenAI's record is the one kept, but where
    # OpenInference's says another call id or other arguments the span disagrees with itself
    # (conflicting evidence): the call still proves the tool ran, its arguments prove nothing either
    # way (judged as cut), and absence on the trace is unprovable.
    disputed = gen_row is not None and oi_row is not None and _disagree(call_id, arguments, attrs, oi_row)
    if disputed:
        reasons.append(CONFLICTING_EVIDENCE)
    if arguments is None:
        arg_state = _ABSENT
    elif partial or not matchable or disputed or attrs.get(TRUNCATED_FLAG) is True or dropped:
        arg_state = _TRUNCATED
    else:
        arg_state = _CAPTURED
    return _new_rules(
        SpanRules,
        (
            name,
            call_id,
            arguments,
            result,
            arg_state,
            "gen_ai" if gen_row is not None else "openinference",
            failed,
            tuple(sorted(set(reasons))) if reasons else (),
            _canary(attrs.get(POISONING_CANARY)),
            scope or None,
        ),
    )


def _disagree(call_id: str | None, arguments: str | None, attrs: Mapping[str, AttrValue], oi_row: Convention) -> bool:
    """Whether a span's OpenInference record of a call contradicts its GenAI record (``call_id``,
    ``arguments``): another call id, or other arguments (JSON compared as values, so key order and
    spacing are no disagreement). What one of them leaves out is no contradiction; a parameter
    definition (``tool.parameters``) is not the call's arguments."""
    oi_call = _call_id(attrs, oi_row)
    if call_id and oi_call and call_id != oi_call:
        return True
    oi_args, partial = _arguments(attrs, oi_row)
    if partial or not arguments or not oi_args or oi_args == arguments:
        return False
    oi_args = conventions.shape_arguments(oi_args, oi_row).text
    try:
        return bool(json.loads(arguments) != json.loads(oi_args))
    except (ValueError, RecursionError):
        return oi_args != arguments  # not both JSON: the same text or not


def _canary(v: AttrValue) -> str | None:
    """The delivered canary of a span, when it can be one (an agent writes its own attributes:
    an unbounded value would be kept in the state and in every observation)."""
    return v if isinstance(v, str) and 0 < len(v) <= MAX_CANARY_CHARS else None


def normalize_span(span: NeutralSpan) -> SpanFacts:
    """Turn one neutral span into (tool execution | None, coverage reasons)."""
    r = span_rules(
        span.attributes,
        status_error=span.status_code == "error",
        ended=span.ended,
        sampled=span.sampled,
        dropped=span.dropped_attributes_count > 0,
        scope=span.scope_name,
        span_name=span.name,
    )
    if r.name is None:
        return SpanFacts(None, frozenset(r.reasons))
    execution = ToolExecution(
        name=r.name,
        trace_id=span.trace_id,
        span_id=span.span_id,
        call_id=r.call_id,
        status="error" if r.failed else ("unset" if r.failed is None else "ok"),
        start_time_unix_nano=span.start_time_unix_nano,
        end_time_unix_nano=span.end_time_unix_nano or 0,
        arguments=r.arguments,
        arguments_state=r.arguments_state,
        convention=r.convention,
        delivered_canary=r.delivered,
        recorder=r.recorder,
    )
    return SpanFacts(execution, frozenset(r.reasons), r.result)


# --- adapters ---------------------------------------------------------------------------------------


def from_readable_span(span: ReadableSpan) -> NeutralSpan:
    """Build a neutral span from an OpenTelemetry SDK ``ReadableSpan``."""
    ctx = span.get_span_context()
    if ctx is None:
        raise ValueError(f"span {span.name!r} has no span context")
    parent = span.parent
    code = span.status.status_code.name.lower()
    resource = span.resource.attributes if span.resource is not None else {}
    return NeutralSpan(
        trace_id=f"{ctx.trace_id:032x}",
        span_id=f"{ctx.span_id:016x}",
        name=span.name,
        parent_span_id=f"{parent.span_id:016x}" if parent is not None else None,
        parent_is_remote=bool(parent is not None and parent.is_remote),
        start_time_unix_nano=span.start_time or 0,
        end_time_unix_nano=span.end_time,
        sampled=ctx.trace_flags.sampled,
        status_code="error" if code == "error" else ("ok" if code == "ok" else "unset"),
        attributes=cast("dict[str, AttrValue]", dict(span.attributes or {})),
        resource_attributes=cast("dict[str, AttrValue]", dict(resource)),
        dropped_attributes_count=span.dropped_attributes,
        scope_name=span.instrumentation_scope.name if span.instrumentation_scope is not None else "",
    )


class SpanDecodeError(ValueError):
    """An OTLP span that cannot be read (wrong id lengths, …). ``retriable`` is False."""

    retriable = False


def _any_value(v: AnyValue) -> AttrValue:
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return v.string_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "int_value":
        return v.int_value
    if kind == "double_value":
        return v.double_value
    if kind == "array_value":
        out = [_any_value(x) for x in v.array_value.values]
        if all(isinstance(x, str) for x in out):
            return [str(x) for x in out]
        return json.dumps(out, default=str)
    if kind == "kvlist_value":
        return json.dumps({kv.key: _any_value(kv.value) for kv in v.kvlist_value.values}, default=str)
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return None


def otlp_attributes(kvs: Sequence[KeyValue]) -> dict[str, AttrValue]:
    # The hot path of every consumed span: strings and ints (most GenAI attributes) inline,
    # everything else through _any_value. A repeated key keeps its last value, as before.
    out: dict[str, AttrValue] = {}
    for kv in kvs:
        v = kv.value
        kind = v.WhichOneof("value")
        if kind == "string_value":
            out[kv.key] = v.string_value
        elif kind == "int_value":
            out[kv.key] = v.int_value
        else:
            out[kv.key] = _any_value(v)
    return out


def fact_attributes(kvs: Sequence[KeyValue], keys: frozenset[str] = FACT_KEYS) -> dict[str, AttrValue]:
    """Only the attributes named in ``keys``, converted as ``otlp_attributes`` does (a repeated
    key keeps its last value): what a span fact needs, without converting the rest."""
    out: dict[str, AttrValue] = {}
    # A slice, not the container itself: iterating an upb repeated field ends in a formatted
    # IndexError (about a third of the cost of a 5-attribute loop).
    for kv in kvs[:]:
        k = kv.key
        if k in keys:
            v = kv.value
            text = v.string_value  # non-empty only if the value is a string
            out[k] = text if text else _any_value(v)
    return out


_ZERO_TRACE_ID = bytes(16)
_ZERO_SPAN_ID = bytes(8)


def check_otlp_ids(trace_id: bytes, span_id: bytes, parent: bytes) -> None:
    """Raise SpanDecodeError unless the ids of an OTLP span are usable."""
    if len(trace_id) != 16 or trace_id == _ZERO_TRACE_ID:
        raise SpanDecodeError(f"trace_id must be 16 non-zero bytes, got {len(trace_id)} bytes")
    if len(span_id) != 8 or span_id == _ZERO_SPAN_ID:
        raise SpanDecodeError(f"span_id must be 8 non-zero bytes, got {len(span_id)} bytes")
    if parent and len(parent) != 8:
        raise SpanDecodeError(f"parent_span_id must be 8 bytes, got {len(parent)} bytes")


#: the latest span time accepted, in ns since the epoch: int64 (the year 2262). OTLP's field is
#: fixed64; a time beyond int64 is no real clock's, and cannot be carried through the state.
MAX_TIME_UNIX_NANO = 2**63 - 1


def check_otlp_times(start: int, end: int) -> None:
    """Raise SpanDecodeError if a span time lies beyond ``MAX_TIME_UNIX_NANO``."""
    if start > MAX_TIME_UNIX_NANO or end > MAX_TIME_UNIX_NANO:
        raise SpanDecodeError(f"span time beyond int64 nanoseconds (the year 2262): start {start}, end {end}")


@functools.lru_cache(maxsize=256)  # a handful of distinct values in practice
def otlp_flags(flags: int) -> tuple[bool, bool]:
    """(sampled, parent is remote) from OTLP ``Span.flags``."""
    # Bits 0-7 carry the W3C trace flags when the exporter fills them (many leave them 0):
    # only a filled-in byte with the sampled bit clear says "unsampled".
    return (
        not (flags & 0xFF and not flags & _FLAG_SAMPLED),
        bool(flags & _FLAG_HAS_IS_REMOTE and flags & _FLAG_IS_REMOTE),
    )


def from_otlp_span(
    span: OtlpSpan, resource_attributes: Mapping[str, AttrValue] | None = None, scope_name: str = ""
) -> NeutralSpan:
    """Build a neutral span from an OTLP protobuf ``Span``; raise SpanDecodeError on bad ids."""
    # Each protobuf field read builds a new Python object: read every id once.
    trace_id = span.trace_id
    span_id = span.span_id
    parent = span.parent_span_id
    check_otlp_ids(trace_id, span_id, parent)
    check_otlp_times(span.start_time_unix_nano, span.end_time_unix_nano)
    sampled, parent_is_remote = otlp_flags(span.flags)
    code = span.status.code  # 0 unset, 1 ok, 2 error
    return NeutralSpan(
        trace_id=trace_id.hex(),
        span_id=span_id.hex(),
        name=span.name,
        parent_span_id=parent.hex() if parent else None,
        parent_is_remote=parent_is_remote,
        start_time_unix_nano=span.start_time_unix_nano,
        end_time_unix_nano=span.end_time_unix_nano or None,
        sampled=sampled,
        status_code="error" if code == 2 else ("ok" if code == 1 else "unset"),
        attributes=otlp_attributes(span.attributes),
        resource_attributes=resource_attributes or {},
        dropped_attributes_count=span.dropped_attributes_count,
        scope_name=scope_name,
    )


def iter_otlp_request(data: TracesData) -> Iterator[NeutralSpan]:
    """Every span of an OTLP ``TracesData`` / ``ExportTraceServiceRequest`` as neutral spans."""
    for rs in data.resource_spans:
        resource = otlp_attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            scope = ss.scope.name
            for s in ss.spans:
                yield from_otlp_span(s, resource, scope)
