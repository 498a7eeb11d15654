"""Kafka exporters: scores (keyed by expectation id), observations (keyed by content id, for a
compacted topic) and the DLQ (original record + reason headers). One idempotent producer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from collector.client import TopicSetupError
from collector.client import kafka_security_kwargs as security_kwargs
from collector.config import KafkaConfig
from collector.exporters.base import ExportError
from collector.exporters.partition import KeyPartitioner
from collector.producer import describe_topic_configs
from collector.telemetry.metrics import DLQ_RECORDS, EXPORT_FAILURES

log = logging.getLogger("toolwitness.exporter.kafka")

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
        self._producer: AIOKafkaProducer | None = None
        self._pending: list[asyncio.Future[Any]] = []
        #: each output topic's ``max.message.bytes`` where it could be read (``read_record_limits``)
        self.record_limits: dict[str, int] = {}

    async def read_record_limits(self, max_observation_bytes: int) -> dict[str, int]:
        """Read the configs of the scores, observations and DLQ topics (where the principal may
        describe them) before ``start``: the producer's batches are kept below the smallest
        ``max.message.bytes``, and a dead letter is cut to fit the DLQ topic. A record the broker
        refuses is retried for ever (the batch, or the sweeper's re-send), so what would make it
        refuse records the service must write is refused here (TopicSetupError): an observations
        topic that cannot take an observation of ``limits.max_observation_bytes``, a compacted DLQ
        topic (it refuses records without a key, and a span record often has none)."""
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
        self.record_limits = {
            topic: int(c["max.message.bytes"]) for topic, c in configs.items() if c.get("max.message.bytes")
        }
        obs_limit = self.record_limits.get(t.observations)
        if obs_limit is not None and obs_limit - RECORD_OVERHEAD < max_observation_bytes:
            raise TopicSetupError(
                f"observations topic {t.observations} takes records up to {obs_limit:,} bytes (its max.message.bytes), "
                f"less than limits.max_observation_bytes ({max_observation_bytes:,}) plus {RECORD_OVERHEAD} bytes "
                "for the record's key and headers: a larger observation would be refused, and its score re-sent "
                f"for ever. Set limits.max_observation_bytes to at most {obs_limit - RECORD_OVERHEAD:,}, or raise "
                "the topic's max.message.bytes"
            )
        if "compact" in configs.get(t.dlq, {}).get("cleanup.policy", ""):
            raise TopicSetupError(
                f"DLQ topic {t.dlq} (kafka.topics.dlq) has cleanup.policy={configs[t.dlq]['cleanup.policy']}: a "
                "compacted topic refuses records without a key, so the dead letter of an unkeyed span record (the "
                "Collector's kafkaexporter writes them unless partition_traces_by_id is set) would stop its "
                "partition for good, and compaction would keep one dead letter per key. Set cleanup.policy=delete"
            )
        return self.record_limits

    async def start(self) -> None:
        if self._producer is not None:
            return
        # A batch over a topic's max.message.bytes is refused whole (every record in it): none bigger
        # than the smallest (a single larger record still goes in a batch of its own).
        batch_bytes = min([MAX_BATCH_BYTES, *(n - RECORD_OVERHEAD for n in self.record_limits.values())])
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.cfg.bootstrap_servers,
            client_id=f"{self.cfg.client_id}-exporter",
            enable_idempotence=True,
            acks="all",
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
        await asyncio.wait_for(self._producer.start(), timeout=self.cfg.request_timeout_ms / 1000)

    async def shutdown(self) -> None:
        p, self._producer = self._producer, None
        if p is not None:
            await p.stop()

    async def _send(self, topic: str, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        if self._producer is None:
            raise ExportError("exporter not started")
        fut = await self._producer.send(topic, value=value, key=key, headers=headers or None)
        self._pending.append(fut)

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
        headers = [h for h in d.headers if not h[0].startswith("toolwitness-dlq-")]
        headers += [
            ("toolwitness-dlq-reason", d.reason.encode()),
            ("toolwitness-dlq-detail", d.detail[:512].encode("utf-8", "replace")),
            ("toolwitness-dlq-source", f"{d.topic}/{d.partition}/{d.offset}".encode()),
        ]
        room = self._dead_letter_room(d.key, headers)
        if len(value) > room:
            headers.append(("toolwitness-dlq-truncated-from", str(len(value)).encode()))
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

    async def flush(self) -> None:
        """Await every delivery since the last flush; raise ExportError on any failure."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        # Every future resolves when its batch is acknowledged or fails: wait for the producer's
        # batches (one wait), then read the futures, not one gather callback per record.
        if self._producer is not None:
            await self._producer.flush()
        unresolved = [f for f in pending if not f.done()]
        if unresolved:
            await asyncio.wait(unresolved)
        errors = [exc for f in pending if (exc := f.exception()) is not None]
        if errors:
            EXPORT_FAILURES.labels(self.name).inc(len(errors))
            log.error("exporter/kafka: %d of %d deliveries failed: %s", len(errors), len(pending), errors[0])
            raise ExportError(f"{len(errors)} deliveries failed: {errors[0]}")
