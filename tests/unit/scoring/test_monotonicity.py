"""Property tests for the streaming invariant (DESIGN §1): decided verdicts never change as evidence grows.

Evidence is generated as a growth sequence: a random set of tool executions is revealed
progressively (prefixes of a random arrival order, so executions may arrive out of
start-time order), under incomplete coverage with random reasons, optionally ending
with complete coverage or with the evidence becoming unavailable. Random scorer trees
(composite AND/OR/MAJORITY, inverter, threshold over plagiarism, streaming fallback)
over tool and text leaves are scored in replay mode against each step's observation.

Tool leaves come in two flavours:
- *routed*: a plain ``OtelToolCallScorer`` that receives the root expectation's
  conditions through the library's type-based routing;
- *bound*: a test-only wrapper that judges its own conditions with a real
  ``OtelToolCallScorer`` (the library routes one expectation by condition type, so
  per-leaf conditions need this helper).
Every ``OtelToolCallScorer`` gets a source that raises if called: replay is pure.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scoring.models import (
    Acquisition,
    ArgumentMatcher,
    CaptureState,
    Condition,
    Coverage,
    MessageScorable,
    Observation,
    PayloadPropagated,
    Score,
    ScoringExpectation,
    ToolCallRequirement,
    ToolExecution,
    ToolsCalled,
    ToolSequence,
    Verdict,
)
from scoring.models.evidence import (
    ATTRIBUTES_DROPPED,
    AWAITING_COMPLETION,
    CONFLICTING_EVIDENCE,
    LATE_SPAN,
    ORPHAN_PARENT,
    RETENTION_EXPIRED,
    SPAN_NOT_ENDED,
    SPAN_UNSAMPLED,
)
from scoring.models.scorables import Scorable
from scoring.score import (
    FloatScaleThresholdScorer,
    OtelToolCallScorer,
    PlagiarismScorer,
    ScoringContext,
    SubStringScorer,
    TrueFalseCompositeScorer,
    TrueFalseFallbackScorer,
    TrueFalseInverterScorer,
    TrueFalseScoreAggregator,
    TrueFalseScorer,
)
from scoring.score.text_scorers import PlagiarismMetric, plagiarism_score
from scoring.verdict import Evidence, all_of, any_of, judge, judge_all, majority
from scoring.verdict.conditions import _json_type
from scoring.verdict.jsonpath import select

T, F, U = Verdict.TRUE, Verdict.FALSE, Verdict.UNDETERMINED

NAMES = ("a", "b", "c", "d")
TRACE_IDS = ("0af7651916cd43dd8448eb211c80319c", "4bf92f3577b34da6a3ce929d0e0e4736")
CANARY = "CANARY-7f3a"
CAPTURED_AT = datetime(2026, 1, 1, tzinfo=UTC)
INCOMPLETE_REASONS = (
    AWAITING_COMPLETION,
    SPAN_NOT_ENDED,
    SPAN_UNSAMPLED,
    ATTRIBUTES_DROPPED,
    ORPHAN_PARENT,
    CONFLICTING_EVIDENCE,
    LATE_SPAN,
)
RESPONSE_TEXTS = (
    "I called tool a and then the quick brown fox jumps",
    "Nothing to report.",
    "The quick brown fox jumps over the lazy dog",
    "tool b said hello",
)
REFERENCE = "the quick brown fox jumps over the lazy dog"

PROPERTY_SETTINGS = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# --- event loop ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run() -> Iterator[Any]:
    """Run a coroutine to completion on a private loop (hypothesis tests are sync functions)."""
    loop = asyncio.new_event_loop()
    try:
        yield loop.run_until_complete
    finally:
        loop.close()


# --- evidence strategies -----------------------------------------------------------------------------


def _argument_pool() -> tuple[tuple[str | None, CaptureState], ...]:
    """A fixed pool of recorded arguments (generation speed): JSON, non-JSON text, absent, truncated."""
    docs: list[dict[str, Any]] = [
        {"q": "hello", "n": 4, "items": [{"x": 1}, {"x": 2}]},
        {"q": "world", "n": 11, "items": [], "nested": {"deep": 1}},
        {"q": f"please forward {CANARY}", "n": True, "items": [{"x": 3}]},
        {"q": "x", "n": 2.5, "items": [{"x": 0}], "nested": {"deep": "three"}},
        {"q": "hello", "n": "5", "items": [{"x": 1}], "nested": {"deep": 2}},
        {"q": "x", "n": -1, "items": [{"x": 2}, {"x": 3}, {"x": 0}]},
        {"q": "world", "n": 0},
        {},
    ]
    pool: list[tuple[str | None, CaptureState]] = [(json.dumps(d, sort_keys=True), CaptureState.CAPTURED) for d in docs]
    pool += [
        ("not json", CaptureState.CAPTURED),
        (f"raw {CANARY}", CaptureState.CAPTURED),
        (None, CaptureState.ABSENT),
        (None, CaptureState.ABSENT),
        (json.dumps(docs[0], sort_keys=True)[:12], CaptureState.TRUNCATED),
        (json.dumps(docs[2], sort_keys=True)[:30], CaptureState.TRUNCATED),
    ]
    return tuple(pool)


ARGUMENTS = _argument_pool()
COVERAGES = tuple(Coverage.incomplete(r) for r in INCOMPLETE_REASONS) + tuple(
    Coverage.incomplete(r1, r2) for i, r1 in enumerate(INCOMPLETE_REASONS) for r2 in INCOMPLETE_REASONS[i + 1 :]
)


CAPTURED_ARGUMENTS = tuple(a for a in ARGUMENTS if a[1] is CaptureState.CAPTURED)
UNKNOWN_ARGUMENTS = tuple(a for a in ARGUMENTS if a[1] is not CaptureState.CAPTURED)


@st.composite
def _execution(
    draw: st.DrawFn,
    index: int,
    names: Sequence[str] = NAMES,
    pool: Sequence[tuple[str | None, CaptureState]] = ARGUMENTS,
) -> ToolExecution:
    arguments, state = draw(st.sampled_from(pool))
    start = draw(st.integers(1, 40))
    duration = draw(st.sampled_from([None, 0, 1, 3, 12]))  # None: not ended yet
    return ToolExecution(
        name=draw(st.sampled_from(names)),
        trace_id=TRACE_IDS[index % 2],
        span_id=f"{index + 1:016x}",
        # a shared call id makes records of one call, nested (one execution) or not (each counts)
        call_id=draw(st.sampled_from([None, None, "call_1", "call_2"])),
        status=draw(st.sampled_from(["ok", "error"])),
        start_time_unix_nano=start,
        end_time_unix_nano=0 if duration is None else start + duration,
        arguments=arguments,
        arguments_state=state,
        # two instrumentations may record one call: records of other recorders that overlap are paired
        recorder=draw(st.sampled_from([None, None, "a", "b"])),
    )


@dataclass(frozen=True)
class Step:
    """One evidence state of a growth sequence."""

    executions: tuple[ToolExecution, ...]
    coverage: Coverage
    acquisition: Acquisition
    final: bool

    def evidence(self) -> Evidence:
        ordered = tuple(sorted(self.executions, key=lambda e: (e.start_time_unix_nano, e.span_id)))
        return Evidence(ordered, self.coverage, self.acquisition is not Acquisition.UNAVAILABLE)

    def observation(self, scorable: MessageScorable) -> Observation:
        return Observation(
            scorable=scorable,
            tool_executions=self.executions,
            coverage=self.coverage,
            acquisition=self.acquisition,
            captured_at=CAPTURED_AT,
        )


@st.composite
def executions(
    draw: st.DrawFn,
    max_size: int = 7,
    names: Sequence[str] = NAMES,
    pool: Sequence[tuple[str | None, CaptureState]] = ARGUMENTS,
) -> list[ToolExecution]:
    """Executions with unique span ids, in a random arrival order (not start-time order)."""
    return [draw(_execution(i, names, pool)) for i in range(draw(st.integers(0, max_size)))]


@st.composite
def growth(draw: st.DrawFn) -> list[Step]:
    """Prefixes of a random arrival order, incomplete until (optionally) complete or unavailable at the end."""
    arrival = draw(executions())
    n = len(arrival)
    # Reveal by non-decreasing prefix lengths (a step may reveal several executions, or none).
    cuts = sorted(draw(st.lists(st.integers(0, n), min_size=1, max_size=n + 2)))
    if cuts[-1] != n:
        cuts.append(n)
    steps = [
        Step(
            executions=tuple(arrival[:k]),
            coverage=draw(st.sampled_from(COVERAGES)),
            acquisition=Acquisition.PARTIAL,
            final=False,
        )
        for k in cuts
    ]
    ending = draw(st.sampled_from(["complete", "complete", "open", "unavailable"]))
    everything = tuple(arrival)
    if ending == "complete":
        steps.append(Step(everything, Coverage.completed(), Acquisition.COMPLETE, final=True))
    elif ending == "unavailable":
        # Retention expired, but the snapshot still holds what was seen: a superset of every prefix.
        steps.append(Step(everything, Coverage.incomplete(RETENTION_EXPIRED), Acquisition.UNAVAILABLE, final=False))
    return steps


# --- condition strategies ----------------------------------------------------------------------------

_MATCHERS = st.sampled_from(
    [
        ArgumentMatcher(path="$.q", equals="hello"),
        ArgumentMatcher(path="$.nested", equals={"deep": 1}),
        ArgumentMatcher(path="$.items[0]", equals={"x": 1}),
        ArgumentMatcher(path="$.items[*].x", one_of=(2, 3)),
        ArgumentMatcher(path="$..deep", equals="three"),
        ArgumentMatcher(path="$.q", regex="^(hello|world)$"),
        ArgumentMatcher(path="$", regex="CANARY"),
        ArgumentMatcher(path="$.n", minimum=0, maximum=5),
        ArgumentMatcher(path="$.n", minimum=3),
        ArgumentMatcher(path="$.n", one_of=(True, 2.5)),
    ]
)


@st.composite
def _requirement(
    draw: st.DrawFn, bounded: bool = True, names: Sequence[str] = (*NAMES, "e", "A")
) -> ToolCallRequirement:
    min_count = draw(st.integers(1, 3))
    max_count = draw(st.one_of(st.none(), st.integers(min_count, min_count + 2))) if bounded else None
    return ToolCallRequirement(
        name=draw(st.sampled_from(names)),
        arguments=tuple(draw(st.lists(_MATCHERS, max_size=2))),
        status=draw(st.sampled_from(["any", "any", "ok", "error"])),
        min_count=min_count,
        max_count=max_count,
    )


def _tools_called(bounded: bool = True, names: Sequence[str] = (*NAMES, "e", "A")) -> st.SearchStrategy[ToolsCalled]:
    return st.builds(ToolsCalled, tools=st.lists(_requirement(bounded, names), min_size=1, max_size=2).map(tuple))


def _sequence(modes: Sequence[str] = ("subsequence", "exact", "any_order")) -> st.SearchStrategy[ToolSequence]:
    return st.builds(
        ToolSequence,
        tools=st.lists(st.sampled_from(NAMES), min_size=1, max_size=3).map(tuple),
        mode=st.sampled_from(list(modes)),
    )


_PAYLOAD = st.builds(
    PayloadPropagated,
    canaries=st.sampled_from([(CANARY,), ("never-seen", CANARY), ("never-seen",)]),
    target_tools=st.lists(st.sampled_from(NAMES), max_size=2, unique=True).map(tuple),
)

conditions: st.SearchStrategy[Condition] = st.one_of(_tools_called(), _sequence(), _PAYLOAD)
#: conditions whose FALSE can only come from proven absence (no max_count, no exact order)
absence_conditions: st.SearchStrategy[Condition] = st.one_of(
    _tools_called(bounded=False), _sequence(("subsequence", "any_order")), _PAYLOAD
)


# --- scorer trees --------------------------------------------------------------------------------------


class _ExplodingSource:
    """A source replay must never touch."""

    async def acquire(self, scorable: Any, trace_ids: Sequence[str] | None = None) -> Observation:
        raise AssertionError("replay acquired evidence from a trace source")


class BoundToolLeaf(TrueFalseScorer):
    """Test helper: a real OtelToolCallScorer that judges its own conditions instead of routed ones."""

    def __init__(self, *, expectation: ScoringExpectation) -> None:
        super().__init__()
        self._leaf = OtelToolCallScorer(source=_ExplodingSource())
        self._leaf.validate(expectation)
        self._expectation = expectation

    async def _score_async(
        self, scorable: Scorable, expectation: ScoringExpectation, context: ScoringContext
    ) -> list[Score]:
        assert not expectation.conditions, "a bound leaf must not receive routed conditions"
        return await self._leaf._score_async(scorable, self._expectation, context)


class Spec:
    """A scorer tree description that can build the scorer and compute its verdict independently."""

    def build(self) -> TrueFalseScorer:
        raise NotImplementedError

    def routed(self) -> bool:
        """Whether the subtree has a tool leaf fed by routing (it then supports every condition type)."""
        raise NotImplementedError

    def expected(self, ev: Evidence, root: Sequence[Condition], text: str, final: bool) -> Verdict:
        raise NotImplementedError


@dataclass(frozen=True)
class ToolLeaf(Spec):
    own: tuple[Condition, ...] | None  # None: routed

    def build(self) -> TrueFalseScorer:
        if self.own is None:
            return OtelToolCallScorer(source=_ExplodingSource())
        return BoundToolLeaf(expectation=ScoringExpectation(conditions=self.own))

    def routed(self) -> bool:
        return self.own is None

    def expected(self, ev: Evidence, root: Sequence[Condition], text: str, final: bool) -> Verdict:
        return judge_all(root if self.own is None else self.own, ev).verdict


@dataclass(frozen=True)
class SubstringLeaf(Spec):
    substring: str

    def build(self) -> TrueFalseScorer:
        return SubStringScorer(substring=self.substring)

    def routed(self) -> bool:
        return False

    def expected(self, ev: Evidence, root: Sequence[Condition], text: str, final: bool) -> Verdict:
        return Verdict.of(self.substring.casefold() in text.casefold())


@dataclass(frozen=True)
class Threshold(Spec):
    threshold: float

    def build(self) -> TrueFalseScorer:
        return FloatScaleThresholdScorer(scorer=PlagiarismScorer(reference_text=REFERENCE), threshold=self.threshold)

    def routed(self) -> bool:
        return False

    def expected(self, ev: Evidence, root: Sequence[Condition], text: str, final: bool) -> Verdict:
        return Verdict.of(plagiarism_score(REFERENCE, text, PlagiarismMetric.LCS) >= self.threshold)


@dataclass(frozen=True)
class Composite(Spec):
    aggregator: TrueFalseScoreAggregator
    children: tuple[Spec, ...]

    def build(self) -> TrueFalseScorer:
        return TrueFalseCompositeScorer(aggregator=self.aggregator, scorers=[c.build() for c in self.children])

    def routed(self) -> bool:
        return any(c.routed() for c in self.children)

    def expected(self, ev: Evidence, root: Sequence[Condition], text: str, final: bool) -> Verdict:
        vs = [c.expected(ev, root, text, final) for c in self.children]
        combine = {"and": all_of, "or": any_of, "majority": majority}[self.aggregator.value]
        return combine(vs)


@dataclass(frozen=True)
class Inverter(Spec):
    child: Spec

    def build(self) -> TrueFalseScorer:
        return TrueFalseInverterScorer(scorer=self.child.build())

    def routed(self) -> bool:
        return self.child.routed()

    def expected(self, ev: Evidence, root: Sequence[Condition], text: str, final: bool) -> Verdict:
        return self.child.expected(ev, root, text, final).invert()


@dataclass(frozen=True)
class Fallback(Spec):
    primary: Spec
    fallback: Spec

    def build(self) -> TrueFalseScorer:
        return TrueFalseFallbackScorer(scorer=self.primary.build(), fallback_scorer=self.fallback.build())

    def routed(self) -> bool:
        return self.primary.routed()

    def expected(self, ev: Evidence, root: Sequence[Condition], text: str, final: bool) -> Verdict:
        p = self.primary.expected(ev, root, text, final)
        if p.decided or not final:
            return p
        return self.fallback.expected(ev, root, text, final)


@st.composite
def trees(draw: st.DrawFn, depth: int = 3, need_routed: bool | None = None) -> Spec:
    """A random tree. ``need_routed``: True = must contain a routed tool leaf, False = must not, None = either."""
    kinds = ["tool", "tool", "substring"]
    if need_routed is not True:
        kinds.append("threshold")
    if depth > 0:
        kinds += ["and", "or", "majority", "invert", "fallback"] * 2
    kind = draw(st.sampled_from(kinds))
    if kind == "tool":
        routed = need_routed if need_routed is not None else draw(st.booleans())
        if routed:
            return ToolLeaf(None)
        return ToolLeaf(tuple(draw(st.lists(conditions, min_size=1, max_size=2))))
    if kind == "substring":
        if need_routed:
            return ToolLeaf(None)
        return SubstringLeaf(draw(st.sampled_from(["tool", "fox", "zzz", "HELLO"])))
    if kind == "threshold":
        return Threshold(draw(st.sampled_from([0.0, 0.3, 0.5, 1.0])))
    if kind == "invert":
        return Inverter(draw(trees(depth - 1, need_routed)))
    if kind == "fallback":
        primary = draw(trees(depth - 1, need_routed))
        # The library requires both fallback children to support the same condition types.
        return Fallback(primary, draw(trees(depth - 1, primary.routed())))
    width = draw(st.integers(1, 3))
    children = [
        draw(trees(depth - 1, need_routed if i == 0 else (False if need_routed is False else None)))
        for i in range(width)
    ]
    return Composite(TrueFalseScoreAggregator(kind), tuple(children))


@st.composite
def scored_trees(draw: st.DrawFn) -> tuple[Spec, tuple[Condition, ...]]:
    spec = draw(trees())
    root = tuple(draw(st.lists(conditions, min_size=1, max_size=2))) if spec.routed() else ()
    return spec, root


def _scorable(text: str) -> MessageScorable:
    return MessageScorable(message_id="m-1", conversation_id="c-1", trace_ids=TRACE_IDS, response_text=text)


async def _score_steps(
    scorer: TrueFalseScorer, expectation: ScoringExpectation, scorable: MessageScorable, steps: Sequence[Step]
) -> list[Verdict]:
    verdicts = []
    for step in steps:
        observation = step.observation(scorable)
        before = observation.model_dump_json()
        ctx = ScoringContext(streaming=True, final=step.final, replay=observation)
        scores = await scorer.score_async(observation.scorable, expectation, context=ctx)
        assert len(scores) == 1
        assert observation.model_dump_json() == before, "replay changed the observation"
        verdicts.append(scores[0].verdict)
    return verdicts


def _assert_monotone(verdicts: Sequence[Verdict], what: str) -> None:
    first = next((i for i, v in enumerate(verdicts) if v.decided), None)
    if first is not None:
        assert all(v is verdicts[first] for v in verdicts[first:]), f"{what}: {[v.value for v in verdicts]}"


# --- properties ----------------------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(tree=scored_trees(), steps=growth(), text=st.sampled_from(RESPONSE_TEXTS))
def test_tree_verdict_once_decided_never_changes(
    run: Any, tree: tuple[Spec, tuple[Condition, ...]], steps: list[Step], text: str
) -> None:
    spec, root = tree
    scorer = spec.build()
    expectation = ScoringExpectation(conditions=root)
    verdicts = run(_score_steps(scorer, expectation, _scorable(text), steps))
    # The tree computes what strong Kleene composition of the condition judges says it should...
    expected = [spec.expected(step.evidence(), root, text, step.final) for step in steps]
    assert verdicts == expected
    # ...and a decided root verdict is never taken back as evidence grows.
    _assert_monotone(verdicts, f"root of {spec}")


@PROPERTY_SETTINGS
@given(condition=absence_conditions, steps=growth())
def test_single_tool_leaf_never_false_while_incomplete(run: Any, condition: Condition, steps: list[Step]) -> None:
    scorer = OtelToolCallScorer(source=_ExplodingSource())
    expectation = ScoringExpectation(conditions=(condition,))
    verdicts = run(_score_steps(scorer, expectation, _scorable(RESPONSE_TEXTS[0]), steps))
    for step, verdict in zip(steps, verdicts, strict=True):
        if not step.coverage.complete:
            assert verdict is not F, f"absence judged FALSE under {step.coverage.reasons}"
    _assert_monotone(verdicts, "single tool leaf")


@PROPERTY_SETTINGS
@given(conds=st.lists(conditions, min_size=1, max_size=4), steps=growth())
def test_each_condition_judge_is_monotone(conds: list[Condition], steps: list[Step]) -> None:
    evidence = [s.evidence() for s in steps]
    for c in conds:
        verdicts = [judge(c, ev).verdict for ev in evidence]
        _assert_monotone(verdicts, f"judge({c!r})")
    _assert_monotone([judge_all(conds, ev).verdict for ev in evidence], "judge_all")
    for c in filter(_pure_absence, conds):
        for step, ev in zip(steps, evidence, strict=True):
            if not step.coverage.complete:
                assert judge(c, ev).verdict is not F, f"{c!r} FALSE under {step.coverage.reasons}"


def _json(raw: str | None) -> bool:
    """Readable: a field of a text that is not JSON is not known (UNDETERMINED)."""
    try:
        json.loads(raw or "")
    except ValueError:
        return False
    return True


def _pure_absence(c: Condition) -> bool:
    """FALSE for this condition can only come from proven absence (no max_count, no exact order)."""
    if isinstance(c, ToolsCalled):
        return all(r.max_count is None for r in c.tools)
    if isinstance(c, ToolSequence):
        return c.mode != "exact"
    return True


@PROPERTY_SETTINGS
@given(conds=st.lists(conditions, min_size=1, max_size=4), seen=executions())
def test_complete_fully_captured_evidence_decides_every_condition(
    conds: list[Condition], seen: list[ToolExecution]
) -> None:
    # Fully captured also means an unambiguous order: start-time ties are broken (a tie leaves a
    # sequence UNDETERMINED when its orders disagree, which is right, and not this property).
    captured = tuple(
        e.model_copy(
            update={
                "arguments": e.arguments if e.arguments_state is CaptureState.CAPTURED and _json(e.arguments) else "{}",
                "arguments_state": CaptureState.CAPTURED,
                "start_time_unix_nano": (start := e.start_time_unix_nano * 1000 + i),
                "end_time_unix_nano": max(e.end_time_unix_nano * 1000, start + 1),
            }
        )
        for i, e in enumerate(seen)
    )
    # ... and a poisoning payload that was delivered (without one, "did not propagate" is no finding)
    last = max((e.end_time_unix_nano for e in captured), default=0)
    deliveries = tuple(
        ToolExecution(
            name=f"deliverer-{k}",
            start_time_unix_nano=last + 1 + k,
            end_time_unix_nano=last + 2 + k,
            arguments="{}",
            arguments_state=CaptureState.CAPTURED,
            delivered_canary=c.canaries[0],
        )
        for k, c in enumerate(conds)
        if isinstance(c, PayloadPropagated)
    )
    ev = Step(captured + deliveries, Coverage.completed(), Acquisition.COMPLETE, final=True).evidence()
    for c in conds:
        decided = judge(c, ev).verdict.decided
        assert decided or _another_type(c, ev) or _confusable(c, ev), f"{c!r} undecided on complete, captured evidence"


def _confusable(c: Condition, ev: Evidence) -> bool:
    """A call recorded under another spelling of a wanted tool's name (case, spaces, forms)."""
    wanted = [r.name for r in c.tools] if isinstance(c, ToolsCalled) else list(getattr(c, "tools", ()))
    return any(e.name != w and e.name.strip().casefold() == w.strip().casefold() for e in ev.executions for w in wanted)


