"""Bearer-token checks shared by the gRPC endpoints (OTLP sidecar, InterceptTool).

Tokens are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any, NoReturn

import grpc  # type: ignore[import-untyped]

from collector.telemetry.metrics import DROPPED

log = logging.getLogger("toolwitness.grpc_auth")


async def abort(context: Any, code: Any, message: str) -> NoReturn:
    """End the call with a status (``context.abort`` always raises)."""
    await context.abort(code, message)
    raise AssertionError("context.abort returned")  # pragma: no cover - abort always raises


def presented_token(context: Any) -> bytes:
    """The bearer token of the call's ``authorization`` metadata, or b"" if none."""
    for key, value in context.invocation_metadata() or ():
        if key.lower() == "authorization":
            raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
            scheme, _, token = raw.partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else b""
    return b""


async def require_bearer(context: Any, expected: bytes | None, *, component: str, call: str) -> None:
    """Refuse the call (UNAUTHENTICATED) unless it carries ``expected``; no-op when no token is set."""
    if expected is None:
        return
    presented = presented_token(context)
    if not presented or not hmac.compare_digest(presented, expected):
        DROPPED.labels(component=component, reason="unauthenticated").inc()
        log.warning(
            "%s: refused a %s call without a valid bearer token", component, call, extra={"component": component}
        )
        await abort(context, grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")
