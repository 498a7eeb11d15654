"""An argument matcher's regex runs on the agent's arguments (which the model under test steers)
in the service's event loop, for every tenant at once: a pattern that backtracks exponentially,
such as ``^(\\w+\\s?)+$`` on 40 letters and a ``!``, would stall all scoring (and the consumer's
heartbeats, so the group would hand the batch to the next instance, which stalls too). The
service refuses such a pattern when the expectation arrives (``invalid_matcher``); the usual
ones, and the same nesting made possessive or atomic, are taken."""

from __future__ import annotations

import json
import time

import pytest

from collector.wire.convert import ControlDecodeError, expectation_from_proto
from collector.wire.gen import common_pb2, control_pb2
from scoring.models import ArgumentMatcher
from scoring.models.evidence import CaptureState, ToolExecution
from scoring.verdict.conditions import match_arguments

CATASTROPHIC = [
    r"^(\w+\s?)+$",
    r"^(?:a+)+$",
    r"^(a*b?)*$",
    r"^(a?a?)+$",
    r"^(.*a){12}$",
    r"(?=(a+)+b)",
    r"^(a{1,1000})+$",
]
TAKEN = [
    r"^/tmp/.*",
    r"^[a-z]+@example\.com$",
    r"^(\d{1,3}\.){3}\d{1,3}$",
    r"^(?:foo|bar)+$",
    r"^LH\d{3,4}$",
    r"^(a+){2}$",
    r"^(?>\w+\s?)+$",
    r"^(?:\w+\s?)++$",
    r"^x+$",
]
HOSTILE = ["a" * 1000 + "!", "1" * 1000 + "!", "a " * 500 + "!", "a." * 500 + "!"]


def _expectation(regex: str) -> control_pb2.Expectation:
    matcher = control_pb2.ArgumentMatcher(path="$.q", regex=regex)
    requirement = control_pb2.ToolCallRequirement(name="search", arguments=[matcher])
    return control_pb2.Expectation(
        expectation_id="e1",
        scope=common_pb2.Scope(traces=common_pb2.TraceScope(trace_ids=["ab" * 16])),
        conditions=[control_pb2.Condition(tools_called=control_pb2.ToolsCalled(tools=[requirement]))],
    )


def _decode(regex: str) -> object:
    return expectation_from_proto(_expectation(regex), default_tenant="t", default_deadline_s=10, now_ms=1)


@pytest.mark.parametrize("regex", CATASTROPHIC)
def test_a_regex_that_backtracks_catastrophically_is_refused(regex: str) -> None:
    with pytest.raises(ControlDecodeError) as info:
        _decode(regex)
    assert info.value.reason == "invalid_matcher"
    assert "possessive" in info.value.detail


@pytest.mark.parametrize("regex", TAKEN)
def test_usual_regexes_are_taken_and_stay_fast_on_hostile_arguments(regex: str) -> None:
    _decode(regex)
    matcher = ArgumentMatcher(path="$.q", regex=regex)
    started = time.perf_counter()
    for text in HOSTILE:
        execution = ToolExecution(
            name="search", arguments=json.dumps({"q": text}), arguments_state=CaptureState.CAPTURED
        )
        match_arguments(matcher, execution)
    assert time.perf_counter() - started < 2.0
