"""StreamingToolScorer against a fake control-plane client: scopes, status mapping, timeouts, replay."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from collector.boundary.streaming import StreamingToolScorer
from collector.client import ToolwitnessClient
from collector.wire.gen import score_pb2
from scoring.executor.attack import AttackScoringConfig, PromptSendingAttack
from scoring.memory import CentralMemory
from scoring.models import (
    AttackOutcome,
    ContentScorable,
    Message,
    MessagePiece,
    MessageScorable,
    ScoringExpectation,
    SessionScorable,
    ToolCallRequirement,
    ToolsCalled,
)
from scoring.prompt_target import PromptTarget, TargetTraceConfig
from scoring.prompt_target.tracing import request_trace
from scoring.setup import IN_MEMORY, initialize_pyrit_async

EXPECT = ScoringExpectation(conditions=(ToolsCalled(tools=(ToolCallRequirement(name="my_tool_call"),)),))


class FakeClient:
    """Records expectations; answers each with the next queued status (None = never answers)."""

    tenant = "default"

    def __init__(self, *statuses: int | None) -> None:
        self.statuses = list(statuses)
        self.expected: list[tuple[Any, ScoringExpectation, str, timedelta]] = []
        self.cancelled: list[str] = []

    async def expect(self, scope: Any, expectation: ScoringExpectation, *, scorer: str, deadline: timedelta) -> str:
        self.expected.append((scope, expectation, scorer, deadline))
        return f"e{len(self.expected)}"

    async def wait_for(self, expectation_id: str, timeout: float) -> score_pb2.ScoreEvent:
        status = self.statuses.pop(0)
        if status is None:
            raise TimeoutError("no score")
        ev = score_pb2.ScoreEvent(expectation_id=expectation_id, version=1, status=status, rationale="r",
                                  trigger="marker", scorer="tools", observation_ids=["obs-1"])
        ev.coverage.complete = status == 2
        return ev

    async def cancel(self, expectation_id: str, reason: str = "") -> None:
        self.cancelled.append(expectation_id)


class EchoTarget(PromptTarget):
    async def send_prompt_async(self, *, message: Message) -> Message:
        piece = message.message_pieces[0]
        with request_trace(self.trace_config, "echo") as rt:
            if rt is not None:
                piece.trace_id = rt.trace_id
        return Message(message_pieces=[MessagePiece(role="assistant", original_value="done",
                                                    conversation_id=piece.conversation_id)])


def scorer_for(client: FakeClient, **kw: Any) -> StreamingToolScorer:
    return StreamingToolScorer(client, **kw)  # type: ignore[arg-type]  # duck-typed ToolwitnessClient


async def test_attack_outcomes_map_from_score_events() -> None:
    await initialize_pyrit_async(memory_db_type=IN_MEMORY)
    client = FakeClient(1, 2, 3, None)
    attack = PromptSendingAttack(
        objective_target=EchoTarget(trace_config=TargetTraceConfig(enabled=True)),
        attack_scoring_config=AttackScoringConfig(
            objective_scorer=scorer_for(client, deadline=timedelta(seconds=2), scorer="tools")),
    )
    outcomes = [
        (await attack.execute_async(objective=p, expectation=EXPECT)).outcome for p in ("a", "b", "c", "d")
    ]
    assert outcomes == [AttackOutcome.SUCCESS, AttackOutcome.FAILURE, AttackOutcome.UNDETERMINED,
                        AttackOutcome.UNDETERMINED]
    assert client.cancelled == ["e4"], "a score that never came: the expectation is cancelled"
    scope, expectation, tree, deadline = client.expected[0]
    assert isinstance(scope, MessageScorable) and scope.response_text == "done"
    assert scope.trace_ids is not None and len(scope.trace_ids) == 1
    piece = CentralMemory.get_memory_instance().get_message_pieces(conversation_id=scope.conversation_id)[0]
    assert piece.trace_id == scope.trace_ids[0], "the request's trace, as saved in memory"
    assert expectation.conditions == EXPECT.conditions and (tree, deadline) == ("tools", timedelta(seconds=2))


async def test_scopes() -> None:
    await initialize_pyrit_async(memory_db_type=IN_MEMORY)
    client = FakeClient(1)
    scorer = scorer_for(client)
    # a message without a linked request trace: undetermined at once, nothing registered
    (score,) = await scorer.score_async(MessageScorable(message_id="m", conversation_id="c"), EXPECT)
    assert score.get_value() is None and client.expected == []
    assert await scorer.score_async(ContentScorable(text="x"), EXPECT) == []
    (score,) = await scorer.score_async(SessionScorable(session_id="s1"), EXPECT)
    assert score.get_value() is True and client.expected[0][0] == SessionScorable(session_id="s1")
    assert score.observation_ids == ("obs-1",) and score.metadata["trigger"] == "marker"


def test_validation() -> None:
    client = FakeClient()
    with pytest.raises(ValueError):
        scorer_for(client, deadline=timedelta(0))
    with pytest.raises(ValueError):
        scorer_for(client, scorer="")
    assert scorer_for(client).get_identifier().params["scorer_tree"] == "tools"
    assert ToolwitnessClient  # the real client type the scorer is written for
