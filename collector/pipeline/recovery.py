"""Recovery from Redis data loss: lost evidence becomes UNDETERMINED (``state_lost``), never FALSE.

Redis holds an *epoch* key. If it disappears (a restart without persistence, a flush,
a failover to an empty replica), every instance that notices:

1. records ``lost_at`` (the first instance to notice wins): expectations created before
   it have lost the evidence of their spans, so their coverage carries ``state_lost``
   and absence can never be proven for them;
2. rebuilds the decision records from the scores topic (the log is the source of truth
   for what was already published), so no published score is ever contradicted;
3. seeks its control partitions back to the beginning, so every expectation is
   registered again (idempotent) and decided — TRUE if new spans prove it, otherwise
   UNDETERMINED at its original deadline.

On a Redis Cluster one shard can lose its data while the others keep theirs, so the epoch is
also written to a *canary* key on every primary (``tw:{epoch:<i>}``, its hash tag chosen to
fall in a slot that primary serves): a canary gone or changed is a loss too. A primary that
appears (resharding) gets its canary written, not counted as a loss.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from redis.asyncio import RedisCluster
from redis.cluster import PRIMARY
from redis.crc import key_slot
from redis.exceptions import ResponseError

from collector.client import topic_partitions
from collector.config import ServiceConfig
from collector.exporters.kafka import kafka_security_kwargs
from collector.processors.trace_state import TraceStateStore
from collector.processors.trace_state import _s as as_text  # bytes or str reply -> str
from collector.receivers.kafka_otlp import KafkaOTLPReceiver
from collector.telemetry.metrics import STATE_LOSSES
from collector.wire.convert import decode_score_event

log = logging.getLogger("toolwitness.recovery")

#: KEYS[1] epoch, ARGV[1] the epoch the caller adopted, ARGV[2] a new one: set unless another
#: instance already replaced the adopted epoch.
_REPLACE_EPOCH = """
local cur = redis.call('GET', KEYS[1])
if not cur or cur == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2]) end
return 0
"""

#: KEYS[1] lost_at, ARGV[1] a loss time: raise the shared loss time to it (never lower it).
_RAISE_LOST_AT = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > cur then redis.call('SET', KEYS[1], ARGV[1]) return ARGV[1] end
return tostring(cur)
"""


