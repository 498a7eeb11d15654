"""Scorables: references to what is scored (traces, a session, a message, plain text)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from scoring.models.message import Message

_TRACE_ID = re.compile(r"[0-9a-f]{32}")


def check_trace_id(value: str) -> str:
    """Validate a W3C trace id: 32 lowercase hex characters, not all zero."""
    if not isinstance(value, str):
        # the OTel API hands out trace ids as ints (``SpanContext.trace_id``)
        raise TypeError(
            f"trace id must be a str of 32 lowercase hex characters, got {type(value).__name__}: "
            "use opentelemetry.trace.format_trace_id(span.get_span_context().trace_id)"
        )
    if not _TRACE_ID.fullmatch(value) or value == "0" * 32:
        raise ValueError(f"trace id must be 32 lowercase hex characters and not all zero, got {value!r}")
    return value


class _Scorable(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TraceScorable(_Scorable):
    """One or more traces, selected explicitly by id."""

    kind: Literal["trace"] = "trace"
    trace_ids: tuple[str, ...]

    @field_validator("trace_ids")
    @classmethod
    def _ids(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("a TraceScorable needs at least one trace id")
        # Each trace once (first occurrence kept): a repeated id would count its executions twice.
        return tuple(dict.fromkeys(check_trace_id(t) for t in v))


class SessionScorable(_Scorable):
    """All traces of a session (``gen_ai.conversation.id`` or ``session.id``)."""

    kind: Literal["session"] = "session"
    session_id: str = Field(min_length=1)


class MessageScorable(_Scorable):
    """A scored response message; its request traces are resolved through the conversation.

    ``trace_ids`` and ``response_text`` may be given inline (the streaming service
    does); otherwise they are resolved from memory, never reading later turns.
    """

    kind: Literal["message"] = "message"
    message_id: str
    conversation_id: str = ""
    trace_ids: tuple[str, ...] | None = None
    response_text: str | None = None

    @field_validator("trace_ids")
    @classmethod
    def _ids(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if v is None else tuple(dict.fromkeys(check_trace_id(t) for t in v))

    @classmethod
    def from_message(cls, message: Message) -> MessageScorable:
        piece = message.message_pieces[-1]
        return cls(message_id=piece.id, conversation_id=piece.conversation_id)


class ContentScorable(_Scorable):
    """Plain text (what ``score_text_async`` scores)."""

    kind: Literal["content"] = "content"
    text: str


AnyScorable = Annotated[
    TraceScorable | SessionScorable | MessageScorable | ContentScorable, Field(discriminator="kind")
]
Scorable = TraceScorable | SessionScorable | MessageScorable | ContentScorable
