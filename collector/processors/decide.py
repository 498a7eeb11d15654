"""The decision step: evidence from Redis → the pure scoring core → a score event, or nothing yet.

This is where a verdict is decided for the service. It builds an Observation
from trace states and runs the configured scorer tree in replay + streaming
mode, so the tree never touches a trace client and wrappers stay monotone.
A TRUE/FALSE verdict is decided the moment it is decidable; UNDETERMINED only
when the evidence is final (deadline passed, evidence unavailable).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache

from collector.config import CompletionConfig, ScorerTreeConfig, ServiceConfig
from collector.processors.normalize import unpack_execution
from collector.processors.trace_state import TraceState
from collector.telemetry.metrics import Trigger
from collector.wire.convert import (
    RegisteredExpectation,
    Scope,
    encode,
    observation_to_proto,
    scope_to_proto,
    score_id_for,
    set_duration,
    set_timestamp,
)
from collector.wire.gen import common_pb2, score_pb2
from scoring.models import (
    Acquisition,
    CompletionSource,
    Coverage,
    MessageScorable,
    Observation,
    SessionScorable,
    ToolExecution,
    TraceScorable,
    Verdict,
)
from scoring.models.evidence import (
    AWAITING_COMPLETION,
    LATE_SPAN,
    LIMIT_EXCEEDED,
    NO_TRACE_LINKED,
    NORMALIZATION_VERSION,
    ORPHAN_PARENT,
    STATE_LOST,
    CaptureState,
    execution_order,
)
from scoring.score import (
    Scorer,
    ScoringContext,
    TrueFalseScorer,
)
from scoring.score.tree import ScorerTreeConfigError, build_scorer_tree

_STATUS = {
    Verdict.TRUE: common_pb2.SCORE_STATUS_TRUE,
    Verdict.FALSE: common_pb2.SCORE_STATUS_FALSE,
    Verdict.UNDETERMINED: common_pb2.SCORE_STATUS_UNDETERMINED,
}


_ZERO = timedelta(0)
#: Coverage is immutable and takes few distinct values: validated once, shared by observations.
_COMPLETED = {s: Coverage.completed(s) for s in CompletionSource}


@lru_cache(maxsize=256)
def _incomplete(reasons: frozenset[str]) -> Coverage:
    return Coverage.incomplete(*reasons)


def _cut_arguments(e: ToolExecution, max_chars: int) -> ToolExecution:
    if e.arguments is None or len(e.arguments) <= max_chars:
        return e
    return ToolExecution.trusted(
        e.name,
        e.trace_id,
        e.span_id,
        e.call_id,
        e.status,
        e.start_time_unix_nano,
        e.end_time_unix_nano,
        e.arguments[:max_chars],
        CaptureState.TRUNCATED,
        e.convention,
        e.delivered_canary,
        e.recorder,
    )


def build_tree(cfg: ScorerTreeConfig, path: str = "scorers") -> Scorer:
    """Build a configured scorer tree (the scoring library's builder); errors name the config path."""
    tree = build_scorer_tree(cfg.model_dump(mode="json", exclude_none=True, exclude_defaults=True), path=path)
    if not isinstance(tree, TrueFalseScorer):
        # A score event is TRUE / FALSE / UNDETERMINED: a float value (0.0 included) has no place in it.
        raise ScorerTreeConfigError(
            f"{path}: a service tree's root must be true/false, not {cfg.type!r} (float scale): "
            "wrap it in a threshold"
        )
    return tree


def trace_coverage(
    st: TraceState | None, watermark_ms: int, cfg: CompletionConfig
) -> tuple[set[str], CompletionSource | None]:
    """Coverage reasons of one trace from its state, or (set(), source) when complete."""
    if st is None:
        return {AWAITING_COMPLETION}, None
    reasons = set(st.reasons)
    if st.orphans:
        reasons.add(ORPHAN_PARENT)
    if st.late:
        reasons.add(LATE_SPAN)
    source: CompletionSource | None = None
    if st.marker_count >= 0:
        if st.span_count == st.marker_count:
            source = CompletionSource.MARKER
        elif st.span_count > st.marker_count:
            reasons.add(LATE_SPAN)
    elif st.marker_at_ms >= 0:
        # Without a count, a marker proves nothing for a trace of which no span was seen.
        if st.span_count > 0 and watermark_ms >= st.marker_at_ms + cfg.allowed_lateness_ms:
            source = CompletionSource.WATERMARK
    elif (
        cfg.mode == "inferred"
        and st.root_end_ms > 0
        and not st.orphans
        and watermark_ms >= st.root_end_ms + cfg.allowed_lateness_ms
    ):
        source = CompletionSource.WATERMARK
    if source is None:
        reasons.add(AWAITING_COMPLETION)
    return (reasons, None) if reasons else (set(), source)


def completion_due(st: TraceState | None, cfg: CompletionConfig) -> int | None:
    """The event time the watermark must reach to complete this trace (``trace_coverage``'s
    watermark rules), or None when the watermark does not complete it (a marker with a count,
    no root end yet in inferred mode, no marker in marker mode)."""
    if st is None or st.marker_count >= 0:
        return None
    if st.marker_at_ms >= 0:
        return st.marker_at_ms + cfg.allowed_lateness_ms if st.span_count > 0 else None
    if cfg.mode == "inferred" and st.root_end_ms > 0 and not st.orphans:
        return st.root_end_ms + cfg.allowed_lateness_ms
    return None


#: bytes an execution takes besides its arguments, in the larger (JSON) encoding: name, ids,
#: times, enums, field names.
EXECUTION_OVERHEAD = 400
#: bytes of an observation besides its executions and scope texts (coverage, times, ids).
OBSERVATION_OVERHEAD = 4096
#: UTF-8 and JSON escaping make a character at most this many bytes.
BYTES_PER_CHAR = 6


def _scope_chars(scope: object) -> int:
    # A model's fields are in its __dict__: read there, a missing one is not a (costly) failed
    # attribute lookup through pydantic's __getattr__.
    fields = getattr(scope, "__dict__", None)
    get = fields.get if isinstance(fields, dict) else functools.partial(getattr, scope)
    text = get("response_text", None) or ""
    ids = get("trace_ids", None) or ()
    return len(text) + 40 * len(ids) + len(get("session_id", "") or "")


def scope_bytes_bound(scope: object) -> int:
    """At most this many bytes of an observation record are its scope's."""
    return BYTES_PER_CHAR * _scope_chars(scope)


def scope_record_bytes(scope: Scope, fmt: str) -> int:
    """The bytes an observation record holding only ``scope`` takes in format ``fmt``: what the scope
    costs each observation of it, measured (the bound above assumes every character escaped)."""
    return len(encode(score_pb2.Observation(scope=scope_to_proto(scope)), fmt))


def executions_of(
    st: TraceState, trace_id: str, cache: dict[tuple[str, str], list[ToolExecution]] | None = None, tenant: str = ""
) -> list[ToolExecution]:
    """The trace's tool executions from its state (``cache``: unpacked once per evaluation)."""
    if cache is None:
        return [unpack_execution(x, trace_id) for x in st.executions]
    key = (tenant, trace_id)
    found = cache.get(key)
    if found is None:
        found = cache[key] = [unpack_execution(x, trace_id) for x in st.executions]
    return found


@dataclass(frozen=True, slots=True)
class Outcome:
    """A decidable result for one expectation (not yet compare-and-set)."""

    expectation: RegisteredExpectation
    verdict: Verdict
    version: int
    score_id: str
    event: score_pb2.ScoreEvent
    observation: score_pb2.Observation
    trigger: Trigger
    #: the verdict rests on the completion claim (complete coverage was needed for it), so a span
    #: that breaks the claim may change it: the expectation keeps watching its traces. A verdict
    #: evidence alone proves (presence) never changes; UNDETERMINED at the deadline is final.
    revisable: bool = False
    #: how many traces the evaluation read (a session's grow: one joining meanwhile is re-judged)
    traces_seen: int = 0


class Decider:
    """Evaluates expectations on trace states with the configured scorer trees."""

    name = "processor/decide"

    def __init__(self, config: ServiceConfig) -> None:
        self.cfg = config
        self.trees: dict[str, Scorer] = {}
        for n, c in config.scorers.items():
            try:
                self.trees[n] = build_tree(c, f"scorers.{n}")
            except ValueError as exc:
                # a tree set by environment variables: name them (the file does not hold it)
                if not (origin := config.set_by(f"scorers.{n}")):
                    raise
                raise ScorerTreeConfigError(f"{exc}{origin}") from None
        self.identities = {n: t.get_identifier().hash for n, t in self.trees.items()}

    def observation_for(
        self,
        exp: RegisteredExpectation,
        traces: Sequence[str],
        states: dict[tuple[str, str], TraceState | None],
        watermark_ms: int,
        *,
        session_complete: bool = False,
        session_late: bool = False,
        lost: bool = False,
        captured_at: datetime | None = None,
        executions: dict[tuple[str, str], list[ToolExecution]] | None = None,
    ) -> Observation:
        """``captured_at``: the evaluation's time (a score's ``decided_at``), so the evidence a score
        cites is never stamped later than its decision; now when not given. ``executions``: the
        evaluation's cache of unpacked executions by (tenant, trace), shared by its expectations."""
        found: list[ToolExecution] = []
        reasons: set[str] = set()
        sources: set[CompletionSource] = set()
        for t in traces:
            st = states.get((exp.tenant, t))
            r, src = trace_coverage(st, watermark_ms, self.cfg.completion)
            reasons |= r
            if src is not None:
                sources.add(src)
            if st is not None:
                found.extend(executions_of(st, t, executions, exp.tenant))
        if not traces:  # a session's traces may still come; other scopes name theirs up front
            reasons.add(AWAITING_COMPLETION if isinstance(exp.scope, SessionScorable) else NO_TRACE_LINKED)
        if session_late:  # a trace came after the session was complete: the claim is broken
            reasons.add(LATE_SPAN)
        if isinstance(exp.scope, SessionScorable) and not session_complete:
            reasons.add(AWAITING_COMPLETION)
        if lost:
            reasons.add(STATE_LOST)
        if reasons:
            coverage = _incomplete(frozenset(reasons))
        else:
            marker = CompletionSource.MARKER in sources
            coverage = _COMPLETED[CompletionSource.MARKER if marker else CompletionSource.WATERMARK]
        acquisition = (
            Acquisition.UNAVAILABLE
            if lost and not found
            else Acquisition.COMPLETE
            if coverage.complete
            else Acquisition.PARTIAL
        )
        scope = exp.scope
        if isinstance(scope, MessageScorable | TraceScorable):
            scope = scope.model_copy()
        found.sort(key=execution_order)
        # Built from validated parts; its content id is computed only if it gets published
        # (most evaluations decide nothing yet), in ``outcome``.
        return Observation.model_construct(
            observation_id="",
            scorable=scope,
            tool_executions=tuple(found),
            coverage=coverage,
            acquisition=acquisition,
            normalization_version=NORMALIZATION_VERSION,
            captured_at=captured_at or datetime.now(UTC),
        )

    def fits(self, observation: Observation) -> bool:
        """True if the observation's record is at most ``limits.max_observation_bytes``.

        A bound from the argument lengths settles it for almost every observation without
        encoding it; only a large one is encoded to measure."""
        budget = self.cfg.limits.max_observation_bytes
        chars = _scope_chars(observation.scorable)
        for e in observation.tool_executions:
            # every text an agent writes counts (a 1,200-character tool name too), not only arguments
            chars += len(e.name) + len(e.call_id or "") + len(e.delivered_canary or "")
            if e.arguments:
                chars += len(e.arguments)
        bound = OBSERVATION_OVERHEAD + BYTES_PER_CHAR * chars + EXECUTION_OVERHEAD * len(observation.tool_executions)
        if bound <= budget:
            return True
        return len(encode(observation_to_proto(observation), self.cfg.kafka.output_format)) <= budget

    def shrink(self, observation: Observation) -> Observation:
        """An observation that fits, made from one that does not: first every execution's
        arguments cut to an equal share of the budget (TRUNCATED, so argument conditions are
        UNDETERMINED on it), then, if the executions alone are too many, none of them
        (coverage ``limit_exceeded``: absence unprovable, presence unknown). The caller judges
        the result again: the verdict is always the one its published evidence gives."""
        budget = self.cfg.limits.max_observation_bytes
        execs = observation.tool_executions
        room = budget - OBSERVATION_OVERHEAD - BYTES_PER_CHAR * _scope_chars(observation.scorable)
        share = (room - EXECUTION_OVERHEAD * len(execs)) // max(1, len(execs)) // BYTES_PER_CHAR
        if share >= 16:
            cut = tuple(_cut_arguments(e, share) for e in execs)
            smaller = observation.model_copy(update={"tool_executions": cut})
            if self.fits(smaller):
                return smaller
        reasons = {*observation.coverage.reasons, LIMIT_EXCEEDED}
        return observation.model_copy(
            update={
                "tool_executions": (),
                "coverage": _incomplete(frozenset(reasons)),
                "acquisition": Acquisition.PARTIAL,
            }
        )

    async def needs_completion(self, exp: RegisteredExpectation, observation: Observation, verdict: Verdict) -> bool:
        """Whether ``verdict`` rests on the observation's complete coverage: judged again as if
        coverage were incomplete, it is not the same (e.g. "never ran", max_count). A verdict
        decided on incomplete coverage rests on evidence alone (monotonicity), or on a fallback
        at the deadline: final, as DESIGN's Finality has it (only a broken completion claim
        revises a score)."""
        if verdict is Verdict.UNDETERMINED or not observation.coverage.complete:
            return False
        partial = observation.model_copy(update={"coverage": _incomplete(frozenset({LATE_SPAN}))})
        # Not final: a fallback tree must not stand in for the evidence here (at the deadline it
        # would answer for the primary, and hide that the primary's verdict needed completion).
        again, _, _ = await self.judge(exp, partial, final=False)
        return again is not verdict

    async def judge(
        self, exp: RegisteredExpectation, observation: Observation, *, final: bool
    ) -> tuple[Verdict, str, dict[str, str]]:
        tree = self.trees.get(exp.scorer)
        if tree is None:
            return Verdict.UNDETERMINED, f"unknown scorer tree {exp.scorer!r}", {"error": "unknown_scorer"}
        ctx = ScoringContext(memory=None, replay=observation, streaming=True, final=final)
        scores = await tree.score_async(observation.scorable, exp.expectation, context=ctx)
        if not scores:
            return Verdict.UNDETERMINED, "scorer did not apply to this scope", {}
        s = scores[0]
        verdict = s.verdict if s.score_type == "true_false" else Verdict.of(None if s.get_value() is None else True)
        meta = {k: _meta_text(v) for k, v in s.metadata.items()}
        return verdict, s.rationale, meta

    def outcome(
        self,
        exp: RegisteredExpectation,
        observation: Observation,
        verdict: Verdict,
        rationale: str,
        meta: dict[str, str],
        *,
        version: int,
        trigger: Trigger,
        now: datetime,
        revisable: bool = False,
        traces_seen: int = 0,
        protos: dict[int, score_pb2.Observation] | None = None,
    ) -> Outcome:
        """``protos``: the evaluation's observation records by the id() of the observation they
        encode, for an observation several outcomes share (hashed and converted once)."""
        sid = score_id_for(exp.tenant, exp.expectation_id, version)
        obs = None if protos is None else protos.get(id(observation))
        if obs is None:
            # The id is computed here, once, for the observations that get published (not by copying
            # the model); the event shares the observation's coverage message.
            oid = observation.observation_id or observation.content_hash()
            obs = observation_to_proto(observation)
            obs.observation_id = oid
            if protos is not None:
                protos[id(observation)] = obs
        oid = obs.observation_id
        ev = score_pb2.ScoreEvent(
            score_id=sid,
            expectation_id=exp.expectation_id,
            version=version,
            tenant=exp.tenant,
            scope=obs.scope,
            scorer=exp.scorer,
            scorer_identity=self.identities.get(exp.scorer, ""),
            status=_STATUS[verdict],
            value="" if verdict is Verdict.UNDETERMINED else verdict.value,
            rationale=rationale,
            coverage=obs.coverage,
            observation_ids=[oid],
            metadata={**meta, **{f"label.{k}": v for k, v in exp.labels}} if exp.labels else meta,
            trigger=trigger,
        )
        set_timestamp(ev.decided_at, now)
        set_duration(ev.time_to_verdict, max(now - datetime.fromtimestamp(exp.created_ms / 1000, UTC), _ZERO))
        return Outcome(exp, verdict, version, sid, ev, obs, trigger, revisable, traces_seen)


def _meta_text(v: object) -> str:
    """A score's metadata value as the event's string: text as is, None as "", anything else as
    its JSON (``true``, not Python's ``True``, for readers in any language)."""
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    try:
        return json.dumps(v, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return str(v)
