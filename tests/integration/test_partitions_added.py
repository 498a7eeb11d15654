"""Partitions added to the spans topic while the service runs are assigned and read (from their
start) within ``kafka.metadata_max_age_ms``; aiokafka's own default left them unread for five
minutes, their spans unscored. Real service, Kafka and Redis."""

from __future__ import annotations

import time

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions

from scoring.models import TraceScorable
from tests.integration.harness import (
    control_client,
    create_topic,
    drop_stack,
    expects,
    make_config,
    new_trace_id,
    otlp_request,
    otlp_span,
    producer_sees_partitions,
    raw_producer,
    running_service,
    span_partitions,
    until,
    verdict,
)

pytestmark = pytest.mark.integration


async def test_spans_on_a_partition_added_while_running_are_scored(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = make_config(kafka_bootstrap, redis_url, kafka={"metadata_max_age_ms": 1000})
    await create_topic(kafka_bootstrap, cfg.kafka.topics.spans, 1, {})
    trace = new_trace_id()
    now = int(time.time() * 1000)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        async with running_service(cfg) as svc, control_client(cfg) as tw, raw_producer(cfg) as producer:
            await until(lambda: span_partitions(svc) == {0})
            eid = await tw.expect(TraceScorable(trace_ids=(trace,)), expects("search"))
            await admin.create_partitions({cfg.kafka.topics.spans: NewPartitions(total_count=3)})
            await producer_sees_partitions(producer, cfg.kafka.topics.spans, 3)
            record = otlp_request([otlp_span(trace, start_ms=now, end_ms=now + 1, tool="search")])
            # on the new partition 2, before the service could have noticed it: read from its start
            await producer.send_and_wait(cfg.kafka.topics.spans, record.SerializeToString(), partition=2)
            event = await tw.wait_for(eid, timeout=30)
            assert verdict(event) == "true"
            assert span_partitions(svc) == {0, 1, 2}
    finally:
        await admin.close()
        await drop_stack(cfg)
