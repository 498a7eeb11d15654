"""A real HTTP server on 127.0.0.1 for attack tests: one async handler per request.

A deliberately small HTTP/1.1 server (asyncio streams, ``Connection: close``): enough for
``HTTPTarget`` to talk to a local agent over a real socket, with the agent's own code as
the handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Self

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalRequest:
    method: str
    path: str
    headers: dict[str, str]  # lowercased names
    body: bytes


Handler = Callable[[LocalRequest], Awaitable[tuple[int, str]]]


class LocalHttpAgent:
    """``async with LocalHttpAgent(handler) as agent:`` → listening on ``agent.port``."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.requests = 0

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        await self._server.wait_closed()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            lines = head.split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers: dict[str, str] = {}
            for line in lines[1:]:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            self.requests += 1
            try:
                status, text = await self._handler(LocalRequest(method, path, headers, body))
            except Exception as exc:
                log.exception("local agent handler failed")
                status, text = 500, f"{type(exc).__name__}: {exc}"
            payload = text.encode("utf-8")
            writer.write(
                f"HTTP/1.1 {status} OK\r\nContent-Type: text/plain; charset=utf-8\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode("latin-1") + payload
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
