"""Scorer evaluation: how well a scorer agrees with human labels (PyRIT's "Scorer Metrics").

Pure library. Importing this package pulls in neither the network client used by the
self-ask judges (:mod:`scoring.evaluation.judges`, imported on demand) nor the CLI
command (:mod:`scoring.evaluation.command`), and never imports ``scoring.score``: scorers
are used through the :class:`EvaluableScorer` Protocol. (The judges and the Likert scales,
imported on demand, use ``scoring.score.evaluable`` for seed 004's methods on a scorer.)
"""

from scoring.evaluation.dataset import (
    DatasetError,
    HumanLabeledDataset,
    LabeledEntry,
    MetricsType,
    combine_datasets,
    load_csv,
    load_human_labeled_dataset,
    resolve_dataset_files,
)
from scoring.evaluation.evaluator import (
    compute_dataset_metrics,
    evaluate_async,
    get_scorer_metrics,
    metrics_type_for,
    run_trials_async,
)
from scoring.evaluation.identity import SimpleScorerIdentifier, evaluation_hash, identity_to_dict
from scoring.evaluation.krippendorff import AlphaLevel, krippendorff_alpha
from scoring.evaluation.metrics import (
    CONTESTED_THRESHOLD,
    HarmScorerMetrics,
    ItemResult,
    ObjectiveScorerMetrics,
    ScorerMetrics,
    compute_harm_metrics,
    compute_objective_metrics,
    one_sample_t_test,
    wilson_interval,
)
from scoring.evaluation.protocols import EvaluableScorer, ScoreLike, ScorerIdentifierLike, is_undetermined
from scoring.evaluation.registry import (
    MetricsRegistry,
    RegistryUpdateBehavior,
    ScorerMetricsWithIdentity,
    decide_skip,
    default_registry_path,
    get_all_harm_metrics,
    get_all_objective_metrics,
)
from scoring.evaluation.traces import (
    LabeledTrace,
    LabeledTraceDataset,
    TraceEvaluableScorer,
    TraceScorerMetrics,
    TraceVerdict,
    evaluate_traces_async,
    load_labeled_traces,
)

__all__ = [
    "CONTESTED_THRESHOLD",
    "AlphaLevel",
    "DatasetError",
    "EvaluableScorer",
    "HarmScorerMetrics",
    "HumanLabeledDataset",
    "ItemResult",
    "LabeledEntry",
    "LabeledTrace",
    "LabeledTraceDataset",
    "MetricsRegistry",
    "MetricsType",
    "ObjectiveScorerMetrics",
    "RegistryUpdateBehavior",
    "ScoreLike",
    "ScorerIdentifierLike",
    "ScorerMetrics",
    "ScorerMetricsWithIdentity",
    "SimpleScorerIdentifier",
    "TraceEvaluableScorer",
    "TraceScorerMetrics",
    "TraceVerdict",
    "combine_datasets",
    "compute_dataset_metrics",
    "compute_harm_metrics",
    "compute_objective_metrics",
    "decide_skip",
    "default_registry_path",
    "evaluate_async",
    "evaluate_traces_async",
    "evaluation_hash",
    "get_all_harm_metrics",
    "get_all_objective_metrics",
    "get_scorer_metrics",
    "identity_to_dict",
    "is_undetermined",
    "krippendorff_alpha",
    "load_csv",
    "load_human_labeled_dataset",
    "load_labeled_traces",
    "metrics_type_for",
    "one_sample_t_test",
    "resolve_dataset_files",
    "run_trials_async",
    "wilson_interval",
]
