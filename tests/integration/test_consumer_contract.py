"""The output topics as a downstream consumer reads them (a dashboard or eval pipeline that never
imports the service): what the records' keys and headers say, and how a score's timestamps
relate to the evidence it cites. Real service, Kafka and Redis."""

from __future__ import annotations

import asyncio

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
    new_trace_id,
    raw_producer,
    read_all,
    read_until,
    running_service,
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
