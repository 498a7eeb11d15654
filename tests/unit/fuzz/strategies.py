"""Hypothesis strategies for hostile input: OTLP records (protobuf and JSON), attribute values,
control messages. Everything an agent (spans) or a broken control plane (control) could send."""

from __future__ import annotations

import base64
import json
from typing import Any, cast

from google.protobuf import json_format
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from collector.wire.gen import common_pb2, control_pb2
from scoring.normalize.conventions import CONVENTIONS

UINT32 = st.integers(min_value=0, max_value=2**32 - 1)
UINT64 = st.integers(min_value=0, max_value=2**64 - 1)
INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)

#: keys the normalizer, the tenant mapping and the completion logic look at, plus keys an
#: agent might use to try to steer its verdict.
INTERESTING_KEYS = (
    "gen_ai.operation.name", "gen_ai.tool.name", "gen_ai.tool.call.id", "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result", "gen_ai.conversation.id", "session.id", "openinference.span.kind", "tool.name",
    "tool.id", "tool_call.id", "tool.parameters", "input.value", "output.value", "error.type",
    "toolwitness.tool.call.arguments.truncated", "toolwitness.tenant", "toolwitness.expectation",
    "toolwitness.completion", "toolwitness.span_count", "service.name",
)
INTERESTING_STRINGS = ("execute_tool", "TOOL", "chat", "search", "delete_db", "", "true", "default", "acme")

keys = st.one_of(st.sampled_from(INTERESTING_KEYS), st.text(max_size=40))
strings = st.one_of(st.sampled_from(INTERESTING_STRINGS), st.text(max_size=60))
_bad_ids = st.one_of(st.binary(min_size=0, max_size=20), st.just(bytes(16)), st.just(bytes(8)))
#: mostly well-formed (so that decoding goes deep), sometimes not
trace_ids = st.one_of(st.binary(min_size=16, max_size=16), st.binary(min_size=16, max_size=16), _bad_ids)
span_ids = st.one_of(st.binary(min_size=8, max_size=8), st.binary(min_size=8, max_size=8), _bad_ids)


# --- OTLP AnyValue / attributes --------------------------------------------------------------------


def _leaf_any_values() -> st.SearchStrategy[AnyValue]:
    return st.one_of(
        strings.map(lambda s: AnyValue(string_value=s)),
        st.booleans().map(lambda b: AnyValue(bool_value=b)),
        INT64.map(lambda i: AnyValue(int_value=i)),
        st.floats(allow_nan=True, allow_infinity=True).map(lambda f: AnyValue(double_value=f)),
        st.binary(max_size=24).map(lambda b: AnyValue(bytes_value=b)),
        st.just(AnyValue()),  # no value set at all
    )


def _array(values: list[AnyValue]) -> AnyValue:
    return AnyValue(array_value=ArrayValue(values=values))


def _kvlist(pairs: list[tuple[str, AnyValue]]) -> AnyValue:
    return AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key=k, value=v) for k, v in pairs]))


any_values: st.SearchStrategy[AnyValue] = st.recursive(
    _leaf_any_values(),
    lambda kids: st.one_of(
        st.lists(kids, max_size=4).map(_array),
        st.lists(st.tuples(keys, kids), max_size=4).map(_kvlist),
    ),
    max_leaves=10,
)


TABLE_SCOPES = sorted({scope for row in CONVENTIONS for scope in row.scopes})


def key_values(max_size: int = 8) -> st.SearchStrategy[list[KeyValue]]:
    return st.lists(st.builds(lambda k, v: KeyValue(key=k, value=v), keys, any_values), max_size=max_size)


# --- OTLP spans and requests -----------------------------------------------------------------------


@st.composite
def spans(draw: st.DrawFn) -> Span:
    span = Span(
        trace_id=draw(trace_ids),
        span_id=draw(span_ids),
        parent_span_id=draw(st.one_of(st.just(b""), span_ids)),
        name=draw(strings),
        kind=cast(Any, draw(st.integers(min_value=0, max_value=7))),  # beyond the enum too (open enum)
        start_time_unix_nano=draw(UINT64),
        end_time_unix_nano=draw(st.one_of(st.just(0), UINT64)),
        flags=draw(st.one_of(st.just(0), st.just(0x01), st.just(0x301), UINT32)),
        dropped_attributes_count=draw(st.one_of(st.just(0), UINT32)),
        status=Status(code=cast(Any, draw(st.integers(min_value=0, max_value=3))), message=draw(strings)),
    )
    span.attributes.extend(draw(key_values()))
    return span


