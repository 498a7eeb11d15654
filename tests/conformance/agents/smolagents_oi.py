"""smolagents ``ToolCallingAgent`` traced by OpenInference's ``SmolagentsInstrumentor``.

Versions: smolagents 1.26.0, openinference-instrumentation-smolagents 0.1.43 (main virtualenv).

Scenario ``openinference``: a ``ToolCallingAgent`` (not a ``CodeAgent``) offered the four witness tools,
each built with smolagents' ``@tool`` decorator from a typed, documented function (``book_trip(trip: dict)``
becomes an input of JSON type ``object``). smolagents adds its own ``final_answer`` tool to every
``ToolCallingAgent``, so the agent really holds five tools and ends its run by calling ``final_answer``.

The model is ``ScriptedModel``, a subclass of ``smolagents.models.Model`` whose ``generate`` returns one
``ChatMessage`` per agent step carrying one ``ChatMessageToolCall`` (id ``call_<n>``, JSON-string arguments,
as an API model would return them): the SCRIPT calls in order, then ``final_answer(answer=FINAL_ANSWER)``.
The instrumentor only wraps ``generate`` of the model classes the ``smolagents`` package exports, so the
scripted class is set on the package (``smolagents.ScriptedModel``) before ``instrument()`` and removed
after; that way its ``generate`` gets the same LLM span as any stock model.

``fail_tool`` raising is turned by smolagents into an ``AgentToolExecutionError`` that is stored on the
step and shown to the model as an error message; the run goes on (``witness.notes`` says what the model saw).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import smolagents
from _witness import FINAL_ANSWER, SCRIPT, Witness
from openinference.instrumentation.smolagents import SmolagentsInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from smolagents import Tool, ToolCallingAgent, tool
from smolagents.models import ChatMessage, ChatMessageToolCall, ChatMessageToolCallFunction, MessageRole, Model
from smolagents.monitoring import LogLevel, TokenUsage


def _tools(witness: Witness) -> list[Tool]:
    """The four witness tools as smolagents tools (typed signatures and ``Args:`` docstrings give the schema)."""

    @tool
    def get_weather(city: str, units: str) -> str:
        """Get the current weather in a city.

        Args:
            city: The city to get the weather for.
            units: The units to report in, "metric" or "imperial".
        """
        return witness.get_weather(city, units)

    @tool
    def book_trip(trip: dict) -> str:
        """Book a trip.

        Args:
            trip: The trip to book: an object with "city", "dates" ({"from", "to"}) and "travellers" (names).
        """
        return witness.book_trip(trip)

    @tool
    def fail_tool(reason: str) -> str:
        """A tool that always fails.

        Args:
            reason: Why it fails.
        """
        return witness.fail_tool(reason)

    @tool
    def send_email(to: str, body: str) -> str:
        """Send an email.

        Args:
            to: The recipient's address.
            body: The text of the email.
        """
        return witness.send_email(to, body)

    return [get_weather, book_trip, fail_tool, send_email]


def _text(message: Any) -> str:
    """The text of a smolagents message (its content is a string or a list of ``{"type": "text"}`` parts)."""
    content = message.content if isinstance(message, ChatMessage) else message.get("content")
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


class ScriptedModel(Model):
    """Answers each agent step with the next SCRIPT call, then with a ``final_answer`` call."""

    def __init__(self, witness: Witness) -> None:
        super().__init__(model_id="scripted")
        self.witness = witness
        self.turn = 0
        self.steps: list[tuple[str, dict[str, Any]]] = [*SCRIPT, ("final_answer", {"answer": FINAL_ANSWER})]

    def generate(
        self,
        messages: list[ChatMessage | dict],
        stop_sequences: list[str] | None = None,
        response_format: dict[str, str] | None = None,
        tools_to_call_from: list[Tool] | None = None,
        **kwargs: Any,
    ) -> ChatMessage:
        if self.turn > 0:  # what the framework fed back about the previous call
            self.witness.notes.setdefault("model_saw_after_call", []).append(_text(messages[-1])[:300])
        if tools_to_call_from is not None:
            self.witness.notes["tools_offered_to_model"] = [t.name for t in tools_to_call_from]
        if self.turn >= len(self.steps):
            raise RuntimeError("scripted model asked for more turns than it has")
        name, arguments = self.steps[self.turn]
        self.turn += 1
        call = ChatMessageToolCall(
            id=f"call_{self.turn}",
            type="function",
            function=ChatMessageToolCallFunction(name=name, arguments=json.dumps(arguments)),
        )
        return ChatMessage(
            role=MessageRole.ASSISTANT,
            content=None,
            tool_calls=[call],
            token_usage=TokenUsage(input_tokens=10, output_tokens=5),
        )


def _witnessed_final_answer(witness: Witness) -> Tool:
    """smolagents' own ``final_answer`` tool, its body witnessed like the others (it is a tool run too)."""
    from smolagents.default_tools import FinalAnswerTool

    class WitnessedFinalAnswer(FinalAnswerTool):  # type: ignore[misc]
        def forward(self, answer: Any) -> Any:
            witness.record("final_answer", answer=answer)
            return super().forward(answer)

    return WitnessedFinalAnswer()


def openinference(provider: TracerProvider, witness: Witness) -> None:
    smolagents.ScriptedModel = ScriptedModel  # so the instrumentor wraps its generate like a stock model's
    instrumentor = SmolagentsInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        agent = ToolCallingAgent(
            tools=_tools(witness),
            model=ScriptedModel(witness),
            max_steps=len(SCRIPT) + 3,
            verbosity_level=LogLevel.OFF,
        )
        agent.tools["final_answer"] = _witnessed_final_answer(witness)
        witness.notes["agent_tools"] = sorted(agent.tools)
        result = agent.run("Check the weather in Paris, book a trip to Rome, check Rome, then call fail_tool.")
        witness.notes["final_output"] = result
        witness.notes["step_errors"] = [
            f"{type(step.error).__name__}: {step.error}"[:300]
            for step in agent.memory.steps
            if getattr(step, "error", None) is not None
        ]
        witness.notes["aborted_on_error"] = False
    finally:
        instrumentor.uninstrument()
        del smolagents.ScriptedModel


#: the distributions whose versions a run records
PACKAGES = (
    "smolagents",
    "openinference-instrumentation-smolagents",
)

SCENARIOS: dict[str, Callable[[TracerProvider, Witness], None]] = {"openinference": openinference}
