"""pydantic-ai with its own (native) OpenTelemetry instrumentation, driven by a scripted model.

Runs ``pydantic_ai.Agent`` (pydantic-ai-slim 2.68.x) with the ``Instrumentation`` capability
(``InstrumentationSettings(tracer_provider=provider, include_content=True)``) and a
``pydantic_ai.models.function.FunctionModel`` whose function returns one ``ToolCallPart`` per model
turn (the ``SCRIPT`` calls in order, ids ``call_1``...), then the text ``FINAL_ANSWER``.

Scenarios:

- ``current``: the default span format (instrumentation ``version=5``: spans ``execute_tool <name>``
  with ``gen_ai.tool.call.arguments`` / ``gen_ai.tool.call.result``).
- ``legacy``: the oldest format still accepted (``version=2``, deprecated: spans ``running tool`` with
  ``tool_arguments`` / ``tool_response``).
- ``validation``: ``current``, but the model first calls ``get_weather`` with ``{"city": 42}`` (wrong
  type, ``units`` missing); pydantic-ai rejects it before the body runs and sends a retry prompt, then
  the normal script follows.
- ``intercept``: ``current`` with async tools that hand each result to toolwitness's
  ``collector.boundary.intercept_tool`` (``TOOLWITNESS_TOOL_INTERCEPT=true``), failures included.
- ``middleware``: ``current`` with async tools that run the bodies through
  ``collector.boundary.make_tool_middleware``.
- ``wrapped``: ``current``, but the model sends ``book_trip``'s arguments wrapped as ``{"trip": {...}}``.

``book_trip`` takes one ``trip: Trip`` parameter (a nested ``TypedDict``). pydantic-ai unwraps a single
model-like parameter: the schema the model sees is ``Trip``'s own, so a model following it sends
``{"city": ..., "dates": ..., "travellers": ...}`` (what every scenario but ``wrapped`` sends) while the body
receives ``trip={...}``. pydantic-ai accepts the wrapped ``{"trip": {...}}`` form too (``wrapped``).

A tool raising an arbitrary exception ends a pydantic-ai run; the model sees a failure only when the tool
raises ``pydantic_ai.exceptions.ToolFailed`` (or ``ModelRetry``). The ``fail_tool`` wrapper therefore turns
the witness's ``ToolFailed`` into pydantic-ai's ``ToolFailed`` (chained), and the run continues to the final
answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from _witness import FINAL_ANSWER, SCRIPT, Witness
from _witness import ToolFailed as WitnessToolFailed
from opentelemetry.sdk.trace import TracerProvider
from pydantic_ai import Agent
from pydantic_ai.capabilities import Instrumentation
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.instrumented import InstrumentationSettings
from typing_extensions import TypedDict

SESSION_ID = "conf-session"

Dates = TypedDict("Dates", {"from": str, "to": str})


class Trip(TypedDict):
    city: str
    dates: Dates
    travellers: list[str]


def _model_calls(*, unwrap_trip: bool, invalid_first: bool) -> list[tuple[str, dict[str, Any]]]:
    """The calls the scripted model makes, in order (as the model sends their arguments)."""
    calls = [(name, dict(args["trip"]) if unwrap_trip and name == "book_trip" else dict(args)) for name, args in SCRIPT]
    if invalid_first:
        calls.insert(0, ("get_weather", {"city": 42}))
    return calls


def _scripted_model(calls: list[tuple[str, dict[str, Any]]]) -> FunctionModel:
    """One tool call per model turn, then the final answer (the turn index is the number of responses so far)."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        if turn < len(calls):
            name, args = calls[turn]
            return ModelResponse(parts=[ToolCallPart(tool_name=name, args=args, tool_call_id=f"call_{turn + 1}")])
        return ModelResponse(parts=[TextPart(FINAL_ANSWER)])

    return FunctionModel(respond, model_name="scripted")


def _settings(provider: TracerProvider, version: int | None = None) -> InstrumentationSettings:
    if version is None:
        return InstrumentationSettings(tracer_provider=provider, include_content=True)
    with warnings.catch_warnings():  # versions 2-4 are deprecated (PydanticAIDeprecationWarning)
        warnings.simplefilter("ignore")
        return InstrumentationSettings(tracer_provider=provider, include_content=True, version=version)  # type: ignore[arg-type]


def _sync_tools(witness: Witness) -> list[Callable[..., Any]]:
    """Plain (sync) tool functions around the witness's bodies; pydantic-ai runs them in a worker thread."""

    def get_weather(city: str, units: str) -> str:
        """Current weather for a city."""
        return witness.get_weather(city, units)

    def book_trip(trip: Trip) -> str:
        """Book a trip."""
        return witness.book_trip(dict(trip))

    def fail_tool(reason: str) -> str:
        """A tool that always fails."""
        try:
            return witness.fail_tool(reason)
        except WitnessToolFailed as e:
            raise ToolFailed(str(e)) from e

    def send_email(to: str, body: str) -> str:
        """Send an email."""
        return witness.send_email(to, body)

    return [get_weather, book_trip, fail_tool, send_email]


