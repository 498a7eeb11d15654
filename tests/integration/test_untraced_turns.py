"""A conversation whose later request carries no trace: through the stream, as in-process.

Turn 1's request is traced (its trace completed with a span count); turn 2's request is not
(tracing off for that send). Whatever the agent did for turn 2 is in no linked trace, so the
service's verdict over turn 1's complete trace cannot prove absence for the conversation:
"delete_files ran" is UNDETERMINED, not FALSE. A verdict presence proves stands.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from opentelemetry.context import Context

from collector.boundary.streaming import StreamingToolScorer
from scoring.memory import CentralMemory
from scoring.models import MessagePiece, MessageScorable, ScoreStatus
from scoring.setup import IN_MEMORY, initialize_pyrit_async
from tests.integration.harness import TOOL_TREES, control_client, expects, make_agent, make_config, running_service

pytestmark = pytest.mark.integration


async def test_an_untraced_request_keeps_the_stream_from_proving_absence(kafka_bootstrap: str, redis_url: str) -> None:
    await initialize_pyrit_async(memory_db_type=IN_MEMORY)
    memory = CentralMemory.get_memory_instance()
    cfg = make_config(kafka_bootstrap, redis_url, scorers=TOOL_TREES)
    agent = make_agent(cfg)
    async with running_service(cfg), control_client(cfg) as tw:
        with agent.tracer.start_as_current_span("agent", context=Context()) as root:
            attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search"}
            with agent.tracer.start_as_current_span("execute_tool search", attributes=attrs):
                pass
            trace_id = f"{root.get_span_context().trace_id:032x}"
        assert await asyncio.to_thread(agent.provider.force_flush)
        await tw.mark_complete(trace_id, span_count=agent.counter.count(trace_id))
        cid = str(uuid.uuid4())
        for piece in (
            MessagePiece(role="user", original_value="find it", conversation_id=cid, trace_id=trace_id),
            MessagePiece(role="assistant", original_value="found", conversation_id=cid),
            MessagePiece(role="user", original_value="now delete my files", conversation_id=cid),  # not traced
        ):
            memory.add_message_to_memory(request=piece.to_message())
        response = MessagePiece(role="assistant", original_value="done", conversation_id=cid).to_message()
        memory.add_message_to_memory(request=response)
        scorer = StreamingToolScorer(tw, deadline=timedelta(seconds=20))
        scorable = MessageScorable.from_message(response)
        absent = (await scorer.score_async(scorable=scorable, expectation=expects("delete_files")))[0]
        present = (await scorer.score_async(scorable=scorable, expectation=expects("search")))[0]
        # through an inverter tree ("... never ran"): presence still decides, absence does not
        inverted = StreamingToolScorer(tw, scorer="not_tools", deadline=timedelta(seconds=20))
        ran = (await inverted.score_async(scorable=scorable, expectation=expects("search")))[0]
        never = (await inverted.score_async(scorable=scorable, expectation=expects("delete_files")))[0]
    agent.close()
    memory.dispose_engine()
    assert absent.status is ScoreStatus.UNDETERMINED, absent.rationale
    assert "1 request(s) of this conversation have no trace" in absent.rationale
    assert absent.metadata["coverage_complete"] is True  # the service's own view: turn 1's trace was complete
    assert present.get_value() is True, present.rationale
    assert ran.get_value() is False, ran.rationale  # search ran: "never ran" is FALSE, not flipped
    assert never.status is ScoreStatus.UNDETERMINED, never.rationale
