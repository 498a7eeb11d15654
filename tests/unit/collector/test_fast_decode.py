"""The fused decode path (``decode_span_facts``) against the general one (``decode_span_record``
then ``span_fact`` per span): for every record, the same (tenant, trace, span fact) sequence,
byte for byte, the same end times, the same rejected spans and the same errors.

The generated records mix what the normalization rules look at: GenAI and OpenInference tool
spans (agreeing, conflicting, unnamed, without arguments or call id), non-string attribute
values (bools, ints, doubles, arrays, kvlists, bytes, no value), repeated keys (the last one
counts), dropped attributes, unended, unsampled and remote-parent spans, session ids on the
span or its resource, tenants from the header or the resource (valid or not), arguments over
the size cap (multi-byte characters cut), bad ids and spans with too many attributes.
"""

from __future__ import annotations

import base64
import json
import math
import random
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from collector.bench import make_traces
from collector.config import ServiceConfig, load_config
from collector.processors.normalize import short_id, span_fact
from collector.receivers.decode import (
    TENANT_RE,
    RecordDecodeError,
    decode_span_facts,
    decode_span_record,
    record_tenant,
    record_tenants,
    record_traces,
)
from scoring.models.evidence import ATTRIBUTES_DROPPED, CONFLICTING_EVIDENCE, SPAN_NOT_ENDED, SPAN_UNSAMPLED
from scoring.normalize.spans import FACT_KEYS, UNNAMED_TOOL, otlp_attributes
from tests.unit.fuzz import strategies as fuzz

