"""krippendorff_alpha against the `krippendorff` package (test-only oracle) and known values."""

from __future__ import annotations

import math
import warnings

import krippendorff
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scoring.evaluation import AlphaLevel, krippendorff_alpha

LEVELS: tuple[AlphaLevel, ...] = ("nominal", "ordinal", "interval")


def oracle(data: np.ndarray, level: AlphaLevel) -> float | None:
    """The package's alpha, or None where it is undefined (it raises, or divides 0 by 0)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            value = float(krippendorff.alpha(reliability_data=data, level_of_measurement=level))
        except ValueError:
            return None
    return None if math.isnan(value) else value


def random_matrix(rng: np.random.Generator) -> np.ndarray:
    raters = int(rng.integers(1, 7))
    items = int(rng.integers(1, 20))
    kind = rng.integers(0, 3)
    if kind == 0:  # Likert-like integers
        data = rng.integers(1, int(rng.integers(2, 8)), size=(raters, items)).astype(float)
    elif kind == 1:  # PyRIT's harm scale: multiples of 0.25
        data = rng.integers(0, 5, size=(raters, items)) / 4.0
    else:  # continuous values: every value distinct
        data = rng.normal(size=(raters, items))
    data[rng.random((raters, items)) < rng.uniform(0.0, 0.5)] = np.nan
    return data


@pytest.mark.parametrize("level", LEVELS)
def test_matches_oracle_on_seeded_random_matrices(level: AlphaLevel) -> None:
    rng = np.random.default_rng(20260101)
    compared = 0
    for _ in range(1000):
        data = random_matrix(rng)
        expected = oracle(data, level)
        if expected is None:
            continue
        assert krippendorff_alpha(data, level) == pytest.approx(expected, abs=1e-9), data
        compared += 1
    assert compared > 600


matrices = st.integers(min_value=1, max_value=6).flatmap(
    lambda raters: st.integers(min_value=1, max_value=12).flatmap(
        lambda items: st.lists(
            st.lists(
                st.one_of(st.none(), st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0, 3.0, -2.0])),
                min_size=items,
                max_size=items,
            ),
            min_size=raters,
            max_size=raters,
        )
    )
)


@settings(max_examples=400, deadline=None, database=None)
@given(ratings=matrices, level=st.sampled_from(LEVELS))
def test_matches_oracle_on_generated_matrices_with_none(ratings: list[list[float | None]], level: AlphaLevel) -> None:
    data = np.array([[np.nan if v is None else v for v in row] for row in ratings], dtype=float)
    expected = oracle(data, level)
    ours = krippendorff_alpha(ratings, level)  # None marks a missing rating
    if expected is None:
        # Undefined for the package: ours is NaN (nothing pairable) or 1.0 (one pairable value).
        assert math.isnan(ours) or ours == 1.0
    else:
        assert ours == pytest.approx(expected, abs=1e-9)


# Krippendorff (2011) / the package's documented example: 4 raters, 12 units.
EXAMPLE: list[list[float | None]] = [
    [1, 2, 3, 3, 2, 1, 4, 1, 2, None, None, None],
    [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, None, 3],
    [None, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, None],
    [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, None],
]


@pytest.mark.parametrize(("level", "expected"), [("nominal", 0.743), ("ordinal", 0.815), ("interval", 0.849)])
def test_published_example(level: AlphaLevel, expected: float) -> None:
    assert krippendorff_alpha(EXAMPLE, level) == pytest.approx(expected, abs=5e-4)


def test_ordinal_depends_on_ranks_not_distances() -> None:
    close = [[0, 1, 2, 2], [0, 1, 2, 1]]
    stretched = [[0, 1, 100, 100], [0, 1, 100, 1]]
    assert krippendorff_alpha(close, "ordinal") == pytest.approx(krippendorff_alpha(stretched, "ordinal"))
    assert krippendorff_alpha(close, "interval") != pytest.approx(krippendorff_alpha(stretched, "interval"))


def test_degenerate_cases() -> None:
    assert math.isnan(krippendorff_alpha([[1, 2, 3]], "nominal"))  # one rater: nothing pairable
    assert math.isnan(krippendorff_alpha([[1, None], [None, 2]], "interval"))
    assert math.isnan(krippendorff_alpha([[None, None], [None, None]], "ordinal"))
    assert krippendorff_alpha([[2, 2, 2], [2, 2, None]], "ordinal") == 1.0  # one value: perfect agreement
    assert krippendorff_alpha([[1, 2], [1, None]], "interval") == 1.0  # 2 is not pairable
    assert krippendorff_alpha([[0, 1], [1, 0]], "nominal") == pytest.approx(-0.5)  # systematic disagreement


def test_input_validation() -> None:
    with pytest.raises(ValueError, match="level"):
        krippendorff_alpha([[1, 2], [1, 2]], "ratio")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="same number of items"):
        krippendorff_alpha([[1, 2], [1]], "nominal")
    with pytest.raises(ValueError, match="finite"):
        krippendorff_alpha([[1, math.inf], [1, 2]], "interval")
    with pytest.raises(ValueError, match="2-D"):
        krippendorff_alpha(np.array([1.0, 2.0]), "interval")
