"""Per-trace evidence in Redis: one JSON state per trace, updated by registered Lua scripts.

Keys are hash-tagged so one trace lives in one Cluster slot: ``tw:{<tenant>:<trace_id>}:s``
is the trace's whole state — seen span ids, compact tool executions, coverage flags, marker,
root end, and the ids of its pending and decided (kept for revisions) expectations; one
key per trace keeps its memory bounded and measured (``MEMORY USAGE``). Expectations live at
``tw:{<tenant>:e:<id>}:def`` / ``…:dec``; sessions at ``tw:{<tenant>:s:<id>}:t``
(trace ids) / ``…:p`` (pending). Global sorted sets: ``tw:deadlines``,
``tw:await_wm`` (traces waiting for the watermark), ``tw:unpub`` (decided but
not yet published). A batch's updates are EVALSHA calls sent in a few round trips
(``collector.processors.resp``), not one command at a time.

How many traces have state in Redis (the ``toolwitness_traces_in_state`` gauge) is kept per
tenant at ``tw:{<tenant>:count}:live``: a hash of expiry bucket -> traces whose state expires in it.
The trace scripts return their state's expiry before and after they ran; the moves between
buckets are sent, one script call per tenant, with the next batch's first apply round trip (or
by the sweeper). The count is the sum of the buckets not ended yet (``count_traces``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, cast

import orjson
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError, ResponseError

from collector.config import ServiceConfig
from collector.processors.resp import Arg, Commands, Pending, RedisClient, execute, raise_first, send
from collector.telemetry.metrics import DROPPED
from collector.wire.convert import RegisteredExpectation

log = logging.getLogger("toolwitness.trace_state")

SEP = "\x1f"
_compact_json = json.JSONEncoder(separators=(",", ":")).encode


def _facts_json(facts: list[dict[str, Any]]) -> str | bytes:
    """Span facts as apply_spans.lua reads them: one array per fact, positionally (i, p, r, e,
    f, x, s) — a fifth smaller and half the encoding time of the objects.

    Written by orjson (UTF-8 kept where ``json`` writes ``\\u`` escapes: the script decodes both
    to the same strings). What orjson refuses (a lone surrogate from JSON input, an int beyond 64
    bits) takes the ``json`` encoder, as before."""
    rows = [[f["i"], f["p"], f["r"], f["e"], f["f"], f["x"], f["s"]] for f in facts]
    try:
        return orjson.dumps(rows)
    except TypeError:
        return _compact_json(rows)


def _loads(raw: str | bytes) -> Any:
    """``json.loads`` of what the scripts (or this module) wrote, by orjson: the same values, a
    few times faster. What orjson refuses (invalid UTF-8, NaN) takes ``json.loads``, which
    behaves as it always did."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


#: traces per apply round trip; a batch keeps all of its round trips in flight at once.
APPLY_CHUNK = 64
#: a tenant stays in the index of counted tenants (``Keys.live_tenants``) this long after the
#: last bucket it counted a trace in has ended (a margin for clocks: its count is 0 by then).
LIVE_TENANT_GRACE_S = 600


