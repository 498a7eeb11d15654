"""Conformance agents for LangChain / LangGraph: LangGraph's prebuilt ReAct agent with a scripted model.

Versions (the main virtualenv): langchain-core 1.8.1, langgraph 1.2.22 (langgraph-prebuilt 1.1.3),
openinference-instrumentation-langchain 0.1.80 (``LangChainInstrumentor``), OpenLLMetry's
opentelemetry-instrumentation-langchain 0.62.4 (``LangchainInstrumentor``).

The agent is ``langgraph.prebuilt.create_react_agent`` (LangGraph 1.x's successor,
``langchain.agents.create_agent``, lives in the ``langchain`` package, which is not installed) over a
``ToolNode`` holding the four tools as ``StructuredTool``s built from typed functions (``book_trip``
takes one parameter ``trip``, a nested ``TypedDict``, so LangChain validates it and passes the body a
plain dict). The model is ``ScriptedChatModel``, langchain-core's ``FakeMessagesListChatModel`` whose
``bind_tools`` returns itself: it answers with one ``AIMessage(tool_calls=[...])`` per SCRIPT call
(call ids ``call_1`` .. ``call_4``), then ``AIMessage(FINAL_ANSWER)``.

The failing tool: the ``ToolNode`` is built with ``handle_tool_errors=True`` (its default handler
re-raises anything but argument errors, which would abort the run), so ``fail_tool``'s exception goes
through LangChain's ``on_tool_error`` callbacks and then becomes a ``ToolMessage(status="error")`` the
model sees; the run continues to the final answer. The tools themselves keep ``handle_tool_error``
off (it would only catch ``ToolException`` and report the call as a success to the callbacks).

Scenarios: ``openinference`` / ``openllmetry`` / ``both`` (sync ``invoke``, sync tools);
``openinference_single_arg`` (as ``openinference``, but ``fail_tool`` is a classic single-input
``Tool``); ``intercept_async`` (async tools, ``ainvoke``, each body then reports its result through
``collector.boundary.intercept_tool``); ``middleware`` (async tools whose bodies run through
``collector.boundary.make_tool_middleware``). Extras: ``intercept_sync`` (``intercept_async`` with sync
tools and ``invoke``), ``intercept_async_openllmetry`` (``intercept_async`` under OpenLLMetry),
``openinference_handle_tool_error`` (the tool's own ``handle_tool_error``). The intercept scenarios
note in ``body_context`` which span each tool body ran under (OpenTelemetry's current span, and
OpenInference's ``get_current_span()``).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from _witness import FINAL_ANSWER, SCRIPT, ToolFailed, Witness
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool, StructuredTool, Tool, ToolException
from langgraph.prebuilt import ToolNode, create_react_agent
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from typing_extensions import TypedDict

SESSION_ID = "conf-session"

#: ``from`` is a Python keyword: the functional form keeps the JSON key as it is
Dates = TypedDict("Dates", {"from": str, "to": str})


class Trip(TypedDict):
    city: str
    dates: Dates
    travellers: list[str]


class ScriptedChatModel(FakeMessagesListChatModel):
    """langchain-core's fake chat model, able to be bound to tools (binding changes nothing)."""

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: str | None = None, **kwargs: Any) -> Runnable:
        return self


def scripted_model() -> ScriptedChatModel:
    turns: list[BaseMessage] = [
        AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call_{i}", "type": "tool_call"}])
        for i, (name, args) in enumerate(SCRIPT, start=1)
    ]
    return ScriptedChatModel(responses=[*turns, AIMessage(content=FINAL_ANSWER)])


# --------------------------------------------------------------------------------------------------
# Tools
# --------------------------------------------------------------------------------------------------

#: a tool body: (tool name, arguments) -> result (sync) or an awaitable of it (async)
Call = Callable[[str, dict[str, Any]], Any]
ACall = Callable[[str, dict[str, Any]], Awaitable[Any]]


def sync_tools(call: Call, *, classic_fail_tool: bool = False, tool_handles_error: bool = False) -> list[BaseTool]:
    def get_weather(city: str, units: str) -> str:
        """Current weather in a city."""
        return call("get_weather", {"city": city, "units": units})

    def book_trip(trip: Trip) -> str:
        """Book a trip (city, dates, travellers)."""
        return call("book_trip", {"trip": trip})

    def fail_tool(reason: str) -> str:
        """A tool that always fails."""
        return call("fail_tool", {"reason": reason})

    def send_email(to: str, body: str) -> str:
        """Send an email."""
        return call("send_email", {"to": to, "body": body})

    fail: BaseTool = (
        Tool.from_function(fail_tool, name="fail_tool", description="A tool that always fails (one string input).")
        if classic_fail_tool
        else StructuredTool.from_function(fail_tool)
    )
    if tool_handles_error:
        fail.handle_tool_error = True
    return [
        StructuredTool.from_function(get_weather),
        StructuredTool.from_function(book_trip),
        fail,
        StructuredTool.from_function(send_email),
    ]


