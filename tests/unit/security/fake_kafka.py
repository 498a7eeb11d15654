"""A fake Kafka broker that speaks just enough of the protocol to take a client through SASL:
ApiVersions, SaslHandshake (PLAIN and SCRAM enabled), then SaslAuthenticate, which it records
and refuses. No real broker here has a SASL listener; this one lets a test drive the client's
credential exchange (and check what gets logged on the way) without one."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator

from aiokafka.protocol.admin import ApiVersionResponse_v0, SaslAuthenticateResponse_v0, SaslHandShakeResponse_v1

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
SASL_AUTHENTICATION_FAILED = 58


class FakeSaslBroker:
    def __init__(self) -> None:
        self.auth_payloads: list[bytes] = []
        self.requests: list[tuple[int, int]] = []  # (api key, version)
        self._server: asyncio.Server | None = None

    @property
    def bootstrap(self) -> str:
        assert self._server is not None
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                frame = await reader.readexactly(size)
                api_key, version, correlation = struct.unpack(">hhi", frame[:8])
                self.requests.append((api_key, version))
                if api_key == API_VERSIONS:
                    body = ApiVersionResponse_v0(0, [(API_VERSIONS, 0, 0), (SASL_HANDSHAKE, 0, 1),
                                                     (SASL_AUTHENTICATE, 0, 0), (3, 0, 1)]).encode()
                elif api_key == SASL_HANDSHAKE:
                    body = SaslHandShakeResponse_v1(0, ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]).encode()
                elif api_key == SASL_AUTHENTICATE:
                    client_id_len = struct.unpack(">h", frame[8:10])[0]
                    rest = frame[10 + max(client_id_len, 0):]
                    n = struct.unpack(">i", rest[:4])[0]
                    self.auth_payloads.append(rest[4:4 + n])
                    body = SaslAuthenticateResponse_v0(SASL_AUTHENTICATION_FAILED, "refused by the test broker",
                                                       b"").encode()
                else:
                    break
                response = struct.pack(">i", correlation) + body
                writer.write(struct.pack(">i", len(response)) + response)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[FakeSaslBroker]:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        try:
            yield self
        finally:
            self._server.close()
            await self._server.wait_closed()
