"""Conformance scenarios for Google ADK (google-adk 2.13.0), native telemetry and OpenInference.

Runs in its own virtualenv (``/tmp/cv/adk``: google-adk 2.13.0, google-genai, opentelemetry-sdk
1.44, openinference-instrumentation-google-adk 1.0.5). An ``LlmAgent`` offers the four witness tools
as ``FunctionTool``s (plain typed functions, so ADK builds their schemas and binds the arguments the
normal way) and is run by an ``InMemoryRunner``. The model is ``ScriptedLlm``, a ``BaseLlm`` subclass
whose ``generate_content_async`` yields one scripted ``LlmResponse`` per model turn: a turn of
``function_call`` parts (one per turn, two in the parallel scenario), then the final text. No
network, no API key.

ADK's native spans go through its module-level tracer ``gcp.vertex.agent`` (a proxy of the global
provider, which ``captured()`` sets). The knobs, all read from the environment at run time:

* ``ADK_TELEMETRY_SCHEMA_VERSION_OPT_IN``: ``2`` (default, semconv aligned: tool content is
  ``gen_ai.tool.call.arguments`` / ``gen_ai.tool.call.result``) or ``1`` (legacy: content is
  ``gcp.vertex.agent.tool_call_args`` / ``gcp.vertex.agent.tool_response``);
* ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``: schema 2 puts tool content on spans only
  for ``SPAN_ONLY`` / ``SPAN_AND_EVENT`` (``true`` means ``EVENT_ONLY``: no span content); default off;
* ``ADK_CAPTURE_MESSAGE_CONTENT_IN_SPANS``: schema 1 content switch, default on.

A tool that raises is not shown to the model by default: ADK re-raises it out of ``run_async``
(unless an ``on_tool_error_callback`` answers for it), so the run aborts on ``fail_tool`` (the last
call of the script); the scenarios catch that and set ``witness.notes["aborted_on_error"]``.
``native_error_callback`` instead gives the agent an ``on_tool_error_callback`` that turns the
exception into a ``{"error": ...}`` response the model sees, and the run reaches its final answer.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from _witness import FINAL_ANSWER, SCRIPT, ToolFailed, Witness
from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner
from google.adk.tools import FunctionTool
from google.genai import types
from opentelemetry.sdk.trace import TracerProvider
from pydantic import PrivateAttr

APP = "conformance"
USER = "user-1"

#: one model turn: the calls it requests, each (tool name, arguments, call id or None)
Turn = Sequence[tuple[str, dict[str, Any], str | None]]


def _sequential_turns(ids: Sequence[str | None] | None = None) -> list[Turn]:
    """SCRIPT as one call per model turn, with call ids ``call_1``... unless ``ids`` says otherwise."""
    ids = ids if ids is not None else [f"call_{i}" for i in range(1, len(SCRIPT) + 1)]
    return [[(name, args, call_id)] for (name, args), call_id in zip(SCRIPT, ids, strict=True)]


def _parallel_turns() -> list[Turn]:
    """Both get_weather calls in one turn (``call_p1``/``call_p2``), then book_trip, then fail_tool."""
    weather = [(name, args) for name, args in SCRIPT if name == "get_weather"]
    book = next((name, args) for name, args in SCRIPT if name == "book_trip")
    fail = next((name, args) for name, args in SCRIPT if name == "fail_tool")
    return [
        [(weather[0][0], weather[0][1], "call_p1"), (weather[1][0], weather[1][1], "call_p2")],
        [(book[0], book[1], "call_b1")],
        [(fail[0], fail[1], "call_f1")],
    ]


class ScriptedLlm(BaseLlm):
    """A model that answers each turn from a script, then with ``FINAL_ANSWER``."""

    model: str = "scripted-model"
    _turns: list[Turn] = PrivateAttr(default_factory=list)
    _next: int = PrivateAttr(default=0)

    def with_turns(self, turns: list[Turn]) -> ScriptedLlm:
        self._turns = list(turns)
        return self

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        if self._next < len(self._turns):
            turn = self._turns[self._next]
            self._next += 1
            parts = [
                types.Part(function_call=types.FunctionCall(name=name, args=args, id=call_id))
                for name, args, call_id in turn
            ]
        else:
            parts = [types.Part(text=FINAL_ANSWER)]
        yield LlmResponse(content=types.Content(role="model", parts=parts), finish_reason=types.FinishReason.STOP)


def _tools(witness: Witness) -> list[FunctionTool]:
    """The witness bodies as ADK ``FunctionTool``s (plain functions with typed signatures)."""

    def get_weather(city: str, units: str) -> str:
        """Get the weather for a city.

        Args:
            city: the city.
            units: metric or imperial.
        """
        return witness.get_weather(city, units)

    def book_trip(trip: dict[str, Any]) -> str:
        """Book a trip.

        Args:
            trip: the trip: city, dates {from, to}, travellers.
        """
        return witness.book_trip(trip)

    def fail_tool(reason: str) -> str:
        """A tool that always fails.

        Args:
            reason: why.
        """
        return witness.fail_tool(reason)

    def send_email(to: str, body: str) -> str:
        """Send an email.

        Args:
            to: recipient.
            body: text.
        """
        return witness.send_email(to, body)

    return [FunctionTool(f) for f in (get_weather, book_trip, fail_tool, send_email)]


@contextmanager
def _env(**values: str) -> Iterator[None]:
    """Sets environment variables for the block (ADK reads its telemetry knobs at run time)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run(witness: Witness, turns: list[Turn], **agent_kwargs: Any) -> None:
    """Runs the agent over the scripted turns; a tool exception that aborts the run is noted, not raised."""
    agent = LlmAgent(
        name="trip_agent",
        description="plans trips",
        instruction="Use the tools.",
        model=ScriptedLlm().with_turns(turns),
        tools=_tools(witness),
        **agent_kwargs,
    )
    runner = InMemoryRunner(agent=agent, app_name=APP)

    async def go() -> None:
        session = await runner.session_service.create_session(app_name=APP, user_id=USER)
        message = types.Content(role="user", parts=[types.Part(text="Plan my trip to Rome.")])
        final = None
        try:
            async for event in runner.run_async(user_id=USER, session_id=session.id, new_message=message):
                if event.content and event.content.parts and event.is_final_response():
                    final = "".join(p.text or "" for p in event.content.parts)
        except ToolFailed as e:
            witness.notes["aborted_on_error"] = True
            witness.notes["abort"] = f"{type(e).__name__}: {e} (ADK re-raises a tool exception out of run_async)"
        witness.notes["final_answer"] = final
        await runner.close()

    asyncio.run(go())