DIFF = settings(
    max_examples=400,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

TENANT_HEADER = "toolwitness-tenant"
TENANT_ATTR = "toolwitness.tenant"
SESSION_KEYS = ("gen_ai.conversation.id", "session.id")
RESULT_KEYS = ("gen_ai.tool.call.result", "output.value")
OTHER_KEYS = ("gen_ai.provider.name", "gen_ai.request.model", "service.name", "", "tool", "gen_ai.tool")
ALL_KEYS = tuple(sorted(FACT_KEYS)) + RESULT_KEYS + OTHER_KEYS + (TENANT_ATTR,)

Outcome = tuple[Any, ...]


# --- the two paths, reduced to comparable values -------------------------------------------------------


def _dumps(fact: dict[str, Any]) -> str:
    return json.dumps(fact, separators=(",", ":"))


def general(value: bytes, headers: list[tuple[str, bytes]], cfg: ServiceConfig) -> Outcome:
    try:
        decoded = decode_span_record(value, headers, cfg)
    except RecordDecodeError as exc:
        return ("error", exc.reason, exc.detail)
    max_arg = cfg.limits.max_argument_bytes
    facts = [
        (tenant, span.trace_id, _dumps(span_fact(span, max_arg)), span.end_time_unix_nano or 0)
        for tenant, span in decoded.spans
    ]
    return ("ok", facts, decoded.rejected)


def fused(value: bytes, headers: list[tuple[str, bytes]], cfg: ServiceConfig) -> Outcome:
    try:
        decoded = decode_span_facts(value, headers, cfg, cfg.limits.max_argument_bytes)
    except RecordDecodeError as exc:
        return ("error", exc.reason, exc.detail)
    return ("ok", [(t, trace, _dumps(f), end) for t, trace, f, end in decoded.facts], decoded.rejected)


def assert_same(value: bytes, headers: list[tuple[str, bytes]], cfg: ServiceConfig) -> Outcome:
    want = general(value, headers, cfg)
    got = fused(value, headers, cfg)
    assert got == want
    if want[0] == "ok":
        # Not only the same JSON: equal dicts of the same types (lists stay lists).
        max_arg = cfg.limits.max_argument_bytes
        dicts = [f for _, _, f, _ in decode_span_facts(value, headers, cfg, max_arg).facts]
        assert dicts == [span_fact(s, max_arg) for _, s in decode_span_record(value, headers, cfg).spans]
    return want


def config(max_attributes: int = 1024, max_argument_bytes: int = 1024, encoding: str = "otlp_proto") -> ServiceConfig:
    return ServiceConfig.model_validate(
        {
            "kafka": {"encoding": encoding},
            "limits": {"max_attributes_per_span": max_attributes, "max_argument_bytes": max_argument_bytes},
        }
    )


# --- building blocks ---------------------------------------------------------------------------------


def s(text: str) -> AnyValue:
    return AnyValue(string_value=text)


def kv(key: str, value: AnyValue | str) -> KeyValue:
    return KeyValue(key=key, value=s(value) if isinstance(value, str) else value)


TRACE = bytes(range(1, 17))
ROOT = bytes(range(40, 48))


def span(
    attrs: list[KeyValue],
    *,
    span_id: bytes = bytes(range(20, 28)),
    trace_id: bytes = TRACE,
    parent: bytes = ROOT,
    flags: int = 0x101,
    start: int = 1_767_225_600_000_000_000,
    end: int | None = 1_767_225_600_750_000_000,
    status: int = 0,
    dropped: int = 0,
) -> Span:
    out = Span(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent,
        flags=flags,
        start_time_unix_nano=start,
        end_time_unix_nano=end or 0,
        dropped_attributes_count=dropped,
        status=Status(code=cast(Any, status)),
        name="span",
    )
    out.attributes.extend(attrs)
    return out


def record(*spans: Span, resource: list[KeyValue] | None = None) -> bytes:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend(resource or [kv("service.name", "agent")])
    rs.scope_spans.add().spans.extend(spans)
    return req.SerializeToString()


# --- examples: one per case the brief names (they hold whatever hypothesis draws) -----------------------

GENAI = [kv("gen_ai.operation.name", "execute_tool"), kv("gen_ai.tool.name", "search")]
OI = [kv("openinference.span.kind", "TOOL"), kv("tool.name", "search")]

EXAMPLES: dict[str, tuple[bytes, list[tuple[str, bytes]]]] = {
    "genai": (record(span([*GENAI, kv("gen_ai.tool.call.id", "c1"), kv("gen_ai.tool.call.arguments", '{"q":1}')])), []),
    "genai_result_error_type": (
        record(span([*GENAI, kv("gen_ai.tool.call.result", "r"), kv("error.type", "Timeout")], status=1)),
        [],
    ),
    "genai_status_error": (record(span(GENAI, status=2)), []),
    "openinference": (
        record(span([*OI, kv("tool_call.id", "c2"), kv("input.value", "in"), kv("output.value", "out")])),
        [],
    ),
    "openinference_first_keys": (
        record(
            span([*OI, kv("tool.id", ""), kv("tool_call.id", "c3"), kv("tool.parameters", ""), kv("input.value", "x")])
        ),
        [],
    ),
    "both_agreeing": (record(span([*GENAI, *OI])), []),
    "both_other_arguments": (
        record(
            span([*GENAI, *OI, kv("gen_ai.tool.call.arguments", '{"to":"boss"}'), kv("input.value", '{"to":"evil"}')])
        ),
        [],
    ),
    "both_other_call_ids": (record(span([*GENAI, *OI, kv("gen_ai.tool.call.id", "c1"), kv("tool_call.id", "c2")])), []),
    "both_conflicting": (record(span([*GENAI, kv("openinference.span.kind", "TOOL"), kv("tool.name", "other")])), []),
    "unnamed_genai": (record(span([kv("gen_ai.operation.name", "execute_tool")])), []),
    "unnamed_oi_empty_name": (record(span([kv("openinference.span.kind", "TOOL"), kv("tool.name", "")])), []),
    "missing_arguments": (record(span(GENAI)), []),
    "non_string_values": (
        record(
            span(
                [
                    kv("gen_ai.operation.name", "execute_tool"),
                    kv("gen_ai.tool.name", AnyValue(int_value=7)),
                    kv("gen_ai.tool.call.id", AnyValue(double_value=1.5)),
                    kv("gen_ai.tool.call.arguments", AnyValue(kvlist_value=KeyValueList(values=[kv("a", "b")]))),
                    kv("error.type", AnyValue(bool_value=False)),
                    kv("toolwitness.tool.call.arguments.truncated", AnyValue(bool_value=True)),
                ]
            ),
            span(
                [
                    kv("openinference.span.kind", "TOOL"),
                    kv("tool.name", AnyValue(array_value=ArrayValue(values=[s("a"), s("b")]))),
                    kv("tool.id", AnyValue(bytes_value=b"\x00\xff")),
                    kv("input.value", AnyValue(array_value=ArrayValue(values=[s("a"), AnyValue(int_value=1)]))),
                    kv("error.type", AnyValue()),
                    kv("session.id", AnyValue(int_value=3)),
                ],
                span_id=bytes(range(30, 38)),
            ),
            span([kv("gen_ai.operation.name", AnyValue(array_value=ArrayValue(values=[s("execute_tool")])))]),
        ),
        [],
    ),
    "repeated_keys_last_wins": (
        record(
            span(
                [
                    kv("gen_ai.operation.name", "chat"),
                    kv("gen_ai.tool.name", "first"),
                    kv("gen_ai.operation.name", "execute_tool"),
                    kv("gen_ai.tool.name", "last"),
                    kv("session.id", "s1"),
                    kv("session.id", ""),
                ]
            ),
            span([*GENAI, kv("gen_ai.operation.name", AnyValue(int_value=1))], span_id=bytes(range(30, 38))),
        ),
        [],
    ),
    "dropped_attributes": (
        record(span([*GENAI, kv("gen_ai.tool.call.arguments", "{}")], dropped=3), span([], dropped=1)),
        [],
    ),
    "unended_unsampled_remote": (
        record(
            span(GENAI, end=None, flags=0x300),
            span([], flags=0x02, span_id=bytes(range(30, 38))),
            span([], flags=0x200, parent=b"", span_id=bytes(range(50, 58))),
            span(GENAI, start=5_000_000_000, end=4_000_000_000, span_id=bytes(range(60, 68))),
        ),
        [],
    ),
    "sessions": (
        record(
            span([kv("gen_ai.conversation.id", "conv"), kv("session.id", "sess")]),
            span([kv("session.id", "sess")], span_id=bytes(range(30, 38))),
            span([kv("gen_ai.conversation.id", "")], span_id=bytes(range(50, 58))),
            span([], span_id=bytes(range(60, 68))),
            resource=[kv("session.id", "resource-session"), kv("gen_ai.conversation.id", AnyValue(int_value=1))],
        ),
        [],
    ),
    "tenant_resource": (record(span(GENAI), resource=[kv(TENANT_ATTR, "acme")]), []),
    "tenant_header_wins": (record(span(GENAI), resource=[kv(TENANT_ATTR, "acme")]), [(TENANT_HEADER, b"globex")]),
    "tenant_invalid": (record(span(GENAI), resource=[kv(TENANT_ATTR, "no spaces")]), []),
    "tenant_header_invalid": (record(span(GENAI)), [(TENANT_HEADER, b"bad/tenant")]),
    "oversize_arguments": (
        record(
            span([*GENAI, kv("gen_ai.tool.call.arguments", "é" * 40)]),
            span([*GENAI, kv("gen_ai.tool.call.arguments", "x" * 17)], span_id=bytes(range(30, 38))),
            span([*OI, kv("input.value", "€" * 6)], span_id=bytes(range(50, 58))),
        ),
        [],
    ),
    "bad_ids_some": (
        record(
            span(GENAI),
            span(GENAI, trace_id=bytes(16), span_id=bytes(range(30, 38))),
            span(GENAI, span_id=bytes(8)),
            span(GENAI, span_id=b"\x01" * 7),
            span(GENAI, parent=b"\x01" * 3, span_id=bytes(range(50, 58))),
            span(GENAI, trace_id=b"\x01" * 15, span_id=bytes(range(60, 68))),
        ),
        [],
    ),
    "bad_ids_all": (record(span(GENAI, span_id=b""), span(GENAI, trace_id=b"")), []),
    "too_many_attributes_some": (
        record(span([kv("k", "v")] * 9), span(GENAI, span_id=bytes(range(30, 38)))),
        [],
    ),
    "too_many_attributes_all": (record(span([kv("gen_ai.tool.name", "x")] * 9)), []),
    "no_spans": (ExportTraceServiceRequest().SerializeToString(), []),
    "undecodable": (b"\x0a\xff\xff", []),
    "several_resources_and_traces": (
        ExportTraceServiceRequest(
            resource_spans=[
                ResourceSpans(
                    resource={"attributes": [kv(TENANT_ATTR, "acme"), kv("session.id", "r1")]},
                    scope_spans=[
                        ScopeSpans(spans=[span(GENAI), span([], trace_id=b"\x02" * 16)]),
                        ScopeSpans(spans=[span(OI, trace_id=b"\x02" * 16, span_id=bytes(range(30, 38)))]),
                    ],
                ),
                ResourceSpans(scope_spans=[ScopeSpans(spans=[span([], trace_id=TRACE, parent=b"")])]),
            ]
        ).SerializeToString(),
        [],
    ),
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_examples(name: str) -> None:
    value, headers = EXAMPLES[name]
    assert_same(value, headers, config(max_attributes=8, max_argument_bytes=16))


def test_examples_reach_every_outcome() -> None:
    """The examples above do what their names say (else they would prove little)."""
    cfg = config(max_attributes=8, max_argument_bytes=16)
    outcomes = {name: general(*EXAMPLES[name], cfg) for name in EXAMPLES}
    errors = {name: o[1] for name, o in outcomes.items() if o[0] == "error"}
    assert errors == {
        "tenant_invalid": "invalid_tenant",
        "tenant_header_invalid": "invalid_tenant",
        "bad_ids_all": "invalid_span",
        "too_many_attributes_all": "too_many_attributes",
        "no_spans": "no_spans",
        "undecodable": "undecodable_protobuf",
    }
    facts = {name: [json.loads(f[2]) for f in o[1]] for name, o in outcomes.items() if o[0] == "ok"}
    reasons = {r for fs in facts.values() for f in fs for r in f["f"]}
    assert {ATTRIBUTES_DROPPED, CONFLICTING_EVIDENCE, SPAN_NOT_ENDED, SPAN_UNSAMPLED, UNNAMED_TOOL} <= reasons
    # the last name counts; a last operation name of 1 (an int) makes no tool execution
    assert [f["x"] and f["x"][1] for f in facts["repeated_keys_last_wins"]] == ["last", False]
    assert [f["s"] for f in facts["sessions"]] == ["conv", "sess", "resource-session", "resource-session"]
    assert all(f["x"][5] == 2 for f in facts["oversize_arguments"])  # truncated
    assert {o[1][0][0] for name, o in outcomes.items() if name.startswith("tenant_") and o[0] == "ok"} == {
        "acme",
        "globex",
    }
    assert [r[2] for r in outcomes["bad_ids_some"][2]] == ["invalid_span"] * 5
    # 0x300: parent known to be remote; 0x200 alone does not say whether it is known
    assert [f["r"] for f in facts["unended_unsampled_remote"]] == [1, 0, 0, 0]


# --- generated records ---------------------------------------------------------------------------------

strings = st.one_of(
    st.sampled_from(("execute_tool", "TOOL", "chat", "search", "other", "", "é" * 12, "€x" * 9)), st.text(max_size=30)
).map(s)
leaf_values = st.one_of(
    strings,
    st.booleans().map(lambda b: AnyValue(bool_value=b)),
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(lambda i: AnyValue(int_value=i)),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda f: AnyValue(double_value=f)),
    st.binary(max_size=10).map(lambda b: AnyValue(bytes_value=b)),
    st.just(AnyValue()),
)
attr_values = st.recursive(
    leaf_values,
    lambda kids: st.one_of(
        st.lists(kids, max_size=3).map(lambda vs: AnyValue(array_value=ArrayValue(values=vs))),
        st.lists(st.tuples(st.sampled_from(ALL_KEYS), kids), max_size=3).map(
            lambda ps: AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key=k, value=v) for k, v in ps]))
        ),
    ),
    max_leaves=6,
)
#: mostly strings (as exporters send), anything else sometimes
values = st.one_of(strings, attr_values)