def async_tools(call: ACall) -> list[BaseTool]:
    async def get_weather(city: str, units: str) -> str:
        """Current weather in a city."""
        return await call("get_weather", {"city": city, "units": units})

    async def book_trip(trip: Trip) -> str:
        """Book a trip (city, dates, travellers)."""
        return await call("book_trip", {"trip": trip})

    async def fail_tool(reason: str) -> str:
        """A tool that always fails."""
        return await call("fail_tool", {"reason": reason})

    async def send_email(to: str, body: str) -> str:
        """Send an email."""
        return await call("send_email", {"to": to, "body": body})

    return [StructuredTool.from_function(coroutine=f) for f in (get_weather, book_trip, fail_tool, send_email)]


def plain(w: Witness) -> Call:
    def call(name: str, arguments: dict[str, Any]) -> Any:
        return getattr(w, name)(**arguments)

    return call


def tool_exceptions(w: Witness) -> Call:
    """The bodies, a failure re-raised as LangChain's ``ToolException`` (what ``handle_tool_error`` catches)."""

    def call(name: str, arguments: dict[str, Any]) -> Any:
        try:
            return getattr(w, name)(**arguments)
        except ToolFailed as e:
            raise ToolException(str(e)) from e

    return call


def witness_dispatch(w: Witness) -> ACall:
    async def dispatch(name: str, arguments: dict[str, Any]) -> Any:
        return getattr(w, name)(**arguments)

    return dispatch


def _note_context(w: Witness, name: str) -> None:
    """Where a tool body runs, as OpenTelemetry sees it (the current span) and as OpenInference's
    ``get_current_span()`` (the span of the current LangChain run) sees it: evidence for how a
    boundary span made in the body gets its parent."""
    otel = trace.get_current_span().get_span_context()
    oi = None
    try:
        from openinference.instrumentation.langchain import LangChainInstrumentor, get_current_span

        if LangChainInstrumentor().is_instrumented_by_opentelemetry:
            oi = get_current_span()
    except Exception:
        pass
    oi_ctx = oi.get_span_context() if oi is not None else None
    w.notes.setdefault("body_context", []).append(
        {
            "tool": name,
            "otel_current_span": f"{otel.trace_id:032x}/{otel.span_id:016x}" if otel.is_valid else None,
            "openinference_current_span": f"{oi_ctx.trace_id:032x}/{oi_ctx.span_id:016x}" if oi_ctx else None,
        }
    )


def intercepting(w: Witness) -> ACall:
    """The body, then ``intercept_tool`` with its result (a failure: ``error=`` the exception, re-raised)."""
    from collector.boundary import intercept_tool

    async def call(name: str, arguments: dict[str, Any]) -> Any:
        _note_context(w, name)
        try:
            result = getattr(w, name)(**arguments)
        except ToolFailed as e:
            await intercept_tool(
                tool_name=name,
                tool_arguments=json.dumps(arguments),
                result={"error": str(e)},
                error=e,
                session_id=SESSION_ID,
            )
            raise
        return await intercept_tool(
            tool_name=name, tool_arguments=json.dumps(arguments), result=result, session_id=SESSION_ID
        )

    return call


def intercepting_sync(w: Witness) -> Call:
    """``intercepting`` for a sync tool body (``asyncio.run``: the sync agent runs no event loop)."""
    acall = intercepting(w)

    def call(name: str, arguments: dict[str, Any]) -> Any:
        return asyncio.run(acall(name, arguments))

    return call


# --------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------


def build_agent(tools: list[BaseTool]) -> Any:
    return create_react_agent(scripted_model(), ToolNode(tools, handle_tool_errors=True))


def _note_result(w: Witness, result: dict[str, Any]) -> None:
    messages = result["messages"]
    w.notes["tool_error_handling"] = "ToolNode(handle_tool_errors=True): the exception becomes a ToolMessage"
    w.notes["tool_messages"] = [
        {"name": m.name, "tool_call_id": m.tool_call_id, "status": m.status, "content": m.content}
        for m in messages
        if isinstance(m, ToolMessage)
    ]
    w.notes["final_answer"] = messages[-1].content
    w.notes["aborted_on_error"] = False


def run_sync(w: Witness, tools: list[BaseTool]) -> None:
    result = build_agent(tools).invoke({"messages": [HumanMessage("plan my trip")]})
    _note_result(w, result)


def run_async(w: Witness, tools: list[BaseTool]) -> None:
    async def main() -> dict[str, Any]:
        return await build_agent(tools).ainvoke({"messages": [HumanMessage("plan my trip")]})

    _note_result(w, asyncio.run(main()))


