"""OpenTelemetry SDK side: export spans straight to Kafka, count spans for completion markers.

    provider = TracerProvider()
    counter = SpanCountingProcessor()
    provider.add_span_processor(counter)
    provider.add_span_processor(BatchSpanProcessor(KafkaSpanExporter(bootstrap_servers="127.0.0.1:19092")))
    ...
    await tw.mark_complete(trace_id, span_count=counter.count(trace_id))

``KafkaSpanExporter`` writes what the Collector's kafkaexporter writes (``otlp_proto``,
partitioned by trace id): one ``ExportTraceServiceRequest`` per trace per export call,
keyed by the 32-hex trace id, with the resource / instrumentation-scope grouping kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import format_trace_id

from collector.client import kafka_security_kwargs
from collector.config import KafkaSecurityConfig
from collector.telemetry.metrics import EXPORT_FAILURES
from collector.wire.convert import TENANT
from scoring.normalize.spans import LENGTH_LIMITED_FLAG
from scoring.score.observation.exporter import UnboundedAttributeLimitsError, check_attribute_limits

__all__ = [
    "TENANT_HEADER",
    "KafkaSpanExporter",
    "SpanCountingProcessor",
    "split_by_trace",
    "split_by_trace_with_rejects",
]

log = logging.getLogger(__name__)

COMPONENT = "kafka_span_exporter"
#: Kafka header carrying the tenant (``TenantConfig.header``).
TENANT_HEADER = "toolwitness-tenant"
_ZERO_TRACE = bytes(16)
_ZERO_SPAN = bytes(8)


# --------------------------------------------------------------------------------------------------
# Splitting an export request by trace
# --------------------------------------------------------------------------------------------------


def _valid_ids(trace_id: bytes, span_id: bytes) -> bool:
    return len(trace_id) == 16 and trace_id != _ZERO_TRACE and len(span_id) == 8 and span_id != _ZERO_SPAN


def split_by_trace_with_rejects(
    request: ExportTraceServiceRequest,
) -> tuple[dict[str, ExportTraceServiceRequest], int]:
    """``split_by_trace`` plus the number of spans dropped for an invalid trace or span id."""
    out: dict[str, ExportTraceServiceRequest] = {}
    rejected = 0
    for rs in request.resource_spans:
        per_trace_rs: dict[str, ResourceSpans] = {}
        for ss in rs.scope_spans:
            per_trace_ss: dict[str, ScopeSpans] = {}
            for span in ss.spans:
                if not _valid_ids(span.trace_id, span.span_id):
                    rejected += 1
                    continue
                key = span.trace_id.hex()
                target_ss = per_trace_ss.get(key)
                if target_ss is None:
                    target_rs = per_trace_rs.get(key)
                    if target_rs is None:
                        req = out.get(key)
                        if req is None:
                            req = out[key] = ExportTraceServiceRequest()
                        target_rs = req.resource_spans.add()
                        if rs.HasField("resource"):
                            target_rs.resource.CopyFrom(rs.resource)
                        target_rs.schema_url = rs.schema_url
                        per_trace_rs[key] = target_rs
                    target_ss = target_rs.scope_spans.add()
                    if ss.HasField("scope"):
                        target_ss.scope.CopyFrom(ss.scope)
                    target_ss.schema_url = ss.schema_url
                    per_trace_ss[key] = target_ss
                target_ss.spans.add().CopyFrom(span)
    return out, rejected


def split_by_trace(request: ExportTraceServiceRequest) -> dict[str, ExportTraceServiceRequest]:
    """One request per trace id (32 lowercase hex), keeping the resource / scope grouping.

    Pure: the input is not modified. Traces appear in order of first appearance; spans keep
    their order. Spans with an invalid (empty, wrong-length or all-zero) trace or span id
    are dropped (see ``split_by_trace_with_rejects``).
    """
    return split_by_trace_with_rejects(request)[0]


# --------------------------------------------------------------------------------------------------
# Span counting
# --------------------------------------------------------------------------------------------------


class SpanCountingProcessor(SpanProcessor):
    """Counts, per trace id, every span the SDK records, from the moment it starts (thread-safe),
    for completion markers.

    A span still open in another thread when the marker is sent is counted, and so is one the
    sampler recorded but did not sample (``RECORD_ONLY``: no exporter receives it). A marker with
    this count claims every such span: the trace completes only once all of them arrived, so a
    span that is late, never ends or is never exported keeps absence unprovable (UNDETERMINED at
    the deadline), never FALSE. Spans a sampler drops outright are not recorded at all and
    reach no processor: score traces recorded with ``ALWAYS_ON`` (or parent-based on it).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        ctx = span.get_span_context()
        if ctx is None:
            return
        key = format_trace_id(ctx.trace_id)
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1

    def on_end(self, span: ReadableSpan) -> None:
        """Counted when it started."""

    def count(self, trace_id: str) -> int | None:
        """Spans recorded so far for a trace (32 hex), open ones included; ``None`` for a trace
        this processor never recorded a span of (a sampler dropped it, another provider recorded
        it, a mistyped id, or it was popped already).

        ``None``, not 0: ``mark_complete(trace_id, span_count=count)`` then sends a marker
        without a count, which proves nothing for a trace of which no span was seen. An explicit
        0 would claim the trace complete and empty, and make "tool X ran" FALSE for a tool that
        ran in a trace the counter never saw."""
        with self._lock:
            return self._counts.get(trace_id.lower())

    def forget(self, trace_id: str) -> None:
        """Drop a trace's count (call after sending its completion marker)."""
        with self._lock:
            self._counts.pop(trace_id.lower(), None)

    def pop(self, trace_id: str) -> int | None:
        """``count`` then ``forget``, atomically (``None`` likewise)."""
        with self._lock:
            return self._counts.pop(trace_id.lower(), None)

    def shutdown(self) -> None:
        """Nothing to release; counts stay readable after the provider shuts down."""

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


