"""One call recorded by two instrumentations counts once; two calls stay two (DESIGN §1).

Records of one tool in one trace by two recorders (instrumentation scopes) that overlap in time,
with no differing call id or captured arguments, are one call when they pair up only one way;
where they could pair up more ways, the count is bounded, never guessed. Records by one recorder
are separate calls (an instrumentation records a call once), however they overlap.
"""

from __future__ import annotations

import pytest

from scoring.models import CaptureState, Coverage, ToolCallRequirement, ToolExecution, ToolsCalled, ToolSequence
from scoring.models.status import Verdict
from scoring.verdict import Evidence, judge

T, F, U = Verdict.TRUE, Verdict.FALSE, Verdict.UNDETERMINED
TRACE = "0af7651916cd43dd8448eb211c80319c"


def rec(
    name: str, start: int, end: int, span: int, recorder: str | None, call_id: str | None = None,
    arguments: str | None = None, status: str = "ok",
) -> ToolExecution:
    return ToolExecution(
        name=name, trace_id=TRACE, span_id=f"{span:016x}", call_id=call_id, status=status,  # type: ignore[arg-type]
        start_time_unix_nano=start, end_time_unix_nano=end, arguments=arguments,
        arguments_state=CaptureState.CAPTURED if arguments else CaptureState.ABSENT, recorder=recorder,
    )


def verdict(condition: ToolsCalled | ToolSequence, records: list[ToolExecution], complete: bool = True) -> Verdict:
    cov = Coverage.completed() if complete else Coverage.incomplete()
    return judge(condition, Evidence(tuple(sorted(records, key=lambda e: e.start_time_unix_nano)), cov)).verdict


def exactly(name: str, n: int) -> ToolsCalled:
    return ToolsCalled(tools=(ToolCallRequirement(name=name, min_count=n, max_count=n),))


def at_least(name: str, n: int) -> ToolsCalled:
    return ToolsCalled(tools=(ToolCallRequirement(name=name, min_count=n),))


@pytest.mark.parametrize(
    ("records", "n"),
    [
        # two instrumentations, one call: siblings in two span trees, overlapping
        ([rec("x", 10, 20, 1, "oi"), rec("x", 11, 19, 2, "oll", call_id="call_1")], 1),
        # the tool boundary inside the framework's record, which had no call id to give it
        ([rec("x", 10, 20, 1, "framework"), rec("x", 15, 18, 2, "boundary")], 1),
        # one instrumentation, two parallel calls of one tool: two calls, however they overlap
        ([rec("x", 10, 20, 1, "oi"), rec("x", 12, 22, 2, "oi")], 2),
        # two instrumentations, but another call id each: two calls
        ([rec("x", 10, 20, 1, "oi", "call_1"), rec("x", 11, 19, 2, "oll", "call_2")], 2),
        # two instrumentations writing one call's arguments differently: still one call
        ([rec("x", 10, 20, 1, "oi", arguments='{"a": 1}'), rec("x", 11, 19, 2, "oll", arguments='"1"')], 1),
        # one after the other: two calls (a retry), whoever recorded them
        ([rec("x", 10, 20, 1, "oi"), rec("x", 30, 40, 2, "oll")], 2),
        # a record whose recorder is not known is paired with none
        ([rec("x", 10, 20, 1, None), rec("x", 11, 19, 2, "oll")], 2),
    ],
    ids=["two-instrumentations", "boundary-inside", "parallel", "other-ids", "arguments-as-written", "retry",
         "unknown"],
)
def test_records_count_as_the_calls_they_prove(records: list[ToolExecution], n: int) -> None:
    assert verdict(exactly("x", n), records) is T
    assert verdict(at_least("x", n + 1), records) is F


