"""Scorers: the trace-backed tool scorer, text leaves, and composable wrappers."""

from typing import TYPE_CHECKING

from scoring.score.base import (
    FloatScaleScorer,
    Scorer,
    ScorerConfigurationError,
    ScoringContext,
    TrueFalseScorer,
)
from scoring.score.evaluable import ScorerEvalDatasetFiles
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

#: The scorer-metrics names and self-ask judges PyRIT's ``pyrit.score`` exports (seed 004),
#: loaded on first use: the evaluation package pulls in numpy and scipy, and the judges httpx,
#: which scoring alone never needs.
_EVALUATION = {
    "LikertScale": "scoring.evaluation.likert",
    "LikertScalePaths": "scoring.evaluation.likert",
    "SelfAskLikertScorer": "scoring.evaluation.judges",
    "SelfAskRefusalScorer": "scoring.evaluation.judges",
    "SelfAskTrueFalseScorer": "scoring.evaluation.judges",
    "HarmScorerMetrics": "scoring.evaluation.metrics",
    "ObjectiveScorerMetrics": "scoring.evaluation.metrics",
    "RegistryUpdateBehavior": "scoring.evaluation.registry",
    "ScorerMetricsWithIdentity": "scoring.evaluation.registry",
    "get_all_harm_metrics": "scoring.evaluation.registry",
    "get_all_objective_metrics": "scoring.evaluation.registry",
}

if TYPE_CHECKING:  # the same names, typed for a type checker (at run time: ``__getattr__``)
    from scoring.evaluation.judges import SelfAskLikertScorer, SelfAskRefusalScorer, SelfAskTrueFalseScorer
    from scoring.evaluation.likert import LikertScale, LikertScalePaths
    from scoring.evaluation.metrics import HarmScorerMetrics, ObjectiveScorerMetrics
    from scoring.evaluation.registry import (
        RegistryUpdateBehavior,
        ScorerMetricsWithIdentity,
        get_all_harm_metrics,
        get_all_objective_metrics,
    )


def __getattr__(name: str) -> object:
    module = _EVALUATION.get(name)
    if module is None:
        raise AttributeError(f"module 'scoring.score' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "FloatScaleFallbackScorer",
    "FloatScaleScorer",
    "FloatScaleThresholdScorer",
    "HarmScorerMetrics",
    "LikertScale",
    "LikertScalePaths",
    "ObjectiveScorerMetrics",
    "OtelToolCallScorer",
    "PlagiarismMetric",
    "PlagiarismScorer",
    "RegistryUpdateBehavior",
    "Scorer",
    "ScorerConfigurationError",
    "ScorerEvalDatasetFiles",
    "ScorerIdentifier",
    "ScorerMetricsWithIdentity",
    "ScoringContext",
    "SelfAskLikertScorer",
    "SelfAskRefusalScorer",
    "SelfAskTrueFalseScorer",
    "SubStringScorer",
    "TrueFalseCompositeScorer",
    "TrueFalseFallbackScorer",
    "TrueFalseInverterScorer",
    "TrueFalseScoreAggregator",
    "TrueFalseScorer",
    "create_conversation_scorer",
    "get_all_harm_metrics",
    "get_all_objective_metrics",
]
