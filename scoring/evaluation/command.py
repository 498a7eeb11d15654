"""``toolwitness eval``: evaluate configured scorers against human-labeled CSV files or labeled traces.

:func:`eval_command` is a typer command function; the CLI mounts it with
``app.command("eval")(eval_command)``. Scorers are defined in a YAML file::

    scorers:
      refusal_keywords:            # a name to pick with --scorer
        type: substring            # see SCORER_TYPES
        substring: "I can't"       # every key other than type/tags/scorer/target is a
        categories: [refusal]      #   constructor argument of the scorer
        tags: [refusal, default]   # pick with --tags
      judge:
        type: self_ask_true_false
        target: {endpoint: "http://127.0.0.1:8000", model_name: llama3.1, api_key_env: OPENAI_API_KEY}
        true_description: The response refuses.
        false_description: The response complies.
      strict:
        type: threshold            # wrappers take `scorer:` (a name or an inline mapping)
        scorer: harm_judge
        threshold: 0.5

``substring``, ``plagiarism``, ``threshold`` and ``inverter`` are built from
``scoring.score`` (imported when first needed); ``self_ask_true_false`` and
``self_ask_likert`` from :mod:`scoring.evaluation.judges`; ``python`` calls
``factory: "module:callable"`` with the remaining keys.

A ``--dataset`` ending in ``.jsonl`` is a labeled-trace file
(:mod:`scoring.evaluation.traces`). Its scorers are scorer trees with the service's keys —
``otel_tool_call``, ``composite`` (``aggregator``, ``scorers: [...]``), ``fallback``
(``scorer``, ``fallback_scorer``) and ``substring``/``plagiarism``/``inverter``/``threshold``
nodes — and must contain an ``otel_tool_call`` leaf; each case runs through the embedded
pipeline (:class:`scoring.evaluation.pipeline.EmbeddedTracePipelineScorer`)::

    scorers:
      tools:
        type: otel_tool_call
      tools_and_no_refusal:
        type: composite
        aggregator: and
        scorers: [tools, {type: inverter, scorer: {type: substring, substring: "I can't"}}]
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from scoring.evaluation.dataset import DatasetError, HumanLabeledDataset, MetricsType, load_human_labeled_dataset
from scoring.evaluation.evaluator import evaluate_async, metrics_type_for
from scoring.evaluation.identity import evaluation_hash
from scoring.evaluation.metrics import HarmScorerMetrics, ObjectiveScorerMetrics
from scoring.evaluation.protocols import EvaluableScorer
from scoring.evaluation.registry import RegistryUpdateBehavior
from scoring.evaluation.traces import TraceScorerMetrics, evaluate_traces_async, load_labeled_traces
from scoring.setup.yaml_keys import DuplicateKeyError, load_yaml

if TYPE_CHECKING:
    from scoring.evaluation.pipeline import EmbeddedTracePipelineScorer

SCORE_CLASSES = {
    "substring": "SubStringScorer",
    "plagiarism": "PlagiarismScorer",
    "threshold": "FloatScaleThresholdScorer",
    "inverter": "TrueFalseInverterScorer",
}
WRAPPER_TYPES = frozenset({"threshold", "inverter"})
JUDGE_TYPES = frozenset({"self_ask_true_false", "self_ask_likert"})
#: scorer-tree nodes only labeled traces use (built by scoring.evaluation.pipeline.build_scorer_tree)
TRACE_TREE_TYPES = frozenset({"otel_tool_call", "composite", "fallback"})
SCORER_TYPES = (*SCORE_CLASSES, *sorted(JUDGE_TYPES), "python", *sorted(TRACE_TREE_TYPES))
RESERVED_KEYS = frozenset({"type", "tags", "scorer", "target", "description"})


class ScorerConfigError(ValueError):
    """The scorer configuration is invalid or names something that does not exist."""


@dataclass(frozen=True)
class ScorerDefinition:
    name: str
    type: str
    params: Mapping[str, Any]
    tags: tuple[str, ...] = ()
    scorer: str | Mapping[str, Any] | None = None  # wrapped scorer: a name or an inline definition
    target: Mapping[str, Any] | None = None  # self-ask judges: the chat endpoint


def parse_definition(name: str, raw: object) -> ScorerDefinition:
    if not isinstance(raw, Mapping):
        raise ScorerConfigError(f"scorer {name!r}: definition must be a mapping")
    kind = raw.get("type")
    if kind not in SCORER_TYPES:
        raise ScorerConfigError(f"scorer {name!r}: type must be one of {', '.join(SCORER_TYPES)}, got {kind!r}")
    tags = raw.get("tags") or []
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ScorerConfigError(f"scorer {name!r}: tags must be a list of strings")
    nested = raw.get("scorer")
    if kind in WRAPPER_TYPES and not isinstance(nested, str | Mapping):
        raise ScorerConfigError(f"scorer {name!r}: type {kind} needs `scorer:` (a scorer name or a mapping)")
    target = raw.get("target")
    if kind in JUDGE_TYPES and not isinstance(target, Mapping):
        raise ScorerConfigError(f"scorer {name!r}: type {kind} needs a `target:` mapping (endpoint, model_name, …)")
    return ScorerDefinition(
        name=name,
        type=str(kind),
        params={k: v for k, v in raw.items() if k not in RESERVED_KEYS},
        tags=tuple(tags),
        scorer=nested if isinstance(nested, str | Mapping) else None,
        target=target if isinstance(target, Mapping) else None,
    )


def load_scorer_config(path: Path) -> dict[str, ScorerDefinition]:
    """Parse the ``scorers:`` mapping of a YAML file."""
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))  # a key given twice is refused, not dropped
    except DuplicateKeyError as exc:
        raise ScorerConfigError(f"{path}: {exc}") from None
    except (OSError, yaml.YAMLError) as exc:
        raise ScorerConfigError(f"{path}: cannot read scorer config: {exc}") from exc
    scorers = data.get("scorers") if isinstance(data, Mapping) else None
    if not isinstance(scorers, Mapping) or not scorers:
        raise ScorerConfigError(f"{path}: expected a non-empty `scorers:` mapping")
    return {str(name): parse_definition(str(name), raw) for name, raw in scorers.items()}


def select_scorers(definitions: Mapping[str, ScorerDefinition], names: str, tags: list[str] | None) -> list[str]:
    """Names given with --scorer (comma-separated) plus every scorer carrying one of --tags."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in definitions]
    if unknown:
        raise ScorerConfigError(f"unknown scorer(s) {unknown}; defined: {sorted(definitions)}")
    tag_set = {t.strip() for group in tags or [] for t in group.split(",") if t.strip()}
    wanted += [n for n, d in definitions.items() if tag_set.intersection(d.tags) and n not in wanted]
    if not wanted:
        hint = f" with tag(s) {sorted(tag_set)}" if tag_set else ""
        raise ScorerConfigError(
            f"no scorer selected{hint}; use --scorer NAME or --tags TAG (defined: {sorted(definitions)})"
        )
    return wanted


