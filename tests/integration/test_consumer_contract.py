"""The output topics as a downstream consumer reads them (a dashboard or eval pipeline that never
imports the service): what the records' keys and headers say, and how a score's timestamps
relate to the evidence it cites. Real service, Kafka and Redis."""

from __future__ import annotations

import pytest

from scoring.models import TraceScorable
from tests.integration.harness import (
    control_client,
    drop_stack,
    expectation_bytes,
    expects,
    header,
    make_config,
    marker_bytes,
    new_trace_id,
    raw_producer,
    read_until,
    running_service,
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
