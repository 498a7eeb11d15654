"""Run a scorer over a human-labeled dataset and compute (or reuse) its metrics.

``evaluate_async`` is PyRIT's ``evaluate_async`` / ``run_evaluation_async`` as a free
function over the :class:`~scoring.evaluation.protocols.EvaluableScorer` Protocol:
load and combine the CSV files, consult the registry (skip rules), score every response
``num_scorer_trials`` times with bounded concurrency, compute the metrics and store them.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from scoring.evaluation.dataset import HumanLabeledDataset, LabeledEntry, MetricsType, load_human_labeled_dataset
from scoring.evaluation.identity import evaluation_hash
from scoring.evaluation.krippendorff import AlphaLevel
from scoring.evaluation.metrics import (
    HarmScorerMetrics,
    ObjectiveScorerMetrics,
    compute_harm_metrics,
    compute_objective_metrics,
)
from scoring.evaluation.protocols import FLOAT_SCALE, TRUE_FALSE, EvaluableScorer, is_undetermined
from scoring.evaluation.registry import MetricsRegistry, RegistryUpdateBehavior, decide_skip

log = logging.getLogger("toolwitness.evaluation")

ProgressCallback = Callable[[int], None]


def metrics_type_for(scorer: EvaluableScorer) -> MetricsType:
    """``true_false`` scorers get objective metrics, ``float_scale`` scorers harm metrics."""
    if not isinstance(scorer, EvaluableScorer):
        raise TypeError(
            "the scorer to evaluate must have scorer_type and score_text_async (a scoring.score scorer or a "
            f"self-ask judge), got {type(scorer).__name__}"
        )
    if scorer.scorer_type == TRUE_FALSE:
        return MetricsType.OBJECTIVE
    if scorer.scorer_type == FLOAT_SCALE:
        return MetricsType.HARM
    raise ValueError(f"cannot evaluate scorer_type {scorer.scorer_type!r}; expected {TRUE_FALSE!r} or {FLOAT_SCALE!r}")


async def score_entry_async(
    scorer: EvaluableScorer, entry: LabeledEntry, metrics_type: MetricsType
) -> bool | float | None:
    """One trial on one response: True/False (objective) or a float (harm); None = undetermined."""
    if entry.data_type != "text":
        raise ValueError(f"{entry.source}: data_type {entry.data_type!r} is not supported; only text responses")
    objective = entry.objective if metrics_type is MetricsType.OBJECTIVE else None
    scores = await scorer.score_text_async(entry.assistant_response, objective=objective)
    if len(scores) == 0:
        return None
    if len(scores) > 1:
        raise ValueError(f"{entry.source}: scorer returned {len(scores)} scores; evaluation needs exactly one")
    score = scores[0]
    if is_undetermined(score):
        return None
    value = score.get_value()
    if metrics_type is MetricsType.OBJECTIVE:
        if not isinstance(value, bool):
            raise TypeError(f"{entry.source}: a true_false scorer returned {value!r}, not a bool")
        return value
    number = float(value) if value is not None else math.nan
    if not 0.0 <= number <= 1.0:
        raise ValueError(f"{entry.source}: a float_scale scorer returned {value!r}, outside [0, 1]")
    return number


_T = TypeVar("_T")


async def gather_or_cancel(coros: Sequence[Coroutine[Any, Any, _T]]) -> list[_T]:
    """``asyncio.gather`` of ``coros`` that, when one raises (or the caller is cancelled), cancels
    and awaits the others before re-raising the same exception: a failed evaluation must not
    keep calling the judge in the background (plain gather leaves them running)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def run_trials_async(
    scorer: EvaluableScorer,
    dataset: HumanLabeledDataset,
    *,
    num_scorer_trials: int,
    max_concurrency: int,
    on_progress: ProgressCallback | None = None,
) -> tuple[list[list[bool | float | None]], float]:
    """Score every entry ``num_scorer_trials`` times.

    Returns:
        (trials × responses values, average seconds per scored response). The average is
        each trial's wall time divided by its number of responses, as PyRIT reports it.
    """
    if num_scorer_trials < 1:
        raise ValueError("num_scorer_trials must be >= 1")
    if max_concurrency < 1:
        raise ValueError("max_concurrency must be >= 1")
    semaphore = asyncio.Semaphore(max_concurrency)

    async def one(entry: LabeledEntry) -> bool | float | None:
        async with semaphore:
            value = await score_entry_async(scorer, entry, dataset.metrics_type)
        if on_progress is not None:
            on_progress(1)
        return value

    trials: list[list[bool | float | None]] = []
    elapsed = 0.0
    for _ in range(num_scorer_trials):
        start = time.perf_counter()
        trials.append(await gather_or_cancel([one(e) for e in dataset.entries]))
        elapsed += time.perf_counter() - start
    scored = num_scorer_trials * len(dataset.entries)
    return trials, (elapsed / scored if scored else 0.0)