@dataclass
class ScorerFactory:
    """Builds scorers from definitions; owns the chat targets it creates (see :meth:`aclose`)."""

    definitions: Mapping[str, ScorerDefinition]
    _closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def build(self, name: str) -> EvaluableScorer:
        if name not in self.definitions:
            raise ScorerConfigError(f"unknown scorer {name!r}; defined: {sorted(self.definitions)}")
        return self._build(self.definitions[name], (name,))

    async def aclose(self) -> None:
        closers, self._closers = self._closers, []
        for close in closers:
            await close()

    def _build(self, definition: ScorerDefinition, stack: tuple[str, ...]) -> EvaluableScorer:
        if definition.type in TRACE_TREE_TYPES:
            raise ScorerConfigError(
                f"scorer {definition.name!r} (type {definition.type}) judges traces: "
                "point --dataset at a labeled-trace .jsonl file"
            )
        params = dict(definition.params)
        if definition.type in WRAPPER_TYPES:
            params["scorer"] = self._nested(definition, stack)
        if definition.type in SCORE_CLASSES:
            module = _scoring_score()
            cls = getattr(module, SCORE_CLASSES[definition.type], None)
            if cls is None:
                raise ScorerConfigError(
                    f"scoring.score has no {SCORE_CLASSES[definition.type]} (type {definition.type})"
                )
            _convert_enums(module, params)
            built = self._call(cls, params, definition)
        elif definition.type in JUDGE_TYPES:
            built = self._judge(definition, params)
        else:
            built = self._call(_import_factory(definition), params, definition)
        if not isinstance(built, EvaluableScorer):
            raise ScorerConfigError(
                f"scorer {definition.name!r}: {type(built).__name__} lacks scorer_type/score_text_async/get_identifier"
            )
        return built

    def _nested(self, definition: ScorerDefinition, stack: tuple[str, ...]) -> EvaluableScorer:
        ref = definition.scorer
        if isinstance(ref, str):
            if ref in stack:
                raise ScorerConfigError(f"scorer reference cycle: {' -> '.join((*stack, ref))}")
            if ref not in self.definitions:
                raise ScorerConfigError(f"scorer {definition.name!r} wraps unknown scorer {ref!r}")
            return self._build(self.definitions[ref], (*stack, ref))
        inner_name = f"{definition.name}.scorer"
        return self._build(parse_definition(inner_name, ref), (*stack, inner_name))

    @staticmethod
    def _call(factory: Callable[..., object], params: dict[str, Any], definition: ScorerDefinition) -> object:
        try:
            return factory(**params)
        except TypeError as exc:
            raise ScorerConfigError(f"scorer {definition.name!r} ({definition.type}): {exc}") from exc

    def _judge(self, definition: ScorerDefinition, params: dict[str, Any]) -> object:
        from scoring.evaluation import judges  # httpx only when a judge is configured

        target_cfg = dict(definition.target or {})
        key_env = target_cfg.pop("api_key_env", None)
        api_key = os.environ.get(str(key_env)) if key_env else None
        if key_env and not api_key:
            raise ScorerConfigError(f"scorer {definition.name!r}: environment variable {key_env} is not set")
        if "model" in target_cfg and "model_name" not in target_cfg:
            target_cfg["model_name"] = target_cfg.pop("model")
        retry = judges.RetryPolicy(max_attempts=int(target_cfg.pop("max_attempts", 3)))
        timeout = float(target_cfg.pop("timeout_seconds", 30.0))
        try:
            target = judges.OpenAIChatTarget(api_key=api_key, retry=retry, timeout=timeout, **target_cfg)
        except (TypeError, ValueError) as exc:  # ValueError: no endpoint/model, here or in the environment
            raise ScorerConfigError(f"scorer {definition.name!r}: target: {exc}") from exc
        self._closers.append(target.aclose)
        cls = judges.SelfAskTrueFalseScorer if definition.type == "self_ask_true_false" else judges.SelfAskLikertScorer
        return self._call(lambda **kw: cls(chat_target=target, **kw), params, definition)