# --------------------------------------------------------------------------------------------------
# The exporter
# --------------------------------------------------------------------------------------------------


def _flag_length_limited(request: Any, spans: Sequence[ReadableSpan]) -> None:
    """Mark the encoded spans the SDK recorded under a finite or unknown attribute-length limit
    (``toolwitness.attribute_length_limited=true``): a cut tool name cannot prove which tool ran,
    so the service keeps such a trace incomplete (``attribute_length_limited``), never FALSE."""
    limited: set[bytes] = set()
    for span in spans:
        try:
            check_attribute_limits(span)
        except UnboundedAttributeLimitsError as exc:
            ctx = span.get_span_context()
            if ctx is not None:
                limited.add(ctx.span_id.to_bytes(8, "big"))
            log.debug("%s: %s", COMPONENT, exc)
    if not limited:
        return
    log.warning(
        "%s: %d span(s) recorded with a finite attribute-length limit are flagged %s (their traces "
        "can never be complete); use SpanLimits(max_span_attribute_length=SpanLimits.UNSET)",
        COMPONENT, len(limited), LENGTH_LIMITED_FLAG,
    )
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            for sp in ss.spans:
                if sp.span_id in limited:
                    sp.attributes.add(key=LENGTH_LIMITED_FLAG).value.bool_value = True