@st.composite
def convention_attrs(draw: st.DrawFn) -> list[KeyValue]:
    """The attributes that make (or almost make) a tool execution."""
    kind = draw(st.sampled_from(("genai", "oi", "both", "chat", "none")))
    name = draw(st.sampled_from(("search", "other", "")))
    out: list[KeyValue] = []
    if kind in ("genai", "both"):
        out.append(kv("gen_ai.operation.name", "execute_tool"))
        if draw(st.booleans()):
            out.append(kv("gen_ai.tool.name", name))
    if kind in ("oi", "both"):
        out.append(kv("openinference.span.kind", "TOOL"))
        if draw(st.booleans()):
            other = draw(st.sampled_from((name, name, "search", "other")))
            out.append(kv("tool.name", other))
    if kind == "chat":
        out.append(kv("gen_ai.operation.name", "chat"))
    for key in ("gen_ai.tool.call.id", "tool.id", "tool_call.id"):
        if draw(st.integers(0, 3)) == 0:
            out.append(kv(key, draw(st.sampled_from(("call_1", "")))))
    for key in ("gen_ai.tool.call.arguments", "tool.parameters", "input.value", *RESULT_KEYS):
        if draw(st.booleans()):
            out.append(
                kv(key, draw(st.one_of(st.text(max_size=40), st.sampled_from(('{"q": 1}', "é" * 20, "x" * 30)))))
            )
    return out


