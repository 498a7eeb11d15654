"""The admin endpoint's metrics: standard process series, base units, no stale per-partition series."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from aiokafka import TopicPartition
from prometheus_client import generate_latest

from collector.receivers.kafka_otlp import _Rebalance
from collector.telemetry.metrics import CONSUMER_LAG, REGISTRY


def test_standard_process_and_python_series_are_exposed() -> None:
    text = generate_latest(REGISTRY).decode()
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "python_info", "python_gc_objects"):
        assert name in text, name
    assert "toolwitness_event_time_watermark_seconds" in text  # base unit, not _ms
    assert "_watermark_ms" not in text


async def test_revoked_partitions_drop_their_lag_series() -> None:
    receiver = SimpleNamespace(name="receiver/test", batch_lock=asyncio.Lock())
    for p in (0, 1):
        CONSUMER_LAG.labels("receiver/test", "spans", str(p)).set(5)
    await _Rebalance(receiver).on_partitions_revoked([TopicPartition("spans", 1), TopicPartition("spans", 9)])
    assert REGISTRY.get_sample_value("toolwitness_consumer_lag", {"component": "receiver/test", "topic": "spans",
                                                                  "partition": "0"}) == 5
    assert REGISTRY.get_sample_value("toolwitness_consumer_lag", {"component": "receiver/test", "topic": "spans",
                                                                  "partition": "1"}) is None


async def test_liveness_holds_through_a_slow_start_then_follows_the_poll_loop() -> None:
    import time

    from collector.config import ServiceConfig
    from collector.pipeline.service import ToolwitnessService

    service = ToolwitnessService(ServiceConfig())
    service._last_loop = time.monotonic() - 120  # constructed two minutes ago, still starting
    assert service.alive() and not service.ready()
    service._started = True  # started, but its poll loop has not turned for two minutes
    assert not service.alive()
    service._last_loop = time.monotonic()
    assert service.alive()
    await service.redis.aclose()


async def test_a_poll_loop_ended_by_an_error_is_not_alive() -> None:
    import pytest

    from collector.config import ServiceConfig
    from collector.pipeline.service import ToolwitnessService

    service = ToolwitnessService(ServiceConfig())
    service._started = True

    async def broken() -> None:
        raise ValueError("Value out of range")

    service._run = broken  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="out of range"):
        await service.run()
    assert not service.alive()  # /healthz 503: the orchestrator restarts it, not a silent zombie
    await service.redis.aclose()


def test_kafka_span_exporter_refuses_a_tenant_the_service_would_dead_letter() -> None:
    import pytest

    from collector.otel import KafkaSpanExporter

    with pytest.raises(ValueError, match=r"tenant 'acme corp' is not"):
        KafkaSpanExporter(bootstrap_servers="127.0.0.1:1", tenant="acme corp")
    KafkaSpanExporter(bootstrap_servers="127.0.0.1:1", tenant="acme-corp").shutdown()


async def test_traces_in_state_is_set_per_tenant_and_a_tenant_no_longer_counted_loses_its_series() -> None:
    from collector.config import ServiceConfig
    from collector.pipeline.service import ToolwitnessService

    service = ToolwitnessService(ServiceConfig())
    service.traces_gauge_every_s = 0
    counts = [{"unit-a": 3, "unit-b": 1}, {"unit-a": 2}]
    flushed = []

    async def count_traces() -> dict[str, int]:
        return counts.pop(0)

    async def flush_counts() -> None:
        flushed.append(1)

    service.store.count_traces = count_traces  # type: ignore[method-assign]
    service.store.flush_counts = flush_counts  # type: ignore[method-assign]

    def sample(tenant: str) -> float | None:
        return REGISTRY.get_sample_value("toolwitness_traces_in_state",
                                         {"component": "processor/trace_state", "tenant": tenant})

    await service.refresh_traces_gauge()
    assert (sample("unit-a"), sample("unit-b")) == (3, 1)
    await service.refresh_traces_gauge()
    assert (sample("unit-a"), sample("unit-b")) == (2, None)  # no stale series for a tenant gone
    # between refreshes a sweep only sends the moves the batches noted
    service.traces_gauge_every_s = 3600
    await service.refresh_traces_gauge()
    assert flushed == [1] and sample("unit-a") == 2
    await service.redis.aclose()


async def test_traces_in_state_keeps_a_bounded_number_of_series_whatever_the_tenants() -> None:
    """Tenants come from the agents' resource attributes: one per session (a misconfigured agent)
    must not make a series each. The largest keep theirs; the rest are summed in one."""
    from collector.config import ServiceConfig
    from collector.pipeline.service import OTHER_TENANTS, TENANT_SERIES_MAX, ToolwitnessService
    from collector.telemetry.metrics import TRACES_IN_STATE

    TRACES_IN_STATE.clear()  # the process-wide registry: series other tests set
    service = ToolwitnessService(ServiceConfig())
    service.traces_gauge_every_s = 0
    many = {f"sess-{i:05d}": 1 for i in range(5000)} | {"big-a": 70, "big-b": 50}

    async def count_traces() -> dict[str, int]:
        return many

    async def flush_counts() -> None:
        return None

    service.store.count_traces = count_traces  # type: ignore[method-assign]
    service.store.flush_counts = flush_counts  # type: ignore[method-assign]
    await service.refresh_traces_gauge()
    series = {
        s.labels["tenant"]: s.value
        for m in REGISTRY.collect() if m.name == "toolwitness_traces_in_state"
        for s in m.samples if s.labels.get("component") == "processor/trace_state"
    }
    assert len(series) == TENANT_SERIES_MAX
    assert series["big-a"] == 70 and series["big-b"] == 50
    assert sum(series.values()) == sum(many.values())  # nothing lost from the total
    assert series[OTHER_TENANTS] == 5000 - (TENANT_SERIES_MAX - 3)
    many = {"big-a": 1}  # back under the bound: the summed series goes
    await service.refresh_traces_gauge()
    assert REGISTRY.get_sample_value(
        "toolwitness_traces_in_state", {"component": "processor/trace_state", "tenant": OTHER_TENANTS}
    ) is None
    await service.redis.aclose()
