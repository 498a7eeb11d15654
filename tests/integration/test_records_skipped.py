"""Records deleted from the spans topic (retention) before the group read them: the consumer,
reset to the earliest offset, skipped them without a word, and a count-less completion marker then
proved an absence on what was left of the trace -- a FALSE for a tool that ran. The service now
finds the gap after the rebalance, says so (a warning, ``toolwitness_records_skipped``) and marks
the evidence of the expectations created until then ``state_lost``. Real service, Kafka, Redis."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

from tests.integration.harness import (
    control_client,
    counter_value,
    create_topic,
    drop_stack,
    expectation_bytes,
    expects,
    make_config,
    marker_bytes,
    new_span_id,
    new_trace_id,
    otlp_request,
    otlp_span,
    raw_producer,
    running_service,
)

pytestmark = pytest.mark.integration


async def test_spans_deleted_before_they_were_read_never_turn_into_false(
    kafka_bootstrap: str, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    spans = cfg.kafka.topics.spans
    tp = TopicPartition(spans, 0)
    await create_topic(kafka_bootstrap, spans, 1, {})
    trace, root = new_trace_id(), new_span_id()
    now = int(time.time() * 1000)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    caplog.set_level(logging.WARNING, logger="toolwitness.service")
    try:
        async with raw_producer(cfg) as producer:
            # offset 0: the tool call; the group has read nothing past it when retention deletes it
            call = otlp_span(trace, parent=root, start_ms=now, end_ms=now + 5, tool="search")
            await producer.send_and_wait(spans, otlp_request([call]).SerializeToString(), key=trace.encode())
            group = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=cfg.kafka.group_id,
                                     enable_auto_commit=False)
            await group.start()
            try:
                group.assign([tp])
                await group.commit({tp: 0})
            finally:
                await group.stop()
            await admin.delete_records({tp: RecordsToDelete(before_offset=1)})
            # offset 1: the rest of the trace (its root), read as usual
            rest = otlp_span(trace, span_id=root, start_ms=now, end_ms=now + 10, name="agent")
            await producer.send_and_wait(spans, otlp_request([rest]).SerializeToString(), key=trace.encode())
            control = cfg.kafka.topics.control
            await producer.send_and_wait(control, expectation_bytes("search-ran", [trace], expects("search"),
                                                                    deadline=timedelta(seconds=8)))
            await producer.send_and_wait(control, marker_bytes(trace, None))  # complete, count not given
        async with running_service(cfg), control_client(cfg) as tw:
            event = await tw.wait_for("search-ran", timeout=40)
        assert event.value != "false"  # the call was lost with its record, not absent
        assert "state_lost" in event.coverage.reasons
        labels = {"component": "service", "topic": spans, "partition": "0"}
        assert counter_value("toolwitness_records_skipped_total", labels) == 1
        assert [m for m in caplog.messages if f"{spans}/0: offsets 0 to 0 were deleted" in m]
    finally:
        await admin.close()
        await drop_stack(cfg)
