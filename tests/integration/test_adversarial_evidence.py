"""Evidence an agent (or a confused control plane) could use to steer a verdict: none of it may
produce a FALSE from missing or contradicted evidence, and a FALSE decided on a claim that is
later contradicted is revised. Asserted on what the scores topic carries.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from collector.client import ToolwitnessClient
from collector.config import ServiceConfig
from collector.otel import KafkaSpanExporter, SpanCountingProcessor
from scoring.models import SessionScorable, TraceScorable
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
    settled,
    until,
    verdict,
)

pytestmark = pytest.mark.integration


async def _send(cfg_topic: str, producer: object, trace_id: str, *spans: object) -> None:
    req = otlp_request(list(spans))  # type: ignore[arg-type]
    await producer.send_and_wait(cfg_topic, req.SerializeToString(), key=trace_id.encode())  # type: ignore[attr-defined]


async def _decided_false(
    cfg: ServiceConfig, tw: ToolwitnessClient, producer: object, t0: int, tool: str
) -> tuple[str, bytes, str]:
    """A trace (root + 'search') complete by its count marker, and an expectation that ``tool``
    ran, decided FALSE. Returns (trace id, root span id, expectation id)."""
    trace, root = new_trace_id(), new_span_id()
    await _send(cfg.kafka.topics.spans, producer, trace,
                otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50),
                otlp_span(trace, parent=root, tool="search", start_ms=t0 + 1, end_ms=t0 + 2))
    ident = await tw.expect(TraceScorable(trace_ids=(trace,)), expects(tool))
    await tw.mark_complete(trace, span_count=2)
    assert verdict(await tw.wait_for(ident, timeout=30)) == "false"
    return trace, root, ident


async def _events(tw: ToolwitnessClient, ident: str, n: int) -> list[str]:
    async def enough() -> bool:
        return len({e.score_id for e in tw.events(ident)}) >= n

    await until(enough, timeout=30)
    by_version = {e.version: verdict(e) for e in tw.events(ident)}
    return [by_version[v] for v in sorted(by_version)]


async def test_a_span_id_reused_for_other_tool_evidence_is_a_conflict_not_a_silent_win(
    kafka_bootstrap: str, redis_url: str
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    t0 = int(time.time() * 1000) - 5_000
    async with running_service(cfg) as service, control_client(cfg) as tw, raw_producer(cfg) as producer:
        spans = cfg.kafka.topics.spans
        hidden, honest = new_trace_id(), new_trace_id()
        for trace, second_tool in ((hidden, "delete_db"), (honest, "search")):
            root, sid = new_span_id(), new_span_id()
            await _send(spans, producer, trace,
                        otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50),
                        otlp_span(trace, span_id=sid, parent=root, tool="search", start_ms=t0 + 1, end_ms=t0 + 2))
            # the same span id again: with other tool evidence (hidden) or as an exact replay (honest)
            await _send(spans, producer, trace, otlp_span(trace, span_id=sid, parent=root, tool=second_tool,
                                                          start_ms=t0 + 1, end_ms=t0 + 2))
        ids = {t: await tw.expect(TraceScorable(trace_ids=(t,)), expects("delete_db"), deadline=timedelta(seconds=4))
               for t in (hidden, honest)}
        for ident in ids.values():
            await settled(service, "default", ident)
        for t in (hidden, honest):
            await tw.mark_complete(t, span_count=2)
        honest_ev = await tw.wait_for(ids[honest], timeout=30)
        assert verdict(honest_ev) == "false" and honest_ev.trigger == "marker"  # an exact replay changes nothing
        # the conflicting copy keeps absence unprovable: no FALSE, UNDETERMINED at the deadline
        hidden_ev = await tw.wait_for(ids[hidden], timeout=30)
        assert verdict(hidden_ev) == "undetermined" and hidden_ev.trigger == "deadline"
        assert "conflicting_evidence" in hidden_ev.coverage.reasons
        assert len(tw.events(ids[hidden])) == 1


async def test_a_second_marker_with_another_count_revises_the_false_decided_on_the_first(
    kafka_bootstrap: str, redis_url: str
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    t0 = int(time.time() * 1000) - 5_000
    async with running_service(cfg), control_client(cfg) as tw, raw_producer(cfg) as producer:
        trace, _, ident = await _decided_false(cfg, tw, producer, t0, "delete_db")
        await tw.mark_complete(trace, span_count=3)  # the producer now claims another span
        versions = await _events(tw, ident, 2)
        assert versions == ["false", "undetermined"]  # revised: the claims disagree
        (revised,) = [e for e in tw.events(ident) if e.version == 2]
        assert "conflicting_completion" in revised.coverage.reasons and revised.trigger == "revision"


async def test_spans_cut_by_the_sdks_attribute_limit_never_prove_absence(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    provider = TracerProvider(sampler=ALWAYS_ON, span_limits=SpanLimits(max_span_attribute_length=12))
    counter = SpanCountingProcessor()
    provider.add_span_processor(counter)
    provider.add_span_processor(SimpleSpanProcessor(KafkaSpanExporter(bootstrap_servers=kafka_bootstrap,
                                                                      topic=cfg.kafka.topics.spans)))
    tracer = provider.get_tracer("limited-agent")
    async with running_service(cfg), control_client(cfg) as tw:
        with tracer.start_as_current_span("agent", context=Context()) as root:
            with tracer.start_as_current_span("execute_tool", attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "delete_database"}):
                pass  # exported as "delete_datab": the name was cut to 12 characters
            trace = f"{root.get_span_context().trace_id:032x}"
        ident = await tw.expect(TraceScorable(trace_ids=(trace,)), expects("delete_database"),
                                deadline=timedelta(seconds=4))
        # nor presence: the cut name is not a tool that ran (it used to be TRUE)
        cut = await tw.expect(TraceScorable(trace_ids=(trace,)), expects("delete_datab"),
                              deadline=timedelta(seconds=4))
        await tw.mark_complete(trace, span_count=counter.count(trace))
        ev = await tw.wait_for(ident, timeout=30)
        assert verdict(ev) == "undetermined" and ev.trigger == "deadline"  # it used to be FALSE, complete
        assert "attribute_length_limited" in ev.coverage.reasons
        ev = await tw.wait_for(cut, timeout=30)
        assert verdict(ev) == "undetermined" and ev.trigger == "deadline"
    provider.shutdown()


def _session_trace(trace: str, session: str, tool: str, t0: int) -> list[object]:
    root = new_span_id()
    attrs = {"gen_ai.conversation.id": session}
    return [otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50, attrs=attrs),
            otlp_span(trace, parent=root, tool=tool, start_ms=t0 + 1, end_ms=t0 + 2, attrs=attrs)]


async def test_a_session_trace_whose_spans_trail_its_marker_is_waited_for(kafka_bootstrap: str, redis_url: str) -> None:
    # The harness marks both traces and the session complete; trace 2's spans are still in flight.
    cfg = make_config(kafka_bootstrap, redis_url)
    t0 = int(time.time() * 1000) - 5_000
    async with running_service(cfg) as service, control_client(cfg) as tw, raw_producer(cfg) as producer:
        spans, session = cfg.kafka.topics.spans, f"s-{new_trace_id()[:8]}"
        first, second = new_trace_id(), new_trace_id()
        await _send(spans, producer, first, *_session_trace(first, session, "search", t0))
        ident = await tw.expect(SessionScorable(session_id=session), expects("delete"))
        await settled(service, "default", ident)
        await tw.mark_complete(first, span_count=2)
        await tw.mark_complete(second, span_count=2)
        await tw.mark_session_complete(session)
        # the service has taken the session marker (and swept) before trace 2's spans arrive
        await until(lambda: service.redis.exists(service.store.k.session_complete("default", session)))
        async with service.batch_lock:
            pass
        await service.sweep()
        assert tw.events(ident) == []
        await _send(spans, producer, second, *_session_trace(second, session, "delete", t0 + 100))
        ev = await tw.wait_for(ident, timeout=30)
        assert verdict(ev) == "true" and ev.version == 1  # never a FALSE first


async def test_a_trace_joining_a_completed_session_revises_its_false(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    t0 = int(time.time() * 1000) - 5_000
    async with running_service(cfg), control_client(cfg) as tw, raw_producer(cfg) as producer:
        spans, session = cfg.kafka.topics.spans, f"s-{new_trace_id()[:8]}"
        first, late = new_trace_id(), new_trace_id()
        await _send(spans, producer, first, *_session_trace(first, session, "search", t0))
        ident = await tw.expect(SessionScorable(session_id=session), expects("delete"))
        await tw.mark_complete(first, span_count=2)
        await tw.mark_session_complete(session)
        assert verdict(await tw.wait_for(ident, timeout=30)) == "false"  # complete: the claim says so
        await _send(spans, producer, late, *_session_trace(late, session, "delete", t0 + 100))
        assert await _events(tw, ident, 2) == ["false", "true"]  # the claim was broken: revised
        (revised,) = [e for e in tw.events(ident) if e.version == 2]
        assert revised.trigger == "revision" and "late_span_after_completion" in revised.coverage.reasons


async def test_claims_broken_later_all_revise_the_false(kafka_bootstrap: str, redis_url: str) -> None:
    """Round 2: a count marker contradicting a count-less completion; a span the limit drops after
    completion; a late span inside a trace of a completed session; a re-sent session marker then
    a joining trace. Each FALSE decided on the earlier claim gets version 2."""
    cfg = make_config(kafka_bootstrap, redis_url, limits={"max_spans_per_trace": 3})
    t0 = int(time.time() * 1000) - 5_000
    async with running_service(cfg), control_client(cfg) as tw, raw_producer(cfg) as producer:
        spans = cfg.kafka.topics.spans

        async def trace_of(tool: str = "search", session: str | None = None) -> tuple[str, bytes]:
            trace, root = new_trace_id(), new_span_id()
            attrs = {"gen_ai.conversation.id": session} if session else None
            await _send(spans, producer, trace,
                        otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50, attrs=attrs),
                        otlp_span(trace, parent=root, tool=tool, start_ms=t0 + 1, end_ms=t0 + 2, attrs=attrs))
            return trace, root

        async def late_span(trace: str, root: bytes, tool: str = "delete", session: str | None = None) -> None:
            attrs = {"gen_ai.conversation.id": session} if session else None
            await _send(spans, producer, trace,
                        otlp_span(trace, parent=root, tool=tool, start_ms=t0 + 3, end_ms=t0 + 4, attrs=attrs))

        # 1. count-less marker (complete once the watermark passes it), then a count that disagrees
        countless, _ = await trace_of()
        e1 = await tw.expect(TraceScorable(trace_ids=(countless,)), expects("delete"))
        await tw.mark_complete(countless)
        assert verdict(await tw.wait_for(e1, timeout=30)) == "false"
        await tw.mark_complete(countless, span_count=3)
        # 2. complete by count, then a span beyond max_spans_per_trace: dropped, but late
        full, root_full = await trace_of()
        e2 = await tw.expect(TraceScorable(trace_ids=(full,)), expects("delete"))
        await late_span(full, root_full, tool="lookup")  # 3 spans: the limit
        await tw.mark_complete(full, span_count=3)
        assert verdict(await tw.wait_for(e2, timeout=30)) == "false"
        await late_span(full, root_full)  # the 4th span: over the limit
        # 3. a session complete with its one trace; then a late span inside that trace
        s3 = f"s-{new_trace_id()[:8]}"
        t3, root3 = await trace_of(session=s3)
        e3 = await tw.expect(SessionScorable(session_id=s3), expects("delete"))
        await tw.mark_complete(t3, span_count=2)
        await tw.mark_session_complete(s3)
        assert verdict(await tw.wait_for(e3, timeout=30)) == "false"
        await late_span(t3, root3, session=s3)
        # 4. a session decided FALSE, its marker re-sent, then a trace joins it
        s4 = f"s-{new_trace_id()[:8]}"
        t4, _ = await trace_of(session=s4)
        e4 = await tw.expect(SessionScorable(session_id=s4), expects("delete"))
        await tw.mark_complete(t4, span_count=2)
        await tw.mark_session_complete(s4)
        assert verdict(await tw.wait_for(e4, timeout=30)) == "false"
        await tw.mark_session_complete(s4)  # re-sent: the first claim holds
        await trace_of(tool="delete", session=s4)

        assert await _events(tw, e1, 2) == ["false", "undetermined"]
        assert await _events(tw, e2, 2) == ["false", "undetermined"]
        assert await _events(tw, e3, 2) == ["false", "true"]
        assert await _events(tw, e4, 2) == ["false", "true"]


async def test_a_session_whose_marker_came_first_is_decided_at_its_last_trace_marker(
    kafka_bootstrap: str, redis_url: str
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    t0 = int(time.time() * 1000) - 5_000
    async with running_service(cfg) as service, control_client(cfg) as tw, raw_producer(cfg) as producer:
        session, trace = f"s-{new_trace_id()[:8]}", new_trace_id()
        await _send(cfg.kafka.topics.spans, producer, trace, *_session_trace(trace, session, "search", t0))
        ident = await tw.expect(SessionScorable(session_id=session), expects("delete"),
                                deadline=timedelta(seconds=45))
        await tw.mark_session_complete(session)
        # the watermark passes the session marker; the trace still has no marker: nothing yet
        marker_at = int(time.time() * 1000)
        await until(lambda: service.watermarks.global_watermark(), timeout=30)

        async def past() -> bool:
            return await service.watermarks.global_watermark() >= marker_at + cfg.completion.allowed_lateness_ms

        await until(past, timeout=30)
        await service.sweep()
        assert tw.events(ident) == []
        await tw.mark_complete(trace, span_count=2)
        ev = await tw.wait_for(ident, timeout=15)  # at the trace's marker, not at the 45 s deadline
        assert verdict(ev) == "false" and ev.trigger != "deadline"


async def test_a_late_span_after_the_state_was_reclaimed_still_revises(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = make_config(kafka_bootstrap, redis_url, redis={"completed_ttl_seconds": 1})
    t0 = int(time.time() * 1000) - 5_000
    async with running_service(cfg) as service, control_client(cfg) as tw, raw_producer(cfg) as producer:
        trace, root, ident = await _decided_false(cfg, tw, producer, t0, "delete")
        key = service.store.k.state("default", trace)

        async def reclaimed() -> bool:
            return not await service.redis.exists(key)

        await until(reclaimed, timeout=30)  # complete and decided: its state is gone after 1 s
        await _send(cfg.kafka.topics.spans, producer, trace,
                    otlp_span(trace, parent=root, tool="delete", start_ms=t0 + 3, end_ms=t0 + 4))
        assert await _events(tw, ident, 2) == ["false", "true"]
