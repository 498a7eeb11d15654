"""The admin HTTP endpoint: /healthz (liveness), /readyz (readiness), /metrics (Prometheus)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from collector.telemetry.metrics import REGISTRY

log = logging.getLogger("toolwitness.admin")

#: a dependency failing this long makes a process not ready (/readyz 503): the scorer's Redis or
#: Kafka, the sidecar's forwarding to Kafka
NOT_READY_AFTER_S = 10.0
#: the whole request head (request line and headers) must arrive within this many seconds, ...
REQUEST_TIMEOUT_S = 5.0
#: ... in at most this many header lines: a client trickling headers must not hold a connection
#: (a file descriptor of the service's, which Kafka and Redis need too) for ever
MAX_HEADER_LINES = 100


class AdminServer:
    name = "admin"

    def __init__(self, host: str, port: int, ready: Callable[[], bool], alive: Callable[[], bool]) -> None:
        self.host = host
        self.port = port
        self._ready = ready
        self._alive = alive
        self._server: asyncio.Server | None = None

    @property
    def bound_port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._handle, self.host, self.port)

    async def shutdown(self) -> None:
        s, self._server = self._server, None
        if s is not None:
            s.close()
            await s.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                line = await reader.readline()
                for _ in range(MAX_HEADER_LINES):
                    if await reader.readline() in (b"\r\n", b"\n", b""):
                        break
                else:
                    return
            parts = line.decode("latin-1").split()
            path = parts[1] if len(parts) > 1 else "/"
            if path == "/healthz":
                ok = self._alive()
                status, body, ctype = (200 if ok else 503), (b"ok\n" if ok else b"unhealthy\n"), "text/plain"
            elif path == "/readyz":
                ok = self._ready()
                status, body, ctype = (200 if ok else 503), (b"ready\n" if ok else b"not ready\n"), "text/plain"
            elif path == "/metrics":
                status, body, ctype = 200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST
            else:
                status, body, ctype = 404, b"not found\n", "text/plain"
            reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode()
                + body
            )
            async with asyncio.timeout(REQUEST_TIMEOUT_S):  # a client that does not read either
                await writer.drain()
        except (TimeoutError, ConnectionError, ValueError):  # ValueError: a line over the reader's limit
            pass
        finally:
            writer.close()
