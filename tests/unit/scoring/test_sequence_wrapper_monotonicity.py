"""ToolSequence when a call's records arrive one by one (DESIGN §1, Monotonicity) -- an open gap.

``_calls`` counts one call recorded twice (a framework's TOOL span around ``intercept_tool``'s,
one call id) as its innermost record. Which record is innermost changes as records arrive: a
record nested in one already seen makes that one a wrapper, and the call moves to the nested
record's (later) start time. ``judge_sequence`` orders calls by that start time, so a decided
order is undone by more evidence: TRUE becomes FALSE, FALSE becomes TRUE.

The streaming service publishes such a verdict as final (decided on partial coverage, so
``Decider.needs_completion`` is False and no late span revises it), while the observation
published later for the same expectation would replay to the opposite verdict.

Which start a call that has several records takes (so that no later record can move it) is a
design decision, left open: these tests are strict xfails until it is made.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from scoring.models import Coverage, ToolExecution, ToolSequence
from scoring.models.status import Verdict
from scoring.verdict import Evidence, judge
from tests.unit.scoring.test_sequence_ties import ex

T, F, U = Verdict.TRUE, Verdict.FALSE, Verdict.UNDETERMINED
OPEN_GAP = "a record nested in one already seen moves its call's start time (design decision pending)"


def evidence(executions: Sequence[ToolExecution], complete: bool) -> Evidence:
    ordered = tuple(sorted(executions, key=lambda e: (e.start_time_unix_nano, e.span_id)))
    return Evidence(ordered, Coverage.completed() if complete else Coverage.incomplete())


# x's framework span (1-30), y (10-12), then x's intercept_tool span (15-20) inside the first.
OUTER_X = ex("x", 1, 30, span=1, call_id="call_x")
Y = ex("y", 10, 12, span=2, call_id="call_y")
INNER_X = ex("x", 15, 20, span=3, call_id="call_x")


@pytest.mark.xfail(strict=True, reason=OPEN_GAP)
def test_a_proven_order_is_not_undone_by_a_nested_record_of_the_same_call() -> None:
    c = ToolSequence(tools=("x", "y"), mode="subsequence")
    assert judge(c, evidence([OUTER_X, Y], False)).verdict is T
    # Same call, more evidence, complete coverage: the decided TRUE must stand (it is FALSE today).
    assert judge(c, evidence([OUTER_X, Y, INNER_X], True)).verdict is T


@pytest.mark.xfail(strict=True, reason=OPEN_GAP)
def test_an_exact_order_refuted_on_partial_evidence_stays_refuted() -> None:
    c = ToolSequence(tools=("y", "x"), mode="exact")
    # FALSE on partial coverage ("cannot become exactly"): final in the service, never revised.
    assert judge(c, evidence([OUTER_X, Y], False)).verdict is F
    # More evidence of the same two calls, complete coverage: must stay FALSE (it is TRUE today).
    assert judge(c, evidence([OUTER_X, Y, INNER_X], True)).verdict is F
