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


def _positions(a: Sequence[str]) -> dict[str, int]:
    """Per distinct token of ``a``, the bit mask of the positions it holds."""
    masks: dict[str, int] = {}
    for i, x in enumerate(a):
        masks[x] = masks.get(x, 0) | (1 << i)
    return masks


def _lcs(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence, bit-parallel: one column of the dynamic
    programme over ``a`` is a ``len(a)``-bit integer, advanced by a few integer operations per
    token of ``b`` (Allison-Dix / Crochemore et al.). The same value as the quadratic table, in
    ``len(b)`` steps on machine words: a long response no longer holds the event loop for seconds
    (``tests/unit/scoring/test_plagiarism_bits.py`` holds the two equal)."""
    n = len(a)
    if not n or not b:
        return 0
    full = (1 << n) - 1
    masks = _positions(a)
    v = full
    for y in b:
        u = v & masks.get(y, 0)
        v = ((v + u) | (v - u)) & full
    return n - v.bit_count()


def _levenshtein(a: Sequence[str], b: Sequence[str]) -> int:
    """Edit distance, bit-parallel (Myers' algorithm in Hyyro's form for a whole-sequence
    distance): the vertical deltas of one column over ``a`` are two ``len(a)``-bit integers, and
    the distance is tracked at the last row; ``len(b)`` steps of integer operations."""
    n = len(a)
    if not n:
        return len(b)
    if not b:
        return n
    full = (1 << n) - 1
    last = 1 << (n - 1)
    masks = _positions(a)
    plus, minus, distance = full, 0, n
    for y in b:
        eq = masks.get(y, 0)
        xv = eq | minus
        xh = (((eq & plus) + plus) ^ plus) | eq
        h_plus = minus | (~(xh | plus) & full)
        h_minus = plus & xh
        if h_plus & last:
            distance += 1
        elif h_minus & last:
            distance -= 1
        h_plus = ((h_plus << 1) | 1) & full  # row 0 of a whole-sequence distance grows by one per step
        h_minus = (h_minus << 1) & full
        plus = h_minus | (~(xv | h_plus) & full)
        minus = h_plus & xv
    return distance


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
