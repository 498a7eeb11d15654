"""Shared fixtures: an in-memory tracer, and a clean gate (the intercept env vars unset)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from collector.boundary.intercept import ENV_CA_FILE, ENV_ENABLED, ENV_ENDPOINT, ENV_TLS, ENV_TOKEN


@pytest.fixture(autouse=True)
def clean_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ENV_ENABLED, ENV_ENDPOINT, ENV_TOKEN, ENV_TLS, ENV_CA_FILE):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def memory_tracer() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_span_attribute_length=SpanLimits.UNSET))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()
