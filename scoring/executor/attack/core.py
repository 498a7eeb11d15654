"""Attack configuration and results."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from scoring.models.message import MessagePiece
from scoring.models.outcome import AttackOutcome
from scoring.models.score import Score
from scoring.models.status import ScoreStatus
from scoring.score.adapt import TextScorer, as_scorer
from scoring.score.base import Scorer, TrueFalseScorer

__all__ = ["AttackResult", "AttackScoringConfig", "outcome_of"]


@dataclass(frozen=True, kw_only=True)
class AttackScoringConfig:
    """How an attack judges its responses.

    ``objective_scorer`` (true/false) decides the outcome: TRUE → SUCCESS, FALSE → FAILURE,
    undetermined → UNDETERMINED. ``auxiliary_scorers`` are run and stored, never decisive.
    """

    objective_scorer: TrueFalseScorer | None = None
    auxiliary_scorers: Sequence[Scorer] = ()

    def __init__(
        self,
        *,
        objective_scorer: TrueFalseScorer | TextScorer | None = None,
        auxiliary_scorers: Sequence[Scorer | TextScorer] = (),
    ) -> None:
        # A self-ask judge (a text scorer, not a tree node) is scored as a leaf, as in a wrapper.
        object.__setattr__(self, "objective_scorer", as_scorer(objective_scorer))
        object.__setattr__(self, "auxiliary_scorers", tuple(as_scorer(s) for s in auxiliary_scorers))
        self.__post_init__()

    def __post_init__(self) -> None:
        s = self.objective_scorer
        if s is not None and s.scorer_type != "true_false":
            raise TypeError(f"objective_scorer must be a true/false scorer, got {type(s).__name__}")


def outcome_of(score: Score | None) -> AttackOutcome:
    """Map an objective score to an outcome; no score or an undetermined one is UNDETERMINED."""
    if score is None or score.status is ScoreStatus.UNDETERMINED:
        return AttackOutcome.UNDETERMINED
    return AttackOutcome.SUCCESS if score.get_value() is True else AttackOutcome.FAILURE


@dataclass(frozen=True, kw_only=True)
class AttackResult:
    """What one attack execution produced."""

    conversation_id: str
    objective: str
    attack_identifier: dict[str, str]
    outcome: AttackOutcome
    outcome_reason: str | None = None
    last_response: MessagePiece | None = None
    automated_score: Score | None = None
    auxiliary_scores: tuple[Score, ...] = ()
    executed_turns: int = 0
    execution_time_ms: int = 0
    trace_ids: tuple[str, ...] = field(default=())

    @property
    def last_score(self) -> Score | None:
        return self.automated_score
