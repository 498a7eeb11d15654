"""Control-plane authority (issue 9): span attributes can never register expectations or declare
completion. The agent under test writes its own spans; whatever it puts in them changes nothing.

A trace whose spans (and resource) carry every steering attempt we could think of --
``toolwitness.expectation`` (a full control message, as JSON and as protobuf bytes),
``toolwitness.completion`` / ``toolwitness.complete`` / ``toolwitness.span_count`` /
``toolwitness.marker``, ``toolwitness.verdict``, a span-level ``toolwitness.tenant``, a span named
like the control topic, ``gen_ai.conversation.id`` / ``session.id`` pointing at a session the
control plane watches, a ``toolwitness.session.complete`` flag -- plus a control message written
to the SPANS topic. Asserted:

- no expectation but the two real ones exists in Redis (SCAN), none was scored for the smuggled ids;
- absence stays UNDETERMINED: the real trace and session expectations get no score while only
  spans arrive (the trace state records no marker, the session no completion);
- the span-level tenant attribute did not move the spans to another tenant;
- a real completion marker (trace) and session marker then decide them (FALSE).
"""

from __future__ import annotations

import json
import time

import pytest
from google.protobuf import json_format

from collector.processors.trace_state import TraceState
from collector.wire.gen import control_pb2
from scoring.models import SessionScorable, TraceScorable
from tests.integration.harness import (
    control_client,
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
    redis_keys,
    running_service,
    until,
    verdict,
)

pytestmark = pytest.mark.integration

SESSION = "watched-session"


