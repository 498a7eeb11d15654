"""Output topics that take smaller records than the service would write (their ``max.message.bytes``).

A record the broker refuses is never written, and the service retries it for ever: a dead letter
retried with its batch stops the spans partition for good, an observation re-sent by the sweeper
every two seconds keeps its score (re-sent each time) citing evidence that is not on the topic.
The service reads the topics' limits at start: dead letters are cut to fit the DLQ topic, the
producer's batches stay below the smallest limit, and an observations topic that cannot take an
observation of ``limits.max_observation_bytes`` is refused at start, naming both settings.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from collector.client import TopicSetupError
from collector.pipeline.service import ToolwitnessService
from collector.wire.convert import decode_score_event
from tests.integration.harness import (
    create_topic,
    expectation_bytes,
    expects,
    header,
    make_config,
    marker_bytes,
    new_trace_id,
    otlp_request,
    otlp_span,
    raw_producer,
    read_all,
    read_until,
    running_service,
    scores_by_id,
    verdict,
)

pytestmark = pytest.mark.integration

#: expectations decided in one batch, each with an observation of ~45 kB
EXPECTATIONS = 6


def _trace_record(trace: str, tools: int, *, argument_chars: int = 1000) -> bytes:
    """One OTLP record: a root span and ``tools`` executions of ``search`` with long arguments."""
    now = int(time.time() * 1000)
    root = otlp_span(trace, name="agent", start_ms=now - 100, end_ms=now)
    spans = [root] + [
        otlp_span(trace, parent=root.span_id, name=f"search-{i}", tool="search", start_ms=now - 50, end_ms=now - 40,
                  attrs={"gen_ai.tool.call.arguments": '{"q": "' + "x" * argument_chars + '"}',
                         "gen_ai.tool.call.id": f"call-{i}"})
        for i in range(tools)
    ]
    return otlp_request(spans).SerializeToString()


async def test_a_dead_letter_is_cut_to_fit_a_dlq_topic_with_a_small_record_limit(
    kafka_bootstrap: str, redis_url: str
) -> None:
    """A 40 kB undecodable record, a DLQ topic taking 10,000-byte records: dead-lettered cut to fit
    (with its original size), and the good record behind it on the same partition is scored."""
    cfg = make_config(kafka_bootstrap, redis_url)
    t = cfg.kafka.topics
    await create_topic(kafka_bootstrap, t.dlq, 1, {"max.message.bytes": "10000"})
    await create_topic(kafka_bootstrap, t.spans, 1, {})
    bad = b"\x00not otlp" * 4000
    trace = new_trace_id()
    async with raw_producer(cfg) as producer:
        await producer.send_and_wait(t.spans, bad, key=b"k")
        await producer.send_and_wait(t.spans, _trace_record(trace, 1), key=trace.encode())
    async with running_service(cfg), raw_producer(cfg) as producer:
        await producer.send_and_wait(t.control, expectation_bytes("e-dlq", [trace], expects("search")), key=b"e-dlq")
        await producer.send_and_wait(t.control, marker_bytes(trace, 2), key=trace.encode())
        dead = await read_until(kafka_bootstrap, t.dlq, lambda rs: len(rs) >= 1, timeout=30)
        scores = await read_until(kafka_bootstrap, t.scores, lambda rs: len(rs) >= 1, timeout=30)
    (letter,) = dead
    assert header(letter, "toolwitness-dlq-source") == f"{t.spans}/0/0"
    assert header(letter, "toolwitness-dlq-truncated-from") == str(len(bad))
    assert letter.value is not None and 0 < len(letter.value) < 10_000 and bad.startswith(letter.value)
    assert [verdict(decode_score_event(r.value or b"")) for r in scores] == ["true"]


async def test_observations_decided_together_are_sent_in_batches_the_topic_takes(
    kafka_bootstrap: str, redis_url: str
) -> None:
    """Observations of ~45 kB each, decided in one batch (those sent while the first is in flight
    share a producer batch), to an observations topic taking 70,000-byte records
    (limits.max_observation_bytes 65,536 fits it): each is written, and each score is published
    once (not re-sent for ever by the sweeper)."""
    cfg = make_config(kafka_bootstrap, redis_url, limits={"max_observation_bytes": 65_536})
    t = cfg.kafka.topics
    await create_topic(kafka_bootstrap, t.observations, 1, {"cleanup.policy": "compact", "max.message.bytes": "70000"})
    await create_topic(kafka_bootstrap, t.spans, 1, {})
    await create_topic(kafka_bootstrap, t.control, 1, {})
    traces = {f"e-{i}": new_trace_id() for i in range(EXPECTATIONS)}
    async with raw_producer(cfg) as producer:  # everything before the service starts: one batch
        for eid, trace in traces.items():
            await producer.send_and_wait(t.spans, _trace_record(trace, 40), key=trace.encode())
            exp = expectation_bytes(eid, [trace], expects("search"))
            await producer.send_and_wait(t.control, exp, key=eid.encode())
            await producer.send_and_wait(t.control, marker_bytes(trace, 41), key=trace.encode())
    async with running_service(cfg):
        observations = await read_until(kafka_bootstrap, t.observations, lambda rs: len(rs) >= EXPECTATIONS, timeout=30)
        await read_until(kafka_bootstrap, t.scores, lambda rs: len(rs) >= EXPECTATIONS, timeout=30)
        await asyncio.sleep(5)  # the sweeper re-sends a decision still unpublished after 2 s
        scores = await read_all(kafka_bootstrap, t.scores)
    assert all(len(r.value or b"") > 30_000 for r in observations)
    by_id = scores_by_id(scores)
    sends = {score_id: len(v) for score_id, v in by_id.items()}
    assert len(sends) == EXPECTATIONS and set(sends.values()) == {1}, sends


async def test_an_observations_topic_that_cannot_take_max_observation_bytes_is_refused_at_start(
    kafka_bootstrap: str, redis_url: str
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)  # limits.max_observation_bytes: 900,000
    t = cfg.kafka.topics
    await create_topic(kafka_bootstrap, t.observations, 1, {"cleanup.policy": "compact", "max.message.bytes": "500000"})
    service = ToolwitnessService(cfg)
    try:
        with pytest.raises(TopicSetupError) as refused:
            await service.start()
    finally:
        await service.shutdown()
    message = str(refused.value)
    assert t.observations in message and "max.message.bytes" in message
    assert "limits.max_observation_bytes" in message and "at most 499,488" in message
