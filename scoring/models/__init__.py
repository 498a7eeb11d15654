"""Data models: scorables, conditions, evidence, observations and scores (pydantic, frozen)."""

from scoring.models.conditions import (
    CONDITION_TYPES,
    ArgumentMatcher,
    Condition,
    PayloadPropagated,
    ScoringExpectation,
    ToolCallRequirement,
    ToolsCalled,
    ToolSequence,
)
from scoring.models.evidence import (
    Acquisition,
    CaptureState,
    CompletionSource,
    Coverage,
    Observation,
    ToolExecution,
)
from scoring.models.message import Message, MessagePiece
from scoring.models.outcome import AttackOutcome
from scoring.models.scorables import (
    AnyScorable,
    ContentScorable,
    MessageScorable,
    Scorable,
    SessionScorable,
    TraceScorable,
)
from scoring.models.score import Score, ScoreType
from scoring.models.status import ScoreStatus, Verdict

__all__ = [
    "CONDITION_TYPES",
    "Acquisition",
    "AnyScorable",
    "ArgumentMatcher",
    "AttackOutcome",
    "CaptureState",
    "CompletionSource",
    "Condition",
    "ContentScorable",
    "Coverage",
    "Message",
    "MessagePiece",
    "MessageScorable",
    "Observation",
    "PayloadPropagated",
    "Scorable",
    "Score",
    "ScoreStatus",
    "ScoreType",
    "ScoringExpectation",
    "SessionScorable",
    "ToolCallRequirement",
    "ToolExecution",
    "ToolSequence",
    "ToolsCalled",
    "TraceScorable",
    "Verdict",
]
