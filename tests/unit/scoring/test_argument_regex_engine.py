"""Argument matcher regexes run on the ``regex`` engine with a time limit.

The pattern is the harness's, the text is what the model under test wrote into a tool call, and
the search runs in the streaming service's event loop. With ``re`` even an ordinary pattern takes
time quadratic in the text (``[a-z0-9]+@evil\\.com`` on 64 KiB of digits: ~13 s) and cannot be
stopped. A search that does not finish in ``REGEX_TIMEOUT_S`` is a match not known: UNDETERMINED,
never FALSE (missing evidence is never a negative result), and said in the rationale.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from scoring.models import ArgumentMatcher, ToolCallRequirement, ToolsCalled
from scoring.models.evidence import CaptureState, Coverage, Observation, ToolExecution
from scoring.models.scorables import TraceScorable
from scoring.models.status import Verdict
from scoring.verdict import conditions
from scoring.verdict.conditions import Evidence, judge, match_arguments

TRACE = "ab" * 16
#: a pattern that backtracks exponentially (the service refuses it on registration; the library
#: alone takes it) and a text that makes it: 2^n ways to split the a's, none followed by the end
EXPONENTIAL = "(a|a)+$"


def _execution(value: str, name: str = "search") -> ToolExecution:
    return ToolExecution(
        name=name,
        trace_id=TRACE,
        span_id="00000000000000a1",
        arguments=json.dumps({"q": value}),
        arguments_state=CaptureState.CAPTURED,
        start_time_unix_nano=1,
        end_time_unix_nano=2,
    )


def _forget_timeouts() -> None:
    for name in ("_TIMED_OUT", "_SLOW_PATTERNS"):
        getattr(conditions, name, {}).clear()


@pytest.fixture(autouse=True)
def _fresh_timeouts() -> Any:
    _forget_timeouts()
    yield
    _forget_timeouts()


def test_an_ordinary_pattern_decides_on_a_long_value() -> None:
    digits = "1" * 65_536
    matcher = ArgumentMatcher(path="$.q", regex=r"[a-z0-9]+@evil\.com")
    assert match_arguments(matcher, _execution(digits)) is Verdict.FALSE
    assert match_arguments(matcher, _execution(digits + "x@evil.com")) is Verdict.TRUE
    assert not conditions._TIMED_OUT  # decided, not timed out


def test_a_search_that_runs_out_of_time_is_undetermined_not_false(monkeypatch: pytest.MonkeyPatch) -> None:
    # 2^26 paths: seconds for either engine, far beyond a 1 ms limit. Under ``re`` this was FALSE.
    monkeypatch.setattr(conditions, "REGEX_TIMEOUT_S", 0.001)
    matcher = ArgumentMatcher(path="$.q", regex=EXPONENTIAL)
    assert match_arguments(matcher, _execution("a" * 26 + "!")) is Verdict.UNDETERMINED
    # what does match is still TRUE, what cannot is FALSE
    assert match_arguments(matcher, _execution("aaa")) is Verdict.TRUE
    assert match_arguments(matcher, _execution("b")) is Verdict.FALSE


def test_the_default_limit_ends_an_exponential_search() -> None:
    matcher = ArgumentMatcher(path="$.q", regex=EXPONENTIAL)
    assert match_arguments(matcher, _execution("a" * 40 + "!")) is Verdict.UNDETERMINED


def test_a_timed_out_text_is_not_searched_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A trace is judged again with every batch that brings it a span: each judgment must not wait
    out the limit again on the same arguments."""
    monkeypatch.setattr(conditions, "REGEX_TIMEOUT_S", 0.001)
    searches: list[str] = []
    real = conditions._regex

    class Counting:
        def __init__(self, pattern: str) -> None:
            self.compiled = real(pattern)

        def search(self, text: str, **kwargs: Any) -> Any:
            searches.append(text)
            return self.compiled.search(text, **kwargs)

    monkeypatch.setattr(conditions, "_regex", Counting)
    matcher = ArgumentMatcher(path="$.q", regex=EXPONENTIAL)
    slow = "a" * 300 + "!"  # long enough to be remembered by digest
    assert match_arguments(matcher, _execution(slow)) is Verdict.UNDETERMINED
    assert match_arguments(matcher, _execution(slow)) is Verdict.UNDETERMINED
    assert searches == [slow]
    assert match_arguments(matcher, _execution("a" * 301 + "!")) is Verdict.UNDETERMINED  # another text: searched
    assert len(searches) == 2


