"""The plagiarism metrics' bit-parallel LCS and edit distance equal the textbook dynamic
programmes they replaced, on any token sequences (hypothesis)."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from scoring.score.text_scorers import _lcs, _levenshtein


def lcs_table(a: Sequence[str], b: Sequence[str]) -> int:
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b, 1):
            cur.append(prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1]))
        prev = cur
    return prev[-1]


def levenshtein_table(a: Sequence[str], b: Sequence[str]) -> int:
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


# few distinct tokens: many matches, the hard case for both algorithms
tokens = st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=70)


@settings(max_examples=400, deadline=None)
@given(tokens, tokens)
def test_lcs_equals_the_table(a: list[str], b: list[str]) -> None:
    assert _lcs(a, b) == lcs_table(a, b)


@settings(max_examples=400, deadline=None)
@given(tokens, tokens)
def test_levenshtein_equals_the_table(a: list[str], b: list[str]) -> None:
    assert _levenshtein(a, b) == levenshtein_table(a, b)


def test_word_boundaries_beyond_64_tokens() -> None:
    """Sequences longer than a machine word, where carries cross word boundaries."""
    a = [f"w{i % 7}" for i in range(150)]
    b = [f"w{(i * 3) % 7}" for i in range(170)]
    assert _lcs(a, b) == lcs_table(a, b)
    assert _levenshtein(a, b) == levenshtein_table(a, b)
    assert _levenshtein(b, a) == levenshtein_table(b, a)

