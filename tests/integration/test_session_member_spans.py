"""A session's expectations are judged on every trace of it, whenever one gains evidence.

They are indexed under the session, not under its traces: a batch re-judged them only when a
trace newly joined the session, on a session marker or a member's count marker, or at the
deadline. So spans on a trace already in the session (presence: "delete_db ran"), a member's
count-less marker completing the session's last trace, or the record after a late trace's first
one (a revision to UNDETERMINED the new spans decide) waited for the deadline, or for ever.
Found by a randomized differential tester (service vs the library on the same evidence).
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest

from collector.wire.gen import control_pb2
from scoring.models import ScoringExpectation, SessionScorable, ToolCallRequirement, ToolsCalled
from tests.integration.harness import (
    control_client,
    drop_stack,
    history,
    make_config,
    marker_bytes,
    new_span_id,
    new_trace_id,
    otlp_request,
    otlp_span,
    raw_producer,
    running_service,
    until,
)

pytestmark = pytest.mark.integration

DELETE_DB = ScoringExpectation(conditions=(ToolsCalled(tools=(ToolCallRequirement(name="delete_db"),)),))


def _marker(**target: str) -> bytes:
    m = control_pb2.CompletionMarker(tenant="default", **target)
    m.at.GetCurrentTime()
    return control_pb2.ControlMessage(completion=m).SerializeToString(deterministic=True)


async def test_a_sessions_expectations_follow_the_evidence_of_its_traces(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    t0 = int(time.time() * 1000) - 2000

    def root(trace: str, span: str, session: str) -> object:
        return otlp_span(trace, span_id=span, name="agent", start_ms=t0, end_ms=t0 + 100, attrs={"session.id": session})

    try:
        async with running_service(cfg) as service, control_client(cfg) as tw, raw_producer(cfg) as producer:

            async def spans(trace: str, *items: object) -> None:
                await producer.send_and_wait(cfg.kafka.topics.spans, otlp_request(list(items)).SerializeToString(),
                                             key=trace.encode())

            async def control(key: str, value: bytes) -> None:
                await producer.send_and_wait(cfg.kafka.topics.control, value, key=key.encode())

            async def linked(session: str, trace: str) -> bool:
                return trace in await service.store.session_traces("default", session)

            # (a) presence on a trace already in the session decides at once, not at the deadline
            sa, ta, ra = f"sa-{new_trace_id()[:8]}", new_trace_id(), new_span_id()
            ea = await tw.expect(SessionScorable(session_id=sa), DELETE_DB, deadline=timedelta(seconds=60))
            await spans(ta, root(ta, ra, sa))
            await until(lambda: linked(sa, ta))
            await spans(ta, otlp_span(ta, parent=ra, tool="delete_db", start_ms=t0 + 10, end_ms=t0 + 20))
            event = await tw.wait_for(ea, timeout=30)
            assert (event.value, event.trigger) == ("true", "span"), event.rationale

            # (b) a member's count-less marker completing the session decides it before the deadline
            sb, tb, rb = f"sb-{new_trace_id()[:8]}", new_trace_id(), new_span_id()
            eb = await tw.expect(SessionScorable(session_id=sb), DELETE_DB, deadline=timedelta(seconds=60))
            await spans(tb, root(tb, rb, sb), otlp_span(tb, parent=rb, tool="search", start_ms=t0 + 10, end_ms=t0 + 20))
            await until(lambda: linked(sb, tb))
            await control(sb, _marker(session_id=sb))
            await control(tb, _marker(trace_id=tb))
            event = await tw.wait_for(eb, timeout=30)
            assert event.value == "false" and event.trigger != "deadline", (event.trigger, event.rationale)

            # (c) after the deadline a trace joins the complete session (FALSE -> UNDETERMINED); its
            # next record shows delete_db: the same spans in one record would have given TRUE
            sc, t1, r1 = f"sc-{new_trace_id()[:8]}", new_trace_id(), new_span_id()
            registered = time.monotonic()
            ec = await tw.expect(SessionScorable(session_id=sc), DELETE_DB, deadline=timedelta(seconds=4))
            await spans(t1, root(t1, r1, sc), otlp_span(t1, parent=r1, tool="search", start_ms=t0 + 10, end_ms=t0 + 20))
            await control(t1, marker_bytes(t1, 2))
            await control(sc, _marker(session_id=sc))
            await until(lambda: history(tw.events(ec)) == [(1, "false")], timeout=30)
            await asyncio.sleep(max(0.0, registered + 5 - time.monotonic()))  # past the deadline: wall time
            t2, r2 = new_trace_id(), new_span_id()
            await spans(t2, root(t2, r2, sc))
            await until(lambda: len(tw.events(ec)) >= 2, timeout=30)
            await spans(t2, otlp_span(t2, parent=r2, tool="delete_db", start_ms=t0 + 210, end_ms=t0 + 220))
            await until(lambda: len(tw.events(ec)) >= 3, timeout=30)
            assert history(tw.events(ec)) == [(1, "false"), (2, "undetermined"), (3, "true")]
    finally:
        await drop_stack(cfg)
