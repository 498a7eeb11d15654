"""Scorers: the trace-backed tool scorer, text leaves, and composable wrappers."""

from scoring.score.base import (
    FloatScaleScorer,
    Scorer,
    ScorerConfigurationError,
    ScoringContext,
    TrueFalseScorer,
)
from scoring.score.identity import ScorerIdentifier
from scoring.score.text_scorers import PlagiarismMetric, PlagiarismScorer, SubStringScorer
from scoring.score.trace_scorer import OtelToolCallScorer
from scoring.score.wrappers import (
    FloatScaleFallbackScorer,
    FloatScaleThresholdScorer,
    TrueFalseCompositeScorer,
    TrueFalseFallbackScorer,
    TrueFalseInverterScorer,
    TrueFalseScoreAggregator,
    create_conversation_scorer,
)

__all__ = [
    "FloatScaleFallbackScorer",
    "FloatScaleScorer",
    "FloatScaleThresholdScorer",
    "OtelToolCallScorer",
    "PlagiarismMetric",
    "PlagiarismScorer",
    "Scorer",
    "ScorerConfigurationError",
    "ScorerIdentifier",
    "ScoringContext",
    "SubStringScorer",
    "TrueFalseCompositeScorer",
    "TrueFalseFallbackScorer",
    "TrueFalseInverterScorer",
    "TrueFalseScoreAggregator",
    "TrueFalseScorer",
    "create_conversation_scorer",
]
