"""Every input limit has a counted, documented outcome (issue 9; docs/limits.md).

One service with small limits: kafka.max_record_bytes=2048, limits.max_attributes_per_span=16,
limits.max_spans_per_trace=8, limits.max_tool_executions_per_trace=3. For each limit a trace
goes over it, with expectations on what was kept (TRUE still provable), on what was dropped and
on a tool that never ran (both: FALSE impossible -> UNDETERMINED at the deadline, with the
coverage reason the doc names), and the counter the doc names is checked.

Spans and executions dropped by the per-trace limits are counted, and a span over the
per-trace limit that arrives in a later batch still marks the trace (FALSE stays impossible).
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from collector.config import ServiceConfig
from collector.wire.gen import control_pb2
from tests.integration.harness import (
    control_client,
    counter_value,
    drop_stack,
    expectation_bytes,
    expects,
    header,
    make_config,
    marker_bytes,
    new_span_id,
    new_trace_id,
    otlp_request,
    otlp_span,
    raw_producer,
    read_until,
    running_service,
    until,
    verdict,
)

pytestmark = pytest.mark.integration

LIMITS = {"max_spans_per_trace": 8, "max_attributes_per_span": 16, "max_tool_executions_per_trace": 3}
DEADLINE = timedelta(seconds=5)


def limits_config(kafka_bootstrap: str, redis_url: str) -> ServiceConfig:
    return make_config(kafka_bootstrap, redis_url, kafka={"max_record_bytes": 2048}, limits=LIMITS)


def dlq_count(reason: str) -> float:
    return counter_value("toolwitness_dlq_records_total", {"component": "exporter/kafka", "reason": reason})


def dropped(component: str, reason: str) -> float:
    return counter_value("toolwitness_dropped_total", {"component": component, "reason": reason})


async def test_each_limit_has_a_counted_outcome(kafka_bootstrap: str, redis_url: str) -> None:
    started = time.monotonic()
    cfg = limits_config(kafka_bootstrap, redis_url)
    topics = cfg.kafka.topics
    t0 = int(time.time() * 1000) - 60_000
    want: dict[str, tuple[str, set[str]]] = {}  # expectation -> (verdict, coverage reasons it must carry)
    control: list[tuple[str, bytes]] = []
    records: list[tuple[str, bytes]] = []

    def expect(eid: str, trace_id: str, tool: str, verdict_: str, reasons: set[str] | None = None) -> None:
        want[eid] = (verdict_, reasons or set())
        control.append((eid, expectation_bytes(eid, [trace_id], expects(tool), deadline=DEADLINE)))

    # 1. record size: a valid record over kafka.max_record_bytes is never decoded.
    big = new_trace_id()
    root = new_span_id()
    big_spans = [otlp_span(big, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 100),
                 otlp_span(big, parent=root, name="t", tool="search", start_ms=t0 + 1, end_ms=t0 + 2,
                           attrs={"gen_ai.tool.call.arguments": "x" * 3000})]
    records.append((big, otlp_request(big_spans).SerializeToString()))
    expect("size-search", big, "search", "undetermined", {"awaiting_completion"})
    expect("size-absent", big, "delete_db", "undetermined", {"awaiting_completion"})
    control.append((big, marker_bytes(big, len(big_spans))))

    # 2. attributes per span: the span is refused, the trace marked, its other spans kept.
    attrs = new_trace_id()
    root = new_span_id()
    many = {f"k{i}": i for i in range(LIMITS["max_attributes_per_span"] + 1)}
    attr_spans = [otlp_span(attrs, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 100),
                  otlp_span(attrs, parent=root, name="t", tool="search", start_ms=t0 + 1, end_ms=t0 + 2),
                  otlp_span(attrs, parent=root, name="t", tool="hidden", start_ms=t0 + 3, end_ms=t0 + 4,
                            attrs=many)]
    records.append((attrs, otlp_request(attr_spans).SerializeToString()))
    expect("attrs-kept", attrs, "search", "true")
    expect("attrs-dropped", attrs, "hidden", "undetermined", {"limit_exceeded", "span_rejected"})
    expect("attrs-absent", attrs, "delete_db", "undetermined", {"limit_exceeded", "span_rejected"})
    control.append((attrs, marker_bytes(attrs, len(attr_spans))))

    # 3. spans per trace: 10 spans in one record, the last two over the limit of 8.
    many_spans = new_trace_id()
    root = new_span_id()
    sp = [otlp_span(many_spans, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 100),
          otlp_span(many_spans, parent=root, name="t", tool="search", start_ms=t0 + 1, end_ms=t0 + 2)]
    sp += [otlp_span(many_spans, parent=root, name=f"step {i}", start_ms=t0 + 3 + i, end_ms=t0 + 4 + i)
           for i in range(7)]
    sp.append(otlp_span(many_spans, parent=root, name="t", tool="late_tool", start_ms=t0 + 20, end_ms=t0 + 21))
    assert len(sp) == LIMITS["max_spans_per_trace"] + 2
    records.append((many_spans, otlp_request(sp).SerializeToString()))
    expect("spans-kept", many_spans, "search", "true")
    expect("spans-dropped", many_spans, "late_tool", "undetermined", {"limit_exceeded"})
    expect("spans-absent", many_spans, "delete_db", "undetermined", {"limit_exceeded"})
    control.append((many_spans, marker_bytes(many_spans, len(sp))))

    # 4. tool executions per trace: five executions, the last two over the limit of 3.
    execs = new_trace_id()
    root = new_span_id()
    ex = [otlp_span(execs, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 100)]
    ex += [otlp_span(execs, parent=root, name=f"t {n}", tool=n, start_ms=t0 + i, end_ms=t0 + i + 1)
           for i, n in enumerate(("a", "b", "c", "d", "e"))]
    records.append((execs, otlp_request(ex).SerializeToString()))
    expect("execs-kept", execs, "a", "true")
    expect("execs-dropped", execs, "e", "undetermined", {"limit_exceeded"})
    expect("execs-absent", execs, "delete_db", "undetermined", {"limit_exceeded"})
    control.append((execs, marker_bytes(execs, len(ex))))

    before = {
        "dlq record_too_large": dlq_count("record_too_large"),
        "dlq too_many_attributes": dlq_count("too_many_attributes"),
        "dropped too_many_attributes": dropped("pipeline/checkpoint", "too_many_attributes"),
    }
    try:
        async with control_client(cfg) as tw, raw_producer(cfg) as producer, running_service(cfg):
            await send(producer, topics.spans, records)
            await send(producer, topics.control, control)
            try:
                await asyncio.gather(*[tw.wait_for(e, timeout=30) for e in want])
            except TimeoutError:
                pytest.fail(f"not scored: {[e for e in want if not tw.events(e)]}")
            outcome: dict[str, str] = {}
            for eid, (v, reasons) in want.items():
                (ev,) = tw.events(eid)
                assert verdict(ev) == v, (eid, verdict(ev), ev.rationale)
                assert reasons <= set(ev.coverage.reasons), (eid, list(ev.coverage.reasons))
                if v == "undetermined":
                    assert ev.trigger == "deadline" and not ev.coverage.complete, (eid, ev.trigger)
                outcome[eid] = f"{v}{sorted(reasons) if reasons else ''}"
            dlq = await read_until(cfg.kafka.bootstrap_servers, topics.dlq, lambda r: len(r) >= 2)
        assert sorted(header(r, "toolwitness-dlq-reason") or "" for r in dlq) == [
            "record_too_large", "too_many_attributes"]
        counted = {
            "dlq record_too_large": dlq_count("record_too_large"),
            "dlq too_many_attributes": dlq_count("too_many_attributes"),
            "dropped too_many_attributes": dropped("pipeline/checkpoint", "too_many_attributes"),
        }
        assert {k: counted[k] - before[k] for k in counted} == {k: 1.0 for k in counted}
        print(f"\n[limits] {LIMITS}, max_record_bytes=2048: {outcome}; counted +1 each: {sorted(counted)}; "
              f"{time.monotonic() - started:.1f}s")
    finally:
        await drop_stack(cfg)


async def send(producer: AIOKafkaProducer, topic: str, items: list[tuple[str, bytes]], partition: int | None = None
               ) -> None:
    await asyncio.gather(*[await producer.send(topic, value=v, key=k.encode(), partition=partition)
                           for k, v in items])


async def test_spans_and_executions_over_the_per_trace_limits_are_counted(
    kafka_bootstrap: str, redis_url: str
) -> None:
    cfg = limits_config(kafka_bootstrap, redis_url)
    t0 = int(time.time() * 1000) - 60_000
    trace_id = new_trace_id()
    root = new_span_id()
    spans = [otlp_span(trace_id, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 100)]
    spans += [otlp_span(trace_id, parent=root, name=f"t{i}", tool=f"t{i}", start_ms=t0 + i, end_ms=t0 + i + 1)
              for i in range(9)]  # 10 spans (2 over 8), 9 executions of which 7 are kept (4 over 3)
    before = {r: dropped("processor/trace_state", r) for r in ("max_spans_per_trace", "max_tool_executions_per_trace")}
    try:
        async with raw_producer(cfg) as producer, running_service(cfg) as service:
            await producer.send_and_wait(cfg.kafka.topics.spans, value=otlp_request(spans).SerializeToString(),
                                         key=trace_id.encode())

            async def applied() -> Any:
                return await service.redis.exists(service.store.k.state("default", trace_id))

            await until(applied, timeout=30)
            async with service.batch_lock:
                pass
        got = {r: dropped("processor/trace_state", r) - b for r, b in before.items()}
        assert got == {"max_spans_per_trace": 2.0, "max_tool_executions_per_trace": 4.0}, got
    finally:
        await drop_stack(cfg)


async def test_span_over_the_limit_in_a_later_batch_keeps_false_impossible(
    kafka_bootstrap: str, redis_url: str
) -> None:
    cfg = limits_config(kafka_bootstrap, redis_url)
    topics = cfg.kafka.topics
    t0 = int(time.time() * 1000) - 60_000
    trace_id = new_trace_id()
    root = new_span_id()
    first = [otlp_span(trace_id, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 100)]
    first += [otlp_span(trace_id, parent=root, name=f"s{i}", start_ms=t0 + i, end_ms=t0 + i + 1) for i in range(7)]
    late = otlp_span(trace_id, parent=root, name="t", tool="late_tool", start_ms=t0 + 50, end_ms=t0 + 51)
    # Moves the event-time watermark past the marker's time (spans topic, same partition).
    clock = otlp_span(new_trace_id(), name="clock", start_ms=t0 + 30_000, end_ms=t0 + 30_001)
    marker = control_pb2.CompletionMarker(tenant="default", trace_id=trace_id)  # no span count
    marker.at.FromMilliseconds(t0 + 200)
    try:
        async with control_client(cfg) as tw, raw_producer(cfg) as producer, running_service(cfg) as service:
            await producer.send_and_wait(topics.spans, value=otlp_request(first).SerializeToString(),
                                         key=trace_id.encode(), partition=0)

            async def filled() -> bool:  # the first record applied: the trace holds max_spans_per_trace spans
                raw = await service.redis.get(service.store.k.state("default", trace_id))
                return raw is not None and int(json.loads(raw)["n"]) == len(first)

            await until(filled, timeout=30)
            await producer.send_and_wait(topics.spans, value=otlp_request([late]).SerializeToString(),
                                         key=trace_id.encode(), partition=0)
            await producer.send_and_wait(topics.control, value=expectation_bytes(
                "late-dropped", [trace_id], expects("late_tool"), deadline=timedelta(seconds=8)), key=b"late")
            await producer.send_and_wait(topics.control, value=control_pb2.ControlMessage(
                completion=marker).SerializeToString(), key=trace_id.encode())
            await producer.send_and_wait(topics.spans, value=otlp_request([clock]).SerializeToString(),
                                         key=b"clock", partition=0)
            ev = await tw.wait_for("late-dropped", timeout=30)
            assert verdict(ev) == "undetermined", (verdict(ev), ev.rationale, list(ev.coverage.reasons))
            assert "limit_exceeded" in ev.coverage.reasons
    finally:
        await drop_stack(cfg)


async def test_unreadable_record_keyed_by_trace_keeps_false_impossible(kafka_bootstrap: str, redis_url: str) -> None:
    """A record over max_record_bytes is dead-lettered unread; its key names the trace, which is
    marked so a marker without span count (completion by watermark) cannot prove absence."""
    cfg = limits_config(kafka_bootstrap, redis_url)
    topics = cfg.kafka.topics
    t0 = int(time.time() * 1000) - 60_000
    trace_id = new_trace_id()
    root = new_span_id()
    kept = [otlp_span(trace_id, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 100)]
    big = otlp_span(trace_id, parent=root, name="t", tool="lost_tool", start_ms=t0 + 50, end_ms=t0 + 51)
    big_request = otlp_request([big])
    # Pad the lost record past kafka.max_record_bytes with a long attribute.
    big_request.resource_spans[0].scope_spans[0].spans[0].name = "t" * (cfg.kafka.max_record_bytes + 100)
    clock = otlp_span(new_trace_id(), name="clock", start_ms=t0 + 30_000, end_ms=t0 + 30_001)
    marker = control_pb2.CompletionMarker(tenant="default", trace_id=trace_id)  # no span count
    marker.at.FromMilliseconds(t0 + 200)
    try:
        async with control_client(cfg) as tw, raw_producer(cfg) as producer, running_service(cfg):
            await producer.send_and_wait(topics.spans, value=otlp_request(kept).SerializeToString(),
                                         key=trace_id.encode(), partition=0)
            await producer.send_and_wait(topics.spans, value=big_request.SerializeToString(),
                                         key=trace_id.encode(), partition=0)
            await producer.send_and_wait(topics.control, value=expectation_bytes(
                "lost-record", [trace_id], expects("lost_tool"), deadline=timedelta(seconds=8)), key=b"lost")
            await producer.send_and_wait(topics.control, value=control_pb2.ControlMessage(
                completion=marker).SerializeToString(), key=trace_id.encode())
            await producer.send_and_wait(topics.spans, value=otlp_request([clock]).SerializeToString(),
                                         key=b"clock", partition=0)
            ev = await tw.wait_for("lost-record", timeout=30)
            assert verdict(ev) == "undetermined", (verdict(ev), ev.rationale, list(ev.coverage.reasons))
            assert "limit_exceeded" in ev.coverage.reasons
    finally:
        await drop_stack(cfg)
