"""``output_scorer_async``: one scorer configuration and its stored metrics, as seed 004 prints them.

The identity block lists the scorer's class and parameters, then its sub-scorers (a composite's,
an inverter's) indented under "Composite of N scorer(s)"; a prompt target's model name is shown
on the scorer that uses it. The metrics block is the registry entry for that configuration
(objective, or harm for ``harm_category``), or a line saying none was recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from scoring.evaluation.dataset import MetricsType
from scoring.evaluation.identity import TARGET_CHILD_KEYS, evaluation_hash
from scoring.evaluation.metrics import HarmScorerMetrics, ObjectiveScorerMetrics
from scoring.evaluation.protocols import ScorerIdentifierLike
from scoring.evaluation.registry import MetricsRegistry

NOT_EVALUATED = "Official evaluation has not been run yet for this specific configuration"


def _children(value: object) -> list[ScorerIdentifierLike]:
    if isinstance(value, ScorerIdentifierLike):
        return [value]
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [v for v in value if isinstance(v, ScorerIdentifierLike)]
    return []


def _identity_lines(identifier: ScorerIdentifierLike, indent: str) -> list[str]:
    lines = [f"{indent}• Scorer Type: {identifier.class_name}"]
    params: Mapping[str, object] = identifier.params
    lines += [f"{indent}• {k}: {v}" for k, v in params.items() if v is not None and k != "system_prompt"]
    scorers: list[ScorerIdentifierLike] = []
    for name, value in identifier.children.items():
        for child in _children(value):
            if name in TARGET_CHILD_KEYS:  # a prompt target: its model, not a sub-scorer
                model = child.params.get("model_name")
                if model is not None:
                    lines.append(f"{indent}• model_name: {model}")
            else:
                scorers.append(child)
    if scorers:
        lines.append(f"{indent}  └─ Composite of {len(scorers)} scorer(s):")
        for child in scorers:
            lines += _identity_lines(child, indent + "      ")
    return lines


def _number(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def _metric_lines(metrics: ObjectiveScorerMetrics | HarmScorerMetrics | None, indent: str) -> list[str]:
    if metrics is None:
        return [f"{indent}{NOT_EVALUATED}"]
    rows: Iterable[tuple[str, str]]
    if isinstance(metrics, ObjectiveScorerMetrics):
        se = metrics.accuracy_standard_error
        rows = [
            ("Accuracy", _number(metrics.accuracy, ".2%")),
            ("Accuracy Std Error", "n/a" if se is None else f"±{se:.4f}"),
            ("F1 Score", _number(metrics.f1_score, ".4f")),
            ("Precision", _number(metrics.precision, ".4f")),
            ("Recall", _number(metrics.recall, ".4f")),
        ]
    else:
        se = metrics.mae_standard_error
        rows = [
            ("Mean Absolute Error", _number(metrics.mean_absolute_error, ".4f")),
            ("MAE Std Error", "n/a" if se is None else f"±{se:.4f}"),
            ("Krippendorff Alpha (Combined)", _number(metrics.krippendorff_alpha_combined, ".4f")),
            ("Krippendorff Alpha (Model)", _number(metrics.krippendorff_alpha_model, ".4f")),
        ]
    lines = [f"{indent}• {name}: {value}" for name, value in rows]
    lines.append(f"{indent}• Average Score Time: {_number(metrics.average_score_time_seconds, '.2f')}s")
    return lines


def format_scorer(
    scorer_identifier: ScorerIdentifierLike,
    *,
    harm_category: str | None = None,
    registry_path: Path | str | None = None,
) -> str:
    """The printed block for one configuration (see the module docstring)."""
    metrics_type = MetricsType.HARM if harm_category else MetricsType.OBJECTIVE
    found = MetricsRegistry(registry_path).find(
        evaluation_hash(scorer_identifier), metrics_type, harm_category=harm_category
    )
    lines = ["", "  📊 Scorer Information", "    ▸ Scorer Identifier"]
    lines += _identity_lines(scorer_identifier, "      ")
    lines += ["", "    ▸ Performance Metrics"]
    lines += _metric_lines(found, "      ")
    return "\n".join(lines)


async def output_scorer_async(
    scorer_identifier: ScorerIdentifierLike,
    *,
    harm_category: str | None = None,
    registry_path: Path | str | None = None,
) -> None:
    """Print a scorer configuration and its stored metrics (``harm_category``: a harm scorer's)."""
    print(format_scorer(scorer_identifier, harm_category=harm_category, registry_path=registry_path))