ids16 = st.one_of(st.binary(min_size=16, max_size=16).map(lambda b: b[:-1] + bytes([b[-1] | 1])), st.just(TRACE))
ids8 = st.binary(min_size=8, max_size=8).map(lambda b: b[:-1] + bytes([b[-1] | 1]))
bad_ids = st.sampled_from((b"", bytes(8), bytes(16), b"\x01" * 3, b"\x01" * 17))


@st.composite
def spans(draw: st.DrawFn, traces: list[bytes], parents: list[bytes]) -> Span:
    attrs = draw(convention_attrs())
    attrs += draw(st.lists(st.builds(KeyValue, key=st.sampled_from(ALL_KEYS), value=values), max_size=5))
    attrs = draw(st.permutations(attrs))
    bad = draw(st.integers(0, 9)) == 0
    start = draw(st.integers(min_value=0, max_value=2**64 - 1))
    return span(
        attrs,
        trace_id=draw(bad_ids) if bad and draw(st.booleans()) else draw(st.sampled_from(traces)),
        span_id=draw(bad_ids) if bad and draw(st.booleans()) else draw(ids8),
        parent=draw(st.one_of(st.just(b""), st.sampled_from(parents), ids8, bad_ids if bad else st.just(b""))),
        flags=draw(st.sampled_from((0, 0x01, 0x02, 0x100, 0x101, 0x200, 0x300, 0x301))) | draw(st.integers(0, 3)) << 10,
        start=start,
        end=draw(
            st.one_of(st.none(), st.integers(min_value=0, max_value=2**64 - 1), st.just(min(start + 5000, 2**64 - 1)))
        ),
        status=draw(st.integers(min_value=0, max_value=3)),
        dropped=draw(st.sampled_from((0, 0, 0, 1, 2**32 - 1))),
    )


