"""Writes the bad-input corpus (this directory) and its manifest. Deterministic: run it again
after changing it, then update README.md (tests/unit/fuzz/test_bad_inputs_corpus.py checks
that README, manifest and files agree, and that each file decodes to its documented reason).

    .venv/bin/python tests/data/bad_inputs/generate.py
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from google.protobuf.duration_pb2 import Duration
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from collector.wire.gen import common_pb2, control_pb2  # noqa: E402

#: the service settings the corpus is written for (small limits keep the files small)
CONFIG: dict[str, Any] = {"kafka": {"max_record_bytes": 65536}, "limits": {"max_attributes_per_span": 64}}
TRACE = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
TRACE_HEX = TRACE.hex()
SPAN = bytes.fromhex("b7ad6b7169203331")
T0_NS = 1_767_225_600_000_000_000

entries: list[dict[str, Any]] = []


def add(name: str, topic: str, value: bytes, reason: str, what: str, *, encoding: str = "otlp_proto",
        headers: dict[str, str] | None = None) -> None:
    (HERE / name).write_bytes(value)
    entry: dict[str, Any] = {"file": name, "topic": topic, "reason": reason, "what": what}
    if topic == "spans":
        entry["encoding"] = encoding
    if headers:
        entry["headers"] = headers
    entries.append(entry)


def span(trace: bytes = TRACE, span_id: bytes = SPAN, parent: bytes = b"", name: str = "execute_tool search",
         attrs: dict[str, AnyValue] | None = None) -> Span:
    s = Span(trace_id=trace, span_id=span_id, parent_span_id=parent, name=name, start_time_unix_nano=T0_NS,
             end_time_unix_nano=T0_NS + 1_000_000)
    base = {"gen_ai.operation.name": AnyValue(string_value="execute_tool"),
            "gen_ai.tool.name": AnyValue(string_value="search")}
    for k, v in {**base, **(attrs or {})}.items():
        s.attributes.append(KeyValue(key=k, value=v))
    return s


def request(*spans: Span, resource: dict[str, str] | None = None) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    for k, v in {"service.name": "agent", **(resource or {})}.items():
        rs.resource.attributes.append(KeyValue(key=k, value=AnyValue(string_value=v)))
    rs.scope_spans.add().spans.extend(spans)
    return req


def otlp_json(req: ExportTraceServiceRequest) -> dict[str, Any]:
    import base64

    def hexify(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: (base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId") else hexify(v))
                    for k, v in node.items()}
        if isinstance(node, list):
            return [hexify(x) for x in node]
        return node

    return dict(hexify(json_format.MessageToDict(req)))


def expectation(**kw: Any) -> control_pb2.Expectation:
    base: dict[str, Any] = {
        "expectation_id": "bad-input", "tenant": "default", "scorer": "tools",
        "scope": common_pb2.Scope(traces=common_pb2.TraceScope(trace_ids=[TRACE_HEX])),
        "conditions": [control_pb2.Condition(tools_called=control_pb2.ToolsCalled(
            tools=[control_pb2.ToolCallRequirement(name="search")]))],
    }
    base.update(kw)
    return control_pb2.Expectation(**base)


def with_matcher(**matcher: Any) -> control_pb2.Expectation:
    req = control_pb2.ToolCallRequirement(name="search", arguments=[control_pb2.ArgumentMatcher(**matcher)])
    return expectation(conditions=[control_pb2.Condition(tools_called=control_pb2.ToolsCalled(tools=[req]))])


def control(**kw: Any) -> bytes:
    return control_pb2.ControlMessage(**kw).SerializeToString(deterministic=True)


def _ld(field: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (built by hand: the library refuses to build it this deep)."""
    n, varint = len(payload), bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        varint.append(byte | (0x80 if n else 0))
        if not n:
            break
    return bytes([field << 3 | 2]) + bytes(varint) + payload