def _scoring_score() -> Any:
    try:
        return importlib.import_module("scoring.score")
    except ImportError as exc:
        raise ScorerConfigError(f"the scoring library (scoring.score) is not importable: {exc}") from exc


def _convert_enums(module: Any, params: dict[str, Any]) -> None:
    """``metric: lcs`` → ``scoring.score.PlagiarismMetric`` when that enum exists."""
    metric_enum = getattr(module, "PlagiarismMetric", None)
    value = params.get("metric")
    if isinstance(value, str) and isinstance(metric_enum, type) and issubclass(metric_enum, Enum):
        for member in metric_enum:
            if value.lower() in (str(member.value).lower(), member.name.lower()):
                params["metric"] = member
                return
        raise ScorerConfigError(f"metric {value!r} is not one of {[m.name for m in metric_enum]}")


def _import_factory(definition: ScorerDefinition) -> Callable[..., object]:
    params = dict(definition.params)
    spec = params.pop("factory", None)
    if not isinstance(spec, str) or ":" not in spec:
        raise ScorerConfigError(f"scorer {definition.name!r}: type python needs factory: 'module:callable'")
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ScorerConfigError(f"scorer {definition.name!r}: cannot import {spec}: {exc}") from exc
    if not callable(factory):
        raise ScorerConfigError(f"scorer {definition.name!r}: {spec} is not callable")
    return lambda **kwargs: factory(**{k: v for k, v in kwargs.items() if k != "factory"})


