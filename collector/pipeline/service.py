"""The service: wires receivers → processors → exporters and runs the poll loop and the sweeper.

Graceful stop (SIGTERM): finish the in-flight batch, commit it, leave the group.
Rebalances wait for the in-flight batch (under a deadline) before partitions go.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from collector.admin import AdminServer
from collector.config import ServiceConfig
from collector.exporters.base import ExportError
from collector.exporters.kafka import KafkaExporter, kafka_security_kwargs
from collector.pipeline.checkpoint import Checkpoint
from collector.pipeline.engine import Engine, Work
from collector.pipeline.recovery import Recovery
from collector.processors.completion import WatermarkTracker
from collector.processors.trace_state import TraceStateStore
from collector.telemetry.metrics import COMMIT_FAILURES, CONSUMER_LAG, EXPORT_FAILURES

log = logging.getLogger("toolwitness.service")

REBALANCE_DEADLINE_S = 20.0
RETRIABLE = (ExportError, RedisConnectionError, RedisTimeoutError, KafkaError, TimeoutError)


class RetryPolicy:
    """Exponential backoff with a cap, reset after a success."""

    def __init__(self, base_s: float = 0.2, cap_s: float = 10.0) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self._attempt = 0

    def next_delay(self) -> float:
        delay = float(min(self.cap_s, self.base_s * (2.0**self._attempt)))
        self._attempt += 1
        return delay

    def reset(self) -> None:
        self._attempt = 0


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, service: ToolwitnessService) -> None:
        self.service = service

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        # Let the in-flight batch finish and commit before the partitions move.
        try:
            async with asyncio.timeout(REBALANCE_DEADLINE_S):
                async with self.service.batch_lock:
                    pass
        except TimeoutError:
            log.warning("service: in-flight batch still running at rebalance deadline")

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        spans = self.service.cfg.kafka.topics.spans
        self.service.watermarks.assign({tp.partition for tp in assigned if tp.topic == spans})


async def ensure_topics(cfg: ServiceConfig, partitions: int = 4) -> None:
    """Create the service's topics if missing (observations compacted)."""
    t = cfg.kafka.topics
    admin = AIOKafkaAdminClient(bootstrap_servers=cfg.kafka.bootstrap_servers, **kafka_security_kwargs(cfg.kafka))
    await asyncio.wait_for(admin.start(), timeout=30)
    try:
        existing = set(await admin.list_topics())
        wanted = [
            NewTopic(t.spans, partitions, 1),
            NewTopic(t.control, partitions, 1),
            NewTopic(t.scores, partitions, 1),
            NewTopic(t.observations, partitions, 1, topic_configs={"cleanup.policy": "compact"}),
            NewTopic(t.dlq, 1, 1),
        ]
        new = [n for n in wanted if n.name not in existing]
        if new:
            with contextlib.suppress(Exception):  # a concurrent creator may win; topics then exist
                await admin.create_topics(new)
    finally:
        await admin.close()


