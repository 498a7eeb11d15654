"""Redis loses its data while expectations are pending: lost evidence turns into
UNDETERMINED (`state_lost`), never FALSE, and no published score is contradicted."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from redis.asyncio import Redis

from scoring.models import TraceScorable
from tests.integration.harness import (
    control_client,
    drop_stack,
    expects,
    make_agent,
    make_config,
    running_service,
    until,
    verdict,
)

pytestmark = pytest.mark.integration


async def test_data_loss_never_turns_into_false(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    agent = make_agent(cfg)
    prefix = cfg.redis.key_prefix
    async with running_service(cfg) as service, control_client(cfg) as tw:
        trace_a = agent.trace("x_tool")
        trace_b = agent.trace("other_tool")
        decided = await tw.expect(TraceScorable(trace_ids=(trace_a,)), expects("x_tool"))
        assert verdict(await tw.wait_for(decided, timeout=30)) == "true"
        pending = await tw.expect(TraceScorable(trace_ids=(trace_b,)), expects("y_tool"), deadline=timedelta(seconds=8))
        # Wait until the service holds trace B's evidence, then lose every key of this deployment.
        await until(lambda: service.redis.exists(service.store.k.state("default", trace_b)))
        await until(lambda: service.redis.exists(service.store.k.expectation("default", pending)))
        lost = [key async for key in service.redis.scan_iter(match=f"{prefix}*", count=1000)]
        assert lost
        await service.redis.delete(*lost)
        # The producer now claims trace B is complete: its spans are gone, so absence is unprovable.
        await tw.mark_complete(trace_b, span_count=agent.counter.count(trace_b))
        ev = await tw.wait_for(pending, timeout=60)
        assert verdict(ev) == "undetermined", ev
        assert "state_lost" in ev.coverage.reasons
        assert ev.trigger == "deadline"
        # The score published before the loss is neither re-decided nor contradicted.
        assert [e.score_id for e in tw.events(decided)] == [tw.events(decided)[0].score_id]
        # New work after the loss is scored normally, FALSE included.
        trace_c = agent.trace("x_tool")
        fresh = await tw.expect(TraceScorable(trace_ids=(trace_c,)), expects("y_tool"))
        await tw.mark_complete(trace_c, span_count=agent.counter.count(trace_c))
        assert verdict(await tw.wait_for(fresh, timeout=30)) == "false"
        assert service.recovery.lost_at_ms > 0
    agent.close()


async def test_recovery_reads_the_published_decisions_back(kafka_bootstrap: str, redis_url: str) -> None:
    # The decision records are rebuilt from the scores topic after a loss; the reader must see the
    # topic's partitions (a consumer that subscribes to nothing has no metadata of its own).
    cfg = make_config(kafka_bootstrap, redis_url)
    agent = make_agent(cfg)
    async with running_service(cfg) as service, control_client(cfg) as tw:
        ids = [await tw.expect(TraceScorable(trace_ids=(agent.trace("search"),)), expects("search")) for _ in range(3)]
        for i in ids:
            assert verdict(await tw.wait_for(i, timeout=30)) == "true"
        for i in ids:
            await service.redis.delete(service.store.k.decision("default", i))
        assert await service.recovery.restore_decisions() >= 3
        for i in ids:
            d = await service.store.get_decision("default", i)
            assert d is not None and d.published and d.version == 1
    agent.close()


async def test_a_redis_that_may_evict_keys_is_named_at_start(
    kafka_bootstrap: str, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Eviction drops single keys, which the epoch does not notice: a Redis whose policy may evict
    the service's keys (all have a TTL, so volatile-* policies too) is named at start."""
    cfg = make_config(kafka_bootstrap, redis_url)
    r = Redis.from_url(redis_url)
    before = await r.config_get("maxmemory*")
    caplog.set_level(logging.WARNING, logger="toolwitness.service")
    try:
        async with running_service(cfg):
            pass
        assert not [m for m in caplog.messages if "may evict" in m]  # noeviction, no limit: silent
        await r.config_set("maxmemory", str(4 << 30))
        await r.config_set("maxmemory-policy", "volatile-lru")
        async with running_service(cfg):
            pass
        [line] = [m for m in caplog.messages if "may evict" in m]
        assert "maxmemory 4,294,967,296 bytes with maxmemory-policy volatile-lru" in line
        assert "noeviction" in line
    finally:
        await r.config_set("maxmemory-policy", before["maxmemory-policy"])
        await r.config_set("maxmemory", before["maxmemory"])
        await r.aclose()
        await drop_stack(cfg)
