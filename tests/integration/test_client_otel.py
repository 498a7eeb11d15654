"""The producer-side pieces against the real broker: the OTel SDK exporter, the control-plane
client, and the OTLP/gRPC sidecar.

* a real TracerProvider + SimpleSpanProcessor(KafkaSpanExporter) puts spans on the spans topic,
  one record per trace per export, keyed by trace id, with the tenant header;
* expect() / mark_complete() / mark_session_complete() / cancel() write control records that
  decode to exactly what was asked;
* the sidecar receives spans from the real OTLP/gRPC exporter and forwards them keyed by
  trace id; invalid spans are reported as partial success; with a bearer token, calls without
  it are refused;
* wait_for() returns a score event produced here (standing in for the service) and drops an
  identical re-send (duplicates == 1); get_observation() verifies the content hash;
* scores() subscribes when called; a broker error in the scores reader is retried, any other
  error that ends it reaches every waiter and stream;
* start() fails within timeout_s against a broker that never answers, naming the step and the
  servers, and (create_topics=False) refuses a missing scores topic instead of auto-creating it.

Every wait ends on a condition (a record, an offset) under a timeout, never on a sleep.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaTimeoutError
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as OtlpResource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import format_trace_id
from pydantic import ValidationError

from collector.client import ToolwitnessClient, TopicSetupError, ensure_topics
from collector.config import KafkaConfig, TopicsConfig
from collector.otel import TENANT_HEADER, KafkaSpanExporter, SpanCountingProcessor
from collector.producer import RecordRefusedError
from collector.receivers.otlp_grpc import SidecarConfig, create_sidecar, run_sidecar
from collector.wire.convert import (
    decode_control,
    encode,
    expectation_from_proto,
    observation_to_proto,
    scope_to_proto,
    score_id_for,
)
from collector.wire.gen import common_pb2, score_pb2
from scoring.models import (
    Acquisition,
    ArgumentMatcher,
    Coverage,
    Observation,
    ScoringExpectation,
    SessionScorable,
    ToolCallRequirement,
    ToolExecution,
    ToolsCalled,
    ToolSequence,
    TraceScorable,
)
from scoring.models.conditions import Condition
from scoring.models.evidence import CaptureState, CompletionSource
from tests.integration.harness import PROBE_KEY, admin_get, producer_sees_partitions, set_record_limit

pytestmark = pytest.mark.integration

TIMEOUT_S = 60.0
TopicFactory = Callable[..., Awaitable[str]]


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------


@pytest.fixture
async def topics(topic_factory: TopicFactory) -> TopicsConfig:
    """A full, unique set of toolwitness topics for one test (deleted after it)."""
    return TopicsConfig(
        spans=await topic_factory(4),
        control=await topic_factory(1),
        scores=await topic_factory(4),
        observations=await topic_factory(1, configs={"cleanup.policy": "compact"}),
        dlq=await topic_factory(1),
    )


@pytest.fixture
async def client(kafka_bootstrap: str, topics: TopicsConfig) -> AsyncIterator[ToolwitnessClient]:
    async with (
        asyncio.timeout(TIMEOUT_S),
        ToolwitnessClient(bootstrap_servers=kafka_bootstrap, tenant="acme", topics=topics) as tw,
    ):
        yield tw


@pytest.fixture
async def producer(kafka_bootstrap: str) -> AsyncIterator[AIOKafkaProducer]:
    """An idempotent producer for writing score and observation records as the service would."""
    p = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True)
    async with asyncio.timeout(TIMEOUT_S):
        await p.start()
    try:
        yield p
    finally:
        await p.stop()


async def read_records(bootstrap: str, topic: str, n: int) -> list[Any]:
    """Exactly the n records on the topic (all partitions, from the beginning); fails on more."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest", enable_auto_commit=False
    )
    records: list[Any] = []
    async with asyncio.timeout(TIMEOUT_S):
        await consumer.start()
        try:
            while len(records) < n:
                for batch in (await consumer.getmany(timeout_ms=500)).values():
                    records.extend(batch)
            tps = list(consumer.assignment())
            ends = await consumer.end_offsets(tps)
        finally:
            await consumer.stop()
    assert sum(ends.values()) == n == len(records), f"expected {n} records on {topic}, found {sum(ends.values())}"
    return records


def attrs(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None
    return out


def spans_of(request: ExportTraceServiceRequest) -> list[Span]:
    return [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]


def make_agent_spans(provider: TracerProvider) -> dict[str, list[str]]:
    """Two traces of tool spans; returns trace id -> span names."""
    tracer = provider.get_tracer("tw.it.agent", "1.0")
    traces: dict[str, list[str]] = {}
    with tracer.start_as_current_span("invoke_agent") as root:
        tid = format_trace_id(root.get_span_context().trace_id)
        for tool, args in (("search_flights", '{"to":"LIS"}'), ("book_flight", '{"flight":"LH123"}')):
            with tracer.start_as_current_span(f"execute_tool {tool}") as span:
                span.set_attribute("gen_ai.operation.name", "execute_tool")
                span.set_attribute("gen_ai.tool.name", tool)
                span.set_attribute("gen_ai.tool.call.arguments", args)
        traces[tid] = ["execute_tool search_flights", "execute_tool book_flight", "invoke_agent"]
    with tracer.start_as_current_span("invoke_agent") as root:
        tid = format_trace_id(root.get_span_context().trace_id)
        root.set_attribute("gen_ai.conversation.id", "conv-7")
        traces[tid] = ["invoke_agent"]
    return traces


def captured_spans() -> tuple[tuple[ReadableSpan, ...], dict[str, list[str]]]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "tw-it-agent"}), shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    traces = make_agent_spans(provider)
    provider.shutdown()
    return memory.get_finished_spans(), traces


def check_span_records(records: list[Any], traces: dict[str, list[str]]) -> None:
    seen: dict[str, list[str]] = {}
    for r in records:
        key = r.key.decode()
        request = ExportTraceServiceRequest.FromString(r.value)
        for rs in request.resource_spans:
            assert attrs(rs.resource.attributes)["service.name"] == "tw-it-agent"
            for ss in rs.scope_spans:
                assert ss.scope.name == "tw.it.agent"
                for span in ss.spans:
                    assert span.trace_id.hex() == key, "a record carries a span of another trace"
                    seen.setdefault(key, []).append(span.name)
                    if span.name == "execute_tool book_flight":
                        a = attrs(span.attributes)
                        assert a["gen_ai.tool.name"] == "book_flight"
                        assert a["gen_ai.tool.call.arguments"] == '{"flight":"LH123"}'
                        assert a["gen_ai.operation.name"] == "execute_tool"
    assert {k: sorted(v) for k, v in seen.items()} == {k: sorted(v) for k, v in traces.items()}


# --------------------------------------------------------------------------------------------------
# KafkaSpanExporter
# --------------------------------------------------------------------------------------------------


