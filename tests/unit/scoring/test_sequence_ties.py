"""ToolSequence with start-time ties, and one call recorded twice.

Executions that started at the same time may have run in any order among themselves. The judge
decides from the groups directly (no enumeration of orders, so no limit on ties); a brute-force
enumeration of every order is the oracle here. Growing evidence never undoes a verdict.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from scoring.models import ArgumentMatcher, Coverage, ToolCallRequirement, ToolExecution, ToolsCalled, ToolSequence
from scoring.models.evidence import CaptureState
from scoring.models.status import Verdict
from scoring.verdict import Evidence, judge

T, F, U = Verdict.TRUE, Verdict.FALSE, Verdict.UNDETERMINED
TRACE = "0af7651916cd43dd8448eb211c80319c"


def ex(
    name: str, start: int, end: int | None = None, *, span: int, call_id: str | None = None, **kw: object
) -> ToolExecution:
    return ToolExecution(
        name=name,
        trace_id=TRACE,
        span_id=f"{span:016x}",
        call_id=call_id,
        status="ok",
        start_time_unix_nano=start,
        end_time_unix_nano=start + 1 if end is None else end,
        **kw,  # type: ignore[arg-type]
    )


def evidence(executions: Sequence[ToolExecution], complete: bool) -> Evidence:
    ordered = tuple(sorted(executions, key=lambda e: (e.start_time_unix_nano, e.span_id)))
    return Evidence(ordered, Coverage.completed() if complete else Coverage.incomplete())


def _is_subsequence(needle: Sequence[str], haystack: Sequence[str]) -> bool:
    it = iter(haystack)
    return all(any(x == y for y in it) for x in needle)


def oracle(c: ToolSequence, ev: Evidence) -> Verdict:
    """Every order the start times allow, tried one by one."""
    groups: dict[int, list[str]] = {}
    for e in ev.executions:
        groups.setdefault(e.start_time_unix_nano, []).append(e.name)
    orders: list[list[str]] = [[]]
    for _, g in sorted(groups.items()):
        orders = [o + list(p) for o in orders for p in set(itertools.permutations(g))]
    want = list(c.tools)
    if c.mode == "subsequence":
        hits = [_is_subsequence(want, o) for o in orders]
        if all(hits):
            return T
        return U if any(hits) or not ev.complete else F
    if not any(_is_subsequence(o, want) for o in orders):
        return F
    if not ev.complete:
        return U
    equal = [o == want for o in orders]
    return T if all(equal) else (F if not any(equal) else U)


names = st.sampled_from("abc")
timed = st.lists(st.tuples(names, st.integers(1, 4)), max_size=7)


@settings(max_examples=600, deadline=None)
@given(
    run=timed,
    want=st.lists(names, min_size=1, max_size=4),
    mode=st.sampled_from(["subsequence", "exact"]),
    complete=st.booleans(),
)
def test_the_judge_agrees_with_every_order_tried(
    run: list[tuple[str, int]], want: list[str], mode: str, complete: bool
) -> None:
    c = ToolSequence(tools=tuple(want), mode=mode)  # type: ignore[arg-type]
    ev = evidence([ex(n, t, span=i + 1) for i, (n, t) in enumerate(run)], complete)
    assert judge(c, ev).verdict is oracle(c, ev)


@settings(max_examples=300, deadline=None)
@given(run=timed, more=timed, want=st.lists(names, min_size=1, max_size=4))
def test_a_subsequence_proven_stays_proven_as_executions_arrive(
    run: list[tuple[str, int]], more: list[tuple[str, int]], want: list[str]
) -> None:
    c = ToolSequence(tools=tuple(want), mode="subsequence")
    first = [ex(n, t, span=i + 1) for i, (n, t) in enumerate(run)]
    later = [ex(n, t, span=100 + i) for i, (n, t) in enumerate(more)]
    if judge(c, evidence(first, False)).verdict is T:
        assert judge(c, evidence([*first, *later], False)).verdict is T
        assert judge(c, evidence([*first, *later], True)).verdict is T


def test_many_ties_do_not_undo_a_proven_order() -> None:
    # search then send_email: proven. Then seven unrelated tools all start at one instant (a coarse
    # clock), and one without a start time: still proven (it used to turn UNDETERMINED).
    c = ToolSequence(tools=("search", "send_email"), mode="subsequence")
    base = [ex("search", 10, span=1), ex("send_email", 20, span=2)]
    assert judge(c, evidence(base, False)).verdict is T
    tied = [ex(f"tool_{i}", 30, span=10 + i) for i in range(7)]
    assert judge(c, evidence([*base, *tied], True)).verdict is T
    assert judge(c, evidence([*base, *tied, ex("late", 0, 0, span=50)], True)).verdict is T
    # 40 executions tied at one instant: decided without trying their 40! orders
    crowd = [ex("a" if i % 2 else "b", 5, span=100 + i) for i in range(40)]
    assert judge(ToolSequence(tools=("b", "a"), mode="subsequence"), evidence(crowd, True)).verdict is U
    assert judge(ToolSequence(tools=("b", "c"), mode="subsequence"), evidence(crowd, True)).verdict is F


# --- one call recorded twice ----------------------------------------------------------------------


def test_a_call_recorded_by_two_instrumentations_counts_once() -> None:
    # A framework's TOOL span around intercept_tool's span, both with call id call_1: one refund.
    outer = ex("refund", 10, 50, span=1, call_id="call_1")
    inner = ex("refund", 20, 40, span=2, call_id="call_1")
    once = ToolsCalled(tools=(ToolCallRequirement(name="refund", max_count=1),))
    for executions in ([outer, inner], [inner, outer]):
        ev = evidence(executions, True)
        assert judge(once, ev).verdict is T
        assert judge(ToolSequence(tools=("refund",), mode="exact"), ev).verdict is T


def test_retries_of_one_call_each_count() -> None:
    # The same call id, one run after the other (a retry): the tool ran twice.
    first = ex("refund", 10, 20, span=1, call_id="call_1")
    retry = ex("refund", 30, 40, span=2, call_id="call_1")
    wrapper = ex("refund", 5, 45, span=3, call_id="call_1")  # the framework's span around both
    once = ToolsCalled(tools=(ToolCallRequirement(name="refund", max_count=1),))
    assert judge(once, evidence([first, retry], True)).verdict is F
    assert judge(once, evidence([first, retry, wrapper], True)).verdict is F


def test_the_wrappers_captured_arguments_speak_for_the_call() -> None:
    # The outer record has the arguments in full, the inner one cut them: the call is proven.
    outer = ex("send", 10, 50, span=1, call_id="c", arguments='{"to": "a@b.c"}', arguments_state=CaptureState.CAPTURED)
    inner = ex("send", 20, 40, span=2, call_id="c", arguments='{"to": "a@', arguments_state=CaptureState.TRUNCATED)
    req = ToolsCalled(
        tools=(ToolCallRequirement(name="send", arguments=(ArgumentMatcher(path="$.to", equals="a@b.c"),)),)
    )
    assert judge(req, evidence([outer, inner], True)).verdict is T
    assert judge(req, evidence([inner], True)).verdict is U


interval = st.tuples(st.integers(1, 30), st.integers(0, 12)).map(lambda t: (t[0], t[0] + t[1] if t[1] else 0))


@settings(max_examples=400, deadline=None)
@given(records=st.lists(interval, min_size=1, max_size=6), data=st.data())
def test_records_of_one_call_never_count_less_as_more_arrive(
    records: list[tuple[int, int]], data: st.DataObject
) -> None:
    # Nested records of one call are one execution; more records (in any order) never lower the
    # count: a FALSE from "ran more than max_count" on partial evidence is never undone.
    order = data.draw(st.permutations(records))
    seen: list[ToolExecution] = []
    counts: list[int] = []
    for i, (start, end) in enumerate(order):
        seen.append(ex("refund", start, end, span=i + 1, call_id="call_1"))
        counts.append(len(evidence(seen, False).calls))
    assert counts == sorted(counts)
