"""A whole toolwitness stack for integration tests: the service in-process (or as a subprocess),
a control-plane client, and a real OTel SDK provider exporting to Kafka. Unique topics, consumer
group and Redis key prefix per stack, so tests never see each other's data."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import Tracer

from collector.client import ToolwitnessClient
from collector.config import ServiceConfig, TopicsConfig
from collector.otel import KafkaSpanExporter, SpanCountingProcessor
from collector.pipeline.service import ToolwitnessService
from collector.wire.gen import score_pb2
from scoring.models import ScoringExpectation, ToolCallRequirement, ToolsCalled


def expects(*names: str) -> ScoringExpectation:
    return ScoringExpectation(conditions=(ToolsCalled(tools=tuple(ToolCallRequirement(name=n) for n in names)),))


def make_config(kafka_bootstrap: str, redis_url: str, **overrides: Any) -> ServiceConfig:
    run = uuid.uuid4().hex[:10]
    topics = TopicsConfig(
        spans=f"t-{run}-spans", control=f"t-{run}-control", scores=f"t-{run}-scores",
        observations=f"t-{run}-obs", dlq=f"t-{run}-dlq",
    )
    base: dict[str, Any] = {
        "kafka": {"bootstrap_servers": kafka_bootstrap, "group_id": f"g-{run}", "topics": topics.model_dump(),
                  "poll_timeout_ms": 50},
        "redis": {"url": redis_url, "key_prefix": f"t{run}"},
        "completion": {"sweep_interval_ms": 100, "default_deadline_seconds": 60},
        "admin": {"port": 0},
    }
    for k, v in overrides.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    return ServiceConfig.model_validate(base)


@dataclass
class Agent:
    """A real OTel SDK provider exporting to the stack's spans topic."""

    provider: TracerProvider
    tracer: Tracer
    counter: SpanCountingProcessor
    exporter: KafkaSpanExporter

    def tool(self, name: str, **attrs: Any) -> None:
        with self.tracer.start_as_current_span(
            name, attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, **attrs}
        ):
            pass

    def close(self) -> None:
        self.provider.shutdown()


def make_agent(cfg: ServiceConfig, tenant: str | None = None) -> Agent:
    provider = TracerProvider(sampler=ALWAYS_ON, span_limits=SpanLimits(max_span_attribute_length=SpanLimits.UNSET))
    counter = SpanCountingProcessor()
    exporter = KafkaSpanExporter(bootstrap_servers=cfg.kafka.bootstrap_servers, topic=cfg.kafka.topics.spans,
                                 tenant=tenant)
    provider.add_span_processor(counter)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Agent(provider, provider.get_tracer("toolwitness-tests"), counter, exporter)


@contextlib.asynccontextmanager
async def running_service(cfg: ServiceConfig) -> AsyncIterator[ToolwitnessService]:
    service = ToolwitnessService(cfg)
    await service.start()
    task = asyncio.create_task(service.run())
    try:
        yield service
    finally:
        service.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, timeout=30)
        await service.shutdown()


@contextlib.asynccontextmanager
async def control_client(cfg: ServiceConfig, tenant: str = "default") -> AsyncIterator[ToolwitnessClient]:
    async with ToolwitnessClient(bootstrap_servers=cfg.kafka.bootstrap_servers, tenant=tenant,
                                 topics=cfg.kafka.topics) as client:
        yield client


async def until(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05) -> Any:
    """Await a condition by polling state the test can observe (not a sleep-and-hope)."""
    async with asyncio.timeout(timeout):
        while True:
            value = predicate()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
            await asyncio.sleep(interval)


async def settled(service: ToolwitnessService, tenant: str, expectation_id: str) -> None:
    """Wait until the service has registered the expectation and finished the batch that did."""
    key = service.store.k.expectation(tenant, expectation_id)
    await until(lambda: service.redis.exists(key))
    async with service.batch_lock:
        pass
    await service.sweep()


def verdict(ev: score_pb2.ScoreEvent) -> str:
    return {1: "true", 2: "false", 3: "undetermined"}.get(ev.status, "unspecified")
