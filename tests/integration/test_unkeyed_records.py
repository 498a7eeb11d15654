"""Records not keyed by trace id (the Collector's kafkaexporter default, ``partition_traces_by_id:
false``) that cannot be used whole, on Kafka and Redis (from an input-handling review).

A record dead-lettered unread (cut short) still shows which traces it held: those traces can never
be proven complete, so a marker does not turn the evidence it carried into a FALSE. A string that
is not UTF-8 is read as U+FFFD, and a resource naming an invalid tenant costs only its own spans,
not those of the other agents batched with it.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from scoring.models import TraceScorable
from tests.integration.harness import (
    control_client,
    expects,
    make_config,
    new_span_id,
    new_trace_id,
    otlp_request,
    otlp_span,
    raw_producer,
    running_service,
    verdict,
)

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("broken", ["truncated", "invalid-utf8", "invalid-tenant"])
async def test_evidence_in_an_unkeyed_record_never_becomes_a_false(
    kafka_bootstrap: str, redis_url: str, broken: str
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    t0 = int(time.time() * 1000) - 5_000
    trace, root, other = new_trace_id(), new_span_id(), new_trace_id()
    agent = otlp_request([otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 300)])
    tool_record = otlp_request(
        [
            otlp_span(trace, parent=root, tool="search", start_ms=t0 + 10, end_ms=t0 + 40),
            otlp_span(other, name="http", start_ms=t0, end_ms=t0 + 5, attrs={"http.url": "MARK\u00e9"}),
        ]
    )
    if broken == "truncated":
        # cut inside the other agent's span: unreadable, dead-lettered whole
        raw = tool_record.SerializeToString()[:-3]
    elif broken == "invalid-utf8":
        # one byte that is not UTF-8, in another agent's span: read as U+FFFD, the record is kept
        raw = tool_record.SerializeToString().replace("MARK\u00e9".encode(), b"MARK\xc3X")
    else:
        rs = tool_record.resource_spans.add()
        rs.resource.attributes.add(key="toolwitness.tenant", value=AnyValue(string_value="Beta Corp"))
        rs.scope_spans.add().spans.add().CopyFrom(otlp_span(other, name="x", start_ms=t0, end_ms=t0 + 5))
        raw = tool_record.SerializeToString()
    async with running_service(cfg), control_client(cfg) as tw, raw_producer(cfg) as producer:
        await producer.send_and_wait(cfg.kafka.topics.spans, value=agent.SerializeToString())  # no key
        await producer.send_and_wait(cfg.kafka.topics.spans, value=raw)  # no key
        ident = await tw.expect(TraceScorable(trace_ids=(trace,)), expects("search"), deadline=timedelta(seconds=6))
        await tw.mark_complete(trace)  # no span count: complete once the watermark passes it
        ev = await tw.wait_for(ident, timeout=40)
    if broken == "truncated":
        # the search span was in the unread record: not seen, and never FALSE
        assert verdict(ev) == "undetermined", ev.rationale
        assert not ev.coverage.complete
    else:
        # the bad string read as U+FFFD / only the "Beta Corp" resource refused: search was applied
        assert verdict(ev) == "true", ev.rationale
