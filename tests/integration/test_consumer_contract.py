"""The output topics as a downstream consumer reads them (a dashboard or eval pipeline that never
imports the service): what the records' keys and headers say, and how a score's timestamps
relate to the evidence it cites. Real service, Kafka and Redis."""

from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import UTC, datetime, timedelta

import pytest

from collector.wire.convert import decode_observation, decode_score_event
from scoring.models import TraceScorable
from tests.integration.harness import (
    control_client,
    drop_stack,
    expectation_bytes,
    expects,
    header,
    make_agent,
    make_config,
    marker_bytes,
    new_span_id,
    new_trace_id,
    otlp_request,
    otlp_span,
    raw_producer,
    read_all,
    read_until,
    running_service,
    send_spans,
    until,
    verdict,
)

pytestmark = pytest.mark.integration


async def test_dead_lettered_control_records_say_their_tenant(kafka_bootstrap: str, redis_url: str) -> None:
    """A DLQ reader serving several tenants routes span dead letters by the tenant header they
    came with; a control record has none, so its dead letter named no tenant although the
    service had decoded the message that names it. It now carries the score records' header."""
    cfg = make_config(kafka_bootstrap, redis_url)
    trace = new_trace_id()
    try:
        async with running_service(cfg), control_client(cfg, tenant="acme") as acme, raw_producer(cfg) as producer:
            await acme.expect(TraceScorable(trace_ids=(trace,)), expects("search"), scorer="no_such_tree",
                              expectation_id="unknown-tree")
            await producer.send_and_wait(cfg.kafka.topics.control, marker_bytes("not-a-trace-id", 1, tenant="globex"),
                                         key=b"bad-marker")
            # no tenant in the message: the service's default tenant is the one it stands for
            await producer.send_and_wait(
                cfg.kafka.topics.control, expectation_bytes("default-tree", [trace], expects("a"), scorer="nope",
                                                            tenant=""), key=b"default-tree")
            records = await read_until(kafka_bootstrap, cfg.kafka.topics.dlq, lambda rs: len(rs) >= 3)
        got = sorted((r.key, header(r, "toolwitness-dlq-reason"), header(r, "toolwitness-tenant")) for r in records)
        assert got == [
            (b"bad-marker", "invalid_marker", "globex"),
            (b"default-tree", "unknown_scorer", "default"),
            (b"unknown-tree", "unknown_scorer", "acme"),
        ]
        assert all(len([k for k, _ in r.headers if k == "toolwitness-tenant"]) == 1 for r in records)
    finally:
        await drop_stack(cfg)


@pytest.mark.parametrize("output_format", ["protobuf", "json"])
async def test_the_evidence_a_score_cites_is_not_captured_after_its_decision(
    kafka_bootstrap: str, redis_url: str, output_format: str
) -> None:
    """An auditor reading a score and the observations it cites expects the evidence snapshot to
    be taken no later than the verdict on it. The observation's ``captured_at`` was read after
    the evaluation's ``decided_at`` (by the time it took to build the snapshot), so every score
    was "decided" before the evidence it was decided on was captured."""
    cfg = make_config(kafka_bootstrap, redis_url, kafka={"output_format": output_format})
    try:
        async with running_service(cfg), control_client(cfg) as tw:
            agent = make_agent(cfg)
            try:
                ran = await asyncio.to_thread(agent.trace, "search")
                other = await asyncio.to_thread(agent.trace, "fetch")
            finally:
                await asyncio.to_thread(agent.close)
            await tw.mark_complete(other, span_count=agent.counter.count(other))
            ids = [await tw.expect(TraceScorable(trace_ids=(t,)), expects("search")) for t in (ran, other)]
            for eid in ids:
                await tw.wait_for(eid, timeout=30)
        scores = [decode_score_event(r.value) for r in await read_all(kafka_bootstrap, cfg.kafka.topics.scores)]
        observations = await read_all(kafka_bootstrap, cfg.kafka.topics.observations)
        captured = {r.key.decode(): decode_observation(r.value).captured_at.ToDatetime() for r in observations}
        assert sorted(verdict(e) for e in scores) == ["false", "true"]
        for ev in scores:
            (oid,) = ev.observation_ids
            assert captured[oid] <= ev.decided_at.ToDatetime(), (oid, captured[oid], ev.decided_at.ToDatetime())
    finally:
        await drop_stack(cfg)


