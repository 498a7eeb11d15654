"""The scorer contract: validation and condition routing, then scoring a Scorable.

Every scorer is either a leaf (it judges some condition types itself) or a
wrapper over children. Before scoring, the whole tree is validated against the
expectation: each condition must reach a leaf that supports it (a missing
criterion is an error even under OR) and a direct leaf rejects conditions it
does not support. ``score_observation_async`` is replay: it judges a saved
observation and never touches a trace client.
"""

from __future__ import annotations

import math
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, ClassVar

from pydantic import JsonValue

from scoring.models.conditions import ScoringExpectation
from scoring.models.evidence import Observation
from scoring.models.scorables import (
    ContentScorable,
    MessageScorable,
    Scorable,
    SessionScorable,
    TraceScorable,
)
from scoring.models.score import MetadataValue, Score, ScoreType
from scoring.models.status import ScoreStatus, Verdict
from scoring.score.evaluable import EvaluationMethods
from scoring.score.identity import ScorerIdentifier

if TYPE_CHECKING:
    from scoring.memory import MemoryInterface


class ScorerConfigurationError(ValueError):
    """The scorer tree cannot score this expectation (unsupported or unrouted conditions)."""

    retriable = False


@dataclass(slots=True)
class ScoringContext:
    """Per-call context shared by every node of a tree.

    ``replay`` holds a saved observation: trace leaves judge it instead of
    acquiring evidence. ``memory`` stores observations and resolves messages.
    """

    memory: MemoryInterface | None = None
    replay: Observation | None = None
    #: streaming mode: evidence may still grow, so wrappers must stay monotone
    #: (a fallback is consulted only once the evidence is ``final``).
    streaming: bool = False
    final: bool = False
    observations: dict[str, Observation] = field(default_factory=dict)

    @property
    def fallback_allowed(self) -> bool:
        return not self.streaming or self.final


_SCORABLES = (TraceScorable, SessionScorable, MessageScorable, ContentScorable)