def deeply_nested_record(depth: int) -> bytes:
    """A one-span record whose attribute "deep" is an AnyValue nested ``depth`` kvlists deep."""
    value = AnyValue(string_value="leaf").SerializeToString()
    for _ in range(depth):  # AnyValue.kvlist_value=6 { KeyValueList.values=1 { key=1, value=2 } }
        value = _ld(6, _ld(1, _ld(1, b"k") + _ld(2, value)))
    span_bytes = span().SerializeToString() + _ld(9, _ld(1, b"deep") + _ld(2, value))  # Span.attributes=9
    return _ld(1, _ld(2, _ld(2, span_bytes)))  # request.resource_spans=1 { scope_spans=2 { spans=2 } }


def build() -> None:
    good = request(span(), span(span_id=bytes.fromhex("00f067aa0ba902b7"), parent=SPAN, name="chat",
                                attrs={"gen_ai.operation.name": AnyValue(string_value="chat")})).SerializeToString()
    p: Callable[..., None] = lambda name, value, reason, what, **kw: add(name, "spans", value, reason, what, **kw)  # noqa: E731

    # --- span records, otlp_proto ------------------------------------------------------------------
    p("proto_garbage.bin", b"\xff\xfe this is not protobuf \x00\x01\x02", "undecodable_protobuf",
      "random bytes")
    p("proto_truncated.bin", good[: len(good) // 2], "undecodable_protobuf",
      "a valid two-span record cut in half")
    p("proto_length_overflow.bin", b"\x0a\xff\xff\xff\xff\x0f", "undecodable_protobuf",
      "field 1 announces a 4 GiB length in a 6-byte record")
    # (a string that is not UTF-8 is no bad input: read as U+FFFD, as the Collector passes it on;
    # tests/unit/collector/test_lenient_decode.py)
    p("proto_deep_nesting.bin", deeply_nested_record(120),
      "undecodable_protobuf", "an attribute value nested 120 kvlists deep (beyond protobuf's recursion limit)")
    p("proto_otlp_json_document.json", json.dumps(otlp_json(request(span()))).encode(), "undecodable_protobuf",
      "an OTLP/JSON record sent to an otlp_proto service")
    p("proto_empty.bin", b"", "no_spans", "an empty record (a valid, empty protobuf message)")
    p("proto_resource_without_spans.bin", request().SerializeToString(), "no_spans",
      "a resource and a scope but no spans")
    p("proto_wrong_wire_type.bin", b"\x08\x01", "no_spans",
      "field 1 (resource_spans) as a varint: skipped as unknown, leaving no spans")
    p("proto_control_message.bin", control(expectation=expectation(expectation_id="smuggled")),
      "undecodable_protobuf",
      "a control-plane Expectation written to the spans topic (never registers anything)")
    p("proto_short_trace_id.bin", request(span(trace=TRACE[:15])).SerializeToString(), "invalid_span",
      "a 15-byte trace id")
    p("proto_zero_trace_id.bin", request(span(trace=bytes(16))).SerializeToString(), "invalid_span",
      "an all-zero trace id")
    p("proto_zero_span_id.bin", request(span(span_id=bytes(8))).SerializeToString(), "invalid_span",
      "an all-zero span id")
    p("proto_bad_parent_span_id.bin", request(span(parent=b"\x01\x02\x03")).SerializeToString(), "invalid_span",
      "a 3-byte parent span id")
    p("proto_too_many_attributes.bin",
      request(span(attrs={f"a{i}": AnyValue(int_value=i) for i in range(63)})).SerializeToString(),
      "too_many_attributes", "65 attributes on one span (limits.max_attributes_per_span=64)")
    p("proto_over_record_limit.bin",
      request(span(attrs={"blob": AnyValue(string_value="x" * 70_000)})).SerializeToString(), "record_too_large",
      "a valid record of ~70 KB (kafka.max_record_bytes=65536)")
    p("proto_invalid_tenant_resource.bin", request(span(), resource={"toolwitness.tenant": "../acme"})
      .SerializeToString(), "invalid_tenant", "resource attribute toolwitness.tenant=\"../acme\"")
    p("proto_tenant_trailing_newline.bin", request(span(), resource={"toolwitness.tenant": "acme\n"})
      .SerializeToString(), "invalid_tenant", "resource attribute toolwitness.tenant=\"acme\\n\"")
    p("proto_invalid_tenant_header.bin", request(span()).SerializeToString(), "invalid_tenant",
      "a valid record with header toolwitness-tenant: \"a:b\" (':' would split Redis keys)",
      headers={"toolwitness-tenant": "a:b"})
    p("proto_empty_tenant_header.bin", request(span()).SerializeToString(), "invalid_tenant",
      "a valid record with an empty toolwitness-tenant header", headers={"toolwitness-tenant": ""})

    # --- span records, otlp_json -------------------------------------------------------------------
    doc = otlp_json(request(span()))
    j: Callable[..., None] = lambda name, value, reason, what, **kw: add(  # noqa: E731
        name, "spans", value, reason, what, encoding="otlp_json", **kw)
    j("json_not_json.txt", b"this is { not json", "invalid_json", "text that is not JSON")
    j("json_protobuf_record.bin", good, "invalid_json", "an otlp_proto record sent to an otlp_json service")
    j("json_deep_nesting.json", b'{"resourceSpans": ' + b"[" * 5_000 + b"]" * 5_000 + b"}", "invalid_json",
      "arrays nested 5,000 deep")
    j("json_not_otlp.json", b'{"hello": "world"}', "not_otlp_json", "a JSON object without resourceSpans")
    j("json_top_level_array.json", b"[1, 2, 3]", "not_otlp_json", "a JSON array")
    j("json_wrong_types.json", b'{"resourceSpans": 5}', "not_otlp_json", "resourceSpans is a number")
    nan = json.dumps(doc).replace('"startTimeUnixNano": "', '"startTimeUnixNano": NaN, "x": "', 1)
    j("json_nan_timestamp.json", nan.encode(), "not_otlp_json", "startTimeUnixNano is NaN")
    j("json_lone_surrogate.json", json.dumps(doc).replace('"name": "execute_tool search"',
                                                          '"name": "\\ud800"', 1).encode(),
      "not_otlp_json", "a span name holding a lone UTF-16 surrogate escape")
    j("json_bad_hex_trace_id.json", json.dumps(doc).replace(f'"traceId": "{TRACE_HEX}"',
                                                            '"traceId": "zz' + TRACE_HEX[2:] + '"', 1).encode(),
      "invalid_id", "a trace id that is not hex")
    j("json_no_spans.json", b'{"resourceSpans": []}', "no_spans", "an empty resourceSpans list")
    j("json_short_trace_id.json", json.dumps(otlp_json(request(span(trace=TRACE[:15])))).encode(), "invalid_span",
      "a 15-byte trace id")
    j("json_invalid_tenant_resource.json",
      json.dumps(otlp_json(request(span(), resource={"toolwitness.tenant": "tenant with spaces"}))).encode(),
      "invalid_tenant", "resource attribute toolwitness.tenant=\"tenant with spaces\"")

    # --- control records ---------------------------------------------------------------------------
    c: Callable[..., None] = lambda name, value, reason, what: add(name, "control", value, reason, what)  # noqa: E731
    c("control_garbage.bin", b"\x00\xffgarbage", "undecodable_control", "random bytes")
    c("control_json_garbage.json", b"{not json", "undecodable_control", "starts like JSON, is not")
    c("control_json_unknown_field.json", b'{"expectation": {"expectationId": "x", "verdict": "TRUE"}}',
      "undecodable_control", "protobuf-JSON with a field the schema does not have")
    c("control_json_deep_nesting.json", b'{"expectation": ' + b"[" * 5_000 + b"}", "undecodable_control",
      "JSON nested 5,000 deep")
    c("control_span_record.bin", good, "undecodable_control", "an OTLP span record written to the control topic")
    c("control_empty.bin", b"", "empty_control", "an empty record: no expectation, completion or cancel")
    c("control_expectation_without_id.bin", control(expectation=expectation(expectation_id="")),
      "invalid_expectation", "an expectation without expectation_id")
    c("control_expectation_uppercase_trace_id.bin", control(expectation=expectation(
        scope=common_pb2.Scope(traces=common_pb2.TraceScope(trace_ids=[TRACE_HEX.upper()])))),
      "invalid_expectation", "a trace scope with an upper-case trace id")
    c("control_expectation_invalid_regex.bin", control(expectation=with_matcher(path="$.q", regex="([a-z")),
      "invalid_expectation", "an argument matcher with the regex \"([a-z\"")
    c("control_expectation_invalid_jsonpath.bin", control(expectation=with_matcher(path="q[", regex="x")),
      "invalid_expectation", "an argument matcher whose path does not start with $")
    c("control_expectation_invalid_equals_json.bin", control(expectation=with_matcher(path="$", equals_json="{x")),
      "invalid_expectation", "an equals matcher whose value is not JSON")
    c("control_expectation_deep_equals_json.bin",
      control(expectation=with_matcher(path="$", equals_json="[" * 5_000)), "invalid_expectation",
      "an equals matcher nested 5,000 deep (used to escape as RecursionError)")
    c("control_expectation_deadline_overflow.bin",
      control(expectation=expectation(deadline=Duration(seconds=2**62))), "invalid_expectation",
      "a deadline of 2^62 seconds (used to escape as OverflowError)")
    c("control_expectation_bad_status.bin", control(expectation=expectation(conditions=[control_pb2.Condition(
        tools_called=control_pb2.ToolsCalled(tools=[control_pb2.ToolCallRequirement(name="search",
                                                                                    status="maybe")]))])),
      "invalid_expectation", "a tool requirement with status \"maybe\"")
    c("control_expectation_empty_tools.bin", control(expectation=expectation(conditions=[control_pb2.Condition(
        tools_called=control_pb2.ToolsCalled())])), "invalid_expectation",
      "a tools_called condition listing no tools")
    c("control_expectation_without_scope.bin", control(expectation=expectation(scope=common_pb2.Scope())),
      "invalid_scope", "an expectation without a scope")
    c("control_expectation_condition_without_kind.bin",
      control(expectation=expectation(conditions=[control_pb2.Condition()])), "invalid_condition",
      "a condition with no kind set")
    c("control_expectation_matcher_without_kind.bin", control(expectation=with_matcher(path="$.q")),
      "invalid_matcher", "an argument matcher with no match kind")
    c("control_expectation_unknown_scorer.bin", control(expectation=expectation(scorer="no_such_tree")),
      "unknown_scorer", "an expectation naming a scorer tree the service does not have")
    c("control_expectation_invalid_tenant.bin", control(expectation=expectation(tenant="a:b")), "invalid_tenant",
      "an expectation for tenant \"a:b\"")
    c("control_marker_without_target.bin", control(completion=control_pb2.CompletionMarker(tenant="default")),
      "invalid_marker", "a completion marker naming neither trace nor session")
    c("control_marker_bad_trace_id.bin", control(completion=control_pb2.CompletionMarker(trace_id="xyz")),
      "invalid_marker", "a completion marker for trace id \"xyz\"")
    c("control_marker_invalid_tenant.bin",
      control(completion=control_pb2.CompletionMarker(tenant="acme\n", trace_id=TRACE_HEX)), "invalid_tenant",
      "a completion marker for tenant \"acme\\n\"")
    c("control_cancel_invalid_tenant.bin",
      control(cancel=control_pb2.CancelExpectation(tenant="../x", expectation_id="bad-input")), "invalid_tenant",
      "a cancellation for tenant \"../x\"")


def main() -> None:
    for old in HERE.iterdir():
        if old.name not in ("README.md", "generate.py", "manifest.json") and old.is_file():
            old.unlink()
    build()
    manifest = {"config": CONFIG, "entries": entries}
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {len(entries)} files and manifest.json to {HERE}")


if __name__ == "__main__":
    main()
