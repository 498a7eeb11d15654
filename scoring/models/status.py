"""Score status and the three-valued verdict used by the pure decision core."""

from __future__ import annotations

from enum import StrEnum


class ScoreStatus(StrEnum):
    """Whether a score carries a judgment (PyRIT's name and values)."""

    COMPLETE = "complete"
    UNDETERMINED = "undetermined"


class Verdict(StrEnum):
    """Strong-Kleene truth value of a condition or scorer tree on some evidence."""

    TRUE = "true"
    FALSE = "false"
    UNDETERMINED = "undetermined"

    @property
    def decided(self) -> bool:
        return self is not Verdict.UNDETERMINED

    @staticmethod
    def of(value: bool | None) -> Verdict:
        if value is None:
            return Verdict.UNDETERMINED
        return Verdict.TRUE if value else Verdict.FALSE

    def to_bool(self) -> bool | None:
        if self is Verdict.UNDETERMINED:
            return None
        return self is Verdict.TRUE

    def invert(self) -> Verdict:
        if self is Verdict.TRUE:
            return Verdict.FALSE
        if self is Verdict.FALSE:
            return Verdict.TRUE
        return self
