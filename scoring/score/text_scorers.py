"""Text leaves: SubStringScorer (true/false) and PlagiarismScorer (float scale)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import StrEnum

from pydantic import JsonValue

from scoring.models.conditions import ScoringExpectation
from scoring.models.scorables import ContentScorable, MessageScorable, Scorable
from scoring.models.score import Score
from scoring.models.status import Verdict
from scoring.score.base import FloatScaleScorer, ScoringContext, TrueFalseScorer
from scoring.score.trace_scorer import resolve_message_text


def scorable_text(scorable: Scorable, context: ScoringContext) -> str | None:
    """The text a text scorer reads, or None when the scorable carries no text."""
    if isinstance(scorable, ContentScorable):
        return scorable.text
    if isinstance(scorable, MessageScorable):
        return resolve_message_text(context.memory, scorable)
    return None


class SubStringScorer(TrueFalseScorer):
    """TRUE when the text contains ``substring`` (case-insensitive unless ``case_sensitive``)."""

    def __init__(
        self, *, substring: str, categories: Sequence[str] | None = None, case_sensitive: bool = False
    ) -> None:
        super().__init__(categories=categories)
        if not substring:
            raise ValueError("substring must not be empty")
        self._substring = substring
        self._case_sensitive = case_sensitive

    def _identity_params(self) -> dict[str, JsonValue]:
        return {"substring": self._substring, "case_sensitive": self._case_sensitive}

    async def _score_async(
        self, scorable: Scorable, expectation: ScoringExpectation, context: ScoringContext
    ) -> list[Score]:
        text = scorable_text(scorable, context)
        if text is None:
            return []
        found = self._substring in text if self._case_sensitive else self._substring.casefold() in text.casefold()
        why = f"{self._substring!r} {'found' if found else 'not found'} in the text"
        return [self._verdict_score(scorable, expectation, Verdict.of(found), why)]


class PlagiarismMetric(StrEnum):
    LCS = "lcs"
    LEVENSHTEIN = "levenshtein"
    JACCARD = "jaccard"


_WORD = re.compile(r"[\w']+")


def _tokens(text: str) -> list[str]:
    return [w.casefold() for w in _WORD.findall(text)]


def _lcs(a: Sequence[str], b: Sequence[str]) -> int:
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b, 1):
            cur.append(prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1]))
        prev = cur
    return prev[-1]


def _levenshtein(a: Sequence[str], b: Sequence[str]) -> int:
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def plagiarism_score(reference: str, text: str, metric: PlagiarismMetric, n: int = 5) -> float:
    """Overlap of ``text`` with ``reference`` in [0, 1] (1 = copied)."""
    ref, cand = _tokens(reference), _tokens(text)
    if not ref:
        return 0.0
    if metric is PlagiarismMetric.LCS:
        return _lcs(ref, cand) / len(ref)
    if metric is PlagiarismMetric.LEVENSHTEIN:
        return max(0.0, 1.0 - _levenshtein(ref, cand) / max(len(ref), len(cand)))
    grams_ref = {tuple(ref[i : i + n]) for i in range(max(1, len(ref) - n + 1))}
    grams_cand = {tuple(cand[i : i + n]) for i in range(max(1, len(cand) - n + 1))}
    union = grams_ref | grams_cand
    return len(grams_ref & grams_cand) / len(union) if union else 0.0


class PlagiarismScorer(FloatScaleScorer):
    """How much of ``reference_text`` the text reproduces (word-level LCS by default)."""

    def __init__(
        self,
        *,
        reference_text: str,
        metric: PlagiarismMetric | str = PlagiarismMetric.LCS,
        n: int = 5,
        categories: Sequence[str] | None = None,
    ) -> None:
        super().__init__(categories=categories)
        try:
            self._metric = PlagiarismMetric(metric)
        except ValueError:
            known = ", ".join(m.value for m in PlagiarismMetric)
            raise ValueError(f"PlagiarismScorer: unknown metric {metric!r} (one of {known})") from None
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"PlagiarismScorer: n must be a positive integer, got {n!r}")
        self._reference = reference_text
        self._n = n

    def _identity_params(self) -> dict[str, JsonValue]:
        return {"reference_text": self._reference, "metric": self._metric.value, "n": self._n}

    async def _score_async(
        self, scorable: Scorable, expectation: ScoringExpectation, context: ScoringContext
    ) -> list[Score]:
        text = scorable_text(scorable, context)
        if text is None:
            return []
        value = plagiarism_score(self._reference, text, self._metric, self._n)
        return [
            self._make_score(
                scorable=scorable,
                expectation=expectation,
                value=value,
                rationale=f"{self._metric.value} overlap with the reference: {value:.3f}",
            )
        ]
