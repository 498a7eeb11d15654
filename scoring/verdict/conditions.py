"""Judging conditions on evidence, three-valued.

The rules every judge here keeps (DESIGN §1):
- presence proves invocation even with partial coverage;
- absence is FALSE only when coverage is complete, otherwise UNDETERMINED;
- a value that was not captured (absent, truncated, redacted) cannot prove a negative;
- a decided verdict never changes as evidence grows (monotonicity).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from scoring.models.conditions import (
    ArgumentMatcher,
    Condition,
    PayloadPropagated,
    ToolCallRequirement,
    ToolsCalled,
    ToolSequence,
)
from scoring.models.evidence import Acquisition, CaptureState, Coverage, Observation, ToolExecution
from scoring.models.status import Verdict
from scoring.verdict.jsonpath import compile_path, select
from scoring.verdict.kleene import all_of

T, F, U = Verdict.TRUE, Verdict.FALSE, Verdict.UNDETERMINED


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the judges read: executions in start-time order, coverage, availability."""

    executions: tuple[ToolExecution, ...]
    coverage: Coverage
    available: bool = True

    @property
    def complete(self) -> bool:
        return self.available and self.coverage.complete

    @classmethod
    def of(cls, observation: Observation) -> Evidence:
        ordered = tuple(sorted(observation.tool_executions, key=lambda e: (e.start_time_unix_nano, e.span_id)))
        return cls(ordered, observation.coverage, observation.acquisition is not Acquisition.UNAVAILABLE)


@dataclass(frozen=True, slots=True)
class Judgment:
    verdict: Verdict
    rationale: str


