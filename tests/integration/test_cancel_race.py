"""A cancel processed while the sweeper judges the same expectation publishes no score.

The sweeper claims an expectation's deadline and judges it; the poll loop meanwhile processes the
client's cancel. The compare-and-set did not look at the cancellation: the sweeper's decision won
and its score went out -- to every client -- for an expectation cancelled before it was decided
(found by a race review; forced here by cancelling from inside the compare-and-set call).
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import pytest

from collector.pipeline.service import ToolwitnessService
from collector.processors.trace_state import member
from scoring.models import TraceScorable
from tests.integration.harness import (
    control_client,
    expects,
    gone,
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


async def test_a_cancel_processed_while_the_sweeper_decides_publishes_no_score(
    kafka_bootstrap: str, redis_url: str
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    t0 = int(time.time() * 1000)
    trace, root = new_trace_id(), new_span_id()
    seen: dict[str, Any] = {}

    def prepare(service: ToolwitnessService) -> None:
        original = service.store.decide_many
        k = service.store.k

        async def decide_many(items: Any) -> Any:
            ident = seen.get("cancelled_id")
            if ident and "result" not in seen and any(it.expectation_id == ident for it in items):
                # judged already (its deadline); the client cancels it now, the poll loop records it
                await seen["client"].cancel(ident)
                await until(lambda: service.redis.exists(k.cancelled("default", ident)))
                await until(lambda: _none(service.redis.zscore(k.deadlines, member("default", ident))))
                out = await original(items)
                seen["result"] = [d for it, d in zip(items, out, strict=True) if it.expectation_id == ident]
                return out
            return await original(items)

        service.store.decide_many = decide_many  # type: ignore[method-assign]

    async with (
        open_stack(cfg) as stack,
        running_service_prepared(cfg, prepare) as service,
        control_client(cfg) as observer,
    ):
        r, tw, producer = service.redis, stack.tw, stack.producer
        seen["client"] = tw
        agent = otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50)
        await send_spans(producer, cfg, trace, agent)
        scope = TraceScorable(trace_ids=(trace,))
        cancelled = await tw.expect(scope, expects("delete_db"), deadline=timedelta(seconds=3))
        seen["cancelled_id"] = cancelled
        # a sibling with a later deadline: judged by a later sweep, published after the cancelled one would be
        sibling = await tw.expect(scope, expects("search"), deadline=timedelta(seconds=5))
        assert verdict(await observer.wait_for(sibling, timeout=30)) == "undetermined"
        assert [d.won for d in seen["result"]] == [False]
        assert not await r.exists(service.store.k.decision("default", cancelled))  # nothing stored
        assert observer.events(cancelled) == [], observer.events(cancelled)


async def _none(value: Any) -> bool:
    return await value is None


async def test_a_decided_expectation_cancelled_later_is_not_judged_again_by_late_spans(
    kafka_bootstrap: str, redis_url: str
) -> None:
    """Decided FALSE, its trace reclaimed (the tombstone lists it as decided), then cancelled: the
    late spans that recreate the trace revise what was decided on it -- but not this one. Refused
    by the compare-and-set as cancelled, it must leave the trace's decided set, or every later
    batch on the trace judges it again (found by a review of the refusal)."""
    cfg = make_config(kafka_bootstrap, redis_url, redis={"completed_ttl_seconds": 1})
    t0 = int(time.time() * 1000) - 5_000
    trace, root = new_trace_id(), new_span_id()
    attempts: list[tuple[int, str]] = []
    applied: list[int] = []  # spans on the trace after each batch the service finished
    seen: dict[str, Any] = {}

    def prepare(service: ToolwitnessService) -> None:
        original_decide, original_process = service.store.decide_many, service.checkpoint.process
        state = service.store.k.state("default", trace)

        async def decide_many(items: Any) -> Any:
            attempts.extend((it.version, it.verdict) for it in items if it.expectation_id == seen.get("ident"))
            return await original_decide(items)

        async def process(batch: Any) -> Any:
            result = await original_process(batch)
            raw = await service.redis.get(state)
            applied.append(json.loads(raw)["n"] if raw else 0)
            return result

        service.store.decide_many = decide_many  # type: ignore[method-assign]
        service.checkpoint.process = process  # type: ignore[method-assign]

    async with open_stack(cfg) as stack, running_service_prepared(cfg, prepare) as service:
        r, tw, producer = service.redis, stack.tw, stack.producer
        agent = otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50)
        await send_spans(
            producer, cfg, trace, agent, otlp_span(trace, parent=root, tool="search", start_ms=t0 + 1, end_ms=t0 + 2)
        )
        ident = await tw.expect(
            TraceScorable(trace_ids=(trace,)), expects("delete_db"), deadline=timedelta(seconds=120)
        )
        seen["ident"] = ident
        await tw.mark_complete(trace, span_count=2)
        assert verdict(await tw.wait_for(ident, timeout=30)) == "false"
        state = service.store.k.state("default", trace)
        await until(lambda: gone(r, state), timeout=20)  # reclaimed: the tombstone lists it
        await tw.cancel(ident)
        await until(lambda: r.exists(service.store.k.cancelled("default", ident)))
        for i in range(5):  # late spans, one record each: each batch recreates or extends the state
            late = otlp_span(trace, parent=root, name=f"llm{i}", start_ms=t0 + 3 + i, end_ms=t0 + 4 + i)
            await send_spans(producer, cfg, trace, late)
            await until(lambda want=i + 1: applied and applied[-1] >= want)  # type: ignore[misc]
        assert attempts[0] == (1, "false")
        assert len(attempts) <= 2, attempts  # at most the one refused revision, not one per batch
        raw = await r.get(state)
        assert raw is not None and ident not in (json.loads(raw).get("de") or {})
