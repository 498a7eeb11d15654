"""Completion by event time: per-partition watermarks shared in Redis, global = min over partitions.

A partition's watermark is its max event time (span end) minus the allowed
out-of-orderness. Partitions that are idle *and* caught up are excluded; a
partition with a backlog holds the global watermark back, so a consumer catching
up never "times out" a trace whose spans are still in the backlog.
"""

from __future__ import annotations

import json
import time

from collector.config import CompletionConfig
from collector.processors.resp import RedisClient
from collector.telemetry.metrics import WATERMARK

#: how often the shared watermarks are written and read at most (seconds).
REFRESH_S = 0.05


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

    def assign(self, partitions: set[int]) -> None:
        self._assigned = set(partitions)

    def observe(self, partition: int, event_ms: int, now_ms: int) -> None:
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
        for v in raw.values():
            wm, last, caught, _ = json.loads(v)
            if caught and now - int(last) >= self.cfg.idle_partition_ms:
                idle.append(int(wm))
            else:
                active.append(int(wm))
        if active:
            g = min(active)
        elif idle:
            g = max(idle)
        else:
            g = 0
        WATERMARK.labels(self.name).set(g / 1000)
        self._global = (tick, g)
        return g
