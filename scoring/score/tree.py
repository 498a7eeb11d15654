"""Scorer trees from configuration (the service's named trees and ``toolwitness eval``'s).

A tree node is a mapping with a ``type`` (otel_tool_call, substring, plagiarism, composite,
inverter, threshold, fallback) and that type's keys; errors name the config path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from scoring.models.evidence import Observation
from scoring.score.base import FloatScaleScorer, Scorer, TrueFalseScorer
from scoring.score.observation.source import EvidenceScorable
from scoring.score.text_scorers import PlagiarismScorer, SubStringScorer
from scoring.score.trace_scorer import OtelToolCallScorer
from scoring.score.wrappers import (
    FloatScaleFallbackScorer,
    FloatScaleThresholdScorer,
    TrueFalseCompositeScorer,
    TrueFalseFallbackScorer,
    TrueFalseInverterScorer,
    TrueFalseScoreAggregator,
)


class ReplayOnlySource:
    """The leaf source of trees built from configuration: they judge observations (replay) only.

    The service and the evaluation pipeline both build their trees here, so the same
    configuration has the same identity hash in both.
    """

    async def acquire(self, scorable: EvidenceScorable, trace_ids: Sequence[str] | None = None) -> Observation:
        raise RuntimeError("configured scorer trees judge observations only (replay mode)")


TREE_TYPES = ("otel_tool_call", "substring", "plagiarism", "composite", "inverter", "threshold", "fallback")
_TREE_KEYS = frozenset(
    {
        "type",
        "substring",
        "case_sensitive",
        "reference_text",
        "aggregator",
        "threshold",
        "categories",
        "scorers",
        "scorer",
        "fallback_scorer",
    }
)
#: the keys each node type takes (besides ``type`` and ``categories``): any other is a mistake
#: (a mis-nested tree would otherwise run as another tree, silently)
TREE_KEYS_BY_TYPE: dict[str, frozenset[str]] = {
    "otel_tool_call": frozenset(),
    "substring": frozenset({"substring", "case_sensitive"}),
    "plagiarism": frozenset({"reference_text"}),
    "composite": frozenset({"aggregator", "scorers"}),
    "inverter": frozenset({"scorer"}),
    "threshold": frozenset({"scorer", "threshold"}),
    "fallback": frozenset({"scorer", "fallback_scorer"}),
}


def keys_not_for(kind: str, keys: Iterable[str]) -> list[str]:
    """The keys of ``keys`` a node of type ``kind`` does not take."""
    return sorted(set(keys) - TREE_KEYS_BY_TYPE[kind] - {"type", "categories"})


class ScorerTreeConfigError(ValueError):
    """A scorer-tree configuration is invalid; the message names the config path."""


def build_scorer_tree(
    config: Mapping[str, Any] | str,
    *,
    path: str = "scorer",
    resolve: Callable[[str], Mapping[str, Any]] | None = None,
    _stack: tuple[str, ...] = (),
) -> Scorer:
    """Build a scorer tree from the service's tree configuration (``ScorerTreeConfig`` keys).

    Types: ``otel_tool_call`` (its source is :class:`ReplayOnlySource`), ``substring``
    (``substring``, ``case_sensitive``), ``plagiarism`` (``reference_text``), ``composite``
    (``aggregator`` and/or/majority, ``scorers: [...]``), ``inverter`` and ``threshold``
    (``scorer``, ``threshold``), ``fallback`` (``scorer``, ``fallback_scorer``); every node
    takes ``categories``. A child may be a mapping or, with ``resolve``, the name of another
    definition (reference cycles are errors).

    Raises:
        ScorerTreeConfigError: naming the config path of the problem.
    """
    if isinstance(config, str):
        if resolve is None:
            raise ScorerTreeConfigError(f"{path}: a scorer name ({config!r}) needs a mapping here")
        if config in _stack:
            raise ScorerTreeConfigError(f"scorer reference cycle: {' -> '.join((*_stack, config))}")
        try:
            resolved = resolve(config)
        except KeyError:
            raise ScorerTreeConfigError(f"{path}: unknown scorer {config!r}") from None
        return build_scorer_tree(resolved, path=config, resolve=resolve, _stack=(*_stack, config))
    if not isinstance(config, Mapping):
        raise ScorerTreeConfigError(f"{path}: a scorer must be a mapping, got {type(config).__name__}")
    kind = config.get("type")
    if kind not in TREE_TYPES:
        raise ScorerTreeConfigError(f"{path}: type must be one of {', '.join(TREE_TYPES)}, got {kind!r}")
    unknown = sorted(set(config) - _TREE_KEYS)
    if unknown:
        raise ScorerTreeConfigError(f"{path}: unknown key(s) {unknown} for a scorer tree node")
    # a key left at its empty default (a dumped config has them all) says nothing
    misplaced = keys_not_for(kind, (k for k, v in config.items() if v is not None and v is not False and v != []))
    if misplaced:
        takes = ", ".join(sorted(TREE_KEYS_BY_TYPE[kind])) or "no other key"
        raise ScorerTreeConfigError(f"{path}: {misplaced} do(es) not apply to type {kind!r} (it takes: {takes})")
    raw_categories = config.get("categories") or []
    if not isinstance(raw_categories, list | tuple) or not all(isinstance(c, str) for c in raw_categories):
        raise ScorerTreeConfigError(f"{path}: categories must be a list of strings")
    cats = list(raw_categories) or None

    def need(key: str) -> Any:
        value = config.get(key)
        if value is None:
            raise ScorerTreeConfigError(f"{path}: type {kind!r} needs {key}")
        return value

    def child(key: str, value: Any) -> Scorer:
        return build_scorer_tree(value, path=f"{path}.{key}", resolve=resolve, _stack=_stack)

    try:
        if kind == "otel_tool_call":
            return OtelToolCallScorer(source=ReplayOnlySource(), categories=cats)
        if kind == "substring":
            return SubStringScorer(
                substring=str(need("substring")), case_sensitive=bool(config.get("case_sensitive")), categories=cats
            )
        if kind == "plagiarism":
            return PlagiarismScorer(reference_text=str(need("reference_text")), categories=cats)
        if kind == "composite":
            raw_kids = need("scorers")
            if not isinstance(raw_kids, list) or not raw_kids:
                raise ScorerTreeConfigError(f"{path}: composite needs a non-empty scorers list")
            kids = [child(f"scorers[{i}]", c) for i, c in enumerate(raw_kids)]
            tf = [k for k in kids if isinstance(k, TrueFalseScorer)]
            if len(tf) != len(kids):
                raise ScorerTreeConfigError(f"{path}: composite needs true/false scorers only")
            aggregator = TrueFalseScoreAggregator(str(need("aggregator")).lower())
            return TrueFalseCompositeScorer(aggregator=aggregator, scorers=tf, categories=cats)
        if kind == "inverter":
            inner = child("scorer", need("scorer"))
            if not isinstance(inner, TrueFalseScorer):
                raise ScorerTreeConfigError(f"{path}: inverter needs a true/false scorer")
            return TrueFalseInverterScorer(scorer=inner, categories=cats)
        if kind == "threshold":
            inner = child("scorer", need("scorer"))
            if not isinstance(inner, FloatScaleScorer):
                raise ScorerTreeConfigError(f"{path}: threshold needs a float-scale scorer")
            return FloatScaleThresholdScorer(scorer=inner, threshold=float(need("threshold")), categories=cats)
        primary = child("scorer", need("scorer"))
        fallback = child("fallback_scorer", need("fallback_scorer"))
        if isinstance(primary, TrueFalseScorer) and isinstance(fallback, TrueFalseScorer):
            return TrueFalseFallbackScorer(scorer=primary, fallback_scorer=fallback, categories=cats)
        if isinstance(primary, FloatScaleScorer) and isinstance(fallback, FloatScaleScorer):
            return FloatScaleFallbackScorer(scorer=primary, fallback_scorer=fallback, categories=cats)
        raise ScorerTreeConfigError(f"{path}: fallback children must be of the same family")
    except ScorerTreeConfigError:
        raise
    except (TypeError, ValueError) as exc:  # constructor checks (empty substring, bad aggregator, …)
        raise ScorerTreeConfigError(f"{path}: {exc}") from exc


def contains_otel_tool_call(scorer: Scorer) -> bool:
    """Whether an ``OtelToolCallScorer`` is anywhere in the tree (i.e. it judges traces)."""
    return isinstance(scorer, OtelToolCallScorer) or any(contains_otel_tool_call(c) for c in scorer.children())