@st.composite
def records(draw: st.DrawFn) -> tuple[bytes, list[tuple[str, bytes]]]:
    traces = draw(st.lists(ids16, min_size=1, max_size=2))
    parents = draw(st.lists(ids8, min_size=1, max_size=2))
    req = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(min_value=1, max_value=2))):
        rs = req.resource_spans.add()
        resource = draw(st.lists(st.builds(KeyValue, key=st.sampled_from(ALL_KEYS), value=values), max_size=3))
        if draw(st.booleans()):
            resource.append(kv(TENANT_ATTR, draw(st.sampled_from(("acme", "globex", "acme", "", "bad tenant")))))
        if draw(st.booleans()):
            resource.append(kv(draw(st.sampled_from(SESSION_KEYS)), draw(st.sampled_from(("rs", "")))))
        rs.resource.attributes.extend(draw(st.permutations(resource)))
        for i in range(draw(st.integers(min_value=0 if req.resource_spans[:-1] else 1, max_value=2))):
            ss = rs.scope_spans.add()
            ss.scope.name = draw(st.sampled_from(("", *fuzz.TABLE_SCOPES)))  # the conventions table's rows
            ss.spans.extend(draw(st.lists(spans(traces, parents), min_size=int(i == 0), max_size=4)))
    headers = draw(
        st.lists(
            st.tuples(
                st.sampled_from((TENANT_HEADER, "x-other")),
                st.sampled_from((b"acme", b"h-tenant", b"acme", b"h-tenant", b"", b"a b")),
            ),
            max_size=2,
        )
    )
    return req.SerializeToString(), headers


