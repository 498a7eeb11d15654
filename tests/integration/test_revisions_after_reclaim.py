"""Broken completion claims and reclaimed traces, end to end on Kafka and Redis (from an
adversarial review of the service; each of these published a wrong or unrevised verdict before).

- A TRUE that needed complete coverage ("delete_db never ran", "search at most once") is revised
  when a late span breaks the claim, as a FALSE is.
- A complete, decided trace whose state was reclaimed leaves a tombstone: whatever recreates the
  state (a late span, a new expectation, a re-sent marker) starts from it -- late, evidence gone --
  so a retried export cannot "complete" what is left (FALSE for a tool that ran), and a late span
  still revises what was decided.
- A trace is reclaimed only when nothing else is pending on it.
- A record dropped unread marks its trace for the tenant its resources name (no header).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from scoring.models import ScoringExpectation, ToolCallRequirement, ToolsCalled, TraceScorable
from tests.integration.harness import (
    TOOL_TREES,
    control_client,
    expects,
    gone,
    history,
    make_config,
    new_span_id,
    new_trace_id,
    otlp_span,
    raw_producer,
    running_service,
    send_spans,
    until,
    verdict,
)

pytestmark = pytest.mark.integration


def versions(events: list[Any]) -> list[str]:
    return [v for _, v in history(events)]


@pytest.mark.parametrize("kind", ["never_ran", "max_count"])
async def test_a_true_that_needed_complete_coverage_is_revised_by_a_late_span(
    kafka_bootstrap: str, redis_url: str, kind: str
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url, scorers=TOOL_TREES)
    t0 = int(time.time() * 1000) - 5_000
    trace, root = new_trace_id(), new_span_id()
    async with running_service(cfg), control_client(cfg) as tw, raw_producer(cfg) as producer:
        await send_spans(
            producer,
            cfg,
            trace,
            otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50),
            otlp_span(trace, parent=root, tool="search", start_ms=t0 + 1, end_ms=t0 + 2),
        )
        scope = TraceScorable(trace_ids=(trace,))
        if kind == "never_ran":
            ident = await tw.expect(scope, expects("delete_db"), scorer="not_tools", deadline=timedelta(seconds=60))
            late = "delete_db"
        else:
            at_most_once = ToolsCalled(tools=(ToolCallRequirement(name="search", max_count=1),))
            once = ScoringExpectation(conditions=(at_most_once,))
            ident = await tw.expect(scope, once, deadline=timedelta(seconds=60))
            late = "search"
        await tw.mark_complete(trace, span_count=2)
        assert verdict(await tw.wait_for(ident, timeout=30)) == "true"
        await send_spans(producer, cfg, trace, otlp_span(trace, parent=root, tool=late, start_ms=t0 + 3, end_ms=t0 + 4))
        await until(lambda: len(tw.events(ident)) == 2)
        assert versions(tw.events(ident)) == ["true", "false"]  # the late span proves the opposite
        revised = max(tw.events(ident), key=lambda e: e.version)
        assert revised.trigger == "revision" and "late_span_after_completion" in revised.coverage.reasons


@pytest.mark.parametrize("between", ["nothing", "register", "marker"])
async def test_a_late_span_on_a_reclaimed_trace_revises_whatever_recreated_its_state(
    kafka_bootstrap: str, redis_url: str, between: str
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url, redis={"completed_ttl_seconds": 1})
    t0 = int(time.time() * 1000) - 5_000
    trace, root = new_trace_id(), new_span_id()
    async with (
        Redis.from_url(redis_url) as r,
        running_service(cfg) as service,
        control_client(cfg) as tw,
        raw_producer(cfg) as producer,
    ):
        await send_spans(
            producer,
            cfg,
            trace,
            otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50),
            otlp_span(trace, parent=root, tool="search", start_ms=t0 + 1, end_ms=t0 + 2),
        )
        scope = TraceScorable(trace_ids=(trace,))
        e1 = await tw.expect(scope, expects("delete_db"), deadline=timedelta(seconds=120))
        await tw.mark_complete(trace, span_count=2)
        assert verdict(await tw.wait_for(e1, timeout=30)) == "false"
        state = service.store.k.state("default", trace)
        await until(lambda: gone(r, state), timeout=20)  # reclaimed (completed_ttl_seconds)
        if between == "register":  # a re-scoring pass asks something else of the finished trace
            e2 = await tw.expect(scope, expects("search"), deadline=timedelta(seconds=4))
            await until(lambda: r.exists(state))
        elif between == "marker":  # the control plane re-sends its marker
            await tw.mark_complete(trace, span_count=2)
            await until(lambda: r.exists(state))
        late = otlp_span(trace, parent=root, tool="delete_db", start_ms=t0 + 3, end_ms=t0 + 4)
        await send_spans(producer, cfg, trace, late)
        await until(lambda: len(tw.events(e1)) == 2)
        assert versions(tw.events(e1)) == ["false", "true"]
        if between == "register":
            # its evidence ("search" ran) was reclaimed before it was asked: never FALSE
            ev = await tw.wait_for(e2, timeout=30)
            assert verdict(ev) == "undetermined" and "retention_expired" in ev.coverage.reasons


@pytest.mark.parametrize("mode", ["marker", "inferred"])
async def test_a_retried_export_does_not_complete_a_reclaimed_trace(
    kafka_bootstrap: str, redis_url: str, mode: str
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url, redis={"completed_ttl_seconds": 1}, completion={"mode": mode})
    trace, root = new_trace_id(), new_span_id()
    async with (
        Redis.from_url(redis_url) as r,
        running_service(cfg) as service,
        control_client(cfg) as tw,
        raw_producer(cfg) as producer,
    ):
        # The trace is exported to a quiet pipeline the service has seen caught up (its watermark
        # follows the clock: one second behind), and its spans ended just before the export. Spans
        # timed before the stack started were older than allowed_lateness + max_out_of_orderness
        # when exported: whenever the service had seen its empty partitions caught up first (often
        # under load), the root's inferred completion had passed already, the "search" record
        # read in the next batch was late, and the trace could never be FALSE (UNDETERMINED at
        # the deadline, as designed).
        await until(lambda: r.hget(service.watermarks.key, "global"))
        t0 = int(time.time() * 1000) - 100
        root_span = otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50)
        chat = otlp_span(
            trace, parent=root, name="chat", start_ms=t0 + 3, end_ms=t0 + 4, attrs={"gen_ai.operation.name": "chat"}
        )
        await send_spans(producer, cfg, trace, root_span, chat)
        await send_spans(
            producer, cfg, trace, otlp_span(trace, parent=root, tool="search", start_ms=t0 + 1, end_ms=t0 + 2)
        )
        scope = TraceScorable(trace_ids=(trace,))
        e1 = await tw.expect(scope, expects("delete_db"), deadline=timedelta(seconds=120))
        if mode == "marker":
            await tw.mark_complete(trace)  # count-less
        assert verdict(await tw.wait_for(e1, timeout=30)) == "false"
        state = service.store.k.state("default", trace)
        await until(lambda: gone(r, state), timeout=20)
        e2 = await tw.expect(scope, expects("search"), deadline=timedelta(seconds=6))
        if mode == "marker":
            await tw.mark_complete(trace)
        await until(lambda: r.exists(state))
        await send_spans(producer, cfg, trace, root_span, chat)  # an exporter retry: nothing new
        ev = await tw.wait_for(e2, timeout=40)
        assert verdict(ev) == "undetermined", ev.rationale  # it was FALSE: "search" did run


async def test_a_trace_is_not_reclaimed_while_another_expectation_is_pending_on_it(
    kafka_bootstrap: str, redis_url: str
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url, redis={"completed_ttl_seconds": 1})
    t0 = int(time.time() * 1000) - 5_000
    t1, t2, root1, root2 = new_trace_id(), new_trace_id(), new_span_id(), new_span_id()
    async with (
        Redis.from_url(redis_url) as r,
        running_service(cfg) as service,
        control_client(cfg) as tw,
        raw_producer(cfg) as producer,
    ):
        await send_spans(
            producer,
            cfg,
            t1,
            otlp_span(t1, span_id=root1, name="agent", start_ms=t0, end_ms=t0 + 50),
            otlp_span(t1, parent=root1, tool="search", start_ms=t0 + 1, end_ms=t0 + 2),
        )
        both = await tw.expect(
            TraceScorable(trace_ids=(t1, t2)), expects("search", "fetch"), deadline=timedelta(seconds=30)
        )
        only = await tw.expect(TraceScorable(trace_ids=(t1,)), expects("delete_db"), deadline=timedelta(seconds=60))
        await tw.mark_complete(t1, span_count=2)
        assert verdict(await tw.wait_for(only, timeout=30)) == "false"
        assert await r.pttl(service.store.k.state("default", t1)) > 60_000  # not shortened: `both` needs it
        await send_spans(
            producer,
            cfg,
            t2,
            otlp_span(t2, span_id=root2, name="agent", start_ms=t0 + 100, end_ms=t0 + 150),
            otlp_span(t2, parent=root2, tool="fetch", start_ms=t0 + 101, end_ms=t0 + 102),
        )
        assert verdict(await tw.wait_for(both, timeout=30)) == "true"


async def test_a_record_dropped_unread_marks_the_trace_of_the_tenant_its_resource_names(
    kafka_bootstrap: str, redis_url: str
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url, kafka={"max_record_bytes": 64 * 1024})
    t0 = int(time.time() * 1000) - 5_000
    trace, root = new_trace_id(), new_span_id()
    async with running_service(cfg), control_client(cfg, tenant="acme") as tw, raw_producer(cfg) as producer:
        await send_spans(
            producer,
            cfg,
            trace,
            otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50),
            tenant="acme",
        )
        big = otlp_span(
            trace,
            parent=root,
            tool="delete_db",
            start_ms=t0 + 1,
            end_ms=t0 + 2,
            attrs={"gen_ai.tool.call.arguments": "x" * 100_000},
        )
        await send_spans(producer, cfg, trace, big, tenant="acme")  # record_too_large: to the DLQ, unread
        ident = await tw.expect(TraceScorable(trace_ids=(trace,)), expects("delete_db"), deadline=timedelta(seconds=6))
        await tw.mark_complete(trace)  # count-less
        ev = await tw.wait_for(ident, timeout=30)
        assert verdict(ev) == "undetermined" and "span_rejected" in ev.coverage.reasons, ev.rationale