def _intercept_tools(witness: Witness, provider: TracerProvider) -> list[Callable[..., Any]]:
    """Async tools that report each result through ``intercept_tool`` after the body ran."""
    from collector.boundary import intercept_tool

    tracer = provider.get_tracer("conformance.toolwitness")

    async def report(name: str, args: dict[str, Any], result: Any, error: BaseException | None = None) -> Any:
        return await intercept_tool(
            tool_name=name,
            tool_arguments=json.dumps(args),
            result=result,
            error=error,
            session_id=SESSION_ID,
            tracer=tracer,
        )

    async def get_weather(city: str, units: str) -> str:
        """Current weather for a city."""
        return await report("get_weather", {"city": city, "units": units}, witness.get_weather(city, units))

    async def book_trip(trip: Trip) -> str:
        """Book a trip."""
        return await report("book_trip", {"trip": trip}, witness.book_trip(dict(trip)))

    async def fail_tool(reason: str) -> str:
        """A tool that always fails."""
        try:
            result = witness.fail_tool(reason)
        except WitnessToolFailed as e:
            await report("fail_tool", {"reason": reason}, {"error": str(e)}, error=e)
            raise ToolFailed(str(e)) from e
        return await report("fail_tool", {"reason": reason}, result)

    async def send_email(to: str, body: str) -> str:
        """Send an email."""
        return await report("send_email", {"to": to, "body": body}, witness.send_email(to, body))

    return [get_weather, book_trip, fail_tool, send_email]


def _middleware_tools(witness: Witness, provider: TracerProvider) -> list[Callable[..., Any]]:
    """Async tools that run the bodies through ``make_tool_middleware`` (one dispatcher for all)."""
    from collector.boundary import make_tool_middleware

    async def dispatch(name: str, arguments: Mapping[str, Any]) -> Any:
        return getattr(witness, name)(**arguments)

    call = make_tool_middleware(dispatch, session_id=SESSION_ID, tracer=provider.get_tracer("conformance.toolwitness"))

    async def get_weather(city: str, units: str) -> str:
        """Current weather for a city."""
        return await call("get_weather", {"city": city, "units": units})

    async def book_trip(trip: Trip) -> str:
        """Book a trip."""
        return await call("book_trip", {"trip": dict(trip)})

    async def fail_tool(reason: str) -> str:
        """A tool that always fails."""
        try:
            return await call("fail_tool", {"reason": reason})
        except WitnessToolFailed as e:
            raise ToolFailed(str(e)) from e

    async def send_email(to: str, body: str) -> str:
        """Send an email."""
        return await call("send_email", {"to": to, "body": body})

    return [get_weather, book_trip, fail_tool, send_email]


def _run(
    witness: Witness,
    settings: InstrumentationSettings,
    tools: list[Callable[..., Any]],
    *,
    unwrap_trip: bool = True,
    invalid_first: bool = False,
) -> None:
    calls = _model_calls(unwrap_trip=unwrap_trip, invalid_first=invalid_first)
    agent = Agent(
        _scripted_model(calls),
        name="conformance",
        tools=tools,
        capabilities=[Instrumentation(settings=settings)],
    )
    result = asyncio.run(agent.run("Plan my trip."))
    witness.notes.update(
        {
            "framework": "pydantic-ai",
            "model_calls": [{"tool": name, "arguments": args} for name, args in calls],
            "book_trip_arguments_unwrapped": unwrap_trip,
            # the model sent Trip's fields as the call's arguments (the schema it was shown)
            "single_object_parameter": ["book_trip"] if unwrap_trip else [],
            "tool_error_reported_as": "pydantic_ai.exceptions.ToolFailed",
            "output": result.output,
        }
    )


def current(provider: TracerProvider, witness: Witness) -> None:
    _run(witness, _settings(provider), _sync_tools(witness))
    witness.notes["instrumentation_version"] = 5


def legacy(provider: TracerProvider, witness: Witness) -> None:
    _run(witness, _settings(provider, version=2), _sync_tools(witness))
    witness.notes["instrumentation_version"] = 2


def validation(provider: TracerProvider, witness: Witness) -> None:
    _run(witness, _settings(provider), _sync_tools(witness), invalid_first=True)
    witness.notes.update({"instrumentation_version": 5, "rejected_calls": [{"tool": "get_weather", "id": "call_1"}]})


def intercept(provider: TracerProvider, witness: Witness) -> None:
    os.environ["TOOLWITNESS_TOOL_INTERCEPT"] = "true"
    _run(witness, _settings(provider), _intercept_tools(witness, provider))
    witness.notes.update({"instrumentation_version": 5, "boundary": "intercept_tool"})


def middleware(provider: TracerProvider, witness: Witness) -> None:
    os.environ["TOOLWITNESS_TOOL_INTERCEPT"] = "true"
    _run(witness, _settings(provider), _middleware_tools(witness, provider))
    witness.notes.update({"instrumentation_version": 5, "boundary": "make_tool_middleware"})


def wrapped(provider: TracerProvider, witness: Witness) -> None:
    _run(witness, _settings(provider), _sync_tools(witness), unwrap_trip=False)
    witness.notes["instrumentation_version"] = 5


#: the distributions whose versions a run records
PACKAGES = ("pydantic-ai-slim",)

SCENARIOS: dict[str, Callable[[TracerProvider, Witness], None]] = {
    "current": current,
    "legacy": legacy,
    "validation": validation,
    "intercept": intercept,
    "middleware": middleware,
    "wrapped": wrapped,
}