def count_bucket_ms(ttl_ms: int) -> int:
    """Width of the expiry buckets of the count of traces in state: 1/100 of the state's life,
    whole seconds from 1 to 60 (1,440 buckets a day at most per tenant). A state is counted
    until the end of the bucket its expiry falls in: at most this long after it expired."""
    return max(1, min(60, ttl_ms // 100_000)) * 1000


def bucket_end_s(expiry_ms: int, width_ms: int) -> int:
    """The end (Unix seconds) of the bucket an expiry falls in: the first multiple of the width
    at or after it."""
    return -(-expiry_ms // width_ms) * width_ms // 1000


def _lua(name: str) -> str:
    return resources.files("collector.processors").joinpath("lua", name).read_text()


# Claim the members of KEYS[1] due by ARGV[1] (at most ARGV[2] of them): in the same atomic step
# each one's score moves to the lease end ARGV[3] (> ARGV[1]), so exactly one caller claims it, and
# a claimer that dies before releasing it leaves it to be claimed again when the lease ends.
_CLAIM_LUA = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, m in ipairs(due) do redis.call('ZADD', KEYS[1], ARGV[3], m) end
return due
"""

# End claims: the members ARGV[3..] of KEYS[1] that still hold the lease ARGV[1] are removed
# (handled; ARGV[2] == '') or put back at score ARGV[2] (their handling failed). One re-added
# since -- a new decision waiting to be published, a wait a batch queued again -- keeps its score.
_RELEASE_LUA = """
local lease = tonumber(ARGV[1])
for i = 3, #ARGV do
  if tonumber(redis.call('ZSCORE', KEYS[1], ARGV[i])) == lease then
    if ARGV[2] == '' then redis.call('ZREM', KEYS[1], ARGV[i]) else redis.call('ZADD', KEYS[1], ARGV[2], ARGV[i]) end
  end
end
return 0
"""


class Keys:
    """Redis key names under one prefix (default ``tw``), hash-tagged per tenant and trace."""

    def __init__(self, prefix: str = "tw") -> None:
        self.p = prefix
        self.deadlines = f"{prefix}:deadlines"
        #: decided expectations whose revision to UNDETERMINED came before their deadline: judged
        #: again at the deadline (a fallback tree answers only then)
        self.revision_deadlines = f"{prefix}:rev_deadlines"
        #: decisions later evidence contradicts, to re-judge: kept here too (not only in memory) so a
        #: crash before the re-judgement does not lose it (the applied spans would not say so again)
        self.rejudge = f"{prefix}:rejudge"
        self.await_watermark = f"{prefix}:await_wm"
        self.unpublished = f"{prefix}:unpub"
        self.epoch = f"{prefix}:epoch"
        self.lost_at = f"{prefix}:lost_at"
        #: tenants whose count of traces in state (``live``) may be above 0, scored by the end
        #: (Unix seconds) of the last bucket they counted a trace in
        self.live_tenants = f"{prefix}:live_tenants"

    def live(self, tenant: str) -> str:
        """The tenant's count of traces in state: expiry bucket end (Unix s) -> traces."""
        return f"{self.p}:{{{tenant}:count}}:live"

    def state(self, tenant: str, trace_id: str) -> str:
        return f"{self.p}:{{{tenant}:{trace_id}}}:s"

    def tombstone(self, tenant: str, trace_id: str) -> str:
        return f"{self.p}:{{{tenant}:{trace_id}}}:t"

    def session_traces(self, tenant: str, session_id: str) -> str:
        return f"{self.p}:{{{tenant}:s:{session_id}}}:t"

    def session_pending(self, tenant: str, session_id: str) -> str:
        return f"{self.p}:{{{tenant}:s:{session_id}}}:p"

    def session_complete(self, tenant: str, session_id: str) -> str:
        return f"{self.p}:{{{tenant}:s:{session_id}}}:c"

    def session_decided(self, tenant: str, session_id: str) -> str:
        return f"{self.p}:{{{tenant}:s:{session_id}}}:d"

    def session_late(self, tenant: str, session_id: str) -> str:
        return f"{self.p}:{{{tenant}:s:{session_id}}}:l"

    def expectation(self, tenant: str, expectation_id: str) -> str:
        return f"{self.p}:{{{tenant}:e:{expectation_id}}}:def"

    def decision(self, tenant: str, expectation_id: str) -> str:
        return f"{self.p}:{{{tenant}:e:{expectation_id}}}:dec"

    def cancelled(self, tenant: str, expectation_id: str) -> str:
        return f"{self.p}:{{{tenant}:e:{expectation_id}}}:x"

    def indexed(self, tenant: str, expectation_id: str) -> str:
        return f"{self.p}:{{{tenant}:e:{expectation_id}}}:i"

    def watermarks(self, topic: str) -> str:
        return f"{self.p}:wm:{topic}"


#: prefix of a session (not a trace) in the await-watermark set: trace ids are 32 hex digits.
SESSION_WAIT = "s:"


def member(tenant: str, ident: str) -> str:
    return f"{tenant}{SEP}{ident}"


def split_member(m: str | bytes) -> tuple[str, str]:
    s = m.decode() if isinstance(m, bytes) else m
    tenant, _, ident = s.partition(SEP)
    return tenant, ident


@dataclass(slots=True)
class TraceState:
    """The decoded Redis state of one trace."""

    span_count: int = 0
    executions: list[list[Any]] = field(default_factory=list)
    reasons: set[str] = field(default_factory=set)
    orphans: int = 0
    root_end_ms: int = 0
    max_end_ms: int = 0
    marker_count: int = -1
    marker_at_ms: int = -1
    late: bool = False
    sessions: set[str] = field(default_factory=set)

    @classmethod
    def from_json(cls, raw: str | bytes) -> TraceState:
        d = _loads(raw)
        x = d.get("x") or []
        return cls(
            span_count=int(d.get("n", 0)),
            executions=list(x) if isinstance(x, list) else [],
            reasons=set(d.get("r") or {}),
            orphans=len(d.get("p") or {}),
            root_end_ms=int(d.get("re", 0)),
            max_end_ms=int(d.get("me", 0)),
            marker_count=int(d.get("mc", -1)),
            marker_at_ms=int(d.get("ma", -1)),
            late=bool(d.get("l", 0)),
            sessions=set(d.get("ss") or {}),
        )


@dataclass(slots=True)
class ApplyResult:
    new_spans: int
    span_count: int
    late: bool
    root_end_ms: int
    pending: list[str]
    decided: list[str]
    new_sessions: list[str]
    state: TraceState | None
    #: the trace's sessions when it turned late: their decided expectations are revised too
    late_sessions: list[str] = field(default_factory=list)
    #: the trace's sessions when it gained spans: their pending expectations are judged again
    touched_sessions: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class DecideRequest:
    tenant: str
    expectation_id: str
    version: int
    score_id: str
    event: bytes
    observation: bytes
    verdict: str


@dataclass(slots=True)
class Decision:
    """What decide.lua holds for an expectation."""

    won: bool
    version: int
    score_id: str
    event: bytes
    observation: bytes
    published: bool
    verdict: str
    #: refused: the expectation was cancelled (nothing stored, nothing to send, nothing to watch)
    cancelled: bool = False
    #: when the stored decision was made (ms; 0 = not known: stored by an older version). Read for
    #: a lost compare-and-set whose winner has not marked it published yet.
    decided_ms: int = 0


def _b(v: Any) -> bytes:
    if v is None:
        return b""
    return v if isinstance(v, bytes) else str(v).encode()


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class RedisVersionError(RedisError):
    """The Redis server is older than the version the state scripts need."""


def _definition_ttl_ms(ttl_ms: int, exp: RegisteredExpectation) -> int:
    """How long an expectation's definition (and its indexed / cancelled marks) live: past its
    deadline by an hour, and never less than the state's ttl."""
    return max(ttl_ms, exp.deadline_ms - exp.created_ms + 3_600_000)


class TraceStateStore:
    """The trace-state processor's Redis side. Scripts are registered once at start-up."""

    name = "processor/trace_state"
    #: how long (ms; event-time ms for the watermark queue) a sweeper's claim on an item holds
    #: before the item is due again because its claimer died without releasing it.
    claim_lease_ms = 30_000

    def __init__(self, redis: RedisClient, config: ServiceConfig) -> None:
        self.redis = redis
        self.cfg = config
        self.ttl_ms = config.redis.state_ttl_seconds * 1000
        self.k = Keys(config.redis.key_prefix)
        self._apply: AsyncScript | None = None
        self._mark: AsyncScript | None = None
        self._decide: AsyncScript | None = None
        self._index: AsyncScript | None = None
        self._session_done: AsyncScript | None = None
        self._claim: AsyncScript | None = None
        self._release: AsyncScript | None = None
        self._count_move: AsyncScript | None = None
        self._count_read: AsyncScript | None = None
        #: width of the expiry buckets of the count of traces in state (``count_bucket_ms``)
        self.bucket_ms = count_bucket_ms(self.ttl_ms)
        #: moves of the count of traces in state not sent yet: tenant -> bucket end (s) -> delta
        self._moves: dict[str, dict[int, int]] = {}
        #: the score this process last gave each tenant in ``Keys.live_tenants``
        self._listed: dict[str, int] = {}

    async def start(self) -> None:
        await self._require_redis_7()
        # The state scripts share state.lua (Redis scripts cannot import): prepended here, once.
        prelude = _lua("state.lua")
        self._apply = self.redis.register_script(prelude + _lua("apply_spans.lua"))
        self._mark = self.redis.register_script(prelude + _lua("mark_complete.lua"))
        self._decide = self.redis.register_script(_lua("decide.lua"))
        self._index = self.redis.register_script(prelude + _lua("index.lua"))
        self._session_done = self.redis.register_script(_lua("session_done.lua"))
        self._claim = self.redis.register_script(_CLAIM_LUA)
        self._release = self.redis.register_script(_RELEASE_LUA)
        self._count_move = self.redis.register_script(_lua("count_move.lua"))
        self._count_read = self.redis.register_script(_lua("count_read.lua"))
        # Load them now so a broken script fails start-up, not the first batch.
        for script in (
            self._apply, self._mark, self._decide, self._index, self._session_done, self._claim, self._release,
            self._count_move, self._count_read,
        ):
            script.sha = await self.redis.script_load(script.script)

    async def _require_redis_7(self) -> None:
        """Refuse a Redis older than 7.0 at start, saying so: the state scripts use PEXPIRETIME
        and ``PEXPIRE … GT``, which an older server would refuse in the first batch instead."""
        try:
            await self.redis.execute_command("PEXPIRETIME", self.k.live_tenants)
        except ResponseError as exc:
            if "unknown command" in str(exc).lower():
                raise RedisVersionError(
                    f"toolwitness needs Redis 7.0 or later (PEXPIRETIME, PEXPIRE with GT); the server said: {exc}"
                ) from None
            raise

    async def shutdown(self) -> None:
        return None

    async def _execute(self, cmds: Commands) -> list[Any]:
        """The hot path's round trips (apply, decide, settle, publish): see ``resp``."""
        return await execute(self.redis, cmds, self.cfg.redis.socket_timeout_seconds)

    async def apply(
        self, groups: dict[tuple[str, str], list[dict[str, Any]]], watermark_ms: int
    ) -> dict[tuple[str, str], ApplyResult]:
        """Step 1 of the commit protocol: apply span facts, one EVALSHA per trace, in round trips of
        ``APPLY_CHUNK`` traces that are all in flight at once."""
        assert self._apply is not None
        if not groups:
            return {}
        lim = self.cfg.limits
        inferred = "1" if self.cfg.completion.mode == "inferred" else "0"
        timeout = self.cfg.redis.socket_timeout_seconds
        # Several round trips in flight: Redis runs one chunk's scripts while this process packs
        # the next and parses the replies of the previous one.
        keys = list(groups)
        chunks = [keys[i : i + APPLY_CHUNK] for i in range(0, len(keys), APPLY_CHUNK)]
        inflight: list[Pending] = []
        # The count moves noted since the last were sent ride in the first round trip (its first
        # commands): no round trip of their own.
        moved = 0
        try:
            for n, chunk in enumerate(chunks):
                cmds = Commands()
                if n == 0:
                    moved = self._add_moves(cmds)
                for tenant, trace in chunk:
                    cmds.evalsha(
                        self._apply,
                        [self.k.state(tenant, trace), self.k.tombstone(tenant, trace)],
                        [
                            self.ttl_ms,
                            _facts_json(groups[(tenant, trace)]),
                            lim.max_spans_per_trace,
                            lim.max_tool_executions_per_trace,
                            watermark_ms,
                            self.cfg.completion.allowed_lateness_ms,
                            inferred,
                        ],
                    )
                inflight.append(await send(self.redis, cmds, timeout))
            out: dict[tuple[str, str], ApplyResult] = {}
            for i, chunk in enumerate(chunks):
                if i == 0 and moved:
                    raw = await inflight[i].replies(raise_on_error=False)
                    self._moves_sent(raw[:moved])
                    raw = raw[moved:]
                    raise_first(raw)
                else:
                    raw = await inflight[i].replies()
                for key, r in zip(chunk, raw, strict=True):
                    out[key] = self._applied(key[0], r)
        except BaseException:
            if moved:
                self._listed.clear()  # the moves may not have reached Redis: list the tenants again
            for f in inflight:
                await f.abandon()  # no-op for those already read
            raise
        return out

    def _applied(self, tenant: str, r: list[Any]) -> ApplyResult:
        self.note_expiry(tenant, int(r[2]), int(r[3]))
        d = _loads(r[0])
        if d.get("ds"):
            DROPPED.labels(self.name, "max_spans_per_trace").inc(int(d["ds"]))
        if d.get("dx"):
            DROPPED.labels(self.name, "max_tool_executions_per_trace").inc(int(d["dx"]))
        return ApplyResult(
            new_spans=int(d["new"]),
            span_count=int(d["n"]),
            late=bool(d["late"]),
            root_end_ms=int(d["root_end"]),
            pending=list(d["pend"] or []),
            decided=list(d["dec"] or []),
            new_sessions=list(d["sess"] or []),
            state=TraceState.from_json(r[1]) if r[1] else None,
            late_sessions=list(d.get("ls") or []),
            touched_sessions=list(d.get("ts") or []),
        )

    # -- the count of traces in state (``Keys.live``) ------------------------------------------------

    def note_expiry(self, tenant: str, old_ms: int, new_ms: int) -> None:
        """A trace script changed a state's expiry from ``old_ms`` to ``new_ms`` (absolute ms; <= 0:
        no state): move it between the tenant's expiry buckets (sent later: ``_add_moves``)."""
        old = bucket_end_s(old_ms, self.bucket_ms) if old_ms > 0 else 0
        new = bucket_end_s(new_ms, self.bucket_ms) if new_ms > 0 else 0
        if old == new:
            return
        moves = self._moves.setdefault(tenant, {})
        if old:
            moves[old] = moves.get(old, 0) - 1
        if new:
            moves[new] = moves.get(new, 0) + 1

    def _indexed(self, tenant: str, replies: Sequence[Any]) -> None:
        """Note the expiry moves of index.lua replies ({code, expiry before, expiry after})."""
        for r in replies:
            self.note_expiry(tenant, int(r[1]), int(r[2]))

    def _add_moves(self, cmds: Commands) -> int:
        """Add the moves noted so far to ``cmds`` (and forget them): one count_move call per tenant,
        and one ZADD listing the tenants whose last bucket is later than this process last listed.
        Returns how many commands were added (their replies are for ``_moves_sent``)."""
        if not self._moves:
            return 0
        assert self._count_move is not None
        moves, self._moves = self._moves, {}
        added = len(cmds)
        listed: list[Arg] = []
        for tenant, buckets in moves.items():
            args: list[Arg] = []
            for b, d in buckets.items():
                if d:
                    args += (b, d)
            if not args:
                continue
            cmds.evalsha(self._count_move, [self.k.live(tenant)], args)
            top = max(b for b, d in buckets.items() if d)
            if top > self._listed.get(tenant, 0):
                self._listed[tenant] = top
                listed += (top, tenant)
        if listed:
            cmds.add("ZADD", self.k.live_tenants, "GT", *listed)
        return len(cmds) - added

    def _moves_sent(self, replies: Sequence[Any]) -> None:
        """The replies of ``_add_moves``' commands. Moves are sent once: one that failed (an error
        reply here, or a round trip that failed) costs only the count (logged), which mends itself
        once the buckets it missed have ended (within ``state_ttl_seconds``)."""
        failed = [r for r in replies if isinstance(r, Exception)]
        if failed:
            self._listed.clear()  # list the tenants again with the next moves
            log.warning("trace_state: %d count move(s) failed (%s); toolwitness_traces_in_state may be off until "
                        "their buckets end", len(failed), failed[0])

    def counts_lost(self) -> None:
        """Redis lost its data (``Recovery``): the moves not sent are of states gone with it, and
        the tenants this process listed are listed no more."""
        self._moves.clear()
        self._listed.clear()

    async def flush_counts(self) -> None:
        """Send the moves noted since the last were sent (the sweeper; shutdown), in one round trip."""
        cmds = Commands()
        if not self._add_moves(cmds):
            return
        try:
            replies = await execute(self.redis, cmds, self.cfg.redis.socket_timeout_seconds, raise_on_error=False)
        except BaseException:
            self._listed.clear()  # the moves may not have reached Redis: list the tenants again
            raise
        self._moves_sent(replies)

    async def count_traces(self) -> dict[str, int]:
        """Traces whose state Redis holds, by tenant: for each listed tenant, the sum of its buckets
        that have not ended. A state is counted until the end of the bucket its expiry falls in
        (``bucket_ms``), so at most that long after it expired. Moves noted here are sent first."""
        assert self._count_read is not None
        await self.flush_counts()
        ended = int(time.time()) - LIVE_TENANT_GRACE_S
        # What Redis drops from the index below, this process forgets too: a tenant that counts
        # again is listed again with its next moves (``_add_moves``). Else one entry per tenant
        # ever seen stays here for the life of the process.
        self._listed = {t: top for t, top in self._listed.items() if top > ended}
        cmds = Commands()
        cmds.add("ZREMRANGEBYSCORE", self.k.live_tenants, "-inf", ended)
        cmds.add("ZRANGE", self.k.live_tenants, 0, -1)
        tenants = sorted(_s(t) for t in (await self._execute(cmds))[1])
        if not tenants:
            return {}
        cmds = Commands()
        for tenant in tenants:
            cmds.evalsha(self._count_read, [self.k.live(tenant)], [])
        return {t: int(n) for t, n in zip(tenants, await self._execute(cmds), strict=True)}

    async def index_sessions(
        self, items: Iterable[tuple[str, str, str]], watermark_ms: int
    ) -> tuple[dict[tuple[str, str], list[str]], list[tuple[str, str]]]:
        """Record trace→session links. Returns (pending, broken): the pending expectation ids of
        each session, and the sessions a trace joined after they were complete (their marker passed
        by the watermark): their completeness claim is broken (``revise_sessions``)."""
        items = list(items)
        if not items:
            return {}, []
        lateness = self.cfg.completion.allowed_lateness_ms
        cmds = Commands()
        for tenant, session, trace in items:
            cmds.add("SADD", self.k.session_traces(tenant, session), trace)
            cmds.add("PEXPIRE", self.k.session_traces(tenant, session), self.ttl_ms)
            cmds.add("SMEMBERS", self.k.session_pending(tenant, session))
            cmds.add("GET", self.k.session_complete(tenant, session))
            cmds.add("SCARD", self.k.session_decided(tenant, session))
        raw = await self._execute(cmds)
        pending: dict[tuple[str, str], list[str]] = {}
        broken: list[tuple[str, str]] = []
        for i, (tenant, session, _) in enumerate(items):
            added, _, pend, marker_at, decided = raw[5 * i : 5 * i + 5]
            pending[(tenant, session)] = sorted(_s(x) for x in pend)
            # Complete by this batch's watermark, or already judged complete by someone whose
            # watermark was ahead of this batch's (a decision resting on completion exists): either
            # way the claim the joining trace breaks was made.
            passed = marker_at is not None and watermark_ms >= int(marker_at) + lateness
            if int(added) and (passed or (marker_at is not None and int(decided))):
                broken.append((tenant, session))
        return pending, broken

    async def mark_complete(
        self, tenant: str, trace_id: str, span_count: int | None, at_ms: int, watermark_ms: int = 0
    ) -> tuple[list[str], list[str], TraceState, list[str], list[str]]:
        """Record a trace's completion marker. Returns (pending ids, decided ids to revise, state,
        the trace's sessions, its sessions to revise)."""
        return (await self.mark_complete_many([(tenant, trace_id, span_count, at_ms)], watermark_ms))[0]

    async def mark_complete_many(
        self, markers: Sequence[tuple[str, str, int | None, int]], watermark_ms: int = 0
    ) -> list[tuple[list[str], list[str], TraceState, list[str], list[str]]]:
        """``mark_complete`` for each (tenant, trace id, span count, at) of ``markers``, in order, in
        one round trip (a marker re-sent in the same run finds the first one's claim, as it would
        one after the other)."""
        assert self._mark is not None
        c = self.cfg.completion
        cmds = Commands()
        for tenant, trace_id, span_count, at_ms in markers:
            cmds.evalsha(
                self._mark,
                [self.k.state(tenant, trace_id), self.k.tombstone(tenant, trace_id)],
                [
                    self.ttl_ms,
                    -1 if span_count is None else span_count,
                    at_ms,
                    watermark_ms,
                    c.allowed_lateness_ms,
                    "1" if c.mode == "inferred" else "0",
                ],
            )
        out: list[tuple[list[str], list[str], TraceState, list[str], list[str]]] = []
        for (tenant, *_), raw in zip(markers, await self._execute(cmds) if markers else [], strict=True):
            d = _loads(raw)
            self.note_expiry(tenant, int(d.get("o", -2)), int(d.get("x", -2)))
            out.append((
                list(d["pend"] or []),
                list(d["dec"] or []),
                TraceState.from_json(d["state"]),
                list(d.get("sess") or []),
                list(d.get("ls") or []),
            ))
        return out

    async def touched_sessions(
        self, items: Iterable[tuple[str, str]]
    ) -> tuple[dict[tuple[str, str], list[str]], dict[tuple[str, str], list[str]]]:
        """Sessions a trace of which gained spans: (their pending expectation ids, the decided ids
        of those whose completeness a late trace broke already: a revision to UNDETERMINED there
        is revised again when the new spans decide it)."""
        items = sorted(set(items))
        if not items:
            return {}, {}
        cmds = Commands()
        for tenant, session in items:
            cmds.add("SMEMBERS", self.k.session_pending(tenant, session))
            cmds.add("EXISTS", self.k.session_late(tenant, session))
            cmds.add("SMEMBERS", self.k.session_decided(tenant, session))
        raw = await self._execute(cmds)
        pending: dict[tuple[str, str], list[str]] = {}
        revise: dict[tuple[str, str], list[str]] = {}
        for i, key in enumerate(items):
            pend, late, decided = raw[3 * i : 3 * i + 3]
            if pend:
                pending[key] = sorted(_s(x) for x in pend)
            if int(late) and decided:
                revise[key] = sorted(_s(x) for x in decided)
        return pending, revise

    async def revise_sessions(self, items: Iterable[tuple[str, str]]) -> dict[tuple[str, str], list[str]]:
        """Sessions whose completeness a late trace broke: flag them late and return their decided
        expectation ids (to revise)."""
        items = sorted(set(items))
        if not items:
            return {}
        cmds = Commands()
        for tenant, session in items:
            cmds.add("SET", self.k.session_late(tenant, session), 1, "PX", self.ttl_ms)
            cmds.add("SMEMBERS", self.k.session_decided(tenant, session))
        raw = await self._execute(cmds)
        return {key: sorted(_s(x) for x in raw[2 * i + 1]) for i, key in enumerate(items)}

    async def register(self, exp: RegisteredExpectation) -> bool:
        """Store an expectation and index it under its traces/session. False if already known."""
        return (await self.register_many([exp]))[0]

    async def register_many(self, exps: Sequence[RegisteredExpectation]) -> list[bool]:
        """``register`` for each of ``exps``, in two round trips whatever their number (store the
        definitions; index the new ones). The same id twice: the first is stored, the second is
        known (False), as when they come one after the other."""
        if not exps:
            return []
        cmds = Commands()
        for exp in exps:
            cmds.add("SET", self.k.expectation(exp.tenant, exp.expectation_id), exp.to_json(), "PX",
                     _definition_ttl_ms(self.ttl_ms, exp), "NX")
        created = [r is not None for r in await self._execute(cmds)]
        await self.index_expectations([e for e, new in zip(exps, created, strict=True) if new])
        return created
    async def unindexed(self, exp: RegisteredExpectation) -> bool:
        """Stored but never indexed: the process died between storing the definition and indexing
        it. Indexing leaves a marker that lives as long as the definition (a decision may expire
        before it: that is no reason to judge it again). One registered before the marker existed
        counts as indexed when it has a deadline entry, a decision or a cancellation."""
        cmds = Commands()
        cmds.add("EXISTS", self.k.indexed(exp.tenant, exp.expectation_id))
        cmds.add("ZSCORE", self.k.deadlines, member(exp.tenant, exp.expectation_id))
        cmds.add("EXISTS", self.k.decision(exp.tenant, exp.expectation_id))
        cmds.add("EXISTS", self.k.cancelled(exp.tenant, exp.expectation_id))
        indexed, deadline, decided, cancelled = await self._execute(cmds)
        return not int(indexed) and deadline is None and not int(decided) and not int(cancelled)

    async def mark_cancelled(self, exp: RegisteredExpectation) -> None:
        """Remember a cancellation as long as the definition lives (a replayed registration is not
        an unindexed one)."""
        ttl = _definition_ttl_ms(self.ttl_ms, exp)
        await self.redis.set(self.k.cancelled(exp.tenant, exp.expectation_id), 1, px=ttl)

    async def index_expectation(self, exp: RegisteredExpectation) -> None:
        """Index a stored expectation under its traces/session and give it its deadline (idempotent)."""
        await self.index_expectations([exp])

    async def index_expectations(self, exps: Sequence[RegisteredExpectation]) -> None:
        """``index_expectation`` for each of ``exps``: one round trip (and one more for the traces
        already linked to their sessions, if any)."""
        assert self._index is not None
        if not exps:
            return
        cmds = Commands()
        #: per expectation: its tenant, how many index.lua replies, where its session's traces are
        shape: list[tuple[str, int, int | None]] = []
        for exp in exps:
            first = len(cmds)
            for trace in exp.trace_ids():
                cmds.evalsha(
                    self._index,
                    [self.k.state(exp.tenant, trace), self.k.tombstone(exp.tenant, trace)],
                    [self.ttl_ms, "add", 0, exp.expectation_id],
                )
            session = None if exp.trace_ids() else getattr(exp.scope, "session_id", None)
            members: int | None = None
            if session is not None:
                cmds.add("SADD", self.k.session_pending(exp.tenant, session), exp.expectation_id)
                cmds.add("PEXPIRE", self.k.session_pending(exp.tenant, session), self.ttl_ms)
                # The session's trace set and the traces already in it live until the deadline at
                # least (it is at most the ttl away): an idle session must not lose its evidence.
                cmds.add("PEXPIRE", self.k.session_traces(exp.tenant, session), self.ttl_ms, "GT")
                members = len(cmds)
                cmds.add("SMEMBERS", self.k.session_traces(exp.tenant, session))
            cmds.add("ZADD", self.k.deadlines, exp.deadline_ms, member(exp.tenant, exp.expectation_id))
            cmds.add("SET", self.k.indexed(exp.tenant, exp.expectation_id), 1, "PX",
                     _definition_ttl_ms(self.ttl_ms, exp))
            shape.append((exp.tenant, first, members))
        replies = await self._execute(cmds)
        touch = Commands()
        touched: list[str] = []  # the tenant of each touch
        for exp, (tenant, first, members) in zip(exps, shape, strict=True):
            self._indexed(tenant, replies[first : first + len(exp.trace_ids())])
            if members is not None:
                for trace in sorted(_s(t) for t in replies[members]):
                    touch.evalsha(self._index, [self.k.state(tenant, trace)], [self.ttl_ms, "touch", 0])
                    touched.append(tenant)
        if touched:
            for tenant, reply in zip(touched, await self._execute(touch), strict=True):
                self._indexed(tenant, [reply])

    async def forget(self, exp: RegisteredExpectation) -> None:
        """Drop a cancelled expectation from every index (pending, and decided: nothing revises it)."""
        assert self._index is not None
        cmds = Commands()
        for trace in exp.trace_ids():
            cmds.evalsha(self._index, [self.k.state(exp.tenant, trace)], [self.ttl_ms, "drop", 0, exp.expectation_id])
        if not exp.trace_ids() and hasattr(exp.scope, "session_id"):
            cmds.add("SREM", self.k.session_pending(exp.tenant, exp.scope.session_id), exp.expectation_id)
            cmds.add("SREM", self.k.session_decided(exp.tenant, exp.scope.session_id), exp.expectation_id)
        cmds.add("ZREM", self.k.deadlines, member(exp.tenant, exp.expectation_id))
        self._indexed(exp.tenant, (await self._execute(cmds))[: len(exp.trace_ids())])

    async def mark_session_complete(self, tenant: str, session_id: str, at_ms: int) -> list[str]:
        """Record a session completion marker; return the session's pending expectation ids."""
        async with self.redis.pipeline(transaction=False) as pipe:
            # the first claim holds (a re-sent marker must not move completion later)
            pipe.set(self.k.session_complete(tenant, session_id), at_ms, px=self.ttl_ms, nx=True)
            pipe.smembers(self.k.session_pending(tenant, session_id))
            raw = await pipe.execute()
        return sorted(_s(x) for x in raw[1])

    async def rearm_deadlines(self, exps: Sequence[RegisteredExpectation]) -> None:
        """Judge these decided expectations again at their deadline (see ``Keys.revision_deadlines``)."""
        await self._due(self.k.revision_deadlines, {member(e.tenant, e.expectation_id): e.deadline_ms for e in exps})

    async def rejudge_at(self, keys: Iterable[tuple[str, str]], at_ms: int) -> None:
        """Have the sweeper re-judge these decisions (as revisions) from ``at_ms`` on."""
        await self._due(self.k.rejudge, {member(t, i): at_ms for t, i in keys})

    async def _due(self, zset: str, members: Mapping[str, int]) -> None:
        """Members the sweeper claims from ``zset`` once due (``claim_due``)."""
        if members:
            await self.redis.zadd(zset, dict(members))

    async def undecided(self, tenant: str, expectation_id: str) -> bool:
        """Registered and neither decided nor cancelled (it still has a deadline entry)."""
        return await self.redis.zscore(self.k.deadlines, member(tenant, expectation_id)) is not None

    async def session_state(self, tenant: str, session_id: str) -> tuple[int | None, bool]:
        """(time of the session's completion marker or None, whether a trace came after the session
        was complete). The keys share the session's hash tag: one slot, one MGET."""
        at, late = await self.redis.mget(
            [self.k.session_complete(tenant, session_id), self.k.session_late(tenant, session_id)]
        )
        return (int(at) if at is not None else None), late is not None

    async def session_pending(self, tenant: str, session_id: str) -> list[str]:
        return sorted(_s(x) for x in await self.redis.smembers(self.k.session_pending(tenant, session_id)))

    async def load_expectations(self, tenant: str, ids: Sequence[str]) -> dict[str, RegisteredExpectation]:
        if not ids:
            return {}
        cmds = Commands()  # one GET each: on a Redis Cluster the keys live in different slots
        for i in ids:
            cmds.add("GET", self.k.expectation(tenant, i))
        raw = await self._execute(cmds)
        return {i: RegisteredExpectation.from_json(r) for i, r in zip(ids, raw, strict=True) if r is not None}

    async def load_states(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], TraceState | None]:
        if not keys:
            return {}
        cmds = Commands()
        for tenant, trace in keys:
            cmds.add("GET", self.k.state(tenant, trace))
        raw = await self._execute(cmds)
        return {k: (TraceState.from_json(r) if r is not None else None) for k, r in zip(keys, raw, strict=True)}

    async def session_traces(self, tenant: str, session_id: str) -> list[str]:
        return sorted(_s(x) for x in await self.redis.smembers(self.k.session_traces(tenant, session_id)))

    async def get_decision(self, tenant: str, expectation_id: str) -> Decision | None:
        cur = await self.redis.hmget(
            self.k.decision(tenant, expectation_id), ["v", "sid", "ev", "ob", "pub", "verdict"]
        )
        if cur[0] is None:
            return None
        return Decision(False, int(cur[0]), _s(cur[1]), _b(cur[2]), _b(cur[3]), _s(cur[4]) == "1", _s(cur[5]))

    async def decide_many(self, items: Sequence[DecideRequest]) -> list[Decision]:
        """Step 2b: compare-and-set every decision of a batch, EVALSHA calls in one round trip.

        A lost compare-and-set that is not yet published (an earlier run decided and crashed)
        gets its stored payload back, so exactly those bytes are re-sent.
        """
        assert self._decide is not None
        if not items:
            return []
        cmds = Commands()
        # Noted as unpublished BEFORE the compare-and-set: a decision made here and never settled
        # (the process died in between) is still found and re-sent -- and settled -- by a sweeper.
        zadd: list[Arg] = ["ZADD", self.k.unpublished]
        now = int(time.time() * 1000)
        for it in items:
            zadd += (now, member(it.tenant, it.expectation_id))
        cmds.add(*zadd)
        for it in items:
            cmds.evalsha(
                self._decide,
                [self.k.decision(it.tenant, it.expectation_id), self.k.cancelled(it.tenant, it.expectation_id)],
                [it.version, it.score_id, it.event, it.observation, it.verdict, self.ttl_ms, now],
            )
        raw = (await self._execute(cmds))[1:]
        # a lost compare-and-set carries the stored verdict (published or not): what won
        out = [
            Decision(
                bool(r[0]), int(r[1]), it.score_id, it.event, it.observation, int(r[2] or 0) == 1,
                it.verdict if r[0] or len(r) < 4 or not r[3] else _s(r[3]), cancelled=int(r[1]) < 0,
            )
            for it, r in zip(items, raw, strict=True)
        ]
        stale = [i for i, d in enumerate(out) if not d.won and not d.published]
        if stale:
            cmds = Commands()
            for i in stale:
                it = items[i]
                cmds.add(
                    "HMGET", self.k.decision(it.tenant, it.expectation_id), "sid", "ev", "ob", "verdict", "pub", "at"
                )
            for i, cur in zip(stale, await self._execute(cmds), strict=True):
                # Published meanwhile (its payload is then dropped, see mark_published): nothing to re-send.
                d = out[i]
                published = _s(cur[4]) == "1"
                at = int(cur[5]) if cur[5] is not None and _s(cur[5]).isdigit() else 0
                out[i] = Decision(
                    False, d.version, _s(cur[0]), _b(cur[1]), _b(cur[2]), published, _s(cur[3]), decided_ms=at
                )
        return out

    async def settle(
        self,
        decided: Sequence[RegisteredExpectation],
        finished: Sequence[RegisteredExpectation],
        now_ms: int,
        reclaim: Iterable[tuple[str, str]] = (),
        seen: Mapping[tuple[str, str], int] | None = None,
    ) -> list[tuple[str, str]]:
        """After winning compare-and-sets (or finding one never settled): update the indexes.
        (``decide_many`` noted them unpublished already: the sweeper re-sends what is not marked
        published.) ``now_ms`` is kept for callers; the indexes need no time.
        Returns the ``decided`` (tenant, id) whose trace turned late before this, or whose session
        has more traces now than ``seen`` (how many its evaluation read): to re-judge.

        ``decided`` keep watching their traces for a broken completion claim; ``finished``
        (UNDETERMINED, revisions) leave every index. The states of the ``reclaim`` traces
        (complete, decided) get their short life in the same script call. One pipeline:
        one script call per trace and operation, one ZADD and one ZREM for the whole slice.
        """
        if not decided and not finished:
            return []
        assert self._index is not None and self._session_done is not None
        shorten = set(reclaim)
        members = [member(e.tenant, e.expectation_id) for e in (*decided, *finished)]
        by_trace: dict[tuple[str, str, str], list[str]] = {}
        sessions: list[tuple[str, str, str, bool]] = []
        for op, exps in (("done", decided), ("drop", finished)):
            for exp in exps:
                for trace in exp.trace_ids():
                    by_trace.setdefault((op, exp.tenant, trace), []).append(exp.expectation_id)
                if not exp.trace_ids() and hasattr(exp.scope, "session_id"):
                    sessions.append((exp.tenant, exp.scope.session_id, exp.expectation_id, op == "done"))
        ms = self.cfg.redis.completed_ttl_seconds * 1000
        cmds = Commands()
        indexed = list(by_trace.items())
        for (op, tenant, trace), ids in indexed:
            cmds.evalsha(
                self._index,
                [self.k.state(tenant, trace), self.k.tombstone(tenant, trace)],
                [self.ttl_ms, op, ms if (tenant, trace) in shorten else 0, *ids],
            )
        checked: list[tuple[int, str, str]] = []  # (reply index, tenant, id) of session_done calls
        for tenant, session, exp_id, revisable in sessions:
            if revisable:  # a trace arriving after the session was complete revises it
                checked.append((len(cmds), tenant, exp_id))
                cmds.evalsha(
                    self._session_done,
                    [
                        self.k.session_pending(tenant, session),
                        self.k.session_decided(tenant, session),
                        self.k.session_traces(tenant, session),
                    ],
                    [exp_id, self.ttl_ms, (seen or {}).get((tenant, exp_id), 0)],
                )
            else:
                cmds.add("SREM", self.k.session_pending(tenant, session), exp_id)
                cmds.add("SREM", self.k.session_decided(tenant, session), exp_id)
        cmds.add("ZREM", self.k.deadlines, *members)
        replies = await self._execute(cmds)
        late: list[tuple[str, str]] = []
        for ((op, tenant, _trace), ids), reply in zip(indexed, replies[: len(indexed)], strict=True):
            self._indexed(tenant, [reply])
            if op == "done" and reply[0] == 2:
                late += [(tenant, i) for i in ids]
        # a trace joined the session while it was being decided: the decision may have missed it
        late += [(tenant, exp_id) for at, tenant, exp_id in checked if replies[at] == 1]
        return late

    async def reclaim(self, traces: Sequence[tuple[str, str]]) -> None:
        """Shorten the life of complete, decided traces' state (never lengthen it: PEXPIRE LT),
        leaving their tombstone (a span after it is late; an expectation registered after it
        finds the evidence gone). A trace something is still pending on keeps its life."""
        if not traces:
            return
        assert self._index is not None
        ms = self.cfg.redis.completed_ttl_seconds * 1000
        cmds = Commands()
        for tenant, trace in traces:
            cmds.evalsha(
                self._index, [self.k.state(tenant, trace), self.k.tombstone(tenant, trace)], [self.ttl_ms, "done", ms]
            )
        for (tenant, _trace), reply in zip(traces, await self._execute(cmds), strict=True):
            self._indexed(tenant, [reply])

    async def restore_decision(
        self, tenant: str, expectation_id: str, version: int, score_id: str, event: bytes, verdict: str
    ) -> None:
        """Re-create a published decision read back from the scores topic (data-loss recovery)."""
        key = self.k.decision(tenant, expectation_id)
        cur = await self.redis.hget(key, "v")
        if cur is not None and int(cur) >= version:
            return
        await self.redis.hset(
            key, mapping={"v": version, "sid": score_id, "ev": event, "ob": b"", "pub": 1, "verdict": verdict}
        )
        await self.redis.pexpire(key, self.ttl_ms)

    async def mark_published(self, items: Sequence[tuple[str, str]]) -> None:
        """Step 4: mark decisions published so the sweeper does not re-send them.

        The stored payload (score event, observation) is kept only to re-send exactly those bytes
        while unpublished; once published it is dropped in the same command (the hash keeps the
        version, score id and verdict that revisions and replays compare against): ~2.8 KB -> ~0.1 KB
        per decided expectation.
        """
        if not items:
            return
        cmds = Commands()
        for tenant, exp_id in items:
            cmds.add("HSET", self.k.decision(tenant, exp_id), "pub", 1, "ev", b"", "ob", b"")
        cmds.add("ZREM", self.k.unpublished, *(member(t, i) for t, i in items))
        await self._execute(cmds)

    async def await_watermark(self, items: Sequence[tuple[str, str, int]]) -> None:
        """Traces whose completion now depends on the event-time watermark reaching ``at``.

        Queued ``state_ttl_seconds`` ahead at most: ``at`` is the agent's clock (a marker's time, a
        root span's end), and the watermark never passes the wall clock, so a time further off
        would keep its member here for good, long after the state it waits for is gone. Taken at
        that time instead, a trace with nothing to judge leaves the queue; one still judged on is
        queued again (``Engine.evaluate``)."""
        if not items:
            return
        latest = int(time.time() * 1000) + self.ttl_ms
        await self.redis.zadd(self.k.await_watermark, {member(t, tr): min(at, latest) for t, tr, at in items})

    async def trace_pending(self, tenant: str, trace_id: str) -> tuple[list[str], TraceState | None]:
        """The expectations judged on a trace: its own pending ones and its sessions' pending ones
        (a count-less marker completing a trace of a session may decide the session's); and the
        trace's state (None: gone), read in the same GET."""
        raw = await self.redis.get(self.k.state(tenant, trace_id))
        if raw is None:
            return [], None
        d = _loads(raw)
        ids = set(d.get("pe") or {})
        for session in d.get("ss") or {}:
            ids.update(await self.session_pending(tenant, session))
        return sorted(ids), TraceState.from_json(raw)

    async def unclaim(self, zset: str, items: Sequence[tuple[str, str]], score: int, *, lease_until: int) -> None:
        """Put claimed items back at ``score`` (their handling failed): those still holding the
        lease ``lease_until`` -- one re-queued meanwhile (e.g. at a later time) keeps its score."""
        assert self._release is not None
        if items:
            await self._release(keys=[zset], args=[lease_until, score, *(member(t, i) for t, i in items)])

    async def undelivered(self) -> int:
        """Decisions noted unpublished (by any instance) and not yet marked published."""
        return int(await self.redis.zcard(self.k.unpublished))

    async def claim_due(self, zset: str, upto: int, limit: int = 500, *, lease_until: int) -> list[tuple[str, str]]:
        """Claim members due by ``upto``: one atomic script moves each one's score to ``lease_until``,
        so exactly one claimer gets it. Once handled, ``release`` them (or ``unclaim`` on failure);
        if the claimer dies first, they are due again at ``lease_until``: a claim is never lost."""
        assert self._claim is not None
        assert lease_until > upto
        due = await self._claim(keys=[zset], args=[upto, limit, lease_until])
        return [split_member(cast(bytes, m)) for m in due]

    async def release(self, zset: str, items: Sequence[tuple[str, str]], lease_until: int) -> None:
        """Drop handled claims (those still holding the lease ``lease_until``)."""
        assert self._release is not None
        if items:
            await self._release(keys=[zset], args=[lease_until, "", *(member(t, i) for t, i in items)])
