"""The prompt-target contract: send one request message, get the response message."""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, StatusCode

from scoring.models.message import Message
from scoring.prompt_target.tracing import TargetTraceConfig

__all__ = ["PromptTarget", "traces_itself"]

F = TypeVar("F", bound=Callable[..., Any])


def traces_itself(method: F) -> F:
    """Mark a target's ``send_prompt_async`` that handles ``trace_config`` itself (``HTTPTarget``:
    it sends the trace context over the wire)."""
    method._traces_itself = True  # type: ignore[attr-defined]
    return method


class PromptTarget(ABC):
    """A system under test. ``send_prompt_async`` sets ``trace_id`` on the request piece when the
    request was traced (see ``TargetTraceConfig``) and returns the assistant's response.

    A target of your own (a local agent in this process) gets ``trace_config.tracer`` for free:
    each ``send_prompt_async`` runs inside a span of that tracer, a fresh trace whose id is set
    on the request piece, so the spans your agent records meanwhile (its tools') are in it."""

    def __init__(self, *, trace_config: TargetTraceConfig | None = None) -> None:
        self.trace_config = trace_config or TargetTraceConfig()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        impl = cls.__dict__.get("send_prompt_async")
        if impl is not None and not getattr(impl, "_traces_itself", False):
            setattr(cls, "send_prompt_async", _traced(impl))  # noqa: B010 -- a class attribute, wrapped

    @abstractmethod
    async def send_prompt_async(self, *, message: Message) -> Message: ...

    def get_identifier(self) -> dict[str, str]:
        return {"__type__": type(self).__name__, "__module__": type(self).__module__}


def _traced(impl: Callable[..., Awaitable[Message]]) -> Callable[..., Awaitable[Message]]:
    @functools.wraps(impl)
    async def send_prompt_async(self: PromptTarget, *, message: Message) -> Message:
        tracer = self.trace_config.tracer
        piece = message.message_pieces[0]
        if tracer is None or piece.trace_id:  # not asked for, or traced already (an outer wrapper)
            return await impl(self, message=message)
        span = tracer.start_span(f"{type(self).__name__}.send_prompt_async", context=Context(), kind=SpanKind.CLIENT)
        ctx = span.get_span_context()
        if ctx.is_valid:
            piece.trace_id = f"{ctx.trace_id:032x}"
        try:
            with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
                return await impl(self, message=message)
        except BaseException as exc:
            span.set_attribute("error.type", type(exc).__qualname__)
            span.set_status(StatusCode.ERROR, type(exc).__qualname__)
            raise
        finally:
            span.end()

    return send_prompt_async