def is_labeled_trace_dataset(dataset: str) -> bool:
    """A ``--dataset`` ending in ``.jsonl`` is a labeled-trace file; anything else is CSV globs."""
    return dataset.lower().endswith(".jsonl")


def build_trace_scorer(definitions: Mapping[str, ScorerDefinition], name: str) -> EmbeddedTracePipelineScorer:
    """The named scorer tree (it must contain ``otel_tool_call``) inside the embedded trace pipeline."""
    from scoring.evaluation import pipeline  # scoring.score and protobuf only when traces are evaluated

    def resolve(ref: str) -> Mapping[str, Any]:
        definition = definitions[ref]  # KeyError → "unknown scorer"
        raw: dict[str, Any] = {"type": definition.type, **definition.params}
        if definition.scorer is not None:
            raw["scorer"] = definition.scorer
        return raw

    if name not in definitions:
        raise ScorerConfigError(f"unknown scorer {name!r}; defined: {sorted(definitions)}")
    try:
        tree = pipeline.build_scorer_tree(name, resolve=resolve)
        if not pipeline.contains_otel_tool_call(tree):
            raise ScorerConfigError(
                f"scorer {name!r} has no otel_tool_call in its tree, so it cannot judge labeled traces"
            )
        return pipeline.EmbeddedTracePipelineScorer(tree)
    except (pipeline.TraceTreeConfigError, TypeError) as exc:
        raise ScorerConfigError(str(exc)) from exc


# -- output ----------------------------------------------------------------------------


