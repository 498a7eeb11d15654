"""Existing topics set up against their use: what the service says at start, or refuses.

A compacted DLQ topic refuses records without a key: the dead letter of an unkeyed span record
(the Collector's kafkaexporter writes them by default) was refused and its batch retried for ever,
so the spans partition stopped for good. It is refused at start. A compacted spans topic (spans
replaced by later records of their trace) and an observations topic that also deletes
(``compact,delete``: the evidence a score cites expires) are warned about.
"""

from __future__ import annotations

import logging

import pytest

from collector.client import TopicSetupError
from collector.pipeline.service import ToolwitnessService
from tests.integration.harness import create_topic, make_config, running_service

pytestmark = pytest.mark.integration


async def test_a_compacted_dlq_topic_is_refused_at_start(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    await create_topic(kafka_bootstrap, cfg.kafka.topics.dlq, 1, {"cleanup.policy": "compact"})
    service = ToolwitnessService(cfg)
    try:
        with pytest.raises(TopicSetupError) as refused:
            await service.start()
    finally:
        await service.shutdown()
    message = str(refused.value)
    assert cfg.kafka.topics.dlq in message and "kafka.topics.dlq" in message and "cleanup.policy=delete" in message


async def test_a_compacted_spans_topic_and_expiring_observations_are_warned_about(
    kafka_bootstrap: str, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    t = cfg.kafka.topics
    await create_topic(kafka_bootstrap, t.spans, 1, {"cleanup.policy": "compact"})
    await create_topic(
        kafka_bootstrap, t.observations, 1, {"cleanup.policy": "compact,delete", "retention.ms": "3600000"}
    )
    with caplog.at_level(logging.WARNING, logger="collector.client"):
        async with running_service(cfg):
            pass
    warnings = [r.getMessage() for r in caplog.records if r.name == "collector.client"]
    assert any(t.spans in w and "compacted" in w for w in warnings), warnings
    assert any(t.observations in w and "retention.ms (3600000)" in w for w in warnings), warnings


async def test_control_and_scores_topics_that_delete_before_the_state_ttl_are_warned_about(
    kafka_bootstrap: str, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A Redis data loss is recovered from the control topic (expectations) and the scores topic
    (what was published): a retention shorter than the state's TTL loses what recovery needs."""
    cfg = make_config(kafka_bootstrap, redis_url, redis={"state_ttl_seconds": 7200})
    t = cfg.kafka.topics
    await create_topic(kafka_bootstrap, t.control, 1, {"retention.ms": "3600000"})
    await create_topic(kafka_bootstrap, t.scores, 1, {"retention.ms": "86400000"})  # longer: fine
    with caplog.at_level(logging.WARNING, logger="collector.client"):
        async with running_service(cfg):
            pass
    warnings = [r.getMessage() for r in caplog.records if r.name == "collector.client"]
    short = [w for w in warnings if "sooner than redis.state_ttl_seconds" in w]
    assert len(short) == 1 and t.control in short[0] and "retention.ms=3600000" in short[0], warnings
    assert "7200000 or more" in short[0] and "re-registers expectations" in short[0]