def native_default(provider: TracerProvider, witness: Witness) -> None:
    """ADK's native spans, default settings (schema 2, no content capture)."""
    _run(witness, _sequential_turns())


def native_content(provider: TracerProvider, witness: Witness) -> None:
    """Schema 2 with span content on; the first get_weather call carries NO call id (ADK makes one)."""
    ids = [None] + [f"call_{i}" for i in range(2, len(SCRIPT) + 1)]
    witness.notes["no_call_id"] = "first get_weather requested without a function_call id"
    with _env(OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="SPAN_ONLY"):
        _run(witness, _sequential_turns(ids))


def native_legacy(provider: TracerProvider, witness: Witness) -> None:
    """The legacy schema 1 (``gcp.vertex.agent.tool_call_args``), content on by default."""
    witness.notes["schema"] = "ADK_TELEMETRY_SCHEMA_VERSION_OPT_IN=1"
    with _env(ADK_TELEMETRY_SCHEMA_VERSION_OPT_IN="1"):
        _run(witness, _sequential_turns())


def native_parallel(provider: TracerProvider, witness: Witness) -> None:
    """Both get_weather calls in one model turn (run concurrently by ADK), content on."""
    witness.notes["parallel"] = "get_weather Paris (call_p1) and Rome (call_p2) requested in one turn"
    with _env(OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="SPAN_ONLY"):
        _run(witness, _parallel_turns())


def native_legacy_parallel(provider: TracerProvider, witness: Witness) -> None:
    """The parallel script under the legacy schema (its merged span carries the responses)."""
    witness.notes["parallel"] = "get_weather Paris (call_p1) and Rome (call_p2) requested in one turn"
    witness.notes["schema"] = "ADK_TELEMETRY_SCHEMA_VERSION_OPT_IN=1"
    with _env(ADK_TELEMETRY_SCHEMA_VERSION_OPT_IN="1"):
        _run(witness, _parallel_turns())


def native_error_callback(provider: TracerProvider, witness: Witness) -> None:
    """Schema 2, content on, and an ``on_tool_error_callback`` that hands the error to the model."""

    def on_tool_error(tool: Any, args: dict[str, Any], tool_context: Any, error: Exception) -> dict[str, Any]:
        return {"error": f"{type(error).__name__}: {error}"}

    witness.notes["on_tool_error_callback"] = "fail_tool's exception becomes the response {'error': ...}"
    with _env(OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="SPAN_ONLY"):
        _run(witness, _sequential_turns(), on_tool_error_callback=on_tool_error)


def openinference(provider: TracerProvider, witness: Witness) -> None:
    """OpenInference's GoogleADKInstrumentor (it reroutes ADK's own tracer), default settings."""
    from openinference.instrumentation.google_adk import GoogleADKInstrumentor

    instrumentor = GoogleADKInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        _run(witness, _sequential_turns())
    finally:
        instrumentor.uninstrument()


#: the distributions whose versions a run records
PACKAGES = (
    "google-adk",
    "openinference-instrumentation-google-adk",
    "opentelemetry-sdk",
)

SCENARIOS: dict[str, Callable[[TracerProvider, Witness], None]] = {
    "native_default": native_default,
    "native_content": native_content,
    "native_legacy": native_legacy,
    "native_parallel": native_parallel,
    "native_legacy_parallel": native_legacy_parallel,
    "native_error_callback": native_error_callback,
    "openinference": openinference,
}