@st.composite
def otlp_requests(draw: st.DrawFn) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        rs = ResourceSpans()
        rs.resource.attributes.extend(draw(key_values(4)))
        for _ in range(draw(st.integers(min_value=0, max_value=2))):
            ss = ScopeSpans()
            # the instrumentations the conventions table has rows for, or any other name
            ss.scope.name = draw(st.one_of(strings, st.sampled_from(TABLE_SCOPES)))
            ss.spans.extend(draw(st.lists(spans(), max_size=4)))
            rs.scope_spans.append(ss)
        req.resource_spans.append(rs)
    return req


headers = st.lists(
    st.tuples(st.sampled_from(("toolwitness-tenant", "x-other", "")), st.binary(max_size=70)), max_size=3
)


def otlp_json_doc(req: ExportTraceServiceRequest) -> dict[str, Any]:
    """OTLP/JSON as the Collector writes it: camelCase, ids as hex (not protobuf's base64)."""
    doc = json_format.MessageToDict(req)

    def hexify(node: Any) -> Any:
        if isinstance(node, dict):
            return {
                k: (base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId") else hexify(v))
                for k, v in node.items()
            }
        if isinstance(node, list):
            return [hexify(x) for x in node]
        return node

    return dict(hexify(doc))


json_values: st.SearchStrategy[Any] = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
        st.sampled_from(("ab" * 16, "cd" * 8, "zz", "")),
    ),
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=12), kids, max_size=4)),
    max_leaves=12,
)


