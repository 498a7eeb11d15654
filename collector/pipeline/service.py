"""The service: wires receivers → processors → exporters and runs the poll loop, the sweeper and
the Kafka probe.

Graceful stop (SIGTERM): finish the in-flight batch, commit it, leave the group.
Rebalances wait for the in-flight batch (under a deadline) before partitions go.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from collector.admin import NOT_READY_AFTER_S, AdminServer
from collector.client import ensure_topics
from collector.config import RedisConfig, ServiceConfig, redact_urls
from collector.exporters.base import ExportError
from collector.exporters.kafka import KafkaExporter
from collector.pipeline.checkpoint import Checkpoint
from collector.pipeline.engine import RESEND_GRACE_MS, Engine, Work
from collector.pipeline.recovery import Recovery
from collector.processors.completion import WatermarkTracker
from collector.processors.decide import completion_due
from collector.processors.resp import RedisClient
from collector.processors.trace_state import SESSION_WAIT, TraceStateStore
from collector.receivers.kafka_otlp import KafkaOTLPReceiver
from collector.telemetry.logs import throttle_logs
from collector.telemetry.metrics import DEPENDENCY_FAILURES, RECORDS_SKIPPED, TRACES_IN_STATE
from collector.wire import regex_safety

log = logging.getLogger("toolwitness.service")

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


#: while it fails, one warning per this many seconds (the rest at DEBUG)
OUTAGE_LOG_EVERY_S = 30.0
#: the Kafka probe's pause between two checks that the brokers answer (``KafkaOTLPReceiver.probe``) ...
KAFKA_PROBE_EVERY_S = 2.0
#: ... and how long they get to answer
KAFKA_PROBE_TIMEOUT_S = 5.0
#: aiokafka's own log lines: one per message kind per this many seconds (an outage: ~70 a second)
LIBRARY_LOG_EVERY_S = 10.0
#: the checkpoint's line per dead-lettered record: one per reason per this many seconds (a producer
#: writing the wrong encoding sends every record there; toolwitness_dlq_records_total counts them all)
RECORD_LOG_EVERY_S = 10.0
#: each shutdown step (sweeper and probe, consumer, count moves, exporter, admin server, Redis) gets at
#: most this long: 6 steps, 30 s after the in-flight batch, all of the 30 s Kubernetes gives a pod between
#: SIGTERM and SIGKILL by default (the chart refuses a terminationGracePeriodSeconds below 30; its default is 60)
SHUTDOWN_STEP_S = 5.0
#: how often the sweeper refreshes ``toolwitness_traces_in_state`` (one script call per tenant,
#: ~20 us in Redis: it takes the buckets ended since the last read out of the tenant's sum)
TRACES_GAUGE_EVERY_S = 15.0


class Outage:
    """Consecutive failures of one of the loops' dependencies (Redis, Kafka): what readiness and
    the logs say about it. The first failure is a warning, then one per ``OUTAGE_LOG_EVERY_S``
    with the count in between; the recovery is logged once."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.since: float | None = None
        self.failures = 0
        self._logged_at = 0.0
        self._quiet = 0

    def failed(self, exc: BaseException, action: str) -> None:
        now = time.monotonic()
        self.failures += 1
        DEPENDENCY_FAILURES.labels("service", self.what).inc()
        if self.since is None:
            self.since = now
        if now - self._logged_at >= OUTAGE_LOG_EVERY_S or self.failures == 1:
            more = f" ({self._quiet} more failures since the last warning)" if self._quiet else ""
            log.warning("%s failed for %.0fs (%s: %s); %s%s", self.what, now - self.since, type(exc).__name__,
                        str(exc)[:200], action, more)
            self._logged_at, self._quiet = now, 0
        else:
            self._quiet += 1
            log.debug("%s failed again (%s: %s)", self.what, type(exc).__name__, exc)

    def ok(self) -> None:
        if self.since is not None:
            log.warning("%s recovered after %.1fs and %d failures", self.what, time.monotonic() - self.since,
                        self.failures)
        self.since, self.failures, self._logged_at, self._quiet = None, 0, 0.0, 0

    def down_for(self) -> float:
        return 0.0 if self.since is None else time.monotonic() - self.since


