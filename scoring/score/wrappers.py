"""Composable wrappers: composite (AND/OR/MAJORITY), inverter, threshold, fallbacks, conversation.

Every wrapper is itself a scorer, so trees stack. Composition keeps the
streaming invariant (strong Kleene logic): a decided verdict never flips as
evidence grows. An empty child result means "did not apply" and is ignored.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import ClassVar, cast

from pydantic import JsonValue

from scoring.models.conditions import ScoringExpectation
from scoring.models.scorables import ContentScorable, MessageScorable, Scorable
from scoring.models.score import MetadataValue, Score, ScoreType
from scoring.models.status import ScoreStatus, Verdict
from scoring.score.adapt import TextScorer, as_scorer
from scoring.score.base import (
    FloatScaleScorer,
    Scorer,
    ScorerConfigurationError,
    ScoringContext,
    TrueFalseScorer,
)
from scoring.verdict.kleene import all_of, any_of, majority


def _single(scorer: Scorer, scores: list[Score]) -> Score | None:
    if not scores:
        return None
    if len(scores) > 1:
        raise ScorerConfigurationError(
            f"{type(scorer).__name__} returned {len(scores)} scores; aggregate them explicitly first"
        )
    return scores[0]


class TrueFalseScoreAggregator(StrEnum):
    AND = "and"
    OR = "or"
    MAJORITY = "majority"

    def combine(self, verdicts: Sequence[Verdict]) -> Verdict:
        if self is TrueFalseScoreAggregator.AND:
            return all_of(verdicts)
        if self is TrueFalseScoreAggregator.OR:
            return any_of(verdicts)
        return majority(verdicts)


class TrueFalseCompositeScorer(TrueFalseScorer):
    """Combine true/false scorers with AND, OR or MAJORITY (strong Kleene)."""

    def __init__(
        self,
        *,
        aggregator: TrueFalseScoreAggregator,
        scorers: Sequence[TrueFalseScorer | TextScorer],
        categories: Sequence[str] | None = None,
    ) -> None:
        super().__init__(categories=categories)
        nodes: list[TrueFalseScorer] = [as_scorer(s) for s in scorers]
        if not nodes:
            raise ValueError("TrueFalseCompositeScorer needs at least one scorer")
        for s in nodes:
            if s.scorer_type != "true_false":
                raise TypeError(f"{type(s).__name__} is not a true/false scorer")
        if not isinstance(aggregator, TrueFalseScoreAggregator):
            try:  # the names and values of the aggregator ("AND", "and", ...) are accepted too
                aggregator = TrueFalseScoreAggregator[str(aggregator).upper()]
            except KeyError:
                choices = ", ".join(a.name for a in TrueFalseScoreAggregator)
                raise ValueError(f"aggregator must be one of {choices}, got {aggregator!r}") from None
        self._aggregator = aggregator
        self._scorers = tuple(nodes)

    def children(self) -> Sequence[Scorer]:
        return self._scorers

    def _identity_params(self) -> dict[str, JsonValue]:
        return {"aggregator": self._aggregator.value}

    def _identity_children(self) -> Mapping[str, Sequence[Scorer]]:
        return {"scorers": self._scorers}

    async def _score_async(
        self, scorable: Scorable, expectation: ScoringExpectation, context: ScoringContext
    ) -> list[Score]:
        if context.replay is not None:
            # Replay never waits on I/O: awaiting children in turn avoids task overhead.
            results = [await s._score_async(scorable, self.route(s, expectation), context) for s in self._scorers]
        else:
            results = list(
                await asyncio.gather(
                    *(s._score_async(scorable, self.route(s, expectation), context) for s in self._scorers)
                )
            )
        scores = [sc for s, r in zip(self._scorers, results, strict=True) if (sc := _single(s, r)) is not None]
        if not scores:
            return []
        verdict = self._aggregator.combine([s.verdict for s in scores])
        rationale = f"{self._aggregator.name} of {len(scores)}: " + " | ".join(
            f"{s.scorer_class}={s.verdict.value} ({s.rationale})" for s in scores
        )
        observation_ids = [o for s in scores for o in s.observation_ids]
        return [self._verdict_score(scorable, expectation, verdict, rationale, observation_ids=observation_ids)]


class TrueFalseInverterScorer(TrueFalseScorer):
    """Swap TRUE and FALSE; UNDETERMINED and empty results pass through."""

    def __init__(self, *, scorer: TrueFalseScorer | TextScorer, categories: Sequence[str] | None = None) -> None:
        super().__init__(categories=categories)
        node: TrueFalseScorer = as_scorer(scorer)
        if node.scorer_type != "true_false":
            raise TypeError(f"{type(node).__name__} is not a true/false scorer")
        self._scorer = node

    def children(self) -> Sequence[Scorer]:
        return (self._scorer,)

    def _identity_children(self) -> Mapping[str, Sequence[Scorer]]:
        return {"scorer": (self._scorer,)}

    async def _score_async(
        self, scorable: Scorable, expectation: ScoringExpectation, context: ScoringContext
    ) -> list[Score]:
        inner = _single(self._scorer, await self._scorer._score_async(scorable, expectation, context))
        if inner is None:
            return []
        verdict = inner.verdict.invert()
        return [
            self._verdict_score(
                scorable,
                expectation,
                verdict,
                f"inverted {inner.scorer_class}: {inner.rationale}",
                metadata=inner.metadata,
                observation_ids=inner.observation_ids,
            )
        ]


class FloatScaleThresholdScorer(TrueFalseScorer):
    """TRUE when a float-scale score meets ``threshold`` (>=); UNDETERMINED passes through."""

    def __init__(
        self, *, scorer: FloatScaleScorer | TextScorer, threshold: float, categories: Sequence[str] | None = None
    ) -> None:
        super().__init__(categories=categories)
        node: FloatScaleScorer = as_scorer(scorer)
        if node.scorer_type != "float_scale":
            raise TypeError(f"{type(node).__name__} is not a float-scale scorer")
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise TypeError(f"threshold must be a number in [0, 1], got {threshold!r}")
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold}")
        self._scorer = node
        # a float, so 1 and 1.0 are one scorer (one identity hash, one metrics entry)
        self._threshold = float(threshold)

    def children(self) -> Sequence[Scorer]:
        return (self._scorer,)

    def _identity_params(self) -> dict[str, JsonValue]:
        return {"threshold": self._threshold}

    def _identity_children(self) -> Mapping[str, Sequence[Scorer]]:
        return {"scorer": (self._scorer,)}

    async def _score_async(
        self, scorable: Scorable, expectation: ScoringExpectation, context: ScoringContext
    ) -> list[Score]:
        inner = _single(self._scorer, await self._scorer._score_async(scorable, expectation, context))
        if inner is None:
            return []
        value = inner.get_value()
        if value is None:
            verdict, why = Verdict.UNDETERMINED, f"{inner.scorer_class} undetermined"
        else:
            verdict = Verdict.of(float(value) >= self._threshold)
            op = ">=" if verdict is Verdict.TRUE else "<"
            why = f"{inner.scorer_class}={float(value):.3f} {op} {self._threshold}"
        meta: dict[str, MetadataValue] = dict(inner.metadata)
        meta["float_value"] = None if value is None else float(value)
        return [
            self._verdict_score(
                scorable, expectation, verdict, why, metadata=meta, observation_ids=inner.observation_ids
            )
        ]


class _FallbackMixin:
    """Primary first; the fallback only when the primary is undetermined.

    In streaming mode the fallback is consulted only once the evidence is final,
    so a fallback judgment can never be contradicted by a later primary one.
    """

    _scorer: Scorer
    _fallback: Scorer

    def children(self) -> Sequence[Scorer]:
        return (self._scorer, self._fallback)

    def _identity_children(self) -> Mapping[str, Sequence[Scorer]]:
        return {"scorer": (self._scorer,), "fallback_scorer": (self._fallback,)}

    def route(self, child: Scorer, expectation: ScoringExpectation) -> ScoringExpectation:
        """Both children see the whole expectation (they must support the same conditions)."""
        return expectation

    async def _score_async(
        self, scorable: Scorable, expectation: ScoringExpectation, context: ScoringContext
    ) -> list[Score]:
        return await self._fallback_score(cast(Scorer, self), scorable, expectation, context)

    def _check_children(self, kind: ScoreType) -> None:
        for s in (self._scorer, self._fallback):
            if s.scorer_type != kind:
                raise TypeError(f"{type(s).__name__} is not a {kind} scorer")
        a, b = self._scorer.tree_supported_conditions(), self._fallback.tree_supported_conditions()
        if a != b:
            raise ScorerConfigurationError(
                f"fallback children must support the same condition types: {sorted(a)} vs {sorted(b)}"
            )

    async def _fallback_score(
        self, owner: Scorer, scorable: Scorable, expectation: ScoringExpectation, context: ScoringContext
    ) -> list[Score]:
        primary = _single(self._scorer, await self._scorer._score_async(scorable, expectation, context))
        if primary is None:
            return []
        meta: dict[str, MetadataValue] = {f"primary.{k}": v for k, v in primary.metadata.items()}
        if primary.status is ScoreStatus.COMPLETE:
            meta["resolved_by"] = "primary"
            return [self._combine(owner, scorable, expectation, primary, primary.rationale, meta, primary)]
        if not context.fallback_allowed:
            meta["resolved_by"] = "primary"
            meta["fallback_status"] = "deferred"
            return [self._combine(owner, scorable, expectation, primary, primary.rationale, meta, primary)]
        meta["primary_rationale"] = primary.rationale
        fallback = _single(self._fallback, await self._fallback._score_async(scorable, expectation, context))
        if fallback is None:
            meta["resolved_by"] = "primary"
            meta["fallback_status"] = "not_applicable"
            why = f"primary undetermined ({primary.rationale}); fallback not applicable"
            return [self._combine(owner, scorable, expectation, primary, why, meta, primary)]
        if primary.score_category and fallback.score_category and primary.score_category != fallback.score_category:
            raise ScorerConfigurationError(
                f"fallback categories {list(fallback.score_category)} differ from primary "
                f"{list(primary.score_category)}"
            )
        meta.update({f"fallback.{k}": v for k, v in fallback.metadata.items()})
        meta["fallback_rationale"] = fallback.rationale
        meta["fallback_status"] = fallback.status.value
        meta["resolved_by"] = "fallback"
        why = f"primary undetermined ({primary.rationale}); fallback: {fallback.rationale}"
        return [self._combine(owner, scorable, expectation, fallback, why, meta, primary, fallback)]

    @staticmethod
    def _combine(
        owner: Scorer,
        scorable: Scorable,
        expectation: ScoringExpectation,
        decisive: Score,
        rationale: str,
        meta: dict[str, MetadataValue],
        *sources: Score,
    ) -> Score:
        return owner._make_score(
            scorable=scorable,
            expectation=expectation,
            value=decisive.get_value(),
            rationale=rationale,
            metadata=meta,
            observation_ids=[o for s in sources for o in s.observation_ids],
            categories=decisive.score_category or None,
        )


class TrueFalseFallbackScorer(_FallbackMixin, TrueFalseScorer):
    def __init__(
        self,
        *,
        scorer: TrueFalseScorer | TextScorer,
        fallback_scorer: TrueFalseScorer | TextScorer,
        categories: Sequence[str] | None = None,
    ) -> None:
        TrueFalseScorer.__init__(self, categories=categories)
        self._scorer, self._fallback = as_scorer(scorer), as_scorer(fallback_scorer)
        self._check_children("true_false")


class FloatScaleFallbackScorer(_FallbackMixin, FloatScaleScorer):
    def __init__(
        self,
        *,
        scorer: FloatScaleScorer | TextScorer,
        fallback_scorer: FloatScaleScorer | TextScorer,
        categories: Sequence[str] | None = None,
    ) -> None:
        FloatScaleScorer.__init__(self, categories=categories)
        self._scorer, self._fallback = as_scorer(scorer), as_scorer(fallback_scorer)
        self._check_children("float_scale")


class _ConversationMixin:
    _scorer: Scorer

    def _render(self, scorable: Scorable, context: ScoringContext) -> ContentScorable | None:
        if not isinstance(scorable, MessageScorable) or context.memory is None:
            return None
        piece = context.memory.get_message_piece(scorable.message_id)
        conversation_id = piece.conversation_id if piece is not None else scorable.conversation_id
        pieces = context.memory.get_message_pieces(conversation_id=conversation_id)
        if not pieces:
            return None
        return ContentScorable(text="\n".join(f"{p.role}: {p.converted_value}" for p in pieces))

    async def _conversation_score(
        self, owner: Scorer, scorable: Scorable, expectation: ScoringExpectation, context: ScoringContext
    ) -> list[Score]:
        content = self._render(scorable, context)
        if content is None:
            if not isinstance(scorable, MessageScorable):
                return []  # not a message: not applicable, as for any text scorer
            # A message whose conversation cannot be read here (a replay: the saved observation
            # keeps the scored response, not the conversation): unknown, never left out of a
            # composite, which would then decide without this criterion.
            why = (
                "the saved observation does not keep the conversation's text"
                if context.replay is not None
                else "the conversation's messages are not in memory"
            )
            return [
                owner._make_score(
                    scorable=scorable,
                    expectation=expectation,
                    value=None,
                    rationale=f"over the whole conversation: undetermined, {why}",
                )
            ]
        inner = _single(self._scorer, await self._scorer._score_async(content, expectation, context))
        if inner is None:
            return []
        return [
            owner._make_score(
                scorable=scorable,
                expectation=expectation,
                value=inner.get_value(),
                rationale=f"over the whole conversation: {inner.rationale}",
                metadata=inner.metadata,
                observation_ids=inner.observation_ids,
                categories=inner.score_category or None,
            )
        ]


class ConversationTrueFalseScorer(_ConversationMixin, TrueFalseScorer):
    supported_conditions: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, *, scorer: TrueFalseScorer) -> None:
        TrueFalseScorer.__init__(self)
        self._scorer = scorer

    def children(self) -> Sequence[Scorer]:
        return (self._scorer,)

    def _identity_children(self) -> Mapping[str, Sequence[Scorer]]:
        return {"scorer": (self._scorer,)}

    async def _score_async(
        self, scorable: Scorable, expectation: ScoringExpectation, context: ScoringContext
    ) -> list[Score]:
        return await self._conversation_score(self, scorable, expectation, context)


class ConversationFloatScaleScorer(_ConversationMixin, FloatScaleScorer):
    def __init__(self, *, scorer: FloatScaleScorer) -> None:
        FloatScaleScorer.__init__(self)
        self._scorer = scorer

    def children(self) -> Sequence[Scorer]:
        return (self._scorer,)

    def _identity_children(self) -> Mapping[str, Sequence[Scorer]]:
        return {"scorer": (self._scorer,)}

    async def _score_async(
        self, scorable: Scorable, expectation: ScoringExpectation, context: ScoringContext
    ) -> list[Score]:
        return await self._conversation_score(self, scorable, expectation, context)


def _leaves(scorer: Scorer) -> list[Scorer]:
    kids = scorer.children()
    return [leaf for k in kids for leaf in _leaves(k)] if kids else [scorer]


def create_conversation_scorer(*, scorer: Scorer | TextScorer) -> Scorer:
    """Wrap a text scorer so it judges the whole conversation of a scored message.

    The result keeps the wrapped scorer's family (true/false or float scale).
    """
    node: Scorer = as_scorer(scorer)
    blind = [type(s).__name__ for s in _leaves(node) if not s.reads_text]
    if blind:
        # It would get the conversation's text, find nothing to judge and drop out of any
        # composite around it: a required criterion silently ignored.
        raise ScorerConfigurationError(
            f"create_conversation_scorer: {', '.join(sorted(set(blind)))} cannot judge text; "
            "only text scorers (e.g. SubStringScorer) can score a whole conversation"
        )
    if isinstance(node, TrueFalseScorer):
        return ConversationTrueFalseScorer(scorer=node)
    if isinstance(node, FloatScaleScorer):
        return ConversationFloatScaleScorer(scorer=node)
    raise TypeError(f"{type(node).__name__} is neither a true/false nor a float-scale scorer")
