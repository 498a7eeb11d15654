"""``pyrit.score.scorer_evaluation.scorer_evaluator``'s names (seed 004)."""

from scoring.evaluation.evaluator import evaluate_async, get_scorer_metrics
from scoring.score.evaluable import ScorerEvalDatasetFiles

__all__ = ["ScorerEvalDatasetFiles", "evaluate_async", "get_scorer_metrics"]
