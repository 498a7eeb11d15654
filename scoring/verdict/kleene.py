"""Strong Kleene connectives. These keep decided verdicts stable as evidence grows."""

from __future__ import annotations

from collections.abc import Iterable

from scoring.models.status import Verdict

T, F, U = Verdict.TRUE, Verdict.FALSE, Verdict.UNDETERMINED


def all_of(values: Iterable[Verdict]) -> Verdict:
    """AND: FALSE as soon as one is FALSE; TRUE only if all are TRUE."""
    result = T
    for v in values:
        if v is F:
            return F
        if v is U:
            result = U
    return result


def any_of(values: Iterable[Verdict]) -> Verdict:
    """OR: TRUE as soon as one is TRUE; FALSE only if all are FALSE."""
    result = F
    for v in values:
        if v is T:
            return T
        if v is U:
            result = U
    return result


def majority(values: Iterable[Verdict]) -> Verdict:
    """MAJORITY (strictly more than half TRUE), decided as soon as the outcome is forced."""
    vs = list(values)
    n = len(vs)
    trues = sum(v is T for v in vs)
    falses = sum(v is F for v in vs)
    if 2 * trues > n:
        return T
    if 2 * (n - falses) <= n:
        return F
    return U
