"""An expectation counts as registered at its control record's time (a replay gives it the same
deadline again), unless a producer's clock stamped the record far in the future: then at the
service's own time, so its deadline comes (it used to wait for as long as the clock was ahead).
Kafka refuses records stamped more than ``message.timestamp.after.max.ms`` ahead (an hour by
default since Kafka 3.6): that much ahead still came through."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from datetime import timedelta

import pytest
from aiokafka import ConsumerRecord

from collector.pipeline.checkpoint import MAX_CLOCK_AHEAD_MS
from collector.wire.convert import decode_score_event
from collector.wire.gen.score_pb2 import ScoreEvent
from tests.integration.harness import (
    drop_stack,
    expectation_bytes,
    expects,
    make_config,
    new_trace_id,
    raw_producer,
    read_until,
    running_service,
    verdict,
)

pytestmark = pytest.mark.integration


def decided(records: Sequence[ConsumerRecord[bytes, bytes]]) -> dict[str, list[ScoreEvent]]:
    out: dict[str, list[ScoreEvent]] = {}
    for r in records:
        if r.value:
            e = decode_score_event(r.value)
            out.setdefault(e.expectation_id, []).append(e)
    return out


async def test_a_registration_stamped_half_an_hour_ahead_still_meets_its_deadline(
    kafka_bootstrap: str, redis_url: str
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    ahead, near = uuid.uuid4().hex, uuid.uuid4().hex
    now = int(time.time() * 1000)
    try:
        async with running_service(cfg), raw_producer(cfg) as producer:
            for eid, stamp in ((ahead, now + 1_800_000), (near, now + MAX_CLOCK_AHEAD_MS // 2)):
                record = expectation_bytes(eid, [new_trace_id()], expects("search"), deadline=timedelta(seconds=1))
                await producer.send_and_wait(cfg.kafka.topics.control, record, key=eid.encode(), timestamp_ms=stamp)
            # No span, no marker: only the deadline decides it, one second after it was registered.
            records = await read_until(
                kafka_bootstrap, cfg.kafka.topics.scores, lambda rs: ahead in decided(rs), 30
            )
        events = decided(records)
        assert [(verdict(e), e.trigger) for e in events[ahead]] == [("undetermined", "deadline")]
        # decided about a second after the service took it, not half an hour later; one stamped
        # within the allowed clock difference keeps its own time (30 s ahead: not decided yet)
        assert events[ahead][0].decided_at.ToMilliseconds() < now + 25_000
        assert near not in events
    finally:
        await drop_stack(cfg)
