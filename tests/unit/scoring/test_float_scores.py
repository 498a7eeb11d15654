"""Float-scale scores from a custom scorer: a NaN is "no value" (UNDETERMINED), a value outside
[0, 1] is refused, and a threshold's identity does not depend on how its number was written."""

from __future__ import annotations

import math

import pytest
from pydantic import JsonValue

from scoring.models import ContentScorable, Score, ScoreStatus, ScoringExpectation
from scoring.models.scorables import Scorable
from scoring.score import FloatScaleThresholdScorer
from scoring.score.base import FloatScaleScorer, ScoringContext


class _Fixed(FloatScaleScorer):
    """A custom float-scale scorer that reports a fixed value through ``_make_score``."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def _identity_params(self) -> dict[str, JsonValue]:
        return {"value": repr(self.value)}

    async def _score_async(
        self, scorable: Scorable, expectation: ScoringExpectation, context: ScoringContext
    ) -> list[Score]:
        return [self._make_score(scorable=scorable, expectation=expectation, value=self.value, rationale="r")]


async def test_a_nan_float_score_is_undetermined_never_a_decided_threshold_verdict() -> None:
    text = ContentScorable(text="x")
    (leaf,) = await _Fixed(math.nan).score_async(text)
    assert leaf.status == ScoreStatus.UNDETERMINED and leaf.get_value() is None
    (thr,) = await FloatScaleThresholdScorer(scorer=_Fixed(math.nan), threshold=0.5).score_async(text)
    assert thr.get_value() is None  # was FALSE ("nan < 0.5"), and TRUE under an inverter


@pytest.mark.parametrize("value", [1.5, -0.2, math.inf])
async def test_a_float_score_outside_0_1_is_refused(value: float) -> None:
    with pytest.raises(ValueError, match=r"a float-scale score is in \[0, 1\]"):
        await _Fixed(value).score_async(ContentScorable(text="x"))


def test_threshold_1_and_1_0_are_one_scorer() -> None:
    a = FloatScaleThresholdScorer(scorer=_Fixed(0.5), threshold=1)
    b = FloatScaleThresholdScorer(scorer=_Fixed(0.5), threshold=1.0)
    assert a.get_identifier().hash == b.get_identifier().hash


async def test_a_numpy_nan_is_undetermined_too() -> None:
    import numpy as np

    (leaf,) = await _Fixed(float(np.float32("nan"))).score_async(ContentScorable(text="x"))
    assert leaf.get_value() is None
    scorer = _Fixed(0.5)
    scorer.value = np.float32("nan")  # type: ignore[assignment]  # as a model's output would be
    (leaf,) = await scorer.score_async(ContentScorable(text="x"))
    assert leaf.status == ScoreStatus.UNDETERMINED
