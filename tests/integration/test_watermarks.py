"""The shared event-time watermark (collector.processors.completion) on a real Redis.

It decides when a marker without a count, or an ended root (inferred mode), proves a trace
complete. Two properties keep that from ever producing a FALSE on missing evidence:
an event time from the future counts as now (the agent writes its own spans; the watermark is
shared by every tenant), and the global watermark never goes backwards (a completion decided at
a watermark stays decided; a span for that trace arriving afterwards is late and revises it).
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from collector.config import CompletionConfig
from collector.processors.completion import WatermarkTracker

pytestmark = pytest.mark.integration

NOW = 1_800_000_000_000
CFG = CompletionConfig(max_out_of_orderness_ms=1000, idle_partition_ms=10_000)


def tracker(redis: Redis, key: str, partitions: set[int]) -> WatermarkTracker:
    t = WatermarkTracker(redis, key, CFG)
    t.assign(partitions)
    return t


async def test_an_event_time_from_the_future_counts_as_now(redis_client: Redis, redis_key_prefix: str) -> None:
    key = f"{redis_key_prefix}wm-future"
    t = tracker(redis_client, key, {0})
    t.observe(0, NOW + 10 * 365 * 86_400_000, NOW)  # a span "ending" ten years from now
    await t.publish({0: False}, NOW)
    assert await tracker(redis_client, key, {0}).global_watermark(NOW) == NOW - 1000


async def test_the_global_watermark_never_goes_backwards(redis_client: Redis, redis_key_prefix: str) -> None:
    key = f"{redis_key_prefix}wm-monotonic"
    first = tracker(redis_client, key, {0, 1})
    first.observe(0, NOW, NOW)
    first.observe(1, NOW, NOW)
    await first.publish({0: False, 1: False}, NOW)
    assert await first.global_watermark(NOW) == NOW - 1000
    # A restarted instance (or the new owner after a rebalance) knows no event yet: it publishes
    # watermark 0 for its partitions, and an old span arrives on one of them.
    restarted = tracker(redis_client, key, {0, 1})
    restarted.observe(1, NOW - 60_000, NOW + 5)
    await restarted.publish({0: False, 1: False}, NOW + 5)
    assert await restarted.global_watermark(NOW + 5) == NOW - 1000  # the shared floor holds
    assert await tracker(redis_client, key, set()).global_watermark(NOW + 5) == NOW - 1000
    # and it still moves forwards
    restarted.observe(0, NOW + 20_000, NOW + 20_000)
    restarted.observe(1, NOW + 20_000, NOW + 20_000)
    restarted._published_at = 0.0  # publish is rate-limited (REFRESH_S): this is the next tick
    await restarted.publish({0: False, 1: False}, NOW + 20_000)
    assert await tracker(redis_client, key, set()).global_watermark(NOW + 20_000) == NOW + 19_000


async def test_a_quiet_caught_up_pipeline_follows_the_time_it_was_seen_caught_up(
    redis_client: Redis, redis_key_prefix: str
) -> None:
    key = f"{redis_key_prefix}wm-quiet"
    t = tracker(redis_client, key, {0, 1})
    t.observe(0, NOW - 50_000, NOW - 40_000)  # the last spans, long ago
    t.observe(1, NOW - 60_000, NOW - 40_000)
    await t.publish({0: True, 1: True}, NOW)  # both caught up, idle for 40 s
    # without new spans event time stands still; a count-less marker would never complete
    assert await tracker(redis_client, key, set()).global_watermark(NOW) == NOW - 1000
    # one partition not caught up (a backlog): it holds the watermark at its own event time
    t.observe(1, NOW - 30_000, NOW + 1)
    t._published_at = 0.0
    await t.publish({0: True, 1: False}, NOW + 1)
    assert await tracker(redis_client, key, set()).global_watermark(NOW + 1) == NOW - 1000  # never backwards


async def test_a_silent_owners_caught_up_partitions_hold_the_watermark(
    redis_client: Redis, redis_key_prefix: str
) -> None:
    # Two members; one is killed while its partition was idle and caught up. Until the group
    # takes its partition over, spans land there unread: what it last published ("caught up")
    # must not let the survivor's event time complete traces whose spans wait in that backlog.
    key = f"{redis_key_prefix}wm-silent"
    alive, dead = tracker(redis_client, key, {0}), tracker(redis_client, key, {1})
    dead.observe(1, NOW - 60_000, NOW - 40_000)
    await dead.publish({1: True}, NOW - 20_000)  # its last word, 20 s ago
    alive.observe(0, NOW - 100, NOW)
    await alive.publish({0: False}, NOW)
    assert await tracker(redis_client, key, set()).global_watermark(NOW) == NOW - 60_000 - 1000
    # the same entry from an owner heard from just now is idle and caught up: excluded
    dead._published_at = 0.0  # past the publish rate limit
    await dead.publish({1: True}, NOW)
    assert await tracker(redis_client, key, set()).global_watermark(NOW) == NOW - 100 - 1000
