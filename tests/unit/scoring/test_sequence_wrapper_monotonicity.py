"""ToolSequence when a call's records arrive one by one (DESIGN §1, Monotonicity).

``_calls`` counts one call recorded twice (a framework's TOOL span around ``intercept_tool``'s,
one call id) as its innermost record. Which record is innermost changes as records arrive: a
record nested in one already seen makes that one a wrapper, and the call moves to the nested
record's (later) start. So while coverage is incomplete a call with a call id may still turn out
to have started anywhere within its innermost record, and an order is decided only on what no
such record can undo: "x before y" is proven once x's record ended before y started, refuted
("cannot become exactly") only when no start within the records fits. Calls without a call id,
and every call on complete evidence, stay where they started (``test_sequence_ties``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from scoring.models import ToolExecution, ToolSequence
from scoring.models.status import Verdict
from scoring.verdict import Evidence, judge
from scoring.verdict.conditions import Window, _call_window, _fits_some_window_order, _surely_in_order
from tests.unit.scoring.test_sequence_ties import _is_subsequence, evidence, ex

T, F, U = Verdict.TRUE, Verdict.FALSE, Verdict.UNDETERMINED

# x's framework span (1-30), y (10-12), then x's intercept_tool span (15-20) inside the first.
OUTER_X = ex("x", 1, 30, span=1, call_id="call_x")
Y = ex("y", 10, 12, span=2, call_id="call_y")
INNER_X = ex("x", 15, 20, span=3, call_id="call_x")


def test_an_order_is_not_decided_while_a_nested_record_could_still_move_a_call() -> None:
    c = ToolSequence(tools=("x", "y"), mode="subsequence")
    # x's record holds y's: another record of x may still show x started after y.
    assert judge(c, evidence([OUTER_X, Y], False)).verdict is U
    # ... and one does: x's tool ran from 15, after y. FALSE on complete coverage, as the
    # observation published with it replays.
    assert judge(c, evidence([OUTER_X, Y, INNER_X], False)).verdict is U
    assert judge(c, evidence([OUTER_X, Y, INNER_X], True)).verdict is F


def test_an_exact_order_is_not_refuted_while_a_nested_record_could_still_fit_it() -> None:
    c = ToolSequence(tools=("y", "x"), mode="exact")
    assert judge(c, evidence([OUTER_X, Y], False)).verdict is U  # it used to be FALSE, final
    assert judge(c, evidence([OUTER_X, Y, INNER_X], True)).verdict is T


def test_calls_one_after_the_other_are_ordered_on_partial_evidence() -> None:
    # The usual agent loop: each call ends before the next starts. Proven as soon as seen,
    # call ids or not, and no later record of either call can undo it.
    search = ex("search", 10, 20, span=1, call_id="c1")
    send = ex("send_email", 25, 40, span=2, call_id="c2")
    seen = evidence([search, send], False)
    assert judge(ToolSequence(tools=("search", "send_email"), mode="subsequence"), seen).verdict is T
    assert judge(ToolSequence(tools=("send_email", "search"), mode="exact"), seen).verdict is F
    # overlapping calls without call ids: no other record can join them, their starts decide
    a, b = ex("a", 1, 30, span=3), ex("b", 10, 12, span=4)
    assert judge(ToolSequence(tools=("a", "b"), mode="subsequence"), evidence([a, b], False)).verdict is T


def test_an_open_record_may_still_hold_a_later_start() -> None:
    open_x = ex("x", 5, 0, span=1, call_id="call_x")  # not ended: a nested record may start any time later
    later_y = ex("y", 100, 110, span=2)
    c = ToolSequence(tools=("x", "y"), mode="subsequence")
    assert judge(c, evidence([open_x, later_y], False)).verdict is U
    assert judge(c, evidence([open_x, later_y], True)).verdict is T


def test_a_record_that_ended_before_it_started_is_not_a_window_past_its_start() -> None:
    # A clock step ended x's record "before" it started; a record starting after 40 is not nested
    # in it, so x stays at 40 or moves nowhere: x after y is proven.
    stepped_x = ex("x", 40, 30, span=1, call_id="call_x")
    y = ex("y", 10, 20, span=2)
    assert _call_window(stepped_x, False) == ("x", 40, 40)
    assert judge(ToolSequence(tools=("y", "x"), mode="subsequence"), evidence([stepped_x, y], False)).verdict is T


# --- the window checks against every order the windows allow ------------------------------------------


def _orders(windows: Sequence[Window]) -> list[list[str]]:
    """Every order of the calls in which none comes after one whose window ends before its own begins."""
    out = []
    for perm in itertools.permutations(range(len(windows))):
        where = {k: i for i, k in enumerate(perm)}
        if all(
            where[a] < where[b]
            for a, (_, _, hi) in enumerate(windows)
            for b, (_, lo, _) in enumerate(windows)
            if hi < lo
        ):
            out.append([windows[k][0] for k in perm])
    return out


window = st.tuples(st.sampled_from("abc"), st.integers(1, 12), st.integers(0, 6)).map(
    lambda t: (t[0], t[1], t[1] + t[2])
)


@settings(max_examples=500, deadline=None)
@given(windows=st.lists(window, max_size=6), want=st.lists(st.sampled_from("abc"), min_size=1, max_size=4))
def test_the_window_checks_agree_with_every_order_tried(windows: list[Window], want: list[str]) -> None:
    orders = _orders(windows)
    assert _surely_in_order(want, windows) == all(_is_subsequence(want, o) for o in orders)
    assert _fits_some_window_order(windows, want) == any(_is_subsequence(o, want) for o in orders)


# --- growth: records of calls arriving in any order ------------------------------------------------------


@st.composite
def call_records(draw: st.DrawFn) -> list[ToolExecution]:
    """A few calls, each recorded one to three times (nested, one call id) or once without an id;
    their records in a random arrival order."""
    records: list[ToolExecution] = []
    for k in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from("xy"))
        start = draw(st.integers(1, 12))
        end = start + draw(st.integers(0, 20))
        call_id = draw(st.sampled_from([f"call_{k}", f"call_{k}", None]))
        for _ in range(draw(st.integers(1, 3)) if call_id else 1):
            records.append(ex(name, start, end, span=len(records) + 1, call_id=call_id))
            # the next record of this call nests in this one
            start += draw(st.integers(0, max(0, end - start)))
            end -= draw(st.integers(0, max(0, end - start)))
    return draw(st.permutations(records))


@settings(max_examples=600, deadline=None)
@given(
    arrival=call_records(),
    want=st.lists(st.sampled_from("xy"), min_size=1, max_size=3),
    mode=st.sampled_from(["subsequence", "exact"]),
)
def test_a_decided_order_stands_as_the_records_of_its_calls_arrive(
    arrival: list[ToolExecution], want: list[str], mode: str
) -> None:
    c = ToolSequence(tools=tuple(want), mode=mode)  # type: ignore[arg-type]
    steps: list[Evidence] = [evidence(arrival[:n], False) for n in range(1, len(arrival) + 1)]
    steps.append(evidence(arrival, True))
    decided: Verdict | None = None
    for ev in steps:
        v = judge(c, ev).verdict
        if decided is not None:
            records = [(e.name, e.start_time_unix_nano, e.end_time_unix_nano, e.call_id) for e in ev.executions]
            assert v is decided, f"{decided.value} became {v.value} on {records}"
        elif v is not U:
            decided = v
