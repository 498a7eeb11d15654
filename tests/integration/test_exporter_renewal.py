"""An output topic's ``max.message.bytes`` lowered while the service runs (an operator's change).

The exporter's idempotent producer numbers the records of each partition. A record batch the
broker refuses is never written, so its sequence numbers leave a gap: every later batch to that
partition is refused as out of order (``OutOfOrderSequenceNumber``), the batch behind it too,
even after the operator restored the limit. Measured on the old code (one producer for the
process's life): 20-30 s after the limit was restored, no score of the refused batch was on the
scores topic (or none of its observations on the observations topic), the sweeper re-sent them
every 2 s and each re-send failed out of order; /readyz stayed 200. Only a restart published them.

The exporter now replaces its producer after a failed delivery (``RenewingProducer``), reading
the topics' limits again first: the re-send goes out on a new producer id whose batches fit the
limit the topic has now.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from aiokafka import AIOKafkaProducer, ConsumerRecord

from collector.admin import NOT_READY_AFTER_S
from collector.config import ServiceConfig
from collector.pipeline import service as service_module
from collector.pipeline.service import OUTAGE_LOG_EVERY_S
from collector.processors.trace_state import Keys
from collector.wire.convert import decode_score_event
from tests.integration.harness import (
    BROKER_RECORD_LIMIT,
    PROBE_KEY,
    TraceGroup,
    counter_value,
    create_topic,
    fail_on_timeout,
    make_config,
    raw_producer,
    read_all,
    read_until,
    running_service,
    scores_by_id,
    set_record_limit,
    until,
    verdict,
)

pytestmark = pytest.mark.integration

#: after the cause is fixed: the sweeper re-sends an unpublished decision 2 s after its last try
RECOVERY_S = 20.0
EXPORT_FAILURES = ("toolwitness_export_failures_total", {"component": "exporter/kafka"})


def records(rs: list[ConsumerRecord[bytes, bytes]]) -> list[ConsumerRecord[bytes, bytes]]:
    return [r for r in rs if r.key != PROBE_KEY]


async def send_group(producer: AIOKafkaProducer, cfg: ServiceConfig, group: TraceGroup) -> None:
    """Expectations, spans and markers of ``group``, all acknowledged before the next kind is sent."""
    t = cfg.kafka.topics
    for topic, items in ((t.control, group.expectations()), (t.spans, group.spans()), (t.control, group.markers())):
        await asyncio.gather(*[await producer.send(topic, value=v, key=k.encode()) for k, v in items])


async def one_partition_outputs(kafka_bootstrap: str, redis_url: str) -> tuple[ServiceConfig, TraceGroup, TraceGroup]:
    """A config whose scores and observations topics have one partition each (a refused record
    holds back all that follow it), a group to warm the service with, and the group the test's
    refused scores belong to."""
    cfg = make_config(kafka_bootstrap, redis_url)
    t = cfg.kafka.topics
    await create_topic(kafka_bootstrap, t.scores, 1, {})
    await create_topic(kafka_bootstrap, t.observations, 1, {"cleanup.policy": "compact"})
    now = int(time.time() * 1000)
    return cfg, TraceGroup.build("warm", 1, now), TraceGroup.build("g", 1, now)


async def published(cfg: ServiceConfig, expected: dict[str, str]) -> bool:
    """Every expectation of ``expected`` has a score on the scores topic, and every observation
    those scores cite is on the observations topic."""
    bootstrap, t = cfg.kafka.bootstrap_servers, cfg.kafka.topics
    events = [decode_score_event(r.value or b"") for r in records(await read_all(bootstrap, t.scores))]
    if not set(expected) <= {e.expectation_id for e in events}:
        return False
    cited = {o for e in events if e.expectation_id in expected for o in e.observation_ids}
    keys = {(r.key or b"").decode() for r in records(await read_all(bootstrap, t.observations))}
    return bool(cited) and cited <= keys


async def assert_once_each(cfg: ServiceConfig, expected: dict[str, str]) -> None:
    """One distinct score_id per expectation (re-sends byte-identical), the right verdicts, nothing else."""
    scores = records(await read_all(cfg.kafka.bootstrap_servers, cfg.kafka.topics.scores))
    per: dict[str, set[str]] = {}
    for sid, payloads in scores_by_id(scores).items():
        assert all(p == payloads[0] for p in payloads), f"{sid}: re-sent events differ"
        ev = decode_score_event(payloads[0])
        assert verdict(ev) == expected.get(ev.expectation_id), (ev.expectation_id, verdict(ev), ev.rationale)
        per.setdefault(ev.expectation_id, set()).add(sid)
    assert {e: len(s) for e, s in per.items()} == dict.fromkeys(expected, 1)


@pytest.mark.parametrize("lowered", ["scores", "observations"])
async def test_records_refused_while_a_topic_limit_was_lowered_are_published_once_it_is_restored(
    kafka_bootstrap: str, redis_url: str, lowered: str
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    t = cfg.kafka.topics
    # one partition each: the refused records and those written before share a sequence
    await create_topic(kafka_bootstrap, t.scores, 1, {})
    await create_topic(kafka_bootstrap, t.observations, 1, {"cleanup.policy": "compact"})
    topic = t.scores if lowered == "scores" else t.observations
    warm = TraceGroup.build("warm", 1, int(time.time() * 1000))
    group = TraceGroup.build("g", 4, int(time.time() * 1000))
    async with running_service(cfg) as service, raw_producer(cfg) as producer:
        # records written first: the producer's sequence on both partitions is under way
        await send_group(producer, cfg, warm)
        await read_until(kafka_bootstrap, t.scores, lambda rs: len(records(rs)) >= 2, timeout=30)
        await set_record_limit(kafka_bootstrap, topic, 200)  # below a score (~430 B) or observation (~220 B)
        failures = counter_value(*EXPORT_FAILURES)
        await send_group(producer, cfg, group)
        await until(lambda: counter_value(*EXPORT_FAILURES) > failures, timeout=30)  # refused
        await set_record_limit(kafka_bootstrap, topic, BROKER_RECORD_LIMIT)
        with fail_on_timeout(lambda: f"{lowered}: the refused records were not published within {RECOVERY_S:.0f}s "
                                     "of the limit being restored (the producer's sequence stayed broken?)"):
            await until(lambda: published(cfg, group.verdicts()), timeout=RECOVERY_S, interval=0.3)
        assert service.exporter.renewals >= 1
    await assert_once_each(cfg, {**warm.verdicts(), **group.verdicts()})


async def test_batches_refused_behind_each_other_on_one_partition_are_sent_again_in_batches_that_fit(
    kafka_bootstrap: str, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The scores topic takes 3,000-byte records when the service starts: its producer's batches
    # stay below that (about four scores each). Lowered to 1,500 while it runs, and not restored:
    # 21 scores decided in one batch go out in about six producer batches to the one partition;
    # those of four scores are refused, and the last (one score, small enough) is refused out of
    # order behind them. Every score is published, each once, without the operator doing more:
    # the new producer reads the limit again and sends batches the topic takes.
    cfg = make_config(kafka_bootstrap, redis_url)
    t = cfg.kafka.topics
    await create_topic(kafka_bootstrap, t.scores, 1, {"max.message.bytes": "3000"})
    await create_topic(kafka_bootstrap, t.observations, 1, {"cleanup.policy": "compact"})
    warm = TraceGroup.build("warm", 1, int(time.time() * 1000))
    group = TraceGroup.build("g", 21, int(time.time() * 1000))
    caplog.set_level(logging.ERROR, logger="toolwitness.exporter.kafka")
    async with running_service(cfg) as service, raw_producer(cfg) as producer:
        await send_group(producer, cfg, warm)
        await read_until(kafka_bootstrap, t.scores, lambda rs: len(records(rs)) >= 2, timeout=30)
        await set_record_limit(kafka_bootstrap, t.scores, 1500)
        failures = counter_value(*EXPORT_FAILURES)
        await send_group(producer, cfg, group)
        await until(lambda: counter_value(*EXPORT_FAILURES) > failures, timeout=30)
        with fail_on_timeout(lambda: f"the refused scores were not published within {RECOVERY_S:.0f}s"):
            await until(lambda: published(cfg, group.verdicts()), timeout=RECOVERY_S, interval=0.3)
        assert service.exporter.renewals >= 1
        assert service.exporter.record_limits[t.scores] == 1500
    failed = [r.getMessage() for r in caplog.records if "deliveries failed" in r.getMessage()]
    # The size refusals happened (the scenario ran). Whether the broker also refused a batch behind
    # them as out of order depends on how many producer batches were in flight together: seen in
    # most runs, not in all (a fresh-clone CI run logged 35 size refusals and no other kind).
    assert any("MessageSizeTooLargeError" in m for m in failed), failed
    await assert_once_each(cfg, {**warm.verdicts(), **group.verdicts()})


async def test_readiness_is_lost_while_deliveries_keep_failing_and_comes_back_once_they_succeed(
    kafka_bootstrap: str, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The scores topic refuses every score for longer than NOT_READY_AFTER_S: the sweeper re-sends the
    # decisions every 2 s and each re-send fails. Measured on the old code: /readyz stayed 200 and the
    # log said "sweep recovered" every ~2 s -- the sweep after a failed re-send had nothing due (a
    # decision put back waits RESEND_GRACE_MS), so it succeeded and closed the outage. A sweep that
    # sends nothing says nothing about deliveries: the outage stays open until one succeeds.
    cfg, warm, group = await one_partition_outputs(kafka_bootstrap, redis_url)
    t = cfg.kafka.topics
    caplog.set_level(logging.INFO, logger="toolwitness.service")

    def service_lines(since: int, text: str) -> list[str]:
        return [r.getMessage() for r in caplog.records[since:]
                if r.name == "toolwitness.service" and r.levelno >= logging.WARNING and text in r.getMessage()]

    def recoveries(since: int) -> list[str]:
        return service_lines(since, " recovered after ")

    async with running_service(cfg) as service, raw_producer(cfg) as producer:
        await send_group(producer, cfg, warm)
        await read_until(kafka_bootstrap, t.scores, lambda rs: len(records(rs)) >= 2, timeout=30)
        assert service.ready()
        await set_record_limit(kafka_bootstrap, t.scores, 200)  # below a score (~430 B)
        failures = counter_value(*EXPORT_FAILURES)
        before = len(caplog.records)
        await send_group(producer, cfg, group)
        await until(lambda: counter_value(*EXPORT_FAILURES) > failures, timeout=30)
        failing, failed_at = len(caplog.records), time.monotonic()
        with fail_on_timeout(lambda: f"still ready {NOT_READY_AFTER_S + 15:.0f}s after the first refused delivery; "
                                     f"logged meanwhile: {recoveries(failing)}"):
            await until(lambda: not service.ready(), timeout=NOT_READY_AFTER_S + 15, interval=0.1)
        assert counter_value(*EXPORT_FAILURES) > failures + 1  # the sweeper's re-sends failed too
        assert recoveries(failing) == []
        warned = service_lines(before, "deliveries failed for ")
        assert 1 <= len(warned) <= 1 + (time.monotonic() - failed_at) / OUTAGE_LOG_EVERY_S, warned
        assert not await published(cfg, group.verdicts())

        await set_record_limit(kafka_bootstrap, t.scores, BROKER_RECORD_LIMIT)
        restored = len(caplog.records)
        with fail_on_timeout(lambda: f"the refused decisions were not published within {RECOVERY_S:.0f}s"):
            await until(lambda: published(cfg, group.verdicts()), timeout=RECOVERY_S, interval=0.3)
        with fail_on_timeout(lambda: "not ready again after the decisions were published"):
            await until(service.ready, timeout=10)
        (recovered,) = recoveries(restored)
    assert recovered.startswith("deliveries recovered after "), recovered
    await assert_once_each(cfg, {**warm.verdicts(), **group.verdicts()})


async def test_readiness_comes_back_once_nothing_failed_is_still_owed(
    kafka_bootstrap: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Decisions whose delivery failed, then dropped before any re-send got through (their records
    # expired; a cancel or another instance publishing them does the same): nothing is owed any more.
    # Measured on the old code: only a delivery that succeeds closed the deliveries outage, so with
    # nothing else to deliver /readyz stayed 503 for good (15 s here, and on).
    monkeypatch.setattr(service_module, "NOT_READY_AFTER_S", 1.0)
    cfg, warm, group = await one_partition_outputs(kafka_bootstrap, redis_url)
    t = cfg.kafka.topics
    async with running_service(cfg) as service, raw_producer(cfg) as producer:
        await send_group(producer, cfg, warm)
        await read_until(kafka_bootstrap, t.scores, lambda rs: len(records(rs)) >= 2, timeout=30)
        assert service.ready()
        await set_record_limit(kafka_bootstrap, t.scores, 200)  # below a score (~430 B)
        await send_group(producer, cfg, group)
        with fail_on_timeout(lambda: "still ready while every score of the group was refused"):
            await until(lambda: not service.ready(), timeout=30, interval=0.1)
        keys = Keys(cfg.redis.key_prefix)
        assert await service.store.undelivered() == len(group.verdicts())
        await service.redis.delete(*[keys.decision("default", e) for e in group.verdicts()])
        with fail_on_timeout(lambda: "not ready again with nothing left to deliver"):
            await until(service.ready, timeout=15, interval=0.1)
        assert await service.store.undelivered() == 0
        # ... and a failure after it opens the outage again
        again = TraceGroup.build("again", 1, int(time.time() * 1000))
        await send_group(producer, cfg, again)
        with fail_on_timeout(lambda: "still ready while the next scores were refused"):
            await until(lambda: not service.ready(), timeout=30, interval=0.1)