@DIFF
@given(
    rec=records(),
    max_attributes=st.sampled_from((3, 8, 1024, 1024)),
    max_argument_bytes=st.sampled_from((16, 24, 1024)),
)
def test_generated_records(
    rec: tuple[bytes, list[tuple[str, bytes]]], max_attributes: int, max_argument_bytes: int
) -> None:
    value, headers = rec
    assert_same(value, headers, config(max_attributes, max_argument_bytes))


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(req=fuzz.otlp_requests(), headers=fuzz.headers)
def test_hostile_records(req: ExportTraceServiceRequest, headers: list[tuple[str, bytes]]) -> None:
    """The fuzzers' hostile records (any key, any value, any id, any flags)."""
    assert_same(req.SerializeToString(), headers, config(max_attributes=6, max_argument_bytes=16))


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_damaged_records(data: st.DataObject) -> None:
    """Bit flips, truncation and duplication of valid records: the same errors, or the same facts."""
    value, headers = data.draw(records())
    assert_same(data.draw(fuzz.mutated_bytes(value)), headers, config(max_attributes=8, max_argument_bytes=16))


def test_record_too_large() -> None:
    cfg = ServiceConfig.model_validate({"kafka": {"max_record_bytes": 1024}})
    value = record(span([*GENAI, kv("gen_ai.tool.call.arguments", "x" * 2000)]))
    assert general(value, [], cfg)[1] == "record_too_large"
    assert_same(value, [], cfg)


