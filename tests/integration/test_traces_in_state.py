"""``toolwitness_traces_in_state``: how many traces have state in Redis, on a real Redis (and Kafka).

The count lives in Redis (per tenant, by expiry bucket), so instances sharing Redis count a trace
once and all report the same figure; it rises as states are created and falls as they are
reclaimed (complete and decided) or expire. A state is counted until the end of its expiry's
bucket (1 s with the short TTLs here), never less long than it lives.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from collector.config import ServiceConfig
from collector.processors.trace_state import TraceStateStore
from collector.wire.convert import RegisteredExpectation
from scoring.models import TraceScorable
from tests.integration.harness import (
    control_client,
    expects,
    make_config,
    metric_value,
    new_span_id,
    new_trace_id,
    otlp_span,
    raw_producer,
    running_service,
    scrape_metrics,
    send_spans,
    until,
    verdict,
)

pytestmark = pytest.mark.integration

GAUGE = "toolwitness_traces_in_state"


def fact(span_id: str) -> dict[str, Any]:
    """A span fact as the checkpoint hands it to ``TraceStateStore.apply`` (a plain ended span)."""
    return {"i": span_id, "p": "", "r": 0, "e": 1, "f": [], "x": False, "s": ""}


def store_config(redis_url: str, prefix: str, **redis: Any) -> ServiceConfig:
    return ServiceConfig.model_validate({"redis": {"url": redis_url, "key_prefix": prefix, **redis}})


@pytest.fixture
def prefix(redis_client: Redis, redis_cleanup: set[str]) -> str:
    """A key prefix of this test's own; ``redis_client``'s teardown deletes its keys."""
    p = f"tis{uuid.uuid4().hex[:10]}"
    redis_cleanup.add(f"{p}:*")
    return p


@pytest.fixture
async def two_instances(redis_url: str, prefix: str) -> AsyncIterator[tuple[TraceStateStore, TraceStateStore]]:
    """Two services' trace-state stores (own clients, own pending moves) on one Redis and prefix."""
    cfg = store_config(redis_url, prefix, state_ttl_seconds=3, completed_ttl_seconds=1)
    clients = [Redis.from_url(redis_url), Redis.from_url(redis_url)]
    stores = [TraceStateStore(c, cfg) for c in clients]
    for s in stores:
        await s.start()
    try:
        yield stores[0], stores[1]
    finally:
        for c in clients:
            await c.aclose()


async def test_instances_sharing_redis_count_a_trace_once_and_report_the_same_figure(
    two_instances: tuple[TraceStateStore, TraceStateStore],
) -> None:
    a, b = two_instances
    t1, t2 = new_trace_id(), new_trace_id()
    await a.apply({("acme", t1): [fact("a1")]}, 0)
    await asyncio.sleep(1.1)  # the next span renews the state into a later bucket (1 s wide here)
    # Another instance applies the next spans of t1 (its state moves between buckets), creates t2,
    # and the same trace id under another tenant.
    await b.apply({("acme", t1): [fact("b1")], ("acme", t2): [fact("b2")], ("other", t1): [fact("o1")]}, 0)
    assert b._moves, "the apply noted the moves of the states it created and renewed"
    await b.apply({("acme", t2): [fact("b2")]}, 0)  # a replay: no change, nothing to move ...
    assert not b._moves  # ... and the earlier moves went along in its round trip
    want = {"acme": 2, "other": 1}
    assert await a.count_traces() == want
    assert await b.count_traces() == want
    # the count is a few fields per tenant (its buckets, the sum, the time read), not one per trace
    buckets = [f for f in await a.redis.hkeys(a.k.live("acme")) if f.isdigit()]
    assert 1 <= len(buckets) <= 2


async def test_the_count_falls_as_states_expire_and_never_below_the_states_alive(
    two_instances: tuple[TraceStateStore, TraceStateStore],
) -> None:
    a, b = two_instances
    traces = [new_trace_id() for _ in range(3)]
    await a.apply({("acme", t): [fact("s")] for t in traces}, 0)
    keys = [a.k.state("acme", t) for t in traces]
    assert await b.count_traces() == {}  # a's moves are not sent yet ...
    assert await a.count_traces() == {"acme": 3}  # ... its sweep sends them

    async def watch(until_count: int, renew: str | None) -> list[int]:
        """Read the count (instance b) until it is ``until_count``, renewing the trace ``renew`` (a
        new span each time, instance a) so that it stays alive -- and so does the tenant's count."""
        seen: list[int] = []
        deadline = time.monotonic() + 10  # ttl 3 s + a 1 s bucket, on a loaded machine
        i = 0
        while True:
            if renew is not None:
                i += 1
                await a.apply({("acme", renew): [fact(f"k{i}")]}, 0)
                await a.flush_counts()  # its sweep
            n = (await b.count_traces()).get("acme", 0)
            alive = sum([await a.redis.exists(k) for k in all_keys])  # read after the count: see the module doc
            assert n >= alive, f"counted {n} traces while {alive} states were alive"
            seen.append(n)
            if n == until_count:
                return seen
            assert time.monotonic() < deadline, f"the count never fell to {until_count}: {seen}"
            await asyncio.sleep(0.2)

    keeper = new_trace_id()
    all_keys = [*keys, a.k.state("acme", keeper)]
    seen = await watch(1, renew=keeper)  # the three expire; the one kept alive is still counted
    assert seen[0] == 4
    assert not any([await a.redis.exists(k) for k in keys])
    assert await a.redis.exists(a.k.state("acme", keeper))
    await watch(0, renew=None)  # left alone, it expires too
    assert not await a.redis.exists(a.k.state("acme", keeper))


