"""Record decoding (bad input → reasons) and trace coverage from state, table-driven."""

import json

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from collector.config import CompletionConfig, ServiceConfig
from collector.otel import KafkaSpanExporter
from collector.processors.decide import trace_coverage
from collector.processors.trace_state import TraceState
from collector.receivers.decode import (
    RecordDecodeError,
    decode_span_facts,
    decode_span_record,
    otlp_json_bytes,
    parse_json_request,
)
from scoring.models import CompletionSource

TRACE = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")


def _request(*spans: Span, resource: dict[str, str] | None = None) -> ExportTraceServiceRequest:
    rs = ResourceSpans(scope_spans=[ScopeSpans(spans=list(spans))])
    for k, v in (resource or {}).items():
        rs.resource.attributes.append(KeyValue(key=k, value=AnyValue(string_value=v)))
    return ExportTraceServiceRequest(resource_spans=[rs])


def _span(span_id: int = 1, trace: bytes = TRACE, n_attrs: int = 1) -> Span:
    s = Span(trace_id=trace, span_id=span_id.to_bytes(8, "big"), name="s", start_time_unix_nano=1, end_time_unix_nano=2)
    s.attributes.append(KeyValue(key="gen_ai.operation.name", value=AnyValue(string_value="execute_tool")))
    s.attributes.append(KeyValue(key="gen_ai.tool.name", value=AnyValue(string_value="t")))
    for i in range(n_attrs - 2):
        s.attributes.append(KeyValue(key=f"k{i}", value=AnyValue(int_value=i)))
    return s


CFG = ServiceConfig()


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        pytest.param(b"\xff\xfe not protobuf at all", "undecodable_protobuf", id="garbage"),
        pytest.param(_request(_span()).SerializeToString()[:-7], "undecodable_protobuf", id="truncated"),
        pytest.param(b"", "no_spans", id="empty"),
        pytest.param(_request(_span(trace=b"\x01" * 15)).SerializeToString(), "invalid_span", id="short-trace-id"),
        pytest.param(_request(_span(n_attrs=2000)).SerializeToString(), "too_many_attributes", id="2000-attributes"),
        pytest.param(b"x" * (CFG.kafka.max_record_bytes + 1), "record_too_large", id="too-large"),
    ],
)
def test_bad_records_name_their_reason(value: bytes, reason: str) -> None:
    with pytest.raises(RecordDecodeError) as err:
        decode_span_record(value, [], CFG)
    assert err.value.reason == reason


def test_bad_span_does_not_take_good_spans_with_it() -> None:
    req = _request(_span(1), _span(2, trace=b"\x01" * 15))
    out = decode_span_record(req.SerializeToString(), [], CFG)
    assert [s.span_id for _, s in out.spans] == [(1).to_bytes(8, "big").hex()]
    assert [r[2] for r in out.rejected] == ["invalid_span"]


def test_a_span_time_beyond_int64_is_refused_on_both_decode_paths() -> None:
    # 2**64-1 ns used to be stored, then overflow the observation protobuf and stop the poll loop.
    bad = _span(2)
    bad.end_time_unix_nano = 2**64 - 1
    req = _request(_span(1), bad).SerializeToString()
    out = decode_span_record(req, [], CFG)
    assert [s.span_id for _, s in out.spans] == [(1).to_bytes(8, "big").hex()]
    assert [(r[2], "beyond int64" in r[3]) for r in out.rejected] == [("invalid_span", True)]
    facts = decode_span_facts(req, [], CFG, CFG.limits.max_argument_bytes)
    assert len(facts.facts) == 1 and [r[2] for r in facts.rejected] == ["invalid_span"]


def test_tenant_header_wins_over_resource_attribute() -> None:
    req = _request(_span(), resource={"toolwitness.tenant": "from-resource"})
    assert decode_span_record(req.SerializeToString(), [], CFG).spans[0][0] == "from-resource"
    out = decode_span_record(req.SerializeToString(), [("toolwitness-tenant", b"from-header")], CFG)
    assert out.spans[0][0] == "from-header"
    with pytest.raises(RecordDecodeError, match="invalid_tenant"):
        decode_span_record(req.SerializeToString(), [("toolwitness-tenant", b"a{b}")], CFG)


