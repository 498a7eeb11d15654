"""OpenAI Agents SDK (``openai-agents`` 0.24.0) under its two OpenTelemetry instrumentations.

``openinference``: Arize's ``openinference-instrumentation-openai-agents`` 2.6.0; ``openllmetry``: Traceloop's
``opentelemetry-instrumentation-openai-agents`` 0.62.4. Both are trace *processors* of the SDK's own tracing
(``agents.tracing``): they turn its agent/generation/function/handoff spans into OTel spans. The SDK's default
processor (which exports to OpenAI's backend) is removed first with ``set_trace_processors([])`` and both
instrumentors replace the processor list with their own, so nothing leaves the process.

The model is the SDK's own test double, ``agents.testing.ScriptedModel``, wrapped so that each turn leaves the
span the SDK's default model (``OpenAIResponsesModel``) leaves: a ``response`` span holding the turn's input items
and a ``Response`` (model ``scripted-responses``) whose output items are the scripted ones. One ``function_call``
per turn, in ``SCRIPT`` order with call ids ``call_1``..``call_4``, then the text ``FINAL_ANSWER``. The tools are
``function_tool``-decorated async functions with typed signatures (``book_trip(trip: Trip)``, a nested
``TypedDict``), so the SDK builds a strict JSON schema, validates the model's arguments against it and calls the
body with plain values. ``fail_tool`` raises; the SDK's default ``failure_error_function`` turns that into an
error message for the model (and redacts the error text on the span), so the run continues
(``witness.notes["aborted_on_error"] = False``).

Scenarios:
  ``openinference`` / ``openllmetry``: one agent running the SCRIPT.
  ``openinference_handoff`` / ``openllmetry_handoff``: a ``triage`` agent whose model first calls the SDK's
  handoff tool (``transfer_to_worker``, ``handoffs=[worker]``); ``worker`` then runs the SCRIPT.
  ``intercept``: ``openinference`` with every tool also reporting itself through
  ``collector.boundary.intercept_tool`` (``TOOLWITNESS_TOOL_INTERCEPT=true``, no poisoning endpoint).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

from _witness import FINAL_ANSWER, SCRIPT, ToolFailed, Witness
from agents import Agent, FunctionTool, ModelResponse, Runner, function_tool, response_span, set_trace_processors
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from openai.types.responses import Response, ResponseUsage
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
from opentelemetry.sdk.trace import TracerProvider
from typing_extensions import TypedDict

SESSION_ID = "conf-session"
MODEL_NAME = "scripted-responses"
Dates = TypedDict("Dates", {"from": str, "to": str})


class Trip(TypedDict):
    """A trip to book."""

    city: str
    dates: Dates
    travellers: list[str]


#: what a tool reports besides returning: (tool name, arguments as the body got them, result, the
#: exception if it failed) -> result
Report = Callable[..., Awaitable[Any]]


async def _no_report(tool: str, arguments: dict[str, Any], result: Any, error: BaseException | None = None) -> Any:
    return result


async def _intercept(tool: str, arguments: dict[str, Any], result: Any, error: BaseException | None = None) -> Any:
    from collector.boundary import intercept_tool

    return await intercept_tool(
        tool_name=tool, tool_arguments=json.dumps(arguments), result=result, error=error, session_id=SESSION_ID
    )


def _tools(witness: Witness, report: Report) -> list[FunctionTool]:
    """The four Witness bodies as the SDK's function tools (each body runs, then ``report`` sees it)."""

    @function_tool
    async def get_weather(city: str, units: str) -> str:
        """Current weather for a city.

        Args:
            city: The city.
            units: metric or imperial.
        """
        return await report("get_weather", {"city": city, "units": units}, witness.get_weather(city, units))

    @function_tool
    async def book_trip(trip: Trip) -> str:
        """Book a trip.

        Args:
            trip: The trip: city, dates (from/to) and travellers.
        """
        return await report("book_trip", {"trip": trip}, witness.book_trip(trip))

    @function_tool
    async def fail_tool(reason: str) -> str:
        """A tool that always fails.

        Args:
            reason: Why it fails.
        """
        try:
            result = witness.fail_tool(reason)
        except ToolFailed as e:
            await report("fail_tool", {"reason": reason}, {"error": str(e)}, error=e)
            raise
        return await report("fail_tool", {"reason": reason}, result)

    @function_tool
    async def send_email(to: str, body: str) -> str:
        """Send an email.

        Args:
            to: The recipient.
            body: The text.
        """
        return await report("send_email", {"to": to, "body": body}, witness.send_email(to, body))

    return [get_weather, book_trip, fail_tool, send_email]