async def test_moves_into_buckets_that_have_ended_count_for_nothing(
    two_instances: tuple[TraceStateStore, TraceStateStore],
) -> None:
    """Moves reach Redis late (with the next batch or sweep): by then a bucket may have ended and
    been taken out of the sum. What lands in it is ignored, before or after it was taken out."""
    a, _ = two_instances
    await a.apply({("acme", new_trace_id()): [fact("s")]}, 0)
    assert await a.count_traces() == {"acme": 1}
    now = int(time.time() * 1000)
    a.note_expiry("acme", -2, now - 5_000)  # a state that expired meanwhile ...
    a.note_expiry("acme", now - 4_000, -2)  # ... and a move out of an ended bucket
    assert await a.count_traces() == {"acme": 1}
    live = a.k.live("acme")
    assert [f for f in await a.redis.hkeys(live) if f.isdigit() and int(f) <= now // 1000] == []
    # not read for long (more seconds than the hash has fields): every field is read once
    await a.redis.hset(live, "p", now // 1000 - 3600)
    a.note_expiry("acme", -2, now - 3_000)
    assert await a.count_traces() == {"acme": 1}
    assert [f for f in await a.redis.hkeys(live) if f.isdigit() and int(f) <= now // 1000] == []


async def test_states_created_by_a_registration_or_a_marker_count_and_a_reclaimed_one_leaves(
    redis_url: str, prefix: str
) -> None:
    cfg = store_config(redis_url, prefix, state_ttl_seconds=60, completed_ttl_seconds=1)
    async with Redis.from_url(redis_url) as r:
        s = TraceStateStore(r, cfg)
        await s.start()
        spans, registered, marked = new_trace_id(), new_trace_id(), new_trace_id()
        await s.apply({("acme", spans): [fact("s1"), fact("s2")]}, 0)
        now = int(time.time() * 1000)
        exp = RegisteredExpectation(
            expectation_id="e1", tenant="acme", scope=TraceScorable(trace_ids=(registered,)), scorer="tools",
            expectation=expects("search"), deadline_ms=now + 60_000, created_ms=now,
        )
        assert await s.register(exp)  # indexed on a trace with no state yet: its state is created
        await s.mark_complete("acme", marked, 0, now)  # a marker before any span creates the state too
        assert await s.count_traces() == {"acme": 3}
        await s.forget(exp)  # changes no expiry
        assert await s.count_traces() == {"acme": 3}

        await s.reclaim([("acme", spans)])  # complete and decided: its state has 1 s to live
        assert 0 < await r.pttl(s.k.state("acme", spans)) <= 1000
        await until(lambda: _count_is(s, "acme", 2), timeout=10)
        assert not await r.exists(s.k.state("acme", spans))
        assert await r.exists(s.k.state("acme", registered)) and await r.exists(s.k.state("acme", marked))


async def _count_is(store: TraceStateStore, tenant: str, n: int) -> bool:
    return (await store.count_traces()).get(tenant) == n


async def test_the_gauge_on_metrics_rises_with_traces_and_falls_on_reclaim_and_expiry(
    kafka_bootstrap: str, redis_url: str, redis_client: Redis, redis_cleanup: set[str]
) -> None:
    """End to end: spans through Kafka, the sweeper refreshing the gauge, read from /metrics."""
    cfg = make_config(kafka_bootstrap, redis_url, redis={"state_ttl_seconds": 15, "completed_ttl_seconds": 1})
    redis_cleanup.add(f"{cfg.redis.key_prefix}:*")
    tenant = f"tis-{uuid.uuid4().hex[:8]}"  # its own series: other tests' services share the registry
    labels = {"component": "processor/trace_state", "tenant": tenant}
    t0 = int(time.time() * 1000) - 5_000
    decided = [new_trace_id() for _ in range(3)]
    idle = [new_trace_id() for _ in range(2)]
    r = redis_client
    async with (
        running_service(cfg) as service,
        control_client(cfg, tenant=tenant) as tw,
        raw_producer(cfg) as producer,
    ):
        service.traces_gauge_every_s = 0.2
        port = service.admin.bound_port

        async def gauge() -> float:
            return metric_value(await scrape_metrics(port), GAUGE, labels)

        async def gauge_is(n: int) -> bool:
            return await gauge() == n

        assert await gauge() == 0
        for trace in decided + idle:
            root = new_span_id()
            await send_spans(
                producer, cfg, trace,
                otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50),
                otlp_span(trace, parent=root, tool="search", start_ms=t0 + 1, end_ms=t0 + 2),
                tenant=tenant,
            )
        await until(lambda: gauge_is(5), timeout=30)

        # three are decided on complete coverage: their state is reclaimed (completed_ttl_seconds=1)
        ids = [
            await tw.expect(TraceScorable(trace_ids=(t,)), expects("search"), deadline=timedelta(seconds=60))
            for t in decided
        ]
        for t in decided:
            await tw.mark_complete(t, span_count=2)
        for e in ids:
            assert verdict(await tw.wait_for(e, timeout=30)) == "true"
        await until(lambda: gauge_is(2), timeout=15)
        assert not any([await r.exists(service.store.k.state(tenant, t)) for t in decided])
        assert all([await r.exists(service.store.k.state(tenant, t)) for t in idle])  # fell by reclaim alone

        # the other two expire (state_ttl_seconds=15 after their last change)
        await until(lambda: gauge_is(0), timeout=30)
        assert not any([await r.exists(service.store.k.state(tenant, t)) for t in idle])