def _paths(node: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [here]
    if isinstance(node, dict):
        for k, v in node.items():
            out.extend(_paths(v, (*here, k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(_paths(v, (*here, i)))
    return out


def _replace(node: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(node, dict):
        return {k: (_replace(v, rest, value) if k == head else v) for k, v in node.items()}
    return [(_replace(v, rest, value) if i == head else v) for i, v in enumerate(node)]


@st.composite
def mutated_json(draw: st.DrawFn, doc: Any) -> Any:
    """``doc`` with one to three subtrees (or the whole) replaced by arbitrary JSON."""
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(_paths(doc)))
        doc = _replace(doc, path, draw(json_values))
    return doc


@st.composite
def otlp_json_records(draw: st.DrawFn) -> bytes:
    doc: Any = otlp_json_doc(draw(otlp_requests()))
    if draw(st.booleans()):
        doc = draw(mutated_json(doc))
    return json.dumps(doc).encode()


@st.composite
def mutated_bytes(draw: st.DrawFn, value: bytes) -> bytes:
    """Bit flips, truncation, insertion and duplication of a valid encoding."""
    data = bytearray(value)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        op = draw(st.sampled_from(("flip", "truncate", "insert", "duplicate")))
        if op == "flip" and data:
            i = draw(st.integers(min_value=0, max_value=len(data) - 1))
            data[i] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        elif op == "truncate" and data:
            data = data[: draw(st.integers(min_value=0, max_value=len(data) - 1))]
        elif op == "insert":
            i = draw(st.integers(min_value=0, max_value=len(data)))
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        else:
            data = data + data
    return bytes(data)


# --- control messages ------------------------------------------------------------------------------

trace_id_texts = st.one_of(
    st.just("ab" * 16), st.just("0af7651916cd43dd8448eb211c80319c"),
    st.sampled_from(("AB" * 16, "0" * 32, "ab" * 16 + "\n", "ab" * 15, "")), st.text(max_size=40),
)
json_texts = st.one_of(
    json_values.map(lambda v: json.dumps(v)),
    st.text(max_size=30),
    st.integers(min_value=1, max_value=5000).map(lambda n: "[" * n + "]" * n),
    st.integers(min_value=1, max_value=5000).map(lambda n: "[" * n),
)


@st.composite
def matchers(draw: st.DrawFn) -> control_pb2.ArgumentMatcher:
    m = control_pb2.ArgumentMatcher(path=draw(st.one_of(st.sampled_from(("$", "$.q", "$..x", "$[", "")),
                                                        st.text(max_size=20))))
    kind = draw(st.sampled_from(("equals_json", "regex", "range", "one_of", "none")))
    if kind == "equals_json":
        m.equals_json = draw(json_texts)
    elif kind == "regex":
        m.regex = draw(st.one_of(st.sampled_from(("([a-z", "a{99999999}", ".*", "(?P<x>")), st.text(max_size=20)))
    elif kind == "range":
        r = control_pb2.NumberRange()
        if draw(st.booleans()):
            r.min = draw(st.floats(allow_nan=True, allow_infinity=True))
        if draw(st.booleans()):
            r.max = draw(st.floats(allow_nan=True, allow_infinity=True))
        m.range.CopyFrom(r)
    elif kind == "one_of":
        m.one_of.values_json.extend(draw(st.lists(json_texts, max_size=3)))
    return m


@st.composite
def conditions(draw: st.DrawFn) -> control_pb2.Condition:
    kind = draw(st.sampled_from(("tools_called", "tool_sequence", "payload_propagated", "none")))
    c = control_pb2.Condition()
    if kind == "tools_called":
        for _ in range(draw(st.integers(min_value=0, max_value=3))):
            t = c.tools_called.tools.add(name=draw(strings), status=draw(st.sampled_from(("", "any", "ok", "error",
                                                                                         "maybe"))))
            t.arguments.extend(draw(st.lists(matchers(), max_size=2)))
            if draw(st.booleans()):
                t.min_count = draw(UINT32)
            if draw(st.booleans()):
                t.max_count = draw(UINT32)
        if not c.HasField("tools_called"):
            c.tools_called.SetInParent()
    elif kind == "tool_sequence":
        c.tool_sequence.tools.extend(draw(st.lists(strings, max_size=4)))
        c.tool_sequence.mode = draw(st.sampled_from(("", "subsequence", "exact", "any_order", "sideways")))
    elif kind == "payload_propagated":
        c.payload_propagated.canaries.extend(draw(st.lists(strings, max_size=3)))
        c.payload_propagated.target_tools.extend(draw(st.lists(strings, max_size=2)))
    return c


@st.composite
def scopes(draw: st.DrawFn) -> common_pb2.Scope:
    kind = draw(st.sampled_from(("traces", "traces", "session", "message", "none")))
    s = common_pb2.Scope()
    if kind == "traces":
        s.traces.trace_ids.extend(draw(st.lists(trace_id_texts, max_size=3)))
        s.traces.SetInParent()
    elif kind == "session":
        s.session.session_id = draw(strings)
        s.session.SetInParent()
    elif kind == "message":
        s.message.message_id = draw(strings)
        s.message.conversation_id = draw(strings)
        s.message.trace_ids.extend(draw(st.lists(trace_id_texts, max_size=2)))
        s.message.response_text = draw(strings)
    return s


_valid_tenants = st.sampled_from(("", "default", "acme", "tenant-b.1"))
tenants = st.one_of(
    _valid_tenants, _valid_tenants, _valid_tenants,
    st.sampled_from(("a:b", "acme\n", "x" * 65, "a}b", " ")), st.text(max_size=70),
)


@st.composite
def control_messages(draw: st.DrawFn) -> control_pb2.ControlMessage:
    kind = draw(st.sampled_from(("expectation", "completion", "cancel", "none")))
    msg = control_pb2.ControlMessage()
    if kind == "expectation":
        e = msg.expectation
        e.expectation_id = draw(strings)
        e.tenant = draw(tenants)
        e.scorer = draw(st.sampled_from(("", "tools", "nope")))
        if draw(st.integers(min_value=0, max_value=4)):
            e.scope.CopyFrom(draw(scopes()))
        e.conditions.extend(draw(st.lists(conditions(), max_size=3)))
        e.objective = draw(strings)
        if draw(st.booleans()):
            e.deadline.CopyFrom(Duration(seconds=draw(INT64), nanos=draw(INT32)))
        if draw(st.booleans()):
            e.created_at.CopyFrom(Timestamp(seconds=draw(INT64), nanos=draw(INT32)))
        for k, v in draw(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=2)).items():
            e.labels[k] = v
        msg.expectation.SetInParent()
    elif kind == "completion":
        m = msg.completion
        m.tenant = draw(tenants)
        target = draw(st.sampled_from(("trace_id", "session_id", "none")))
        if target == "trace_id":
            m.trace_id = draw(trace_id_texts)
        elif target == "session_id":
            m.session_id = draw(strings)
        if draw(st.booleans()):
            m.span_count = draw(UINT64)
        if draw(st.booleans()):
            m.at.CopyFrom(Timestamp(seconds=draw(INT64), nanos=draw(INT32)))
        msg.completion.SetInParent()
    elif kind == "cancel":
        msg.cancel.tenant = draw(tenants)
        msg.cancel.expectation_id = draw(strings)
        msg.cancel.reason = draw(strings)
        msg.cancel.SetInParent()
    return msg


@st.composite
def control_json_records(draw: st.DrawFn) -> bytes:
    msg = draw(control_messages())
    try:
        doc: Any = json_format.MessageToDict(msg)
    except (ValueError, json_format.Error):  # e.g. a Duration beyond the JSON mapping's range
        doc = {}
    if draw(st.booleans()):
        doc = draw(mutated_json(doc))
    text = json.dumps(doc)
    return (text if text.startswith("{") else "{" + text).encode()


# --- plausible inputs: well-formed envelopes with hostile details, so decoding goes all the way -----


@st.composite
def plausible_requests(draw: st.DrawFn) -> ExportTraceServiceRequest:
    """One resource, one scope, one to four spans with valid ids; attributes anything."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend(draw(key_values(3)))
    if draw(st.booleans()):
        rs.resource.attributes.add(key="toolwitness.tenant").value.string_value = draw(_valid_tenants)
    ss = rs.scope_spans.add()
    trace = draw(st.binary(min_size=16, max_size=16).filter(any))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        span = draw(spans())
        span.trace_id = trace
        span.span_id = draw(st.binary(min_size=8, max_size=8).filter(any))
        span.parent_span_id = draw(st.one_of(st.just(b""), st.binary(min_size=8, max_size=8)))
        if draw(st.booleans()):
            span.attributes.add(key="gen_ai.operation.name").value.string_value = "execute_tool"
        ss.spans.append(span)
    return req


@st.composite
def plausible_expectations(draw: st.DrawFn) -> control_pb2.ControlMessage:
    """Valid tenant, id, scope and condition kinds; matchers, counts, statuses and deadlines anything."""
    msg = control_pb2.ControlMessage()
    e = msg.expectation
    e.expectation_id = draw(st.text(min_size=1, max_size=30))
    e.tenant = draw(_valid_tenants)
    e.scorer = "tools"
    if draw(st.booleans()):
        e.scope.traces.trace_ids.extend(draw(st.lists(st.just("ab" * 16) | st.just("cd" * 16), min_size=1,
                                                      max_size=2)))
    else:
        e.scope.session.session_id = draw(st.text(min_size=1, max_size=20))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        c = e.conditions.add()
        kind = draw(st.sampled_from(("tools_called", "tools_called", "tool_sequence", "payload_propagated")))
        if kind == "tools_called":
            for _ in range(draw(st.integers(min_value=1, max_value=2))):
                t = c.tools_called.tools.add(name=draw(st.text(min_size=1, max_size=12)))
                t.status = draw(st.sampled_from(("", "any", "ok", "error", "maybe")))
                t.arguments.extend(draw(st.lists(matchers(), max_size=2)))
                if draw(st.booleans()):
                    t.min_count = draw(UINT32)
                if draw(st.booleans()):
                    t.max_count = draw(UINT32)
        elif kind == "tool_sequence":
            c.tool_sequence.tools.extend(draw(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=3)))
            c.tool_sequence.mode = draw(st.sampled_from(("", "subsequence", "exact", "any_order", "sideways")))
        else:
            c.payload_propagated.canaries.extend(draw(st.lists(st.text(min_size=1, max_size=8), min_size=1,
                                                               max_size=2)))
    if draw(st.booleans()):
        e.deadline.CopyFrom(Duration(seconds=draw(st.one_of(st.integers(-10, 10**6), INT64)),
                                     nanos=draw(st.one_of(st.just(0), INT32))))
    return msg
