"""The prompt-target contract: send one request message, get the response message."""

from __future__ import annotations

from abc import ABC, abstractmethod

from scoring.models.message import Message
from scoring.prompt_target.tracing import TargetTraceConfig

__all__ = ["PromptTarget"]


class PromptTarget(ABC):
    """A system under test. ``send_prompt_async`` sets ``trace_id`` on the request piece when the
    request was traced (see ``TargetTraceConfig``) and returns the assistant's response."""

    def __init__(self, *, trace_config: TargetTraceConfig | None = None) -> None:
        self.trace_config = trace_config or TargetTraceConfig()

    @abstractmethod
    async def send_prompt_async(self, *, message: Message) -> Message: ...

    def get_identifier(self) -> dict[str, str]:
        return {"__type__": type(self).__name__, "__module__": type(self).__module__}
