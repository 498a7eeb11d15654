"""What the gRPC endpoints (OTLP sidecar, InterceptTool) share: listen/TLS/token config and the server life cycle.

A subclass of ``GrpcServer`` names itself (``COMPONENT``, ``CALL``, its logger), adds its
servicer and its message-size options, and may do extra work around the gRPC server
(``_before_start`` / ``_after_stop``, e.g. the sidecar's Kafka producer).
"""

from __future__ import annotations

import asyncio
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Generic, NoReturn, Self, TypeVar

import grpc  # type: ignore[import-untyped]
from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from collector.grpc_auth import abort, require_bearer

__all__ = ["GrpcServer", "GrpcServerConfig", "ListenError"]

_LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "::1")


class ListenError(OSError):
    """The server could not bind its ``listen`` address."""


class GrpcServerConfig(BaseModel):
    """host:port to listen on, the bearer token's environment variable, optional TLS cert/key files."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: host:port to listen on (port 0 = an ephemeral port, see ``GrpcServer.port``).
    listen: str
    #: environment variable holding the bearer token; unset/empty variable = no token check.
    bearer_token_env: str
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
    def _tls_pair(self) -> Self:
        if bool(self.tls_certfile) != bool(self.tls_keyfile):
            raise ValueError("tls_certfile and tls_keyfile must be given together")
        return self

    def read_bearer_token(self, env: Mapping[str, str] | None = None) -> str | None:
        """The token in ``bearer_token_env`` (of ``env``, default ``os.environ``); None if unset or empty."""
        environ = os.environ if env is None else env
        return (environ.get(self.bearer_token_env, "") if self.bearer_token_env else "") or None


C = TypeVar("C", bound=GrpcServerConfig)


class GrpcServer(ABC, Generic[C]):
    """A grpc.aio server with optional TLS and bearer token. ``start()`` / ``shutdown()``, both idempotent."""

    #: component name in logs and metrics.
    COMPONENT: ClassVar[str]
    #: the RPC's name in the log line of a refused call.
    CALL: ClassVar[str]
    #: what ``port`` raises before ``start()``.
    NOT_STARTED: ClassVar[str]
    #: the subclass module's logger, so its records keep their logger name.
    _log: ClassVar[logging.Logger]

    def __init__(self, config: C, bearer_token: str | None) -> None:
        """``bearer_token`` None: the token in ``config.bearer_token_env`` (the documented
        default, so a server built directly is not left open when the variable is set); ""
        explicitly: no token."""
        self.config = config
        if bearer_token is None:
            bearer_token = config.read_bearer_token()
        self._token = bearer_token.encode("utf-8") if bearer_token else None
        self._server: Any = None
        self._port: int | None = None
        self._started = False
        self._lock = asyncio.Lock()

    # -- what a subclass provides ----------------------------------------------------------------

    def _grpc_options(self) -> list[tuple[str, int]]:
        """grpc.aio server options (message sizes); ``grpc.so_reuseport`` is always turned off."""
        return []

    @abstractmethod
    def _add_servicer(self, server: Any) -> None:
        """Register the servicer on ``server``."""

    async def _before_start(self) -> None:
        """Runs before the gRPC server is created; ``_after_stop`` undoes it (also when start fails)."""

    async def _after_stop(self) -> None:
        """Runs after the gRPC server stopped (or failed to start)."""

    def _listening_detail(self) -> str:
        """Appended to the "listening on" log line."""
        return ""

    # -- the life cycle --------------------------------------------------------------------------

    @property
    def _extra(self) -> dict[str, str]:
        return {"component": self.COMPONENT}

    @property
    def port(self) -> int:
        """The bound port (the ephemeral one when ``listen`` ends in ``:0``)."""
        if self._port is None:
            raise RuntimeError(self.NOT_STARTED)
        return self._port

    @property
    def endpoint(self) -> str:
        """host:port clients connect to."""
        return f"{self.config.listen.rpartition(':')[0]}:{self.port}"

    @property
    def running(self) -> bool:
        return self._started

    @property
    def auth_required(self) -> bool:
        return self._token is not None

    async def start(self) -> None:
        """Do ``_before_start``, then bind and start the gRPC server. Idempotent."""
        async with self._lock:
            if self._started:
                return
            listen = self.config.listen
            tls = bool(self.config.tls_certfile)
            try:
                await self._before_start()
                self._server = grpc.aio.server(options=[*self._grpc_options(), ("grpc.so_reuseport", 0)])
                self._add_servicer(self._server)
                credentials = None
                if tls:
                    key = await asyncio.to_thread(Path(self.config.tls_keyfile).read_bytes)
                    cert = await asyncio.to_thread(Path(self.config.tls_certfile).read_bytes)
                    credentials = grpc.ssl_server_credentials([(key, cert)])
                try:
                    port = (
                        self._server.add_secure_port(listen, credentials)
                        if credentials is not None
                        else self._server.add_insecure_port(listen)
                    )
                except RuntimeError:  # grpc's "Failed to bind to address ..." (its log line says why)
                    port = 0
                if not port:
                    raise ListenError(
                        f"{self.COMPONENT}: cannot listen on {listen}: the address is in use, "
                        "not one of this host's, or not permitted"
                    )
                self._port = int(port)
                await self._server.start()
            except BaseException:
                await self._teardown(grace=0)
                raise
            self._started = True
            host = listen.rpartition(":")[0]
            if self._token is not None and not tls and host not in _LOOPBACK:
                self._log.warning(
                    "%s: bearer token configured without TLS on non-loopback %s: the token crosses the network "
                    "in clear text", self.COMPONENT, listen, extra=self._extra,
                )
            if self._token is None and host not in _LOOPBACK:
                self._log.warning(
                    "%s: no bearer token (%s is unset or empty) on non-loopback %s: whoever can reach it may "
                    "call %s", self.COMPONENT, self.config.bearer_token_env or "no variable", listen, self.CALL,
                    extra=self._extra,
                )
            self._log.info(
                "%s: listening on %s:%d (tls=%s, auth=%s)%s", self.COMPONENT, host, self._port, tls,
                self._token is not None, self._listening_detail(), extra=self._extra,
            )

    async def shutdown(self, grace: float = 2.0) -> None:
        """Stop accepting calls, let in-flight ones finish (``grace`` s), then ``_after_stop``. Idempotent."""
        async with self._lock:
            if not self._started:
                return
            self._started = False
            await self._teardown(grace)
            self._log.info("%s: stopped", self.COMPONENT, extra=self._extra)

    async def _teardown(self, grace: float) -> None:
        server, self._server = self._server, None
        if server is not None:
            try:
                await server.stop(grace)
            except Exception as exc:
                self._log.warning("%s: stopping the gRPC server failed: %r", self.COMPONENT, exc, extra=self._extra)
        await self._after_stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # -- per call --------------------------------------------------------------------------------

    async def _abort(self, context: Any, code: Any, message: str) -> NoReturn:
        await abort(context, code, message)

    async def _check_auth(self, context: Any) -> None:
        await require_bearer(context, self._token, component=self.COMPONENT, call=self.CALL)
