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
import os
import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

import grpc  # type: ignore[import-untyped]
from aiokafka import AIOKafkaProducer
from aiokafka.errors import MessageSizeTooLargeError
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from collector.client import kafka_security_kwargs
from collector.config import KafkaConfig
from collector.grpc_auth import abort, require_bearer
from collector.otel import split_by_trace_with_rejects
from collector.telemetry.metrics import DROPPED, EXPORT_FAILURES, SPANS_IN

__all__ = ["COMPONENT", "OtlpGrpcReceiver", "SidecarConfig", "create_sidecar", "run_sidecar"]

COMPONENT = "otlp_grpc"
log = logging.getLogger(__name__)
_EXTRA = {"component": COMPONENT}
_LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "::1")


class SidecarConfig(BaseModel):
    """The OTLP/gRPC sidecar: where to listen, where to forward, how to authenticate."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: host:port to listen on (port 0 = an ephemeral port, see ``OtlpGrpcReceiver.port``).
    listen: str = "127.0.0.1:4317"
    kafka: KafkaConfig = KafkaConfig()
    #: environment variable holding the bearer token; unset/empty variable = no token check.
    bearer_token_env: str = "TOOLWITNESS_SIDECAR_TOKEN"
    tls_certfile: str = ""
    tls_keyfile: str = ""

    @field_validator("listen")
    @classmethod
    def _host_port(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"listen must be host:port, got {v!r}")
        return v

    @model_validator(mode="after")
    def _tls_pair(self) -> SidecarConfig:
        if bool(self.tls_certfile) != bool(self.tls_keyfile):
            raise ValueError("tls_certfile and tls_keyfile must be given together")
        return self


def _span_count(request: ExportTraceServiceRequest) -> int:
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpGrpcReceiver) -> None:
        self._receiver = receiver

    async def Export(
        self, request: ExportTraceServiceRequest, context: Any
    ) -> ExportTraceServiceResponse:
        return await self._receiver.handle_export(request, context)


class OtlpGrpcReceiver:
    """grpc.aio server + idempotent Kafka producer. ``start()`` / ``shutdown()``."""

    def __init__(self, config: SidecarConfig, *, bearer_token: str | None = None) -> None:
        self.config = config
        self._token = bearer_token.encode("utf-8") if bearer_token else None
        self._kafka_kwargs = kafka_security_kwargs(config.kafka.security)
        self._server: Any = None
        self._producer: Any = None
        self._port: int | None = None
        self._started = False
        self._lock = asyncio.Lock()
        self.forwarded_records = 0
        self.rejected_spans = 0

    @property
    def port(self) -> int:
        """The bound port (the ephemeral one when ``listen`` ends in ``:0``)."""
        if self._port is None:
            raise RuntimeError("the receiver is not started")
        return self._port

    @property
    def endpoint(self) -> str:
        """host:port clients connect to."""
        host = self.config.listen.rpartition(":")[0]
        return f"{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._started

    @property
    def auth_required(self) -> bool:
        return self._token is not None

    @property
    def _timeout_s(self) -> float:
        return self.config.kafka.request_timeout_ms / 1000

    async def start(self) -> None:
        """Start the Kafka producer, then bind and start the gRPC server. Idempotent."""
        async with self._lock:
            if self._started:
                return
            kafka = self.config.kafka
            try:
                self._producer = AIOKafkaProducer(
                    bootstrap_servers=kafka.bootstrap_servers,
                    client_id=f"{kafka.client_id}-{COMPONENT}",
                    enable_idempotence=True,
                    acks="all",
                    max_request_size=kafka.max_record_bytes,
                    request_timeout_ms=kafka.request_timeout_ms,
                    **self._kafka_kwargs,
                )
                async with asyncio.timeout(self._timeout_s):
                    await self._producer.start()
                self._server = grpc.aio.server(
                    options=[
                        ("grpc.max_receive_message_length", kafka.max_record_bytes),
                        ("grpc.so_reuseport", 0),
                    ]
                )
                trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
                    _TraceService(self), self._server
                )
                tls = bool(self.config.tls_certfile)
                if tls:
                    key = await asyncio.to_thread(Path(self.config.tls_keyfile).read_bytes)
                    cert = await asyncio.to_thread(Path(self.config.tls_certfile).read_bytes)
                    creds = grpc.ssl_server_credentials([(key, cert)])
                    port = self._server.add_secure_port(self.config.listen, creds)
                else:
                    port = self._server.add_insecure_port(self.config.listen)
                if not port:
                    raise OSError(f"{COMPONENT}: cannot listen on {self.config.listen}")
                self._port = int(port)
                await self._server.start()
            except BaseException:
                await self._teardown(grace=0)
                raise
            self._started = True
            host = self.config.listen.rpartition(":")[0]
            if self._token is not None and not tls and host not in _LOOPBACK:
                log.warning(
                    "%s: bearer token configured without TLS on non-loopback %s: the token crosses the network "
                    "in clear text",
                    COMPONENT, self.config.listen, extra=_EXTRA,
                )
            log.info(
                "%s: listening on %s:%d (tls=%s, auth=%s), forwarding to %s",
                COMPONENT, host, self._port, tls, self._token is not None, kafka.topics.spans, extra=_EXTRA,
            )

    async def shutdown(self, grace: float = 5.0) -> None:
        """Stop accepting calls, let in-flight ones finish (``grace`` s), stop the producer."""
        async with self._lock:
            if not self._started:
                return
            self._started = False
            await self._teardown(grace)
            log.info("%s: stopped", COMPONENT, extra=_EXTRA)

    async def _teardown(self, grace: float) -> None:
        server, self._server = self._server, None
        producer, self._producer = self._producer, None
        if server is not None:
            try:
                await server.stop(grace)
            except Exception as exc:
                log.warning("%s: stopping the gRPC server failed: %r", COMPONENT, exc, extra=_EXTRA)
        if producer is not None:
            try:
                async with asyncio.timeout(self._timeout_s):
                    await producer.stop()
            except Exception as exc:
                log.warning("%s: stopping the Kafka producer failed: %r", COMPONENT, exc, extra=_EXTRA)

    # -- the call --------------------------------------------------------------------------------

    async def _abort(self, context: Any, code: Any, message: str) -> NoReturn:
        await abort(context, code, message)

    async def _check_auth(self, context: Any) -> None:
        await require_bearer(context, self._token, component=COMPONENT, call="Export")

    async def handle_export(self, request: ExportTraceServiceRequest, context: Any) -> ExportTraceServiceResponse:
        await self._check_auth(context)
        producer = self._producer
        if producer is None:
            await self._abort(context, grpc.StatusCode.UNAVAILABLE, "the receiver is shutting down")
        parts, rejected = split_by_trace_with_rejects(request)
        errors: list[str] = []
        if rejected:
            errors.append(f"{rejected} span(s) with an invalid trace or span id")
        topic = self.config.kafka.topics.spans
        pending: list[Any] = []
        try:
            for trace_id, part in parts.items():
                try:
                    pending.append(
                        await producer.send(topic, value=part.SerializeToString(), key=trace_id.encode("ascii"))
                    )
                except MessageSizeTooLargeError:
                    n = _span_count(part)
                    rejected += n
                    errors.append(f"trace {trace_id}: {n} span(s) exceed the record size limit")
            async with asyncio.timeout(self._timeout_s):
                await asyncio.gather(*pending)
        except Exception as exc:
            for fut in pending:
                fut.cancel()
            EXPORT_FAILURES.labels(component=COMPONENT).inc()
            log.warning("%s: forwarding to Kafka topic %r failed: %r", COMPONENT, topic, exc, extra=_EXTRA)
            await self._abort(context, grpc.StatusCode.UNAVAILABLE, "forwarding to Kafka failed; retry")
        accepted = _span_count(request) - rejected
        SPANS_IN.labels(component=COMPONENT).inc(max(accepted, 0))
        self.forwarded_records += len(pending)
        if rejected:
            self.rejected_spans += rejected
            DROPPED.labels(component=COMPONENT, reason="rejected_span").inc(rejected)
            return ExportTraceServiceResponse(
                partial_success=ExportTracePartialSuccess(rejected_spans=rejected, error_message="; ".join(errors))
            )
        return ExportTraceServiceResponse()


def create_sidecar(config: SidecarConfig | None = None, *, env: Mapping[str, str] | None = None) -> OtlpGrpcReceiver:
    """Factory: a receiver for ``config`` (defaults), the token read from ``config.bearer_token_env``."""
    config = config or SidecarConfig()
    environ = os.environ if env is None else env
    token = environ.get(config.bearer_token_env, "") if config.bearer_token_env else ""
    return OtlpGrpcReceiver(config, bearer_token=token or None)


async def run_sidecar(
    config: SidecarConfig | None = None,
    *,
    env: Mapping[str, str] | None = None,
    on_started: Callable[[OtlpGrpcReceiver], None] | None = None,
) -> None:
    """Run the sidecar until cancelled or SIGTERM/SIGINT, then shut it down gracefully.

    ``on_started`` is called with the started receiver (e.g. to learn an ephemeral port).
    """
    receiver = create_sidecar(config, env=env)
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
        log.info("%s: signal received, shutting down", COMPONENT, extra=_EXTRA)
    finally:
        for sig in installed:
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
        await receiver.shutdown()
