"""PromptSendingAttack: send the objective as a prompt, score the response (PyRIT's single-turn attack).

    attack = PromptSendingAttack(
        objective_target=target,
        attack_scoring_config=AttackScoringConfig(objective_scorer=tool_scorer),
        max_attempts_on_failure=0,
    )
    result = await attack.execute_async(objective="my_tool_call", expectation=expects("my_tool_call"))
    result.outcome            # AttackOutcome.SUCCESS / FAILURE / UNDETERMINED
    result.automated_score    # a Score whose scorable is a MessageScorable (the response)

Each execution is one conversation in memory: the request piece (with its ``trace_id`` when
the target traced it) and then the assistant response. The objective scorer receives the
response as a ``MessageScorable``; a trace-backed scorer resolves the request traces of the
conversation through it, never reading later turns. The expectation is validated against
the scorer tree before anything is sent.

``max_attempts_on_failure`` retries (in the same conversation) only on FAILURE: an
undetermined score is not a failure.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping

from scoring.executor.attack.core import AttackResult, AttackScoringConfig, outcome_of
from scoring.memory.central import CentralMemory, MemoryInterface
from scoring.models.conditions import ScoringExpectation
from scoring.models.message import Message, MessagePiece
from scoring.models.outcome import AttackOutcome
from scoring.models.scorables import MessageScorable
from scoring.models.score import Score
from scoring.prompt_target.base import PromptTarget

__all__ = ["PromptSendingAttack"]


class PromptSendingAttack:
    """Send the objective to a target and score the response (see the module docstring)."""

    def __init__(
        self,
        *,
        objective_target: PromptTarget,
        attack_scoring_config: AttackScoringConfig | None = None,
        max_attempts_on_failure: int = 0,
    ) -> None:
        if max_attempts_on_failure < 0:
            raise ValueError(f"max_attempts_on_failure must be >= 0, got {max_attempts_on_failure}")
        self._target = objective_target
        self._scoring = attack_scoring_config or AttackScoringConfig()
        self._max_attempts_on_failure = max_attempts_on_failure
        self._id = str(uuid.uuid4())

    def get_identifier(self) -> dict[str, str]:
        return {"__type__": type(self).__name__, "__module__": type(self).__module__, "id": self._id}

    @staticmethod
    def _memory() -> MemoryInterface:
        return CentralMemory.get_memory_instance()

    async def _send(
        self, memory: MemoryInterface, prompt: str, conversation_id: str, labels: Mapping[str, str]
    ) -> tuple[MessagePiece, Message]:
        request = MessagePiece(role="user", original_value=prompt, conversation_id=conversation_id,
                               labels=dict(labels))
        try:
            response = await self._target.send_prompt_async(message=request.to_message())
        finally:
            # Saved with the trace id the target set on it, before its response.
            memory.add_message_to_memory(request=request.to_message())
        memory.add_message_to_memory(request=response)
        return request, response

    async def _score(
        self, response: Message, expectation: ScoringExpectation, objective: str
    ) -> tuple[Score | None, tuple[Score, ...]]:
        scorable = MessageScorable.from_message(response)
        objective_score: Score | None = None
        scorer = self._scoring.objective_scorer
        if scorer is not None:
            scores = await scorer.score_async(scorable=scorable, expectation=expectation, objective=objective)
            objective_score = scores[0] if scores else None
        aux: list[Score] = []
        for s in self._scoring.auxiliary_scorers:
            aux.extend(await s.score_async(scorable=scorable, objective=objective))
        return objective_score, tuple(aux)

    async def execute_async(
        self,
        *,
        objective: str,
        expectation: ScoringExpectation | None = None,
        memory_labels: Mapping[str, str] | None = None,
    ) -> AttackResult:
        """Run the attack once (plus retries on FAILURE) and return its result."""
        if not objective:
            raise ValueError("objective must not be empty")
        expectation = expectation or ScoringExpectation()
        if expectation.objective is None:
            expectation = expectation.model_copy(update={"objective": objective})
        scorer = self._scoring.objective_scorer
        if scorer is not None:
            scorer.validate(expectation)  # fail before sending anything
        memory = self._memory()
        conversation_id = str(uuid.uuid4())
        started = time.monotonic()
        last_piece: MessagePiece | None = None
        score: Score | None = None
        aux: tuple[Score, ...] = ()
        outcome = AttackOutcome.UNDETERMINED
        trace_ids: list[str] = []
        turns = 0
        for _ in range(self._max_attempts_on_failure + 1):
            request, response = await self._send(memory, objective, conversation_id, memory_labels or {})
            turns += 1
            if request.trace_id:
                trace_ids.append(request.trace_id)
            last_piece = response.message_pieces[-1]
            score, aux = await self._score(response, expectation, objective)
            outcome = outcome_of(score)
            if outcome is not AttackOutcome.FAILURE:
                break
        if score is None:
            reason = "no objective scorer" if scorer is None else "the objective scorer did not apply"
        else:
            reason = score.rationale
        return AttackResult(
            conversation_id=conversation_id,
            objective=objective,
            attack_identifier=self.get_identifier(),
            outcome=outcome,
            outcome_reason=reason,
            last_response=last_piece,
            automated_score=score,
            auxiliary_scores=aux,
            executed_turns=turns,
            execution_time_ms=int((time.monotonic() - started) * 1000),
            trace_ids=tuple(trace_ids),
        )
