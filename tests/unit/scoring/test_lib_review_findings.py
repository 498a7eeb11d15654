"""Findings of a user-side review of the scoring library (each test failed before its fix)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from scoring.score import (
    ScorerIdentifier,
    SubStringScorer,
    TrueFalseCompositeScorer,
    TrueFalseInverterScorer,
    TrueFalseScoreAggregator,
)


def test_scorer_identifier_json_round_trip() -> None:
    """``get_identifier().model_dump_json()`` includes the computed ``hash``; reading it back must
    work (nested children too), and a hash that does not match the content is refused."""
    leaf = SubStringScorer(substring="bomb")
    tree = TrueFalseCompositeScorer(
        aggregator=TrueFalseScoreAggregator.AND, scorers=[leaf, TrueFalseInverterScorer(scorer=leaf)]
    )
    for ident in (leaf.get_identifier(), tree.get_identifier()):
        back = ScorerIdentifier.model_validate_json(ident.model_dump_json())
        assert back == ident and back.hash == ident.hash
        assert ScorerIdentifier.model_validate(ident.model_dump()).hash == ident.hash
    tampered = {**leaf.get_identifier().model_dump(), "hash": "0" * 64}
    with pytest.raises(ValidationError, match="does not match"):
        ScorerIdentifier.model_validate(tampered)
