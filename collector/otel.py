"""OpenTelemetry SDK side: export spans straight to Kafka, count spans for completion markers.

    provider = TracerProvider()
    counter = SpanCountingProcessor()
    provider.add_span_processor(counter)
    provider.add_span_processor(BatchSpanProcessor(KafkaSpanExporter(bootstrap_servers="127.0.0.1:19092")))
    ...
    await tw.mark_complete(trace_id, span_count=counter.pop(trace_id))

``KafkaSpanExporter`` writes what the Collector's kafkaexporter writes (``otlp_proto``,
partitioned by trace id): one ``ExportTraceServiceRequest`` per trace per export call,
keyed by the 32-hex trace id, with the resource / instrumentation-scope grouping kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Literal, TypeVar

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import format_trace_id

from collector.client import kafka_security_kwargs
from collector.config import KafkaSecurityConfig
from collector.producer import RecordRefusedError, RenewingProducer, start_idempotent, topic_record_limit
from collector.receivers.decode import otlp_json_bytes
from collector.telemetry.metrics import DROPPED, EXPORT_FAILURES
from collector.wire.convert import TENANT
from scoring.models.scorables import check_trace_id
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
#: the default Kafka header carrying the tenant (the service's ``tenant.header``; the exporter's
#: ``tenant_header`` when a deployment renamed it).
TENANT_HEADER = "toolwitness-tenant"
_ZERO_TRACE = bytes(16)
_T = TypeVar("_T")
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


def _key(trace_id: str) -> str:
    """The counter's key: case folded, as before; anything but a str refused with what to pass."""
    if not isinstance(trace_id, str):
        check_trace_id(trace_id)
    return trace_id.lower()


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
        key = _key(trace_id)
        with self._lock:
            return self._counts.get(key)

    def forget(self, trace_id: str) -> None:
        """Drop a trace's count (call after sending its completion marker)."""
        key = _key(trace_id)
        with self._lock:
            self._counts.pop(key, None)

    def pop(self, trace_id: str) -> int | None:
        """``count`` then ``forget``, atomically (``None`` likewise)."""
        key = _key(trace_id)
        with self._lock:
            return self._counts.pop(key, None)

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