def _openinference() -> Any:
    from openinference.instrumentation.langchain import LangChainInstrumentor

    return LangChainInstrumentor()


def _openllmetry() -> Any:
    os.environ.setdefault("TRACELOOP_TRACE_CONTENT", "true")
    from opentelemetry.instrumentation.langchain import LangchainInstrumentor

    return LangchainInstrumentor()


def instrumented(provider: TracerProvider, *factories: Callable[[], Any]) -> Callable[[Callable[[], None]], None]:
    def run(body: Callable[[], None]) -> None:
        instrumentors = [f() for f in factories]
        for i in instrumentors:
            i.instrument(tracer_provider=provider)
        try:
            body()
        finally:
            for i in reversed(instrumentors):
                i.uninstrument()

    return run


# --------------------------------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------------------------------


def openinference(provider: TracerProvider, w: Witness) -> None:
    w.notes["instrumentation"] = "openinference"
    instrumented(provider, _openinference)(lambda: run_sync(w, sync_tools(plain(w))))


def openllmetry(provider: TracerProvider, w: Witness) -> None:
    w.notes["instrumentation"] = "openllmetry"
    instrumented(provider, _openllmetry)(lambda: run_sync(w, sync_tools(plain(w))))


def both(provider: TracerProvider, w: Witness) -> None:
    w.notes["instrumentation"] = "openinference+openllmetry"
    instrumented(provider, _openinference, _openllmetry)(lambda: run_sync(w, sync_tools(plain(w))))


def openinference_single_arg(provider: TracerProvider, w: Witness) -> None:
    w.notes["instrumentation"] = "openinference"
    w.notes["fail_tool_type"] = "langchain_core.tools.Tool (classic single string input)"
    instrumented(provider, _openinference)(lambda: run_sync(w, sync_tools(plain(w), classic_fail_tool=True)))


def openinference_handle_tool_error(provider: TracerProvider, w: Witness) -> None:
    """Extra: the tool's own ``handle_tool_error=True`` (its body raises ``ToolException``) instead of
    the ToolNode's: LangChain then ends the tool run as a success whose ToolMessage says ``status="error"``."""
    w.notes["instrumentation"] = "openinference"
    w.notes["fail_tool_error_handling"] = "StructuredTool(handle_tool_error=True), body raises ToolException"
    instrumented(provider, _openinference)(lambda: run_sync(w, sync_tools(tool_exceptions(w), tool_handles_error=True)))


def intercept_async(provider: TracerProvider, w: Witness) -> None:
    os.environ["TOOLWITNESS_TOOL_INTERCEPT"] = "true"
    w.notes["instrumentation"] = "openinference+intercept_tool"
    instrumented(provider, _openinference)(lambda: run_async(w, async_tools(intercepting(w))))


def intercept_sync(provider: TracerProvider, w: Witness) -> None:
    """Extra: ``intercept_async`` with sync tools and ``invoke`` (is a lost parent async-only?)."""
    os.environ["TOOLWITNESS_TOOL_INTERCEPT"] = "true"
    w.notes["instrumentation"] = "openinference+intercept_tool (sync tools, asyncio.run)"
    instrumented(provider, _openinference)(lambda: run_sync(w, sync_tools(intercepting_sync(w))))


def intercept_async_openllmetry(provider: TracerProvider, w: Witness) -> None:
    """Extra: ``intercept_async`` under OpenLLMetry (which makes its spans current)."""
    os.environ["TOOLWITNESS_TOOL_INTERCEPT"] = "true"
    w.notes["instrumentation"] = "openllmetry+intercept_tool"
    instrumented(provider, _openllmetry)(lambda: run_async(w, async_tools(intercepting(w))))


def middleware(provider: TracerProvider, w: Witness) -> None:
    from collector.boundary import make_tool_middleware

    os.environ["TOOLWITNESS_TOOL_INTERCEPT"] = "true"
    w.notes["instrumentation"] = "openinference+make_tool_middleware"
    call = make_tool_middleware(witness_dispatch(w), session_id=SESSION_ID)
    instrumented(provider, _openinference)(lambda: run_async(w, async_tools(call)))


#: the distributions whose versions a run records
PACKAGES = (
    "langchain-core",
    "langgraph",
    "openinference-instrumentation-langchain",
    "opentelemetry-instrumentation-langchain",
)

SCENARIOS: dict[str, Callable[[TracerProvider, Witness], None]] = {
    "openinference": openinference,
    "openllmetry": openllmetry,
    "both": both,
    "openinference_single_arg": openinference_single_arg,
    "intercept_async": intercept_async,
    "middleware": middleware,
    "intercept_sync": intercept_sync,
    "intercept_async_openllmetry": intercept_async_openllmetry,
    "openinference_handle_tool_error": openinference_handle_tool_error,
}