def redis_client(cfg: RedisConfig, password: str | None) -> RedisClient:
    """The service's Redis client: one server, or a Redis Cluster (``redis.cluster``) discovered
    from the node ``url`` names."""
    t = cfg.socket_timeout_seconds
    tls: dict[str, Any] = {"ssl_ca_certs": cfg.ssl_ca_file} if cfg.ssl_ca_file else {}
    if cfg.cluster:
        return RedisCluster.from_url(
            cfg.url, password=password, decode_responses=False, socket_timeout=t, socket_connect_timeout=t, **tls
        )
    return Redis.from_url(
        cfg.url, password=password, decode_responses=False, socket_timeout=t, socket_connect_timeout=t, **tls
    )


#: series of ``toolwitness_traces_in_state`` at most: the tenant comes from the agents' resource
#: attributes, so a misconfigured agent (a tenant per session) must not flood the metrics backend
TENANT_SERIES_MAX = 100
#: the series that sums the tenants beyond the largest ``TENANT_SERIES_MAX - 1``: not a tenant
#: name (the tenant rule has no parentheses), so it never merges with a real tenant's series
OTHER_TENANTS = "(other)"


def tenant_series(counts: Mapping[str, int]) -> dict[str, int]:
    """``counts`` as gauge series: every tenant when they fit, else the largest ones and one
    ``OTHER_TENANTS`` series with the rest (the total stays right)."""
    if len(counts) <= TENANT_SERIES_MAX:
        return dict(counts)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    kept = dict(ranked[: TENANT_SERIES_MAX - 1])
    kept[OTHER_TENANTS] = sum(n for _, n in ranked[TENANT_SERIES_MAX - 1 :])
    return kept


