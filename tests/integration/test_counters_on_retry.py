"""What a batch held is counted once, however often it is retried.

A batch that fails on a dependency (Redis or Kafka away) is not committed and is consumed again
from its first offset, decoded again, until it goes through. toolwitness_spans_received_total and
toolwitness_records_received_total counted at decode time, so every retry counted the batch again
(a reviewer saw 270 spans counted for 30 sent over a 40 s Redis outage), and the DLQ counter as a
dead letter was handed to the producer (a batch whose deliveries failed counted it again); all
count a batch once it is done now.

The failure is injected in-process (the trace-state store's apply raises the error a Redis outage
gives, for the first batches that carry spans), on the shared Kafka and Redis.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from collector.telemetry.metrics import DEPENDENCY_FAILURES
from tests.integration.harness import (
    TraceGroup,
    counter_value,
    ended,
    fail_on_timeout,
    make_config,
    open_stack,
    service_and_task,
    until,
)

pytestmark = pytest.mark.integration

FAILURES = 3


def counts() -> dict[str, float]:
    c = "pipeline/checkpoint"
    return {
        "spans": counter_value("toolwitness_spans_received_total", {"component": c}),
        "span records": counter_value("toolwitness_records_received_total", {"component": c, "kind": "spans"}),
        "control records": counter_value("toolwitness_records_received_total", {"component": c, "kind": "control"}),
        "dlq": counter_value("toolwitness_dlq_records_total",
                             {"component": "exporter/kafka", "reason": "undecodable_protobuf"}),
    }


async def test_a_retried_batch_is_counted_once(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    group = TraceGroup.build("retried", 5, int(time.time() * 1000) - 60_000)
    spans = sum(n for _, _, n in group.traces)
    expected = {"spans": float(spans), "span records": len(group.traces) + 1.0,
                "control records": 3.0 * len(group.traces), "dlq": 1.0}
    async with open_stack(cfg) as s, service_and_task(cfg) as (svc, task):
        before = counts()
        failed0 = DEPENDENCY_FAILURES.labels("service", "batch")._value.get()
        apply = svc.store.apply
        failed = 0

        async def failing_apply(groups: Any, watermark: int) -> Any:
            nonlocal failed
            if groups and failed < FAILURES:  # a batch with spans: fails as with Redis away
                failed += 1
                raise RedisConnectionError("injected: Redis is away")
            return await apply(groups, watermark)

        svc.store.apply = failing_apply  # type: ignore[method-assign]
        await s.send_group(group)
        await s.send(s.topics.spans, [("bad", b"\xff not otlp")])  # one dead letter
        with fail_on_timeout(lambda: f"not scored: {s.missing(group.ids())}; loop done={task.done()}"):
            await s.all_scored(group.ids(), timeout=60)

        def delta() -> dict[str, float]:
            now = counts()
            return {k: now[k] - before[k] for k in now}

        # every record went through (at least once each); then nothing in flight
        with fail_on_timeout(lambda: f"not every record counted: {delta()} (want {expected})"):
            await until(lambda: all(delta()[k] >= v for k, v in expected.items()), timeout=30)
        async with svc.batch_lock:
            got = delta()
        assert not task.done(), ended(task)
        assert failed == FAILURES
        assert DEPENDENCY_FAILURES.labels("service", "batch")._value.get() - failed0 >= FAILURES
        assert got == expected, f"counted {got} for {expected} after {FAILURES} failed batches"
        print(f"\n[counters] {FAILURES} batches failed and retried; counted once: {got}")


async def test_a_dead_letter_whose_batch_is_retried_is_counted_once(kafka_bootstrap: str, redis_url: str) -> None:
    """The DLQ counter went up as each dead letter was handed to the producer, so a batch whose
    deliveries then failed (Kafka away, a DLQ topic refusing the record) counted its dead letters
    again on every retry (a reviewer saw 7 for one record). It counts a batch that went through."""
    from collector.exporters.base import ExportError

    cfg = make_config(kafka_bootstrap, redis_url)
    async with open_stack(cfg) as s, service_and_task(cfg) as (svc, task):
        before = counts()["dlq"]
        flush = svc.exporter.flush
        failed = 0

        async def failing_flush() -> None:
            nonlocal failed
            if failed < FAILURES and any(True for _ in svc.exporter._pending):  # deliveries in flight
                failed += 1
                svc.exporter._pending.clear()
                raise ExportError("injected: deliveries failed")
            await flush()

        svc.exporter.flush = failing_flush  # type: ignore[method-assign]
        await s.send(s.topics.spans, [("bad", b"\xff not otlp")])
        with fail_on_timeout(lambda: f"dead letter not counted; failed={failed}; loop done={task.done()}"):
            await until(lambda: counts()["dlq"] - before >= 1 and failed == FAILURES, timeout=30)
        async with svc.batch_lock:
            got = counts()["dlq"] - before
        assert not task.done(), ended(task)
        assert got == 1.0, f"counted {got} dead letters for one record after {FAILURES} failed deliveries"