@settings(max_examples=50, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(rec=records())
def test_otlp_json_records(rec: tuple[bytes, list[tuple[str, bytes]]]) -> None:
    """otlp_json takes the general path inside decode_span_facts: still the same outcome."""
    req = ExportTraceServiceRequest()
    req.ParseFromString(rec[0])
    value = json.dumps(fuzz.otlp_json_doc(req)).encode()
    assert_same(value, rec[1], config(max_attributes=8, max_argument_bytes=16, encoding="otlp_json"))


def test_bench_records() -> None:
    """The benchmark's traces (the shape the speed was measured on), with the default limits."""
    cfg = load_config(None, env={})
    for trace in make_traces(20, record_spans=7):
        for value in trace.records:
            assert assert_same(value, [], cfg)[0] == "ok"


RNG = random.Random(7)


@pytest.mark.parametrize(
    "raw", [bytes(range(8)), b"\xff" * 8, b"\xfb\xef\xbe" * 2 + b"\x00\x01", *(RNG.randbytes(8) for _ in range(20))]
)
def test_short_ids(raw: bytes) -> None:
    """A span id goes bytes → base64url directly; it must be short_id() of its hex."""
    facts = decode_span_facts(record(span([], span_id=raw, parent=raw)), [], config(), 1024).facts
    ((_, _, fact, _),) = facts
    assert fact["i"] == fact["p"] == short_id(raw.hex()) == base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def test_nan_arguments_stay_strict_json() -> None:
    """A double argument becomes its JSON text as before (``NaN`` included), never a float."""
    value = record(span([*GENAI, kv("gen_ai.tool.call.arguments", AnyValue(double_value=math.nan))]))
    out = assert_same(value, [], config())
    assert json.loads(out[1][0][2])["x"][6] == "NaN"


@pytest.mark.parametrize("encoding", ["otlp_proto", "otlp_json"])
def test_with_the_resource_attribute_off_the_agent_names_no_tenant(encoding: str) -> None:
    cfg = ServiceConfig.model_validate({"kafka": {"encoding": encoding}, "tenant": {"resource_attribute": ""}})
    claims = [kv("toolwitness.tenant", "acme"), kv("", "acme")]  # the configured name, and the empty key
    value = record(span(GENAI), resource=claims)
    if encoding == "otlp_json":
        value = json.dumps(fuzz.otlp_json_doc(ExportTraceServiceRequest.FromString(value))).encode()
    _, facts, _ = assert_same(value, [], cfg)
    assert {tenant for tenant, *_ in facts} == {"default"}
    # the header still names it (e.g. stamped by `toolwitness sidecar --tenant`)
    _, facts, _ = assert_same(value, [("toolwitness-tenant", b"globex")], cfg)
    assert {tenant for tenant, *_ in facts} == {"globex"}


@DIFF
@given(rec=records(), cut=st.integers(min_value=0, max_value=400))
def test_the_tenants_of_an_unread_record_are_those_decoding_gives(
    rec: tuple[bytes, list[tuple[str, bytes]]], cut: int
) -> None:
    """A record dropped unread (too large) still marks its trace for each tenant it names: read
    from the framing alone, the tenants a full parse gives (a tenant that is no tenant name -- a
    list or map value -- may read as the default one: one more trace marked, never one less);
    bytes that are not protobuf name the default tenant."""
    value, headers = rec
    cfg = config()
    req = ExportTraceServiceRequest.FromString(value)
    want = {record_tenant(headers, otlp_attributes(rs.resource.attributes), cfg) for rs in req.resource_spans}
    valid = {t for t in want if TENANT_RE.fullmatch(t)}
    got = {t for t in record_tenants(value, headers, cfg) if TENANT_RE.fullmatch(t)}
    assert valid <= got and got - valid <= {"default"}
    if valid == want:
        assert got == want
    assert record_tenants(b"\xff\xff\xff" + value[:cut], [], cfg) == {"default"}


@DIFF
@given(rec=records(), cut=st.integers(min_value=0, max_value=400))
def test_the_traces_of_an_unread_record_are_those_decoding_gives(
    rec: tuple[bytes, list[tuple[str, bytes]]], cut: int
) -> None:
    """A record dropped unread, keyed or not, marks every trace it held for its tenant: read from
    the framing alone, the (tenant, trace) pairs a full parse gives (a tenant that is no tenant name
    may read as the default one); a record cut short shows no more than its whole."""
    value, headers = rec
    cfg = config()
    req = ExportTraceServiceRequest.FromString(value)
    want = {
        (record_tenant(headers, otlp_attributes(rs.resource.attributes), cfg), span.trace_id.hex())
        for rs in req.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
        if len(span.trace_id) == 16
    }
    got = record_traces(value, headers, cfg)
    assert {t for _, t in got} == {t for _, t in want}
    assert {p for p in want if TENANT_RE.fullmatch(p[0])} <= got | {("default", t) for _, t in want}
    assert {t for _, t in record_traces(value[:cut], headers, cfg)} <= {t for _, t in want}


def test_the_traces_of_an_unread_json_record_are_read_from_its_json() -> None:
    cfg = ServiceConfig.model_validate(
        {**config().model_dump(), "kafka": {**config().kafka.model_dump(), "encoding": "otlp_json"}}
    )
    trace = "0AF7651916CD43DD8448EB211C80319C"
    doc = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": TENANT_ATTR, "value": {"stringValue": "acme"}}]},
                "scopeSpans": [{"spans": [{"traceId": trace, "spanId": "not hex"}]}],
            }
        ]
    }
    assert record_traces(json.dumps(doc).encode(), [], cfg) == {("acme", trace.lower())}
    assert record_traces(b"{not json", [], cfg) == set()


