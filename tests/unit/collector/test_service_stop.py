"""A stop request (SIGTERM) ends the poll loop at once, also while a failed batch waits to be retried."""

from __future__ import annotations

import asyncio
import time

from aiokafka.structs import TopicPartition
from redis.exceptions import ConnectionError as RedisConnectionError

from collector.config import ServiceConfig
from collector.pipeline.service import RetryPolicy, ToolwitnessService


async def test_a_stop_request_ends_the_wait_before_a_failed_batch_is_retried() -> None:
    service = ToolwitnessService(ServiceConfig())
    # the retry backoff after a few failures in a row (it is capped at 10 s); here from the first one
    service.retry = RetryPolicy(base_s=30.0, cap_s=30.0)
    failed = asyncio.Event()

    async def poll() -> dict[TopicPartition, list[object]]:
        return {TopicPartition("otlp_spans", 0): [object()]}

    async def process(batch: object) -> object:
        failed.set()
        raise RedisConnectionError("Redis is down")

    async def caught_up(*, fresh: bool = False) -> dict[int, bool]:
        return {}

    service.receiver.poll = poll  # type: ignore[assignment]
    service.receiver.rewind = lambda batch: None  # type: ignore[assignment]
    service.receiver.span_partitions_caught_up = caught_up  # type: ignore[method-assign]
    service.checkpoint.process = process  # type: ignore[assignment]
    loop = asyncio.create_task(service.run())
    try:
        await asyncio.wait_for(failed.wait(), timeout=5)
        await asyncio.sleep(0.05)  # in the backoff now
        stopped_at = time.monotonic()
        service.request_stop()
        await asyncio.wait_for(loop, timeout=5)  # the old loop slept the whole 30 s
        assert time.monotonic() - stopped_at < 1.0
    finally:
        loop.cancel()
        await service.redis.aclose()
