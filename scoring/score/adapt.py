"""Text scorers that are not ``scoring.score`` scorers (the self-ask judges of
``scoring.evaluation.judges``, a user's own), as leaves of a wrapper tree.

Seed 004 wraps a judge directly (``TrueFalseInverterScorer(scorer=SelfAskRefusalScorer(...))``)
and ``toolwitness eval`` configures ``threshold``/``inverter`` over ``self_ask_*`` judges. A
judge has ``scorer_type``, ``score_text_async`` and ``get_identifier`` (the members evaluation
uses), not a tree node's; :func:`as_scorer` gives it one. Nothing here imports the evaluation
package (``import scoring.score`` stays free of numpy/scipy).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any, ClassVar, Protocol, runtime_checkable

from pydantic import JsonValue

from scoring.models.conditions import ScoringExpectation
from scoring.models.scorables import Scorable
from scoring.models.score import MetadataValue, Score, ScoreType
from scoring.score.base import FloatScaleScorer, Scorer, ScoringContext, TrueFalseScorer
from scoring.score.identity import ScorerIdentifier


@runtime_checkable
class TextScorer(Protocol):
    """What a judge offers: ``scorer_type`` ("true_false" / "float_scale"), ``score_text_async``
    returning scores with ``get_value()`` and ``status``, and ``get_identifier()``."""

    @property
    def scorer_type(self) -> str: ...

    async def score_text_async(self, text: str, *, objective: str | None = None) -> Sequence[Any]: ...

    def get_identifier(self) -> Any: ...


def _undetermined(score: Any) -> bool:
    """``scoring.evaluation.protocols.is_undetermined`` (not imported: this package stays free of
    the evaluation's numpy), for a score that may lack ``status``: the status first, as a score
    without a judgment may refuse ``get_value()``."""
    status = getattr(score, "status", None)
    if isinstance(status, Enum):
        if status.name.upper() == "UNDETERMINED" or str(status.value).lower() == "undetermined":
            return True
    elif str(status).lower() == "undetermined":
        return True
    return score.get_value() is None


def _identifier(ident: Any, module: str = "") -> ScorerIdentifier:
    """A ``ScorerIdentifier`` of any identity with class_name / params / children."""
    if isinstance(ident, ScorerIdentifier):
        return ident
    children: dict[str, tuple[ScorerIdentifier, ...]] = {}
    params: dict[str, JsonValue] = dict(getattr(ident, "params", {}) or {})
    for name, value in dict(getattr(ident, "children", {}) or {}).items():
        if hasattr(value, "class_name"):
            children[name] = (_identifier(value),)
        elif isinstance(value, Sequence) and not isinstance(value, str) and all(
            hasattr(v, "class_name") for v in value
        ):
            children[name] = tuple(_identifier(v) for v in value)
        else:  # not identity-shaped: kept as a parameter, so it still counts
            params[f"children.{name}"] = value
    return ScorerIdentifier(
        class_name=str(ident.class_name),
        class_module=str(getattr(ident, "class_module", "") or module),
        params=params,
        children=children,
    )


class _TextScorerLeaf:
    """The leaf behaviour: score the scorable's text with the wrapped text scorer."""

    _inner: Any

    def get_identifier(self) -> ScorerIdentifier:
        cached: ScorerIdentifier | None = getattr(self, "_identifier_cache", None)
        if cached is None:
            cached = _identifier(self._inner.get_identifier(), type(self._inner).__module__)
            self._identifier_cache = cached
        return cached

    async def _score_async(
        self, scorable: Scorable, expectation: ScoringExpectation, context: ScoringContext
    ) -> list[Score]:
        from scoring.score.text_scorers import scorable_text

        owner: Scorer = self  # type: ignore[assignment]
        text = scorable_text(scorable, context)
        if text is None:
            return []
        out: list[Score] = []
        for s in await self._inner.score_text_async(text, objective=expectation.objective):
            raw_meta: Mapping[str, Any] = getattr(s, "metadata", None) or getattr(s, "score_metadata", None) or {}
            meta: dict[str, MetadataValue] = {
                str(k): v if v is None or isinstance(v, str | int | float | bool) else str(v)
                for k, v in raw_meta.items()
            }
            rationale = getattr(s, "rationale", None) or getattr(s, "score_rationale", "") or ""
            value = None if _undetermined(s) else s.get_value()
            out.append(
                owner._make_score(
                    scorable=scorable, expectation=expectation, value=value, rationale=str(rationale), metadata=meta
                )
            )
        return out


class TrueFalseTextScorer(_TextScorerLeaf, TrueFalseScorer):
    """A true/false text scorer (e.g. ``SelfAskTrueFalseScorer``) as a tree leaf."""

    scorer_type: ClassVar[ScoreType] = "true_false"

    def __init__(self, inner: TextScorer) -> None:
        TrueFalseScorer.__init__(self)
        self._inner = inner


class FloatScaleTextScorer(_TextScorerLeaf, FloatScaleScorer):
    """A float-scale text scorer (e.g. ``SelfAskLikertScorer``) as a tree leaf."""

    scorer_type: ClassVar[ScoreType] = "float_scale"

    def __init__(self, inner: TextScorer) -> None:
        FloatScaleScorer.__init__(self)
        self._inner = inner


def as_scorer(scorer: Any) -> Any:
    """``scorer`` itself when it is a tree node, else a leaf around a text scorer of either family
    (anything else is returned unchanged, for the caller's own type check to name)."""
    if isinstance(scorer, Scorer) or not isinstance(scorer, TextScorer):
        return scorer
    if scorer.scorer_type == "true_false":
        return TrueFalseTextScorer(scorer)
    if scorer.scorer_type == "float_scale":
        return FloatScaleTextScorer(scorer)
    return scorer
