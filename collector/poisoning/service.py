"""The poisoning service: ``toolwitness.v1.ToolBoundary/InterceptTool`` over gRPC.

    registry = CampaignRegistry([Campaign(campaign_id="c1", payload_template="… {canary} …",
                                          sessions=frozenset({"session-1"}), target_tools=frozenset({"url_fetch"}))])
    server = PoisoningServer(registry, PoisoningConfig(listen="127.0.0.1:0"))
    await server.start()          # server.endpoint → "127.0.0.1:<port>"
    ...
    await server.shutdown()

For a session that is not enrolled in a campaign (or a tool the campaign does not target)
the response carries the request's ``result_json`` byte for byte, without parsing it.
Otherwise the campaign's payload, with a fresh canary, is spliced into the result (see
``collector.poisoning.splice``); every delivery is kept in the registry's delivery log and,
when a tracer is given, recorded as a ``toolwitness.poisoning.delivery`` span (a new trace
linked to the caller's ``execute_tool`` span, so the agent's own trace and its span count
are untouched). A payload ready only when less than ``DEADLINE_MARGIN_S`` of the caller's gRPC
deadline is left is not delivered: the caller gives up at its deadline and uses its real
result, so the result passes through (reason ``caller_deadline``), nothing is logged as
delivered and the session's cap is not used up. Likewise a result the payload would make
larger than ``max_message_bytes`` (gRPC could not send it) passes through (``result_too_large``).

Optional bearer token (``authorization: Bearer <token>``, read from the environment
variable the config names, ``TOOLWITNESS_POISONING_TOKEN`` by default, unless
``bearer_token=`` is given; compared in constant time, never logged) and optional TLS.
Logs carry the component name ``poisoning``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
from collections.abc import Mapping
from typing import Any

import grpc  # type: ignore[import-untyped]
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, Tracer
from pydantic import Field, JsonValue

from collector.boundary.wire import InterceptToolRequest, InterceptToolResponse, boundary_grpc
from collector.grpc_server import GrpcServer, GrpcServerConfig
from collector.poisoning.campaigns import (
    NOT_ENROLLED,
    TOOL_NOT_TARGETED,
    CampaignRegistry,
    Delivery,
    Disposition,
)

__all__ = [
    "CALLER_DEADLINE",
    "COMPONENT",
    "DELIVERY_SESSION",
    "DELIVERY_SPAN",
    "RESULT_TOO_LARGE",
    "PoisoningConfig",
    "PoisoningServer",
    "create_poisoning_server",
]

COMPONENT = "poisoning"
DELIVERY_SPAN = "toolwitness.poisoning.delivery"
#: the session a delivery span is about (a session key would make the span part of the session)
DELIVERY_SESSION = "toolwitness.poisoning.session_id"

log = logging.getLogger(__name__)
_EXTRA = {"component": COMPONENT}
_HEX32 = re.compile(r"^[0-9a-f]{32}$")
_HEX16 = re.compile(r"^[0-9a-f]{16}$")
#: the response's ``reason`` when the caller's deadline passed before a payload could be delivered
CALLER_DEADLINE = "caller_deadline"
#: the response's ``reason`` when the poisoned result would be over ``max_message_bytes``
RESULT_TOO_LARGE = "result_too_large"


class PoisoningConfig(GrpcServerConfig):
    """Where the poisoning service listens and how it authenticates callers (TLS fields: see the base)."""

    listen: str = "127.0.0.1:4320"
    bearer_token_env: str = "TOOLWITNESS_POISONING_TOKEN"
    max_message_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)


class _Servicer(boundary_grpc.ToolBoundaryServicer):  # type: ignore[misc]
    def __init__(self, server: PoisoningServer) -> None:
        self._server = server

    async def InterceptTool(self, request: InterceptToolRequest, context: Any) -> InterceptToolResponse:
        return await self._server.intercept(request, context)


def _abort_message(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]


class PoisoningServer(GrpcServer[PoisoningConfig]):
    """grpc.aio server around a ``CampaignRegistry``. ``start()`` / ``shutdown()``.

    ``endpoint`` is the value for ``TOOLWITNESS_POISONING_ENDPOINT``.
    """

    COMPONENT = COMPONENT
    CALL = "InterceptTool"
    NOT_STARTED = "the poisoning server is not started"
    #: a payload is delivered only with this much of the caller's deadline left once its answer is
    #: ready; closer to it the caller has (or soon will have) given up and used its real result
    DEADLINE_MARGIN_S = 0.05
    _log = log

    def __init__(
        self,
        registry: CampaignRegistry,
        config: PoisoningConfig | None = None,
        *,
        bearer_token: str | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        super().__init__(config or PoisoningConfig(), bearer_token)
        self.registry = registry
        self._tracer = tracer
        self.calls = 0
        self.poisoned = 0

    def _grpc_options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.max_receive_message_length", self.config.max_message_bytes),
            ("grpc.max_send_message_length", self.config.max_message_bytes),
        ]

    def _add_servicer(self, server: Any) -> None:
        boundary_grpc.add_ToolBoundaryServicer_to_server(_Servicer(self), server)

    # -- the call --------------------------------------------------------------------------------

    @staticmethod
    def _passthrough(request: InterceptToolRequest, reason: str) -> InterceptToolResponse:
        return InterceptToolResponse(result_json=request.result_json, poisoned=False, reason=reason)

    async def intercept(self, request: InterceptToolRequest, context: Any) -> InterceptToolResponse:
        await self._check_auth(context)
        self.calls += 1
        if not request.tool_name or not request.session_id:
            await self._abort(context, grpc.StatusCode.INVALID_ARGUMENT, "tool_name and session_id are required")
        campaign = self.registry.campaign_for(request.session_id)
        if campaign is None:
            return self._passthrough(request, NOT_ENROLLED)
        if not campaign.targets(request.tool_name):
            return self._passthrough(request, TOOL_NOT_TARGETED)
        if self._too_late(context):
            return self._passthrough(request, CALLER_DEADLINE)
        # Parsing, splicing and serializing a result is CPU work that grows with it (a 2 MB result
        # takes ~0.9 s): done in a worker thread, so the event loop keeps answering other calls.
        try:
            result: JsonValue = await asyncio.to_thread(json.loads, request.result_json)
        except ValueError as exc:
            await self._abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"result_json: {_abort_message(exc)}")
        deciding = asyncio.ensure_future(
            asyncio.to_thread(
                functools.partial(
                    self.registry.decide,
                    tool_name=request.tool_name,
                    result=result,
                    session_id=request.session_id,
                    call_id=request.call_id,
                    trace_id=request.trace_id if _HEX32.match(request.trace_id) else "",
                    span_id=request.span_id if _HEX16.match(request.span_id) else "",
                )
            )
        )
        try:
            disposition = await asyncio.shield(deciding)
        except asyncio.CancelledError:
            # The call ended (the caller gave up) while its result was spliced: the thread goes on,
            # and a delivery it logs never reaches the caller, so it is taken back when it is done.
            deciding.add_done_callback(self._retract_undelivered)
            raise
        if not disposition.poisoned or disposition.delivery is None:
            log.debug(
                "%s: %s result for session %s not poisoned (%s)", COMPONENT, request.tool_name,
                request.session_id, disposition.reason, extra=_EXTRA,
            )
            return self._passthrough(request, disposition.reason)
        delivery = disposition.delivery
        try:
            result_json = await asyncio.to_thread(functools.partial(json.dumps, disposition.value, ensure_ascii=False))
            response = InterceptToolResponse(
                result_json=result_json,
                poisoned=True,
                canary=delivery.canary,
                campaign_id=delivery.campaign_id,
            )
        except BaseException:
            self.registry.retract(delivery)  # never sent: no delivery
            raise
        if response.ByteSize() > self.config.max_message_bytes:
            # gRPC would refuse to send it (RESOURCE_EXHAUSTED): the caller keeps its real result
            self.registry.retract(delivery)
            log.info(
                "%s: %s result for session %s not poisoned: with the payload it is over max_message_bytes (%d)",
                COMPONENT, request.tool_name, request.session_id, self.config.max_message_bytes, extra=_EXTRA,
            )
            return self._passthrough(request, RESULT_TOO_LARGE)
        if self._too_late(context):
            # The caller gives up at its deadline and uses its real result: a delivery logged now
            # would be one the agent never received (and would use up the session's cap).
            self.registry.retract(delivery)
            log.info(
                "%s: %s result for session %s not poisoned: the caller's deadline passed while it was "
                "prepared", COMPONENT, request.tool_name, request.session_id, extra=_EXTRA,
            )
            return self._passthrough(request, CALLER_DEADLINE)
        self.poisoned += 1
        self._record(delivery)
        log.info(
            "%s: delivered campaign %s to session %s in %s result at %s (delivery %d)", COMPONENT,
            delivery.campaign_id, delivery.session_id, delivery.tool_name, delivery.path, delivery.delivery,
            extra=_EXTRA,
        )
        return response

    def _retract_undelivered(self, done: asyncio.Future[Disposition]) -> None:
        if done.cancelled() or done.exception() is not None:
            return
        delivery = done.result().delivery
        if delivery is not None:
            self.registry.retract(delivery)

    def _too_late(self, context: Any) -> bool:
        """Whether less than ``DEADLINE_MARGIN_S`` of the caller's gRPC deadline is left."""
        try:
            remaining = context.time_remaining()
        except Exception:
            return False
        return remaining is not None and remaining < self.DEADLINE_MARGIN_S

    def _record(self, delivery: Delivery) -> None:
        """The delivery as a span of its own trace, linked to the caller's execute_tool span."""
        if self._tracer is None:
            return
        links: list[Link] = []
        if delivery.trace_id and delivery.span_id:
            links.append(
                Link(
                    SpanContext(
                        trace_id=int(delivery.trace_id, 16),
                        span_id=int(delivery.span_id, 16),
                        is_remote=True,
                        trace_flags=TraceFlags(TraceFlags.SAMPLED),
                    )
                )
            )
        try:
            span = self._tracer.start_span(
                DELIVERY_SPAN,
                context=Context(),
                kind=SpanKind.SERVER,
                links=links,
                attributes={
                    "toolwitness.poisoning.campaign_id": delivery.campaign_id,
                    "toolwitness.poisoning.canary": delivery.canary,
                    "toolwitness.poisoning.delivery": delivery.delivery,
                    "toolwitness.poisoning.path": delivery.path,
                    "toolwitness.poisoning.carrier": delivery.carrier,
                    # not gen_ai.conversation.id: this span's trace is the server's, never marked
                    # complete by the harness; as part of the session it kept it from completing
                    DELIVERY_SESSION: delivery.session_id,
                    "gen_ai.tool.name": delivery.tool_name,
                    "gen_ai.tool.call.id": delivery.call_id,
                },
            )
            span.end()
        except Exception as exc:  # recording is best effort: never fail the call on it
            log.warning("%s: recording a delivery span failed: %r", COMPONENT, exc, extra=_EXTRA)


def create_poisoning_server(
    registry: CampaignRegistry,
    config: PoisoningConfig | None = None,
    *,
    tracer: Tracer | None = None,
    env: Mapping[str, str] | None = None,
) -> PoisoningServer:
    """Factory: a server for ``config`` (defaults), the token read from ``config.bearer_token_env``."""
    config = config or PoisoningConfig()
    return PoisoningServer(registry, config, bearer_token=config.read_bearer_token(env), tracer=tracer)
