"""The sweeper consumes a watermark wait while a batch, on an older watermark, changes what it waits for.

A trace complete by the watermark (inferred from its root's end, or a marker without a count) and
a session's trace set (a session marker) are queued to wait for the watermark; the sweeper takes
them off that queue when the watermark passes and judges what is pending on them then. A batch
reads the watermark first. When the sweeper consumed a wait in between (a newer watermark) and
the batch then registered an expectation, recorded the count marker of its last other trace, or
the missing parent of an orphan, the batch judged the expectation on its older watermark: it
stayed undecided, and nothing woke it before its deadline -- UNDETERMINED where the evidence said
FALSE. (The first of these failed CI as a "flaky" test under load.) And when the sweeper had
decided on the trace's completion, a count marker that contradicts it or a late span, applied on
the batch's older watermark, did not break the claim: the FALSE was never revised, not even by the
tool span that proves the opposite. Each window is forced here by holding the batch until the
sweeper did its part.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest

from collector.pipeline.service import ToolwitnessService
from collector.processors.trace_state import SESSION_WAIT, member
from scoring.models import SessionScorable, TraceScorable
from tests.integration.harness import (
    expects,
    history,
    make_config,
    new_span_id,
    new_trace_id,
    open_stack,
    otlp_span,
    running_service_prepared,
    send_spans,
    until,
    verdict,
)

pytestmark = pytest.mark.integration


async def hold_batch(service: ToolwitnessService, condition: Callable[[], Awaitable[bool]]) -> None:
    """Inside a batch: until ``condition()`` holds. The poll loop, held here, cannot share its
    partitions' progress meanwhile (the sweeper's watermark would stop): done here instead."""

    async def holds() -> bool:
        await service.watermarks.publish(await service.receiver.span_partitions_caught_up())
        return await condition()

    await until(holds, timeout=30)


async def hold_batch_until_consumed(service: ToolwitnessService, waiting: str) -> None:
    """Inside a batch: until the sweeper has taken ``waiting`` off the watermark queue."""
    zset = service.store.k.await_watermark
    await hold_batch(service, lambda: _none(service.redis.zscore(zset, waiting)))


async def _none(value: Awaitable[Any]) -> bool:
    return await value is None


@pytest.mark.parametrize("mode", ["inferred", "marker", "session"])
async def test_an_expectation_registered_as_its_traces_wait_is_consumed_is_still_judged_at_the_watermark(
    kafka_bootstrap: str, redis_url: str, mode: str
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url, completion={"mode": "inferred" if mode == "inferred" else "marker"})
    trace, root, session = new_trace_id(), new_span_id(), f"s-{new_span_id()}"
    # what waits for the watermark: the trace, or (a session marker) the session's trace set
    waiting = member("default", SESSION_WAIT + session if mode == "session" else trace)
    seen: dict[str, Any] = {}

    def prepare(service: ToolwitnessService) -> None:
        original = service.store.register_many

        async def register_many(exps: Any) -> list[bool]:
            # This batch read its watermark already; let the sweeper take the trace's wait off
            # the queue before the expectation is stored (the window the race needs).
            await hold_batch_until_consumed(service, waiting)
            seen["consumed_first"] = True
            return await original(exps)

        service.store.register_many = register_many  # type: ignore[method-assign]

    async with open_stack(cfg) as stack, running_service_prepared(cfg, prepare) as service:
        # the spans' times: fresh when sent (the stack can take seconds to start, and spans
        # older than the allowed lateness would be late to a watermark that follows the clock)
        t0 = int(time.time() * 1000)
        r, tw, producer = service.redis, stack.tw, stack.producer
        await send_spans(
            producer,
            cfg,
            trace,
            otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50, attrs={"session.id": session}),
            otlp_span(trace, parent=root, tool="search", start_ms=t0 + 1, end_ms=t0 + 2),
        )
        if mode == "marker":
            await tw.mark_complete(trace)  # without a count: complete when the watermark passes it
        elif mode == "session":
            await tw.mark_complete(trace, span_count=2)
            await tw.mark_session_complete(session)  # its trace set: complete when the watermark passes it
        # queued to wait for the watermark (its root ended / its marker came) before the expectation
        await until(lambda: r.zscore(service.store.k.await_watermark, waiting))
        scope = SessionScorable(session_id=session) if mode == "session" else TraceScorable(trace_ids=(trace,))
        ident = await tw.expect(scope, expects("delete_db"), deadline=timedelta(seconds=90))
        ev = await tw.wait_for(ident, timeout=30)  # it waited for the deadline (90 s) before
        assert seen.get("consumed_first") is True
        assert verdict(ev) == "false", ev.rationale
        assert ev.trigger == "watermark" and ev.coverage.complete


@pytest.mark.parametrize("shape", ["two_traces", "session"])
async def test_a_count_marker_completing_the_last_trace_as_another_wait_is_consumed_is_judged_at_the_watermark(
    kafka_bootstrap: str, redis_url: str, shape: str
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    t1, t2, session = new_trace_id(), new_trace_id(), f"s-{new_span_id()}"
    # t1 (a count-less marker) or the session (its marker) waits for the watermark; t2 gets a count
    waiting = member("default", SESSION_WAIT + session if shape == "session" else t1)
    seen: dict[str, Any] = {}

    def prepare(service: ToolwitnessService) -> None:
        original = service.store.mark_complete_many

        async def mark_complete_many(markers: Any, *args: Any, **kwargs: Any) -> Any:
            if any(m[1] == t2 for m in markers) and not seen:
                await hold_batch_until_consumed(service, waiting)
                seen["consumed_first"] = True
            return await original(markers, *args, **kwargs)

        service.store.mark_complete_many = mark_complete_many  # type: ignore[method-assign]

    attrs = {"session.id": session} if shape == "session" else {}
    async with open_stack(cfg) as stack, running_service_prepared(cfg, prepare) as service:
        # the spans' times: fresh when sent (the stack can take seconds to start, and spans
        # older than the allowed lateness would be late to a watermark that follows the clock)
        t0 = int(time.time() * 1000)
        r, tw, producer = service.redis, stack.tw, stack.producer
        for trace in (t1, t2):
            root = new_span_id()
            await send_spans(
                producer,
                cfg,
                trace,
                otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50, attrs=attrs),
                otlp_span(trace, parent=root, tool="search", start_ms=t0 + 1, end_ms=t0 + 2, attrs=attrs),
            )
        scope: SessionScorable | TraceScorable
        if shape == "session":
            await tw.mark_complete(t1, span_count=2)
            await tw.mark_session_complete(session)
            scope = SessionScorable(session_id=session)
        else:
            await tw.mark_complete(t1)
            scope = TraceScorable(trace_ids=(t1, t2))
        await until(lambda: r.zscore(service.store.k.await_watermark, waiting))
        ident = await tw.expect(scope, expects("delete_db"), deadline=timedelta(seconds=90))
        await until(lambda: r.zscore(service.store.k.deadlines, member("default", ident)))  # registered
        await tw.mark_complete(t2, span_count=2)
        ev = await tw.wait_for(ident, timeout=30)  # it waited for the deadline before
        assert seen.get("consumed_first") is True
        assert verdict(ev) == "false" and ev.trigger == "watermark", (verdict(ev), ev.trigger, ev.rationale)


async def test_an_orphans_parent_recorded_as_the_traces_wait_is_consumed_is_judged_at_the_watermark(
    kafka_bootstrap: str, redis_url: str
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url, completion={"mode": "inferred"})
    trace, root, parent = new_trace_id(), new_span_id(), new_span_id()
    waiting = member("default", trace)
    seen: dict[str, Any] = {}

    def prepare(service: ToolwitnessService) -> None:
        original = service.store.apply

        async def apply(groups: Any, watermark_ms: int) -> Any:
            if seen.get("armed") and ("default", trace) in groups and not seen.get("consumed_first"):
                await hold_batch_until_consumed(service, waiting)
                seen["consumed_first"] = True
            return await original(groups, watermark_ms)

        service.store.apply = apply  # type: ignore[method-assign]

    async with open_stack(cfg) as stack, running_service_prepared(cfg, prepare) as service:
        # the spans' times: fresh when sent (the stack can take seconds to start, and spans
        # older than the allowed lateness would be late to a watermark that follows the clock)
        t0 = int(time.time() * 1000)
        r, tw, producer = service.redis, stack.tw, stack.producer
        await send_spans(
            producer,
            cfg,
            trace,
            otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50),
            otlp_span(trace, parent=parent, tool="search", start_ms=t0 + 2, end_ms=t0 + 3),  # an orphan
        )
        await until(lambda: r.zscore(service.store.k.await_watermark, waiting))
        ident = await tw.expect(TraceScorable(trace_ids=(trace,)), expects("delete_db"), deadline=timedelta(seconds=90))
        await until(lambda: r.zscore(service.store.k.deadlines, member("default", ident)))
        seen["armed"] = True
        the_parent = otlp_span(trace, span_id=parent, parent=root, name="llm", start_ms=t0 + 1, end_ms=t0 + 40)
        await send_spans(producer, cfg, trace, the_parent)
        ev = await tw.wait_for(ident, timeout=30)
        assert seen.get("consumed_first") is True
        assert verdict(ev) == "false" and ev.trigger == "watermark", (verdict(ev), ev.trigger, ev.rationale)


@pytest.mark.parametrize("what", ["count_marker", "late_span"])
async def test_evidence_applied_on_an_older_watermark_breaks_a_completion_the_sweeper_decided_on(
    kafka_bootstrap: str, redis_url: str, what: str
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url, completion={"mode": "inferred"})
    trace, root = new_trace_id(), new_span_id()
    seen: dict[str, Any] = {}

    def prepare(service: ToolwitnessService) -> None:
        async def hold_until_decided_on_the_trace() -> None:
            async def settled() -> bool:
                raw = await service.redis.get(service.store.k.state("default", trace))
                return raw is not None and seen["ident"] in (json.loads(raw).get("de") or {})

            await hold_batch(service, settled)
            seen["decided_first"] = True

        original_mark, original_apply = service.store.mark_complete_many, service.store.apply

        async def mark_complete_many(markers: Any, *args: Any, **kwargs: Any) -> Any:
            if what == "count_marker" and any(m[1] == trace for m in markers) and not seen.get("decided_first"):
                await hold_until_decided_on_the_trace()
            return await original_mark(markers, *args, **kwargs)

        async def apply(groups: Any, watermark_ms: int) -> Any:
            if (
                what == "late_span"
                and seen.get("armed")
                and ("default", trace) in groups
                and not seen.get("decided_first")
            ):
                await hold_until_decided_on_the_trace()
            return await original_apply(groups, watermark_ms)

        service.store.mark_complete_many = mark_complete_many  # type: ignore[method-assign]
        service.store.apply = apply  # type: ignore[method-assign]

    async with open_stack(cfg) as stack, running_service_prepared(cfg, prepare) as service:
        # the spans' times: fresh when sent (the stack can take seconds to start, and spans
        # older than the allowed lateness would be late to a watermark that follows the clock)
        t0 = int(time.time() * 1000)
        r, tw, producer = service.redis, stack.tw, stack.producer
        await send_spans(
            producer,
            cfg,
            trace,
            otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50),
            otlp_span(trace, parent=root, name="llm", start_ms=t0 + 1, end_ms=t0 + 40),
        )
        ident = await tw.expect(TraceScorable(trace_ids=(trace,)), expects("delete_db"), deadline=timedelta(seconds=90))
        seen["ident"] = ident
        await until(lambda: r.zscore(service.store.k.deadlines, member("default", ident)))  # registered
        seen["armed"] = True
        if what == "count_marker":  # the agent counted 3 spans: one is still to come
            await tw.mark_complete(trace, span_count=3)
            await until(lambda: seen.get("decided_first"))
        # the missing (or late) tool span: delete_db did run
        await send_spans(
            producer, cfg, trace, otlp_span(trace, parent=root, tool="delete_db", start_ms=t0 + 2, end_ms=t0 + 30)
        )
        await until(lambda: (ev := tw.latest(ident)) is not None and verdict(ev) == "true", timeout=30)
        steps = history(tw.events(ident))
        assert steps[0] == (1, "false") and steps[-1][1] == "true", steps


async def test_a_presence_judged_by_a_batch_contradicting_a_published_false_revises_it(
    kafka_bootstrap: str, redis_url: str
) -> None:
    """The sweeper decides FALSE on the watermark's completion, without the tool span a batch (on
    an older watermark: not late) applied meanwhile; the batch judges TRUE and loses the
    compare-and-set after the FALSE was published: it is re-judged and revised to TRUE."""
    cfg = make_config(kafka_bootstrap, redis_url, completion={"mode": "inferred"})
    trace, root = new_trace_id(), new_span_id()
    seen: dict[str, Any] = {}

    def prepare(service: ToolwitnessService) -> None:
        original_apply, original_decide = service.store.apply, service.store.decide_many
        decision = service.store.k.decision

        async def apply(groups: Any, watermark_ms: int) -> Any:
            if seen.get("armed") and ("default", trace) in groups and "applied" not in seen:

                async def sweeper_judged() -> bool:
                    return "sweeper_judged" in seen

                await hold_batch(service, sweeper_judged)
                out = await original_apply(groups, watermark_ms)
                seen["applied"] = True
                return out
            return await original_apply(groups, watermark_ms)

        async def decide_many(items: Any) -> Any:
            mine = [it for it in items if it.expectation_id == seen.get("ident")]
            if mine and mine[0].verdict == "false" and "sweeper_judged" not in seen:
                seen["sweeper_judged"] = True  # judged without the span: let the batch apply it first
                await until(lambda: "applied" in seen, timeout=30)
            elif mine and mine[0].verdict == "true" and "batch_lost" not in seen:
                await until(lambda: service.redis.hget(decision("default", seen["ident"]), "pub"), timeout=30)
                out = await original_decide(items)
                seen["batch_lost"] = [d.won for it, d in zip(items, out, strict=True) if it is mine[0]]
                return out
            return await original_decide(items)

        service.store.apply = apply  # type: ignore[method-assign]
        service.store.decide_many = decide_many  # type: ignore[method-assign]

    async with open_stack(cfg) as stack, running_service_prepared(cfg, prepare) as service:
        # the spans' times: fresh when sent (the stack can take seconds to start, and spans
        # older than the allowed lateness would be late to a watermark that follows the clock)
        t0 = int(time.time() * 1000)
        r, tw, producer = service.redis, stack.tw, stack.producer
        await send_spans(
            producer, cfg, trace, otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50)
        )
        ident = await tw.expect(TraceScorable(trace_ids=(trace,)), expects("delete_db"), deadline=timedelta(seconds=90))
        seen["ident"] = ident
        await until(lambda: r.zscore(service.store.k.deadlines, member("default", ident)))  # registered
        seen["armed"] = True
        tool = otlp_span(trace, parent=root, tool="delete_db", start_ms=t0 + 2, end_ms=t0 + 30)
        await send_spans(producer, cfg, trace, tool)  # before the watermark passes the root's end
        await until(lambda: (ev := tw.latest(ident)) is not None and verdict(ev) == "true", timeout=30)
        assert seen["batch_lost"] == [False]
        steps = history(tw.events(ident))
        assert steps[0] == (1, "false") and steps[-1][1] == "true", steps