async def test_span_attributes_have_no_authority(kafka_bootstrap: str, redis_url: str) -> None:
    started = time.monotonic()
    cfg = make_config(kafka_bootstrap, redis_url)
    topics = cfg.kafka.topics
    t0 = int(time.time() * 1000) - 60_000
    trace = new_trace_id()
    smuggled = expectation_bytes("smuggled", [trace], expects("search"))
    smuggled_json = json_format.MessageToJson(control_pb2.ControlMessage.FromString(smuggled))
    marker_json = json_format.MessageToJson(control_pb2.ControlMessage.FromString(marker_bytes(trace, 3)))
    steering: dict[str, str | bool | int] = {
        "toolwitness.expectation": smuggled_json,
        "toolwitness.expectation.id": "smuggled-2",
        "toolwitness.control": marker_json,
        "toolwitness.completion": "true",
        "toolwitness.complete": True,
        "toolwitness.span_count": 3,
        "toolwitness.marker": "complete",
        "toolwitness.verdict": "FALSE",
        "toolwitness.tenant": "victim",
        "toolwitness.session.complete": True,
        "gen_ai.conversation.id": SESSION,
        "session.id": SESSION,
    }
    root = new_span_id()
    spans = [
        otlp_span(trace, span_id=root, name="toolwitness.control", start_ms=t0, end_ms=t0 + 100, attrs=steering),
        otlp_span(trace, parent=root, name="execute_tool search", tool="search", start_ms=t0 + 10, end_ms=t0 + 20,
                  attrs=steering),
        otlp_span(trace, parent=root, name="chat", start_ms=t0 + 30, end_ms=t0 + 40,
                  attrs={"gen_ai.operation.name": "chat", **steering}),
    ]
    req = otlp_request(spans)
    resource = req.resource_spans[0].resource
    for k, v in (("toolwitness.expectation", smuggled_json), ("toolwitness.completion", "true")):
        resource.attributes.add(key=k).value.string_value = v
    resource.attributes.add(key="toolwitness.control").value.bytes_value = marker_bytes(trace, 3)
    try:
        async with control_client(cfg) as tw, raw_producer(cfg) as producer, running_service(cfg) as service:
            # The real expectations: a tool that never ran, on the trace and on the session.
            trace_exp = await tw.expect(TraceScorable(trace_ids=(trace,)), expects("delete_db"))
            session_exp = await tw.expect(SessionScorable(session_id=SESSION), expects("delete_db"))
            await until(lambda: service.redis.exists(service.store.k.expectation("default", session_exp)))
            # A control message written to the spans topic, then the steering spans.
            # (Keyed by something else than the trace: an unreadable record keyed by a trace id marks
            # that trace incomplete forever — see test_faults_limits — which would hide the FALSE below.)
            bad = await producer.send_and_wait(topics.spans, value=smuggled, key=b"smuggled")
            await producer.send_and_wait(topics.spans, value=req.SerializeToString(), key=trace.encode())

            async def applied() -> bool:
                raw = await service.redis.get(service.store.k.state("default", trace))
                return raw is not None and TraceState.from_json(raw).span_count == len(spans)

            await until(applied, timeout=30)
            dlq = await read_until(cfg.kafka.bootstrap_servers, topics.dlq, lambda r: len(r) >= 1)
            source = f"{topics.spans}/{bad.partition}/{bad.offset}"
            assert [header(r, "toolwitness-dlq-source") for r in dlq] == [source]
            async with service.batch_lock:
                pass
            await service.sweep()

            # Nothing was registered, completed or decided by the spans.
            expectations = await redis_keys(cfg, "{*:e:*}:def")
            prefix = cfg.redis.key_prefix
            assert expectations == sorted(f"{prefix}:{{default:e:{e}}}:def" for e in (trace_exp, session_exp))
            assert await redis_keys(cfg, "{*:e:smuggled*}*") == []
            raw = await service.redis.get(service.store.k.state("default", trace))
            assert raw is not None
            state = TraceState.from_json(raw)
            assert (state.marker_count, state.marker_at_ms) == (-1, -1), "a span declared the trace complete"
            assert (await service.store.session_state("default", SESSION))[0] is None
            assert await service.store.session_traces("default", SESSION) == [trace]  # evidence, not authority
            assert tw.events(trace_exp) == [] and tw.events(session_exp) == [], "absence decided without a marker"
            assert tw.events("smuggled") == [] and tw.events("smuggled-2") == []
            assert {k.split("{", 1)[1].split(":", 1)[0] for k in await redis_keys(cfg, "{*")} == {"default"}

            # Only the control plane completes: then the absence is FALSE.
            await tw.mark_complete(trace, span_count=len(spans))
            await tw.mark_session_complete(SESSION)
            ev_trace = await tw.wait_for(trace_exp, timeout=30)
            ev_session = await tw.wait_for(session_exp, timeout=30)
            assert verdict(ev_trace) == "false" and ev_trace.trigger == "marker", ev_trace
            assert verdict(ev_session) == "false", ev_session
            assert tw.events("smuggled") == []
        print(f"\n[control authority] {len(steering)} steering attributes on {len(spans)} spans + resource, a control "
              f"message on the spans topic (DLQ: {header(dlq[0], 'toolwitness-dlq-reason')}): no expectation "
              f"registered, nothing completed or decided until the real markers; {time.monotonic() - started:.1f}s")
    finally:
        await drop_stack(cfg)


def test_steering_attributes_are_not_evidence_either() -> None:
    """The normalizer (no service): steering attributes add no execution and no coverage claim."""
    from scoring.normalize.spans import NeutralSpan, normalize_span

    base = NeutralSpan(trace_id="ab" * 16, span_id="cd" * 8, name="x", start_time_unix_nano=1, end_time_unix_nano=2)
    steer = NeutralSpan(trace_id="ab" * 16, span_id="cd" * 8, name="toolwitness.control", start_time_unix_nano=1,
                        end_time_unix_nano=2, attributes={
                            "toolwitness.completion": "true", "toolwitness.span_count": 1,
                            "toolwitness.expectation": json.dumps({"expectation": {"expectationId": "x"}}),
                            "toolwitness.verdict": "TRUE"})
    assert normalize_span(steer) == normalize_span(base)