def test_records_that_pair_up_more_than_one_way_bound_the_count_and_prove_no_exact_one() -> None:
    # two parallel calls, each recorded by both instrumentations, no ids: 2 calls, or 3, or 4
    records = [rec("x", 10, 30, 1, "oi"), rec("x", 12, 32, 2, "oi"), rec("x", 11, 29, 3, "oll"),
               rec("x", 13, 31, 4, "oll")]
    assert verdict(at_least("x", 2), records) is T  # the two of one instrumentation are surely two
    assert verdict(exactly("x", 2), records) is U
    assert verdict(exactly("x", 4), records) is U
    assert verdict(at_least("x", 5), records) is F  # never more calls than records
    assert verdict(ToolSequence(tools=("x", "x"), mode="exact"), records) is U


def test_a_failure_either_record_shows_is_the_calls() -> None:
    records = [rec("x", 10, 20, 1, "framework", status="error"), rec("x", 15, 18, 2, "boundary", status="error")]
    failed = ToolsCalled(tools=(ToolCallRequirement(name="x", status="error", min_count=1, max_count=1),))
    assert verdict(failed, records) is T


def test_a_call_another_instrumentation_may_still_join_is_not_ordered_before_it_can_move() -> None:
    # x's record holds y's; another instrumentation's record of x, nested later than y, may come
    x, y, inner_x = rec("x", 1, 30, 1, "a"), rec("y", 10, 12, 2, "a"), rec("x", 15, 20, 3, "b")
    in_order = ToolSequence(tools=("x", "y"), mode="subsequence")
    assert verdict(in_order, [x, y], complete=False) is U
    assert verdict(in_order, [x, y, inner_x], complete=True) is F
    assert verdict(in_order, [x, y], complete=True) is T


@pytest.mark.parametrize("recorded", ["Send_Email", "send_email ", "ｓｅｎｄ_ｅｍａｉｌ", "send\u200b_email"])
def test_a_confusable_name_makes_absence_unprovable(recorded: str) -> None:
    # A lenient dispatcher ran send_email for what the model spelled this way; the record keeps the spelling.
    records = [rec(recorded, 10, 20, 1, "agent")]
    ran = ToolsCalled(tools=(ToolCallRequirement(name="send_email"),))
    assert verdict(ran, records) is U  # so "send_email never ran" is not TRUE
    assert verdict(ToolSequence(tools=("send_email",), mode="any_order"), records) is U
    assert verdict(ToolsCalled(tools=(ToolCallRequirement(name="search"),)), records) is F


def test_a_model_chosen_id_on_two_parallel_calls_keeps_them_two() -> None:
    # one layer, one id the model gave both calls, the first slower (the second nested in its time)
    records = [rec("send_email", 10, 40, 1, "agent", "call_1"), rec("send_email", 15, 20, 2, "agent", "call_1")]
    assert verdict(exactly("send_email", 2), records) is T
    assert verdict(ToolsCalled(tools=(ToolCallRequirement(name="send_email", max_count=1),)), records) is F


def test_many_calls_sharing_one_id_are_judged_in_linear_time_and_bounded() -> None:
    one_layer = [rec("x", 10 + i, 11 + i, i + 1, "agent", "call_1") for i in range(2000)]
    assert verdict(exactly("x", 2000), one_layer) is T
    two_layers = [rec("x", 10 + i, 11 + i, i + 1, "ab"[i % 2], "call_1") for i in range(2000)]
    assert verdict(at_least("x", 1000), two_layers) is T  # the most one layer recorded
    assert verdict(exactly("x", 2000), two_layers) is U


def test_records_that_do_not_count_runs_one_for_one_never_refute_a_count() -> None:
    # CrewAI's tool-usage events: one record may stand for two runs of the body
    events = "openinference.instrumentation.crewai._event_listener"
    records = [rec("x", 10, 20, 1, events), rec("x", 30, 40, 2, events)]
    assert verdict(at_least("x", 1), records) is T
    assert verdict(exactly("x", 4), records) is U
    assert verdict(ToolSequence(tools=("x",) * 4, mode="exact"), records) is U
    assert verdict(ToolSequence(tools=("x", "y"), mode="exact"), records) is F  # y never ran
