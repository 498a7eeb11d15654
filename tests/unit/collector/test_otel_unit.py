"""Unit tests (no services) for the SDK-side pieces: span counting, splitting by trace, building
control expectations, Kafka security settings, the sidecar config and exporter failure handling."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as PbResource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, Decision, Sampler, SamplingResult
from opentelemetry.trace import format_trace_id
from pydantic import ValidationError

from collector.boundary.streaming import StreamingToolScorer
from collector.client import ToolwitnessClient, build_expectation, kafka_security_kwargs, matcher_to_proto
from collector.config import KafkaSecurityConfig
from collector.otel import KafkaSpanExporter, SpanCountingProcessor, split_by_trace, split_by_trace_with_rejects
from collector.receivers.otlp_grpc import SidecarConfig, create_sidecar
from collector.wire.convert import expectation_from_proto
from collector.wire.gen import control_pb2
from scoring.models import (
    ArgumentMatcher,
    MessageScorable,
    PayloadPropagated,
    ScoringExpectation,
    SessionScorable,
    ToolCallRequirement,
    ToolsCalled,
    ToolSequence,
    TraceScorable,
)

# --------------------------------------------------------------------------------------------------
# SpanCountingProcessor
# --------------------------------------------------------------------------------------------------


def _provider(**kw: object) -> TracerProvider:
    return TracerProvider(shutdown_on_exit=False, **kw)  # type: ignore[arg-type]


def test_span_counting_processor_counts_recorded_spans_per_trace_from_their_start() -> None:
    provider = _provider()
    counter = SpanCountingProcessor()
    provider.add_span_processor(counter)
    tracer = provider.get_tracer("tw.unit")

    with tracer.start_as_current_span("root-a") as root_a:
        with tracer.start_as_current_span("child-1"):
            pass
        with tracer.start_as_current_span("child-2"):
            pass
        trace_a = format_trace_id(root_a.get_span_context().trace_id)
        # The root is still open: it counts (a marker sent now claims it, so it must arrive).
        assert counter.count(trace_a) == 3
    assert counter.count(trace_a) == 3

    with tracer.start_as_current_span("root-b") as root_b:
        trace_b = format_trace_id(root_b.get_span_context().trace_id)
    assert counter.count(trace_b) == 1
    assert counter.count(trace_a) == 3
    assert counter.count("f" * 32) is None  # never recorded: no count to claim

    # Many threads ending spans of one trace: no lost updates.
    with tracer.start_as_current_span("root-c") as root_c:
        ctx = root_c.get_span_context()
        trace_c = format_trace_id(ctx.trace_id)
        from opentelemetry import trace as trace_api

        parent = trace_api.set_span_in_context(root_c)

        def work() -> None:
            for _ in range(50):
                tracer.start_span("worker", context=parent).end()

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert counter.count(trace_c) == 8 * 50 + 1

    counter.forget(trace_a)
    assert counter.count(trace_a) is None
    assert counter.pop(trace_b) == 1
    assert counter.count(trace_b) is None and counter.pop(trace_b) is None
    provider.shutdown()


def test_span_counting_processor_ignores_unsampled_spans() -> None:
    provider = _provider(sampler=ALWAYS_OFF)
    counter = SpanCountingProcessor()
    provider.add_span_processor(counter)
    with provider.get_tracer("tw.unit").start_as_current_span("dropped") as span:
        trace_id = format_trace_id(span.get_span_context().trace_id)
    assert counter.count(trace_id) is None  # not recorded at all: no processor sees it
    provider.shutdown()


class _RecordOnly(Sampler):
    """Records 'exfiltrate' spans without sampling them (no exporter receives them)."""

    def should_sample(self, parent_context: Any, trace_id: int, name: str, *args: Any, **kwargs: Any) -> SamplingResult:
        return SamplingResult(Decision.RECORD_ONLY if name == "exfiltrate" else Decision.RECORD_AND_SAMPLE)

    def get_description(self) -> str:
        return "record-only exfiltrate"


def test_a_recorded_but_unsampled_span_counts_so_the_marker_is_never_met() -> None:
    # The tool ran; its span is recorded, never exported. Counting it keeps the trace incomplete
    # (its marker claims a span that never arrives): UNDETERMINED, where it used to be FALSE.
    provider = _provider(sampler=_RecordOnly())
    counter = SpanCountingProcessor()
    exported = InMemorySpanExporter()
    provider.add_span_processor(counter)
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracer = provider.get_tracer("tw.unit")
    with tracer.start_as_current_span("agent") as root:
        with tracer.start_as_current_span("exfiltrate"):
            pass
        trace_id = format_trace_id(root.get_span_context().trace_id)
    assert counter.count(trace_id) == 2 and len(exported.get_finished_spans()) == 1
    provider.shutdown()


# --------------------------------------------------------------------------------------------------
# split_by_trace
# --------------------------------------------------------------------------------------------------


def _attr(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _span(trace: int, span: int, name: str) -> Span:
    return Span(trace_id=trace.to_bytes(16, "big"), span_id=span.to_bytes(8, "big"), name=name)


def test_split_by_trace_keeps_resources_scopes_and_puts_each_span_in_its_trace() -> None:
    t1, t2, t3 = 0xA1, 0xB2, 0xC3
    request = ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource=PbResource(attributes=[_attr("service.name", "agent-1"), _attr("toolwitness.tenant", "acme")]),
                schema_url="https://schema/r1",
                scope_spans=[
                    ScopeSpans(
                        scope=InstrumentationScope(name="scope-x", version="1"),
                        schema_url="https://schema/s1",
                        spans=[_span(t1, 1, "a1"), _span(t2, 2, "b1"), _span(t1, 3, "a2")],
                    ),
                    ScopeSpans(scope=InstrumentationScope(name="scope-y"), spans=[_span(t1, 4, "a3")]),
                ],
            ),
            ResourceSpans(
                resource=PbResource(attributes=[_attr("service.name", "agent-2")]),
                scope_spans=[
                    ScopeSpans(
                        scope=InstrumentationScope(name="scope-z"),
                        spans=[
                            _span(t3, 5, "c1"),
                            _span(t2, 6, "b2"),
                            Span(trace_id=bytes(16), span_id=(7).to_bytes(8, "big"), name="zero-trace"),
                            Span(trace_id=b"\x01" * 8, span_id=(8).to_bytes(8, "big"), name="short-trace"),
                            Span(trace_id=(t3).to_bytes(16, "big"), span_id=bytes(8), name="zero-span"),
                        ],
                    )
                ],
            ),
        ]
    )
    before = request.SerializeToString(deterministic=True)

    parts, rejected = split_by_trace_with_rejects(request)
    assert rejected == 3
    assert split_by_trace(request) == parts
    assert request.SerializeToString(deterministic=True) == before, "the input must not be modified"

    key1, key2, key3 = (t.to_bytes(16, "big").hex() for t in (t1, t2, t3))
    assert list(parts) == [key1, key2, key3]  # order of first appearance
    assert all(len(k) == 32 and k == k.lower() for k in parts)

    def layout(req: ExportTraceServiceRequest) -> list[tuple[str, str, list[tuple[str, list[str]]]]]:
        return [
            (
                {kv.key: kv.value.string_value for kv in rs.resource.attributes}["service.name"],
                rs.schema_url,
                [(ss.scope.name, [s.name for s in ss.spans]) for ss in rs.scope_spans],
            )
            for rs in req.resource_spans
        ]

    assert layout(parts[key1]) == [("agent-1", "https://schema/r1", [("scope-x", ["a1", "a2"]), ("scope-y", ["a3"])])]
    assert layout(parts[key2]) == [
        ("agent-1", "https://schema/r1", [("scope-x", ["b1"])]),
        ("agent-2", "", [("scope-z", ["b2"])]),
    ]
    assert layout(parts[key3]) == [("agent-2", "", [("scope-z", ["c1"])])]

    # Full resource and scope content is kept, not just the names.
    rs = parts[key1].resource_spans[0]
    assert rs.resource == request.resource_spans[0].resource
    assert rs.scope_spans[0].scope == request.resource_spans[0].scope_spans[0].scope
    assert rs.scope_spans[0].schema_url == "https://schema/s1"
    for key, part in parts.items():
        for r in part.resource_spans:
            for ss in r.scope_spans:
                assert all(s.trace_id.hex() == key for s in ss.spans)
    total = sum(len(ss.spans) for p in parts.values() for r in p.resource_spans for ss in r.scope_spans)
    assert total == 6


def test_split_by_trace_on_sdk_encoded_spans() -> None:
    memory = InMemorySpanExporter()
    provider = _provider(resource=Resource.create({"service.name": "tw-unit", "deployment.environment": "test"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("tw.unit", "0.1")
    ids = []
    for t in range(3):
        with tracer.start_as_current_span(f"root-{t}") as root:
            ids.append(format_trace_id(root.get_span_context().trace_id))
            for c in range(t + 1):
                with tracer.start_as_current_span(f"tool-{t}-{c}") as child:
                    child.set_attribute("gen_ai.tool.name", f"tool_{c}")
    spans = memory.get_finished_spans()
    parts = split_by_trace(encode_spans(spans))
    assert sorted(parts) == sorted(ids)
    for t, trace_id in enumerate(ids):
        (rs,) = parts[trace_id].resource_spans
        attrs = {kv.key: kv.value.string_value for kv in rs.resource.attributes}
        assert attrs["service.name"] == "tw-unit" and attrs["deployment.environment"] == "test"
        (ss,) = rs.scope_spans
        assert (ss.scope.name, ss.scope.version) == ("tw.unit", "0.1")
        assert sorted(s.name for s in ss.spans) == sorted([f"root-{t}"] + [f"tool-{t}-{c}" for c in range(t + 1)])
    provider.shutdown()


# --------------------------------------------------------------------------------------------------
# Expectations: scoring models -> control_pb2 -> scoring models
# --------------------------------------------------------------------------------------------------

TRACE_1 = "0af7651916cd43dd8448eb211c80319c"
TRACE_2 = "4bf92f3577b34da6a3ce929d0e0e4736"

RICH = ScoringExpectation(
    conditions=(
        ToolsCalled(
            tools=(
                ToolCallRequirement(name="search_flights"),
                ToolCallRequirement(
                    name="book_flight",
                    arguments=(
                        ArgumentMatcher(path="$.passenger", equals={"name": "Ada", "tags": ["vip", 1, 2.5, None]}),
                        ArgumentMatcher(path="$.note", equals=None),
                        ArgumentMatcher(path="$.flight", regex=r"^LH\d{3,4}$"),
                        ArgumentMatcher(path="$.price", minimum=10.5, maximum=900),
                        ArgumentMatcher(path="$.seats", minimum=1),
                        ArgumentMatcher(path="$.budget", maximum=1e6),
                        ArgumentMatcher(path="$.class", one_of=("economy", "business", 3, {"k": [1]})),
                    ),
                    status="ok",
                    min_count=2,
                    max_count=3,
                ),
                ToolCallRequirement(name="refund", status="error", max_count=1),
            )
        ),
        ToolSequence(tools=("search_flights", "book_flight"), mode="exact"),
        ToolSequence(tools=("a",)),
        PayloadPropagated(canaries=("CANARY-123",), target_tools=("send_email",)),
    ),
    objective="book the cheapest flight",
)


@pytest.mark.parametrize(
    "scope",
    [
        TraceScorable(trace_ids=(TRACE_1, TRACE_2)),
        SessionScorable(session_id="conv-42"),
        MessageScorable(message_id="m-1", conversation_id="conv-42", trace_ids=(TRACE_1,), response_text="Booked."),
    ],
    ids=["trace", "session", "message"],
)
def test_expectation_round_trips_through_control_proto(
    scope: TraceScorable | SessionScorable | MessageScorable,
) -> None:
    msg = build_expectation(
        expectation_id="exp-1",
        tenant="acme",
        scope=scope,
        expectation=RICH,
        scorer="strict_tools",
        deadline=timedelta(seconds=90),
        labels={"suite": "unit"},
    )
    # Through the wire as a control record.
    wire = control_pb2.ControlMessage(expectation=msg).SerializeToString()
    back = control_pb2.ControlMessage.FromString(wire).expectation
    registered = expectation_from_proto(back, default_tenant="default", default_deadline_s=300, now_ms=1_000_000)
    assert registered.expectation == RICH
    assert registered.scope == scope
    assert registered.tenant == "acme"
    assert registered.scorer == "strict_tools"
    assert registered.deadline_ms - registered.created_ms == 90_000
    assert dict(back.labels) == {"suite": "unit"}
    assert back.created_at.seconds > 0


def test_matchers_travel_as_canonical_json() -> None:
    m = matcher_to_proto(ArgumentMatcher(path="$.x", equals={"b": 1, "a": "é"}))
    assert m.equals_json == '{"a":"é","b":1}'
    m = matcher_to_proto(ArgumentMatcher(one_of=({"z": 0, "y": [1]}, "s")))
    assert list(m.one_of.values_json) == ['{"y":[1],"z":0}', '"s"']
    m = matcher_to_proto(ArgumentMatcher(minimum=3))
    assert m.range.HasField("min") and not m.range.HasField("max")
    m = matcher_to_proto(ArgumentMatcher(path="$.n", equals=None))
    assert m.WhichOneof("match") == "equals_json" and m.equals_json == "null"


def test_minimal_expectation_and_bad_arguments() -> None:
    simple = ScoringExpectation(conditions=(ToolsCalled(tools=(ToolCallRequirement(name="t"),)),))
    scope = TraceScorable(trace_ids=(TRACE_1,))
    msg = build_expectation(expectation_id="e", tenant="t", scope=scope, expectation=simple)
    back = expectation_from_proto(msg, default_tenant="x", default_deadline_s=1, now_ms=0)
    # no deadline given: none is sent, the service's default applies
    assert not msg.HasField("deadline")
    assert back.expectation == simple and back.scorer == "tools" and back.deadline_ms == 1_000
    with pytest.raises(ValueError, match="deadline"):
        build_expectation(
            expectation_id="e", tenant="t", scope=TraceScorable(trace_ids=(TRACE_1,)), expectation=simple,
            deadline=timedelta(0),
        )
    with pytest.raises(ValueError, match="expectation_id"):
        build_expectation(expectation_id="", tenant="t", scope=TraceScorable(trace_ids=(TRACE_1,)), expectation=simple)


# --------------------------------------------------------------------------------------------------
# Kafka security settings, sidecar config
# --------------------------------------------------------------------------------------------------


def test_kafka_security_kwargs() -> None:
    assert kafka_security_kwargs(None) == {}
    assert kafka_security_kwargs(KafkaSecurityConfig()) == {}
    sasl = KafkaSecurityConfig(protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512")
    with pytest.raises(ValueError, match="TOOLWITNESS_KAFKA_SASL_PASSWORD") as info:
        kafka_security_kwargs(sasl, env={"TOOLWITNESS_KAFKA_SASL_USERNAME": "svc"})
    assert "svc" not in str(info.value)
    kw = kafka_security_kwargs(
        sasl, env={"TOOLWITNESS_KAFKA_SASL_USERNAME": "svc", "TOOLWITNESS_KAFKA_SASL_PASSWORD": "pw"}
    )
    assert kw == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "svc",
        "sasl_plain_password": "pw",
    }
    with pytest.raises(ValueError, match="sasl_mechanism"):
        kafka_security_kwargs(KafkaSecurityConfig(protocol="SASL_SSL"), env={})
    kw = kafka_security_kwargs(KafkaSecurityConfig(protocol="SSL"))
    assert kw["security_protocol"] == "SSL" and kw["ssl_context"] is not None


def test_sidecar_config_and_token_from_env() -> None:
    assert SidecarConfig().listen == "127.0.0.1:4317"
    with pytest.raises(ValidationError):
        SidecarConfig(tls_certfile="cert.pem")
    with pytest.raises(ValidationError):
        SidecarConfig(listen="4317")
    with pytest.raises(ValidationError):
        SidecarConfig(unknown="x")  # type: ignore[call-arg]
    assert not create_sidecar(SidecarConfig(), env={}).auth_required
    assert create_sidecar(SidecarConfig(bearer_token_env="TW_TOKEN"), env={"TW_TOKEN": "t0k"}).auth_required
    assert not create_sidecar(SidecarConfig(bearer_token_env="TW_TOKEN"), env={"TW_TOKEN": ""}).auth_required


# --------------------------------------------------------------------------------------------------
# KafkaSpanExporter failure handling (no broker: nothing listens on the port)
# --------------------------------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_exporter_failure_is_returned_not_raised_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    memory = InMemorySpanExporter()
    provider = _provider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("tw.unit").start_as_current_span("s"):
        pass
    spans = memory.get_finished_spans()

    exporter = KafkaSpanExporter(bootstrap_servers=f"127.0.0.1:{_free_port()}", timeout_s=3.0)
    with caplog.at_level(logging.DEBUG, logger="collector.otel"):
        assert exporter.export(spans) is SpanExportResult.FAILURE
        assert exporter.export(spans) is SpanExportResult.FAILURE
    warnings = [r for r in caplog.records if r.name == "collector.otel" and r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert exporter.export([]) is SpanExportResult.SUCCESS
    assert exporter.force_flush(1000) is True
    exporter.shutdown()
    exporter.shutdown()  # idempotent
    assert exporter.force_flush() is True
    assert exporter.export(spans) is SpanExportResult.FAILURE
    provider.shutdown()


def test_exporter_shutdown_without_use() -> None:
    exporter = KafkaSpanExporter(bootstrap_servers="127.0.0.1:1")
    exporter.shutdown()
    exporter.shutdown()


async def test_a_trace_id_given_as_the_otel_int_is_refused_saying_how_to_format_it() -> None:
    # SpanContext.trace_id is an int; the counter and the client key traces by 32-hex text. They
    # failed with "'int' object has no attribute 'lower'" / "expected string or bytes-like object".
    provider = TracerProvider()
    counter = SpanCountingProcessor()
    provider.add_span_processor(counter)
    with provider.get_tracer("t").start_as_current_span("agent") as root:
        pass
    raw = root.get_span_context().trace_id
    for call in (counter.count, counter.pop, counter.forget):
        with pytest.raises(TypeError, match=r"format_trace_id\(span.get_span_context\(\).trace_id\)"):
            call(raw)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="format_trace_id"):
        await ToolwitnessClient(bootstrap_servers="127.0.0.1:1").mark_complete(raw, span_count=1)  # type: ignore[arg-type]
    assert counter.count(format_trace_id(raw)) == 1 and counter.count(format_trace_id(raw).upper()) == 1
    provider.shutdown()


async def test_a_deadline_or_timeout_of_the_wrong_kind_says_which_kind() -> None:
    # expect's deadline is a timedelta, wait_for's timeout a number of seconds: the other one
    # failed with "'<=' not supported between instances of 'int' and 'datetime.timedelta'".
    tw = ToolwitnessClient(bootstrap_servers="127.0.0.1:1")
    scope = TraceScorable(trace_ids=("ab" * 16,))
    called = [ToolsCalled(tools=(ToolCallRequirement(name="t"),))]
    with pytest.raises(TypeError, match=r"deadline must be a datetime.timedelta, e.g. timedelta\(seconds=30\)"):
        await tw.expect(scope, conditions=called, deadline=30)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"timeout is in seconds .*total_seconds\(\)"):
        await tw.wait_for("e1", timeout=timedelta(seconds=30))  # type: ignore[arg-type]
    for kwargs in ({"deadline": 30}, {"wait_margin": 5.0}):
        with pytest.raises(TypeError, match=r"must be a datetime\.timedelta"):
            StreamingToolScorer(tw, **kwargs)  # type: ignore[arg-type]
