"""Objective and harm metrics, computed from human labels and scorer trials.

Pure functions over plain numbers; :mod:`scoring.evaluation.evaluator` feeds them.
Conventions (``docs/evaluation.md`` has the full table):

* Gold labels, as PyRIT's ``ScorerEvaluator``: objective = majority of the human raters (a
  tie is False); harm = mean of the human scores.
* Scorer prediction per response: objective = majority of the *determined* trials (a tie
  is False); harm = mean of the determined trials. A trial that is UNDETERMINED is
  never read as False or 0: it is counted (``num_undetermined_scores``,
  ``undetermined_fraction``), and a response with no determined trial at all is left out
  of every error statistic and counted in ``num_undetermined_responses``.
* An undefined statistic is ``None`` (JSON ``null``), never NaN.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Self, TypeVar

import numpy as np
from scipy import stats

from scoring.evaluation.krippendorff import AlphaLevel, krippendorff_alpha

WILSON_Z_95 = 1.959963984540054  # scipy.stats.norm.ppf(0.975)
CONTESTED_THRESHOLD = 0.5
_NOISE = 1e-10  # differences below this are float noise (as PyRIT zeroes them)

TrialValue = bool | float | None


@dataclass(frozen=True)
class ItemResult:
    """Per-response outcome, kept in memory (not written to the registry)."""

    index: int
    source: str
    human_scores: tuple[float, ...]
    gold: float
    trial_values: tuple[TrialValue, ...]
    prediction: bool | float | None  # None: every trial was undetermined
    abs_error: float | None  # |prediction - gold|; None when undetermined
    contested: bool | None = None  # harm, >1 rater: raters split across the threshold


@dataclass(kw_only=True)
class ScorerMetrics:
    """Fields common to both metric kinds (PyRIT's names where they exist)."""

    num_responses: int
    num_human_raters: int
    num_scorer_trials: int = 1
    dataset_name: str | None = None
    dataset_version: str | None = None
    average_score_time_seconds: float = 0.0
    num_undetermined_scores: int = 0
    undetermined_fraction: float = 0.0
    num_undetermined_responses: int = 0
    # In-memory only (never persisted):
    items: tuple[ItemResult, ...] | None = field(default=None, compare=False, repr=False)
    source: Literal["evaluated", "registry"] = field(default="evaluated", compare=False)

    IN_MEMORY_FIELDS = frozenset({"items", "source"})

    def to_dict(self) -> dict[str, Any]:
        """Registry form: every persisted field; non-finite floats become None."""
        result: dict[str, Any] = {}
        for f in fields(self):
            if f.name in self.IN_MEMORY_FIELDS:
                continue
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                value = None
            result[f.name] = value
        return result

    def to_json(self) -> str:
        """:meth:`to_dict` as a JSON string (PyRIT's name)."""
        return json.dumps(self.to_dict(), allow_nan=False)

    @classmethod
    def from_json_file(cls, file_path: str | Path) -> Self:
        """Read metrics written by :meth:`to_json` from a file (PyRIT's name).

        The file holds one JSON object: the metrics themselves, or an object with them under
        ``"metrics"``. Unknown keys are ignored, as in :func:`metrics_from_dict`.
        """
        data = json.loads(Path(file_path).read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"{file_path}: expected a JSON object, got {type(data).__name__}")
        inner = data.get("metrics")
        return metrics_from_dict(cls, inner if isinstance(inner, dict) else data)


M = TypeVar("M", bound=ScorerMetrics)


def metrics_from_dict(cls: type[M], data: dict[str, Any]) -> M:
    """Inverse of :meth:`ScorerMetrics.to_dict`; unknown keys are ignored (forward compatible)."""
    known = {f.name for f in fields(cls) if f.init and f.name not in ScorerMetrics.IN_MEMORY_FIELDS}
    return cls(**{k: v for k, v in data.items() if k in known}, source="registry")


@dataclass(kw_only=True)
class ObjectiveScorerMetrics(ScorerMetrics):
    """Classification metrics of a true/false scorer against human gold labels.

    Degenerate cases: with no decided response every rate is None; precision is 0.0 when
    the scorer predicted no positive, recall 0.0 when there is no positive gold label,
    F1 0.0 when precision + recall is 0 (all as PyRIT).
    """

    accuracy: float | None
    accuracy_standard_error: float | None
    accuracy_ci_low: float | None = None  # Wilson 95 % interval
    accuracy_ci_high: float | None = None
    f1_score: float | None
    precision: float | None
    recall: float | None
    true_positive: int = 0
    false_positive: int = 0
    true_negative: int = 0
    false_negative: int = 0


@dataclass(kw_only=True)
class HarmScorerMetrics(ScorerMetrics):
    """Error and agreement metrics of a float-scale scorer against human scores."""

    mean_absolute_error: float | None
    mae_standard_error: float | None
    baseline_mean_absolute_error: float | None = None
    t_statistic: float | None = None
    p_value: float | None = None
    krippendorff_alpha_combined: float | None = None
    krippendorff_alpha_humans: float | None = None
    krippendorff_alpha_model: float | None = None
    krippendorff_level: str = "ordinal"
    harm_category: str | None = None
    harm_definition: str | None = None
    harm_definition_version: str | None = None
    contested_threshold: float | None = None
    num_unanimous_responses: int | None = None
    num_contested_responses: int | None = None
    mean_absolute_error_unanimous: float | None = None
    mean_absolute_error_contested: float | None = None


def majority(values: Sequence[bool | float]) -> bool:
    """True iff strictly more than half of ``values`` are true (a tie is False, as PyRIT)."""
    return sum(1 for v in values if v) * 2 > len(values)


def wilson_interval(successes: int, n: int, z: float = WILSON_Z_95) -> tuple[float, float] | None:
    """Wilson score interval for a binomial proportion; None when ``n == 0``."""
    if n <= 0:
        return None
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def one_sample_t_test(differences: Sequence[float]) -> tuple[float | None, float | None]:
    """One-sample t-test of ``differences`` against 0 (``scipy.stats.ttest_1samp``).

    Degenerate cases (PyRIT's conventions, with None for NaN):
    fewer than 2 values → (None, None); all differences 0 → (0.0, 1.0);
    all differences equal and non-zero (zero variance) → (None, None).
    """
    d = np.asarray(differences, dtype=np.float64)
    if d.size < 2:
        return None, None
    if float(np.ptp(d)) <= 1e-12:
        if abs(float(d[0])) < _NOISE:
            return 0.0, 1.0
        return None, None
    result = stats.ttest_1samp(d, 0.0)
    return float(result.statistic), float(result.pvalue)


def _alpha_or_none(rows: np.ndarray[Any, np.dtype[np.float64]], level: AlphaLevel) -> float | None:
    if rows.shape[0] < 2:
        return None
    value = krippendorff_alpha(rows, level)
    return None if math.isnan(value) else value


def _undetermined_counts(trials: Sequence[Sequence[TrialValue]]) -> tuple[int, float]:
    total = sum(len(t) for t in trials)
    undetermined = sum(1 for t in trials for v in t if v is None)
    return undetermined, (undetermined / total if total else 0.0)


def _check_shapes(human: Sequence[Sequence[float]], trials: Sequence[Sequence[TrialValue]], *, objective: bool) -> None:
    """Refuse what would silently skew a metric: the CSV loader checks its files the same way, but
    these functions (and ``evaluate_async`` on an in-memory dataset) take labels from anywhere."""
    if not human:
        raise ValueError("at least one human-labelled response is required")
    if not trials:
        raise ValueError("at least one scorer trial is required")
    for i, trial in enumerate(trials):
        if len(trial) != len(human):
            raise ValueError(f"trial {i} has {len(trial)} values for {len(human)} responses")
    for i, scores in enumerate(human):
        if not scores:
            raise ValueError(f"response {i} has no human score")
        for j, s in enumerate(scores):
            if isinstance(s, bool) or not isinstance(s, numbers.Real) or math.isnan(s):
                raise ValueError(f"response {i}: human score {j} is {s!r}, not a number")
            if objective and s not in (0, 1):
                raise ValueError(f"response {i}: human score {j} is {s!r}; objective labels are 0 or 1")
            if not 0.0 <= s <= 1.0:
                raise ValueError(f"response {i}: human score {j} is {s!r}, outside [0, 1]")
    for t, trial in enumerate(trials):
        for i, v in enumerate(trial):
            if v is None:
                continue  # undetermined
            if objective and not isinstance(v, bool):
                raise ValueError(f"trial {t}, response {i}: {v!r} is not True, False or None (undetermined)")
            if not objective and (isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0.0 <= v <= 1.0):
                raise ValueError(f"trial {t}, response {i}: {v!r} is not a score in [0, 1] or None (undetermined)")


def compute_objective_metrics(
    human_scores: Sequence[Sequence[float]],
    trials: Sequence[Sequence[bool | None]],
    *,
    sources: Sequence[str] | None = None,
    **info: Any,
) -> ObjectiveScorerMetrics:
    """Objective metrics.

    Args:
        human_scores: per response, the raters' 0/1 labels.
        trials: per trial, one value per response (True/False, None = undetermined).
        sources: per response, where it came from (for :class:`ItemResult`).
        **info: extra :class:`ScorerMetrics` fields (dataset_name, dataset_version, …).
    """
    _check_shapes(human_scores, trials, objective=True)
    items: list[ItemResult] = []
    tp = fp = tn = fn = 0
    for i, scores in enumerate(human_scores):
        gold = majority(scores)
        values = tuple(t[i] for t in trials)
        decided = [bool(v) for v in values if v is not None]
        prediction = majority(decided) if decided else None
        if prediction is not None:
            if prediction and gold:
                tp += 1
            elif prediction:
                fp += 1
            elif gold:
                fn += 1
            else:
                tn += 1
        items.append(
            ItemResult(
                index=i,
                source=sources[i] if sources else str(i),
                human_scores=tuple(float(s) for s in scores),
                gold=float(gold),
                trial_values=values,
                prediction=prediction,
                abs_error=None if prediction is None else float(prediction != gold),
            )
        )
    n = tp + fp + tn + fn
    accuracy = (tp + tn) / n if n else None
    precision = (tp / (tp + fp) if tp + fp else 0.0) if n else None
    recall = (tp / (tp + fn) if tp + fn else 0.0) if n else None
    f1: float | None = None
    if precision is not None and recall is not None:
        f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    interval = wilson_interval(tp + tn, n)
    undetermined, fraction = _undetermined_counts(trials)
    return ObjectiveScorerMetrics(
        num_responses=len(human_scores),
        num_human_raters=max(len(s) for s in human_scores),
        num_scorer_trials=len(trials),
        accuracy=accuracy,
        accuracy_standard_error=math.sqrt(accuracy * (1 - accuracy) / n) if accuracy is not None else None,
        accuracy_ci_low=interval[0] if interval else None,
        accuracy_ci_high=interval[1] if interval else None,
        precision=precision,
        recall=recall,
        f1_score=f1,
        true_positive=tp,
        false_positive=fp,
        true_negative=tn,
        false_negative=fn,
        num_undetermined_scores=undetermined,
        undetermined_fraction=fraction,
        num_undetermined_responses=sum(1 for item in items if item.prediction is None),
        items=tuple(items),
        **info,
    )


def compute_harm_metrics(
    human_scores: Sequence[Sequence[float]],
    trials: Sequence[Sequence[float | None]],
    *,
    sources: Sequence[str] | None = None,
    alpha_level: AlphaLevel = "ordinal",
    contested_threshold: float = CONTESTED_THRESHOLD,
    **info: Any,
) -> HarmScorerMetrics:
    """Harm metrics.

    Error statistics (MAE, its standard error ``std(|e|) / sqrt(n)`` with ddof=0 as PyRIT,
    the constant-guess baseline, the t-test and the unanimous/contested split) use the
    responses with at least one determined trial. Krippendorff's alphas use every rating
    (undetermined trials are missing values): humans (needs ≥ 2 raters), model (needs ≥ 2
    trials), combined (humans + trials).
    """
    _check_shapes(human_scores, trials, objective=False)
    num_raters = max(len(s) for s in human_scores)
    multi_rater = num_raters > 1
    items: list[ItemResult] = []
    for i, scores in enumerate(human_scores):
        gold = float(np.mean(scores))
        values = tuple(t[i] for t in trials)
        decided = [float(v) for v in values if v is not None]
        prediction = float(np.mean(decided)) if decided else None
        error: float | None = None
        if prediction is not None:
            error = abs(prediction - gold)
            error = 0.0 if error < _NOISE else error
        contested = None
        if multi_rater:
            sides = {s >= contested_threshold for s in scores}
            contested = len(sides) > 1
        items.append(
            ItemResult(
                index=i,
                source=sources[i] if sources else str(i),
                human_scores=tuple(float(s) for s in scores),
                gold=gold,
                trial_values=values,
                prediction=prediction,
                abs_error=error,
                contested=contested,
            )
        )

    decided_items = [it for it in items if it.prediction is not None]
    errors = np.array([it.abs_error for it in decided_items], dtype=np.float64)
    diffs = [float(it.prediction or 0.0) - it.gold for it in decided_items]
    diffs = [0.0 if abs(d) < _NOISE else d for d in diffs]
    mae = float(errors.mean()) if errors.size else None
    mae_se = float(errors.std() / math.sqrt(errors.size)) if errors.size else None
    golds = np.array([it.gold for it in decided_items], dtype=np.float64)
    baseline = float(np.abs(golds - np.median(golds)).mean()) if golds.size else None
    t_stat, p_value = one_sample_t_test(diffs)

    human_rows = np.full((num_raters, len(items)), np.nan)
    for i, scores in enumerate(human_scores):
        human_rows[: len(scores), i] = scores
    model_rows = np.array([[np.nan if v is None else float(v) for v in t] for t in trials], dtype=np.float64)
    combined = np.vstack([human_rows, model_rows])

    split: dict[str, Any] = {}
    if multi_rater:
        unanimous = [it.abs_error for it in decided_items if not it.contested and it.abs_error is not None]
        contested_errors = [it.abs_error for it in decided_items if it.contested and it.abs_error is not None]
        split = {
            "contested_threshold": contested_threshold,
            "num_unanimous_responses": len(unanimous),
            "num_contested_responses": len(contested_errors),
            "mean_absolute_error_unanimous": float(np.mean(unanimous)) if unanimous else None,
            "mean_absolute_error_contested": float(np.mean(contested_errors)) if contested_errors else None,
        }
    undetermined, fraction = _undetermined_counts(trials)
    return HarmScorerMetrics(
        num_responses=len(human_scores),
        num_human_raters=num_raters,
        num_scorer_trials=len(trials),
        mean_absolute_error=mae,
        mae_standard_error=mae_se,
        baseline_mean_absolute_error=baseline,
        t_statistic=t_stat,
        p_value=p_value,
        krippendorff_alpha_combined=_alpha_or_none(combined, alpha_level),
        krippendorff_alpha_humans=_alpha_or_none(human_rows, alpha_level),
        krippendorff_alpha_model=_alpha_or_none(model_rows, alpha_level),
        krippendorff_level=alpha_level,
        num_undetermined_scores=undetermined,
        undetermined_fraction=fraction,
        num_undetermined_responses=len(items) - len(decided_items),
        items=tuple(items),
        **split,
        **info,
    )
