"""Retention vs deadlines on a real Redis and Kafka: the evidence an expectation is judged on lives
at least until its deadline, so an idle trace or session never loses it to a TTL first (lost
evidence judged "complete" would be a FALSE from missing evidence)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from redis.asyncio import Redis

from collector.config import ServiceConfig
from collector.processors.trace_state import TraceStateStore, member
from collector.wire.convert import RegisteredExpectation
from scoring.models import SessionScorable, TraceScorable
from tests.integration.harness import control_client, expects, make_config, new_trace_id, running_service, until

pytestmark = pytest.mark.integration

TTL_S = 3600


@pytest.fixture
def cfg(kafka_bootstrap: str, redis_url: str, redis_cleanup: set[str]) -> ServiceConfig:
    c = make_config(kafka_bootstrap, redis_url, redis={"state_ttl_seconds": TTL_S})
    redis_cleanup.add(f"{c.redis.key_prefix}*")
    return c


@pytest.fixture
async def store(cfg: ServiceConfig, redis_url: str, redis_client: Redis) -> AsyncIterator[TraceStateStore]:
    """``redis_client`` is requested for its teardown: it deletes the keys ``cfg`` listed."""
    redis = Redis.from_url(redis_url)
    s = TraceStateStore(redis, cfg)
    await s.start()
    try:
        yield s
    finally:
        await redis.aclose()


def registered(scope: TraceScorable | SessionScorable, now_ms: int = 1_800_000_000_000) -> RegisteredExpectation:
    return RegisteredExpectation(
        expectation_id=f"e-{uuid.uuid4().hex[:8]}",
        tenant="default",
        scope=scope,
        scorer="tools",
        expectation=expects("search"),
        deadline_ms=now_ms + TTL_S * 1000,
        created_ms=now_ms,
    )


async def test_registering_on_a_trace_renews_its_state_to_the_full_ttl(store: TraceStateStore) -> None:
    trace = new_trace_id()
    key = store.k.state("default", trace)
    assert await store.register(registered(TraceScorable(trace_ids=(trace,))))
    await store.redis.pexpire(key, 2000)  # the trace has been idle for almost the whole ttl

    # a second expectation on it (deadline up to the ttl away) must still find the evidence then
    assert await store.register(registered(TraceScorable(trace_ids=(trace,))))
    assert await store.redis.pttl(key) > (TTL_S - 60) * 1000

    # ... but indexing never lengthens a state the service shortened on purpose (reclaim) when
    # nothing new is pending: decided/dropped ids keep the remaining life
    await store.redis.pexpire(key, 2000)
    await store.forget(registered(TraceScorable(trace_ids=(trace,))))
    assert 0 < await store.redis.pttl(key) <= 2000


async def test_registering_on_a_session_renews_its_trace_set_and_its_traces(store: TraceStateStore) -> None:
    session, first, second = f"s-{uuid.uuid4().hex[:8]}", new_trace_id(), new_trace_id()
    for trace in (first, second):  # two traces already joined the session, long ago
        assert await store.register(registered(TraceScorable(trace_ids=(trace,))))
    await store.index_sessions([("default", session, first), ("default", session, second)], 0)
    keys = [
        store.k.session_traces("default", session),
        store.k.state("default", first),
        store.k.state("default", second),
    ]
    for k in keys:
        await store.redis.pexpire(k, 2000)

    assert await store.register(registered(SessionScorable(session_id=session)))
    for k in keys:
        assert await store.redis.pttl(k) > (TTL_S - 60) * 1000, k
    # a trace of the session whose state is already gone is not recreated empty
    gone = new_trace_id()
    await store.index_sessions([("default", session, gone)], 0)
    assert await store.register(registered(SessionScorable(session_id=session)))
    assert not await store.redis.exists(store.k.state("default", gone))


async def test_a_deadline_beyond_the_state_ttl_is_clamped_to_it(cfg: ServiceConfig) -> None:
    trace = new_trace_id()
    async with running_service(cfg) as service, control_client(cfg) as client:
        eid = await client.expect(TraceScorable(trace_ids=(trace,)), expects("search"), deadline=timedelta(days=10))
        store = service.store
        loaded = await until(lambda: _loaded(store, eid))
        assert loaded.deadline_ms - loaded.created_ms == TTL_S * 1000
        # and the sweeper will decide it then (its deadline index says the same)
        assert await store.redis.zscore(store.k.deadlines, member("default", eid)) == loaded.deadline_ms


async def _loaded(store: TraceStateStore, eid: str) -> RegisteredExpectation | None:
    return (await store.load_expectations("default", [eid])).get(eid)