class ResponsesScriptedModel(ScriptedModel):
    """``ScriptedModel`` leaving the span the SDK's default model (``OpenAIResponsesModel``) leaves: a ``response``
    span holding the request's input items and the ``Response`` (its ``output`` items: the scripted calls)."""

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        tracing = args[5] if len(args) > 5 else kwargs["tracing"]
        with response_span(disabled=tracing.is_disabled()) as span:
            result = await super().get_response(system_instructions, input, *args, **kwargs)
            usage = ResponseUsage(
                input_tokens=1,
                output_tokens=1,
                total_tokens=2,
                input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
                output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
            )
            span.span_data.usage = {"requests": 1, "input_tokens": 1, "output_tokens": 1, "total_tokens": 2}
            if tracing.include_data():
                span.span_data.response = Response(
                    id=result.response_id or "resp",
                    created_at=0,
                    model=MODEL_NAME,
                    object="response",
                    instructions=system_instructions,
                    output=list(result.output),
                    tool_choice="auto",
                    tools=[],
                    top_p=None,
                    parallel_tool_calls=False,
                    status="completed",
                    usage=usage,
                )
                span.span_data.input = input
        return result


def _script_steps() -> list[ModelStep]:
    steps = [
        ModelStep(output=[function_call(name, args, call_id=f"call_{i}")], response_id=f"resp_{i}")
        for i, (name, args) in enumerate(SCRIPT, 1)
    ]
    return [*steps, ModelStep(output=[assistant_message(FINAL_ANSWER)], response_id="resp_final")]


def _run(witness: Witness, *, handoff: bool, report: Report = _no_report) -> None:
    worker = Agent(
        name="worker",
        instructions="Use the tools.",
        model=ResponsesScriptedModel(_script_steps()),
        tools=list(_tools(witness, report)),
    )
    start = worker
    if handoff:
        handoff_call = function_call("transfer_to_worker", {}, call_id="call_handoff")
        triage_model = ResponsesScriptedModel([ModelStep(output=[handoff_call], response_id="resp_handoff")])
        start = Agent(name="triage", instructions="Hand off to the worker.", model=triage_model, handoffs=[worker])
        witness.notes["handoff"] = True
    result = asyncio.run(Runner.run(start, "Plan my trip.", max_turns=12))
    witness.notes["final_output"] = result.final_output
    witness.notes["aborted_on_error"] = False
    witness.notes["last_agent"] = result.last_agent.name
    worker_model = worker.model
    assert isinstance(worker_model, ScriptedModel)
    worker_model.assert_complete()


def _openinference(provider: TracerProvider, witness: Witness, *, handoff: bool, report: Report = _no_report) -> None:
    from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor

    set_trace_processors([])  # the SDK's default processor exports to OpenAI
    instrumentor = OpenAIAgentsInstrumentor()
    instrumentor.instrument(tracer_provider=provider)  # exclusive_processor (default): replaces the list
    try:
        _run(witness, handoff=handoff, report=report)
    finally:
        instrumentor.uninstrument()
        set_trace_processors([])


def _openllmetry(provider: TracerProvider, witness: Witness, *, handoff: bool) -> None:
    from opentelemetry.instrumentation.openai_agents import OpenAIAgentsInstrumentor

    os.environ.setdefault("TRACELOOP_METRICS_ENABLED", "false")
    set_trace_processors([])
    instrumentor = OpenAIAgentsInstrumentor(replace_existing_processors=True)
    instrumentor.instrument(tracer_provider=provider)
    try:
        _run(witness, handoff=handoff)
    finally:
        instrumentor.uninstrument()  # leaves its processor registered: take it out by hand
        set_trace_processors([])


def openinference(provider: TracerProvider, witness: Witness) -> None:
    _openinference(provider, witness, handoff=False)


def openllmetry(provider: TracerProvider, witness: Witness) -> None:
    _openllmetry(provider, witness, handoff=False)


def openinference_handoff(provider: TracerProvider, witness: Witness) -> None:
    _openinference(provider, witness, handoff=True)


def openllmetry_handoff(provider: TracerProvider, witness: Witness) -> None:
    _openllmetry(provider, witness, handoff=True)


def intercept(provider: TracerProvider, witness: Witness) -> None:
    os.environ["TOOLWITNESS_TOOL_INTERCEPT"] = "true"
    os.environ.pop("TOOLWITNESS_POISONING_ENDPOINT", None)
    witness.notes["intercept"] = True
    _openinference(provider, witness, handoff=False, report=_intercept)


#: the distributions whose versions a run records
PACKAGES = (
    "openai-agents",
    "openinference-instrumentation-openai-agents",
    "opentelemetry-instrumentation-openai-agents",
)

SCENARIOS: dict[str, Callable[[TracerProvider, Witness], None]] = {
    "openinference": openinference,
    "openllmetry": openllmetry,
    "openinference_handoff": openinference_handoff,
    "openllmetry_handoff": openllmetry_handoff,
    "intercept": intercept,
}
