"""Span records compressed with each codec the Collector's kafkaexporter offers
(``producer.compression``: none, gzip, snappy, lz4, zstd) are read, on Kafka and Redis.

aiokafka decodes snappy, lz4 and zstd only with ``cramjam`` installed; without it the consumer's
fetch raised ``UnsupportedCodecError`` out of the poll loop and the service exited (every restart
met the same batch again), so one Collector set to ``compression: zstd`` stopped the whole group.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaProducer

from collector.config import ServiceConfig
from scoring.models import TraceScorable
from tests.integration.harness import (
    control_client,
    expects,
    make_config,
    new_span_id,
    new_trace_id,
    otlp_span,
    running_service,
    send_spans,
    verdict,
)

pytestmark = pytest.mark.integration

#: every compression.type Kafka has (and so every ``producer.compression`` of the kafkaexporter)
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


@contextlib.asynccontextmanager
async def compressing_producer(cfg: ServiceConfig, codec: str) -> AsyncIterator[AIOKafkaProducer]:
    producer = AIOKafkaProducer(
        bootstrap_servers=cfg.kafka.bootstrap_servers, acks="all", compression_type=None if codec == "none" else codec
    )
    await producer.start()
    try:
        yield producer
    finally:
        await producer.stop()


async def test_span_records_of_every_kafka_codec_are_scored(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    t0 = int(time.time() * 1000) - 5_000
    async with running_service(cfg) as service, control_client(cfg) as tw:
        idents = {}
        for codec in CODECS:
            trace, root = new_trace_id(), new_span_id()
            async with compressing_producer(cfg, codec) as producer:
                await send_spans(
                    producer, cfg, trace,
                    otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 300),
                    otlp_span(trace, parent=root, tool="search", start_ms=t0 + 10, end_ms=t0 + 40),
                )
            idents[codec] = await tw.expect(TraceScorable(trace_ids=(trace,)), expects("search"))
            await tw.mark_complete(trace, span_count=2)
        got = {codec: verdict(await tw.wait_for(ident, timeout=30)) for codec, ident in idents.items()}
        assert service.alive()
    assert got == dict.fromkeys(CODECS, "true")
