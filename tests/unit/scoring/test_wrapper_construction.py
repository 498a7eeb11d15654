"""Wrappers refuse, when built, what would later make a required criterion vanish or crash."""

from __future__ import annotations

import pytest

from scoring.score import (
    OtelToolCallScorer,
    ScorerConfigurationError,
    SubStringScorer,
    TrueFalseCompositeScorer,
    TrueFalseInverterScorer,
    TrueFalseScoreAggregator,
    create_conversation_scorer,
)
from scoring.score.observation import InMemoryTraceClient, OtelTraceSource


def _tools() -> OtelToolCallScorer:
    return OtelToolCallScorer(source=OtelTraceSource(trace_client=InMemoryTraceClient()))


@pytest.mark.parametrize(
    "inner",
    [
        pytest.param(_tools, id="tool-scorer"),
        pytest.param(lambda: TrueFalseInverterScorer(scorer=_tools()), id="tool-scorer-in-inverter"),
        pytest.param(
            lambda: TrueFalseCompositeScorer(
                aggregator=TrueFalseScoreAggregator.AND, scorers=[SubStringScorer(substring="done"), _tools()]
            ),
            id="tool-scorer-in-composite",
        ),
    ],
)
def test_conversation_wrapper_refuses_scorers_that_cannot_read_text(inner: object) -> None:
    # Given the conversation's text a tool scorer returns nothing, and a composite around the
    # wrapper would drop it: "AND(done, tool ran)" would be TRUE on "done" alone.
    assert callable(inner)
    with pytest.raises(ScorerConfigurationError, match="OtelToolCallScorer cannot judge text"):
        create_conversation_scorer(scorer=inner())


def test_conversation_wrapper_takes_text_scorers() -> None:
    wrapped = create_conversation_scorer(scorer=SubStringScorer(substring="done"))
    assert wrapped.children()[0].reads_text


@pytest.mark.parametrize("name", ["AND", "and", "Or", "MAJORITY"])
def test_composite_takes_aggregator_names(name: str) -> None:
    c = TrueFalseCompositeScorer(aggregator=name, scorers=[SubStringScorer(substring="x")])  # type: ignore[arg-type]
    assert c.get_identifier().hash  # the identity (and so scoring) works with it


def test_composite_names_a_bad_aggregator() -> None:
    with pytest.raises(ValueError, match=r"aggregator must be one of AND, OR, MAJORITY, got 'xor'"):
        TrueFalseCompositeScorer(aggregator="xor", scorers=[SubStringScorer(substring="x")])  # type: ignore[arg-type]