class Recovery:
    name = "pipeline/recovery"

    def __init__(self, cfg: ServiceConfig, store: TraceStateStore) -> None:
        self.cfg = cfg
        self.store = store
        self.epoch: str | None = None
        self.lost_at_ms = 0
        #: the canary keys (cluster only) this instance has written or seen hold the epoch.
        self._canaries: set[str] = set()
        #: (canary key, its slot, the primary serving it) per primary, for the topology last seen
        self._canary_plan: list[tuple[str, int, str]] = []

    def canary_keys(self) -> list[str]:
        """One key per primary of a Redis Cluster, in a slot that primary serves; [] otherwise."""
        r = self.store.redis
        if not isinstance(r, RedisCluster):
            return []
        slots = r.nodes_manager.slots_cache
        primaries = {n.name for n in r.nodes_manager.nodes_cache.values() if n.server_type == PRIMARY}
        plan = self._canary_plan
        # Every sweep asks; the 16,384-slot walk is only for a topology not seen yet: the same
        # primaries, each still serving its canary's slot, keep the keys.
        if not plan or {node for _, _, node in plan} != primaries or any(
            not (owners := slots.get(slot)) or owners[0].name != node for _, slot, node in plan
        ):
            owner = {slot: nodes[0].name for slot, nodes in slots.items() if nodes}
            plan = []
            for node in set(owner.values()):
                i = 0
                while owner.get(slot := key_slot(f"epoch:{i}".encode())) != node:
                    i += 1
                plan.append((f"{self.store.k.p}:{{epoch:{i}}}", slot, node))
            self._canary_plan = plan
        return sorted(key for key, _, _ in plan)

    async def _sync_canaries(self, *, overwrite: bool) -> None:
        r = self.store.redis
        assert self.epoch is not None
        for key in self.canary_keys():
            await r.set(key, self.epoch, nx=not overwrite)
            self._canaries.add(key)

    async def start(self) -> None:
        """Adopt the current epoch (creating it on a fresh Redis) and any recorded loss time."""
        r = self.store.redis
        await r.set(self.store.k.epoch, uuid.uuid4().hex, nx=True)
        raw = await r.get(self.store.k.epoch)
        self.epoch = raw.decode() if isinstance(raw, bytes) else raw
        await self._sync_canaries(overwrite=False)
        lost = await r.get(self.store.k.lost_at)
        self.lost_at_ms = int(lost) if lost else 0

    async def eviction_risk(self) -> str | None:
        """Why Redis may evict this service's keys under memory pressure, or None.

        Every key the service writes has a TTL, so any policy but ``noeviction`` (``volatile-lru``,
        the usual default of managed caches, included) can drop a trace's state, an expectation or a
        decision without notice. That is a loss the epoch does not see: an evicted state rebuilt
        from later spans can be "complete" under a count-less marker, proving an absence that is
        not one, and an evicted decision can be decided again. None when the limit is off
        (``maxmemory`` 0), the policy is ``noeviction``, or CONFIG is not allowed (managed Redis)."""
        try:
            raw = await self.store.redis.config_get("maxmemory*")
        except ResponseError as exc:  # CONFIG renamed or disabled (managed Redis): nothing to say
            log.debug("%s: could not read Redis's eviction policy: %r", self.name, exc)
            return None
        # one server: {name: value}; a cluster may answer per node: {node: {name: value}}
        reply: dict[Any, Any] = dict(raw)
        answers: list[dict[Any, Any]] = [v for v in reply.values() if isinstance(v, dict)] or [reply]
        for answer in answers:
            conf = {as_text(k): as_text(v) for k, v in answer.items()}
            policy, limit = conf.get("maxmemory-policy", ""), conf.get("maxmemory", "0")
            if policy and policy != "noeviction" and limit.isdigit() and int(limit) > 0:
                return f"maxmemory {int(limit):,} bytes with maxmemory-policy {policy}"
        return None

    async def note_lost(self, at_ms: int) -> int:
        """Record that evidence before ``at_ms`` was lost without Redis losing its data (spans deleted
        from Kafka before they were read): the shared loss time moves up to it, never back, so every
        instance judges expectations created before it with ``state_lost``. Returns the loss time."""
        raw = await self.store.redis.eval(_RAISE_LOST_AT, 1, self.store.k.lost_at, at_ms)
        self.lost_at_ms = max(self.lost_at_ms, int(raw or 0))
        return self.lost_at_ms

    async def check(self) -> bool:
        """True if Redis lost its data since this instance adopted the epoch. Also follows the shared
        loss time (``note_lost`` by another instance)."""
        r = self.store.redis
        raw = await r.get(self.store.k.epoch)
        current = raw.decode() if isinstance(raw, bytes) else raw
        if current is not None and current == self.epoch:
            lost = await r.get(self.store.k.lost_at)  # two keys, two slots on a cluster: no MGET
            if lost is not None:
                self.lost_at_ms = max(self.lost_at_ms, int(lost))
        if current is None or current != self.epoch:
            return True
        for key in self.canary_keys():
            if key not in self._canaries:  # a primary this instance has not seen yet (resharding)
                await r.set(key, current, nx=True)
                self._canaries.add(key)
            raw = await r.get(key)
            if (raw.decode() if isinstance(raw, bytes) else raw) != current:
                return True
        return False

    async def recover(self, receiver: KafkaOTLPReceiver | None) -> None:
        r = self.store.redis
        now = int(time.time() * 1000)
        STATE_LOSSES.labels(self.name).inc()
        await r.set(self.store.k.lost_at, now, nx=True)
        lost = await r.get(self.store.k.lost_at)
        self.lost_at_ms = int(lost) if lost else now
        # A new epoch, once: the first instance to notice replaces the one it adopted (gone, or
        # still there when the loss was on another shard); the others adopt the winner's.
        await r.eval(_REPLACE_EPOCH, 1, self.store.k.epoch, self.epoch or "", uuid.uuid4().hex)
        raw = await r.get(self.store.k.epoch)
        restored = await self.restore_decisions()
        self.epoch = raw.decode() if isinstance(raw, bytes) else raw
        await self._sync_canaries(overwrite=True)
        replayed = await receiver.replay_control() if receiver is not None else 0
        log.error(
            "%s: Redis lost its data; evidence before %d ms is marked state_lost, %d published decisions "
            "restored from the scores topic, %d control partitions replayed",
            self.name,
            self.lost_at_ms,
            restored,
            replayed,
        )

    async def restore_decisions(self, timeout_s: float = 60.0) -> int:
        """Re-create decision records (published) from the scores topic, newest version wins."""
        k = self.cfg.kafka
        consumer = AIOKafkaConsumer(
            bootstrap_servers=k.bootstrap_servers,
            client_id=f"{k.client_id}-recovery",
            enable_auto_commit=False,
            group_id=None,
            **kafka_security_kwargs(k),
        )
        await asyncio.wait_for(consumer.start(), timeout=timeout_s)
        restored = 0
        try:
            parts = await topic_partitions(consumer, k.topics.scores)
            tps = [TopicPartition(k.topics.scores, p) for p in sorted(parts)]
            if not tps:
                return 0
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            end = await consumer.end_offsets(tps)
            async with asyncio.timeout(timeout_s):
                while [tp for tp in tps if await consumer.position(tp) < end[tp]]:
                    batch = await consumer.getmany(timeout_ms=200, max_records=1000)
                    for records in batch.values():
                        for rec in records:
                            if rec.value is None:
                                continue
                            try:
                                ev = decode_score_event(rec.value)
                            except Exception:  # not a score event of ours: nothing to restore
                                continue
                            await self.store.restore_decision(
                                ev.tenant,
                                ev.expectation_id,
                                ev.version,
                                ev.score_id,
                                rec.value,
                                {1: "true", 2: "false", 3: "undetermined"}.get(ev.status, ""),
                            )
                            restored += 1
        finally:
            await consumer.stop()
        return restored
