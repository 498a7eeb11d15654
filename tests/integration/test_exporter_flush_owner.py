"""The batch loop and the sweeper send through one exporter at the same time (the sweeper does not
hold the batch lock): each ``flush`` must answer for its own caller's deliveries (the sweep's are
its own within ``KafkaExporter.deliveries()``, as ``ToolwitnessService.sweep`` takes them).

With one list of pending deliveries for both, a sweep that flushed while a batch was between its
sends and its own flush took the batch's deliveries. A failure among them failed the sweep
(whose own records went through), and the batch's flush found nothing pending and returned:
the batch then marked published, and committed, a score that was never written -- and never
re-sent, since only unpublished decisions are.
"""

from __future__ import annotations

import asyncio

import pytest

from collector.exporters.base import ExportError
from collector.exporters.kafka import KafkaExporter
from tests.integration.harness import create_topic, make_config

pytestmark = pytest.mark.integration


async def test_a_sweep_flush_answers_for_the_sweeps_deliveries_only(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    # the scores topic takes records up to 1,000 bytes: the "batch" sends one it refuses
    await create_topic(kafka_bootstrap, cfg.kafka.topics.scores, 1, {"max.message.bytes": "1000"})
    # the "sweep" writes to another topic: a record in the refused record's producer batch is
    # refused with it (rightly its own failure)
    await create_topic(kafka_bootstrap, cfg.kafka.topics.observations, 1, {})
    exporter = KafkaExporter(cfg.kafka)
    await exporter.start()
    sent = asyncio.Event()
    swept = asyncio.Event()

    async def batch() -> None:
        await exporter.send_score("default", "refused", b"x" * 5000)
        sent.set()
        await swept.wait()  # e.g. awaiting Redis between its sends and its flush
        await exporter.flush()

    async def sweep() -> None:
        await sent.wait()
        try:
            with exporter.deliveries():
                await exporter.send_observation("fits", b"y" * 100)
                await exporter.flush()
        finally:
            swept.set()

    try:
        batch_task = asyncio.create_task(batch())
        await asyncio.wait_for(sweep(), 30)  # its own delivery went through: no error
        with pytest.raises(ExportError, match="1 deliveries failed"):
            await asyncio.wait_for(batch_task, 30)  # the refused record is the batch's failure
    finally:
        await exporter.shutdown()