async def test_json_scores_and_observations_read_with_json_alone(kafka_bootstrap: str, redis_url: str) -> None:
    """What score.proto promises a reader without protobuf, read with ``json`` only: enum names,
    RFC 3339 timestamps, "<seconds>s" durations, 64-bit integers as strings, defaults left out,
    and a revision that names the version it replaces under the same key."""
    cfg = make_config(kafka_bootstrap, redis_url, kafka={"output_format": "json"})
    t0 = int(time.time() * 1000) - 5_000
    trace, root = new_trace_id(), new_span_id()
    try:
        async with running_service(cfg), control_client(cfg) as tw, raw_producer(cfg) as producer:
            await send_spans(producer, cfg, trace,
                             otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50),
                             otlp_span(trace, parent=root, tool="fetch", start_ms=t0 + 1, end_ms=t0 + 2))
            await tw.mark_complete(trace, span_count=2)
            revised = await tw.expect(TraceScorable(trace_ids=(trace,)), expects("search"))
            assert verdict(await tw.wait_for(revised, timeout=30)) == "false"
            # a span beyond the marker's count breaks the completion claim: "search" did run
            await send_spans(producer, cfg, trace,
                             otlp_span(trace, parent=root, tool="search", start_ms=t0 + 3, end_ms=t0 + 4))
            undetermined = await tw.expect(TraceScorable(trace_ids=(new_trace_id(),)), expects("search"),
                                           deadline=timedelta(seconds=1))
            await until(lambda: len(tw.events(revised)) == 2 and tw.events(undetermined))
        records = await read_all(kafka_bootstrap, cfg.kafka.topics.scores)
        docs = [json.loads(r.value) for r in records]
        by_version = {(d["expectation_id"], d["version"]): (r, d) for r, d in zip(records, docs, strict=True)}
        for r, d in zip(records, docs, strict=True):
            assert header(r, "content-type") == "application/json"
            assert r.key == f"{d['tenant']}/{d['expectation_id']}".encode()
            assert re.fullmatch(r"[0-9a-f]{32}", d["score_id"])
            assert d["status"] in {"SCORE_STATUS_TRUE", "SCORE_STATUS_FALSE", "SCORE_STATUS_UNDETERMINED"}
            decided = datetime.fromisoformat(d["decided_at"])
            assert decided.utcoffset() == timedelta(0) and decided <= datetime.now(UTC)
            # the broker stamped the record after the decision (same machine's clock)
            assert decided.timestamp() * 1000 <= r.timestamp + 1
            assert re.fullmatch(r"\d+(\.\d+)?s", d["time_to_verdict"])
        first, second = by_version[(revised, 1)][1], by_version[(revised, 2)][1]
        assert (first["status"], second["status"]) == ("SCORE_STATUS_FALSE", "SCORE_STATUS_TRUE")
        assert second["trigger"] == "revision" and second["metadata"]["revises_version"] == "1"
        assert "late_span_after_completion" in second["coverage"]["reasons"]
        assert by_version[(revised, 1)][0].key == by_version[(revised, 2)][0].key
        assert by_version[(revised, 1)][0].partition == by_version[(revised, 2)][0].partition
        assert first["coverage"] == {"complete": True, "source": "COMPLETION_SOURCE_MARKER"}
        (_, lone) = by_version[(undetermined, 1)]
        assert lone["status"] == "SCORE_STATUS_UNDETERMINED" and "value" not in lone
        assert "complete" not in lone["coverage"]
        observations = {r.key.decode(): json.loads(r.value) for r in await read_all(
            kafka_bootstrap, cfg.kafka.topics.observations)}
        for d in docs:
            for oid in d["observation_ids"]:
                assert observations[oid]["observation_id"] == oid
        for e in observations[second["observation_ids"][0]]["tool_executions"]:
            assert isinstance(e["start_time_unix_nano"], str) and int(e["start_time_unix_nano"]) > 0
            assert e["status"] == "EXECUTION_STATUS_OK" and e["arguments_state"] == "CAPTURE_STATE_ABSENT"
    finally:
        await drop_stack(cfg)


def _tenant_request(tenants: list[str], trace: str, *, bad_span: bool) -> bytes:
    """A span record with one resource per tenant (its ``toolwitness.tenant`` attribute, no header),
    each holding a good span of ``trace`` and, with ``bad_span``, a span whose id is 3 bytes."""
    req = otlp_request([])
    del req.resource_spans[:]
    for t in tenants:
        rs = req.resource_spans.add()
        rs.resource.attributes.add(key="toolwitness.tenant").value.string_value = t
        spans = rs.scope_spans.add().spans
        spans.append(otlp_span(trace, start_ms=1000, end_ms=1001, tool="search"))
        if bad_span:
            spans.append(otlp_span(trace, span_id=b"abc", start_ms=1000, end_ms=1001))
    return req.SerializeToString()


async def test_dead_lettered_span_records_say_their_tenant(kafka_bootstrap: str, redis_url: str) -> None:
    """A span record names its tenant in a resource attribute when it has no header (an agent's
    own SDK, the Collector's kafkaexporter): its dead letter carried no tenant header, so a DLQ
    reader serving several tenants had to decode OTLP to route it. A record whose spans are of
    one tenant now carries it; one of several tenants carries none."""
    cfg = make_config(kafka_bootstrap, redis_url)
    trace = new_trace_id()
    whole = _tenant_request(["acme"], trace, bad_span=False)
    try:
        async with running_service(cfg), raw_producer(cfg) as producer:
            topic = cfg.kafka.topics.spans
            # unreadable: cut short (the framing still names its resource's tenant)
            await producer.send_and_wait(topic, whole[: len(whole) - 3], key=b"cut")
            # readable, one span rejected (its id is 3 bytes): the good span is kept
            await producer.send_and_wait(topic, _tenant_request(["globex"], trace, bad_span=True), key=b"bad-id")
            # two tenants' spans rejected in one record: no one tenant to name
            await producer.send_and_wait(topic, _tenant_request(["acme", "globex"], trace, bad_span=True), key=b"two")
            records = await read_until(kafka_bootstrap, cfg.kafka.topics.dlq, lambda rs: len(rs) >= 3)
        got = sorted((r.key, header(r, "toolwitness-dlq-reason"), header(r, "toolwitness-tenant")) for r in records)
        assert got == [
            (b"bad-id", "invalid_span", "globex"),
            (b"cut", "undecodable_protobuf", "acme"),
            (b"two", "invalid_span", None),
        ]
    finally:
        await drop_stack(cfg)