class _RefusalLog:
    """Refused traces at WARNING, at most one line per ``interval_s`` (the rest counted in the next)."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self._interval_s = interval_s
        self._next_at = 0.0
        self._suppressed = 0
        self._lock = threading.Lock()

    def refused(self, topic: str, refusals: Sequence[tuple[str, RecordRefusedError]]) -> None:
        now = time.monotonic()
        with self._lock:
            if now < self._next_at:
                self._suppressed += len(refusals)
                for trace_id, exc in refusals:
                    log.debug("%s: trace %s not written to %r: %s", COMPONENT, trace_id, topic, exc.reason)
                return
            suppressed, self._suppressed, self._next_at = self._suppressed, 0, now + self._interval_s
        more = f" ({suppressed} more refused since the last warning)" if suppressed else ""
        for trace_id, exc in refusals:
            log.warning(
                "%s: trace %s not written to Kafka topic %r, its evidence is lost: %s%s",
                COMPONENT, trace_id, topic, exc.reason, more,
            )
            more = ""


class KafkaSpanExporter(SpanExporter):
    """An OTel SDK ``SpanExporter`` producing OTLP records to Kafka, keyed by trace id.

    ``encoding`` is the record format, as the Collector's kafkaexporter names it: ``otlp_proto``
    (default) or ``otlp_json``; it must be the service's ``kafka.encoding``.

    The idempotent producer (``enable_idempotence=True``, ``acks="all"``) lives on a private
    asyncio loop in a daemon thread; ``export()`` (called from SDK threads) submits to it and
    waits at most ``timeout_s``. Errors never escape: they are reported as ``FAILURE``.

    Each trace's record is sent on its own: one Kafka refuses (over this exporter's
    ``max_request_size`` or the topic's ``max.message.bytes``, which is read when the producer
    starts) is lost alone, logged at WARNING with its trace id and the reason (at most one line
    per 10 s), and the call returns ``FAILURE`` (the OTel exporter result has no partial
    success); the other traces of the call are written. A producer the broker's refusal left
    out of sequence is replaced. Outages (no broker, timeouts) are logged once until recovered.

    ``tenant`` is stamped on every record as the Kafka header ``tenant_header``: the service's
    ``tenant.header`` (default ``toolwitness-tenant``; a deployment that renamed it passes the
    same name here).
    """

    def __init__(
        self,
        *,
        bootstrap_servers: str,
        topic: str = "otlp_spans",
        tenant: str | None = None,
        tenant_header: str = TENANT_HEADER,
        timeout_s: float = 10.0,
        security: KafkaSecurityConfig | None = None,
        client_id: str = "toolwitness-otel-exporter",
        max_request_size: int = 1024 * 1024,
        encoding: Literal["otlp_proto", "otlp_json"] = "otlp_proto",
    ) -> None:
        if encoding not in ("otlp_proto", "otlp_json"):
            raise ValueError(
                f"encoding must be 'otlp_proto' or 'otlp_json' (the service's kafka.encoding), got {encoding!r}"
            )
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if tenant is not None and not TENANT.fullmatch(tenant):  # the service would dead-letter every record
            raise ValueError(f"tenant {tenant!r} is not {TENANT.pattern}")
        if not tenant_header:
            raise ValueError("tenant_header must not be empty")
        self._bootstrap = bootstrap_servers
        self._topic = topic
        self._serialize: Callable[[ExportTraceServiceRequest], bytes] = (
            otlp_json_bytes if encoding == "otlp_json" else ExportTraceServiceRequest.SerializeToString
        )
        self._headers: list[tuple[str, bytes]] = [(tenant_header, tenant.encode("utf-8"))] if tenant else []
        self._timeout_s = timeout_s
        self._client_id = client_id
        self._max_request_size = max_request_size
        self._kafka_kwargs = kafka_security_kwargs(security)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._producers = RenewingProducer(self._new_producer, component=COMPONENT, timeout_s=timeout_s, logger=log)
        self._refusals = _RefusalLog()
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

    async def _new_producer(self) -> Any:
        # Limited to the topic's own record limit when lower: a record over it is refused here,
        # not by the broker (which would leave the producer out of sequence, to be replaced).
        topic_limit = await topic_record_limit(
            self._bootstrap, self._topic, kafka_kwargs=self._kafka_kwargs, timeout_s=self._timeout_s
        )
        return await start_idempotent(
            self._timeout_s,
            bootstrap_servers=self._bootstrap,
            client_id=self._client_id,
            max_request_size=min(self._max_request_size, topic_limit or self._max_request_size),
            request_timeout_ms=max(1000, int(self._timeout_s * 1000)),
            **self._kafka_kwargs,
        )

    async def _send(self, records: list[tuple[bytes | None, bytes]]) -> list[BaseException | None]:
        return await self._producers.send_each(self._topic, records, self._headers or None)

    async def _stop_producer(self) -> None:
        await self._producers.stop()

    async def _flush(self) -> None:
        await self._producers.flush()

    def _run(self, coro_factory: Callable[[], Coroutine[Any, Any, _T]], timeout_s: float) -> _T:
        """Run a coroutine on the private loop and wait for it (cancelled on timeout)."""
        loop = self._ensure_loop()
        fut = asyncio.run_coroutine_threadsafe(coro_factory(), loop)
        try:
            return fut.result(timeout=timeout_s)
        except TimeoutError:
            fut.cancel()
            raise TimeoutError(f"not acknowledged by Kafka within {timeout_s}s") from None

    # -- SpanExporter ----------------------------------------------------------------------------

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Write one record per trace; ``FAILURE`` if any trace of the batch was not written."""
        if self._closed:
            return SpanExportResult.FAILURE
        try:
            request = encode_spans(spans)
            _flag_length_limited(request, spans)
            parts = split_by_trace(request)
            if not parts:
                return SpanExportResult.SUCCESS
            records: list[tuple[bytes | None, bytes]] = [
                (tid.encode("ascii"), self._serialize(req)) for tid, req in parts.items()
            ]
            results = self._run(lambda: self._send(records), self._timeout_s)
            refused = [(tid, r) for tid, r in zip(parts, results, strict=True) if isinstance(r, RecordRefusedError)]
            if refused:  # these records alone: Kafka refuses them, sending them again would not help
                EXPORT_FAILURES.labels(component=COMPONENT).inc()
                DROPPED.labels(component=COMPONENT, reason="record_refused").inc(len(refused))
                self._refusals.refused(self._topic, refused)
            failed = next((r for r in results if r is not None and not isinstance(r, RecordRefusedError)), None)
            if failed is not None:
                raise failed
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
        return SpanExportResult.FAILURE if refused else SpanExportResult.SUCCESS

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
