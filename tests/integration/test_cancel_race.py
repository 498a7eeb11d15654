"""A cancel processed while the sweeper judges the same expectation publishes no score.

The sweeper claims an expectation's deadline and judges it; the poll loop meanwhile processes the
client's cancel. The compare-and-set did not look at the cancellation: the sweeper's decision won
and its score went out -- to every client -- for an expectation cancelled before it was decided
(found by a race review; forced here by cancelling from inside the compare-and-set call).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from collector.pipeline.service import ToolwitnessService
from collector.processors.trace_state import member
from scoring.models import TraceScorable
from tests.integration.harness import (
    control_client,
    expects,
    make_config,
    new_span_id,
    new_trace_id,
    otlp_span,
    raw_producer,
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
                await until(lambda: _gone(service.redis.zscore(k.deadlines, member("default", ident))))
                out = await original(items)
                seen["result"] = [d for it, d in zip(items, out, strict=True) if it.expectation_id == ident]
                return out
            return await original(items)

        service.store.decide_many = decide_many  # type: ignore[method-assign]

    async with (
        Redis.from_url(redis_url) as r,
        running_service_prepared(cfg, prepare) as service,
        control_client(cfg) as tw,
        control_client(cfg) as observer,
        raw_producer(cfg) as producer,
    ):
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


async def _gone(value: Any) -> bool:
    return await value is None
