"""Completion by event time: per-partition watermarks shared in Redis, global = min over partitions.

A partition's watermark is its max event time (span end) minus the allowed
out-of-orderness. Partitions that are idle *and* caught up are excluded; a
partition with a backlog holds the global watermark back, so a consumer catching
up never "times out" a trace whose spans are still in the backlog. So does a
partition whose owner has gone silent (killed before the group rebalanced).
"""

from __future__ import annotations

import json
import time

from redis.commands.core import AsyncScript

from collector.config import CompletionConfig
from collector.processors.resp import RedisClient
from collector.telemetry.metrics import WATERMARK

#: the field of the watermarks hash holding the highest global watermark reached.
GLOBAL_FIELD = b"global"
_RAISE_LUA = """
local cur = tonumber(redis.call('HGET', KEYS[1], 'global') or '0')
if tonumber(ARGV[1]) > cur then redis.call('HSET', KEYS[1], 'global', ARGV[1]) end
return 0
"""

#: how often the shared watermarks are written and read at most (seconds).
REFRESH_S = 0.05
#: an owner that has not published its partitions' watermarks for this long (an idle poll loop
#: publishes every poll, 100 ms by default) may be gone (killed, its partitions not yet taken
#: over): what it last said -- "caught up" -- is not known to hold any more.
OWNER_SILENT_MS = 3_000


class WatermarkTracker:
    name = "processor/completion"

    def __init__(self, redis: RedisClient, key: str, cfg: CompletionConfig) -> None:
        self.redis = redis
        self.key = key
        self.cfg = cfg
        self._max_event: dict[int, int] = {}
        self._last_active: dict[int, int] = {}
        self._assigned: set[int] = set()
        self._published_at = 0.0
        self._global: tuple[float, int] | None = None
        #: the highest global watermark known (this instance's or the shared one)
        self._floor = 0
        self._raise: AsyncScript | None = None

    async def _raise_floor(self, g: int) -> None:
        if self._raise is None:
            self._raise = self.redis.register_script(_RAISE_LUA)
        await self._raise(keys=[self.key], args=[g])

    def assign(self, partitions: set[int]) -> None:
        self._assigned = set(partitions)

    def observe(self, partition: int, event_ms: int, now_ms: int) -> None:
        # Event time is the agent's own claim: one from the future (a skewed clock, or an agent
        # steering completion -- of any tenant's traces, the watermark is shared) counts as now.
        event_ms = min(event_ms, now_ms)
        if event_ms > self._max_event.get(partition, 0):
            self._max_event[partition] = event_ms
        self._last_active[partition] = now_ms

    async def publish(self, caught_up: dict[int, bool], now_ms: int | None = None) -> None:
        """Share this instance's partitions' watermarks (every assigned partition, even empty)."""
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        if not self._assigned:
            return
        # At most every REFRESH_S: small batches would otherwise pay a Redis write each. A
        # watermark shared a little late is only more conservative (less completion, never wrong).
        tick = time.monotonic()
        if tick - self._published_at < REFRESH_S:
            return
        self._published_at = tick
        mapping: dict[str | bytes, str | bytes] = {}
        for p in self._assigned:
            wm = self._max_event.get(p, 0) - self.cfg.max_out_of_orderness_ms if p in self._max_event else 0
            mapping[str(p)] = json.dumps([wm, self._last_active.get(p, 0), 1 if caught_up.get(p, False) else 0, now])
        await self.redis.hset(self.key, mapping=mapping)  # type: ignore[arg-type]

    async def global_watermark(self, now_ms: int | None = None) -> int:
        """Min over partitions, excluding idle caught-up ones; 0 when nothing is known."""
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        tick = time.monotonic()
        if self._global is not None and tick - self._global[0] < REFRESH_S:
            return self._global[1]  # a slightly older watermark: conservative
        raw = await self.redis.hgetall(self.key)
        active: list[int] = []
        idle: list[int] = []
        checked: list[int] = []
        floor = self._floor
        for k, v in raw.items():
            if k in (GLOBAL_FIELD, GLOBAL_FIELD.decode()):
                floor = max(floor, int(v))
                continue
            wm, last, caught, published = json.loads(v)
            # idle and caught up, as its owner says -- while the owner is heard from: a dead
            # member's partitions fill up unread until the rebalance, and must hold the minimum
            if caught and now - int(last) >= self.cfg.idle_partition_ms and now - int(published) < OWNER_SILENT_MS:
                idle.append(int(wm))
                checked.append(int(published))
            else:
                active.append(int(wm))
        if active:
            g = min(active)
        elif idle:
            # Every partition idle and caught up: nothing is waiting in Kafka. Event time cannot
            # advance without spans, so the watermark follows the time up to which every partition
            # was seen caught up (else a marker without count on a quiet pipeline would never
            # complete); a span exported later with an older time is late and revises.
            g = max(max(idle), min(checked) - self.cfg.max_out_of_orderness_ms)
        else:
            g = 0
        # Never backwards: completions were decided at the watermark reached; a partition that
        # becomes active again (or an instance that restarts and knows no event yet) must not
        # pull it back, or a span arriving now for a trace completed then would not count as
        # late and its FALSE would never be revised. Shared, so every instance agrees.
        if g > floor:
            await self._raise_floor(g)
            floor = g
        g = floor
        self._floor = g
        WATERMARK.labels(self.name).set(g / 1000)
        self._global = (tick, g)
        return g
