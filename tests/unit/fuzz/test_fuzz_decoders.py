"""Fuzzing every decoder the service runs on untrusted bytes (issue 9).

Property: for any input, the OTLP decoder (``decode_span_record``, otlp_proto and otlp_json),
the normalizer (``from_otlp_span`` / ``normalize_span`` / the trace-state span fact) and the
control decoder (``decode_control`` + ``expectation_from_proto`` / ``check_marker``) either
succeed or raise ``RecordDecodeError`` / ``ControlDecodeError`` with a non-empty, known
``reason`` -- never anything else (an unexpected exception inside a batch would stop the
partition: the service would crash, replay the same record, and crash again).

A successful decode must also be usable downstream: every kept span yields a span fact that
serializes to strict JSON (what apply_spans.lua decodes), every tenant is a valid key part,
and every expectation survives the JSON round trip through Redis unchanged.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collector.config import ServiceConfig
from collector.processors.normalize import span_fact
from collector.receivers.decode import RecordDecodeError, decode_span_record
from collector.wire.convert import (
    TENANT,
    ControlDecodeError,
    RegisteredExpectation,
    check_marker,
    decode_control,
    expectation_from_proto,
)
from scoring.normalize.spans import NeutralSpan, normalize_span
from tests.unit.fuzz import strategies as S

FUZZ = settings(
    max_examples=150, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

PROTO = ServiceConfig.model_validate({"kafka": {"encoding": "otlp_proto"}})
JSON = ServiceConfig.model_validate({"kafka": {"encoding": "otlp_json"}})

#: every reason decode_span_record may give (documented in tests/data/bad_inputs/README.md)
SPAN_REASONS = {
    "record_too_large", "undecodable_protobuf", "invalid_json", "not_otlp_json", "invalid_id", "no_spans",
    "invalid_tenant", "invalid_span", "too_many_attributes",
}
#: every reason the control path below may give
CONTROL_REASONS = {
    "undecodable_control", "empty_control", "invalid_tenant", "invalid_expectation", "invalid_scope",
    "invalid_condition", "invalid_matcher", "invalid_marker",
}
NOW_MS = 1_767_225_600_000

counts: dict[str, int] = {}


def _count(key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


def check_span_record(value: bytes, headers: Sequence[tuple[str, bytes]], cfg: ServiceConfig) -> None:
    try:
        out = decode_span_record(value, headers, cfg)
    except RecordDecodeError as exc:
        assert exc.reason in SPAN_REASONS and exc.detail is not None, (exc.reason, exc.detail)
        _count(f"span:{exc.reason}")
        return
    _count("span:ok")
    assert out.spans, "a decoded record holds at least one usable span"
    for tenant, span in out.spans:
        assert TENANT.fullmatch(tenant), tenant
        assert len(span.trace_id) == 32 and len(span.span_id) == 16
        fact = span_fact(span, cfg.limits.max_argument_bytes)
        json.dumps(fact, allow_nan=False)  # strict JSON: what apply_spans.lua's cjson.decode reads
    for _tenant, trace, reason, _detail in out.rejected:
        assert reason in SPAN_REASONS and (trace == "" or len(trace) == 32), (reason, trace)


def check_control(value: bytes) -> None:
    try:
        msg = decode_control(value)
        kind = msg.WhichOneof("message")
        if kind == "expectation":
            exp = expectation_from_proto(
                msg.expectation, default_tenant="default", default_deadline_s=300, now_ms=NOW_MS
            )
            assert exp.expectation_id and TENANT.fullmatch(exp.tenant), exp
            # What the store writes and every later batch (or another instance) reads back.
            again = RegisteredExpectation.from_json(exp.to_json())
            assert again.to_json() == exp.to_json()
            assert again.deadline_ms == exp.deadline_ms and again.trace_ids() == exp.trace_ids()
        elif kind == "completion":
            check_marker(msg.completion)
            assert not msg.completion.tenant or TENANT.fullmatch(msg.completion.tenant)
        _count(f"control:ok:{kind}")
    except ControlDecodeError as exc:
        assert exc.reason in CONTROL_REASONS, (exc.reason, exc.detail)
        _count(f"control:{exc.reason}")


# --- OTLP records ------------------------------------------------------------------------------------


@FUZZ
@given(req=S.otlp_requests(), headers=S.headers)
def test_otlp_proto_structured(req: ExportTraceServiceRequest, headers: list[tuple[str, bytes]]) -> None:
    check_span_record(req.SerializeToString(), headers, PROTO)


@FUZZ
@given(req=S.plausible_requests(), encoding=st.sampled_from(("otlp_proto", "otlp_json")))
def test_plausible_otlp_records_decode_deep(req: ExportTraceServiceRequest, encoding: str) -> None:
    if encoding == "otlp_proto":
        check_span_record(req.SerializeToString(), [], PROTO)
    else:
        check_span_record(json.dumps(S.otlp_json_doc(req)).encode(), [], JSON)


@FUZZ
@given(value=st.one_of(st.binary(max_size=300), S.otlp_requests().flatmap(
    lambda r: S.mutated_bytes(r.SerializeToString()))))
@example(value=b"")
@example(value=b"\x0a\xff\xff\xff\xff\x0f")  # a length far beyond the record
@example(value=b"\x0a\x80" * 3000)  # nesting / truncated varints
def test_otlp_proto_bytes(value: bytes) -> None:
    check_span_record(value, [], PROTO)


@FUZZ
@given(value=S.otlp_json_records(), headers=S.headers)
def test_otlp_json_structured(value: bytes, headers: list[tuple[str, bytes]]) -> None:
    check_span_record(value, headers, JSON)


@FUZZ
@given(value=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode),
                       S.json_values.map(lambda v: json.dumps(v).encode())))
@example(value=b'{"resourceSpans": ' + b"[" * 50_000)
@example(value=b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "\\ud800"}]}]}]}')
@example(value=b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": 5, "spanId": null}]}]}]}')
@example(value=b'\xef\xbb\xbf{"resourceSpans": []}')
def test_otlp_json_bytes(value: bytes) -> None:
    check_span_record(value, [], JSON)


# --- the normalizer with arbitrary attribute values --------------------------------------------------

scalar = st.one_of(
    st.none(), st.text(max_size=40), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
)
attr_values = st.one_of(
    scalar,
    st.sampled_from(S.INTERESTING_STRINGS),
    st.lists(st.text(max_size=10), max_size=4),
    st.lists(st.integers(), max_size=4),
    st.lists(st.floats(allow_nan=True), max_size=4),
    st.lists(st.booleans(), max_size=4),
    st.lists(scalar, max_size=4),  # mixed: the SDK refuses these, a hand-built NeutralSpan need not
    st.tuples(st.text(max_size=5), st.integers()),
)


@FUZZ
@given(
    attributes=st.dictionaries(S.keys, attr_values, max_size=10),
    resource=st.dictionaries(S.keys, attr_values, max_size=4),
    sampled=st.booleans(),
    status=st.sampled_from(("unset", "ok", "error")),
    start=S.UINT64,
    end=st.one_of(st.none(), st.just(0), S.UINT64),
    dropped=st.integers(min_value=0, max_value=2**32),
    max_argument_bytes=st.integers(min_value=16, max_value=64),
)
@example(attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": ["a", "b"],
                     "gen_ai.tool.call.arguments": "é" * 40}, resource={}, sampled=True, status="ok",
         start=0, end=1, dropped=0, max_argument_bytes=17)
@example(attributes={"openinference.span.kind": "TOOL", "tool.name": math.nan, "input.value": [None, 1]},
         resource={"session.id": 5}, sampled=False, status="error", start=2**64 - 1, end=None, dropped=1,
         max_argument_bytes=16)
def test_normalizer_with_arbitrary_attribute_values(
    attributes: dict[str, Any], resource: dict[str, Any], sampled: bool, status: Any, start: int,
    end: int | None, dropped: int, max_argument_bytes: int,
) -> None:
    span = NeutralSpan(
        trace_id="ab" * 16, span_id="cd" * 8, name="s", start_time_unix_nano=start, end_time_unix_nano=end,
        sampled=sampled, status_code=status, attributes=attributes, resource_attributes=resource,
        dropped_attributes_count=dropped,
    )
    facts = normalize_span(span)
    e = facts.execution
    if e is not None:
        assert isinstance(e.name, str) and e.name
        assert attributes.get("gen_ai.operation.name") == "execute_tool" or attributes.get(
            "openinference.span.kind") == "TOOL"
    fact = span_fact(span, max_argument_bytes)
    json.dumps(fact, allow_nan=False)
    if e is not None and e.arguments is not None and len(e.arguments.encode()) > max_argument_bytes:
        assert fact["x"][5] == 2 and len(fact["x"][6].encode()) <= max_argument_bytes  # 2 = truncated


# --- control messages --------------------------------------------------------------------------------


@FUZZ
@given(msg=S.control_messages())
def test_control_structured(msg: Any) -> None:
    check_control(msg.SerializeToString())


@FUZZ
@given(msg=S.plausible_expectations())
def test_plausible_expectations_decode_deep(msg: Any) -> None:
    check_control(msg.SerializeToString())


@FUZZ
@given(value=st.one_of(st.binary(max_size=200), S.control_messages().flatmap(
    lambda m: S.mutated_bytes(m.SerializeToString()))))
@example(value=b"")
@example(value=b"\x0a\x80")
def test_control_bytes(value: bytes) -> None:
    check_control(value)


@FUZZ
@given(value=S.control_json_records())
@example(value=b'{"expectation": {"expectationId": "x", "deadline": "315576000001s"}}')
@example(value=b'{"expectation": ' + b"[" * 50_000)
@example(value=b"{\xff")
def test_control_json(value: bytes) -> None:
    check_control(value)


def test_zz_report_what_was_tried() -> None:
    """Not a property: prints how many inputs of each outcome the properties above produced."""
    print("\n[fuzz] outcomes: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