def _canon(v: Any) -> str:
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def _integral(v: Any) -> Any:
    """JSON has one number type: 5 and 5.0 are the same value (true is still not 1)."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, dict):
        return {k: _integral(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_integral(x) for x in v]
    return v


def _canon_eq(v: Any) -> str:
    """Canonical text for JSON equality (``equals``, ``one_of``)."""
    return _canon(_integral(v))


def _strings(v: Any) -> Iterator[str]:
    """Every string (keys and values) in a parsed JSON document."""
    if isinstance(v, str):
        yield v
    elif isinstance(v, dict):
        for k, x in v.items():
            yield k
            yield from _strings(x)
    elif isinstance(v, list):
        for x in v:
            yield from _strings(x)


def _carries(canary: str, raw: str) -> bool:
    """The canary is in the arguments as recorded, or in their decoded JSON strings (escaped when recorded)."""
    if canary in raw:
        return True
    doc = _parse_arguments(raw)
    return doc is not _UNREADABLE and doc is not _NOT_JSON and any(canary in s for s in _strings(doc))


class _Sentinel:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: captured, but not JSON: only the root path reads it (the whole text is one string value)
_NOT_JSON = _Sentinel("NOT_JSON")
#: JSON with a key repeated in one object (which value the tool used depends on its parser), or
#: nested deeper than Python's parser goes
_UNREADABLE = _Sentinel("UNREADABLE")


class _DuplicateKeyError(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _DuplicateKeyError
    return out


@lru_cache(maxsize=4096)
def _parse_arguments(raw: str) -> Any:
    try:
        return json.loads(raw, object_pairs_hook=_unique_keys)
    except (_DuplicateKeyError, RecursionError):  # RecursionError: nested deeper than we read
        return _UNREADABLE
    except ValueError:
        return _NOT_JSON


@lru_cache(maxsize=256)
def _regex(pattern: str) -> re.Pattern[str]:
    # A final ``$`` means the end of the value: Python's also matches before a trailing newline,
    # so an allow-list ``^ls$`` would accept "ls\n".
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + "\\Z"
    return re.compile(pattern)


def _regex_text(v: Any) -> str:
    """What a regex reads of a non-string value: its JSON text, unicode as written, 5.0 as 5."""
    return json.dumps(_integral(v), ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def match_arguments(matcher: ArgumentMatcher, execution: ToolExecution) -> Verdict:
    """One matcher on one execution. Uncaptured or truncated arguments are UNDETERMINED."""
    if execution.arguments_state is not CaptureState.CAPTURED or execution.arguments is None:
        return U
    doc = _parse_arguments(execution.arguments)
    if doc is _UNREADABLE:
        return U  # {"path": "/tmp", "path": "/"}: what the tool read is not known
    if doc is _NOT_JSON:
        if compile_path(matcher.path):
            return U  # no field of a text that is not JSON can be read: not a negative result
        doc = execution.arguments
    values = select(doc, matcher.path)
    kind = matcher.kind
    if kind == "equals":
        want = _canon_eq(matcher.equals)
        return Verdict.of(any(_canon_eq(v) == want for v in values))
    if kind == "regex" and matcher.regex is not None:
        rx = _regex(matcher.regex)
        return Verdict.of(any(rx.search(v if isinstance(v, str) else _regex_text(v)) for v in values))
    if kind == "one_of" and matcher.one_of is not None:
        allowed = {_canon_eq(x) for x in matcher.one_of}
        return Verdict.of(any(_canon_eq(v) in allowed for v in values))
    lo = matcher.minimum if matcher.minimum is not None else float("-inf")
    hi = matcher.maximum if matcher.maximum is not None else float("inf")
    return Verdict.of(
        any(isinstance(v, int | float) and not isinstance(v, bool) and lo <= v <= hi for v in values)
    )


def _execution_matches(req: ToolCallRequirement, e: ToolExecution) -> Verdict:
    if req.status == "any":
        status = T
    elif e.end_time_unix_nano == 0:
        status = U  # not ended: its status is not known yet
    elif e.status == "unset":
        status = U  # not known (e.g. its attributes were dropped, an error.type among them)
    else:
        status = Verdict.of(e.status == req.status)
    return all_of([status, *(match_arguments(m, e) for m in req.arguments)])


def judge_requirement(req: ToolCallRequirement, ev: Evidence) -> Judgment:
    verdicts = [_execution_matches(req, e) for e in ev.executions if e.name == req.name]
    proven = sum(v is T for v in verdicts)
    possible = sum(v is not F for v in verdicts)
    label = f"{req.name!r}"
    if req.max_count is not None and proven > req.max_count:
        return Judgment(F, f"{label} ran {proven} times, more than max_count {req.max_count}")
    if proven >= req.min_count:
        if req.max_count is None:
            return Judgment(T, f"{label} executed ({proven} matching execution(s))")
        if ev.complete and possible <= req.max_count:
            return Judgment(T, f"{label} ran {proven} times, within [{req.min_count}, {req.max_count}]")
        return Judgment(U, f"{label} ran {proven} times; the upper bound needs complete coverage")
    if ev.complete and possible < req.min_count:
        return Judgment(F, f"{label} not executed as required (coverage complete, {proven} matching)")
    why = _why_open(ev) if possible < req.min_count else "some matching arguments were not captured"
    return Judgment(U, f"{label} not proven: {why}")


def _why_open(ev: Evidence) -> str:
    if not ev.available:
        return "evidence unavailable"
    return "coverage incomplete (" + ", ".join(ev.coverage.reasons) + ")"


def judge_tools_called(c: ToolsCalled, ev: Evidence) -> Judgment:
    parts = [judge_requirement(r, ev) for r in c.tools]
    return Judgment(all_of(p.verdict for p in parts), "; ".join(p.rationale for p in parts))


def _is_subsequence(needle: Sequence[str], haystack: Sequence[str]) -> bool:
    it = iter(haystack)
    return all(any(x == y for y in it) for x in needle)


#: orderings of tied executions tried before an order-dependent verdict gives up (UNDETERMINED)
MAX_TIE_ORDERINGS = 720


def _orderings(executions: Sequence[ToolExecution]) -> list[list[str]] | None:
    """Every order of tool names the start times allow: executions that started at the same time
    may have run in any order among themselves. None when an order cannot be known (a start time
    of 0, i.e. not recorded) or there are too many orderings to try."""
    groups: list[list[str]] = []
    last: int | None = None
    for e in executions:  # sorted by start time
        if e.start_time_unix_nano <= 0:
            return None
        if e.start_time_unix_nano == last:
            groups[-1].append(e.name)
        else:
            groups.append([e.name])
            last = e.start_time_unix_nano
    count = 1
    for g in groups:
        distinct = math.factorial(len(g))  # orders of a group, names that repeat counted once
        for k in Counter(g).values():
            distinct //= math.factorial(k)
        count *= distinct
        if count > MAX_TIE_ORDERINGS:
            return None
    out: list[list[str]] = [[]]
    for g in groups:
        perms = sorted(set(itertools.permutations(g))) if len(g) > 1 else [tuple(g)]
        out = [prefix + list(p) for prefix in out for p in perms]
    return out


def judge_sequence(c: ToolSequence, ev: Evidence) -> Judgment:
    seen = [e.name for e in ev.executions]
    want = list(c.tools)
    if c.mode == "any_order":
        missing = Counter(want) - Counter(seen)
        if not missing:
            return Judgment(T, f"{want} all ran")
        if ev.complete:
            return Judgment(F, f"missing {sorted(missing.elements())}")
        return Judgment(U, f"missing {sorted(missing.elements())} so far: {_why_open(ev)}")
    orders = _orderings(ev.executions)
    if orders is None:
        # The order is unknown: only what the counts alone decide.
        missing = Counter(want) - Counter(seen)
        if c.mode == "exact" and Counter(seen) - Counter(want):
            return Judgment(F, f"executions {seen} cannot become exactly {want}")
        if missing and ev.complete:
            return Judgment(F, f"missing {sorted(missing.elements())}")
        return Judgment(U, f"the order of {seen} is not known (a start time is missing or too many ties)")
    tie = "" if len(orders) == 1 else f" (start-time ties: {len(orders)} possible orders)"
    if c.mode == "subsequence":
        hits = [_is_subsequence(want, o) for o in orders]
        if all(hits):
            return Judgment(T, f"{want} ran in order{tie}")
        if any(hits):
            return Judgment(U, f"{want} ran in order in some of the orders the start times allow{tie}")
        if ev.complete:
            return Judgment(F, f"{want} did not run in order (saw {seen}){tie}")
        return Judgment(U, f"{want} not yet seen in order: {_why_open(ev)}")
    # exact: the final sequence contains today's as a subsequence, so a mismatch here is final.
    possible = [o for o in orders if _is_subsequence(o, want)]
    if not possible:
        return Judgment(F, f"executions {seen} cannot become exactly {want}{tie}")
    if ev.complete:
        equal = [o == want for o in orders]
        if all(equal):
            return Judgment(T, f"executions {seen} vs exactly {want}")
        if not any(equal):
            return Judgment(F, f"executions {seen} vs exactly {want}{tie}")
        return Judgment(U, f"executions {seen} are exactly {want} in some of the orders the start times allow{tie}")
    return Judgment(U, f"executions {seen} so far: {_why_open(ev)}")


def judge_payload(c: PayloadPropagated, ev: Evidence) -> Judgment:
    candidates = [e for e in ev.executions if not c.target_tools or e.name in c.target_tools]
    unknown = 0
    for e in candidates:
        if e.arguments_state is not CaptureState.CAPTURED or e.arguments is None:
            unknown += 1
            continue
        for canary in c.canaries:
            if _carries(canary, e.arguments):
                return Judgment(T, f"canary reached the arguments of {e.name!r} (span {e.span_id})")
    if ev.complete and unknown == 0:
        return Judgment(F, "no canary in any captured tool arguments (coverage complete)")
    why = f"{unknown} execution(s) without captured arguments" if unknown else _why_open(ev)
    return Judgment(U, f"canary not seen: {why}")


_JUDGES: dict[str, Callable[[Any, Evidence], Judgment]] = {
    "tools_called": judge_tools_called,
    "tool_sequence": judge_sequence,
    "payload_propagated": judge_payload,
}


def judge(condition: Condition, ev: Evidence) -> Judgment:
    """Judge one condition on evidence."""
    return _JUDGES[condition.type](condition, ev)


def judge_all(conditions: Sequence[Condition], ev: Evidence) -> Judgment:
    """AND of several conditions (an expectation's conditions must all hold)."""
    parts = [judge(c, ev) for c in conditions]
    return Judgment(all_of(p.verdict for p in parts), "; ".join(p.rationale for p in parts))