def _another_type(c: Condition, ev: Evidence) -> bool:
    """Some execution the condition reads holds, where a matcher looks, a value of another JSON type
    than the matcher compares: the tool may have coerced it, so that value proves no mismatch."""
    if not isinstance(c, ToolsCalled):
        return False
    for req in c.tools:
        for e in ev.executions:
            if e.name != req.name:
                continue
            doc = json.loads(e.arguments or "{}")
            for m in req.arguments:
                for v in select(doc, m.path):
                    wanted = [m.equals] if m.kind == "equals" else list(m.one_of or ())
                    if m.kind in ("equals", "one_of"):
                        other = any(v is not None and w is not None and _json_type(v) != _json_type(w) for w in wanted)
                    elif m.kind == "range":
                        other = v is not None and _json_type(v) != "number"
                    else:
                        other = not isinstance(v, str)
                    if other:
                        return True
    return False


@settings(PROPERTY_SETTINGS, max_examples=100)
@given(condition=conditions)
def test_unavailable_evidence_is_never_false(run: Any, condition: Condition) -> None:
    """Expired evidence (nothing retained) is UNDETERMINED for every condition, never FALSE."""
    scorable = _scorable(RESPONSE_TEXTS[1])
    observation = Observation(
        scorable=scorable,
        coverage=Coverage.incomplete(RETENTION_EXPIRED),
        acquisition=Acquisition.UNAVAILABLE,
        captured_at=CAPTURED_AT,
    )
    assert judge(condition, Evidence.of(observation)).verdict is U
    scorer = OtelToolCallScorer(source=_ExplodingSource())
    expectation = ScoringExpectation(conditions=(condition,))
    for final in (False, True):
        ctx = ScoringContext(streaming=True, final=final, replay=observation)
        (score,) = run(scorer.score_async(scorable, expectation, context=ctx))
        assert score.verdict is U


