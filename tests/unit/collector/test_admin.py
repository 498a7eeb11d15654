"""The admin endpoint answers probes and scrapes, and no client holds a connection open: a request
head trickled in line by line, or a line longer than the reader takes, ends the connection."""

from __future__ import annotations

import asyncio
import time

import pytest

from collector import admin
from collector.admin import AdminServer


async def _server() -> AdminServer:
    server = AdminServer("127.0.0.1", 0, ready=lambda: True, alive=lambda: True)
    await server.start()
    return server


async def test_probes_are_answered() -> None:
    server = await _server()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_port)
        writer.write(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=5)
        assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b"ready\n")
        writer.close()
    finally:
        await server.shutdown()


async def test_a_request_head_trickled_in_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admin, "REQUEST_TIMEOUT_S", 0.5, raising=False)
    server = await _server()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_port)
        writer.write(b"GET /healthz HTTP/1.1\r\n")
        started = time.monotonic()
        # one header line every 0.1 s: each arrives well within any per-line timeout
        closed = False
        while not closed and time.monotonic() - started < 8:
            try:
                writer.write(b"X-Slow: 1\r\n")
                await writer.drain()
            except ConnectionError:
                break
            await asyncio.sleep(0.1)
            try:
                data = await asyncio.wait_for(reader.read(1), timeout=0.01)
            except TimeoutError:
                continue
            assert data == b"", "a head not finished was answered"
            closed = True
        assert time.monotonic() - started < 3, "the server kept the connection of a client trickling headers"
        writer.close()
    finally:
        await server.shutdown()


async def test_a_line_over_the_limit_ends_the_connection() -> None:
    server = await _server()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_port)
        writer.write(b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), timeout=5) == b""
        writer.close()
    finally:
        await server.shutdown()