async def test_sdk_spans_land_on_the_spans_topic_keyed_by_trace_id(kafka_bootstrap: str, topics: TopicsConfig) -> None:
    exporter = KafkaSpanExporter(bootstrap_servers=kafka_bootstrap, topic=topics.spans, tenant="acme")
    provider = TracerProvider(resource=Resource.create({"service.name": "tw-it-agent"}), shutdown_on_exit=False)
    counter = SpanCountingProcessor()
    provider.add_span_processor(counter)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        # SimpleSpanProcessor exports synchronously on span end: keep it off the event loop.
        traces = await asyncio.to_thread(make_agent_spans, provider)
    finally:
        await asyncio.to_thread(provider.shutdown)  # shuts the exporter down too
    for tid, names in traces.items():
        assert counter.count(tid) == len(names)

    # SimpleSpanProcessor: one export (one record) per span.
    records = await read_records(kafka_bootstrap, topics.spans, sum(len(v) for v in traces.values()))
    check_span_records(records, traces)
    for r in records:
        assert dict(r.headers)[TENANT_HEADER] == b"acme"
    # Records of one trace share a key, hence a partition: per-trace order is kept.
    for tid in traces:
        assert len({r.partition for r in records if r.key == tid.encode()}) == 1


async def test_one_export_call_writes_one_record_per_trace(kafka_bootstrap: str, topics: TopicsConfig) -> None:
    spans, traces = captured_spans()
    exporter = KafkaSpanExporter(bootstrap_servers=kafka_bootstrap, topic=topics.spans)
    try:
        assert await asyncio.to_thread(exporter.export, spans) is SpanExportResult.SUCCESS
        assert await asyncio.to_thread(exporter.force_flush, 10_000)
    finally:
        await asyncio.to_thread(exporter.shutdown)
        await asyncio.to_thread(exporter.shutdown)
    records = await read_records(kafka_bootstrap, topics.spans, len(traces))
    assert sorted(r.key.decode() for r in records) == sorted(traces)
    assert all(not r.headers for r in records), "no tenant configured: no tenant header"
    check_span_records(records, traces)


async def test_the_exporter_stamps_the_tenant_under_the_header_it_is_given(
    kafka_bootstrap: str, topics: TopicsConfig
) -> None:
    # The service's tenant.header is configurable; the exporter wrote only "toolwitness-tenant".
    spans, traces = captured_spans()
    exporter = KafkaSpanExporter(bootstrap_servers=kafka_bootstrap, topic=topics.spans, tenant="acme",
                                 tenant_header="x-org")
    try:
        assert await asyncio.to_thread(exporter.export, spans) is SpanExportResult.SUCCESS
    finally:
        await asyncio.to_thread(exporter.shutdown)
    records = await read_records(kafka_bootstrap, topics.spans, len(traces))
    assert all(list(r.headers) == [("x-org", b"acme")] for r in records)
    with pytest.raises(ValueError, match="tenant_header"):
        KafkaSpanExporter(bootstrap_servers=kafka_bootstrap, tenant="acme", tenant_header="")