@st.composite
def _refinements(draw: st.DrawFn) -> tuple[list[ToolExecution], list[list[ToolExecution]]]:
    """Executions, and a few versions of them once every unknown (uncaptured arguments, status of an
    unfinished span) has become known, with arbitrary values."""
    pool = draw(st.sampled_from([ARGUMENTS, UNKNOWN_ARGUMENTS]))
    seen = draw(executions(max_size=5, names=("a", "b"), pool=pool))
    versions = []
    for _ in range(3):
        known = []
        for e in seen:
            update: dict[str, Any] = {}
            if e.arguments_state is not CaptureState.CAPTURED:
                update["arguments"], update["arguments_state"] = draw(st.sampled_from(CAPTURED_ARGUMENTS))
            if e.end_time_unix_nano == 0:
                update["end_time_unix_nano"] = e.start_time_unix_nano + 1
            known.append(e.model_copy(update=update))
        versions.append(known)
    return seen, versions


@PROPERTY_SETTINGS
@given(
    conds=st.lists(st.one_of(_tools_called(names=("a", "b")), _sequence(), _PAYLOAD), min_size=1, max_size=3),
    refinements=_refinements(),
    complete=st.booleans(),
)
def test_unknown_values_never_decide(
    conds: list[Condition], refinements: tuple[list[ToolExecution], list[list[ToolExecution]]], complete: bool
) -> None:
    """An uncaptured/truncated argument or an unfinished span's status cannot prove anything:
    whatever the value turns out to be, a verdict decided without it stays the same."""
    coverage = Coverage.completed() if complete else Coverage.incomplete()
    acquisition = Acquisition.COMPLETE if complete else Acquisition.PARTIAL
    seen, versions = refinements
    before = Step(tuple(seen), coverage, acquisition, final=complete).evidence()
    for known in versions:
        if complete:
            # A span still open never makes complete evidence (the normalizer gives its trace
            # span_not_ended), so an open span's end is no unknown of complete evidence.
            ends = [e.end_time_unix_nano for e in seen]
            known = [k.model_copy(update={"end_time_unix_nano": end}) for k, end in zip(known, ends, strict=True)]
        after = Step(tuple(known), coverage, acquisition, final=complete).evidence()
        for c in conds:
            v = judge(c, before).verdict
            if v.decided:
                assert judge(c, after).verdict is v, f"{c!r} decided {v.value} on an unknown value"
