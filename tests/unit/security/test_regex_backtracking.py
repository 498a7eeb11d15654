"""An argument matcher's regex runs on the agent's arguments (which the model under test steers)
in the service's event loop, for every tenant at once: a pattern that backtracks exponentially,
such as ``^(\\w+\\s?)+$`` on 40 letters and a ``!``, would stall all scoring (and the consumer's
heartbeats, so the group would hand the batch to the next instance, which stalls too). The
service refuses such a pattern when the expectation arrives (``invalid_matcher``); the usual
ones, and the same nesting made possessive or atomic, are taken.

Each refused pattern comes with a text that makes it blow up, and that blow-up is shown by
counting the steps a model of the engine takes (``backtracking_steps``), not by timing it;
``scripts/redos_check.py`` times the same rows with ``re`` itself.
"""

from __future__ import annotations

import json
import re
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.wire.convert import ControlDecodeError, expectation_from_proto
from collector.wire.gen import common_pb2, control_pb2
from scoring.models import ArgumentMatcher, ToolsCalled
from scoring.models.evidence import CaptureState, ToolExecution
from scoring.models.status import Verdict
from scoring.verdict import conditions as verdict_conditions
from scoring.verdict.conditions import match_arguments
from tests.unit.security.backtracking_steps import StepCounter


class Refused(NamedTuple):
    pattern: str
    cause: str  # "nested" | "alternatives" | "adjacent": which words the refusal uses
    prefix: str  # the attack: prefix + pump * n + suffix
    pump: str
    suffix: str


REFUSED = [
    # a repetition of varying length in another, iterations not kept apart
    Refused(r"^(\w+\s?)+$", "nested", "", "a", "!"),
    Refused(r"^(?:a+)+$", "nested", "", "a", "!"),
    Refused(r"(a+)+$", "nested", "", "a", "!"),
    Refused(r"^(a*b?)*$", "nested", "", "a", "!"),
    Refused(r"^(a?a?)+$", "nested", "", "a", "!"),
    Refused(r"^(.*a){12}$", "nested", "", "a", "!"),  # twelve rounds: a polynomial of degree 12
    Refused(r"(?=(a+)+b)", "nested", "", "a", "!"),
    Refused(r"^(a{1,1000})+$", "nested", "", "a", "!"),
    Refused(r"(x+x+)+y", "nested", "", "x", "!"),
    Refused(r"^(\d+\.?)+$", "nested", "", "1", "!"),
    Refused(r"(a*)*$", "nested", "", "a", "!"),
    Refused(r"((a?)*b)+$", "nested", "", "b", "!"),  # (a?)* matches "" two ways
    Refused(r"(?>(\w+\s?)+$)", "nested", "", "a", "!"),  # the $ that fails is inside the atomic group
    Refused(r"([^ ]+\xa0)+$", "nested", "x", "\xa0", "!"),  # [^ ] takes the no-break space
    Refused(r"(?a)([^\s]+\xa0)+$", "nested", "x", "\xa0", "!"),  # so does ASCII [^\s]
    # alternatives that match the same text
    Refused(r"(a|a)+$", "alternatives", "", "a", "!"),
    Refused(r"(.|\s)*x", "alternatives", "", " ", "!"),
    Refused(r"(a|b|ab)*c", "alternatives", "", "ab", "!"),  # ab or a, b
    Refused(r"(\w|\d\d)+!", "alternatives", "", "1", "?"),
    Refused(r"(?i)(ab|AB)+$", "alternatives", "", "aB", "!"),
    # three adjacent repetitions over the same characters: n**3 ways per start
    Refused(r"\w*\w*\w*x", "adjacent", "", "a", "!"),
    Refused(r"^.*a.*b.*c", "adjacent", "", "ab", "!"),
    Refused(r"x.*y.*z.*w", "adjacent", "x", "yz", "!"),
    Refused(r"\w*\w*[^!]*+x", "adjacent", "", "a", "!"),  # the possessive scan is rerun n**2 times
]