class Scorer(EvaluationMethods, ABC):
    """Base of all scorers. Subclasses set ``scorer_type`` and implement ``_score_async``."""

    scorer_type: ClassVar[ScoreType]
    #: condition types a leaf judges itself; wrappers take their children's.
    supported_conditions: ClassVar[frozenset[str]] = frozenset()
    #: a leaf that has nothing to check without conditions.
    requires_conditions: ClassVar[bool] = False
    #: a leaf that can judge text (``ContentScorable``): the conversation wrapper hands it text.
    reads_text: ClassVar[bool] = True

    def __init__(self, *, categories: Sequence[str] | None = None) -> None:
        self._categories = tuple(categories or ())

    # --- identity --------------------------------------------------------------------------------

    def _identity_params(self) -> dict[str, JsonValue]:
        return {}

    def _identity_children(self) -> Mapping[str, Sequence[Scorer]]:
        return {}

    def get_identifier(self) -> ScorerIdentifier:
        """The scorer's identity (cached: a scorer's configuration does not change after construction)."""
        cached: ScorerIdentifier | None = getattr(self, "_identifier_cache", None)
        if cached is not None:
            return cached
        ident = self._build_identifier()
        self._identifier_cache = ident
        return ident

    def _build_identifier(self) -> ScorerIdentifier:
        params = dict(self._identity_params())
        if self._categories:
            params["categories"] = list(self._categories)
        return ScorerIdentifier(
            class_name=type(self).__name__,
            class_module=type(self).__module__,
            params=params,
            children={k: tuple(c.get_identifier() for c in v) for k, v in self._identity_children().items()},
        )

    def _identity_hash(self) -> str:
        cached: str | None = getattr(self, "_identity_hash_cache", None)
        if cached is None:
            cached = self.get_identifier().hash
            self._identity_hash_cache = cached
        return cached

    # --- validation and routing ------------------------------------------------------------------

    def children(self) -> Sequence[Scorer]:
        return ()

    def tree_supported_conditions(self) -> frozenset[str]:
        """Condition types this subtree can judge."""
        kids = self.children()
        if not kids:
            return self.supported_conditions
        out: frozenset[str] = frozenset()
        for k in kids:
            out |= k.tree_supported_conditions()
        return out

    def validate(self, expectation: ScoringExpectation) -> None:
        """Raise ScorerConfigurationError if this tree cannot score the expectation."""
        wanted = expectation.condition_types()
        kids = self.children()
        if not kids:
            extra = wanted - self.supported_conditions
            if extra:
                raise ScorerConfigurationError(
                    f"{type(self).__name__} does not support condition(s) {sorted(extra)}; "
                    f"it supports {sorted(self.supported_conditions) or 'none'}"
                )
            if self.requires_conditions and not wanted:
                raise ScorerConfigurationError(f"{type(self).__name__} needs at least one condition to check")
            return
        missing = wanted - self.tree_supported_conditions()
        if missing:
            raise ScorerConfigurationError(
                f"no scorer under {type(self).__name__} supports condition(s) {sorted(missing)}"
            )
        for k in kids:
            k.validate(self.route(k, expectation))

    def route(self, child: Scorer, expectation: ScoringExpectation) -> ScoringExpectation:
        """The part of the expectation a child receives (objective kept)."""
        return expectation.only(child.tree_supported_conditions())

    # --- scoring ---------------------------------------------------------------------------------

    async def score_async(
        self,
        scorable: Scorable,
        expectation: ScoringExpectation | None = None,
        *,
        objective: str | None = None,
        context: ScoringContext | None = None,
    ) -> list[Score]:
        """Score a scorable. Returns [] when the scorer does not apply to it."""
        if not isinstance(scorable, _SCORABLES):
            raise TypeError(
                f"{type(self).__name__}.score_async: scorable must be a TraceScorable, SessionScorable, "
                f"MessageScorable or ContentScorable, got {type(scorable).__name__}"
                + (" (for a trace id use TraceScorable(trace_ids=(trace_id,)))" if isinstance(scorable, str) else "")
            )
        if expectation is not None and not isinstance(expectation, ScoringExpectation):
            raise TypeError(
                f"{type(self).__name__}.score_async: expectation must be a ScoringExpectation (e.g. "
                "ScoringExpectation(conditions=(ToolsCalled(tools=(ToolCallRequirement(name=...),)),))), "
                f"got {type(expectation).__name__}"
            )
        if expectation is None:
            expectation = ScoringExpectation(objective=objective)
        elif objective is not None and expectation.objective is None:
            expectation = expectation.model_copy(update={"objective": objective})
        self.validate(expectation)
        if context is None:
            from scoring.memory import CentralMemory

            context = ScoringContext(memory=CentralMemory.get_memory_instance_or_none())
        scores = await self._score_async(scorable, expectation, context)
        if context.memory is not None and context.replay is None:
            context.memory.add_scores(scores)
        return scores

    async def score_text_async(self, text: str, *, objective: str | None = None) -> list[Score]:
        return await self.score_async(ContentScorable(text=text), objective=objective)

    async def score_observation_async(
        self,
        observation: Observation,
        expectation: ScoringExpectation | None = None,
        *,
        objective: str | None = None,
    ) -> list[Score]:
        """Replay: judge a saved observation. Pure; never reads a trace client or writes memory."""
        if not isinstance(observation, Observation):
            raise TypeError(
                f"{type(self).__name__}.score_observation_async: observation must be an Observation "
                f"(e.g. Observation.model_validate_json(saved)), got {type(observation).__name__}"
            )
        context = ScoringContext(memory=None, replay=observation)
        return await self.score_async(observation.scorable, expectation, objective=objective, context=context)

    @abstractmethod
    async def _score_async(
        self, scorable: Scorable, expectation: ScoringExpectation, context: ScoringContext
    ) -> list[Score]: ...

    # --- helpers for subclasses --------------------------------------------------------------------

    def _make_score(
        self,
        *,
        scorable: Scorable,
        expectation: ScoringExpectation,
        value: bool | float | None,
        rationale: str,
        metadata: Mapping[str, MetadataValue] | None = None,
        observation_ids: Sequence[str] = (),
        categories: Sequence[str] | None = None,
    ) -> Score:
        ident = self.get_identifier()
        ident_hash = self._identity_hash()
        if value is not None and not isinstance(value, bool) and math.isnan(float(value)):
            value = None  # a scorer's "no value" (any float type, numpy's too): UNDETERMINED
        if value is not None and self.scorer_type == "float_scale" and not 0.0 <= float(value) <= 1.0:
            raise ValueError(f"{type(self).__name__} produced {value!r}; a float-scale score is in [0, 1]")
        if value is None:
            status, text = ScoreStatus.UNDETERMINED, ""
        elif self.scorer_type == "true_false":
            status, text = ScoreStatus.COMPLETE, ("true" if value else "false")
        else:
            status, text = ScoreStatus.COMPLETE, repr(float(value))
        # Every field is built here from validated parts, so skip re-validation (hot path).
        return Score.model_construct(
            id=str(uuid.uuid4()),
            timestamp=datetime.now(UTC),
            score_type=self.scorer_type,
            status=status,
            score_value=text,
            score_category=tuple(categories if categories is not None else self._categories),
            rationale=rationale,
            metadata=dict(metadata or {}),
            scorable=scorable,
            observation_ids=tuple(dict.fromkeys(observation_ids)),
            scorer_class=ident.class_name,
            scorer_hash=ident_hash,
            objective=expectation.objective,
            expectation=expectation if expectation.conditions else None,
        )


class TrueFalseScorer(Scorer):
    scorer_type: ClassVar[ScoreType] = "true_false"

    def _verdict_score(
        self,
        scorable: Scorable,
        expectation: ScoringExpectation,
        verdict: Verdict,
        rationale: str,
        *,
        metadata: Mapping[str, MetadataValue] | None = None,
        observation_ids: Sequence[str] = (),
    ) -> Score:
        return self._make_score(
            scorable=scorable,
            expectation=expectation,
            value=verdict.to_bool(),
            rationale=rationale,
            metadata=metadata,
            observation_ids=observation_ids,
        )


class FloatScaleScorer(Scorer):
    scorer_type: ClassVar[ScoreType] = "float_scale"
