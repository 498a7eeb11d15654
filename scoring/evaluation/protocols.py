"""The few members of a scorer, a score and a scorer identity that evaluation relies on.

The scoring library (``scoring.score`` / ``scoring.models``) is written independently of
this package; evaluation codes against these structural Protocols instead of importing
it, so any object with these members can be evaluated — the real scorers, the self-ask
judges in :mod:`scoring.evaluation.judges`, or a small fake in a test.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Protocol, runtime_checkable

TRUE_FALSE = "true_false"
FLOAT_SCALE = "float_scale"


@runtime_checkable
class ScorerIdentifierLike(Protocol):
    """A scorer's identity: class name, parameters, child components, SHA-256 hash."""

    @property
    def class_name(self) -> str: ...

    @property
    def params(self) -> Mapping[str, object]: ...

    @property
    def children(self) -> Mapping[str, object]: ...

    def get_child(self, name: str) -> object: ...

    @property
    def hash(self) -> str: ...


@runtime_checkable
class ScoreLike(Protocol):
    """One score: ``get_value()`` is True/False/float, or None when undetermined."""

    @property
    def status(self) -> object: ...

    def get_value(self) -> bool | float | None: ...


@runtime_checkable
class EvaluableScorer(Protocol):
    """A text scorer that can be evaluated against human labels.

    ``scorer_type`` is ``"true_false"`` (objective metrics) or ``"float_scale"``
    (harm metrics).
    """

    @property
    def scorer_type(self) -> str: ...

    async def score_text_async(self, text: str, *, objective: str | None = None) -> Sequence[ScoreLike]: ...

    def get_identifier(self) -> ScorerIdentifierLike: ...


def is_undetermined(score: ScoreLike) -> bool:
    """True when the score carries no judgment (status UNDETERMINED or no value).

    The status is read by name or value so that any enum spelled like PyRIT's
    ``ScoreStatus`` (``UNDETERMINED`` / ``"undetermined"``) is understood.
    """
    # The status first: a score without a judgment may refuse ``get_value()`` (a PyRIT-era score
    # with an empty value raises), and its status already says so.
    status = score.status
    if isinstance(status, Enum):
        if status.name.upper() == "UNDETERMINED" or str(status.value).lower() == "undetermined":
            return True
    elif str(status).lower() == "undetermined":
        return True
    return score.get_value() is None