def compute_dataset_metrics(
    dataset: HumanLabeledDataset,
    trials: Sequence[Sequence[bool | float | None]],
    *,
    average_score_time_seconds: float = 0.0,
    alpha_level: AlphaLevel = "ordinal",
) -> ObjectiveScorerMetrics | HarmScorerMetrics:
    """Metrics of ``trials`` against ``dataset``'s human labels, with the dataset's identity fields."""
    human = [e.human_scores for e in dataset.entries]
    sources = [e.source for e in dataset.entries]
    if dataset.metrics_type is MetricsType.OBJECTIVE:
        bool_trials = [[None if v is None else bool(v) for v in t] for t in trials]
        return compute_objective_metrics(
            human,
            bool_trials,
            sources=sources,
            dataset_name=dataset.name,
            dataset_version=dataset.version,
            average_score_time_seconds=average_score_time_seconds,
        )
    float_trials = [[None if v is None else float(v) for v in t] for t in trials]
    return compute_harm_metrics(
        human,
        float_trials,
        sources=sources,
        alpha_level=alpha_level,
        harm_category=dataset.harm_category,
        harm_definition=dataset.harm_definition,
        harm_definition_version=dataset.harm_definition_version,
        dataset_name=dataset.name,
        dataset_version=dataset.version,
        average_score_time_seconds=average_score_time_seconds,
    )


async def evaluate_async(
    scorer: EvaluableScorer,
    dataset: HumanLabeledDataset | str | Sequence[str],
    *,
    num_scorer_trials: int = 3,
    update_registry_behavior: RegistryUpdateBehavior = RegistryUpdateBehavior.SKIP_IF_EXISTS,
    registry_path: Path | str | None = None,
    max_concurrency: int = 10,
    on_progress: ProgressCallback | None = None,
    alpha_level: AlphaLevel = "ordinal",
    dataset_root: Path | None = None,
) -> ObjectiveScorerMetrics | HarmScorerMetrics:
    """Evaluate ``scorer`` against human labels (PyRIT's ``evaluate_async``).

    Args:
        scorer: anything implementing :class:`EvaluableScorer`.
        dataset: a loaded dataset, or glob pattern(s) of PyRIT-format CSV files (combined
            with PyRIT's rules; resolved against ``dataset_root`` or the working directory).
        num_scorer_trials: how many times each response is scored.
        update_registry_behavior: see :class:`RegistryUpdateBehavior`.
        registry_path: the JSONL registry (default: :func:`default_registry_path`).
        max_concurrency: at most this many ``score_text_async`` calls in flight.
        on_progress: called with 1 after every scored response.
        alpha_level: level of measurement for the harm alphas (PyRIT uses ordinal).

    Returns:
        The metrics. When the registry already holds a sufficient result, that result is
        returned (``metrics.source == "registry"``, no per-item results).
    """
    metrics_type = metrics_type_for(scorer)
    if not isinstance(dataset, HumanLabeledDataset):
        dataset = load_human_labeled_dataset(dataset, metrics_type, root=dataset_root)
    elif dataset.metrics_type is not metrics_type:
        raise ValueError(
            f"a {scorer.scorer_type} scorer needs a {metrics_type.value} dataset, got {dataset.metrics_type.value}"
        )

    registry = MetricsRegistry(registry_path)
    identifier = scorer.get_identifier()
    eval_hash = evaluation_hash(identifier)
    if update_registry_behavior is RegistryUpdateBehavior.SKIP_IF_EXISTS:
        existing = registry.find(eval_hash, metrics_type, harm_category=dataset.harm_category)
        decision = decide_skip(
            existing,
            dataset_version=dataset.version,
            harm_definition_version=dataset.harm_definition_version,
            num_scorer_trials=num_scorer_trials,
            dataset_name=dataset.name,
        )
        if decision.skip and existing is not None:
            return existing

    trials, average = await run_trials_async(
        scorer, dataset, num_scorer_trials=num_scorer_trials, max_concurrency=max_concurrency, on_progress=on_progress
    )
    metrics = compute_dataset_metrics(dataset, trials, average_score_time_seconds=average, alpha_level=alpha_level)
    if update_registry_behavior is not RegistryUpdateBehavior.NEVER_UPDATE:
        if _decided_nothing(metrics):
            # Every rate is undefined (None): a registry entry would only break the comparisons
            # users run over get_all_*_metrics (sorting by f1_score / mean_absolute_error).
            log.warning(
                "%s: no response of %r was decided (every score UNDETERMINED): not recorded in the "
                "metrics registry %s",
                identifier.class_name, dataset.name, registry.path,
            )
        else:
            registry.replace(identifier, eval_hash, metrics)
    return metrics


def _decided_nothing(metrics: ObjectiveScorerMetrics | HarmScorerMetrics) -> bool:
    if isinstance(metrics, ObjectiveScorerMetrics):
        return metrics.accuracy is None
    return metrics.mean_absolute_error is None


def get_scorer_metrics(
    scorer: EvaluableScorer, *, harm_category: str | None = None, registry_path: Path | str | None = None
) -> ObjectiveScorerMetrics | HarmScorerMetrics | None:
    """The stored metrics for this scorer's evaluation hash, or None.

    Harm scorers are stored per harm category, so ``harm_category`` is required for them.
    """
    metrics_type = metrics_type_for(scorer)
    if metrics_type is MetricsType.HARM and not harm_category:
        raise ValueError("harm_category is required to look up a float_scale scorer's metrics")
    return MetricsRegistry(registry_path).find(
        evaluation_hash(scorer.get_identifier()), metrics_type, harm_category=harm_category
    )