def test_otlp_json_with_hex_ids() -> None:
    cfg = ServiceConfig.model_validate({"kafka": {"encoding": "otlp_json"}})
    doc = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": TRACE.hex(),
                                "spanId": "00f067aa0ba902b7",
                                "name": "x",
                                "startTimeUnixNano": "1",
                                "endTimeUnixNano": "2",
                                "attributes": [{"key": "gen_ai.tool.name", "value": {"stringValue": "t"}}],
                            }
                        ]
                    }
                ]
            }
        ]
    }
    out = decode_span_record(json.dumps(doc).encode(), [], cfg)
    assert out.spans[0][1].trace_id == TRACE.hex()
    with pytest.raises(RecordDecodeError, match="not_otlp_json"):
        decode_span_record(b'{"hello": "world"}', [], cfg)


def _state(**kw: object) -> TraceState:
    return TraceState(**kw)  # type: ignore[arg-type]


C = CompletionConfig(allowed_lateness_ms=100)
CI = CompletionConfig(mode="inferred", allowed_lateness_ms=100)


def test_otlp_json_bytes_is_otlp_json_the_receiver_reads_back() -> None:
    parent = _span(span_id=7)
    child = _span(span_id=8)
    child.parent_span_id = parent.span_id
    child.kind = Span.SPAN_KIND_CLIENT
    req = _request(parent, child, resource={"service.name": "agent"})
    doc = json.loads(otlp_json_bytes(req))
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][1]
    # OTLP/JSON: ids as hex (not protobuf JSON's base64), enums as integers, lowerCamelCase names
    ids = (span["traceId"], span["spanId"], span["parentSpanId"])
    assert ids == (TRACE.hex(), "0000000000000008", "0000000000000007")
    assert span["kind"] == Span.SPAN_KIND_CLIENT
    back, rejected = parse_json_request(otlp_json_bytes(req))
    assert rejected == []
    assert back == req


def test_the_span_exporter_refuses_an_encoding_the_service_cannot_read() -> None:
    with pytest.raises(ValueError, match=r"encoding must be 'otlp_proto' or 'otlp_json'.*got 'json'"):
        KafkaSpanExporter(bootstrap_servers="127.0.0.1:1", encoding="json")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("state", "wm", "cfg", "reasons", "source"),
    [
        pytest.param(None, 0, C, {"awaiting_completion"}, None, id="no-state"),
        pytest.param(_state(span_count=2, marker_count=2), 0, C, set(), CompletionSource.MARKER, id="count-met"),
        pytest.param(_state(span_count=1, marker_count=2), 0, C, {"awaiting_completion"}, None, id="count-short"),
        pytest.param(
            _state(span_count=3, marker_count=2),
            0,
            C,
            {"late_span_after_completion", "awaiting_completion"},
            None,
            id="count-exceeded",
        ),
        pytest.param(
            _state(span_count=2, marker_at_ms=1000),
            1099,
            C,
            {"awaiting_completion"},
            None,
            id="marker-no-count-before-watermark",
        ),
        pytest.param(
            _state(span_count=2, marker_at_ms=1000),
            1100,
            C,
            set(),
            CompletionSource.WATERMARK,
            id="marker-no-count-after-watermark",
        ),
        pytest.param(
            _state(span_count=0, marker_at_ms=1000),
            9999,
            C,
            {"awaiting_completion"},
            None,
            id="marker-no-count-no-span-seen",
        ),
        pytest.param(_state(span_count=0, marker_count=0), 0, C, set(), CompletionSource.MARKER, id="count-0-explicit"),
        pytest.param(
            _state(span_count=2, root_end_ms=1000),
            5000,
            C,
            {"awaiting_completion"},
            None,
            id="root-ended-but-marker-mode",
        ),
        pytest.param(
            _state(span_count=2, root_end_ms=1000), 1100, CI, set(), CompletionSource.WATERMARK, id="inferred"
        ),
        pytest.param(
            _state(span_count=2, root_end_ms=1000, orphans=1),
            9999,
            CI,
            {"orphan_parent", "awaiting_completion"},
            None,
            id="inferred-with-orphan",
        ),
        pytest.param(
            _state(span_count=2, marker_count=2, reasons={"span_unsampled"}),
            0,
            C,
            {"span_unsampled"},
            None,
            id="unsampled-blocks-completion",
        ),
    ],
)
def test_trace_coverage(
    state: TraceState | None, wm: int, cfg: CompletionConfig, reasons: set[str], source: CompletionSource | None
) -> None:
    assert trace_coverage(state, wm, cfg) == (reasons, source)
