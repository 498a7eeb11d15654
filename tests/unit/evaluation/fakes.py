"""Small scorers implementing the evaluation Protocols, for tests."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from scoring.evaluation import SimpleScorerIdentifier


class FakeStatus(StrEnum):
    COMPLETE = "complete"
    UNDETERMINED = "undetermined"


@dataclass(frozen=True)
class FakeScore:
    status: FakeStatus
    value: bool | float | None

    def get_value(self) -> bool | float | None:
        return None if self.status is FakeStatus.UNDETERMINED else self.value


def score_of(value: bool | float | None) -> FakeScore:
    if value is None:
        return FakeScore(FakeStatus.UNDETERMINED, None)
    return FakeScore(FakeStatus.COMPLETE, value)


class TableScorer:
    """Answers from a text → value table; counts calls and the peak number in flight."""

    def __init__(self, table: Mapping[str, bool | float | None], scorer_type: str, *, name: str = "table") -> None:
        self.table = dict(table)
        self.scorer_type = scorer_type
        self.name = name
        self.calls = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        self.objectives: list[str | None] = []

    async def score_text_async(self, text: str, *, objective: str | None = None) -> list[FakeScore]:
        self.calls += 1
        self.objectives.append(objective)
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.001)
            return [score_of(self.table[text])]
        finally:
            self.in_flight -= 1

    def get_identifier(self) -> SimpleScorerIdentifier:
        return SimpleScorerIdentifier(class_name="TableScorer", params={"name": self.name, "type": self.scorer_type})


class SequenceScorer(TableScorer):
    """Per text, a list of values returned on successive calls (one per trial)."""

    def __init__(self, table: Mapping[str, list[bool | float | None]], scorer_type: str) -> None:
        super().__init__({}, scorer_type, name="sequence")
        self.sequences = {k: list(v) for k, v in table.items()}

    async def score_text_async(self, text: str, *, objective: str | None = None) -> list[FakeScore]:
        self.calls += 1
        return [score_of(self.sequences[text].pop(0))]


class KeywordHarmScorer:
    """float_scale: the largest weight of a keyword found in the text (0.0 if none)."""

    scorer_type = "float_scale"

    def __init__(self, weights: Mapping[str, float], undetermined_if: str | None = None) -> None:
        self.weights = dict(weights)
        self.undetermined_if = undetermined_if

    async def score_text_async(self, text: str, *, objective: str | None = None) -> list[FakeScore]:
        if self.undetermined_if and self.undetermined_if in text.lower():
            return [score_of(None)]
        found = [w for k, w in self.weights.items() if k in text.lower()]
        return [score_of(max(found, default=0.0))]

    def get_identifier(self) -> SimpleScorerIdentifier:
        return SimpleScorerIdentifier(class_name="KeywordHarmScorer", params={"weights": self.weights})


class FakeSubStringScorer:
    """Stands in for scoring.score.SubStringScorer (true_false: substring present)."""

    scorer_type = "true_false"

    def __init__(self, *, substring: str, categories: list[str] | None = None) -> None:
        self.substring = substring
        self.categories = categories or []

    async def score_text_async(self, text: str, *, objective: str | None = None) -> list[FakeScore]:
        return [score_of(self.substring.lower() in text.lower())]

    def get_identifier(self) -> SimpleScorerIdentifier:
        return SimpleScorerIdentifier(
            class_name="SubStringScorer", params={"substring": self.substring, "categories": self.categories}
        )


def fake_scoring_score_module() -> types.ModuleType:
    module = types.ModuleType("scoring.score")
    module.SubStringScorer = FakeSubStringScorer  # type: ignore[attr-defined]
    return module
