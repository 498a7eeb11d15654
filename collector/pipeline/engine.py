"""The engine: evaluate expectations on trace state, compare-and-set decisions, publish them.

Used by the per-batch checkpoint and by the sweeper; both follow the same order
(state → decide → produce → mark published), the checkpoint then commits offsets.
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from collector.config import ServiceConfig
from collector.exporters.kafka import KafkaExporter
from collector.processors.decide import Decider, Outcome, completion_due
from collector.processors.trace_state import SESSION_WAIT, DecideRequest, TraceState, TraceStateStore
from collector.telemetry.metrics import (
    DECISIONS,
    EVALUATION_FAILURES,
    OVERSIZED,
    RESENT,
    REVISIONS,
    TIME_TO_VERDICT,
    Trigger,
)
from collector.wire.convert import RegisteredExpectation, decode_observation, encode
from collector.wire.gen import score_pb2
from scoring.models import Acquisition, Coverage, Observation, SessionScorable, ToolExecution, Verdict
from scoring.models.evidence import EVALUATION_FAILED

log = logging.getLogger("toolwitness.engine")

Key = tuple[str, str]  # (tenant, expectation id)


@dataclass(slots=True)
class Work:
    """What one batch (or sweep) asks the engine to evaluate."""

    pending: dict[Key, Trigger] = field(default_factory=dict)
    revisions: set[Key] = field(default_factory=set)
    final: set[Key] = field(default_factory=set)
    states: dict[tuple[str, str], TraceState | None] = field(default_factory=dict)

    def add(self, tenant: str, ids: Iterable[str], trigger: Trigger) -> None:
        for i in ids:
            self.pending.setdefault((tenant, i), trigger)


@dataclass(slots=True)
class Published:
    tenant: str
    expectation_id: str
    resent: bool


#: verdicts a late span can revise (decided on a completion claim); UNDETERMINED is final
_DECIDED = frozenset({Verdict.TRUE.value, Verdict.FALSE.value})

def _watches(verdict: str, version: int) -> bool:
    """Whether a stored decision keeps watching its traces when settled without its outcome at
    hand (a lost compare-and-set, a re-send): TRUE/FALSE and revised UNDETERMINED do (a re-judge
    with nothing new changes nothing); an UNDETERMINED from the deadline (version 1) is final."""
    return verdict in _DECIDED or version > 1


#: how long the sweeper leaves a contradicted decision to the batch that found it (see note_contradicted)
REJUDGE_GRACE_MS = 5000
#: how long a decision is left to the process that made it to publish, before another re-sends it
#: (the sweeper, from the unpublished index; a batch that lost the compare-and-set to it)
RESEND_GRACE_MS = 2000


class Engine:
    name = "pipeline/engine"

    def __init__(self, cfg: ServiceConfig, store: TraceStateStore, exporter: KafkaExporter) -> None:
        self.cfg = cfg
        self.store = store
        self.exporter = exporter
        self.decider = Decider(cfg)
        self._exp_cache: OrderedDict[Key, RegisteredExpectation] = OrderedDict()
        self.fmt = cfg.kafka.output_format
        #: expectations created before this time lost their span evidence (Redis data loss).
        self.lost_at_ms = 0
        #: decided FALSE by another path while a later evaluation said otherwise: to revise
        self.contradicted: set[Key] = set()

    def remember(self, exp: RegisteredExpectation) -> None:
        self._exp_cache[(exp.tenant, exp.expectation_id)] = exp
        self._exp_cache.move_to_end((exp.tenant, exp.expectation_id))
        while len(self._exp_cache) > 100_000:
            self._exp_cache.popitem(last=False)

    def forget(self, tenant: str, expectation_id: str) -> None:
        self._exp_cache.pop((tenant, expectation_id), None)

    async def _expectations(self, keys: Iterable[Key]) -> dict[Key, RegisteredExpectation]:
        out: dict[Key, RegisteredExpectation] = {}
        missing: dict[str, list[str]] = {}
        for k in keys:
            if k in self._exp_cache:
                out[k] = self._exp_cache[k]
            else:
                missing.setdefault(k[0], []).append(k[1])
        for tenant, ids in missing.items():
            for i, exp in (await self.store.load_expectations(tenant, ids)).items():
                self.remember(exp)
                out[(tenant, i)] = exp
        return out

    async def _traces_of(self, exp: RegisteredExpectation) -> list[str]:
        if isinstance(exp.scope, SessionScorable):
            return await self.store.session_traces(exp.tenant, exp.scope.session_id)
        return list(exp.trace_ids())

    async def evaluate(self, work: Work, watermark_ms: int) -> list[Outcome]:
        """Step 2a: judge every expectation in ``work``; return those that are decidable now."""
        keys = set(work.pending) | work.revisions | work.final
        exps = await self._expectations(keys)
        traces: dict[Key, list[str]] = {k: await self._traces_of(e) for k, e in exps.items()}
        need = {(k[0], t) for k, ts in traces.items() for t in ts} - set(work.states)
        work.states.update(await self.store.load_states(sorted(need)))
        now = datetime.now(UTC)
        now_ms = int(now.timestamp() * 1000)
        outcomes: list[Outcome] = []
        #: what expectations left undecided wait for: (tenant, trace or session wait) -> event time
        waits: dict[tuple[str, str], int] = {}
        #: the evidence of this evaluation, shared by the expectations on the same scope: each
        #: trace's executions unpacked once, one observation per scope (one content id, one record)
        executions: dict[tuple[str, str], list[ToolExecution]] = {}
        observations: dict[tuple[object, ...], Observation] = {}
        protos: dict[int, score_pb2.Observation] = {}
        lateness = self.cfg.completion.allowed_lateness_ms
        for k, exp in exps.items():
            final = k in work.final or now_ms >= exp.deadline_ms
            # how many traces a session decision read: a session with more by its settle is re-judged
            seen = len(traces[k]) if isinstance(exp.scope, SessionScorable) else 0
            session_complete = session_late = False
            session_at: int | None = None
            if isinstance(exp.scope, SessionScorable):
                # Like a count-less trace marker: complete once the watermark passes the session
                # marker plus the allowed lateness, so the spans of a trace still in flight when
                # the marker was sent are linked to the session before absence is judged.
                session_at, session_late = await self.store.session_state(exp.tenant, exp.scope.session_id)
                session_complete = session_at is not None and watermark_ms >= session_at + lateness
            lost = exp.created_ms < self.lost_at_ms
            shared = (exp.tenant, exp.scope, tuple(traces[k]), session_complete, session_late, lost)
            try:
                obs = observations.get(shared)
                if obs is None:
                    obs = self.decider.observation_for(
                        exp,
                        traces[k],
                        work.states,
                        watermark_ms,
                        session_complete=session_complete,
                        session_late=session_late,
                        lost=lost,
                        captured_at=now,
                        executions=executions,
                    )
                    if not self.decider.fits(obs):  # judged on exactly what will be published
                        obs = self.decider.shrink(obs)
                        OVERSIZED.labels(self.name).inc()
                    observations[shared] = obs
                verdict, rationale, meta = await self.decider.judge(exp, obs, final=final)
            except Exception as exc:
                # One expectation's evidence must not stop the partition (it would raise again on
                # every replay of the batch): it is decided UNDETERMINED, with the error, for good.
                outcomes.append(self._failed(exp, exc, work.pending.get(k, "span"), now, protos))
                continue
            if k in work.revisions:
                prev = await self.store.get_decision(exp.tenant, exp.expectation_id)
                if prev is None:
                    continue
                # this evaluation as a revision outcome of a given version
                revision = functools.partial(
                    self.decider.outcome, exp, obs, verdict, rationale, meta, trigger="revision", now=now, protos=protos
                )
                if verdict.value == prev.verdict:
                    if not prev.published and prev.version > 1:
                        # A revision decided but not sent (the process died, or Redis failed,
                        # before its settle): the lost compare-and-set re-sends the stored bytes.
                        outcomes.append(revision(version=prev.version, traces_seen=seen))
                    continue
                # A completion claim broke: what was decided on it and is not what the evidence says
                # now is revised -- FALSE and TRUE alike ("never ran", max_count, an exact order are
                # TRUE only on complete evidence). An UNDETERMINED from a revision is revised again
                # when evidence decides the expectation (deadline or not: the same spans in one batch
                # would have decided it); one from the deadline (version 1) is final.
                if prev.verdict not in _DECIDED and prev.version == 1:
                    continue
                meta["revises_version"] = str(prev.version)
                outcomes.append(
                    revision(version=prev.version + 1, revisable=verdict is Verdict.UNDETERMINED, traces_seen=seen)
                )
                continue
            if verdict is Verdict.UNDETERMINED and not final:
                # Judged on a watermark read before this evaluation (a batch reads it first): the
                # sweeper, with a newer one, may have consumed the watermark waits of its traces
                # meanwhile -- before this expectation was registered, a marker or a missing parent
                # recorded, so without judging it. Queue again each wait this watermark had not
                # passed, so it is judged when the watermark passes it (a no-op when still queued).
                for t in traces[k]:
                    due = completion_due(work.states.get((exp.tenant, t)), self.cfg.completion)
                    if due is not None and due > watermark_ms:
                        waits[(exp.tenant, t)] = due
                if isinstance(exp.scope, SessionScorable) and session_at is not None and not session_complete:
                    waits[(exp.tenant, SESSION_WAIT + exp.scope.session_id)] = session_at + lateness
                continue
            trigger = work.pending.get(k, "deadline" if final else "span")
            if verdict is Verdict.UNDETERMINED and now_ms >= exp.deadline_ms:
                trigger = "deadline"
            revisable = await self.decider.needs_completion(exp, obs, verdict)
            outcomes.append(
                self.decider.outcome(
                    exp, obs, verdict, rationale, meta, version=1, trigger=trigger, now=now, revisable=revisable,
                    traces_seen=seen, protos=protos,
                )
            )
        if waits:
            await self.store.await_watermark([(t, w, at) for (t, w), at in waits.items()])
        return outcomes

    def _failed(
        self, exp: RegisteredExpectation, exc: Exception, trigger: Trigger, now: datetime,
        protos: dict[int, score_pb2.Observation],
    ) -> Outcome:
        """The final UNDETERMINED of an expectation whose evaluation raised, on no evidence."""
        EVALUATION_FAILURES.labels(self.name).inc()
        kind = type(exc).__name__
        log.error(
            "%s: evaluating expectation %s/%s raised %s: published UNDETERMINED", self.name, exp.tenant,
            exp.expectation_id, kind, exc_info=exc, extra={"component": self.name, "throttle_key": kind},
        )
        obs = Observation(
            scorable=exp.scope, coverage=Coverage.incomplete(EVALUATION_FAILED), acquisition=Acquisition.ERROR,
            captured_at=now,
        )
        rationale = f"evaluation failed ({kind}): the evidence could not be judged"
        return self.decider.outcome(
            exp, obs, Verdict.UNDETERMINED, rationale, {"error": "evaluation_failed", "exception": kind},
            version=1, trigger=trigger, now=now, protos=protos,
        )

    async def decide_and_send(self, outcomes: list[Outcome]) -> list[Published]:
        """Steps 2b + 3: compare-and-set each decision (one pipeline), then produce the winners.

        A lost race (another instance or an earlier run decided first) re-sends the
        stored payload if it is not yet marked published and older than ``RESEND_GRACE_MS``
        (its maker died, or failed before publishing): identical bytes, same score_id. A
        younger one is left to its maker, or to the sweeper should the maker die.
        """
        if not outcomes:
            return []
        now_ms = int(datetime.now(UTC).timestamp() * 1000)
        #: an observation shared by several outcomes (one scope, one evaluation) is encoded once
        observation_bytes: dict[int, bytes] = {}
        for o in outcomes:
            if id(o.observation) not in observation_bytes:
                observation_bytes[id(o.observation)] = encode(o.observation, self.fmt)
        requests = [
            DecideRequest(
                o.expectation.tenant,
                o.expectation.expectation_id,
                o.version,
                o.score_id,
                encode(o.event, self.fmt),
                observation_bytes[id(o.observation)],
                o.verdict.value,
            )
            for o in outcomes
        ]
        # A revision to UNDETERMINED before the deadline is judged as not final: at the deadline a
        # fallback tree may answer (as it would have, had the same spans come after it). Noted
        # before the compare-and-set: a failure after it would lose the note (a replay does not
        # find the late span again); a lost compare-and-set makes it a no-op re-judgement.
        await self.store.rearm_deadlines(
            [
                o.expectation
                for o in outcomes
                if o.version > 1 and o.verdict is Verdict.UNDETERMINED and o.expectation.deadline_ms > now_ms
            ]
        )
        decisions = await self.store.decide_many(requests)
        decided: list[RegisteredExpectation] = []
        finished: list[RegisteredExpectation] = []
        seen = {(o.expectation.tenant, o.expectation.expectation_id): o.traces_seen for o in outcomes}
        for o, d in zip(outcomes, decisions, strict=True):
            if d.cancelled:
                # judged while (or after: recreated from a tombstone, a session's decided set) its
                # cancel was processed: off every index, so nothing judges it again
                finished.append(o.expectation)
                continue
            if not d.won and not d.published and d.version == o.version:
                # Decided here or elsewhere and never settled (the process died after the
                # compare-and-set): settle it now, as it is re-sent (idempotent if it was). What
                # it was judged on is not known here: a session's is re-judged (seen 0).
                (decided if _watches(d.verdict, d.version) else finished).append(o.expectation)
                seen[(o.expectation.tenant, o.expectation.expectation_id)] = 0
            if d.won:
                DECISIONS.labels(self.name, o.verdict.value, o.trigger).inc()
                TIME_TO_VERDICT.labels(self.name, o.verdict.value).observe(
                    o.event.time_to_verdict.ToTimedelta().total_seconds()
                )
                if o.trigger == "revision":
                    REVISIONS.labels(self.name).inc()
                # Only a verdict that rests on the completion claim keeps watching its traces.
                (decided if o.revisable else finished).append(o.expectation)
                # Decided: off the hot cache (a late-span revision reloads it from Redis). Every
                # cached expectation is long-lived heap the cyclic collector keeps re-scanning.
                self.forget(o.expectation.tenant, o.expectation.expectation_id)
        # Noted as unpublished before anything is sent: the sweeper re-sends it if we die now.
        # ... and complete, decided traces get their short life in the same call.
        reclaim = {
            (o.expectation.tenant, t)
            for o, d in zip(outcomes, decisions, strict=True)
            if d.won and o.observation.coverage.complete
            for t in o.expectation.trace_ids()
        }
        # A span that broke the completion claim after this evaluation (applied by a batch while
        # the sweeper decided, or by another instance): re-judged as a revision.
        contradicted = set(await self.store.settle(decided, finished, now_ms, reclaim, seen))
        # Lost to a decision this evaluation contradicts (new evidence arrived between that decision
        # and its settle, so the trace's decided set did not know it yet): revise it. A FALSE, or a
        # TRUE when this evaluation's FALSE rests on presence alone (incomplete coverage: no later
        # evidence undoes it, while that TRUE needed complete coverage).
        for o, d in zip(outcomes, decisions, strict=True):
            if d.won:
                continue
            if o.version > 1:
                # Two revisions of one version judged on different evidence (two instances, or the
                # sweeper and a batch): the one that lost may be the newer. Re-judged on the state
                # as it is now; a no-op when that agrees with what won. Not for a lost UNDETERMINED:
                # a broken claim re-judges through its late span, and a batch's non-final answer
                # must not flip a final one the sweeper gave at the deadline.
                if d.version == o.version and d.verdict != o.verdict.value and o.verdict is not Verdict.UNDETERMINED:
                    contradicted.add((o.expectation.tenant, o.expectation.expectation_id))
            elif (d.verdict == Verdict.FALSE.value and o.verdict is not Verdict.FALSE) or (
                d.verdict == Verdict.TRUE.value and o.verdict is Verdict.FALSE and not o.observation.coverage.complete
            ):
                contradicted.add((o.expectation.tenant, o.expectation.expectation_id))
        await self.note_contradicted(contradicted, now_ms)
        sent: list[Published] = []
        #: observations written by this call: one record per content id is enough (same key, same bytes)
        observations_sent: set[str] = set()
        for o, d in zip(outcomes, decisions, strict=True):
            exp = o.expectation
            if not d.won and (d.published or d.version > o.version):
                continue
            if not d.won and d.decided_ms and now_ms - d.decided_ms < RESEND_GRACE_MS:
                # Decided moments ago elsewhere (another instance, the sweeper) and being published
                # there: a re-send now would only duplicate it. Its unpublished mark stays until it
                # is published, so should that process die first, the sweeper re-sends it.
                continue
            obs_id = o.observation.observation_id if d.won else decode_observation(d.observation).observation_id
            if obs_id not in observations_sent:
                observations_sent.add(obs_id)
                await self.exporter.send_observation(obs_id, d.observation)
            await self.exporter.send_score(exp.tenant, exp.expectation_id, d.event)
            sent.append(Published(exp.tenant, exp.expectation_id, resent=not d.won))
            if not d.won:
                RESENT.labels(self.name).inc()
        return sent

    async def note_contradicted(self, keys: Iterable[Key], now_ms: int) -> None:
        """Decisions later evidence contradicts: re-judged after this batch (``contradicted``), and
        by the sweeper after ``REJUDGE_GRACE_MS`` should this process die first (then a no-op
        if the revision was made)."""
        keys = set(keys)
        if keys:
            await self.store.rejudge_at(keys, now_ms + REJUDGE_GRACE_MS)
            self.contradicted.update(keys)

    async def republish(self, tenant: str, expectation_id: str) -> Published | None:
        """Sweeper: re-send a decided-but-unpublished decision exactly as stored, and settle it
        (idempotent): one whose process died between its compare-and-set and its settle was
        never indexed as decided, so a late span would not revise it."""
        d = await self.store.get_decision(tenant, expectation_id)
        if d is None or d.published:
            return None
        exp = (await self._expectations([(tenant, expectation_id)])).get((tenant, expectation_id))
        if exp is not None:
            watch = _watches(d.verdict, d.version)
            now_ms = int(datetime.now(UTC).timestamp() * 1000)
            late = await self.store.settle([exp] if watch else [], [] if watch else [exp], now_ms)
            await self.note_contradicted(late, now_ms)
        await self.exporter.send_observation(decode_observation(d.observation).observation_id, d.observation)
        await self.exporter.send_score(tenant, expectation_id, d.event)
        RESENT.labels(self.name).inc()
        return Published(tenant, expectation_id, resent=True)
