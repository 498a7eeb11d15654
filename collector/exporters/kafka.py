"""Kafka exporters: scores (keyed by expectation id), observations (keyed by content id, for a
compacted topic) and the DLQ (original record + reason headers). One idempotent producer, replaced
after a failed delivery (``RenewingProducer``): a record batch the broker refused leaves a gap in
the producer's sequence on its partition, and every later batch to that partition would be refused
as out of order (``OutOfOrderSequenceNumber``) until the process restarted."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from collector.client import TopicSetupError
from collector.client import kafka_security_kwargs as security_kwargs
from collector.config import KafkaConfig
from collector.exporters.base import ExportError
from collector.exporters.partition import KeyPartitioner
from collector.producer import RenewingProducer, describe_topic_configs, start_idempotent
from collector.telemetry.metrics import DLQ_RECORDS, EXPORT_FAILURES

log = logging.getLogger("toolwitness.exporter.kafka")

#: the deliveries of the current ``KafkaExporter.deliveries()`` scope (None: the batch's list)
_OWNED: ContextVar[list[asyncio.Future[Any]] | None] = ContextVar("toolwitness_owned_deliveries", default=None)

DLQ_PREVIEW_BYTES = 65536
#: the producer's record batches (several records of one partition, sent together) ...
MAX_BATCH_BYTES = 524288
#: ... and what a record batch holds besides its records' keys, values and header texts: the
#: batch header (61 bytes), each record's framing, the headers this exporter adds
RECORD_OVERHEAD = 512


def kafka_security_kwargs(cfg: KafkaConfig) -> dict[str, Any]:
    """aiokafka connection settings for the service's Kafka config (one implementation: the client's)."""
    return security_kwargs(cfg.security)


#: headers of score records: the tenant, and the encoding of the value (``kafka.output_format``)
TENANT_HEADER = "toolwitness-tenant"
CONTENT_TYPE_HEADER = "content-type"
#: headers a dead letter gets on top of the original record's (``toolwitness dlq`` reads them)
DLQ_HEADER_PREFIX = "toolwitness-dlq-"
DLQ_REASON_HEADER = DLQ_HEADER_PREFIX + "reason"
DLQ_DETAIL_HEADER = DLQ_HEADER_PREFIX + "detail"
DLQ_SOURCE_HEADER = DLQ_HEADER_PREFIX + "source"
DLQ_TRUNCATED_HEADER = DLQ_HEADER_PREFIX + "truncated-from"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: Sequence[tuple[str, bytes]]
    reason: str
    detail: str


class KafkaExporter:
    """Publishes outputs; ``flush`` awaits every delivery of the current batch or raises ExportError."""

    name = "exporter/kafka"

    def __init__(self, cfg: KafkaConfig) -> None:
        self.cfg = cfg
        self._producers = RenewingProducer(
            self._new_producer, component=self.name, timeout_s=cfg.request_timeout_ms / 1000, logger=log
        )
        #: deliveries not yet flushed, of the batch (its decision lanes included) or, within
        #: ``deliveries()``, of that scope's own list (the sweeper's)
        self._pending: list[asyncio.Future[Any]] = []
        #: each output topic's ``max.message.bytes`` where it could be read (``read_record_limits``)
        self.record_limits: dict[str, int] = {}
        self._max_observation_bytes: int | None = None

    @property
    def renewals(self) -> int:
        """How often the producer was replaced after a failed delivery."""
        return self._producers.renewals

    async def read_record_limits(self, max_observation_bytes: int) -> dict[str, int]:
        """Read the configs of the scores, observations and DLQ topics (where the principal may
        describe them) before ``start``: the producer's batches are kept below the smallest
        ``max.message.bytes``, and a dead letter is cut to fit the DLQ topic. A record the broker
        refuses is retried for ever (the batch, or the sweeper's re-send), so what would make it
        refuse records the service must write is refused here (TopicSetupError): an observations
        topic that cannot take an observation of ``limits.max_observation_bytes``, a compacted DLQ
        topic (it refuses records without a key, and a span record often has none)."""
        self._max_observation_bytes = max_observation_bytes
        configs = await self._describe_output_topics()
        self._set_record_limits(configs)
        message = self._observations_limit_problem()
        if message is not None:
            raise TopicSetupError(message)
        t = self.cfg.topics
        if "compact" in configs.get(t.dlq, {}).get("cleanup.policy", ""):
            raise TopicSetupError(
                f"DLQ topic {t.dlq} (kafka.topics.dlq) has cleanup.policy={configs[t.dlq]['cleanup.policy']}: a "
                "compacted topic refuses records without a key, so the dead letter of an unkeyed span record (the "
                "Collector's kafkaexporter writes them unless partition_traces_by_id is set) would stop its "
                "partition for good, and compaction would keep one dead letter per key. Set cleanup.policy=delete"
            )
        return self.record_limits

    async def _describe_output_topics(self) -> dict[str, dict[str, str]]:
        """The configs of the scores, observations and DLQ topics ({} where they cannot be read)."""
        t = self.cfg.topics
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.cfg.bootstrap_servers, client_id=f"{self.cfg.client_id}-admin",
            request_timeout_ms=self.cfg.request_timeout_ms, **kafka_security_kwargs(self.cfg),
        )
        try:
            async with asyncio.timeout(self.cfg.request_timeout_ms / 1000):
                await admin.start()
                configs = await describe_topic_configs(admin, [t.scores, t.observations, t.dlq])
        except Exception as exc:  # DescribeConfigs not permitted: the topics are taken as they are
            log.debug("could not read the configs of the output topics: %r", exc)
            configs = {}
        finally:
            with contextlib.suppress(Exception):
                await admin.close()
        return configs

    def _set_record_limits(self, configs: dict[str, dict[str, str]]) -> None:
        self.record_limits = {
            topic: int(c["max.message.bytes"]) for topic, c in configs.items() if c.get("max.message.bytes")
        }

    def _observations_limit_problem(self) -> str | None:
        """Why the observations topic cannot take every observation (None if it can, or unknown)."""
        t = self.cfg.topics
        obs_limit = self.record_limits.get(t.observations)
        wanted = self._max_observation_bytes
        if obs_limit is None or wanted is None or obs_limit - RECORD_OVERHEAD >= wanted:
            return None
        return (
            f"observations topic {t.observations} takes records up to {obs_limit:,} bytes (its max.message.bytes), "
            f"less than limits.max_observation_bytes ({wanted:,}) plus {RECORD_OVERHEAD} bytes "
            "for the record's key and headers: a larger observation would be refused, and its score re-sent "
            f"for ever. Set limits.max_observation_bytes to at most {obs_limit - RECORD_OVERHEAD:,}, or raise "
            "the topic's max.message.bytes"
        )

    async def _new_producer(self) -> AIOKafkaProducer:
        """A started idempotent producer. A renewal (a delivery failed: the broker refused a record
        batch, e.g. an output topic's max.message.bytes was lowered while the service runs) reads
        the topics' limits again first, so the new producer's batches fit them."""
        if self._producers.current is not None:
            configs = await self._describe_output_topics()
            if configs:
                self._set_record_limits(configs)
            if (message := self._observations_limit_problem()) is not None:
                log.error("%s: %s", self.name, message)
        # A batch over a topic's max.message.bytes is refused whole (every record in it): none bigger
        # than the smallest (a single larger record still goes in a batch of its own).
        batch_bytes = min([MAX_BATCH_BYTES, *(n - RECORD_OVERHEAD for n in self.record_limits.values())])
        return await start_idempotent(
            self.cfg.request_timeout_ms / 1000,
            bootstrap_servers=self.cfg.bootstrap_servers,
            client_id=f"{self.cfg.client_id}-exporter",
            # No linger: every batch ends in ``flush``, which waits for the lingering batch, so a
            # linger only delays each batch's scores; the sends of a large batch are issued without
            # yielding to the sender and are batched anyway.
            linger_ms=0,
            max_batch_size=max(1024, batch_bytes),
            partitioner=KeyPartitioner(),
            max_request_size=max(1048576, DLQ_PREVIEW_BYTES * 4),
            request_timeout_ms=self.cfg.request_timeout_ms,
            **kafka_security_kwargs(self.cfg),
        )

    async def start(self) -> None:
        await self._producers.start()

    async def shutdown(self) -> None:
        await self._producers.stop()

    async def _send(self, topic: str, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        producer = self._producers.current
        if producer is None:
            raise ExportError("exporter not started")
        try:
            fut = await producer.send(topic, value=value, key=key, headers=headers or None)
        except KafkaError as exc:  # not taken (no metadata, a full buffer, over max_request_size): not delivered
            raise ExportError(f"not sent: {type(exc).__name__}: {exc}") from exc
        owned = _OWNED.get()
        (self._pending if owned is None else owned).append(fut)

    @property
    def _content_type(self) -> bytes:
        return b"application/json" if self.cfg.output_format == "json" else b"application/x-protobuf"

    async def send_score(self, tenant: str, expectation_id: str, event: bytes) -> None:
        """Keyed ``<tenant>/<expectation id>`` (a tenant has no '/'): two tenants' expectations
        under one id stay two keys, and every version of one lands on one partition, in order."""
        headers = [(TENANT_HEADER, tenant.encode()), (CONTENT_TYPE_HEADER, self._content_type)]
        await self._send(self.cfg.topics.scores, f"{tenant}/{expectation_id}".encode(), event, headers)

    async def send_observation(self, observation_id: str, observation: bytes) -> None:
        headers = [(CONTENT_TYPE_HEADER, self._content_type)]
        await self._send(self.cfg.topics.observations, observation_id.encode(), observation, headers)

    async def send_dead_letter(self, d: DeadLetter) -> None:
        value = d.value
        headers = [h for h in d.headers if not h[0].startswith(DLQ_HEADER_PREFIX)]
        headers += [
            (DLQ_REASON_HEADER, d.reason.encode()),
            (DLQ_DETAIL_HEADER, d.detail[:512].encode("utf-8", "replace")),
            (DLQ_SOURCE_HEADER, f"{d.topic}/{d.partition}/{d.offset}".encode()),
        ]
        room = self._dead_letter_room(d.key, headers)
        if len(value) > room:
            headers.append((DLQ_TRUNCATED_HEADER, str(len(value)).encode()))
            value = value[:room]
        await self._send(self.cfg.topics.dlq, d.key, value, headers)

    def count_dead_letters(self, letters: Sequence[DeadLetter]) -> None:
        """``toolwitness_dlq_records_total`` for dead letters delivered (after ``flush``): a batch
        retried after a failed delivery sends its dead letters again but counts them once."""
        for d in letters:
            DLQ_RECORDS.labels(self.name, d.reason).inc()

    def _dead_letter_room(self, key: bytes | None, headers: Sequence[tuple[str, bytes]]) -> int:
        """How much of a dead letter's value is kept: ``DLQ_PREVIEW_BYTES``, less where the DLQ
        topic takes smaller records (a refused dead letter would stop its partition for good)."""
        limit = self.record_limits.get(self.cfg.topics.dlq)
        if limit is None:
            return DLQ_PREVIEW_BYTES
        # the truncated-from header comes on top of those given
        taken = RECORD_OVERHEAD + len(key or b"") + sum(len(k.encode()) + len(v) for k, v in headers) + 64
        return max(0, min(DLQ_PREVIEW_BYTES, limit - taken))

    @contextlib.contextmanager
    def deliveries(self) -> Iterator[None]:
        """Within it, the sends of this task (and of the tasks it starts) are its own: ``flush``
        awaits those alone, and the batch's ``flush`` does not take them.

        The sweeper publishes while a batch may be between its sends and its flush (it does not
        hold the batch lock). With one list for both, a sweep's flush took the batch's deliveries:
        a failure among them failed the sweep, whose own records went through, and the batch's
        flush found nothing pending, so the batch marked published, and committed, a score that
        was never written, and is never re-sent (only unpublished decisions are)."""
        token = _OWNED.set([])
        try:
            yield
        finally:
            _OWNED.reset(token)

    async def flush(self) -> None:
        """Await every delivery since the last flush; raise ExportError on any failure, after
        replacing the producer (its sequence broke)."""
        owned = _OWNED.get()
        if owned is None:
            pending, self._pending = self._pending, []
        else:
            pending = owned[:]
            owned.clear()
        if not pending:
            return
        producer = self._producers.current
        # Every future resolves when its batch is acknowledged or fails: wait for the producer's
        # batches (one wait), then read the futures, not one gather callback per record.
        if producer is not None:
            await producer.flush()
        unresolved = [f for f in pending if not f.done()]
        if unresolved:
            await asyncio.wait(unresolved)
        errors = [exc for f in pending if (exc := f.exception()) is not None]
        if errors:
            EXPORT_FAILURES.labels(self.name).inc(len(errors))
            kinds: dict[str, int] = {}
            for exc in errors:
                kinds[type(exc).__name__] = kinds.get(type(exc).__name__, 0) + 1
            log.error(
                "%s: %d of %d deliveries failed (%s): %s; sent again (the batch, or the sweeper's re-send) on a "
                "new producer", self.name, len(errors), len(pending),
                ", ".join(f"{n} {kind}" for kind, n in kinds.items()), errors[0],
            )
            # A failed delivery leaves a gap in the idempotent producer's sequence on its partition:
            # the same producer would have every later batch there refused (out of order). A new one
            # (a new producer id) starts its sequences afresh. ``renew`` returns once the old one is
            # stopped (what another caller still had in flight on it delivered or failed), before
            # this raises: the retry goes to the new producer, after those, so a key's records stay
            # in order. Only a failure costs this (an InitProducerId and a DescribeConfigs).
            if producer is not None:
                await self._producers.renew(producer)
            raise ExportError(f"{len(errors)} deliveries failed: {errors[0]}")
