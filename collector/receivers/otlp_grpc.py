"""OTLP/gRPC receiver for the sidecar path: ``TraceService/Export`` in, Kafka ``otlp_spans`` out.

Each Export request is split by trace id and forwarded as one ``ExportTraceServiceRequest``
record per trace, keyed by the 32-hex trace id (what the Collector's kafkaexporter writes
when partitioned by trace), through an idempotent producer. Spans with an invalid trace or
span id are not forwarded; they are reported in ``partial_success.rejected_spans``.
The call returns only once Kafka acknowledged every record (``acks=all``); if Kafka fails,
the call fails with UNAVAILABLE so the OTLP exporter retries (the service deduplicates
spans by span id, so a retry after a partial forward is harmless).

Optional bearer token (``authorization: Bearer <token>``, the token read from the
environment variable the config names) and optional TLS (server cert/key files).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

import grpc  # type: ignore[import-untyped]
from aiokafka.errors import MessageSizeTooLargeError, RecordListTooLargeError
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from pydantic import field_validator

from collector.admin import NOT_READY_AFTER_S, AdminServer
from collector.client import kafka_security_kwargs
from collector.config import KafkaConfig
from collector.grpc_server import GrpcServer, GrpcServerConfig
from collector.otel import split_by_trace_with_rejects
from collector.producer import RecordRefusedError, RenewingProducer, start_idempotent, topic_record_limit
from collector.receivers.lenient import parse_lenient
from collector.telemetry.metrics import DROPPED, EXPORT_FAILURES, SPANS_IN
from collector.wire.convert import TENANT

__all__ = ["COMPONENT", "OtlpGrpcReceiver", "SidecarConfig", "create_sidecar", "run_sidecar"]

COMPONENT = "otlp_grpc"
log = logging.getLogger(__name__)
_EXTRA = {"component": COMPONENT}


class SidecarConfig(GrpcServerConfig):
    """The OTLP/gRPC sidecar: where to listen, where to forward, how to authenticate (TLS fields: see the base)."""

    listen: str = "127.0.0.1:4317"
    kafka: KafkaConfig = KafkaConfig()
    bearer_token_env: str = "TOOLWITNESS_SIDECAR_TOKEN"
    #: the tenant of everything this sidecar forwards, stamped on each record as the Kafka header
    #: ``tenant_header`` (the service's ``tenant.header``), which wins over the resource attribute
    #: the agent writes itself. Empty: no header (the service reads the resource attribute).
    tenant: str = ""
    tenant_header: str = "toolwitness-tenant"
    #: host:port of the sidecar's own admin endpoint (/healthz, /readyz, /metrics); empty: none
    admin_listen: str = ""
    #: on SIGTERM/SIGINT, seconds of drain before the stop: /readyz answers 503 while Export calls
    #: are still accepted and forwarded. Kubernetes removes a terminating pod from the Service's
    #: endpoints while it sends SIGTERM, so agents keep sending here for a few seconds. 0: stop at once.
    shutdown_delay_seconds: float = 5.0

    @field_validator("admin_listen")
    @classmethod
    def _admin_host_port(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if v and (not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535):
            raise ValueError(f"admin_listen must be host:port (or empty: no admin endpoint), got {v!r}")
        return v

    @field_validator("shutdown_delay_seconds")
    @classmethod
    def _delay(cls, v: float) -> float:
        if not 0 <= v < math.inf:  # NaN fails too
            raise ValueError(f"shutdown_delay_seconds must be a number of seconds >= 0 (0: stop at once), got {v}")
        return v

    @field_validator("tenant")
    @classmethod
    def _tenant_name(cls, v: str) -> str:
        if v and not TENANT.fullmatch(v):  # the service's own rule: it would dead-letter every record
            raise ValueError(f"tenant {v[:80]!r} is not {TENANT.pattern}")
        return v


def _read_request(value: bytes) -> ExportTraceServiceRequest:
    try:
        return ExportTraceServiceRequest.FromString(value)
    except DecodeError:
        return parse_lenient(value)  # a DecodeError again: not OTLP at all


def _span_count(request: ExportTraceServiceRequest) -> int:
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpGrpcReceiver) -> None:
        self._receiver = receiver

    async def Export(
        self, request: ExportTraceServiceRequest, context: Any
    ) -> ExportTraceServiceResponse:
        return await self._receiver.handle_export(request, context)


class OtlpGrpcReceiver(GrpcServer[SidecarConfig]):
    """grpc.aio server + idempotent Kafka producer. ``start()`` / ``shutdown()``."""

    COMPONENT = COMPONENT
    CALL = "Export"
    NOT_STARTED = "the receiver is not started"
    _log = log

    def __init__(self, config: SidecarConfig, *, bearer_token: str | None = None) -> None:
        super().__init__(config, bearer_token)
        self._kafka_kwargs = kafka_security_kwargs(config.kafka.security)
        self._record_limit = config.kafka.max_record_bytes
        # the factory is looked up on each call (a test replaces ``_new_producer``)
        self._producers = RenewingProducer(
            lambda: self._new_producer(), component=COMPONENT, timeout_s=self._timeout_s, logger=log, extra=_EXTRA
        )
        self.forwarded_records = 0
        self.rejected_spans = 0
        #: since when every forwarding to Kafka has failed (None: the last one went through)
        self.failing_since: float | None = None
        #: set by ``drain()``: not ready, still serving (``run_sidecar`` stops it after the delay)
        self.draining = False

    @property
    def _timeout_s(self) -> float:
        return self.config.kafka.request_timeout_ms / 1000

    def _grpc_options(self) -> list[tuple[str, int]]:
        return [("grpc.max_receive_message_length", self.config.kafka.max_record_bytes)]

    def _add_servicer(self, server: Any) -> None:
        # The generated registration, with one change: a request with strings that are not UTF-8
        # (the Collector and Go SDKs pass them through) is read with U+FFFD, not refused whole
        # (UNKNOWN, which OTLP exporters do not retry: every trace of the batch would be lost).
        service = _TraceService(self)
        handler = grpc.method_handlers_generic_handler(
            "opentelemetry.proto.collector.trace.v1.TraceService",
            {
                "Export": grpc.unary_unary_rpc_method_handler(
                    service.Export,
                    request_deserializer=_read_request,
                    response_serializer=ExportTraceServiceResponse.SerializeToString,
                )
            },
        )
        server.add_generic_rpc_handlers((handler,))

    def _listening_detail(self) -> str:
        return f", forwarding to {self.config.kafka.topics.spans}"

    async def _before_start(self) -> None:
        # The topic's own record limit, when lower than ours: a record the broker refuses leaves
        # the idempotent producer with a gap in its sequence numbers, so it must be renewed
        # (``RenewingProducer``); a record over the limit had better never leave here.
        kafka = self.config.kafka
        topic_limit = await topic_record_limit(
            kafka.bootstrap_servers, kafka.topics.spans, kafka_kwargs=self._kafka_kwargs, timeout_s=self._timeout_s
        )
        if topic_limit is not None and topic_limit < kafka.max_record_bytes:
            log.info(
                "%s: topic %s takes records up to %d bytes (max.message.bytes): larger traces are rejected here",
                COMPONENT, kafka.topics.spans, topic_limit, extra=_EXTRA,
            )
        self._record_limit = min(kafka.max_record_bytes, topic_limit or kafka.max_record_bytes)
        await self._producers.start()

    async def _new_producer(self) -> Any:
        kafka = self.config.kafka
        return await start_idempotent(
            self._timeout_s,
            bootstrap_servers=kafka.bootstrap_servers,
            client_id=f"{kafka.client_id}-{COMPONENT}",
            max_request_size=self._record_limit,
            request_timeout_ms=kafka.request_timeout_ms,
            **self._kafka_kwargs,
        )

    async def _after_stop(self) -> None:
        if self._producers.started:
            try:
                async with asyncio.timeout(self._timeout_s):
                    await self._producers.stop()
            except Exception as exc:
                log.warning("%s: stopping the Kafka producer failed: %r", COMPONENT, exc, extra=_EXTRA)

    async def shutdown(self, grace: float = 5.0) -> None:
        """Stop accepting calls, let in-flight ones finish (``grace`` s), stop the producer."""
        await super().shutdown(grace)

    # -- the call --------------------------------------------------------------------------------

    async def handle_export(self, request: ExportTraceServiceRequest, context: Any) -> ExportTraceServiceResponse:
        await self._check_auth(context)
        if not self._producers.started:
            await self._abort(context, grpc.StatusCode.UNAVAILABLE, "the receiver is shutting down")
        parts, rejected = split_by_trace_with_rejects(request)
        errors: list[str] = []
        if rejected:
            errors.append(f"{rejected} span(s) with an invalid trace or span id")
        topic = self.config.kafka.topics.spans
        tenant = self.config.tenant
        headers = [(self.config.tenant_header, tenant.encode())] if tenant else None
        traces = [(trace_id, _span_count(part)) for trace_id, part in parts.items()]
        records = [(trace_id.encode("ascii"), part.SerializeToString()) for trace_id, part in parts.items()]
        try:
            # each trace on its own: one the broker (or our limit) refuses costs only itself, and
            # a producer it left out of sequence is renewed (``RenewingProducer``)
            async with asyncio.timeout(self._timeout_s):
                results = await self._producers.send_each(topic, records, headers)
            for (trace_id, n), result in zip(traces, results, strict=True):
                if isinstance(result, RecordRefusedError):
                    rejected += n
                    if isinstance(result.__cause__, MessageSizeTooLargeError | RecordListTooLargeError):
                        errors.append(f"trace {trace_id}: {n} span(s) exceed the record size limit")
                    else:  # sending it again would be refused again
                        errors.append(f"trace {trace_id}: {n} span(s) refused by Kafka: {result.reason}")
            for result in results:
                if result is not None and not isinstance(result, RecordRefusedError):
                    raise result  # anything else: the exporter retries the whole call
        except Exception as exc:
            if self.failing_since is None:
                self.failing_since = time.monotonic()
            EXPORT_FAILURES.labels(component=COMPONENT).inc()
            log.warning("%s: forwarding to Kafka topic %r failed: %r", COMPONENT, topic, exc, extra=_EXTRA)
            await self._abort(context, grpc.StatusCode.UNAVAILABLE, "forwarding to Kafka failed; retry")
        self.failing_since = None
        accepted = _span_count(request) - rejected
        SPANS_IN.labels(component=COMPONENT).inc(max(accepted, 0))
        self.forwarded_records += sum(r is None for r in results)
        if rejected:
            self.rejected_spans += rejected
            DROPPED.labels(component=COMPONENT, reason="rejected_span").inc(rejected)
            return ExportTraceServiceResponse(
                partial_success=ExportTracePartialSuccess(rejected_spans=rejected, error_message="; ".join(errors))
            )
        return ExportTraceServiceResponse()


    def drain(self) -> None:
        """Report not ready from now on (the Service stops routing exports here), still serving."""
        self.draining = True

    def ready(self) -> bool:
        """Listening, not draining, and forwarding to Kafka has not failed for ``NOT_READY_AFTER_S``
        in a row (as the scorer's /readyz): a Service then sends the agents' exports to another sidecar."""
        return (
            not self.draining
            and self._producers.started
            and self._server is not None
            and (self.failing_since is None or time.monotonic() - self.failing_since < NOT_READY_AFTER_S)
        )


def create_sidecar(config: SidecarConfig | None = None, *, env: Mapping[str, str] | None = None) -> OtlpGrpcReceiver:
    """Factory: a receiver for ``config`` (defaults), the token read from ``config.bearer_token_env``."""
    config = config or SidecarConfig()
    return OtlpGrpcReceiver(config, bearer_token=config.read_bearer_token(env))


async def run_sidecar(
    config: SidecarConfig | None = None,
    *,
    env: Mapping[str, str] | None = None,
    on_started: Callable[[OtlpGrpcReceiver], None] | None = None,
) -> None:
    """Run the sidecar until cancelled or SIGTERM/SIGINT, then shut it down gracefully: after a
    signal it drains for ``shutdown_delay_seconds`` (not ready, still forwarding; a second signal
    ends the drain), then stops.

    ``on_started`` is called with the started receiver (e.g. to learn an ephemeral port).
    """
    receiver = create_sidecar(config, env=env)
    admin: AdminServer | None = None
    if receiver.config.admin_listen:
        host, _, port = receiver.config.admin_listen.rpartition(":")
        # Up before the receiver, which waits for Kafka: alive while starting, ready once listening.
        admin = AdminServer(host, int(port), ready=receiver.ready, alive=lambda: True)
        await admin.start()
        log.info("%s: admin endpoint on %s:%d (/healthz, /readyz, /metrics)", COMPONENT, host, admin.bound_port,
                 extra=_EXTRA)
    try:
        await _serve(receiver, on_started)
    finally:
        if admin is not None:
            await admin.shutdown()


async def _serve(receiver: OtlpGrpcReceiver, on_started: Callable[[OtlpGrpcReceiver], None] | None) -> None:
    await receiver.start()
    if on_started is not None:
        try:
            on_started(receiver)
        except BaseException:
            await receiver.shutdown()
            raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # not the main thread / not supported: cancellation still stops us
    try:
        await stop.wait()
        delay = receiver.config.shutdown_delay_seconds
        if delay > 0:
            # Kubernetes takes the pod out of the Service's endpoints only as it sends SIGTERM, and
            # agents keep sending here until that reaches them: keep serving, but report not ready.
            stop.clear()
            receiver.drain()
            log.info("%s: signal received, draining for %g s (not ready, still forwarding exports) before "
                     "shutting down; a second signal stops at once", COMPONENT, delay, extra=_EXTRA)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            log.info("%s: %s, shutting down", COMPONENT, "second signal received" if stop.is_set() else "drained",
                     extra=_EXTRA)
        else:
            log.info("%s: signal received, shutting down", COMPONENT, extra=_EXTRA)
    finally:
        for sig in installed:
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
        await receiver.shutdown()