ACCEPTED = [
    r"^ls$",
    r"^/tmp/.*",
    r"https?://[^/]+/",
    r"^[a-z]+@example\.com$",
    r"^[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}$",
    r"\d{3}-\d{4}",
    r"^LH\d{3,4}$",
    r"[A-Za-z0-9+/]{16,}={0,2}",
    r"(?i)secret",
    r"\b(?:password|passwd|pwd)\b",
    r"^x+$",
    r"^(?:foo|bar)+$",
    r"^(\d{1,3}\.){3}\d{1,3}$",
    r"(\d+\.){3}\d+$",  # once refused: the dots keep the iterations apart
    r"(\w+\.)+com",  # every iteration ends at a . that \w cannot match
    r"^(?:[a-z0-9-]+\.)+[a-z]{2,}$",
    r"(?:(?:\w+\.)+\w+,)+$",
    r"(\d+,)*\d+$",
    r"^([a-z]+/)+$",
    r"(\w+\s)+done",
    r"([^\s]+\xa0)+$",  # a no-break space is a \s
    r"(?:\s*,\s*\w+)*$",
    r'"(?:[^"\\]|\\.)*"',
    r'"(?:[^"]|\\")*"$',
    r"(a|ab)*c",  # a, ab: no text is two ways of them, linear
    r"(\w|\d)+!",  # the parser makes it one character set, [\w\d]
    r"(?i)(ab|cd)+$",
    r"(\w+\.)++com",  # possessive
    r"^(?:\w+\s?)++$",
    r"(\w++\s?)+$",
    r"^(?>\w+\s?)+$",  # atomic
    r"(?>(\w+\s?)+)$",  # nothing fails inside the atomic group
    r"(?:(\w+\s?)+)++!",
    r"(\w+\s?)+",  # nothing after it can fail, so it is never backtracked into
    r"(?=(a+)+)a",
    r"^(a+){2}$",  # two rounds: quadratic
    r"(\d+)\d+!",  # two adjacent repetitions: quadratic per start, left alone
    r".*rm -rf.*",
    r"curl .*evil\.com.*",
    r".*a.*b.*",  # three, but the last always succeeds
    r"https?://.*\..*/.+",  # the last succeeds on whatever follows
]

#: texts a matcher may meet: the ones the patterns are for, and pumped hostile ones
SAMPLES = [
    "",
    "ls",
    "ls\n",
    "/tmp/x",
    "https://evil.com/x?q=1",
    "curl https://a.evil.com/p",
    "bob@example.com",
    "a.b@mail.example.org",
    "555-1234",
    "LH1234",
    "aGVsbG8gd29ybGQgaGVsbG8=",
    "my SECRET is",
    "password=1",
    "foobar",
    "10.0.0.1",
    "www.example.com",
    "1,2,3",
    "a/b/",
    "foo bar done",
    'say "hi \\" there"',
    "abababc",
    "12!",
    "ABcd",
    "aa",
    "rm -rf /",
    "a\xa0b\xa0",
    "x" * 40 + "!",
    "a " * 20 + "!",
    "a." * 20 + "!",
    "1" * 40 + "!",
]

PUMPS = ["a", "1", "a ", "a.", " ", "ab", "1,", "x\xa0", "a/", '\\"']


def _expectation(regex: str) -> control_pb2.Expectation:
    matcher = control_pb2.ArgumentMatcher(path="$.q", regex=regex)
    requirement = control_pb2.ToolCallRequirement(name="search", arguments=[matcher])
    return control_pb2.Expectation(
        expectation_id="e1",
        scope=common_pb2.Scope(traces=common_pb2.TraceScope(trace_ids=["ab" * 16])),
        conditions=[control_pb2.Condition(tools_called=control_pb2.ToolsCalled(tools=[requirement]))],
    )


def _decode(regex: str) -> ArgumentMatcher:
    decoded = expectation_from_proto(_expectation(regex), default_tenant="t", default_deadline_s=10, now_ms=1)
    condition = decoded.expectation.conditions[0]
    assert isinstance(condition, ToolsCalled)
    return condition.tools[0].arguments[0]


