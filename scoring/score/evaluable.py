"""Seed-style evaluation on the scorer itself: ``scorer.evaluation_file_mapping`` +
``await scorer.evaluate_async(...)`` / ``scorer.get_scorer_metrics()`` (PyRIT's form).

``ScorerEvalDatasetFiles`` names the human-labeled CSV files (glob patterns) and the JSONL
registry the results go to. Relative paths are taken from the scorer-evals directory:
``$TOOLWITNESS_SCORER_EVALS_PATH``, else the working directory. A relative dataset pattern
that matches nothing there is looked up in the datasets bundled with the package
(:data:`BUNDLED_SCORER_EVALS_PATH`: ``sample/mini_refusal.csv``, ``harm/<category>.csv``),
so seed 004's paths work anywhere, and a file of the same name in the scorer-evals
directory takes precedence. Results are never written into the package.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:  # the evaluation package (numpy, scipy) loads only when a scorer is evaluated
    from scoring.evaluation.metrics import HarmScorerMetrics, ObjectiveScorerMetrics
    from scoring.evaluation.protocols import EvaluableScorer
    from scoring.evaluation.registry import RegistryUpdateBehavior

SCORER_EVALS_ENV = "TOOLWITNESS_SCORER_EVALS_PATH"

#: The human-labeled datasets shipped as package data (read-only).
BUNDLED_SCORER_EVALS_PATH = Path(__file__).resolve().parents[1] / "datasets" / "scorer_evals"


def scorer_evals_path() -> Path:
    """Where relative dataset and result paths are resolved."""
    return Path(os.environ.get(SCORER_EVALS_ENV) or Path.cwd())


@dataclass(frozen=True)
class ScorerEvalDatasetFiles:
    """The human-labeled datasets a scorer is evaluated on and where its metrics are kept."""

    human_labeled_datasets_files: Sequence[str]
    #: the JSONL registry (default: the shared one, ``default_registry_path()``).
    result_file: str | None = None
    #: required for harm (float-scale) scorers, ignored for objective ones.
    harm_category: str | None = None
    #: resolve relative paths here instead of ``scorer_evals_path()``.
    root: Path | None = field(default=None)

    def __post_init__(self) -> None:
        if isinstance(self.human_labeled_datasets_files, str | bytes):
            raise TypeError("human_labeled_datasets_files is a list of glob patterns, e.g. ['sample/*.csv']")
        if not self.human_labeled_datasets_files:
            raise ValueError("human_labeled_datasets_files: give at least one CSV file or glob pattern")

    def base(self) -> Path:
        return self.root if self.root is not None else scorer_evals_path()

    def dataset_patterns(self) -> list[str]:
        """The dataset patterns to load: each relative pattern that matches no file under
        :meth:`base` but matches bundled ones is pointed at :data:`BUNDLED_SCORER_EVALS_PATH`
        (only when no explicit ``root`` was given)."""
        patterns = [str(p) for p in self.human_labeled_datasets_files]
        if self.root is not None:
            return patterns
        base = self.base()
        resolved: list[str] = []
        for pattern in patterns:
            if not Path(pattern).is_absolute() and not _matches(base / pattern):
                bundled = BUNDLED_SCORER_EVALS_PATH / pattern
                if _matches(bundled):
                    pattern = str(bundled)
            resolved.append(pattern)
        return resolved

    def registry_path(self) -> Path | None:
        if self.result_file is None:
            return None
        p = Path(self.result_file)
        return p if p.is_absolute() else self.base() / p


def _matches(pattern: Path) -> bool:
    return any(Path(p).is_file() for p in glob.iglob(str(pattern), recursive=True))


class EvaluationMethods:
    """``evaluate_async`` / ``get_scorer_metrics`` as methods of a scorer (mixed into every scorer)."""

    #: set it before ``evaluate_async``; ``get_scorer_metrics`` reads its ``result_file``.
    evaluation_file_mapping: ScorerEvalDatasetFiles | None = None

    def _evaluable(self) -> EvaluableScorer:
        return cast("EvaluableScorer", self)

    async def evaluate_async(
        self,
        file_mapping: ScorerEvalDatasetFiles | None = None,
        *,
        num_scorer_trials: int = 3,
        update_registry_behavior: RegistryUpdateBehavior | None = None,
        add_to_evaluation_results: bool = True,
        max_concurrency: int = 10,
    ) -> ObjectiveScorerMetrics | HarmScorerMetrics:
        """Evaluate this scorer on ``file_mapping``'s datasets, else ``evaluation_file_mapping``'s
        (see :func:`scoring.evaluation.evaluate_async`; ``update_registry_behavior`` defaults to
        ``SKIP_IF_EXISTS``); ``add_to_evaluation_results=False`` neither reads nor writes the
        registry."""
        from scoring.evaluation.dataset import HumanLabeledDataset, MetricsType, load_human_labeled_dataset
        from scoring.evaluation.evaluator import evaluate_async
        from scoring.evaluation.protocols import FLOAT_SCALE
        from scoring.evaluation.registry import RegistryUpdateBehavior

        files = file_mapping if file_mapping is not None else self.evaluation_file_mapping
        if files is None:
            raise ValueError(
                f"{type(self).__name__}.evaluation_file_mapping is not set: assign "
                "ScorerEvalDatasetFiles(human_labeled_datasets_files=[...], result_file=...) first, "
                "or pass one as file_mapping (judges built with SelfAskLikertScorer.from_likert_scale "
                "get their scale's datasets)"
            )
        behavior = update_registry_behavior or RegistryUpdateBehavior.SKIP_IF_EXISTS
        if not add_to_evaluation_results:
            behavior = RegistryUpdateBehavior.NEVER_UPDATE
        patterns = files.dataset_patterns()
        dataset: HumanLabeledDataset | list[str] = patterns
        scorer = self._evaluable()
        if files.harm_category is not None and scorer.scorer_type == FLOAT_SCALE:
            # The mapping names the category the metrics are stored and looked up under: a
            # dataset of another category would be stored where get_scorer_metrics never looks.
            dataset = load_human_labeled_dataset(patterns, MetricsType.HARM, root=files.base())
            if (dataset.harm_category or "").casefold() != files.harm_category.casefold():
                raise ValueError(
                    f"evaluation_file_mapping.harm_category is {files.harm_category!r} but the datasets "
                    f"{list(files.human_labeled_datasets_files)} are labeled {dataset.harm_category!r}"
                )
        return await evaluate_async(
            scorer,
            dataset,
            num_scorer_trials=num_scorer_trials,
            update_registry_behavior=behavior,
            registry_path=files.registry_path(),
            max_concurrency=max_concurrency,
            dataset_root=files.base(),
        )

    def get_scorer_metrics(
        self, *, harm_category: str | None = None
    ) -> ObjectiveScorerMetrics | HarmScorerMetrics | None:
        """The stored metrics of this scorer's configuration (by identity), or None.

        Read from ``evaluation_file_mapping.result_file`` when set, else the shared registry; a
        harm scorer's category comes from the argument or the mapping."""
        from scoring.evaluation.evaluator import get_scorer_metrics
        from scoring.evaluation.protocols import FLOAT_SCALE

        files = self.evaluation_file_mapping
        scorer = self._evaluable()
        registry_path = files.registry_path() if files else None
        if scorer.scorer_type == FLOAT_SCALE and harm_category is None and files is not None:
            harm_category = files.harm_category
        if scorer.scorer_type == FLOAT_SCALE and harm_category is None:
            # Harm results are stored per category; with none named, the one stored for this
            # configuration (if there is exactly one), else nothing -- not an error (seed 004).
            from scoring.evaluation.identity import evaluation_hash
            from scoring.evaluation.registry import MetricsRegistry

            eval_hash = evaluation_hash(scorer.get_identifier())
            stored = [e for e in MetricsRegistry(registry_path).all_harm() if e.eval_hash == eval_hash]
            return stored[0].metrics if len(stored) == 1 else None
        return get_scorer_metrics(scorer, harm_category=harm_category, registry_path=registry_path)
