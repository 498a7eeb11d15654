"""Bad records go to the DLQ with a reason and never take good records with them (issue 4 acceptance 6).

Every record is produced BEFORE the service starts, bad ones interleaved with good ones on
every partition, so they are consumed in the same batches (checked: the test records what
each batch held). Asserted on what a downstream consumer reads: each bad record is on the
DLQ topic (found by its ``toolwitness-dlq-source`` header) with a ``toolwitness-dlq-reason``
naming the right reason; the admin endpoint's ``toolwitness_dlq_records`` counted them; every
good record's expectation is scored correctly.

Oversized records: the local broker keeps Kafka's default ``message.max.bytes`` (~1 MB), so the
spans topic of this test is created beforehand with ``max.message.bytes=8388608`` and the
producer uses ``max_request_size=8 MiB``. The service's own limit ``kafka.max_record_bytes`` is
set to 1 MiB here, and two valid OTLP records exceed it: one of 5 MB and one just above 1 MiB;
both must be dead-lettered as ``record_too_large``. The one just above the limit fits the
consumer's per-partition fetch size (limit + 64 KiB), so it arrives in the same batch as good
records. The 5 MB one shares a batch only when its partition comes first in a fetch response (a
broker returns a batch larger than the fetch size only as the first data of a response), which
the test does not control: for it the same-batch figure is reported, not asserted.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest
from aiokafka import AIOKafkaProducer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1 import trace_pb2

from collector.config import ServiceConfig
from collector.exporters.kafka import DLQ_PREVIEW_BYTES
from collector.telemetry.metrics import REGISTRY
from collector.wire.convert import scope_to_proto
from collector.wire.gen import control_pb2
from scoring.models import MessageScorable, TraceScorable
from tests.integration.harness import (
    BatchLog,
    control_client,
    create_topic,
    drop_stack,
    expectation_bytes,
    expects,
    header,
    make_config,
    marker_bytes,
    metric_value,
    new_span_id,
    new_trace_id,
    otlp_json,
    otlp_request,
    otlp_span,
    raw_producer,
    read_until,
    running_service_prepared,
    scrape_metrics,
    verdict,
)

pytestmark = pytest.mark.integration

DLQ_METRIC = "toolwitness_dlq_records_total"
COMPONENT = "exporter/kafka"


@dataclass
class Plan:
    """What goes where: records per partition in order, and what each bad one must become."""

    spans: dict[int, list[tuple[str, bytes]]] = field(default_factory=dict)  # partition -> [(label, value)]
    control: list[tuple[str, bytes]] = field(default_factory=list)  # [(label, value)], key = label
    #: a control record keyed otherwise (as the client keys by expectation id: one partition, in order)
    control_keys: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)  # bad label -> expected DLQ reason
    expected: dict[str, str] = field(default_factory=dict)  # expectation id -> verdict
    good_labels: set[str] = field(default_factory=set)


def good_trace(t0_ms: int, tool: str = "search") -> tuple[str, list[trace_pb2.Span], int]:
    trace_id = new_trace_id()
    root = new_span_id()
    spans = [
        otlp_span(trace_id, span_id=root, name="agent", start_ms=t0_ms, end_ms=t0_ms + 300),
        otlp_span(trace_id, parent=root, name=f"execute_tool {tool}", tool=tool, start_ms=t0_ms + 10,
                  end_ms=t0_ms + 40),
    ]
    return trace_id, spans, len(spans)


def add_good(
    plan: Plan, partition: int, t0_ms: int, n: int, encode: Callable[[ExportTraceServiceRequest], bytes]
) -> None:
    """A trace with a tool, as one record; a TRUE and a FALSE expectation on it, and its marker."""
    trace_id, spans, count = good_trace(t0_ms)
    label = f"good-{n}"
    plan.spans.setdefault(partition, []).append((label, encode(otlp_request(spans))))
    plan.good_labels.add(label)
    plan.control.append((f"{label}-true", expectation_bytes(f"{label}-true", [trace_id], expects("search"))))
    plan.control.append((f"{label}-false", expectation_bytes(f"{label}-false", [trace_id], expects("delete_db"))))
    plan.control.append((trace_id, marker_bytes(trace_id, count)))
    plan.expected[f"{label}-true"] = "true"
    plan.expected[f"{label}-false"] = "false"


async def produce_plan(producer: AIOKafkaProducer, cfg: ServiceConfig, plan: Plan) -> dict[str, tuple[str, int, int]]:
    """Produce every record; return label -> (topic, partition, offset)."""
    where: dict[str, tuple[str, int, int]] = {}
    topics = cfg.kafka.topics
    for partition, records in sorted(plan.spans.items()):
        for label, value in records:
            md = await producer.send_and_wait(topics.spans, value=value, key=label.encode(), partition=partition)
            where[label] = (topics.spans, md.partition, md.offset)
    for label, value in plan.control:
        md = await producer.send_and_wait(topics.control, value=value, key=plan.control_keys.get(label, label).encode())
        where[label] = (topics.control, md.partition, md.offset)
    return where


def dlq_baseline(reasons: Sequence[str]) -> dict[str, float]:
    return {
        r: REGISTRY.get_sample_value(DLQ_METRIC, {"component": COMPONENT, "reason": r}) or 0.0 for r in set(reasons)
    }


@dataclass
class Result:
    seen: dict[str, str]
    shared: dict[str, int]
    batches: int
    seconds: float


async def run_plan(cfg: ServiceConfig, plan: Plan, *, max_request_size: int = 1024 * 1024) -> Result:
    """Produce the plan, start the service, and check DLQ records, metrics and scores."""
    started = time.monotonic()
    async with control_client(cfg) as tw:
        async with raw_producer(cfg, max_request_size=max_request_size) as producer:
            where = await produce_plan(producer, cfg, plan)
        baseline = dlq_baseline(list(plan.reasons.values()))
        logs: list[BatchLog] = []
        async with running_service_prepared(cfg, lambda s: logs.append(BatchLog(s).install())) as service:
            try:
                await asyncio.gather(*[tw.wait_for(e, timeout=30) for e in plan.expected])
            except TimeoutError:
                pytest.fail(f"good records not scored: {[e for e in plan.expected if not tw.events(e)]}")
            for eid, want in plan.expected.items():
                events = tw.events(eid)
                assert len(events) == 1 and verdict(events[0]) == want, (eid, events)
            dlq = await read_until(
                cfg.kafka.bootstrap_servers, cfg.kafka.topics.dlq, lambda recs: len(recs) >= len(plan.reasons)
            )
            # Every DLQ record is the DLQ record of one of the bad records, with the right reason.
            source_of = {f"{t}/{p}/{o}": label for label, (t, p, o) in where.items()}
            seen: dict[str, str] = {}
            for rec in dlq:
                label = source_of[header(rec, "toolwitness-dlq-source") or ""]
                assert label not in plan.good_labels, f"good record {label} went to the DLQ"
                seen[label] = header(rec, "toolwitness-dlq-reason") or ""
                if plan.reasons.get(label) == "record_too_large":  # the DLQ keeps a preview of it
                    assert len(rec.value or b"") == DLQ_PREVIEW_BYTES
                    assert int(header(rec, "toolwitness-dlq-truncated-from") or 0) > 1024 * 1024
            assert seen == plan.reasons
            # Counted: scraped from the admin endpoint, as Prometheus would.
            text = await scrape_metrics(service.admin.bound_port)
            for reason, before in baseline.items():
                want_count = sum(1 for r in plan.reasons.values() if r == reason)
                got = metric_value(text, DLQ_METRIC, {"component": COMPONENT, "reason": reason}) - before
                assert got == want_count, (reason, got, want_count)
        # The bad records really shared batches with good ones.
        log = logs[0]
        shared: dict[str, int] = {}
        for label in plan.reasons:
            t, p, o = where[label]
            batch = log.batches[log.batch_of(t, p, o)]
            goods = [g for g in plan.good_labels | set(plan.expected) if where.get(g) and where[g] in batch]
            shared[label] = len(goods)
    return Result(seen, shared, len(log.batches), time.monotonic() - started)


def _proto(req: ExportTraceServiceRequest) -> bytes:
    return req.SerializeToString()


def bad_regex_expectation(expectation_id: str, trace_id: str) -> bytes:
    """An expectation whose argument matcher has an invalid regex (the client would refuse to build it)."""
    matcher = control_pb2.ArgumentMatcher(path="$.q", regex="([a-z")
    requirement = control_pb2.ToolCallRequirement(name="search", arguments=[matcher])
    msg = control_pb2.Expectation(
        expectation_id=expectation_id, tenant="default", scorer="tools",
        scope=scope_to_proto(TraceScorable(trace_ids=(trace_id,))),
        conditions=[control_pb2.Condition(tools_called=control_pb2.ToolsCalled(tools=[requirement]))],
    )
    return control_pb2.ControlMessage(expectation=msg).SerializeToString()


def huge_scope_expectation(expectation_id: str, trace_id: str, chars: int = 500_000) -> bytes:
    """A message-scoped expectation with a long response text: 500,000 characters take more than
    half of an observation record (900,000 B by default); 200,000 plain ones fit."""
    scope = MessageScorable(message_id="m-1", trace_ids=(trace_id,), response_text="x" * chars)
    msg = control_pb2.Expectation(expectation_id=expectation_id, tenant="default", scorer="tools",
                                  scope=scope_to_proto(scope), conditions=[control_pb2.Condition(
                                      tools_called=control_pb2.ToolsCalled(
                                          tools=[control_pb2.ToolCallRequirement(name="search")]))])
    return control_pb2.ControlMessage(expectation=msg).SerializeToString()


def one_span(trace_id: str | bytes, t0_ms: int, **attrs: str | int) -> ExportTraceServiceRequest:
    return otlp_request([otlp_span(trace_id, name="x", start_ms=t0_ms, end_ms=t0_ms + 1, attrs=attrs)])


async def test_bad_span_and_control_records_go_to_the_dlq(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = make_config(kafka_bootstrap, redis_url, kafka={"max_record_bytes": 1024 * 1024})
    # Room for the oversized records on the broker (see the module docstring).
    await create_topic(kafka_bootstrap, cfg.kafka.topics.spans, 4, {"max.message.bytes": str(8 * 1024 * 1024)})
    t0 = int(time.time() * 1000) - 60_000
    plan = Plan()
    _, spans, _ = good_trace(t0)
    whole = _proto(otlp_request(spans))
    big = _proto(one_span(new_trace_id(), t0, blob="x" * (5 * 1024 * 1024)))  # valid OTLP, 5 MB
    over = _proto(one_span(new_trace_id(), t0, blob="y" * (1024 * 1024 + 8 * 1024)))  # just above 1 MiB
    assert len(big) > 5 * 1024 * 1024 and 1024 * 1024 < len(over) < 1024 * 1024 + 16 * 1024
    bad = [
        ("garbage", b"\xff\xfe this is not protobuf \x00\x01\x02", "undecodable_protobuf"),
        ("truncated", whole[: len(whole) // 2], "undecodable_protobuf"),
        ("json", b'{"hello": "world"}', "undecodable_protobuf"),  # JSON, not OTLP, to the otlp_proto service
        ("short-trace-id", _proto(one_span(bytes(range(1, 16)), t0)), "invalid_span"),
        ("many-attributes", _proto(one_span(new_trace_id(), t0, **{f"a{i}": i for i in range(10_000)})),
         "too_many_attributes"),
        ("over-limit", over, "record_too_large"),
    ]
    # The 5 MB record first on partition 0 (a fetch returns an oversized batch only when it comes first);
    # then, on every partition, good and bad records alternate.
    plan.spans[0] = [("huge", big)]
    plan.reasons["huge"] = "record_too_large"
    n = 0
    for i, (label, value, reason) in enumerate(bad):
        add_good(plan, i % 4, t0 + 1000 * n, n, _proto)
        n += 1
        plan.spans[i % 4].append((label, value))
        plan.reasons[label] = reason
    for partition in range(4):
        add_good(plan, partition, t0 + 1000 * n, n, _proto)
        n += 1
    # One record holding a good span (of a scored trace) and a span with a 15-byte trace id: the good
    # span is kept, and the record is dead-lettered for the bad one.
    mixed_trace, mixed_spans, _ = good_trace(t0 + 1000 * n)
    mixed_spans.append(otlp_span(bytes(range(1, 16)), name="bad", start_ms=t0, end_ms=t0 + 1))
    plan.spans[1].append(("mixed", _proto(otlp_request(mixed_spans))))
    plan.reasons["mixed"] = "invalid_span"
    plan.control.append(("mixed-true", expectation_bytes("mixed-true", [mixed_trace], expects("search"))))
    plan.expected["mixed-true"] = "true"
    # the same id again with another definition: never silently ignored
    plan.control.append(("reused-id", expectation_bytes("mixed-true", [mixed_trace], expects("other_tool"))))
    plan.control_keys["reused-id"] = "mixed-true"
    plan.reasons["reused-id"] = "expectation_id_reused"
    # Bad control records among the good ones (the expectations and markers above).
    other = new_trace_id()
    plan.control.insert(1, ("control-garbage", b"\x00\xffgarbage"))
    plan.control.insert(4, ("unknown-scorer", expectation_bytes("unknown-scorer", [other], expects("search"),
                                                                 scorer="no_such_tree")))
    plan.control.insert(7, ("bad-regex", bad_regex_expectation("bad-regex", other)))
    plan.control.insert(9, ("huge-scope", huge_scope_expectation("huge-scope", other)))
    # Long but within the budget: registered and scored (six bytes a character, the worst case,
    # refused it once).
    long_trace, long_spans, _ = good_trace(t0 + 1000 * (n + 1))
    plan.spans[2].append(("long-scope-trace", _proto(otlp_request(long_spans))))
    plan.good_labels.add("long-scope-trace")
    plan.control.append(("long-scope", huge_scope_expectation("long-scope", long_trace, chars=200_000)))
    plan.expected["long-scope"] = "true"
    plan.reasons.update({"control-garbage": "undecodable_control", "unknown-scorer": "unknown_scorer",
                         "bad-regex": "invalid_expectation", "huge-scope": "expectation_too_large"})
    try:
        result = await run_plan(cfg, plan, max_request_size=8 * 1024 * 1024)
    finally:
        await drop_stack(cfg)
    print(f"\n[dlq otlp_proto] reasons {sorted(result.seen.items())}; good records in the bad record's batch "
          f"{result.shared}; {result.batches} batches; {result.seconds:.1f}s")
    assert all(v > 0 for label, v in result.shared.items() if label != "huge"), result.shared


async def test_bad_records_with_otlp_json_encoding(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = make_config(kafka_bootstrap, redis_url, kafka={"encoding": "otlp_json"})
    t0 = int(time.time() * 1000) - 60_000
    plan = Plan()
    _, spans, _ = good_trace(t0)
    bad_hex = otlp_json(one_span(new_trace_id(), t0)).replace(b'"traceId": "', b'"traceId": "zz', 1)
    bad = [
        ("json-not-otlp", b'{"hello": "world"}', "not_otlp_json"),
        ("not-json", b"\xff\xfe not json at all", "invalid_json"),
        ("protobuf", _proto(otlp_request(spans)), "invalid_json"),  # otlp_proto bytes to an otlp_json service
        ("bad-hex-id", bad_hex, "invalid_id"),
        ("short-trace-id", otlp_json(one_span(bytes(range(1, 16)), t0)), "invalid_span"),
    ]
    n = 0
    for i, (label, value, reason) in enumerate(bad):
        add_good(plan, i % 4, t0 + 1000 * n, n, otlp_json)
        n += 1
        plan.spans[i % 4].append((label, value))
        plan.reasons[label] = reason
    for partition in range(4):
        add_good(plan, partition, t0 + 1000 * n, n, otlp_json)
        n += 1
    # One record holding a good span (of a scored trace) and a span whose id is not hex: the good
    # span is kept and scored, and the record is dead-lettered for the bad one.
    mixed_trace, mixed_spans, _ = good_trace(t0 + 1000 * n)
    mixed_spans.append(otlp_span(new_trace_id(), name="bad", start_ms=t0, end_ms=t0 + 1))
    doc = json.loads(otlp_json(otlp_request(mixed_spans)))
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][-1]["spanId"] = "not-hex!"
    plan.spans[1].append(("mixed", json.dumps(doc).encode()))
    plan.reasons["mixed"] = "invalid_id"
    plan.control.append(("mixed-true", expectation_bytes("mixed-true", [mixed_trace], expects("search"))))
    plan.expected["mixed-true"] = "true"
    try:
        result = await run_plan(cfg, plan)
    finally:
        await drop_stack(cfg)
    print(f"\n[dlq otlp_json] reasons {sorted(result.seen.items())}; good records in the bad record's batch "
          f"{result.shared}; {result.batches} batches; {result.seconds:.1f}s")
    assert all(v > 0 for v in result.shared.values()), result.shared
