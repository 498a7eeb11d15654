"""Attack outcome, as an attack driver maps a score to it."""

from __future__ import annotations

from enum import StrEnum


class AttackOutcome(StrEnum):
    SUCCESS = "success"
    FAILURE = "failure"
    UNDETERMINED = "undetermined"
