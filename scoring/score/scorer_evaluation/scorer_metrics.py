"""``pyrit.score.scorer_evaluation.scorer_metrics``'s names (seed 004)."""

from scoring.evaluation.metrics import HarmScorerMetrics, ObjectiveScorerMetrics
from scoring.evaluation.registry import ScorerMetricsWithIdentity

__all__ = ["HarmScorerMetrics", "ObjectiveScorerMetrics", "ScorerMetricsWithIdentity"]