def _growth(pattern: str, prefix: str, pump: str, suffix: str, n: int) -> float:
    """How many times the steps grow when the pumped part doubles from ``n`` to ``2n``."""
    counter = StepCounter(pattern)
    return counter.steps(prefix + pump * 2 * n + suffix) / counter.steps(prefix + pump * n + suffix)


WORDS = {
    "nested": "sits in another repetition",
    "alternatives": "alternatives in a repetition can match the same text",
    "adjacent": "three or more adjacent unbounded repetitions",
}


@pytest.mark.parametrize("row", REFUSED, ids=[r.pattern for r in REFUSED])
def test_a_regex_that_backtracks_catastrophically_is_refused(row: Refused) -> None:
    with pytest.raises(ControlDecodeError) as info:
        _decode(row.pattern)
    assert info.value.reason == "invalid_matcher"
    assert repr(row.pattern) in info.value.detail  # it names the pattern
    assert WORDS[row.cause] in info.value.detail  # and why
    assert "possessive" in info.value.detail and "(?>" in info.value.detail  # and how to rewrite it


@pytest.mark.parametrize("row", REFUSED, ids=[r.pattern for r in REFUSED])
def test_what_is_refused_really_blows_up(row: Refused) -> None:
    """Doubling the pumped part of the attack multiplies the engine's steps (at one start) at
    least 12-fold for the exponential causes (2**n ways: 64-fold; (\\w|\\d\\d)+: Fibonacci, 18)
    and more than 5.5-fold for three adjacent repetitions (n**3: towards 8); what is accepted
    stays under 4.6 (n**2 at most, below)."""
    if row.cause == "adjacent":
        assert _growth(row.pattern, row.prefix, row.pump, row.suffix, 16) > 5.5
    else:
        assert _growth(row.pattern, row.prefix, row.pump, row.suffix, 6) >= 12
    # ... and all those ways are tried: no match starts where the attack does
    assert re.match(row.pattern, row.prefix + row.pump * 4 + row.suffix) is None


@pytest.mark.parametrize("regex", ACCEPTED)
def test_usual_regexes_are_taken_and_backtrack_at_most_quadratically(regex: str) -> None:
    _decode(regex)
    counter = StepCounter(regex)
    for pump in PUMPS:
        for suffix in ("!", ""):
            few, more = (counter.steps(pump * n + suffix) for n in (16, 32))
            assert more <= 4.6 * few, (pump, suffix, few, more)


def _verdict(matcher: ArgumentMatcher, text: str) -> bool:
    execution = ToolExecution(name="search", arguments=json.dumps({"q": text}), arguments_state=CaptureState.CAPTURED)
    return match_arguments(matcher, execution) is Verdict.TRUE


def _plain(regex: str, text: str) -> bool:
    """``re.search`` with the matcher's one documented rewrite: a final ``$`` is the very end."""
    return re.search(regex[:-1] + r"\Z" if regex.endswith("$") else regex, text) is not None


@pytest.mark.parametrize("regex", ACCEPTED)
def test_an_accepted_regex_matches_what_it_matched(regex: str) -> None:
    matcher = _decode(regex)
    assert matcher.regex == regex  # decoded as sent: the check refuses or takes, it never rewrites
    for text in SAMPLES + [p * 8 + s for p in PUMPS for s in ("", "!")]:
        assert _verdict(matcher, text) == _plain(regex, text), text


@settings(max_examples=300, deadline=None, derandomize=True)
@given(regex=st.sampled_from(ACCEPTED), text=st.text(alphabet='a1 ./,"\\!x\xa0bcmo-', max_size=24))
def test_an_accepted_regex_matches_what_it_matched_on_any_text(regex: str, text: str) -> None:
    assert _verdict(_decode(regex), text) == _plain(regex, text)


def test_the_matcher_still_reads_a_final_dollar_as_the_end() -> None:
    """The rewrite ``_plain`` mirrors is the verdict module's (its cache holds compiled patterns)."""
    assert verdict_conditions._regex("^ls$").pattern == r"^ls\Z"