class ToolwitnessService:
    name = "service"
    #: the loops whose Redis / Kafka failures are counted (``toolwitness_dependency_failures_total{loop}``)
    #: and reported by ``/readyz``; ``deliveries`` is what any loop failed to deliver to Kafka
    LOOPS = ("batch", "watermarks", "sweep", "kafka", "deliveries")

    def __init__(self, cfg: ServiceConfig, *, owns_process: bool = False) -> None:
        """``owns_process``: the service is what this process is for (``toolwitness run``, the
        bench and demo processes): ``start`` may tune the process-wide garbage collector. An
        application that embeds the service leaves its collector alone (the default)."""
        self.cfg = cfg
        self.owns_process = owns_process
        self.instance = cfg.instance or f"{socket.gethostname()}:{os.getpid()}"
        password = os.environ.get(cfg.redis.password_env) or None
        self.redis = redis_client(cfg.redis, password)
        self.store = TraceStateStore(self.redis, cfg)
        self.exporter = KafkaExporter(cfg.kafka)
        self.engine = Engine(cfg, self.store, self.exporter)
        self.watermarks = WatermarkTracker(self.redis, self.store.k.watermarks(cfg.kafka.topics.spans), cfg.completion)
        self.recovery = Recovery(cfg, self.store)
        self.checkpoint = Checkpoint(cfg, self.store, self.engine, self.exporter, self.watermarks)
        self.batch_lock = asyncio.Lock()
        self.receiver = KafkaOTLPReceiver(
            cfg.kafka, instance=self.instance, batch_lock=self.batch_lock, on_assigned=self.watermarks.assign
        )
        self.admin = AdminServer(cfg.admin.host, cfg.admin.port, ready=self.ready, alive=self.alive)
        self.retry = RetryPolicy()
        self.sweep_retry = RetryPolicy(base_s=cfg.completion.sweep_interval_ms / 1000)
        #: the poll loop's batches, its watermark publishing, the sweeper, the brokers' answers, and the
        #: deliveries of what the batches and the sweeper publish (``_outage``)
        self.outages = {name: Outage(name) for name in self.LOOPS}
        #: the last batch failed to deliver (its retry is the delivery still owed)
        self._batch_undelivered = False
        self._stopping = asyncio.Event()
        self._started = False
        self._last_loop = time.monotonic()
        self._sweeper: asyncio.Task[None] | None = None
        self._prober: asyncio.Task[None] | None = None
        #: ``refresh_traces_gauge``: how often, when last (monotonic s), and the tenants it set
        self.traces_gauge_every_s = TRACES_GAUGE_EVERY_S
        self._gauged_at: float | None = None
        self._gauged: set[str] = set()
        #: the error that ended the poll loop, if one did
        self._failed: BaseException | None = None

    @property
    def consumer(self) -> AIOKafkaConsumer | None:
        """The receiver's consumer (tests and tools inspect assignment and positions)."""
        return self.receiver.consumer

    # health
    def ready(self) -> bool:
        """Started, consuming, and no dependency failing for ``NOT_READY_AFTER_S`` in a row."""
        return (
            self._started
            and not self._stopping.is_set()
            and self.receiver.consumer is not None
            and all(o.down_for() < NOT_READY_AFTER_S for o in self.outages.values())
        )

    def alive(self) -> bool:
        """Live while starting (every start step has its own deadline and fails the process if it
        passes), then while the poll loop has turned within the last minute."""
        if self._failed is not None:
            return False
        return not self._started or time.monotonic() - self._last_loop < 60

    async def start(self) -> None:
        if self.owns_process:  # process-wide, like the collector tuning below
            self.throttle_logs()
        await self.admin.start()
        await asyncio.wait_for(self.redis.ping(), timeout=10)
        await self.store.start()
        await self.recovery.start()
        self.engine.lost_at_ms = self.recovery.lost_at_ms
        if (risk := await self.recovery.eviction_risk()) is not None:
            log.warning(
                "Redis at redis.url %s may evict this service's keys (%s): an evicted trace state, "
                "expectation or decision is evidence lost without notice, and a verdict can then be "
                "wrong. Set maxmemory-policy noeviction (a full Redis then fails writes and batches "
                "are retried) or give Redis the memory it needs",
                redact_urls(self.cfg.redis.url), risk,
            )
        # Missing topics are created (replication min(3, brokers), observations compacted) and
        # waited for; a refusal (no CreateTopics permission, ...) fails the start with its reason.
        k = self.cfg.kafka
        await ensure_topics(
            k.bootstrap_servers, k.topics, security=k.security, client_id=f"{k.client_id}-admin",
            keep_ms=self.cfg.redis.state_ttl_seconds * 1000,
        )
        # The output topics' record limits: the exporter keeps its records and batches within them.
        await self.exporter.read_record_limits(self.cfg.limits.max_observation_bytes)
        await self.exporter.start()
        # The regex check's Unicode tables, built in a thread before the first batch: built by the
        # first expectation with a \w regex, they would stall every tenant's batch by ~0.5 s.
        await asyncio.to_thread(regex_safety.warm_up)
        await self.receiver.start()
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="sweeper")
        self._prober = asyncio.create_task(self._probe_loop(), name="kafka-probe")
        self._last_loop = time.monotonic()
        self._started = True
        # What is alive now (modules, config, scorer trees, clients: >100k objects) lives as
        # long as the process. Freezing it keeps the cyclic collector from re-scanning it in
        # every full collection, each of which otherwise stalls a batch by ~100 ms (the p99
        # time to verdict). Refcounting still frees these objects; only cycles among them
        # would outlive the process's need for them, and they are startup objects. A larger
        # young generation lets a batch's short-lived objects die before they are promoted
        # (fewer promotions, fewer full collections): p99 at 5,000 spans/s 115-125 -> 65-87 ms.
        # Process-wide: only when the service owns the process (an embedding application's own
        # objects would be frozen too, and its collector thresholds changed).
        if self.owns_process:
            gc.collect()
            gc.freeze()
            gen0, gen1, gen2 = gc.get_threshold()
            gc.set_threshold(max(gen0, 10_000), gen1, gen2)
        topics = self.cfg.kafka.topics
        log.info("service %s started: consuming %s, %s", self.instance, topics.spans, topics.control)

    @staticmethod
    def throttle_logs() -> None:
        """Lines that repeat per failed request or per bad record: one per kind per interval, with a
        count of those held back (process-wide loggers: only when the service owns the process)."""
        throttle_logs("aiokafka", LIBRARY_LOG_EVERY_S)
        throttle_logs("toolwitness.checkpoint", RECORD_LOG_EVERY_S)
        throttle_logs("toolwitness.engine", RECORD_LOG_EVERY_S)  # evaluations that raised, per exception type
        # A topic refusing records fails every re-send (each ~2 s): its ERROR and the producer's
        # renewal, like the outage's own warning, once per OUTAGE_LOG_EVERY_S.
        throttle_logs("toolwitness.exporter", OUTAGE_LOG_EVERY_S)

    def request_stop(self) -> None:
        self._stopping.set()

    async def start_unless_stopped(self) -> bool:
        """``start()``, given up as soon as a stop is requested: False if it was (the caller shuts
        down). A start waits on Kafka and Redis, up to a minute per step when one accepts connections
        but does not answer; a SIGTERM then (a rollout while Kafka is down) ends the process now,
        not after the step's timeout -- past the pod's grace period, which ends in a SIGKILL."""
        starting = asyncio.create_task(self.start(), name=f"service-start-{self.instance}")
        stopping = asyncio.create_task(self._stopping.wait(), name=f"service-stop-wait-{self.instance}")
        try:
            await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if starting.done():
            starting.result()  # a start that failed raises as ``start()`` does
            return True
        starting.cancel()
        await asyncio.wait({starting})
        if not starting.cancelled() and starting.exception() is not None:  # failed as it was cancelled
            log.debug("service %s: start failed as it was given up", self.instance, exc_info=starting.exception())
        log.info("service %s: stop requested while starting; not started", self.instance)
        return False

    @contextlib.asynccontextmanager
    async def serving(self, *, start_timeout: float | None = None) -> AsyncIterator[asyncio.Task[None]]:
        """Start, run the poll loop in a task (yielded), and on exit stop it and shut down.

        The in-process way to run the service (tests, benchmarks); ``toolwitness run`` adds
        signal handling around the same steps.
        """
        await asyncio.wait_for(self.start(), timeout=start_timeout)
        task = asyncio.create_task(self.run(), name=f"service-run-{self.instance}")
        try:
            yield task
        finally:
            self.request_stop()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, timeout=30)
            await self.shutdown()

    async def run(self) -> None:
        """Poll → checkpoint → commit until asked to stop. An error that is not retriable ends the
        loop: logged, the service reports itself not alive (/healthz 503), and it is raised."""
        try:
            await self._run()
        except Exception as exc:
            self._failed = exc
            log.critical("service: the poll loop stopped on %s: %s", type(exc).__name__, exc, exc_info=exc)
            raise

    async def _run(self) -> None:
        receiver = self.receiver
        while not self._stopping.is_set():
            self._last_loop = time.monotonic()
            batch = await receiver.poll()
            if receiver.unchecked:  # after a rebalance, before its partitions' first batch is judged
                await self._note_skipped_records()
            if not batch:
                await self._publish_watermarks()
                continue
            async with self.batch_lock:
                try:
                    result = await self.checkpoint.process(batch)
                except RETRIABLE as exc:
                    self._batch_undelivered = isinstance(exc, ExportError)
                    delay = self.retry.next_delay()
                    self._outage(exc, "batch").failed(exc, f"batch not committed; retrying from its first offset in "
                                                           f"{delay:.1f}s")
                    receiver.rewind(batch)
                    # The lag says how far behind this instance is while it cannot move on (the
                    # watermarks are not published: that needs Redis too). The broker's end offsets:
                    # the fetcher's high watermarks stop moving while the same batch is retried.
                    with contextlib.suppress(Exception):
                        await receiver.span_partitions_caught_up(fresh=True)
                    # a SIGTERM ends the wait (nothing was committed: the next owner replays the batch)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), timeout=delay)
                    continue
                self.retry.reset()
                self._batch_undelivered = False
                self.outages["batch"].ok()
                if result.published or result.dead_letters:
                    self.outages["deliveries"].ok()
                await receiver.commit(result.offsets)
            await self._publish_watermarks()

    async def _note_skipped_records(self) -> None:
        """Records deleted (retention) before this group read them are skipped by the consumer
        without a word: their spans are lost evidence, as after a Redis loss. Said (a warning, a
        metric) and, for the spans topic, recorded as the shared loss time, so no expectation
        created until now is judged absent on what is left of its traces (never FALSE for it)."""
        skipped = await self.receiver.skipped_records()
        if not skipped:
            return
        spans = False
        for tp, committed, first in skipped:
            RECORDS_SKIPPED.labels(self.name, tp.topic, str(tp.partition)).inc(first - committed)
            spans |= tp.topic == self.cfg.kafka.topics.spans
            log.warning(
                "%s/%d: offsets %d to %d were deleted before this group read them (retention shorter than "
                "the time the group was away or behind): %d record(s) skipped%s",
                tp.topic, tp.partition, committed, first - 1, first - committed,
                "; evidence of expectations created until now is marked state_lost (never FALSE)" if tp.topic
                == self.cfg.kafka.topics.spans else " (control records: their expectations, markers or cancels "
                "are lost)",
            )
        if spans:
            self.engine.lost_at_ms = await self.recovery.note_lost(int(time.time() * 1000))

    async def _probe_loop(self) -> None:
        """Every ``KAFKA_PROBE_EVERY_S``: do the brokers answer? A Kafka outage is invisible to the
        poll loop (``getmany`` returns empty batches, aiokafka retries and logs on its own), so
        without this /readyz, the failure counter and the log would not show it. A request of our
        own, bounded by a timeout, in a task beside the poll loop: it tests exactly the brokers this
        instance reads from, through the consumer's own connections, and needs no private aiokafka
        state (its connection / coordinator flags are internal and do not say whether fetches work).
        Beside the loop, not in it: a broker that does not answer the probe while fetches still work
        would otherwise hold every batch for up to ``KAFKA_PROBE_TIMEOUT_S``, and a healthy probe's
        round trip would add to the time to verdict of the records waiting for the next poll."""
        while not self._stopping.is_set():
            try:
                await self._probe_kafka()
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # shutdown stops the probe
                # Not sent to this task: an aiokafka future the request awaited was cancelled (as its
                # own tasks are when its client closes). No reason to stop probing.
                log.warning("kafka probe: its request was cancelled; probing again in %.0fs", KAFKA_PROBE_EVERY_S)
            except Exception:
                # Not a broker failure (those are RETRIABLE and counted): logged, not counted as an
                # outage the probe cannot vouch for, and the probe goes on (nothing awaits this task,
                # so an exception ending it would end the outage reporting unseen).
                log.exception("kafka probe failed; probing again in %.0fs", KAFKA_PROBE_EVERY_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=KAFKA_PROBE_EVERY_S)

    async def _probe_kafka(self) -> None:
        """One probe, bounded by ``KAFKA_PROBE_TIMEOUT_S``, recorded in ``outages["kafka"]``."""
        outage = self.outages["kafka"]
        try:
            async with asyncio.timeout(KAFKA_PROBE_TIMEOUT_S):
                await self.receiver.probe()
        except RETRIABLE as exc:
            if isinstance(exc, TimeoutError) and not str(exc):
                exc = TimeoutError(f"no answer within {KAFKA_PROBE_TIMEOUT_S:.0f}s")
            outage.failed(exc, "nothing is consumed; probing again in "
                               f"{KAFKA_PROBE_EVERY_S:.0f}s")
        else:
            outage.ok()

    async def _publish_watermarks(self) -> None:
        """Share this instance's watermarks; a Redis outage here is retried on the next poll."""
        try:
            await self.watermarks.publish(await self.receiver.span_partitions_caught_up())
        except RETRIABLE as exc:
            self.outages["watermarks"].failed(exc, "watermarks not published; retrying on the next poll")
        else:
            self.outages["watermarks"].ok()

    def _outage(self, exc: BaseException, loop: str) -> Outage:
        """Where a loop's failure counts: a failed delivery (``ExportError``) in the deliveries'
        outage, which only a delivery that succeeds closes, anything else in the loop's own.
        The loop's next turn succeeding proves nothing about Kafka taking records: it may send
        none (a decision whose delivery failed is re-sent by the sweeper ``RESEND_GRACE_MS``
        later, not by the replayed batch nor the next sweep), and closing the outage then said
        "recovered" at every turn and kept /readyz 200 while no decision was published."""
        return self.outages["deliveries" if isinstance(exc, ExportError) else loop]

    async def _sweep_loop(self) -> None:
        interval = self.cfg.completion.sweep_interval_ms / 1000
        outage = self.outages["sweep"]
        while not self._stopping.is_set():
            wait = interval
            try:
                if await self.sweep() or await self._nothing_left_to_deliver():
                    self.outages["deliveries"].ok()
                await self.refresh_traces_gauge()
            except RETRIABLE as exc:
                wait = max(interval, self.sweep_retry.next_delay())
                self._outage(exc, "sweep").failed(exc, f"sweep not done; retrying in {wait:.1f}s")
            except Exception:
                log.exception("sweeper: sweep failed; retrying")
            else:
                self.sweep_retry.reset()
                outage.ok()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=wait)

    async def _nothing_left_to_deliver(self) -> bool:
        """The deliveries outage is open, and what failed is no longer owed: no batch is being
        retried for a failed delivery, and no decision waits to be published (another instance
        published it, or it was dropped: cancelled, expired). Else the outage stayed open, and
        /readyz 503, until some later decision was delivered: for good on a quiet pipeline."""
        if self.outages["deliveries"].since is None or self._batch_undelivered:
            return False
        return await self.store.undelivered() == 0

    async def sweep(self) -> int:
        """Finalize deadlines, watermark completions, and re-send decided-but-unpublished scores.

        Work is claimed under a lease (exactly one instance wins each item); if handling it
        fails, the claims are put back so a later sweep (here or elsewhere) retries them; if
        this process dies holding them, they are due again when the lease ends; once handled,
        they are released.
        """
        # Its own deliveries: a batch may be between its sends and its flush meanwhile
        # (see KafkaExporter.deliveries).
        with self.exporter.deliveries():
            if await self.recovery.check():
                async with self.batch_lock:
                    await self.recovery.recover(self.receiver)
                    self.engine.lost_at_ms = self.recovery.lost_at_ms
                    self.store.counts_lost()
            # a loss another instance noted (records deleted before it read them)
            self.engine.lost_at_ms = max(self.engine.lost_at_ms, self.recovery.lost_at_ms)
            now = int(time.time() * 1000)
            k = self.store.k
            watermark = await self.watermarks.global_watermark(now)
            lease = self.store.claim_lease_ms
            #: (set, claimed items, their score if put back, the lease they hold)
            claims: list[tuple[str, list[tuple[str, str]], int, int]] = []

            async def claim(zset: str, upto: int, back: int, lease_until: int) -> list[tuple[str, str]]:
                items = await self.store.claim_due(zset, upto, lease_until=lease_until)
                claims.append((zset, items, back, lease_until))
                return items

            deadlines = await claim(k.deadlines, now, now, now + lease)
            waiting = await claim(k.await_watermark, watermark, watermark, watermark + lease)
            unpublished = await claim(k.unpublished, now - RESEND_GRACE_MS, now, now + lease)
            rejudge = await claim(k.revision_deadlines, now, now, now + lease)
            contradicted = await claim(k.rejudge, now, now, now + lease)
            try:
                work = Work()
                for tenant, ident in deadlines:
                    work.final.add((tenant, ident))
                    work.pending[(tenant, ident)] = "deadline"
                for key in rejudge:  # decided, revised to UNDETERMINED before the deadline: judged as final
                    work.final.add(key)
                    work.revisions.add(key)
                work.revisions.update(contradicted)  # left by a process that died before re-judging them
                #: complete by a count-less marker, nothing left to decide: reclaimed as the checkpoint
                #: reclaims one its counted marker completes (else kept for the whole state_ttl_seconds).
                #: Not a trace of a session: the session's expectations read it until it is complete.
                reclaim: list[tuple[str, str]] = []
                for tenant, ident in waiting:
                    if ident.startswith(SESSION_WAIT):
                        session = ident[len(SESSION_WAIT) :]
                        work.add(tenant, await self.store.session_pending(tenant, session), "watermark")
                        continue
                    pending, state = await self.store.trace_pending(tenant, ident)
                    work.add(tenant, pending, "watermark")
                    if (
                        not pending
                        and state is not None
                        and state.marker_at_ms >= 0
                        and not state.late
                        and not state.sessions
                        and (due := completion_due(state, self.cfg.completion)) is not None
                        and due <= watermark
                    ):
                        reclaim.append((tenant, ident))
                await self.store.reclaim(reclaim)
                published = []
                if work.pending or work.final or work.revisions:
                    outcomes = await self.engine.evaluate(work, watermark)
                    published.extend(await self.engine.decide_and_send(outcomes))
                if self.engine.contradicted:  # also on a quiet pipeline, where no batch would
                    again = Work(revisions=set(self.engine.contradicted))
                    self.engine.contradicted.clear()
                    published.extend(await self.engine.decide_and_send(await self.engine.evaluate(again, watermark)))
                for tenant, ident in unpublished:
                    p = await self.engine.republish(tenant, ident)
                    if p is not None:
                        published.append(p)
                if published:
                    await self.exporter.flush()
                    await self.store.mark_published([(p.tenant, p.expectation_id) for p in published])
            except BaseException:
                for zset, items, back, lease_until in claims:
                    await self.store.unclaim(zset, items, back, lease_until=lease_until)
                raise
            for zset, items, _, lease_until in claims:
                await self.store.release(zset, items, lease_until)
            return len(published)

    async def refresh_traces_gauge(self) -> None:
        """Each sweep: send the count moves the batches noted (when no batch took them along);
        every ``traces_gauge_every_s``: set ``toolwitness_traces_in_state`` from the counts in
        Redis, one series per tenant listed there (a tenant no longer listed loses its series)."""
        now = time.monotonic()
        if self._gauged_at is not None and now - self._gauged_at < self.traces_gauge_every_s:
            await self.store.flush_counts()
            return
        self._gauged_at = now
        counts = tenant_series(await self.store.count_traces())
        component = self.store.name
        for tenant, n in counts.items():
            TRACES_IN_STATE.labels(component, tenant).set(n)
        for tenant in self._gauged - counts.keys():
            with contextlib.suppress(KeyError):
                TRACES_IN_STATE.remove(component, tenant)
        self._gauged = set(counts)

    async def shutdown(self) -> None:
        """Stop the sweeper and the Kafka probe, leave the group, send the last count moves, close the
        exporter, the admin server and Redis, in that order. Each step is bounded (``SHUTDOWN_STEP_S``) and
        guarded: one that fails or hangs (Kafka or Redis unreachable) is logged at WARNING and the
        later ones still run, so a SIGTERM during an outage still ends the process cleanly (exit 0)."""
        self._stopping.set()
        unclean = [what for what, step in (
            ("the sweeper and the Kafka probe", self._stop_tasks),
            ("the consumer (leaving the group)", self._stop_receiver),
            ("the count of traces in state (its last moves)", self.store.flush_counts),
            ("the exporter (flushing the producer)", self.exporter.shutdown),
            ("the admin server", self.admin.shutdown),
            ("the Redis client", self.redis.aclose),
        ) if not await self._shutdown_step(what, step)]
        if unclean:
            log.info("service %s stopped (not closed cleanly: %s)", self.instance, ", ".join(unclean))
        else:
            log.info("service %s stopped", self.instance)

    async def _shutdown_step(self, what: str, step: Callable[[], Awaitable[Any]]) -> bool:
        """Run one shutdown step under ``SHUTDOWN_STEP_S``; False (logged) when it failed."""
        try:
            async with asyncio.timeout(SHUTDOWN_STEP_S):
                await step()
        except TimeoutError:
            log.warning("service: %s not closed within %.0fs; going on", what, SHUTDOWN_STEP_S)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the shutdown itself is being cancelled
            # a library's internal task cancelled under it (not us): a failure of this step
            log.warning("service: %s not closed cleanly (an internal task was cancelled); going on", what)
        except Exception as exc:
            log.warning("service: %s not closed cleanly (%s: %s); going on", what, type(exc).__name__,
                        str(exc)[:200])
        else:
            return True
        return False

    async def _stop_tasks(self) -> None:
        for task in (self._prober, self._sweeper):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _stop_receiver(self) -> None:
        async with self.batch_lock:
            await self.receiver.shutdown()  # leaves the group