def sized_trace_spans(*sizes: int) -> tuple[list[ReadableSpan], list[str]]:
    """One single-span trace per size (a tool span whose arguments are that many bytes), in order:
    a mixed batch such as BatchSpanProcessor hands the exporter."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(
        sampler=ALWAYS_ON, span_limits=SpanLimits(max_span_attribute_length=SpanLimits.UNSET), shutdown_on_exit=False
    )
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("tw.it.agent")
    trace_ids = []
    for size in sizes:
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search",
                      "gen_ai.tool.call.arguments": "x" * size}
        with tracer.start_as_current_span("execute_tool search", context=Context(), attributes=attributes) as span:
            trace_ids.append(format_trace_id(span.get_span_context().trace_id))
    provider.shutdown()
    return list(memory.get_finished_spans()), trace_ids


@pytest.mark.parametrize("refused_by", ["producer", "broker"])
async def test_a_trace_kafka_refuses_costs_an_export_only_that_trace(
    kafka_bootstrap: str, topic_factory: TopicFactory, caplog: pytest.LogCaptureFixture, refused_by: str
) -> None:
    # One export call (a BatchSpanProcessor batch mixes traces) with a trace Kafka refuses and a
    # small one, on one partition. The refusal stopped the send loop (the producer's own 1 MiB
    # limit) or broke the idempotent producer's sequence (the broker's limit, lowered after the
    # exporter started): the small trace was lost too. Now only the refused trace is lost, named
    # in a WARNING, and the call says FAILURE.
    topic = await topic_factory(1)
    exporter = KafkaSpanExporter(bootstrap_servers=kafka_bootstrap, topic=topic, timeout_s=10)
    (first,), (before,) = sized_trace_spans(10)
    spans, (big, small) = sized_trace_spans(2_000_000 if refused_by == "producer" else 300_000, 10)
    (last,), (after,) = sized_trace_spans(10)
    try:
        async with asyncio.timeout(TIMEOUT_S):
            assert await asyncio.to_thread(exporter.export, [first]) is SpanExportResult.SUCCESS
            probes = 0
            if refused_by == "broker":
                probes = await set_record_limit(kafka_bootstrap, topic, 100_000)
            with caplog.at_level(logging.WARNING, logger="collector.otel"):
                assert await asyncio.to_thread(exporter.export, spans) is SpanExportResult.FAILURE
            assert await asyncio.to_thread(exporter.export, [last]) is SpanExportResult.SUCCESS
    finally:
        await asyncio.to_thread(exporter.shutdown)
    records = [r for r in await read_records(kafka_bootstrap, topic, 3 + probes) if r.key != PROBE_KEY]
    assert [r.key.decode() for r in records] == [before, small, after]
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and big in r.getMessage()]
    assert ("record size limit" if refused_by == "producer" else "max.message.bytes") in warning


@pytest.mark.parametrize("lowered", ["before-start", "after-start"])
async def test_a_trace_the_topic_refuses_does_not_stop_the_exporter(
    kafka_bootstrap: str, topic_factory: TopicFactory, caplog: pytest.LogCaptureFixture, lowered: str
) -> None:
    # The spans topic takes records up to 100 kB. A 300 kB trace the broker refused left the
    # idempotent producer with a gap in its sequence: every later export failed
    # (OutOfOrderSequenceNumber, logged at DEBUG) and every later trace lost its evidence. The
    # topic's limit is read when the producer starts (before-start: refused here), and a producer
    # the broker refused is replaced (after-start).
    topic = await topic_factory(1, configs={"max.message.bytes": "100000"} if lowered == "before-start" else {})
    exporter = KafkaSpanExporter(bootstrap_servers=kafka_bootstrap, topic=topic, timeout_s=10)
    exports = [sized_trace_spans(size) for size in (10, 300_000, 10, 10)]
    results = []
    probes = 0
    try:
        async with asyncio.timeout(TIMEOUT_S):
            for i, (spans, _) in enumerate(exports):
                if i == 1 and lowered == "after-start":
                    probes = await set_record_limit(kafka_bootstrap, topic, 100_000)
                with caplog.at_level(logging.WARNING, logger="collector.otel"):
                    results.append(await asyncio.to_thread(exporter.export, spans))
    finally:
        await asyncio.to_thread(exporter.shutdown)
    ok, refused = SpanExportResult.SUCCESS, SpanExportResult.FAILURE
    assert results == [ok, refused, ok, ok]
    keys = [r.key.decode() for r in await read_records(kafka_bootstrap, topic, 3 + probes) if r.key != PROBE_KEY]
    assert keys == [tids[0] for i, (_, tids) in enumerate(exports) if i != 1]
    big = exports[1][1][0]
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and big in r.getMessage()]
    assert "300" in warning and ("record size limit (100000 bytes)" in warning or "max.message.bytes" in warning)


# --------------------------------------------------------------------------------------------------
# ToolwitnessClient: control records
# --------------------------------------------------------------------------------------------------

TRACE = "0af7651916cd43dd8448eb211c80319c"


async def test_control_records_decode_to_what_was_asked(
    kafka_bootstrap: str, topics: TopicsConfig, client: ToolwitnessClient
) -> None:
    scope = TraceScorable(trace_ids=(TRACE,))
    conditions: list[Condition] = [
        ToolsCalled(
            tools=(
                ToolCallRequirement(
                    name="book_flight",
                    arguments=(ArgumentMatcher(path="$.flight", regex="^LH"), ArgumentMatcher(path="$.n", minimum=1)),
                    status="ok",
                    max_count=1,
                ),
            )
        ),
        ToolSequence(tools=("search_flights", "book_flight")),
    ]
    eid = await client.expect(
        scope, conditions=conditions, objective="book it", deadline=timedelta(seconds=42), scorer="tools"
    )
    assert len(eid) == 32 and int(eid, 16) >= 0
    given = ScoringExpectation(conditions=(ToolsCalled(tools=(ToolCallRequirement(name="x"),)),))
    eid2 = await client.expect(SessionScorable(session_id="conv-7"), given, expectation_id="my-id")
    assert eid2 == "my-id"
    at = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    await client.mark_complete(TRACE, span_count=3, at=at)
    await client.mark_complete(TRACE)
    await client.mark_session_complete("conv-7", at=at)
    await client.cancel("my-id", reason="changed my mind")
    with pytest.raises(ValueError):
        await client.mark_complete("not-a-trace-id")
    with pytest.raises(ValueError):
        await client.expect(scope, given, conditions=conditions)

    records = await read_records(kafka_bootstrap, topics.control, 6)
    assert [r.offset for r in records] == list(range(6))  # one partition: send order
    msgs = [decode_control(r.value) for r in records]
    keys = [r.key.decode() for r in records]
    assert keys == [eid, "my-id", TRACE, TRACE, "conv-7", "my-id"]

    e1 = expectation_from_proto(msgs[0].expectation, default_tenant="x", default_deadline_s=1, now_ms=0)
    assert e1.expectation_id == eid and e1.tenant == "acme" and e1.scope == scope and e1.scorer == "tools"
    assert e1.expectation == ScoringExpectation(conditions=tuple(conditions), objective="book it")
    assert e1.deadline_ms == 42_000
    e2 = expectation_from_proto(msgs[1].expectation, default_tenant="x", default_deadline_s=1, now_ms=0)
    assert e2.expectation == given and e2.scope == SessionScorable(session_id="conv-7")
    # no deadline given: none is sent, the service's completion.default_deadline_seconds applies
    assert not msgs[1].expectation.HasField("deadline") and e2.deadline_ms == 1_000

    m = msgs[2].completion
    assert (m.tenant, m.trace_id, m.span_count) == ("acme", TRACE, 3) and m.HasField("span_count")
    assert m.at.ToDatetime(tzinfo=UTC) == at
    m = msgs[3].completion
    assert m.trace_id == TRACE and not m.HasField("span_count")
    assert abs((m.at.ToDatetime(tzinfo=UTC) - datetime.now(UTC)).total_seconds()) < TIMEOUT_S
    m = msgs[4].completion
    assert m.WhichOneof("target") == "session_id" and m.session_id == "conv-7"
    c = msgs[5].cancel
    assert (c.tenant, c.expectation_id, c.reason) == ("acme", "my-id", "changed my mind")


async def test_a_control_record_the_broker_refuses_fails_alone(
    kafka_bootstrap: str, topics: TopicsConfig, topic_factory: TopicFactory
) -> None:
    # The control topic takes records up to 100 kB; an expectation with a 300 kB objective is
    # refused by the broker. That left the client's idempotent producer with a gap in its
    # sequence: every later expect/mark_complete failed (OutOfOrderSequenceNumber) until the
    # client was recreated. The refused call says what was refused and why; later calls work.
    control = await topic_factory(1, configs={"max.message.bytes": "100000"})
    scope = TraceScorable(trace_ids=(TRACE,))
    given = ScoringExpectation(conditions=(ToolsCalled(tools=(ToolCallRequirement(name="search"),)),))
    async with (
        asyncio.timeout(TIMEOUT_S),
        ToolwitnessClient(
            bootstrap_servers=kafka_bootstrap, tenant="acme", topics=topics.model_copy(update={"control": control})
        ) as tw,
    ):
        first = await tw.expect(scope, given)
        with pytest.raises(RecordRefusedError) as info:
            await tw.expect(scope, given, objective="o" * 300_000, expectation_id="too-big")
        assert "expectation 'too-big'" in str(info.value) and "max.message.bytes" in str(info.value)
        await tw.mark_complete(TRACE, span_count=1)
        after = await tw.expect(scope, given)
        await tw.cancel(after)
    records = await read_records(kafka_bootstrap, control, 4)
    assert [r.key.decode() for r in records] == [first, TRACE, after, after]
    assert [decode_control(r.value).WhichOneof("message") for r in records] == [
        "expectation", "completion", "expectation", "cancel",
    ]


def fresh_topics(prefix: str) -> TopicsConfig:
    """Topic names no other test uses (``<prefix>-<random>-spans`` ...), none of them created."""
    stem = f"{prefix}-{uuid.uuid4().hex[:12]}"
    return TopicsConfig(
        spans=f"{stem}-spans", control=f"{stem}-control", scores=f"{stem}-scores",
        observations=f"{stem}-observations", dlq=f"{stem}-dlq",
    )


async def test_client_creates_missing_topics(kafka_bootstrap: str, kafka_admin: AIOKafkaAdminClient) -> None:
    wanted = fresh_topics("tw-test-ensure")
    names = [wanted.spans, wanted.control, wanted.scores, wanted.observations, wanted.dlq]
    try:
        async with asyncio.timeout(TIMEOUT_S):
            async with ToolwitnessClient(bootstrap_servers=kafka_bootstrap, topics=wanted) as tw:
                assert tw.started
                await tw.start()  # idempotent
            await tw.stop()  # idempotent
            assert sorted(await ensure_topics(kafka_bootstrap, wanted)) == []  # all there now
            rows = {r["topic"]: r for r in await kafka_admin.describe_topics(names)}
            assert all(len(rows[n]["partitions"]) == 4 for n in names)
            (resp,) = await kafka_admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, wanted.observations, configs=None)]
            )
            entries = {e["config_names"]: e["config_value"] for e in resp.to_object()["resources"][0]["config_entries"]}
            assert entries["cleanup.policy"] == "compact"
    finally:
        await kafka_admin.delete_topics(names, timeout_ms=30_000)


@pytest.fixture
async def mute_broker() -> AsyncIterator[str]:
    """host:port of a listener that accepts TCP connections and never answers (a hung broker)."""
    held: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    ("create_topics", "step"), [(True, "creating the toolwitness topics"), (False, "listing the topics")]
)
async def test_start_against_a_broker_that_never_answers_fails_within_timeout_s(
    mute_broker: str, create_topics: bool, step: str
) -> None:
    tw = ToolwitnessClient(bootstrap_servers=mute_broker, timeout_s=1, create_topics=create_topics)
    t0 = time.monotonic()
    async with asyncio.timeout(TIMEOUT_S):
        with pytest.raises(TimeoutError) as failed:
            await tw.start()
    elapsed = time.monotonic() - t0
    assert elapsed < 5, f"start() took {elapsed:.1f}s with timeout_s=1"
    # the error says which step and which servers
    assert step in str(failed.value) and mute_broker in str(failed.value) and "timeout_s=1" in str(failed.value)
    assert not tw.started


async def test_without_create_topics_a_missing_scores_topic_is_refused_not_created(
    kafka_bootstrap: str, kafka_admin: AIOKafkaAdminClient
) -> None:
    wanted = fresh_topics("tw-test-missing")
    tw = ToolwitnessClient(bootstrap_servers=kafka_bootstrap, topics=wanted, create_topics=False)
    try:
        async with asyncio.timeout(TIMEOUT_S):
            with pytest.raises(TopicSetupError, match=f"scores topic '{wanted.scores}' does not exist"):
                await tw.start()
            assert not tw.started
            # subscribing would have made the broker auto-create it
            assert wanted.scores not in set(await kafka_admin.list_topics())
    finally:
        leftovers = [t for t in await kafka_admin.list_topics() if t.startswith(wanted.spans[: -len("-spans")])]
        if leftovers:
            await kafka_admin.delete_topics(leftovers, timeout_ms=30_000)


# --------------------------------------------------------------------------------------------------
# ToolwitnessClient: scores and observations
# --------------------------------------------------------------------------------------------------


def score_event(
    expectation_id: str, version: int = 1, status: common_pb2.ScoreStatus.ValueType = common_pb2.SCORE_STATUS_TRUE
) -> score_pb2.ScoreEvent:
    ev = score_pb2.ScoreEvent(
        score_id=score_id_for("acme", expectation_id, version),
        expectation_id=expectation_id,
        version=version,
        tenant="acme",
        scope=scope_to_proto(TraceScorable(trace_ids=(TRACE,))),
        scorer="tools",
        scorer_identity="ab" * 32,
        status=status,
        value="true" if status == common_pb2.SCORE_STATUS_TRUE else "false",
        rationale="book_flight executed",
        coverage=common_pb2.Coverage(complete=True, source=common_pb2.COMPLETION_SOURCE_MARKER),
        trigger="marker" if version == 1 else "revision",
    )
    ev.decided_at.FromDatetime(datetime.now(UTC))
    return ev


async def test_wait_for_returns_the_score_and_drops_identical_resends(
    kafka_bootstrap: str, topics: TopicsConfig, client: ToolwitnessClient, producer: AIOKafkaProducer
) -> None:
    eid = await client.expect(
        TraceScorable(trace_ids=(TRACE,)), conditions=[ToolsCalled(tools=(ToolCallRequirement(name="book_flight"),))]
    )
    sent = score_event(eid)
    other = score_event(uuid.uuid4().hex)
    async with asyncio.timeout(TIMEOUT_S):
        stream = client.scores()
        await producer.send_and_wait(topics.scores, value=encode(sent, "protobuf"), key=eid.encode(), partition=2)
        got = await client.wait_for(eid, timeout=TIMEOUT_S)
        assert got == sent
        assert await anext(stream) == sent

        # The service re-sends an identical event (crash replay), then another score on the
        # same partition: once that one is seen, the re-send has been processed (and dropped).
        await producer.send_and_wait(topics.scores, value=encode(sent, "json"), key=eid.encode(), partition=2)
        await producer.send_and_wait(topics.scores, value=encode(other, "protobuf"), partition=2)
        assert await anext(stream) == other
        assert client.duplicates == 1
        assert client.events(eid) == [sent]

        # A revision (version 2) is a distinct event; wait_for then returns the latest version.
        revision = score_event(eid, version=2, status=common_pb2.SCORE_STATUS_FALSE)
        await producer.send_and_wait(topics.scores, value=encode(revision, "protobuf"), key=eid.encode())
        assert await anext(stream) == revision
        assert await client.wait_for(eid, timeout=1) == revision
        assert [e.version for e in client.events(eid)] == [1, 2]
        await stream.aclose()

    with pytest.raises(TimeoutError, match="no score for expectation 'never'"):
        await client.wait_for("never", timeout=0.2)


async def test_a_score_stream_subscribes_when_opened_and_a_dropped_one_unsubscribes(
    topics: TopicsConfig, client: ToolwitnessClient, producer: AIOKafkaProducer
) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        # Opened "from now" before the score exists, read only after the score has arrived.
        stream = client.scores(include_received=False)
        sent = score_event("opened-before")
        await producer.send_and_wait(topics.scores, value=encode(sent, "protobuf"), partition=0)
        assert await client.wait_for("opened-before", timeout=TIMEOUT_S) == sent
        # Already in the stream's queue when wait_for returned: no waiting for the broker here.
        assert await asyncio.wait_for(anext(stream), 5) == sent
        await stream.aclose()
        assert client._subscribers == []

    # A stream that is opened and never read does not keep the client's events forever.
    abandoned = client.scores()
    assert len(client._subscribers) == 1
    del abandoned
    gc.collect()
    assert client._subscribers == []


async def test_scores_sent_before_start_are_not_seen(
    kafka_bootstrap: str, topics: TopicsConfig, producer: AIOKafkaProducer
) -> None:
    old = score_event("old-expectation")
    fresh = score_event("fresh-expectation")
    async with asyncio.timeout(TIMEOUT_S):
        await producer.send_and_wait(topics.scores, value=encode(old, "protobuf"), partition=1)
        async with ToolwitnessClient(bootstrap_servers=kafka_bootstrap, tenant="acme", topics=topics) as tw:
            await producer.send_and_wait(topics.scores, value=encode(fresh, "protobuf"), partition=1)
            assert await tw.wait_for("fresh-expectation", timeout=TIMEOUT_S) == fresh
            assert tw.events("old-expectation") == []
        # A harness restarted after its verdicts were published reads the topic from its start.
        async with ToolwitnessClient(
            bootstrap_servers=kafka_bootstrap, tenant="acme", topics=topics, scores_from="beginning"
        ) as again:
            assert await again.wait_for("old-expectation", timeout=TIMEOUT_S) == old
            assert await again.wait_for("fresh-expectation", timeout=TIMEOUT_S) == fresh


async def test_partitions_added_to_the_scores_topic_are_read_from_their_start_and_the_rest_resume(
    kafka_bootstrap: str, topics: TopicsConfig, kafka_admin: AIOKafkaAdminClient, producer: AIOKafkaProducer
) -> None:
    before = score_event("before-start")
    async with asyncio.timeout(TIMEOUT_S):
        await producer.send_and_wait(topics.scores, value=encode(before, "protobuf"), partition=1)
        async with ToolwitnessClient(
            bootstrap_servers=kafka_bootstrap, tenant="acme", topics=topics, metadata_max_age_ms=300
        ) as tw:
            first = score_event("first")
            await producer.send_and_wait(topics.scores, value=encode(first, "protobuf"), partition=0)
            assert await tw.wait_for("first", timeout=TIMEOUT_S) == first

            await kafka_admin.create_partitions({topics.scores: NewPartitions(total_count=6)})
            # Scores on every partition, the two new ones included, before the client can have
            # noticed them: those on 4 and 5 are older than the client's first look at them.
            await producer_sees_partitions(producer, topics.scores, 6)
            sent = {p: score_event(f"after-{p}") for p in range(6)}
            for p, ev in sent.items():
                await producer.send_and_wait(topics.scores, value=encode(ev, "protobuf"), partition=p)
            for p, ev in sent.items():
                assert await tw.wait_for(f"after-{p}", timeout=TIMEOUT_S) == ev
            assert len(tw._consumer.assignment()) == 6
            # the re-assignment did not rewind the old partitions to their start either
            assert tw.events("before-start") == []
            assert tw.events("first") == [first] and tw.duplicates == 0


async def test_a_broker_error_while_following_added_partitions_is_retried(
    kafka_bootstrap: str, topics: TopicsConfig, kafka_admin: AIOKafkaAdminClient, producer: AIOKafkaProducer
) -> None:
    async with (
        asyncio.timeout(TIMEOUT_S),
        ToolwitnessClient(
            bootstrap_servers=kafka_bootstrap, tenant="acme", topics=topics, metadata_max_age_ms=300
        ) as tw,
    ):
        # The reader's first look at the new partitions (their first offsets) gets no answer.
        failed = asyncio.Event()
        real = tw._consumer.beginning_offsets

        async def flaky(tps: list[Any]) -> Any:
            if not failed.is_set():
                failed.set()
                raise KafkaTimeoutError("injected: the broker did not answer")
            return await real(tps)

        tw._consumer.beginning_offsets = flaky
        await kafka_admin.create_partitions({topics.scores: NewPartitions(total_count=6)})
        await failed.wait()
        await producer_sees_partitions(producer, topics.scores, 6)
        sent = {p: score_event(f"after-{p}") for p in range(6)}
        for p, ev in sent.items():
            await producer.send_and_wait(topics.scores, value=encode(ev, "protobuf"), partition=p)
        # Retried like a failed fetch: the reader lives on and reads every partition, new ones too.
        for p, ev in sent.items():
            assert await tw.wait_for(f"after-{p}", timeout=20) == ev
        assert tw._consumer_error is None and len(tw._consumer.assignment()) == 6


async def test_an_error_that_ends_the_scores_reader_reaches_every_waiter_and_stream(
    kafka_bootstrap: str, topics: TopicsConfig, kafka_admin: AIOKafkaAdminClient
) -> None:
    async with (
        asyncio.timeout(TIMEOUT_S),
        ToolwitnessClient(
            bootstrap_servers=kafka_bootstrap, tenant="acme", topics=topics, metadata_max_age_ms=300
        ) as tw,
    ):
        bug = ValueError("injected: not a broker error")

        async def broken(tps: list[Any]) -> Any:
            raise bug

        tw._consumer.beginning_offsets = broken  # reached when the reader follows added partitions
        waiting = asyncio.create_task(tw.wait_for("never", timeout=20))
        stream = tw.scores()
        reading = asyncio.create_task(anext(stream))
        await kafka_admin.create_partitions({topics.scores: NewPartitions(total_count=6)})

        # Those waiting are woken with it (not left to time out) ...
        with pytest.raises(RuntimeError, match="the scores consumer failed") as waited:
            await waiting
        assert waited.value.__cause__ is bug
        with pytest.raises(RuntimeError, match="the scores consumer failed"):
            await reading
        assert tw._consumer_error is bug
        # ... and so are those who come later, at once.
        with pytest.raises(RuntimeError, match="the scores consumer failed"):
            await tw.wait_for("later", timeout=20)
        with pytest.raises(RuntimeError, match="the scores consumer failed"):
            await asyncio.wait_for(anext(tw.scores()), 5)


async def test_other_tenants_scores_are_counted_not_kept_unless_asked(
    kafka_bootstrap: str, topics: TopicsConfig, producer: AIOKafkaProducer
) -> None:
    mine, theirs = score_event("mine"), score_event("theirs")
    theirs.tenant = "globex"
    async with asyncio.timeout(TIMEOUT_S):
        async with (
            ToolwitnessClient(bootstrap_servers=kafka_bootstrap, tenant="acme", topics=topics) as acme,
            ToolwitnessClient(
                bootstrap_servers=kafka_bootstrap, tenant="acme", topics=topics, all_tenants=True
            ) as everyone,
        ):
            # the same partition, theirs first: once mine is read, theirs has been handled
            await producer.send_and_wait(topics.scores, value=encode(theirs, "protobuf"), partition=3)
            await producer.send_and_wait(topics.scores, value=encode(mine, "protobuf"), partition=3)
            assert await acme.wait_for("mine", timeout=TIMEOUT_S) == mine
            assert acme.events("theirs") == [] and acme.other_tenants == 1
            stream = acme.scores()
            assert await anext(stream) == mine  # theirs never reaches a subscriber
            await stream.aclose()
            assert await everyone.wait_for("mine", timeout=TIMEOUT_S) == mine
            assert everyone.events("theirs", tenant="globex") == [theirs] and everyone.other_tenants == 0
            assert everyone.events("theirs") == []  # another tenant's expectation is asked for by its tenant


async def test_get_observation_reads_and_verifies(
    kafka_bootstrap: str, topics: TopicsConfig, client: ToolwitnessClient, producer: AIOKafkaProducer
) -> None:
    obs = Observation(
        scorable=TraceScorable(trace_ids=(TRACE,)),
        tool_executions=(
            ToolExecution(
                name="book_flight",
                trace_id=TRACE,
                span_id="00f067aa0ba902b7",
                status="ok",
                start_time_unix_nano=1,
                end_time_unix_nano=2,
                arguments='{"flight":"LH123"}',
                arguments_state=CaptureState.CAPTURED,
            ),
        ),
        coverage=Coverage.completed(CompletionSource.MARKER),
        acquisition=Acquisition.COMPLETE,
    )
    tampered = observation_to_proto(obs)
    tampered.observation_id = "f" * 64
    tampered.tool_executions[0].name = "send_email"
    async with asyncio.timeout(TIMEOUT_S):
        await producer.send_and_wait(topics.observations, value=b"", key=b"unrelated")
        good = encode(observation_to_proto(obs), "protobuf")
        await producer.send_and_wait(topics.observations, value=good, key=obs.observation_id.encode())
        await producer.send_and_wait(topics.observations, value=encode(tampered, "json"), key=b"f" * 64)
        got = await client.get_observation(obs.observation_id, timeout=TIMEOUT_S)
        assert got == obs
        with pytest.raises(ValueError, match="does not match"):
            await client.get_observation("f" * 64, timeout=TIMEOUT_S)
        with pytest.raises(TimeoutError, match="not found"):
            await client.get_observation("0" * 64, timeout=1.0)


async def test_get_observation_starts_where_its_score_was_decided(
    kafka_bootstrap: str, topics: TopicsConfig, client: ToolwitnessClient, producer: AIOKafkaProducer
) -> None:
    # A long-lived observations topic: 300 older observations (an hour old) before the one a score
    # names. Kafka's time index takes the search past them; without a score, from the start.
    obs = Observation(scorable=TraceScorable(trace_ids=(TRACE,)), coverage=Coverage.completed(CompletionSource.MARKER))
    hour_ago_ms = int(time.time() * 1000) - 3_600_000
    async with asyncio.timeout(TIMEOUT_S):
        for i in range(300):
            await producer.send(topics.observations, value=b"old", key=f"old-{i}".encode(), timestamp_ms=hour_ago_ms)
        value = encode(observation_to_proto(obs), "protobuf")
        await producer.send_and_wait(topics.observations, value=value, key=obs.observation_id.encode())
        ahead_ms = int(time.time() * 1000) + 1_800_000  # a record from a clock half an hour ahead
        await producer.send_and_wait(topics.observations, value=b"ahead", key=b"ahead", timestamp_ms=ahead_ms)
        ev = score_event("near")
        ev.observation_ids.append(obs.observation_id)
        ev.decided_at.FromMilliseconds(int(time.time() * 1000))
        await producer.send_and_wait(topics.scores, value=encode(ev, "protobuf"))
        await client.wait_for("near", timeout=TIMEOUT_S)
        assert await client.get_observation(obs.observation_id, timeout=TIMEOUT_S) == obs
        assert client.observation_records_read < 50  # not the 300 before it

    # a time after it was written (a skewed clock): the search from there (the record from the
    # clock ahead) misses it, then goes on from the start and finds it
    async with (
        asyncio.timeout(TIMEOUT_S),
        ToolwitnessClient(bootstrap_servers=kafka_bootstrap, tenant="acme", topics=topics) as fresh,
    ):
        later = datetime.now(UTC) + timedelta(minutes=20)
        assert await fresh.get_observation(obs.observation_id, timeout=TIMEOUT_S, published_after=later) == obs
        assert fresh.observation_records_read >= 302


async def test_get_observation_finds_one_published_before_partitions_were_added(
    kafka_bootstrap: str, topics: TopicsConfig, producer: AIOKafkaProducer, kafka_admin: AIOKafkaAdminClient
) -> None:
    # Published when the topic had one partition; with 8 now, the key hashes elsewhere.
    scopes = [TraceScorable(trace_ids=(f"{i + 1:032x}",)) for i in range(6)]
    observations = [Observation(scorable=scope, coverage=Coverage.completed()) for scope in scopes]
    async with asyncio.timeout(TIMEOUT_S):
        for obs in observations:
            value = encode(observation_to_proto(obs), "protobuf")
            await producer.send_and_wait(topics.observations, value=value, key=obs.observation_id.encode())
        await kafka_admin.create_partitions({topics.observations: NewPartitions(total_count=8)})
        async with ToolwitnessClient(bootstrap_servers=kafka_bootstrap, tenant="acme", topics=topics) as fresh:
            for obs in observations:
                assert await fresh.get_observation(obs.observation_id, timeout=TIMEOUT_S) == obs


# --------------------------------------------------------------------------------------------------
# The OTLP/gRPC sidecar
# --------------------------------------------------------------------------------------------------


def sidecar_config(bootstrap: str, topics: TopicsConfig, token_env: str = "TW_IT_SIDECAR_TOKEN") -> SidecarConfig:
    return SidecarConfig(
        listen="127.0.0.1:0",
        kafka=KafkaConfig(bootstrap_servers=bootstrap, topics=topics, request_timeout_ms=10_000),
        bearer_token_env=token_env,
    )


async def test_sidecar_forwards_otlp_grpc_exports_keyed_by_trace_id(kafka_bootstrap: str, topics: TopicsConfig) -> None:
    spans, traces = captured_spans()
    sidecar = create_sidecar(sidecar_config(kafka_bootstrap, topics), env={})
    async with asyncio.timeout(TIMEOUT_S):
        await sidecar.start()
        try:
            assert sidecar.port > 0
            otlp = OTLPSpanExporter(endpoint=sidecar.endpoint, insecure=True, timeout=10)
            try:
                # The real exporter is synchronous (gRPC sync channel): off the loop serving the call.
                assert await asyncio.to_thread(otlp.export, spans) is SpanExportResult.SUCCESS
            finally:
                await asyncio.to_thread(otlp.shutdown)

            # A raw call with a span that has an invalid trace id: partial success, not forwarded.
            good_tid = uuid.uuid4().bytes
            request = ExportTraceServiceRequest(
                resource_spans=[
                    ResourceSpans(
                        scope_spans=[
                            ScopeSpans(
                                spans=[
                                    Span(trace_id=good_tid, span_id=b"\x01" * 8, name="good"),
                                    Span(trace_id=bytes(16), span_id=b"\x02" * 8, name="bad"),
                                ]
                            )
                        ]
                    )
                ]
            )
            async with grpc.aio.insecure_channel(sidecar.endpoint) as channel:
                stub = trace_service_pb2_grpc.TraceServiceStub(channel)  # type: ignore[no-untyped-call]
                response = await stub.Export(request, timeout=10)
            assert response.partial_success.rejected_spans == 1
            assert "invalid" in response.partial_success.error_message
        finally:
            await sidecar.shutdown()
            await sidecar.shutdown()  # idempotent

    records = await read_records(kafka_bootstrap, topics.spans, len(traces) + 1)
    by_key = {r.key.decode(): r for r in records}
    assert set(by_key) == {*traces, good_tid.hex()}
    good = ExportTraceServiceRequest.FromString(by_key.pop(good_tid.hex()).value)
    assert [s.name for s in spans_of(good)] == ["good"]
    check_span_records(list(by_key.values()), traces)
    assert sidecar.rejected_spans == 1


async def test_sidecar_refuses_calls_without_the_bearer_token(
    kafka_bootstrap: str, topics: TopicsConfig, caplog: pytest.LogCaptureFixture
) -> None:
    token = f"s3cret-{uuid.uuid4().hex}"
    spans, traces = captured_spans()
    sidecar = create_sidecar(sidecar_config(kafka_bootstrap, topics, "TW_IT_TOKEN"), env={"TW_IT_TOKEN": token})
    assert sidecar.auth_required
    span = Span(trace_id=b"\x07" * 16, span_id=b"\x01" * 8)
    request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])])
    with caplog.at_level(logging.DEBUG):
        async with asyncio.timeout(TIMEOUT_S):
            await sidecar.start()
            try:
                async with grpc.aio.insecure_channel(sidecar.endpoint) as channel:
                    stub = trace_service_pb2_grpc.TraceServiceStub(channel)  # type: ignore[no-untyped-call]
                    for metadata in [(), (("authorization", "Bearer wrong"),), (("authorization", token),)]:
                        with pytest.raises(grpc.aio.AioRpcError) as info:
                            await stub.Export(request, metadata=metadata, timeout=10)
                        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED

                refused = OTLPSpanExporter(endpoint=sidecar.endpoint, insecure=True, timeout=5)
                try:
                    assert await asyncio.to_thread(refused.export, spans) is SpanExportResult.FAILURE
                finally:
                    await asyncio.to_thread(refused.shutdown)

                allowed = OTLPSpanExporter(
                    endpoint=sidecar.endpoint, insecure=True, timeout=10, headers={"authorization": f"Bearer {token}"}
                )
                try:
                    assert await asyncio.to_thread(allowed.export, spans) is SpanExportResult.SUCCESS
                finally:
                    await asyncio.to_thread(allowed.shutdown)
            finally:
                await sidecar.shutdown()
    # Only the authorized export reached Kafka.
    records = await read_records(kafka_bootstrap, topics.spans, len(traces))
    assert sorted(r.key.decode() for r in records) == sorted(traces)
    assert token not in caplog.text
    assert any("refused" in r.getMessage() for r in caplog.records)


async def test_a_trace_the_broker_refuses_is_a_partial_success_not_a_retry(
    kafka_bootstrap: str, topics: TopicsConfig, topic_factory: TopicFactory
) -> None:
    # The spans topic takes records up to 100 kB; the sidecar's own limit (4 MiB) lets a 300 kB
    # trace through to the broker, which refuses it. The small trace of the same call is
    # forwarded and the call says which spans were not: retrying all of it would never succeed.
    spans_topic = await topic_factory(1, configs={"max.message.bytes": "100000"})
    config = sidecar_config(kafka_bootstrap, topics.model_copy(update={"spans": spans_topic}))
    sidecar = create_sidecar(config, env={})
    big, small = uuid.uuid4().bytes, uuid.uuid4().bytes
    payload = KeyValue(key="gen_ai.tool.call.arguments", value=AnyValue(string_value="x" * 300_000))
    request = ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                scope_spans=[
                    ScopeSpans(
                        spans=[
                            Span(trace_id=big, span_id=b"\x01" * 8, name="big", attributes=[payload]),
                            Span(trace_id=big, span_id=b"\x02" * 8, name="big-2"),
                            Span(trace_id=small, span_id=b"\x03" * 8, name="small"),
                        ]
                    )
                ]
            )
        ]
    )
    async with asyncio.timeout(TIMEOUT_S):
        await sidecar.start()
        try:
            async with grpc.aio.insecure_channel(sidecar.endpoint) as channel:
                stub = trace_service_pb2_grpc.TraceServiceStub(channel)  # type: ignore[no-untyped-call]
                response = await stub.Export(request, timeout=10)
        finally:
            await sidecar.shutdown()
    assert response.partial_success.rejected_spans == 2
    assert f"trace {big.hex()}: 2 span(s) exceed the record size limit" in response.partial_success.error_message
    [rec] = await read_records(kafka_bootstrap, spans_topic, 1)
    assert rec.key == small.hex().encode()


def _one_trace_request(trace_id: bytes, name: str, size: int = 0) -> ExportTraceServiceRequest:
    attrs = [KeyValue(key="gen_ai.tool.call.arguments", value=AnyValue(string_value="x" * size))] if size else []
    span = Span(trace_id=trace_id, span_id=uuid.uuid4().bytes[:8], name=name, attributes=attrs)
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])])


@pytest.mark.parametrize("lowered", ["before-start", "after-start"])
async def test_a_trace_the_topic_refuses_does_not_stop_the_sidecar(
    kafka_bootstrap: str, topics: TopicsConfig, topic_factory: TopicFactory, lowered: str
) -> None:
    # One partition: every trace goes to it. A record the broker refused left the idempotent
    # producer with a gap in its sequence, and every later Export failed (UNAVAILABLE) until
    # the sidecar was restarted. The topic's limit is read at start, and a producer the broker
    # refused is renewed.
    spans_topic = await topic_factory(1, configs={} if lowered == "after-start" else {"max.message.bytes": "100000"})
    config = sidecar_config(kafka_bootstrap, topics.model_copy(update={"spans": spans_topic}))
    sidecar = create_sidecar(config, env={})
    before, big, after = uuid.uuid4().bytes, uuid.uuid4().bytes, uuid.uuid4().bytes
    probes = 0
    async with asyncio.timeout(TIMEOUT_S):
        await sidecar.start()
        try:
            if lowered == "after-start":
                probes = await set_record_limit(kafka_bootstrap, spans_topic, 100_000)
            async with grpc.aio.insecure_channel(sidecar.endpoint) as channel:
                stub = trace_service_pb2_grpc.TraceServiceStub(channel)  # type: ignore[no-untyped-call]
                # a record first, so the producer's sequence on the partition is under way
                await stub.Export(_one_trace_request(before, "before"), timeout=10)
                refused = await stub.Export(_one_trace_request(big, "big", 300_000), timeout=10)
                ok = await stub.Export(_one_trace_request(after, "after"), timeout=10)
        finally:
            await sidecar.shutdown()
    assert refused.partial_success.rejected_spans == 1
    assert not ok.HasField("partial_success") or ok.partial_success.rejected_spans == 0
    assert [r.key for r in await read_records(kafka_bootstrap, spans_topic, 2 + probes) if r.key != PROBE_KEY] == [
        before.hex().encode(),
        after.hex().encode(),
    ]


async def test_a_failed_producer_renewal_is_tried_again_by_the_next_export(
    kafka_bootstrap: str, topics: TopicsConfig, topic_factory: TopicFactory
) -> None:
    # The renewal after a refused record failed once (broker slow for a moment): the receiver was
    # left without a producer and answered every later Export "shutting down" until restarted.
    spans_topic = await topic_factory(1)
    sidecar = create_sidecar(sidecar_config(kafka_bootstrap, topics.model_copy(update={"spans": spans_topic})), env={})
    tries: list[int] = []
    async with asyncio.timeout(TIMEOUT_S):
        await sidecar.start()
        try:
            probes = await set_record_limit(kafka_bootstrap, spans_topic, 100_000)
            real_new = sidecar._new_producer

            async def slow_once() -> Any:
                tries.append(1)
                if len(tries) == 1:
                    raise TimeoutError("injected: the broker was slow for a moment")
                return await real_new()

            sidecar._new_producer = slow_once  # type: ignore[method-assign]
            async with grpc.aio.insecure_channel(sidecar.endpoint) as channel:
                stub = trace_service_pb2_grpc.TraceServiceStub(channel)  # type: ignore[no-untyped-call]
                await stub.Export(_one_trace_request(uuid.uuid4().bytes, "before"), timeout=10)
                refused = await stub.Export(_one_trace_request(uuid.uuid4().bytes, "big", 300_000), timeout=10)
                after = [uuid.uuid4().bytes for _ in range(2)]
                for trace_id in after:
                    await stub.Export(_one_trace_request(trace_id, "after"), timeout=10)
        finally:
            await sidecar.shutdown()
    assert refused.partial_success.rejected_spans == 1 and len(tries) == 2
    keys = [r.key for r in await read_records(kafka_bootstrap, spans_topic, 3 + probes) if r.key != PROBE_KEY]
    assert keys[1:] == [t.hex().encode() for t in after]


async def test_a_string_that_is_not_utf8_costs_the_sidecar_no_span(kafka_bootstrap: str, topics: TopicsConfig) -> None:
    # The Go Collector and SDKs pass such strings through; refused whole (UNKNOWN, not retried by
    # OTLP exporters), every trace of the batch was lost. Read with U+FFFD, both are forwarded.
    first, second = uuid.uuid4().bytes, uuid.uuid4().bytes
    request = ExportTraceServiceRequest()
    request.resource_spans.extend(_one_trace_request(first, "search").resource_spans)
    request.resource_spans.extend(_one_trace_request(second, "http").resource_spans)
    request.resource_spans[1].scope_spans[0].spans[0].attributes.add(key="http.url").value.string_value = "MARK\u00e9"
    raw = request.SerializeToString().replace("MARK\u00e9".encode(), b"MARK\xc3X")
    sidecar = create_sidecar(sidecar_config(kafka_bootstrap, topics), env={})
    async with asyncio.timeout(TIMEOUT_S):
        await sidecar.start()
        try:
            async with grpc.aio.insecure_channel(sidecar.endpoint) as channel:
                export = channel.unary_unary(
                    "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                    request_serializer=lambda b: b,
                    response_deserializer=ExportTraceServiceResponse.FromString,
                )
                response = await export(raw, timeout=10)
        finally:
            await sidecar.shutdown()
    assert response.partial_success.rejected_spans == 0
    records = await read_records(kafka_bootstrap, topics.spans, 2)
    assert {r.key for r in records} == {first.hex().encode(), second.hex().encode()}


async def test_a_sidecar_with_a_tenant_stamps_it_on_every_record(kafka_bootstrap: str, topics: TopicsConfig) -> None:
    # The agent's resource claims another tenant: the header the sidecar stamps wins at the service.
    config = sidecar_config(kafka_bootstrap, topics).model_copy(update={"tenant": "acme"})
    sidecar = create_sidecar(config, env={})
    trace_id = uuid.uuid4().bytes
    claim = KeyValue(key="toolwitness.tenant", value=AnyValue(string_value="globex"))
    request = ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource=OtlpResource(attributes=[claim]),
                scope_spans=[ScopeSpans(spans=[Span(trace_id=trace_id, span_id=b"\x01" * 8, name="s")])],
            )
        ]
    )
    async with asyncio.timeout(TIMEOUT_S):
        await sidecar.start()
        try:
            async with grpc.aio.insecure_channel(sidecar.endpoint) as channel:
                stub = trace_service_pb2_grpc.TraceServiceStub(channel)  # type: ignore[no-untyped-call]
                await stub.Export(request, timeout=10)
        finally:
            await sidecar.shutdown()
    [rec] = await read_records(kafka_bootstrap, topics.spans, 1)
    assert rec.key == trace_id.hex().encode() and list(rec.headers) == [("toolwitness-tenant", b"acme")]
    with pytest.raises(ValidationError, match="tenant"):
        SidecarConfig(tenant="acme corp")


async def test_the_sidecar_serves_health_readiness_and_metrics_on_its_admin_port(
    kafka_bootstrap: str, topics: TopicsConfig
) -> None:
    """``--admin-listen``: a platform team probes and scrapes the sidecar as it does the scorer."""
    spans, traces = captured_spans()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        admin_port = probe.getsockname()[1]
    cfg = sidecar_config(kafka_bootstrap, topics).model_copy(update={"admin_listen": f"127.0.0.1:{admin_port}"})
    started: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(run_sidecar(cfg, env={}, on_started=started.set_result))
    async with asyncio.timeout(TIMEOUT_S):
        receiver = await asyncio.shield(started)
        assert await admin_get(admin_port, "/healthz") == (200, "ok\n")
        assert (await admin_get(admin_port, "/readyz"))[0] == 200
        otlp = OTLPSpanExporter(endpoint=receiver.endpoint, insecure=True, timeout=10)
        try:
            assert await asyncio.to_thread(otlp.export, spans) is SpanExportResult.SUCCESS
        finally:
            await asyncio.to_thread(otlp.shutdown)
        status, metrics = await admin_get(admin_port, "/metrics")
        assert status == 200
        sample = 'toolwitness_spans_received_total{component="otlp_grpc"}'
        forwarded = [line for line in metrics.splitlines() if line.startswith(sample)]
        assert forwarded and float(forwarded[0].split()[-1]) >= len(spans), forwarded
        # forwarding has failed for longer than the readiness bound: not ready (the Service then
        # sends the agents' exports to another sidecar), still alive
        receiver.failing_since = time.monotonic() - 11
        assert (await admin_get(admin_port, "/readyz"))[0] == 503
        assert (await admin_get(admin_port, "/healthz"))[0] == 200
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    with pytest.raises(OSError):  # the admin port is closed with the sidecar
        socket.create_connection(("127.0.0.1", admin_port), timeout=5).close()
    assert len(await read_records(kafka_bootstrap, topics.spans, len(traces))) == len(traces)
    with pytest.raises(ValidationError, match="admin_listen"):
        SidecarConfig(admin_listen="9464")


async def test_run_sidecar_serves_until_cancelled(kafka_bootstrap: str, topics: TopicsConfig) -> None:
    spans, traces = captured_spans()
    started: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        run_sidecar(sidecar_config(kafka_bootstrap, topics), env={}, on_started=started.set_result)
    )
    async with asyncio.timeout(TIMEOUT_S):
        receiver = await asyncio.shield(started)
        otlp = OTLPSpanExporter(endpoint=receiver.endpoint, insecure=True, timeout=10)
        try:
            assert await asyncio.to_thread(otlp.export, spans) is SpanExportResult.SUCCESS
        finally:
            await asyncio.to_thread(otlp.shutdown)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert not receiver.running
    with pytest.raises(OSError):  # the port is closed
        socket.create_connection(("127.0.0.1", receiver.port), timeout=5).close()
    records = await read_records(kafka_bootstrap, topics.spans, len(traces))
    assert sorted(r.key.decode() for r in records) == sorted(traces)
