"""Krippendorff's alpha by the coincidence-matrix method (nominal, ordinal, interval).

Own implementation; the ``krippendorff`` package is only a test oracle. The computation
follows Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability":

1. per unit (column) u with m_u >= 2 values, every ordered pair of values from different
   raters adds 1 / (m_u - 1) to the coincidence matrix o[c, k]; units with fewer than two
   values are not pairable and contribute nothing;
2. n_c = sum_k o[c, k] and n = sum_c n_c;
3. alpha = 1 - D_o / D_e with D_o = sum o[c, k] * d(c, k) / n and
   D_e = sum n_c * n_k * d(c, k) / (n * (n - 1)).

Distances: nominal ``d = [c != k]``; interval ``d = (c - k)**2``; ordinal uses ranks over
the value domain, ``d = (sum_{g=c..k} n_g - (n_c + n_k) / 2)**2``, which equals the squared
difference of the values' mid-ranks ``m_g = (n_0 + … + n_g) - n_g / 2``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, TypeAlias

import numpy as np
import numpy.typing as npt

AlphaLevel: TypeAlias = Literal["nominal", "ordinal", "interval"]
RatingsInput: TypeAlias = Sequence[Sequence[float | None]] | npt.NDArray[Any]

_LEVELS: tuple[AlphaLevel, ...] = ("nominal", "ordinal", "interval")


def ratings_matrix(ratings: RatingsInput) -> npt.NDArray[np.float64]:
    """Convert raters × items ratings (``None`` or NaN = missing) to a float matrix.

    Raises:
        ValueError: if the ratings are not a rectangular 2-D table of finite numbers.
    """
    if isinstance(ratings, np.ndarray) and ratings.dtype != object:
        data = np.asarray(ratings, dtype=np.float64)
    else:
        rows = [list(row) for row in ratings]
        widths = {len(row) for row in rows}
        if len(widths) > 1:
            raise ValueError(f"every rater row must have the same number of items, got lengths {sorted(widths)}")
        data = np.array(
            [[math.nan if value is None else float(value) for value in row] for row in rows],
            dtype=np.float64,
        )
    if data.ndim != 2:
        raise ValueError(f"ratings must be a 2-D table (raters × items), got {data.ndim} dimension(s)")
    if np.isinf(data).any():
        raise ValueError("ratings must be finite numbers; use None or NaN for a missing rating")
    return data


def krippendorff_alpha(ratings: RatingsInput, level: AlphaLevel) -> float:
    """Krippendorff's alpha for ``ratings`` (rows are raters, columns are items).

    Args:
        ratings: A raters × items table; ``None`` or NaN marks a missing rating.
        level: ``"nominal"``, ``"ordinal"`` (rank-based metric over the observed value
            domain, as Krippendorff defines it) or ``"interval"``.

    Returns:
        Alpha in [-1, 1] (it can fall below -1 only for pathological small samples).
        Degenerate cases, as PyRIT's implementation treats them:
        NaN when no item has two or more ratings (alpha is undefined);
        1.0 when every pairable rating has the same value (no disagreement is possible
        and none is observed).

    Raises:
        ValueError: for an unknown level or malformed ratings.
    """
    if level not in _LEVELS:
        raise ValueError(f"level must be one of {', '.join(_LEVELS)}, got {level!r}")
    data = ratings_matrix(ratings)
    present = ~np.isnan(data)
    domain = np.unique(data[present])
    if domain.size == 0:
        return math.nan

    # counts[u, v]: how many raters gave value domain[v] to item u (missing values excluded).
    counts = np.zeros((data.shape[1], domain.size), dtype=np.float64)
    rater_idx, item_idx = np.nonzero(present)
    value_idx = np.searchsorted(domain, data[rater_idx, item_idx])
    np.add.at(counts, (item_idx, value_idx), 1.0)

    per_item = counts.sum(axis=1)
    pairable = per_item >= 2
    if not pairable.any():
        return math.nan
    c = counts[pairable]
    weights = 1.0 / (per_item[pairable] - 1.0)
    # sum_u (c_u c_u^T - diag(c_u)) / (m_u - 1)
    coincidences = np.einsum("u,uc,uk->ck", weights, c, c) - np.diag((c * weights[:, None]).sum(axis=0))

    n_v = coincidences.sum(axis=0)
    n = float(n_v.sum())
    if np.count_nonzero(n_v > 0) <= 1:
        return 1.0

    distance = _distances(level, domain, n_v)
    observed = float((coincidences * distance).sum()) / n
    expected = float((np.outer(n_v, n_v) * distance).sum()) / (n * (n - 1.0))
    return 1.0 - observed / expected


def _distances(
    level: AlphaLevel, domain: npt.NDArray[np.float64], n_v: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    if level == "nominal":
        return 1.0 - np.eye(domain.size)
    if level == "interval":
        return np.subtract.outer(domain, domain) ** 2
    mid_ranks = np.cumsum(n_v) - n_v / 2.0
    return np.subtract.outer(mid_ranks, mid_ranks) ** 2