class ToolwitnessService:
    name = "service"

    def __init__(self, cfg: ServiceConfig) -> None:
        self.cfg = cfg
        self.instance = cfg.instance or f"{socket.gethostname()}:{os.getpid()}"
        password = os.environ.get(cfg.redis.password_env) or None
        self.redis = Redis.from_url(
            cfg.redis.url,
            password=password,
            socket_timeout=cfg.redis.socket_timeout_seconds,
            socket_connect_timeout=cfg.redis.socket_timeout_seconds,
            decode_responses=False,
        )
        self.store = TraceStateStore(self.redis, cfg)
        self.exporter = KafkaExporter(cfg.kafka)
        self.engine = Engine(cfg, self.store, self.exporter)
        self.watermarks = WatermarkTracker(self.redis, self.store.k.watermarks(cfg.kafka.topics.spans), cfg.completion)
        self.recovery = Recovery(cfg, self.store)
        self.checkpoint = Checkpoint(cfg, self.store, self.engine, self.exporter, self.watermarks)
        self.consumer: AIOKafkaConsumer | None = None
        self.admin = AdminServer(cfg.admin.host, cfg.admin.port, ready=self.ready, alive=self.alive)
        self.batch_lock = asyncio.Lock()
        self.retry = RetryPolicy()
        self._stopping = asyncio.Event()
        self._started = False
        self._last_loop = time.monotonic()
        self._sweeper: asyncio.Task[None] | None = None

    # health
    def ready(self) -> bool:
        return self._started and not self._stopping.is_set() and self.consumer is not None

    def alive(self) -> bool:
        return time.monotonic() - self._last_loop < 60

    async def start(self) -> None:
        await self.admin.start()
        await asyncio.wait_for(self.redis.ping(), timeout=10)
        await self.store.start()
        await self.recovery.start()
        self.engine.lost_at_ms = self.recovery.lost_at_ms
        await ensure_topics(self.cfg)
        await self.exporter.start()
        k = self.cfg.kafka
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=k.bootstrap_servers,
            group_id=k.group_id,
            client_id=f"{k.client_id}-{self.instance}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            max_poll_records=k.max_poll_records,
            fetch_max_bytes=max(52428800, k.max_record_bytes * 2),
            max_partition_fetch_bytes=max(1048576, k.max_record_bytes + 65536),
            request_timeout_ms=k.request_timeout_ms,
            session_timeout_ms=k.session_timeout_ms,
            heartbeat_interval_ms=max(1000, k.session_timeout_ms // 3),
            **kafka_security_kwargs(k),
        )
        self.consumer.subscribe([k.topics.spans, k.topics.control], listener=_Rebalance(self))
        await asyncio.wait_for(self.consumer.start(), timeout=60)
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="sweeper")
        self._started = True
        log.info("service %s started: consuming %s, %s", self.instance, k.topics.spans, k.topics.control)

    def request_stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        """Poll → checkpoint → commit until asked to stop."""
        assert self.consumer is not None
        consumer = self.consumer
        while not self._stopping.is_set():
            self._last_loop = time.monotonic()
            batch = await consumer.getmany(
                timeout_ms=self.cfg.kafka.poll_timeout_ms, max_records=self.cfg.kafka.max_poll_records
            )
            if not batch:
                await self._publish_watermarks()
                continue
            async with self.batch_lock:
                try:
                    result = await self.checkpoint.process(batch)
                except RETRIABLE as exc:
                    EXPORT_FAILURES.labels(self.name).inc()
                    delay = self.retry.next_delay()
                    log.error(
                        "service: batch not committed (%s: %s); retrying from its first offset in %.1fs",
                        type(exc).__name__,
                        exc,
                        delay,
                    )
                    for tp, recs in batch.items():
                        consumer.seek(tp, recs[0].offset)
                    await asyncio.sleep(delay)
                    continue
                self.retry.reset()
                try:
                    await consumer.commit(result.offsets)
                except (CommitFailedError, IllegalStateError) as exc:
                    # The partitions moved during the batch: the new owner replays it, and every
                    # step is idempotent (identical re-sends at most). Keep polling.
                    COMMIT_FAILURES.labels(self.name).inc()
                    log.warning("service: offsets not committed (%s); the new owner replays the batch", exc)
            await self._publish_watermarks()

    async def _publish_watermarks(self) -> None:
        assert self.consumer is not None
        spans = self.cfg.kafka.topics.spans
        caught: dict[int, bool] = {}
        for tp in self.consumer.assignment():
            if tp.topic != spans:
                continue
            hw = self.consumer.highwater(tp)
            try:
                pos = await self.consumer.position(tp)
            except Exception:
                continue
            lag = max(0, (hw or 0) - pos)
            CONSUMER_LAG.labels(self.name, tp.topic, str(tp.partition)).set(lag)
            caught[tp.partition] = hw is not None and pos >= hw
        await self.watermarks.publish(caught)

    async def _sweep_loop(self) -> None:
        interval = self.cfg.completion.sweep_interval_ms / 1000
        while not self._stopping.is_set():
            try:
                await self.sweep()
            except Exception:
                log.exception("sweeper: sweep failed; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=interval)

    async def sweep(self) -> int:
        """Finalize deadlines, watermark completions, and re-send decided-but-unpublished scores.

        Work is claimed under a lease (exactly one instance wins each item); if handling it
        fails, the claims are put back so a later sweep (here or elsewhere) retries them; if
        this process dies holding them, they are due again when the lease ends; once handled,
        they are released.
        """
        if await self.recovery.check():
            async with self.batch_lock:
                await self.recovery.recover(self.consumer)
                self.engine.lost_at_ms = self.recovery.lost_at_ms
        now = int(time.time() * 1000)
        k = self.store.k
        watermark = await self.watermarks.global_watermark(now)
        lease = self.store.claim_lease_ms
        deadlines = await self.store.claim_due(k.deadlines, now, lease_until=now + lease)
        waiting = await self.store.claim_due(k.await_watermark, watermark, lease_until=watermark + lease)
        unpublished = await self.store.claim_due(k.unpublished, now - 2000, lease_until=now + lease)
        try:
            work = Work()
            for tenant, ident in deadlines:
                work.final.add((tenant, ident))
                work.pending[(tenant, ident)] = "deadline"
            for tenant, trace in waiting:
                work.add(tenant, await self.store.trace_pending(tenant, trace), "watermark")
            published = []
            if work.pending or work.final:
                outcomes = await self.engine.evaluate(work, watermark)
                published.extend(await self.engine.decide_and_send(outcomes))
            for tenant, ident in unpublished:
                p = await self.engine.republish(tenant, ident)
                if p is not None:
                    published.append(p)
            if published:
                await self.exporter.flush()
                await self.store.mark_published([(p.tenant, p.expectation_id) for p in published])
        except BaseException:
            await self.store.unclaim(k.deadlines, deadlines, now)
            await self.store.unclaim(k.await_watermark, waiting, watermark)
            await self.store.unclaim(k.unpublished, unpublished, now)
            raise
        await self.store.release(k.deadlines, deadlines, now + lease)
        await self.store.release(k.await_watermark, waiting, watermark + lease)
        await self.store.release(k.unpublished, unpublished, now + lease)
        return len(published)

    async def shutdown(self) -> None:
        self._stopping.set()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        async with self.batch_lock:
            if self.consumer is not None:
                await self.consumer.stop()  # leaves the group
                self.consumer = None
        await self.exporter.shutdown()
        await self.admin.shutdown()
        await self.redis.aclose()
        log.info("service %s stopped", self.instance)
