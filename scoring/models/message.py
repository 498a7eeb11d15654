"""Conversation messages, as far as scoring needs them (PyRIT's MessagePiece / Message)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["system", "user", "assistant", "tool"]


class MessagePiece(BaseModel):
    """One piece of a conversation turn.

    ``trace_id`` is set on a request piece when the target sent W3C trace
    context with it: the agent's spans for that request live in that trace.
    """

    model_config = ConfigDict(extra="forbid")

    role: Role
    original_value: str
    conversation_id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    sequence: int = -1
    trace_id: str | None = None
    timestamp: datetime = Field(default_factory=lambda: datetime.now(UTC))
    labels: dict[str, str] = Field(default_factory=dict)

    @property
    def converted_value(self) -> str:
        return self.original_value

    def to_message(self) -> Message:
        return Message(message_pieces=[self])


class Message(BaseModel):
    """A conversation turn: one or more pieces with the same role and conversation."""

    model_config = ConfigDict(extra="forbid")

    message_pieces: list[MessagePiece] = Field(min_length=1)

    @property
    def role(self) -> Role:
        return self.message_pieces[0].role

    @property
    def conversation_id(self) -> str:
        return self.message_pieces[0].conversation_id

    @property
    def text(self) -> str:
        return "\n".join(p.converted_value for p in self.message_pieces)

    def get_value(self) -> str:
        return self.text
