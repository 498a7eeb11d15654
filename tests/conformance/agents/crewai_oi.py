"""CrewAI 1.15.30 instrumented by openinference-instrumentation-crewai 1.1.21 (OpenTelemetry SDK 1.45.2).

Runs in CrewAI's own virtualenv (``/tmp/cv/crewai``): one ``Agent`` holding the four Witness tools
(``crewai.tools.BaseTool`` subclasses with pydantic ``args_schema``; ``book_trip`` takes one ``trip``
that is a nested model, dumped back to the plain dict by CrewAI's own validation), one ``Task``, one
``Crew``, ``crew.kickoff()``. The model is ``_ScriptedLLM``, a subclass of CrewAI's ``BaseLLM``:

- ``openinference``: native function calling (``supports_function_calling() is True``, CrewAI's
  default path for tool-calling models). Each turn returns one OpenAI-style tool call dict
  (``{"id", "type": "function", "function": {"name", "arguments": json}}``); CrewAI's
  ``AgentExecutor._execute_single_native_tool_call`` runs it through ``BaseTool.run`` (validation against
  ``args_schema``, then ``_run``), which is what the instrumentation wraps. A raising tool becomes the
  ``"Error executing tool: ..."`` tool message the model sees next; the run goes on.
- ``openinference_react``: the text (ReAct) path (``supports_function_calling() is False``): each turn
  returns ``Thought/Action/Action Input`` text that CrewAI's parser and ``ToolUsage`` turn into a call of
  ``CrewStructuredTool.invoke`` (which calls ``BaseTool._run``, not the wrapped ``BaseTool.run``).
  ``ToolUsage`` re-invokes a raising tool (an inner retry with the unfiltered arguments, and up to three
  ``use`` attempts), so the truth holds every run of the ``fail_tool`` body.
- ``openinference_events`` / ``openinference_react_events``: the same two runs with the instrumentor's
  other mode, ``instrument(use_event_listener=True)``: spans built from CrewAI's event bus
  (``ToolUsageStarted/Finished/ErrorEvent``, ``LLMCall*Event``) instead of wrapped methods.

The scripted model emits ``LLMCallStartedEvent``/``LLMCallCompletedEvent`` in an ``llm_call_context`` as
CrewAI's own providers do (only the event-listener mode turns them into LLM spans).
CrewAI's own telemetry, its tracing to its platform, and its last-run recording are switched off by
environment (set before CrewAI is imported); the tool cache is CrewAI's default (off: ``Crew.cache`` is
opt-in). Every model turn's input messages (roles and tool results) go to ``witness.notes``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from typing import Any, Literal

from _witness import FINAL_ANSWER, SCRIPT, Witness
from opentelemetry.sdk.trace import TracerProvider
from pydantic import BaseModel, ConfigDict, Field

# CrewAI reads these when it is imported (anonymous telemetry to its host, platform tracing, the
# first-run prompt, files written in the working directory): set them first, never to the network.
_QUIET_ENV = {
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_DISABLE_TRACKING": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "CREWAI_TESTING": "true",
    "OPENAI_API_KEY": "sk-conformance-dummy",
}


def _quiet_crewai() -> None:
    for key, value in _QUIET_ENV.items():
        os.environ.setdefault(key, value)
    # a project name for appdirs; absolute, so anything CrewAI stores lands there, not under ~/.local/share
    os.environ.setdefault("CREWAI_STORAGE_DIR", os.path.join(tempfile.gettempdir(), "crewai-conformance"))
    os.environ.pop("OTEL_SDK_DISABLED", None)  # it would also switch off the SDK provider we read


class _WeatherArgs(BaseModel):
    city: str = Field(description="the city to look up")
    units: Literal["metric", "imperial"] = Field(description="unit system")


class _Dates(BaseModel):
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)
    from_: str = Field(alias="from", description="first day, ISO date")
    to: str = Field(description="last day, ISO date")


class _Trip(BaseModel):
    city: str
    dates: _Dates
    travellers: list[str]


class _BookTripArgs(BaseModel):
    trip: _Trip = Field(description="the trip to book")


class _FailArgs(BaseModel):
    reason: str = Field(description="why it fails")


class _EmailArgs(BaseModel):
    to: str = Field(description="recipient address")
    body: str = Field(description="message text")


def _tools(witness: Witness) -> list[Any]:
    """The four Witness bodies as CrewAI ``BaseTool`` subclasses (``_run`` calls the body)."""
    from crewai.tools import BaseTool
    from pydantic import PrivateAttr

    class _WitnessTool(BaseTool):
        _witness: Witness = PrivateAttr()

        def bind(self, w: Witness) -> _WitnessTool:
            self._witness = w
            return self

    class GetWeather(_WitnessTool):
        name: str = "get_weather"
        description: str = "Current weather in a city."
        args_schema: type[BaseModel] = _WeatherArgs

        def _run(self, city: str, units: str) -> str:
            return self._witness.get_weather(city=city, units=units)

    class BookTrip(_WitnessTool):
        name: str = "book_trip"
        description: str = "Book a trip (city, dates, travellers)."
        args_schema: type[BaseModel] = _BookTripArgs

        def _run(self, trip: dict[str, Any]) -> str:
            return self._witness.book_trip(trip=trip)

    class FailTool(_WitnessTool):
        name: str = "fail_tool"
        description: str = "A tool that always fails."
        args_schema: type[BaseModel] = _FailArgs

        def _run(self, reason: str) -> str:
            return self._witness.fail_tool(reason=reason)

    class SendEmail(_WitnessTool):
        name: str = "send_email"
        description: str = "Send an email."
        args_schema: type[BaseModel] = _EmailArgs

        def _run(self, to: str, body: str) -> str:
            return self._witness.send_email(to=to, body=body)

    return [cls().bind(witness) for cls in (GetWeather, BookTrip, FailTool, SendEmail)]


def _scripted_llm(witness: Witness, *, native: bool) -> Any:
    """A ``BaseLLM`` that answers turn ``i`` with ``SCRIPT[i]`` (a native tool call or ReAct text),
    then with the final answer; it records what each turn was shown."""
    from crewai.events.types.llm_events import LLMCallType
    from crewai.llms.base_llm import BaseLLM, llm_call_context

    turns: list[dict[str, Any]] = []
    witness.notes["model_turns"] = turns

    class _ScriptedLLM(BaseLLM):
        def call(
            self,
            messages: Any,
            tools: Any = None,
            callbacks: Any = None,
            available_functions: Any = None,
            from_task: Any = None,
            from_agent: Any = None,
            response_model: Any = None,
            **kwargs: Any,
        ) -> Any:
            # as CrewAI's own providers do: one call scope, with its started / completed events
            with llm_call_context():
                self._emit_call_started_event(
                    messages=messages,
                    tools=tools,
                    callbacks=callbacks,
                    available_functions=available_functions,
                    from_task=from_task,
                    from_agent=from_agent,
                )
                answer = self._answer(messages, tools, available_functions)
                self._emit_call_completed_event(
                    response=answer,
                    call_type=LLMCallType.TOOL_CALL if isinstance(answer, list) else LLMCallType.LLM_CALL,
                    from_task=from_task,
                    from_agent=from_agent,
                    messages=messages,
                )
            return answer

        def _answer(self, messages: Any, tools: Any, available_functions: Any) -> Any:
            step = len(turns)
            seen = messages if isinstance(messages, list) else [{"role": "user", "content": messages}]
            turns.append(
                {
                    "tools_offered": sorted(t.get("function", t).get("name", "?") for t in tools or []),
                    "available_functions": available_functions is not None,
                    "last_messages": [
                        {k: m.get(k) for k in ("role", "name", "tool_call_id", "content") if m.get(k) is not None}
                        for m in seen[-2:]
                        if m.get("role") != "system"
                    ],
                }
            )
            if step >= len(SCRIPT):
                return FINAL_ANSWER if native else f"Thought: I know the answer.\nFinal Answer: {FINAL_ANSWER}"
            name, arguments = SCRIPT[step]
            if native:
                call_id = f"call_{step + 1}"
                return [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments)},
                    }
                ]
            return f"Thought: step {step + 1}.\nAction: {name}\nAction Input: {json.dumps(arguments)}"

        def supports_function_calling(self) -> bool:
            return native

        def supports_stop_words(self) -> bool:
            return not native

        def get_context_window_size(self) -> int:
            return 128_000

    return _ScriptedLLM(model="scripted-conformance")


def _run(provider: TracerProvider, witness: Witness, *, native: bool, events: bool = False) -> None:
    _quiet_crewai()
    from crewai import Agent, Crew, Process, Task
    from openinference.instrumentation.crewai import CrewAIInstrumentor

    instrumentor = CrewAIInstrumentor()
    if events:
        instrumentor.instrument(tracer_provider=provider, use_event_listener=True)
    else:
        instrumentor.instrument(tracer_provider=provider)
    try:
        agent = Agent(
            role="Travel agent",
            goal="Check the weather, book the trip, and report.",
            backstory="A scripted conformance agent.",
            tools=_tools(witness),
            llm=_scripted_llm(witness, native=native),
            allow_delegation=False,
            max_iter=10,
            verbose=False,
        )
        task = Task(
            description="Check the weather in Paris, book a trip to Rome, check the weather there, call fail_tool.",
            expected_output="The word done.",
            agent=agent,
        )
        crew = Crew(agents=[agent], tasks=[task], process=Process.sequential, verbose=False)
        output = crew.kickoff()
        witness.notes["final_output"] = str(output.raw)
        witness.notes["native_tool_calling"] = native
        witness.notes["instrumentation_mode"] = "event_listener" if events else "wrappers"
        witness.notes["tool_body_runs"] = {
            tool: sum(1 for c in witness.calls if c["tool"] == tool)
            for tool in ("get_weather", "book_trip", "fail_tool")
        }
    finally:
        instrumentor.uninstrument()


#: the distributions whose versions a run records
PACKAGES = (
    "crewai",
    "openinference-instrumentation-crewai",
    "opentelemetry-sdk",
)

SCENARIOS: dict[str, Callable[[TracerProvider, Witness], None]] = {
    "openinference": lambda provider, witness: _run(provider, witness, native=True),
    "openinference_react": lambda provider, witness: _run(provider, witness, native=False),
    "openinference_events": lambda provider, witness: _run(provider, witness, native=True, events=True),
    "openinference_react_events": lambda provider, witness: _run(provider, witness, native=False, events=True),
}
