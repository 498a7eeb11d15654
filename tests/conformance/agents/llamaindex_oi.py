"""LlamaIndex ``FunctionAgent`` traced by OpenInference's ``LlamaIndexInstrumentor``.

Versions: llama-index-core 0.14.25 (llama-index-workflows 2.26.1), openinference-instrumentation-llama-index
4.6.1 (main virtualenv). The instrumentor hooks LlamaIndex's own instrumentation dispatcher (span and event
handlers), not the callback manager.

Scenario ``openinference``: a ``FunctionAgent`` (``llama_index.core.agent.workflow``, the workflow-based
function-calling agent) offered the four witness tools, each the Witness's bound method wrapped by
``FunctionTool.from_defaults`` (the schema comes from the typed signature: ``book_trip(trip: dict)`` gives an
``object`` parameter). The workflow is async; the scenario drives it with ``asyncio.run``.

The model is the core's own test LLM, ``llama_index.core.llms.MockFunctionCallingLLM``, given a
``response_generator`` that answers each model turn with one assistant ``ChatMessage`` holding one
``ToolCallBlock`` (id ``call_<n>``, dict arguments): the SCRIPT calls in order, then a plain text message
``FINAL_ANSWER`` that ends the run. The agent streams (its default), so the mock's ``astream_chat`` is used.

``fail_tool`` raising is caught by the agent (``BaseWorkflowAgent._call_tool``), which turns it into a
``ToolOutput(is_error=True)`` whose text is fed back to the model as the tool message; the run goes on
(``witness.notes`` says what the model saw).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from _witness import FINAL_ANSWER, SCRIPT, Witness
from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.llms import MockFunctionCallingLLM
from llama_index.core.tools import FunctionTool
from openinference.instrumentation.llama_index import LlamaIndexInstrumentor
from opentelemetry.sdk.trace import TracerProvider


def _tools(witness: Witness) -> list[FunctionTool]:
    """The four witness tools (bound methods) as LlamaIndex function tools."""
    return [
        FunctionTool.from_defaults(
            fn=witness.get_weather, name="get_weather", description="Get the current weather in a city."
        ),
        FunctionTool.from_defaults(
            fn=witness.book_trip,
            name="book_trip",
            description='Book a trip: an object with "city", "dates" ({"from", "to"}) and "travellers" (names).',
        ),
        FunctionTool.from_defaults(fn=witness.fail_tool, name="fail_tool", description="A tool that always fails."),
        FunctionTool.from_defaults(fn=witness.send_email, name="send_email", description="Send an email."),
    ]


def _scripted(witness: Witness) -> Callable[..., ChatMessage]:
    """A ``response_generator`` for the mock LLM: the next SCRIPT call per model turn, then the final text."""
    turn = 0

    def respond(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        nonlocal turn
        if turn > 0:  # what the agent fed back about the previous call
            last = messages[-1]
            witness.notes.setdefault("model_saw_after_call", []).append(
                {"role": str(last.role.value), "content": str(last.content)[:300]}
            )
        if tools := kwargs.get("tools"):
            witness.notes["tools_offered_to_model"] = [t.metadata.get_name() for t in tools]
        turn += 1
        if turn > len(SCRIPT):
            return ChatMessage(role=MessageRole.ASSISTANT, content=FINAL_ANSWER)
        name, arguments = SCRIPT[turn - 1]
        call = ToolCallBlock(tool_call_id=f"call_{turn}", tool_name=name, tool_kwargs=arguments)
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=[call])

    return respond


async def _run(witness: Witness) -> None:
    agent = FunctionAgent(
        name="conformance_agent",
        description="Runs the conformance script.",
        tools=_tools(witness),
        llm=MockFunctionCallingLLM(response_generator=_scripted(witness)),
        system_prompt="You are a helpful travel agent.",
    )
    handler = agent.run(user_msg="Check the weather in Paris, book a trip to Rome, check Rome, then call fail_tool.")
    tool_results = []
    async for event in handler.stream_events():
        if isinstance(event, ToolCallResult):
            tool_results.append({"tool": event.tool_name, "id": event.tool_id, "is_error": event.tool_output.is_error})
    result = await handler
    witness.notes["tool_call_results"] = tool_results
    witness.notes["final_output"] = str(result)
    witness.notes["aborted_on_error"] = False


def openinference(provider: TracerProvider, witness: Witness) -> None:
    instrumentor = LlamaIndexInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        asyncio.run(_run(witness))
    finally:
        instrumentor.uninstrument()


#: the distributions whose versions a run records
PACKAGES = (
    "llama-index-core",
    "openinference-instrumentation-llama-index",
)

SCENARIOS: dict[str, Callable[[TracerProvider, Witness], None]] = {"openinference": openinference}