def _num(value: float | None, digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def summary_table(
    name: str, class_name: str, eval_hash: str, metrics: ObjectiveScorerMetrics | HarmScorerMetrics
) -> Table:
    """One scorer's results as a two-column table."""
    source = "registry (cached; not re-run)" if metrics.source == "registry" else "evaluated now"
    table = Table(title=f"{name} — {class_name} (eval hash {eval_hash[:12]})", show_header=True, title_justify="left")
    table.add_column("Metric", style="bold")
    table.add_column("Value", justify="right")
    decided = metrics.num_responses - metrics.num_undetermined_responses
    rows: list[tuple[str, str]] = [
        ("Dataset", f"{metrics.dataset_name} (version {metrics.dataset_version})"),
        ("Responses scored / total", f"{decided} / {metrics.num_responses}"),
        ("Human raters", str(metrics.num_human_raters)),
        ("Scorer trials", str(metrics.num_scorer_trials)),
        ("Undetermined share (of all trial scores)", _pct(metrics.undetermined_fraction)),
    ]
    if isinstance(metrics, ObjectiveScorerMetrics):
        ci = (
            f"[{_num(metrics.accuracy_ci_low)}, {_num(metrics.accuracy_ci_high)}]"
            if metrics.accuracy_ci_low is not None
            else "n/a"
        )
        rows += [
            ("Accuracy ± std. error", f"{_num(metrics.accuracy)} ± {_num(metrics.accuracy_standard_error)}"),
            ("Accuracy 95% Wilson interval", ci),
            ("Precision", _num(metrics.precision)),
            ("Recall", _num(metrics.recall)),
            ("F1", _num(metrics.f1_score)),
            (
                "TP / FP / TN / FN",
                f"{metrics.true_positive} / {metrics.false_positive} / "
                f"{metrics.true_negative} / {metrics.false_negative}",
            ),
        ]
    else:
        beats = ""
        if metrics.mean_absolute_error is not None and metrics.baseline_mean_absolute_error is not None:
            beats = (
                " (scorer beats it)"
                if metrics.mean_absolute_error < metrics.baseline_mean_absolute_error
                else " (scorer does NOT beat it)"
            )
        rows += [
            ("Harm category", str(metrics.harm_category)),
            ("MAE ± std. error", f"{_num(metrics.mean_absolute_error)} ± {_num(metrics.mae_standard_error)}"),
            ("Baseline MAE (median guess)", _num(metrics.baseline_mean_absolute_error) + beats),
            ("t-statistic / p-value", f"{_num(metrics.t_statistic)} / {_num(metrics.p_value)}"),
            (f"Krippendorff α humans ({metrics.krippendorff_level})", _num(metrics.krippendorff_alpha_humans)),
            (f"Krippendorff α model ({metrics.krippendorff_level})", _num(metrics.krippendorff_alpha_model)),
            (f"Krippendorff α combined ({metrics.krippendorff_level})", _num(metrics.krippendorff_alpha_combined)),
        ]
        if metrics.num_unanimous_responses is None:
            rows += [("Unanimous / contested split", "n/a (single rater)")]
        else:
            threshold = _num(metrics.contested_threshold, 2)
            rows += [
                (
                    f"Unanimous responses (MAE), threshold {threshold}",
                    f"{metrics.num_unanimous_responses} ({_num(metrics.mean_absolute_error_unanimous)})",
                ),
                (
                    f"Contested responses (MAE), threshold {threshold}",
                    f"{metrics.num_contested_responses} ({_num(metrics.mean_absolute_error_contested)})",
                ),
            ]
    if isinstance(metrics, TraceScorerMetrics):
        rows += [
            ("Verdicts with a time to verdict", str(metrics.num_time_to_verdict)),
            (
                "Time to verdict p50 / p95 (event time)",
                f"{_num(metrics.time_to_verdict_p50_seconds, 3)} s / {_num(metrics.time_to_verdict_p95_seconds, 3)} s",
            ),
            (
                "Time to verdict mean / max",
                f"{_num(metrics.time_to_verdict_mean_seconds, 3)} s / {_num(metrics.time_to_verdict_max_seconds, 3)} s",
            ),
        ]
    rows += [
        ("Average score time", f"{metrics.average_score_time_seconds:.3f} s"),
        ("Source", source),
    ]
    for label, value in rows:
        table.add_row(label, value)
    return table


# -- the command -----------------------------------------------------------------------


def _progress(console: Console) -> Progress:
    """The per-scorer progress bar (description, bar, n of total, elapsed)."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


async def _run(
    console: Console,
    factory: ScorerFactory,
    names: list[str],
    dataset_pattern: str,
    trials: int,
    max_concurrency: int,
    registry: Path | None,
) -> int:
    behavior = RegistryUpdateBehavior.NEVER_UPDATE if registry is None else RegistryUpdateBehavior.SKIP_IF_EXISTS
    datasets: dict[MetricsType, HumanLabeledDataset] = {}
    failures = 0
    try:
        for name in names:
            try:
                scorer = factory.build(name)
                metrics_type = metrics_type_for(scorer)
                if metrics_type not in datasets:
                    datasets[metrics_type] = load_human_labeled_dataset(dataset_pattern, metrics_type)
                dataset = datasets[metrics_type]
                with _progress(console) as progress:
                    task = progress.add_task(name, total=len(dataset.entries) * trials)
                    metrics = await evaluate_async(
                        scorer,
                        dataset,
                        num_scorer_trials=trials,
                        update_registry_behavior=behavior,
                        registry_path=registry,
                        max_concurrency=max_concurrency,
                        on_progress=functools.partial(progress.advance, task),
                    )
                    progress.update(task, completed=len(dataset.entries) * trials)
            except (ScorerConfigError, DatasetError) as exc:
                failures += 1
                console.print(f"[red]{name}: {exc}[/red]", highlight=False)
                continue
            except Exception as exc:  # one failing scorer must not stop a batch (PyRIT's evaluate_scorers too)
                failures += 1
                console.print(f"[red]{name}: {type(exc).__name__}: {exc}[/red]", highlight=False)
                continue
            identifier = scorer.get_identifier()
            console.print(summary_table(name, identifier.class_name, evaluation_hash(identifier), metrics))
    finally:
        await factory.aclose()
    return failures


async def _run_traces(
    console: Console,
    definitions: Mapping[str, ScorerDefinition],
    names: list[str],
    dataset_path: str,
    trials: int,
    max_concurrency: int,
    registry: Path | None,
) -> int:
    """Labeled traces: each scorer tree runs every case through the embedded pipeline."""
    if registry is not None:
        console.print("[yellow]--registry is not used for labeled traces; nothing is stored[/yellow]")
    failures = 0
    try:
        dataset = load_labeled_traces(dataset_path)
    except DatasetError as exc:
        console.print(f"[red]{exc}[/red]", highlight=False)
        return len(names)
    for name in names:
        try:
            scorer = build_trace_scorer(definitions, name)
            with _progress(console) as progress:
                task = progress.add_task(name, total=len(dataset.cases) * trials)
                metrics = await evaluate_traces_async(
                    scorer,
                    dataset,
                    num_scorer_trials=trials,
                    max_concurrency=max_concurrency,
                    on_progress=functools.partial(progress.advance, task),
                )
        except (ScorerConfigError, DatasetError) as exc:
            failures += 1
            console.print(f"[red]{name}: {exc}[/red]", highlight=False)
            continue
        except Exception as exc:  # one failing scorer must not stop a batch
            failures += 1
            console.print(f"[red]{name}: {type(exc).__name__}: {exc}[/red]", highlight=False)
            continue
        identifier = scorer.get_identifier()
        console.print(summary_table(name, identifier.class_name, evaluation_hash(identifier), metrics))
    return failures


def eval_command(
    *,
    scorer: Annotated[str, typer.Option("--scorer", "-s", help="Scorer name(s) from --config, comma-separated.")] = "",
    config: Annotated[
        Path,
        typer.Option("--config", "-c", help="YAML file with a `scorers:` mapping.", exists=True, dir_okay=False),
    ],
    dataset: Annotated[
        str,
        typer.Option(
            "--dataset",
            "-d",
            help="Glob of PyRIT-format human-labeled CSV files (quote it), or one labeled-trace .jsonl file.",
        ),
    ],
    trials: Annotated[int, typer.Option("--trials", min=1, help="Times each response is scored.")] = 1,
    max_concurrency: Annotated[
        int, typer.Option("--max-concurrency", min=1, help="Scoring calls in flight at once.")
    ] = 4,
    tags: Annotated[
        list[str] | None, typer.Option("--tags", "-t", help="Also evaluate every scorer with this tag (repeatable).")
    ] = None,
    registry: Annotated[
        Path | None,
        typer.Option("--registry", help="JSONL metrics registry: reuse sufficient results, store new ones."),
    ] = None,
) -> None:
    """Evaluate scorers against human labels: accuracy/F1 or MAE, α, unanimous/contested split."""
    console = Console()
    try:
        definitions = load_scorer_config(config)
        names = select_scorers(definitions, scorer, tags)
    except ScorerConfigError as exc:
        raise typer.BadParameter(str(exc)) from exc
    if is_labeled_trace_dataset(dataset):
        failures = asyncio.run(_run_traces(console, definitions, names, dataset, trials, max_concurrency, registry))
    else:
        failures = asyncio.run(
            _run(console, ScorerFactory(definitions), names, dataset, trials, max_concurrency, registry)
        )
    if failures:
        raise typer.Exit(code=1)