class KafkaSpanExporter(SpanExporter):
    """An OTel SDK ``SpanExporter`` producing ``otlp_proto`` records to Kafka, keyed by trace id.

    The idempotent producer (``enable_idempotence=True``, ``acks="all"``) lives on a private
    asyncio loop in a daemon thread; ``export()`` (called from SDK threads) submits to it and
    waits at most ``timeout_s``. Errors never escape: they are logged once per outage and
    reported as ``FAILURE``.
    """

    def __init__(
        self,
        *,
        bootstrap_servers: str,
        topic: str = "otlp_spans",
        tenant: str | None = None,
        timeout_s: float = 10.0,
        security: KafkaSecurityConfig | None = None,
        client_id: str = "toolwitness-otel-exporter",
        max_request_size: int = 1024 * 1024,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if tenant is not None and not TENANT.fullmatch(tenant):  # the service would dead-letter every record
            raise ValueError(f"tenant {tenant!r} is not [A-Za-z0-9._-]{{1,64}}")
        self._bootstrap = bootstrap_servers
        self._topic = topic
        self._headers: list[tuple[str, bytes]] = [(TENANT_HEADER, tenant.encode("utf-8"))] if tenant else []
        self._timeout_s = timeout_s
        self._client_id = client_id
        self._max_request_size = max_request_size
        self._kafka_kwargs = kafka_security_kwargs(security)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._producer: Any = None
        self._producer_lock: asyncio.Lock | None = None
        self._closed = False
        self._failing = False

    # -- the private loop ------------------------------------------------------------------------

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise RuntimeError("the exporter is shut down")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()
                thread = threading.Thread(
                    target=self._run_loop, args=(loop, ready), name="toolwitness-kafka-span-exporter", daemon=True
                )
                thread.start()
                ready.wait(self._timeout_s)
                self._loop, self._thread = loop, thread
            return self._loop

    @staticmethod
    def _run_loop(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        try:
            loop.run_forever()
        finally:
            try:
                pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for task in pending:
                    task.cancel()
                if pending:
                    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    async def _get_producer(self) -> Any:
        if self._producer_lock is None:
            self._producer_lock = asyncio.Lock()
        async with self._producer_lock:
            if self._producer is None:
                producer = AIOKafkaProducer(
                    bootstrap_servers=self._bootstrap,
                    client_id=self._client_id,
                    enable_idempotence=True,
                    acks="all",
                    max_request_size=self._max_request_size,
                    request_timeout_ms=max(1000, int(self._timeout_s * 1000)),
                    **self._kafka_kwargs,
                )
                try:
                    await producer.start()
                except BaseException:
                    with contextlib.suppress(Exception):
                        await producer.stop()
                    raise
                self._producer = producer
            return self._producer

    async def _send(self, records: list[tuple[bytes, bytes]]) -> None:
        producer = await self._get_producer()
        pending = [
            await producer.send(self._topic, value=value, key=key, headers=list(self._headers) or None)
            for key, value in records
        ]
        await asyncio.gather(*pending)

    async def _stop_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()

    async def _flush(self) -> None:
        if self._producer is not None:
            await self._producer.flush()

    def _run(self, coro_factory: Callable[[], Coroutine[Any, Any, None]], timeout_s: float) -> None:
        """Run a coroutine on the private loop and wait for it (cancelled on timeout)."""
        loop = self._ensure_loop()
        fut = asyncio.run_coroutine_threadsafe(coro_factory(), loop)
        try:
            fut.result(timeout=timeout_s)
        except TimeoutError:
            fut.cancel()
            raise TimeoutError(f"not acknowledged by Kafka within {timeout_s}s") from None

    # -- SpanExporter ----------------------------------------------------------------------------

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed:
            return SpanExportResult.FAILURE
        try:
            request = encode_spans(spans)
            _flag_length_limited(request, spans)
            parts = split_by_trace(request)
            if not parts:
                return SpanExportResult.SUCCESS
            records = [(tid.encode("ascii"), req.SerializeToString()) for tid, req in parts.items()]
            self._run(lambda: self._send(records), self._timeout_s)
        except Exception as exc:
            EXPORT_FAILURES.labels(component=COMPONENT).inc()
            if not self._failing:
                self._failing = True
                log.warning(
                    "%s: exporting %d span(s) to Kafka topic %r failed (further failures logged at DEBUG "
                    "until it recovers): %r",
                    COMPONENT, len(spans), self._topic, exc,
                )
            else:
                log.debug("%s: export failed again: %r", COMPONENT, exc)
            return SpanExportResult.FAILURE
        if self._failing:
            self._failing = False
            log.info("%s: exporting to Kafka topic %r recovered", COMPONENT, self._topic)
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with self._lock:
            if self._closed or self._loop is None:
                return True
        try:
            self._run(self._flush, timeout_millis / 1000)
        except Exception as exc:
            log.debug("%s: flush failed: %r", COMPONENT, exc)
            return False
        return True

    def shutdown(self) -> None:
        """Stop the producer and the loop thread. Idempotent; never raises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._stop_producer(), loop).result(timeout=self._timeout_s)
        except Exception as exc:
            log.warning("%s: stopping the Kafka producer failed: %r", COMPONENT, exc)
        with contextlib.suppress(RuntimeError):  # the loop is already closed
            loop.call_soon_threadsafe(loop.stop)
        thread.join(self._timeout_s)
        if thread.is_alive():
            log.warning("%s: the exporter thread did not stop within %ss", COMPONENT, self._timeout_s)
