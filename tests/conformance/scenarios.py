"""Every framework x instrumentation the conformance suite runs, and what each does not record.

``gaps`` maps a check category (``checks.CATEGORIES``) to why that framework's spans cannot
decide it: the only UNDETERMINED a conformance run may give. The compatibility matrix
(``docs/compatibility.md``) is generated from these and the runs' results.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Scenario:
    module: str
    scenario: str
    framework: str
    instrumentation: str
    #: ``venvs.MAIN`` or a requirements file's name under ``requirements/``
    venv: str = "main"
    gaps: dict[str, str] = field(default_factory=dict)
    #: what the scenario exercises beyond the common script
    about: str = ""
    env: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.module}.{self.scenario}"

    def environment(self) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLWITNESS_", "OTEL_"))}
        return {**keep, "PYTHONHASHSEED": "0", **self.env}


_ADK_NO_CONTENT = (
    "ADK's default schema records no arguments unless content capture is on "
    "(OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY or SPAN_AND_EVENT)"
)
_LC_BARE = (
    "OpenInference LangChain records a tool's one string argument as the bare value, without the "
    "parameter's name (fail_tool's reason): not matchable"
)
_CREW_WRAPPERS = (
    "the wrappers miss tools CrewAI runs on its text (ReAct) path, so no absence is provable on a trace "
    "they write, nor a FALSE resting on one; CrewAIInstrumentor(use_event_listener=True) records that path"
)
_CREW_REACT = "the wrappers record no tool span on CrewAI's text (ReAct) path: use_event_listener=True"
_CREW_EVENTS = (
    "a tool-usage event stands for up to two runs of the tool body (a retry with unfiltered arguments) "
    "or for a cached result: how often, and in which order, tools ran is not provable"
)
_ADK = "Google ADK"
_LC = "LangChain / LangGraph"
_OAI = "OpenAI Agents SDK"
_OI = "OpenInference"
_OLL = "OpenLLMetry"


def _gaps(why: str, *categories: str) -> dict[str, str]:
    return dict.fromkeys(categories, why)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("pydantic_ai_native", "current", "pydantic-ai", "native (instrumentation version 5)"),
    Scenario("pydantic_ai_native", "legacy", "pydantic-ai", "native (instrumentation version 2)"),
    Scenario(
        "pydantic_ai_native",
        "validation",
        "pydantic-ai",
        "native",
        about="a call rejected by argument validation (the body never ran)",
    ),
    Scenario(
        "pydantic_ai_native",
        "wrapped",
        "pydantic-ai",
        "native",
        about="the model sends the one object parameter wrapped in its name",
    ),
    Scenario("pydantic_ai_native", "intercept", "pydantic-ai", "native + intercept_tool"),
    Scenario("pydantic_ai_native", "middleware", "pydantic-ai", "native + make_tool_middleware"),
    Scenario("openai_agents", "openinference", _OAI, _OI),
    Scenario("openai_agents", "openinference_handoff", _OAI, _OI, about="a handoff between two agents"),
    Scenario("openai_agents", "openllmetry", _OAI, _OLL),
    Scenario("openai_agents", "openllmetry_handoff", _OAI, _OLL, about="a handoff between two agents"),
    Scenario("openai_agents", "intercept", _OAI, f"{_OI} + intercept_tool"),
    Scenario("langchain_agents", "openinference", _LC, _OI, gaps=_gaps(_LC_BARE, "arguments", "arguments_mismatch")),
    Scenario(
        "langchain_agents",
        "openinference_single_arg",
        _LC,
        _OI,
        about="a classic single-input Tool",
        gaps=_gaps(_LC_BARE, "arguments", "arguments_mismatch"),
    ),
    Scenario(
        "langchain_agents",
        "openinference_handle_tool_error",
        _LC,
        _OI,
        about="the tool's own handle_tool_error: the span ends OK, its ToolMessage says error",
        gaps=_gaps(_LC_BARE, "arguments", "arguments_mismatch"),
    ),
    Scenario("langchain_agents", "openllmetry", _LC, _OLL),
    Scenario(
        "langchain_agents",
        "both",
        _LC,
        f"{_OI} + {_OLL}",
        about="two instrumentations on one app: each call recorded twice",
        gaps=_gaps(_LC_BARE, "arguments_mismatch"),
    ),
    Scenario(
        "langchain_agents",
        "intercept_async",
        _LC,
        f"{_OI} + intercept_tool (async tools)",
        gaps=_gaps(_LC_BARE, "arguments_mismatch"),
    ),
    Scenario(
        "langchain_agents",
        "intercept_sync",
        _LC,
        f"{_OI} + intercept_tool (sync tools)",
        gaps=_gaps(_LC_BARE, "arguments_mismatch"),
    ),
    Scenario("langchain_agents", "intercept_async_openllmetry", _LC, f"{_OLL} + intercept_tool"),
    Scenario(
        "langchain_agents",
        "middleware",
        _LC,
        f"{_OI} + make_tool_middleware",
        gaps=_gaps(_LC_BARE, "arguments_mismatch"),
    ),
    Scenario("smolagents_oi", "openinference", "smolagents", _OI),
    Scenario("llamaindex_oi", "openinference", "LlamaIndex", _OI),
    Scenario(
        "adk_agents",
        "native_default",
        _ADK,
        "native (default settings)",
        venv="adk",
        gaps=_gaps(_ADK_NO_CONTENT, "arguments", "arguments_mismatch"),
    ),
    Scenario(
        "adk_agents",
        "native_content",
        _ADK,
        "native, content capture on",
        venv="adk",
        about="one call without an id from the model",
    ),
    Scenario("adk_agents", "native_legacy", _ADK, "native, legacy schema", venv="adk"),
    Scenario(
        "adk_agents",
        "native_parallel",
        _ADK,
        "native, content capture on",
        venv="adk",
        about="two calls in one model turn (the aggregate span)",
    ),
    Scenario(
        "adk_agents",
        "native_legacy_parallel",
        _ADK,
        "native, legacy schema",
        venv="adk",
        about="two calls in one model turn (the aggregate span)",
    ),
    Scenario(
        "adk_agents",
        "native_error_callback",
        _ADK,
        "native, content capture on",
        venv="adk",
        about="on_tool_error_callback: the run goes on after the failing tool",
    ),
    Scenario("adk_agents", "openinference", _ADK, _OI, venv="adk"),
    Scenario(
        "crewai_oi",
        "openinference",
        "CrewAI",
        f"{_OI} (wrappers)",
        venv="crewai",
        about="native tool calling",
        gaps=_gaps(_CREW_WRAPPERS, "absence", "never", "status", "count", "arguments_mismatch", "sequence"),
    ),
    Scenario(
        "crewai_oi",
        "openinference_react",
        "CrewAI",
        f"{_OI} (wrappers)",
        venv="crewai",
        about="the text (ReAct) tool path",
        gaps=_gaps(
            _CREW_REACT, "ran", "never", "count", "status", "absence", "arguments", "arguments_mismatch", "sequence"
        ),
    ),
    Scenario(
        "crewai_oi",
        "openinference_events",
        "CrewAI",
        f"{_OI} (event listener)",
        venv="crewai",
        about="native tool calling",
        gaps=_gaps(_CREW_EVENTS, "count", "sequence"),
    ),
    Scenario(
        "crewai_oi",
        "openinference_react_events",
        "CrewAI",
        f"{_OI} (event listener)",
        venv="crewai",
        about="the text (ReAct) tool path",
        gaps=_gaps(_CREW_EVENTS, "count", "sequence"),
    ),
)