def test_absence_on_complete_coverage_is_not_proven_by_an_unfinished_search(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conditions, "REGEX_TIMEOUT_S", 0.001)
    condition = ToolsCalled(
        tools=(ToolCallRequirement(name="search", arguments=(ArgumentMatcher(path="$.q", regex=EXPONENTIAL),)),)
    )
    observation = Observation(
        scorable=TraceScorable(trace_ids=(TRACE,)),
        tool_executions=(_execution("a" * 26 + "!"),),
        coverage=Coverage.completed(),
    )
    judgment = judge(condition, Evidence.of(observation))
    assert judgment.verdict is Verdict.UNDETERMINED
    assert "did not finish within 0.001 s" in judgment.rationale


def test_the_limit_is_logged_once_per_pattern(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(conditions, "REGEX_TIMEOUT_S", 0.001)
    matcher = ArgumentMatcher(path="$.q", regex=EXPONENTIAL)
    with caplog.at_level("WARNING", logger=conditions.__name__):
        for n in (26, 27):
            match_arguments(matcher, _execution("a" * n + "!"))
    lines = [r.getMessage() for r in caplog.records if "did not finish" in r.getMessage()]
    assert len(lines) == 1 and "(a|a)+$" in lines[0]


def test_word_characters_follow_unicode() -> None:
    """The documented difference from ``re``: a zero-width joiner or a combining mark inside a word
    is part of it (a payload cannot split a word run with one)."""
    matcher = ArgumentMatcher(path="$.q", regex=r"^\w+$")
    assert match_arguments(matcher, _execution("ev\u200dil")) is Verdict.TRUE
    assert match_arguments(matcher, _execution("cafe\u0301")) is Verdict.TRUE
    assert match_arguments(matcher, _execution("evil!")) is Verdict.FALSE


def test_a_final_dollar_is_still_the_end_of_the_value() -> None:
    matcher = ArgumentMatcher(path="$.q", regex="^ls$")
    assert match_arguments(matcher, _execution("ls")) is Verdict.TRUE
    assert match_arguments(matcher, _execution("ls\n")) is Verdict.FALSE


def test_a_pattern_the_engine_refuses_is_refused_when_the_matcher_is_built() -> None:
    with pytest.raises(ValueError, match="invalid regex"):
        ArgumentMatcher(path="$.q", regex="(")


_UNROLL_CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # a regression fails here, not the machine
from collector.client import build_expectation
from collector.wire.convert import ControlDecodeError, expectation_from_proto
from scoring.models import ArgumentMatcher, ScoringExpectation, ToolCallRequirement, ToolsCalled, TraceScorable
pattern = sys.argv[1]
try:
    ArgumentMatcher(path="$.q", regex=pattern)
    print("library: taken")
except ValueError as exc:
    print("library:", str(exc).replace("\\n", " "))
matcher = ArgumentMatcher.model_construct(path="$.q", regex=pattern)
expectation = ScoringExpectation.model_construct(
    conditions=(ToolsCalled.model_construct(tools=(ToolCallRequirement.model_construct(
        name="search", arguments=(matcher,), status="any", min_count=1, max_count=None),)),),
    objective=None,
)
msg = build_expectation(expectation_id="e1", tenant="default", scope=TraceScorable(trace_ids=("ab" * 16,)),
                        expectation=expectation, scorer="tools", deadline=None, labels=None)
try:
    expectation_from_proto(msg, default_tenant="default", default_deadline_s=1.0, now_ms=0)
    print("service: taken")
except ControlDecodeError as exc:
    print("service:", exc.reason, exc.detail.replace("\\n", " "))
"""


#: counted repetitions the backtracking check takes (so the service's decoding reaches the bound)
UNROLLING = ["(?:ab{9999}){9999}", "(?:ab{999}){999}", "(?:ab{999}){11}(?:cd{999}){11}"]


@pytest.mark.parametrize("pattern", UNROLLING)
def test_a_regex_that_would_unroll_to_gigabytes_is_refused_before_it_is_compiled(pattern: str) -> None:
    """The regex engine writes a counted repetition out its minimum number of times, nested ones
    multiplied: a fuzzed pattern of that kind ran a CI test process out of 23 GiB, and
    ``(?:ab{9999}){9999}`` (which the backtracking check takes) would have done the same to the
    service. It is refused, in the library and by the service's decoding, with what to change."""
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run(
        [sys.executable, "-c", _UNROLL_CHILD, pattern], cwd=Path(__file__).resolve().parents[3],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    library, service = done.stdout.strip().splitlines()
    assert "too much memory to compile" in library and "at most 20,000" in library, library
    assert service.startswith("service: invalid_expectation") and "too much memory" in service, service


@pytest.mark.parametrize(
    "pattern", [r"^\d{3}-\d{4}$", r"(?:[a-z]{2,63}\.){1,127}com", "(?:a{100}){100}", r"[A-Za-z0-9+/]{1000,}"]
)
def test_counted_repetitions_of_a_usual_size_are_taken(pattern: str) -> None:
    assert ArgumentMatcher(path="$.q", regex=pattern).regex == pattern
