"""The one commit path of the service: what happens to each consumed batch, in order.

``Checkpoint.process(batch)`` runs, for one batch of records from the spans and
control topics:

1. **Apply state.** Decode records (bad ones become dead letters with a reason),
   apply span facts to Redis (EVALSHA calls in round trips kept in flight together,
   idempotent by span id), register expectations, record completion markers and cancellations.
2. **Decide.** Evaluate every expectation the batch touched; compare-and-set each
   decidable result in Redis with its final payload and deterministic score id.
3. **Produce.** Send scores, observations and dead letters (idempotent producer)
   and await every delivery.
4. **Mark published.** Flag the decisions as published in Redis.
5. **Commit offsets** of the batch.

A crash between any two steps replays the batch from the last committed offset:
after 1, re-applying spans is a no-op; after 2, the stored decision wins the
compare-and-set again and its identical payload is sent (same score_id); after 3,
the events are re-sent identically (consumers deduplicate by score_id) — the
sweeper also re-sends decided-but-unpublished scores without waiting for a replay;
after 4, only the offsets are replayed and nothing is re-sent. A produce failure
raises ExportError before step 5, so the batch is retried, never skipped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import ConsumerRecord, TopicPartition

from collector.config import ServiceConfig
from collector.exporters.kafka import TENANT_HEADER, DeadLetter, KafkaExporter
from collector.pipeline.engine import Engine, Published, Work
from collector.processors.completion import WatermarkTracker
from collector.processors.decide import Outcome, scope_bytes_bound, scope_record_bytes
from collector.processors.normalize import rejected_fact
from collector.processors.trace_state import SESSION_WAIT, TraceStateStore
from collector.receivers.decode import TENANT_RE, RecordDecodeError, decode_span_facts, record_tenants, record_traces
from collector.telemetry.metrics import BATCH_SECONDS, DROPPED, RECORDS_IN, SPANS_IN, TRACES_TOUCHED
from collector.wire.convert import (
    ControlDecodeError,
    RegisteredExpectation,
    check_marker,
    decode_control,
    expectation_from_proto,
    now_ms,
)
from scoring.score.base import ScorerConfigurationError

log = logging.getLogger("toolwitness.checkpoint")
_HEX = re.compile(rb"[0-9a-f]{32}")

Batch = Mapping[TopicPartition, Sequence[ConsumerRecord[bytes, bytes]]]

#: outcomes compare-and-set, produced and marked published together (steps 2b-4) ...
DECIDE_SLICE = 256
#: ... by up to this many concurrent lanes, so Redis and Kafka round trips overlap ...
DECIDE_LANES = 8
#: ... each lane carrying at least this many: every lane costs its own round trips, so a
#: small batch (the low-latency case) goes in one lane.
DECIDE_LANE_MIN = 32
#: A control record stamped further ahead of this process's clock than this (a producer with a
#: wrong clock) registers its expectation as created now: its deadline must come.
MAX_CLOCK_AHEAD_MS = 60_000
#: how often (seconds) a future-stamped registration is logged at most
CLOCK_AHEAD_LOG_EVERY_S = 60.0


@dataclass(slots=True)
class BatchResult:
    records: int = 0
    spans: int = 0
    dead_letters: int = 0
    published: int = 0
    offsets: dict[TopicPartition, int] = field(default_factory=dict)


def _headers(rec: ConsumerRecord[bytes, bytes]) -> list[tuple[str, bytes]]:
    return [(k, v) for k, v in (rec.headers or ())]


def _only(tenants: set[str]) -> str | None:
    """The tenant of a dead-lettered span record when it names exactly one ("" = a span whose
    tenant was invalid: none to name); a record of several tenants gets no stamp."""
    return next(iter(tenants)) if len(tenants) == 1 else None


def _run_kind(msg: Any) -> str:
    """What consecutive control records are taken together by (``""``: each alone)."""
    kind: str = msg.WhichOneof("message")
    if kind == "expectation":
        return kind
    if kind == "completion" and msg.completion.WhichOneof("target") == "trace_id":
        return "trace_marker"
    return ""


def _control_tenant(msg: Any, default_tenant: str) -> str | None:
    """The tenant a decoded control message is for (its own, else the default), if it has one."""
    kind = msg.WhichOneof("message")
    if kind is None:
        return None
    return str(getattr(msg, kind).tenant) or default_tenant


class Checkpoint:
    name = "pipeline/checkpoint"

    def __init__(
        self,
        cfg: ServiceConfig,
        store: TraceStateStore,
        engine: Engine,
        exporter: KafkaExporter,
        watermarks: WatermarkTracker,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.engine = engine
        self.exporter = exporter
        self.watermarks = watermarks
        # Per-record metric children, resolved once (``labels()`` is a locked dict lookup).
        self._records_spans = RECORDS_IN.labels(self.name, "spans")
        self._records_control = RECORDS_IN.labels(self.name, "control")
        self._spans_in = SPANS_IN.labels(self.name)
        #: future-stamped control records not yet logged, and when that was last logged
        self._clock_ahead = 0
        self._clock_ahead_logged = float("-inf")

    async def process(self, batch: Batch) -> BatchResult:
        started = time.perf_counter()
        res = BatchResult()
        topics = self.cfg.kafka.topics
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        dead: list[DeadLetter] = []
        controls: list[tuple[ConsumerRecord[bytes, bytes], Any]] = []
        wall = now_ms()
        max_arg = self.cfg.limits.max_argument_bytes
        # Counted once the batch is done (below), not as it is decoded: a batch that fails (Redis or
        # Kafka away) is decoded again from its first offset on every retry.
        control_records = 0
        rejected: dict[str, int] = {}

        # 1. decode + apply state -------------------------------------------------------------------
        for tp, records in batch.items():
            for rec in records:
                res.records += 1
                res.offsets[tp] = rec.offset + 1
                value = rec.value or b""
                if tp.topic == topics.control:
                    control_records += 1
                    try:
                        controls.append((rec, decode_control(value)))
                    except ControlDecodeError as exc:
                        dead.append(self._dead(rec, exc.reason, exc.detail))
                    continue
                try:
                    decoded = decode_span_facts(value, _headers(rec), self.cfg, max_arg)
                except Exception as exc:
                    # Its spans are unreadable but its trace is known from the key: that trace
                    # (of each tenant the record names) can never be complete now, so its absence
                    # is never FALSE. (Not only a RecordDecodeError: whatever a record holds must
                    # not stop the partition.)
                    if isinstance(exc, RecordDecodeError):
                        reason, detail = exc.reason, exc.detail
                    else:
                        reason, detail = "undecodable", f"{type(exc).__name__}: {exc}"[:200]
                    lost_traces = self._lost_traces(rec)
                    tenant = _only({t for t, _ in lost_traces})
                    dead.append(self._dead(rec, reason, detail, tenant=tenant))
                    for lost in lost_traces:
                        placeholder = rejected_fact(f"unreadable-{rec.partition}-{rec.offset}")
                        groups.setdefault(lost, []).append(placeholder)
                    continue
                # The watermark keeps a partition's latest end time: one observation per record.
                latest_end = 0
                for tenant, trace, fact, end in decoded.facts:
                    groups.setdefault((tenant, trace), []).append(fact)
                    if end > latest_end:
                        latest_end = end
                if latest_end:
                    self.watermarks.observe(tp.partition, latest_end // 1_000_000, wall)
                res.spans += len(decoded.facts)
                for i, (tenant, trace, reason, _detail) in enumerate(decoded.rejected):
                    rejected[reason] = rejected.get(reason, 0) + 1
                    if trace:
                        placeholder = rejected_fact(f"rejected-{rec.partition}-{rec.offset}-{i}")
                        groups.setdefault((tenant, trace), []).append(placeholder)
                if decoded.rejected:
                    first = decoded.rejected[0]
                    detail = f"{len(decoded.rejected)} span(s) rejected: {first[3]}"
                    dead.append(self._dead(rec, first[2], detail, tenant=_only({r[0] for r in decoded.rejected})))

        watermark = await self.watermarks.global_watermark()
        work = Work()
        applied = await self.store.apply(groups, watermark)
        TRACES_TOUCHED.labels(self.name).set(len(applied))
        sessions: list[tuple[str, str, str]] = []
        touched: list[tuple[str, str]] = []  # sessions of traces (already linked) that gained spans
        waits: list[tuple[str, str, int]] = []
        lateness = self.cfg.completion.allowed_lateness_ms
        for (tenant, trace), r in applied.items():
            work.add(tenant, r.pending, "span")
            if r.decided:
                work.revisions.update((tenant, d) for d in r.decided)
            if r.state is not None:
                work.states[(tenant, trace)] = r.state
            sessions.extend((tenant, s, trace) for s in r.new_sessions)
            touched.extend((tenant, s) for s in r.touched_sessions if s not in r.new_sessions)
            if r.root_end_ms and self.cfg.completion.mode == "inferred":
                waits.append((tenant, trace, r.root_end_ms + lateness))
        pending, broken = await self.store.index_sessions(sessions, watermark)
        for (tenant, _session), ids in pending.items():
            work.add(tenant, ids, "span")
        # A session's expectations are judged on all its traces: new spans on one may decide them
        # (presence), or decide one a late trace had revised to UNDETERMINED.
        touched_pending, touched_revise = await self.store.touched_sessions(touched)
        for (tenant, _session), ids in touched_pending.items():
            work.add(tenant, ids, "span")
        for (tenant, _session), ids in touched_revise.items():
            work.revisions.update((tenant, d) for d in ids)
        # sessions a trace joined after they were complete, and those of a trace that turned late
        broken += [(tenant, s) for (tenant, _t), r in applied.items() for s in r.late_sessions]
        for (tenant, _session), ids in (await self.store.revise_sessions(broken)).items():
            work.revisions.update((tenant, d) for d in ids)
        # Span batches never carry authority: only control records register or complete.
        i = 0
        while i < len(controls):
            # consecutive expectations, and consecutive trace markers, are taken together (a round
            # trip or two for the run, not per record); anything else alone; all in their order
            kind = _run_kind(controls[i][1])
            j = i + 1
            while kind and j < len(controls) and _run_kind(controls[j][1]) == kind:
                j += 1
            if kind == "expectation":
                await self._register(controls[i:j], work, dead)
            elif kind == "trace_marker":
                await self._complete_traces(controls[i:j], work, waits, dead, watermark)
            else:
                await self._control(*controls[i], work, waits, dead, watermark)
            i = j
        await self.store.await_watermark(waits)

        # 2. decide (compare-and-set) + 3. produce + 4. mark published, one slice of outcomes at a
        # time, each slice in concurrent lanes (distinct expectations: independent; each decision
        # keeps its own order). A decision stays unpublished for one slice only, well within the
        # sweeper's re-send grace, so the sweeper does not re-send the decisions of a long batch.
        res.published += await self._publish(await self.engine.evaluate(work, watermark))
        if self.engine.contradicted:
            # A FALSE decided elsewhere (the sweeper, another instance) that this batch's evidence
            # contradicts: revise it now (the revision path re-checks the stored verdict).
            again = Work(revisions=set(self.engine.contradicted))
            self.engine.contradicted.clear()
            res.published += await self._publish(await self.engine.evaluate(again, watermark))
        for d in dead:
            await self.exporter.send_dead_letter(d)
        res.dead_letters = len(dead)
        await self.exporter.flush()
        # Done: what it held is counted (once; a failed attempt above raised before this).
        self.exporter.count_dead_letters(dead)
        self._records_control.inc(control_records)
        self._records_spans.inc(res.records - control_records)
        self._spans_in.inc(res.spans)
        for reason, n in rejected.items():
            DROPPED.labels(self.name, reason).inc(n)
        BATCH_SECONDS.labels(self.name).observe(time.perf_counter() - started)
        # 5. the caller commits res.offsets
        return res

    async def _publish(self, outcomes: list[Outcome]) -> int:
        """Steps 2b-4 for ``outcomes``, one slice at a time; how many were published."""
        count = 0
        for i in range(0, len(outcomes), DECIDE_SLICE):
            published = await self._decide_and_send(outcomes[i : i + DECIDE_SLICE])
            await self.exporter.flush()
            await self.store.mark_published([(p.tenant, p.expectation_id) for p in published])
            count += len(published)
        return count

    async def _decide_and_send(self, outcomes: list[Outcome]) -> list[Published]:
        n = max(1, min(DECIDE_LANES, len(outcomes) // DECIDE_LANE_MIN))
        lanes = [outcomes[j::n] for j in range(n)]
        results = await asyncio.gather(*(self.engine.decide_and_send(lane) for lane in lanes), return_exceptions=True)
        for r in results:  # every lane has finished: re-raise the first failure as it was
            if isinstance(r, BaseException):
                raise r
        return [p for r in results if not isinstance(r, BaseException) for p in r]


    async def _retried(self, known: RegisteredExpectation, exp: RegisteredExpectation) -> bool:
        """``exp`` is a caller's retry of ``known`` (``expect`` again with the same id after a
        timeout): the same definition, sent later, while the first is pending or decided. It is
        taken once: the first registration's score answers both."""
        same = (known.tenant, known.scope, known.scorer, known.expectation) == (
            exp.tenant,
            exp.scope,
            exp.scorer,
            exp.expectation,
        )
        if not same:
            return False
        if await self.store.undecided(exp.tenant, exp.expectation_id):
            return True
        return await self.store.get_decision(exp.tenant, exp.expectation_id) is not None

    def _created_ms(self, rec: ConsumerRecord[bytes, bytes], expectation_id: str) -> int:
        """When an expectation counts as registered: the record's own time, not ours, so a replay
        (crash, data-loss recovery) gives it the same creation time and deadline again -- unless
        the record is stamped more than ``MAX_CLOCK_AHEAD_MS`` in the future, whose deadline would
        not come for as long as the producer's clock is ahead: then now (a replay may differ)."""
        now, stamp = now_ms(), int(rec.timestamp or 0)
        if stamp <= 0:
            return now
        if stamp <= now + MAX_CLOCK_AHEAD_MS:
            return stamp
        self._clock_ahead += 1
        if time.monotonic() - self._clock_ahead_logged >= CLOCK_AHEAD_LOG_EVERY_S:
            log.warning(
                "expectation %s: its control record (%s[%d]@%d) is stamped %.0f s ahead of this process's "
                "clock; registered as created now (%d such record(s) since the last warning): check the "
                "producer's clock",
                expectation_id[:80], rec.topic, rec.partition, rec.offset, (stamp - now) / 1000,
                self._clock_ahead,
            )
            self._clock_ahead, self._clock_ahead_logged = 0, time.monotonic()
        return now

    def _within_retention(self, exp: RegisteredExpectation) -> RegisteredExpectation:
        """A deadline at most ``redis.state_ttl_seconds`` away: the evidence it is judged on lives
        that long after the expectation is registered (a later deadline would judge expired
        state). Clamped, with a warning, not refused: the caller still gets its UNDETERMINED."""
        latest = exp.created_ms + self.cfg.redis.state_ttl_seconds * 1000
        if exp.deadline_ms <= latest:
            return exp
        log.warning(
            "expectation %s: deadline %.0f s is beyond redis.state_ttl_seconds (%d s), the evidence's "
            "retention; it is decided by then",
            exp.expectation_id,
            (exp.deadline_ms - exp.created_ms) / 1000,
            self.cfg.redis.state_ttl_seconds,
        )
        return dataclasses.replace(exp, deadline_ms=latest)

    async def _register(
        self,
        run: Sequence[tuple[ConsumerRecord[bytes, bytes], Any]],
        work: Work,
        dead: list[DeadLetter],
    ) -> None:
        """Expectation records (consecutive ones of a batch): decoded and checked one by one, then
        stored and indexed together (two round trips for the whole run, not two each), then each
        judged as ``_control`` judged it alone -- the same id twice is known the second time."""
        default_tenant = self.cfg.tenant.default
        valid: list[tuple[ConsumerRecord[bytes, bytes], Any, RegisteredExpectation]] = []
        for rec, msg in run:
            try:
                valid.append((rec, msg, self._expectation(rec, msg)))
            except ControlDecodeError as exc:
                dead.append(self._dead(rec, exc.reason, exc.detail, tenant=_control_tenant(msg, default_tenant)))
        created = await self.store.register_many([exp for _, _, exp in valid])
        for (rec, msg, exp), new in zip(valid, created, strict=True):
            try:
                await self._registered(exp, new, work)
            except ControlDecodeError as exc:
                dead.append(self._dead(rec, exc.reason, exc.detail, tenant=_control_tenant(msg, default_tenant)))

    async def _complete_traces(
        self,
        run: Sequence[tuple[ConsumerRecord[bytes, bytes], Any]],
        work: Work,
        waits: list[tuple[str, str, int]],
        dead: list[DeadLetter],
        watermark: int,
    ) -> None:
        """Trace completion markers (consecutive ones of a batch): recorded in one round trip, then
        what each makes decidable is queued, and the complete traces with nothing left to decide
        are reclaimed together."""
        default_tenant = self.cfg.tenant.default
        markers: list[tuple[str, str, int | None, int]] = []
        for rec, msg in run:
            m = msg.completion
            try:
                check_marker(m)
            except ControlDecodeError as exc:
                dead.append(self._dead(rec, exc.reason, exc.detail, tenant=_control_tenant(msg, default_tenant)))
                continue
            at = int(m.at.ToMilliseconds()) if m.HasField("at") else now_ms()
            count = m.span_count if m.HasField("span_count") else None
            markers.append((m.tenant or default_tenant, m.trace_id, count, at))
        late: list[tuple[str, str]] = []
        reclaim: list[tuple[str, str]] = []
        results = await self.store.mark_complete_many(markers, watermark)
        for (tenant, trace, count, at), result in zip(markers, results, strict=True):
            pend, dec, state, sessions, late_sessions = result
            work.states[(tenant, trace)] = state
            work.add(tenant, pend, "marker")
            work.revisions.update((tenant, d) for d in dec)
            # the sessions it belongs to may be decidable now (their marker came first)
            for session in sessions:
                work.add(tenant, await self.store.session_pending(tenant, session), "marker")
            late.extend((tenant, x) for x in late_sessions)
            if count is None:
                waits.append((tenant, trace, at + self.cfg.completion.allowed_lateness_ms))
            elif not pend and state.span_count == count and not state.late:
                # Complete and nothing left to decide (e.g. decided TRUE before the marker).
                reclaim.append((tenant, trace))
        for (t, _s), ids in (await self.store.revise_sessions(late)).items():
            work.revisions.update((t, d) for d in ids)
        await self.store.reclaim(reclaim)

    def _expectation(self, rec: ConsumerRecord[bytes, bytes], msg: Any) -> RegisteredExpectation:
        """The expectation a control record registers, checked as far as it can be without Redis;
        ``ControlDecodeError`` (to the DLQ) for what can never be scored."""
        default_tenant = self.cfg.tenant.default
        try:
            exp = expectation_from_proto(
                msg.expectation,
                default_tenant=default_tenant,
                default_deadline_s=self.cfg.completion.default_deadline_seconds,
                now_ms=self._created_ms(rec, msg.expectation.expectation_id),
            )
        except (ArithmeticError, ValueError, TypeError) as exc:
            # Pure decoding: whatever it cannot take is this record's fault, never a reason
            # to stop the loop (a replay would fail the same way forever).
            if isinstance(exc, ControlDecodeError):
                raise
            raise ControlDecodeError("invalid_expectation", f"{type(exc).__name__}: {exc}"[:300]) from None
        exp = self._within_retention(exp)
        half = self.cfg.limits.max_observation_bytes // 2
        # Measured only when the bound (every character escaped) does not settle it.
        if scope_bytes_bound(exp.scope) > half and (
            size := scope_record_bytes(exp.scope, self.cfg.kafka.output_format)
        ) > half:
            # Its observations could never be published (the scope is part of each).
            raise ControlDecodeError(
                "expectation_too_large",
                f"the scope's text and trace ids take {size:,} bytes of each observation record; at most "
                f"half of limits.max_observation_bytes ({self.cfg.limits.max_observation_bytes:,}) is allowed",
            )
        tree = self.engine.decider.trees.get(exp.scorer)
        if tree is None:
            raise ControlDecodeError("unknown_scorer", f"scorer tree {exp.scorer!r} is not configured")
        try:
            tree.validate(exp.expectation)  # before it is stored: never a poison pill later
        except ScorerConfigurationError as exc:
            raise ControlDecodeError("unscorable_expectation", str(exc)) from None
        return exp

    async def _registered(self, exp: RegisteredExpectation, created: bool, work: Work) -> None:
        """After ``register``: a new expectation is judged now; a known id is a replay, a retry, or
        a reuse (``ControlDecodeError``)."""
        if created:
            self.engine.remember(exp)
            work.add(exp.tenant, [exp.expectation_id], "expectation")
        elif (known := await self.store.load_expectations(exp.tenant, [exp.expectation_id])).get(
            exp.expectation_id
        ) not in (None, exp) and not await self._retried(known[exp.expectation_id], exp):
            # Not a replay of the record that registered it (that one is identical, its own
            # timestamp included) nor a caller's retry of it: another expectation under a
            # used id -- another definition, or the same one sent again after a cancel. It
            # would never be scored; say so.
            pending = await self.store.undecided(exp.tenant, exp.expectation_id)
            raise ControlDecodeError(
                "expectation_id_reused",
                f"expectation {exp.expectation_id!r} of tenant {exp.tenant!r} is already registered "
                f"({'pending' if pending else 'cancelled or decided'}, created at "
                f"{known[exp.expectation_id].created_ms} ms); register a new one under a new id",
            )
        elif await self.store.undecided(exp.tenant, exp.expectation_id):
            # A replay after a crash between registering and deciding: nothing else may
            # ever re-trigger it (its spans can be committed already), so decide it now.
            work.add(exp.tenant, [exp.expectation_id], "expectation")
        elif known.get(exp.expectation_id) == exp and await self.store.unindexed(exp):
            # A replay after a crash between storing it and indexing it: index it now (else
            # it would never be decided, nor given its deadline).
            await self.store.index_expectation(exp)
            self.engine.remember(exp)
            work.add(exp.tenant, [exp.expectation_id], "expectation")

    async def _control(
        self,
        rec: ConsumerRecord[bytes, bytes],
        msg: Any,
        work: Work,
        waits: list[tuple[str, str, int]],
        dead: list[DeadLetter],
        watermark: int = 0,
    ) -> None:
        kind = msg.WhichOneof("message")
        default_tenant = self.cfg.tenant.default
        try:
            if kind == "expectation":
                await self._register([(rec, msg)], work, dead)
            elif kind == "completion":
                m = msg.completion
                if m.WhichOneof("target") == "trace_id":
                    await self._complete_traces([(rec, msg)], work, waits, dead, watermark)
                else:
                    check_marker(m)
                    tenant = m.tenant or default_tenant
                    at = int(m.at.ToMilliseconds()) if m.HasField("at") else now_ms()
                    work.add(tenant, await self.store.mark_session_complete(tenant, m.session_id, at), "marker")
                    # complete once the watermark passes it: the sweeper re-evaluates the session then
                    waits.append((tenant, SESSION_WAIT + m.session_id, at + self.cfg.completion.allowed_lateness_ms))
            elif kind == "cancel":
                c = msg.cancel
                tenant = c.tenant or default_tenant
                exps = await self.store.load_expectations(tenant, [c.expectation_id])
                if c.expectation_id in exps:
                    await self.store.mark_cancelled(exps[c.expectation_id])
                    await self.store.forget(exps[c.expectation_id])
                    self.engine.forget(tenant, c.expectation_id)
                    work.pending.pop((tenant, c.expectation_id), None)
        except ControlDecodeError as exc:
            dead.append(self._dead(rec, exc.reason, exc.detail, tenant=_control_tenant(msg, default_tenant)))

    def _lost_traces(self, rec: ConsumerRecord[bytes, bytes]) -> list[tuple[str, str]]:
        """(tenant, trace id) of every trace an unreadable record held: the traces its bytes still
        show (keyed or not: the Collector's kafkaexporter does not key by trace by default) and,
        for a record keyed by trace id (producers partitioning by trace), the key's trace for each
        tenant it names (header, else its resources' tenant attribute)."""
        value, headers = rec.value or b"", _headers(rec)
        lost = record_traces(value, headers, self.cfg)
        key = rec.key or b""
        if len(key) == 32 and _HEX.fullmatch(key):
            lost |= {(t, key.decode().lower()) for t in record_tenants(value, headers, self.cfg)}
        return sorted((t, trace) for t, trace in lost if TENANT_RE.fullmatch(t))

    def _dead(
        self, rec: ConsumerRecord[bytes, bytes], reason: str, detail: str, *, tenant: str | None = None
    ) -> DeadLetter:
        """``tenant``: the tenant a decoded control message names, or the one tenant of a span record's
        spans, stamped as the score records' tenant header when the record has none, so a DLQ reader
        routes it without decoding it."""
        log.warning(
            "%s: record %s/%d/%d to DLQ: %s (%s)",
            self.name, rec.topic, rec.partition, rec.offset, reason, detail[:200],
            extra={"throttle_key": reason},  # the service logs one per reason per RECORD_LOG_EVERY_S
        )
        headers = _headers(rec)
        if tenant is not None and TENANT_RE.fullmatch(tenant) and all(k != TENANT_HEADER for k, _ in headers):
            headers.append((TENANT_HEADER, tenant.encode()))
        return DeadLetter(rec.topic, rec.partition, rec.offset, rec.key, rec.value or b"", headers, reason, detail)