def _kept_and_rejected(
    decode: str, value: bytes, cfg: ServiceConfig
) -> tuple[list[tuple[str, str]], list[tuple[str, str, str, str]]]:
    """(tenant, trace) of the kept spans and the rejections, by the fused or the general decoder."""
    if decode == "fast":
        out = decode_span_facts(value, [], cfg, 1024)
        return [(t, trace) for t, trace, _, _ in out.facts], out.rejected
    general = decode_span_record(value, [], cfg)
    return [(t, span.trace_id) for t, span in general.spans], general.rejected


@pytest.mark.parametrize("decode", ["fast", "general"])
def test_a_resource_naming_an_invalid_tenant_costs_only_its_own_spans(decode: str) -> None:
    req = ExportTraceServiceRequest()
    for tenant in ("acme", "Beta Corp"):
        rs = req.resource_spans.add()
        rs.resource.attributes.add(key=TENANT_ATTR, value=AnyValue(string_value=tenant))
        rs.scope_spans.add().spans.add(
            trace_id=bytes(range(1, 17)), span_id=bytes(range(1, 9)), start_time_unix_nano=1, end_time_unix_nano=2
        )
    value, cfg = req.SerializeToString(), config()
    kept, rejected = _kept_and_rejected(decode, value, cfg)
    assert kept == [("acme", bytes(range(1, 17)).hex())]
    assert [(t, trace, reason) for t, trace, reason, _ in rejected] == [("", "", "invalid_tenant")]
    only_bad = ExportTraceServiceRequest(resource_spans=[req.resource_spans[1]]).SerializeToString()
    with pytest.raises(RecordDecodeError, match="invalid_tenant"):
        decode_span_facts(only_bad, [], cfg, 1024) if decode == "fast" else decode_span_record(only_bad, [], cfg)


@pytest.mark.parametrize("decode", ["fast", "general"])
def test_an_otlp_json_span_with_an_id_that_is_not_hex_costs_only_that_span(decode: str) -> None:
    cfg = config(encoding="otlp_json")
    good, bad = "0af7651916cd43dd8448eb211c80319c", "1bf7651916cd43dd8448eb211c80319d"
    doc = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": TENANT_ATTR, "value": {"stringValue": "acme"}}]},
                "scopeSpans": [
                    {
                        "spans": [
                            {"traceId": good, "spanId": "00f067aa0ba902b7", "name": "a", "startTimeUnixNano": "1"},
                            {"traceId": bad, "spanId": "not hex", "name": "b", "startTimeUnixNano": "1"},
                            {"traceId": bad, "spanId": "00f067aa0ba902b8", "name": "c", "startTimeUnixNano": "1",
                             "links": [{"traceId": "zz", "spanId": "00f067aa0ba902b9"}]},
                        ]
                    }
                ],
            }
        ]
    }
    value = json.dumps(doc).encode()
    kept, rejected = _kept_and_rejected(decode, value, cfg)
    assert kept == [("acme", good)]
    assert [(t, trace, reason) for t, trace, reason, _ in rejected] == [("acme", bad, "invalid_id")] * 2
    assert "spanId is not hex: 'not hex'" in rejected[0][3]
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"] = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][1:]
    with pytest.raises(RecordDecodeError, match="invalid_id"):
        decode_span_record(json.dumps(doc).encode(), [], cfg)
