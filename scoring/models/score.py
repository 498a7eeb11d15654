"""The Score a scorer returns."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from scoring.models.conditions import ScoringExpectation
from scoring.models.scorables import AnyScorable, MessageScorable
from scoring.models.status import ScoreStatus, Verdict

ScoreType = Literal["true_false", "float_scale"]
MetadataValue = str | int | float | bool | None


class Score(BaseModel):
    """One judgment. ``get_value()`` is True/False/float, or None when undetermined.

    PyRIT's spellings work too: ``score_rationale`` and ``score_metadata`` as constructor
    arguments and as read-only attributes, and ``scored_expectation``, ``message_piece_id``,
    ``scorer_class_identifier`` and ``is_undetermined`` as read-only attributes. Serialized scores keep our field names
    (``rationale``, ``metadata``): stored and streamed records are read by them.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    score_type: ScoreType
    status: ScoreStatus
    score_value: str = ""
    score_category: tuple[str, ...] = ()
    rationale: str = Field(default="", validation_alias=AliasChoices("rationale", "score_rationale"))
    metadata: dict[str, MetadataValue] = Field(
        default_factory=dict, validation_alias=AliasChoices("metadata", "score_metadata")
    )
    scorable: AnyScorable
    observation_ids: tuple[str, ...] = ()
    scorer_class: str = ""
    scorer_hash: str = ""
    objective: str | None = None
    expectation: ScoringExpectation | None = None
    timestamp: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @model_validator(mode="after")
    def _value_matches_status(self) -> Score:
        if self.status is ScoreStatus.UNDETERMINED:
            if self.score_value:
                raise ValueError("an undetermined score has no value")
        elif self.score_type == "true_false":
            if self.score_value not in ("true", "false"):
                raise ValueError(f"true_false score value must be 'true' or 'false', got {self.score_value!r}")
        else:
            v = float(self.score_value)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"float_scale score value must be in [0, 1], got {v}")
        return self

    def get_value(self) -> bool | float | None:
        if self.status is ScoreStatus.UNDETERMINED:
            return None
        if self.score_type == "true_false":
            return self.score_value == "true"
        return float(self.score_value)

    @property
    def verdict(self) -> Verdict:
        """The three-valued reading of a true/false score."""
        if self.score_type != "true_false":
            raise TypeError("only true_false scores have a verdict")
        v = self.get_value()
        assert v is None or isinstance(v, bool)
        return Verdict.of(v)

    @property
    def categories(self) -> tuple[str, ...]:
        return self.score_category

    # --- PyRIT's names for the same things (read-only) --------------------------------------------

    @property
    def score_rationale(self) -> str:
        """``rationale`` under PyRIT's name."""
        return self.rationale

    @property
    def score_metadata(self) -> dict[str, MetadataValue]:
        """``metadata`` under PyRIT's name."""
        return self.metadata

    @property
    def is_undetermined(self) -> bool:
        """True when no judgment was reached (``status`` is UNDETERMINED)."""
        return self.status is ScoreStatus.UNDETERMINED

    @property
    def scored_expectation(self) -> ScoringExpectation | None:
        """The expectation judged, objective included (PyRIT's name).

        ``expectation`` is stored only when it had conditions; an objective-only expectation
        is rebuilt from ``objective`` here, so this is None only when there was neither.
        """
        if self.expectation is not None:
            return self.expectation
        if self.objective is not None:
            return ScoringExpectation(objective=self.objective)
        return None

    @property
    def scorer_class_identifier(self) -> dict[str, str]:
        """The scorer that made it, as PyRIT's dict: ``__type__`` is its class name; ours adds
        ``scorer_hash``, the hash of its whole identity (the same configuration, the same hash)."""
        return {"__type__": self.scorer_class, "scorer_hash": self.scorer_hash}

    @property
    def message_piece_id(self) -> str | None:
        """The id of the scored message piece when a message was scored, else None."""
        return self.scorable.message_id if isinstance(self.scorable, MessageScorable) else None
