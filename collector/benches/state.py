"""``toolwitness bench state``: Redis memory of the service's state, measured with ``MEMORY USAGE``.

Figures, all from one run on the real Redis:

- **bytes per active trace** (25 spans; state JSON + pending set, one pending expectation)
  and **per tool execution** (the slope of the state over 0 → 20 tool executions); the per-trace
  figure includes the trace's share of the count of traces in state (``Keys.live``: per tenant,
  a hash of expiry buckets, and the list of tenants) at its worst: a tenant with one trace, or
  one trace in each of 1,440 buckets (the share of many traces in a bucket is shown beside);
- **growth with active traces** (default 1k → 20k; ``--max-traces 100000`` for 100k): every
  key of the run's prefix summed (``SCAN`` + ``MEMORY USAGE``), per trace, at each step —
  linear when the per-trace figure stays flat;
- **growth with active expectations** (default 1k → 10k; ``--max-expectations 100000``):
  definition keys, pending sets and the shared deadline index, per expectation;
- **reclamation**: with ``redis.completed_ttl_seconds`` set short, a trace that is complete
  when it is decided has its keys gone after that grace; a trace decided before it completes
  keeps its state until ``state_ttl_seconds`` (what the run shows is printed as measured).

Traces are applied through the service's own trace-state script (``TraceStateStore.apply``,
the ``apply_spans.lua`` the service runs), expectations through ``TraceStateStore.register``;
the growth steps reuse one decoded template trace with fresh ids (identical sizes), so 100k
traces load in seconds rather than minutes. Reclamation runs the real service end to end.
"""

from __future__ import annotations

import asyncio
import math
import os
import secrets
import time
import uuid
from collections.abc import Sequence
from copy import deepcopy
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from redis.asyncio import Redis
from rich.progress import Progress
from rich.table import Table

from collector.bench import (
    TENANT,
    TRACE_SPANS,
    TRACE_TOOLS,
    BenchTrace,
    Rig,
    _control_record,
    _produce,
    _service,
    drain_in_process,
    make_trace,
    on_rig,
    prepare_backlog,
)
from collector.benches.common import Target, consoles, emit, new_progress, target_rows, task
from collector.config import ServiceConfig
from collector.processors.normalize import short_id, span_fact
from collector.processors.trace_state import Keys, TraceStateStore
from collector.receivers.decode import decode_span_record
from collector.wire.convert import RegisteredExpectation, decode_control, expectation_from_proto
from collector.wire.gen import control_pb2

__all__ = ["run_state_bench"]

TARGET_TRACE_BYTES = 2048
#: growth is "linear" when the per-item figure at the largest step is within this factor of the smallest.
LINEAR_TOLERANCE = 1.25
RECLAIM_TTL_S = 2


def _steps(lo: int, hi: int) -> list[int]:
    """lo, then decades below hi, then hi: 1k, 10k, 20k / 1k, 10k, 100k."""
    out = []
    x = lo
    while x < hi:
        out.append(x)
        x *= 10
    out.append(hi)
    return out


def registered(trace: BenchTrace, cfg: ServiceConfig) -> RegisteredExpectation:
    msg = decode_control(_control_record(trace))
    return expectation_from_proto(
        msg.expectation,
        default_tenant=TENANT,
        default_deadline_s=cfg.completion.default_deadline_seconds,
        now_ms=int(time.time() * 1000),
    )


def facts_of(trace: BenchTrace, cfg: ServiceConfig) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for record in trace.records:
        for _tenant, span in decode_span_record(record, [], cfg).spans:
            out.append(span_fact(span, cfg.limits.max_argument_bytes))
    return out


def _fresh(template: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The template's facts with fresh span ids (parents remapped): same sizes, new spans."""
    ids = {f["i"]: short_id(secrets.token_hex(8)) for f in template}
    out = []
    for f in template:
        g = deepcopy(f)
        g["i"] = ids[f["i"]]
        if g["p"]:
            g["p"] = ids.get(g["p"], g["p"])
        if g["x"]:
            g["x"][0] = g["i"]
        out.append(g)
    return out


async def key_bytes(redis: Redis, prefix: str) -> dict[str, int]:
    """``MEMORY USAGE`` of every key under ``prefix``, summed by key kind (suffix)."""
    out: dict[str, int] = {}
    batch: list[bytes] = []

    async def flush() -> None:
        async with redis.pipeline(transaction=False) as pipe:
            for k in batch:
                pipe.memory_usage(k, samples=0)
            sizes = await pipe.execute()
        for k, size in zip(batch, sizes, strict=True):
            name = k.decode()
            kind = name.rsplit(":", 1)[-1] if "}" in name else name.split(":", 1)[-1]
            out[kind] = out.get(kind, 0) + int(size or 0)
            out["#" + kind] = out.get("#" + kind, 0) + 1
        batch.clear()

    async for key in redis.scan_iter(match=f"{prefix}:*", count=2000):
        batch.append(key)
        if len(batch) >= 2000:
            await flush()
    if batch:
        await flush()
    return out


def _kind_bytes(kb: dict[str, int], kinds: Sequence[str]) -> int:
    return sum(kb.get(k, 0) for k in kinds)


async def _used_memory(redis: Redis) -> int:
    info = await redis.info("memory")
    return int(info.get("used_memory", 0))


async def _register_many(store: TraceStateStore, exps: Sequence[RegisteredExpectation]) -> None:
    for i in range(0, len(exps), 50):  # within the client's connection pool
        await asyncio.gather(*(store.register(e) for e in exps[i : i + 50]))


async def _count_index(store: TraceStateStore, redis: Redis, counted: int) -> dict[str, Any]:
    """Bytes per trace of the count of traces in state, after ``_per_tool`` loaded ``counted``
    traces of ``TENANT``: their share (all in one or two buckets: the common case), a tenant with one
    trace (its hash: one bucket, the sum, the time read; its entry in the list of tenants), and one trace in each of
    1,440 buckets (a day at 60 s: the most fields a tenant's hash can hold at the default TTL)."""
    k = store.k

    async def used(key: str) -> int:
        return int(await redis.memory_usage(key, samples=0) or 0)

    assert (await store.count_traces()).get(TENANT) == counted
    listed_one = await used(k.live_tenants)
    shared = (await used(k.live(TENANT)) + listed_one) / counted
    lone, spread = f"{TENANT}-lone", f"{TENANT}-spread"
    now = int(time.time() * 1000)
    store.note_expiry(lone, -2, now + store.ttl_ms)
    buckets = 1440
    for i in range(buckets):
        store.note_expiry(spread, -2, now + store.ttl_ms + i * store.bucket_ms)
    counts = await store.count_traces()  # as the sweeper reads them (which adds the time read)
    assert counts.get(lone) == 1 and counts.get(spread) == buckets
    member = (await used(k.live_tenants) - listed_one) / 2  # a tenant's entry in the list of tenants
    lone_b = await used(k.live(lone)) + member
    spread_b = (await used(k.live(spread)) + member) / buckets
    return {
        "shared_per_trace": shared,
        "lone_trace": lone_b,
        "one_per_bucket_per_trace": spread_b,
        "buckets": buckets,
        "worst_per_trace": max(lone_b, spread_b, shared),
        "bucket_seconds": store.bucket_ms // 1000,
    }


async def _per_tool(store: TraceStateStore, redis: Redis, cfg: ServiceConfig, n: int) -> dict[str, Any]:
    keys = Keys(cfg.redis.key_prefix)
    rows = []
    for tools in (0, 5, 10, 20):
        sizes = []
        for i in range(n):
            tr = make_trace(i, time.time_ns(), spans=TRACE_SPANS, tools=tools)
            await store.register(registered(tr, cfg))
            await store.apply({(TENANT, tr.trace_id): facts_of(tr, cfg)}, 0)
            st = await redis.memory_usage(keys.state(TENANT, tr.trace_id), samples=0)
            # The trace's pending/decided expectation ids live inside its state: one key.
            sizes.append((int(st or 0), 0, len(await redis.get(keys.state(TENANT, tr.trace_id)) or b"")))
        rows.append(
            {
                "tools": tools,
                "state_bytes": sum(s[0] for s in sizes) / n,
                "pending_bytes": sum(s[1] for s in sizes) / n,
                "json_bytes": sum(s[2] for s in sizes) / n,
            }
        )
    index = await _count_index(store, redis, n * len(rows))
    for r in rows:  # the count's worst share per trace, added to every trace's figure
        r["index_bytes"] = index["worst_per_trace"]
        r["trace_bytes"] = r["state_bytes"] + r["pending_bytes"] + r["index_bytes"]
    lo, hi = rows[0], rows[-1]
    slope = (hi["state_bytes"] - lo["state_bytes"]) / (hi["tools"] - lo["tools"])
    json_slope = (hi["json_bytes"] - lo["json_bytes"]) / (hi["tools"] - lo["tools"])
    ten = next(r for r in rows if r["tools"] == TRACE_TOOLS)
    return {
        "by_tools": rows, "per_tool_bytes": slope, "per_tool_json_bytes": json_slope, "trace_bytes": ten,
        "count_index": index,
    }


async def _trace_growth(
    store: TraceStateStore, redis: Redis, cfg: ServiceConfig, steps: Sequence[int], progress: Progress
) -> list[dict[str, Any]]:
    template_trace = make_trace(0, time.time_ns())
    template = facts_of(template_trace, cfg)
    base_used = await _used_memory(redis)
    loaded = 0
    rows = []
    _, adv = task(progress, "state: load active traces", steps[-1])
    for step in steps:
        while loaded < step:
            chunk = min(500, step - loaded)
            groups = {(TENANT, secrets.token_hex(16)): _fresh(template) for _ in range(chunk)}
            exps = []
            for trace_id in groups:
                bt = BenchTrace(trace_id[1], b"", template_trace.tool, uuid.uuid4().hex)
                exps.append(registered(bt, cfg))
            await _register_many(store, exps)
            await store.apply(groups, 0)
            loaded += chunk
            adv(chunk)
        await store.flush_counts()
        kb = await key_bytes(redis, cfg.redis.key_prefix)
        # the state, and the count of traces in state (the tenant's hash and the list of tenants)
        trace_b = _kind_bytes(kb, ("s", "p", "live", "live_tenants"))
        exp_b = _kind_bytes(kb, ("def", "deadlines"))
        rows.append(
            {
                "traces": step,
                "trace_keys_bytes": trace_b,
                "per_trace_bytes": trace_b / step,
                "expectation_bytes": exp_b,
                "per_trace_with_expectation_bytes": (trace_b + exp_b) / step,
                "used_memory_delta": await _used_memory(redis) - base_used,
                "keys": {k[1:]: v for k, v in kb.items() if k.startswith("#")},
            }
        )
    return rows


async def _expectation_growth(
    store: TraceStateStore, redis: Redis, cfg: ServiceConfig, steps: Sequence[int], progress: Progress
) -> list[dict[str, Any]]:
    loaded = 0
    rows = []
    _, adv = task(progress, "state: register active expectations", steps[-1])
    for step in steps:
        while loaded < step:
            chunk = min(1000, step - loaded)
            exps = [
                registered(BenchTrace(secrets.token_hex(16), b"", "tool_3", uuid.uuid4().hex), cfg)
                for _ in range(chunk)
            ]
            await _register_many(store, exps)
            loaded += chunk
            adv(chunk)
        kb = await key_bytes(redis, cfg.redis.key_prefix)
        b = _kind_bytes(kb, ("def", "p", "deadlines"))
        rows.append(
            {
                "expectations": step,
                "bytes": b,
                "per_expectation_bytes": b / step,
                "by_kind": {k: kb.get(k, 0) for k in ("def", "p", "deadlines")},
            }
        )
    return rows


async def _ttl_summary(redis: Redis, keys: Keys, traces: Sequence[BenchTrace]) -> dict[str, Any]:
    alive = 0
    ttls = []
    for t in traces:
        ms = await redis.pttl(keys.state(TENANT, t.trace_id))
        if ms is not None and ms >= 0:
            alive += 1
            ttls.append(int(ms))
    return {"alive": alive, "max_pttl_ms": max(ttls) if ttls else -2}


async def _reclamation(rig: Rig, n: int, progress: Progress) -> dict[str, Any]:
    """Decided traces, complete at decision vs completed later, with completed_ttl_seconds short."""
    cfg = rig.config(completed_ttl_seconds=RECLAIM_TTL_S)
    keys = Keys(cfg.redis.key_prefix)
    redis = Redis.from_url(cfg.redis.url)
    out: dict[str, Any] = {"completed_ttl_seconds": RECLAIM_TTL_S, "state_ttl_seconds": cfg.redis.state_ttl_seconds}
    try:
        complete_first = [make_trace(i, time.time_ns()) for i in range(n)]
        decided_first = [make_trace(n + i, time.time_ns()) for i in range(n)]
        traces = complete_first + decided_first

        def marker(t: BenchTrace) -> tuple[bytes, bytes]:
            at = Timestamp()
            at.GetCurrentTime()
            m = control_pb2.CompletionMarker(tenant=TENANT, trace_id=t.trace_id, span_count=TRACE_SPANS, at=at)
            return t.trace_id.encode(), control_pb2.ControlMessage(completion=m).SerializeToString()

        # Markers for the first half are registered before any span: complete when decided.
        ids = [t.expectation_id for t in traces]
        total = await prepare_backlog(cfg, redis, traces, progress, extra_controls=[marker(t) for t in complete_first])
        await drain_in_process(cfg, total, progress, desc="state: reclamation pass")
        out["complete_at_decision"] = await _ttl_summary(redis, keys, complete_first)
        out["decided_before_complete"] = await _ttl_summary(redis, keys, decided_first)
        out["traces"] = n
        # Then the second half's markers arrive, after their decisions.
        await _produce(cfg.kafka, cfg.kafka.topics.control, [marker(t) for t in decided_first])
        async with _service(cfg) as svc:
            await asyncio.sleep(1.0)
            async with svc.batch_lock:
                pass
            await asyncio.sleep(RECLAIM_TTL_S + 1.0)
            out["complete_at_decision_after_grace"] = await _ttl_summary(redis, keys, complete_first)
            out["decided_then_completed_after_grace"] = await _ttl_summary(redis, keys, decided_first)
        out["expectations"] = len(ids)
    finally:
        await redis.aclose()
    return out


async def _run(rig: Rig, traces: int, expectations: int, per_tool_n: int, err: Any) -> dict[str, Any]:
    progress = new_progress(err)
    report: dict[str, Any] = {"cpus": os.cpu_count() or 0}
    with progress:
        cfg = rig.config()
        redis = Redis.from_url(cfg.redis.url)
        store = TraceStateStore(redis, cfg)
        await store.start()
        try:
            tid = progress.add_task("state: bytes per trace and per tool execution", total=None)
            report["per_trace"] = await _per_tool(store, redis, cfg, per_tool_n)
            progress.remove_task(tid)
        finally:
            await redis.aclose()
        cfg = rig.config()
        redis = Redis.from_url(cfg.redis.url)
        store = TraceStateStore(redis, cfg)
        await store.start()
        try:
            report["trace_growth"] = await _trace_growth(store, redis, cfg, _steps(1000, traces), progress)
        finally:
            await redis.aclose()
        cfg = rig.config()
        redis = Redis.from_url(cfg.redis.url)
        store = TraceStateStore(redis, cfg)
        await store.start()
        try:
            report["expectation_growth"] = await _expectation_growth(
                store, redis, cfg, _steps(min(1000, expectations), expectations), progress
            )
        finally:
            await redis.aclose()
        report["reclamation"] = await _reclamation(rig, 20, progress)
    return report


def _growth_word(first: float, last: float) -> str:
    if not (math.isfinite(first) and math.isfinite(last)) or first <= 0:
        return "n/a"
    r = last / first
    if r <= LINEAR_TOLERANCE:
        return f"linear (per-item x{r:.2f} from first to last step)" if r >= 0.8 else f"sub-linear (x{r:.2f})"
    return f"SUPER-linear (per-item x{r:.2f})"


def _targets(report: dict[str, Any]) -> list[Target]:
    pt = report["per_trace"]["trace_bytes"]
    rc = report["reclamation"]
    tg = report["trace_growth"]
    eg = report["expectation_growth"]
    trace_lin = tg[-1]["per_trace_bytes"] / tg[0]["per_trace_bytes"] if tg[0]["per_trace_bytes"] else math.nan
    exp_lin = eg[-1]["per_expectation_bytes"] / eg[0]["per_expectation_bytes"] if eg[0]["per_expectation_bytes"] else 0
    return [
        Target(
            "Redis bytes / active trace (25 spans, 10 tools)",
            f"<= {TARGET_TRACE_BYTES:,} B",
            f"{pt['trace_bytes']:,.0f} B (state incl. expectation ids {pt['state_bytes']:,.0f} B + count of "
            f"traces in state, worst case {pt['index_bytes']:,.0f} B)",
            0 < pt["trace_bytes"] <= TARGET_TRACE_BYTES,
        ),
        Target(
            "complete, decided traces reclaimed",
            f"keys gone after completed_ttl_seconds={rc['completed_ttl_seconds']}",
            f"{rc['traces'] - rc['complete_at_decision_after_grace']['alive']}/{rc['traces']} gone",
            rc["complete_at_decision_after_grace"]["alive"] == 0,
        ),
        Target(
            "memory grows linearly with active traces",
            f"per-trace bytes at {tg[-1]['traces']:,} <= x{LINEAR_TOLERANCE} of at {tg[0]['traces']:,}",
            f"x{trace_lin:.2f}",
            trace_lin <= LINEAR_TOLERANCE,
        ),
        Target(
            "memory grows linearly with active expectations",
            f"per-expectation bytes at {eg[-1]['expectations']:,} <= x{LINEAR_TOLERANCE} of at "
            f"{eg[0]['expectations']:,}",
            f"x{exp_lin:.2f}",
            exp_lin <= LINEAR_TOLERANCE,
        ),
    ]


def _table(report: dict[str, Any], targets: Sequence[Target]) -> Table:
    t = Table(title=f"toolwitness bench state — Redis MEMORY USAGE, one run, {report['cpus']} CPUs")
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_column("detail")
    pt = report["per_trace"]
    for r in pt["by_tools"]:
        t.add_row(
            f"active trace, 25 spans, {r['tools']} tool executions",
            f"{r['trace_bytes']:,.0f} B",
            f"state key {r['state_bytes']:,.0f} B (JSON {r['json_bytes']:,.0f} B, pending/decided ids inside) "
            f"+ count of traces in state {r['index_bytes']:,.0f} B (worst case)",
        )
    ix = pt["count_index"]
    t.add_row(
        "  count of traces in state, per trace",
        f"{ix['worst_per_trace']:,.0f} B",
        f"worst of: a tenant with one trace {ix['lone_trace']:,.0f} B; one trace in each of {ix['buckets']:,} "
        f"{ix['bucket_seconds']} s buckets {ix['one_per_bucket_per_trace']:,.0f} B; many traces in a bucket "
        f"{ix['shared_per_trace']:,.1f} B",
    )
    t.add_row(
        "per tool execution",
        f"{pt['per_tool_bytes']:,.0f} B",
        f"slope 0 → 20 tools of the state key (JSON {pt['per_tool_json_bytes']:,.0f} B)",
    )
    t.add_section()
    tg = report["trace_growth"]
    for r in tg:
        t.add_row(
            f"{r['traces']:,} active traces (1 pending expectation each)",
            f"{r['per_trace_bytes']:,.0f} B/trace",
            f"trace keys {r['trace_keys_bytes'] / 1e6:,.1f} MB; with expectation "
            f"{r['per_trace_with_expectation_bytes']:,.0f} B/trace; server used_memory "
            f"+{r['used_memory_delta'] / 1e6:,.1f} MB",
        )
    t.add_row("  growth with active traces", "", _growth_word(tg[0]["per_trace_bytes"], tg[-1]["per_trace_bytes"]))
    t.add_section()
    eg = report["expectation_growth"]
    for r in eg:
        kinds = ", ".join(f"{k} {v / 1e6:,.2f} MB" for k, v in r["by_kind"].items())
        t.add_row(
            f"{r['expectations']:,} active expectations (no spans)",
            f"{r['per_expectation_bytes']:,.0f} B/exp",
            f"{kinds} (def = definition, p = pending set of its trace, deadlines = shared index)",
        )
    t.add_row(
        "  growth with active expectations",
        "",
        _growth_word(eg[0]["per_expectation_bytes"], eg[-1]["per_expectation_bytes"]),
    )
    t.add_section()
    rc = report["reclamation"]
    n = rc["traces"]

    def ttl(s: dict[str, Any]) -> str:
        return f"{s['alive']}/{n} states alive, max PTTL {s['max_pttl_ms'] / 1000:,.1f} s"

    t.add_row("decided, complete at decision: right after", "", ttl(rc["complete_at_decision"]))
    t.add_row(
        f"  … after completed_ttl_seconds={rc['completed_ttl_seconds']} + 1 s",
        f"{n - rc['complete_at_decision_after_grace']['alive']}/{n} gone",
        ttl(rc["complete_at_decision_after_grace"]),
    )
    t.add_row("decided before its completion marker", "", ttl(rc["decided_before_complete"]))
    t.add_row(
        "  … marker arrives after the decision, + grace",
        f"{n - rc['decided_then_completed_after_grace']['alive']}/{n} gone",
        ttl(rc["decided_then_completed_after_grace"]) + f" (state_ttl_seconds={rc['state_ttl_seconds']:,})",
    )
    target_rows(t, targets)
    return t


async def run_state_bench(
    *,
    traces: int = 20000,
    expectations: int = 10000,
    as_json: bool = False,
    bootstrap: str | None = None,
    redis_url: str | None = None,
    per_tool_traces: int = 20,
) -> int:
    """Run the state benchmark; print one table (or JSON). Exit code: 0 met, 1 missed, 2 failed."""
    if traces < 1000 or expectations < 10:
        raise ValueError("need traces >= 1000 and expectations >= 10")
    out, err = consoles()
    report = await on_rig(
        "state", bootstrap, redis_url, err, lambda rig: _run(rig, traces, expectations, per_tool_traces, err)
    )
    if report is None:
        return 2
    targets = _targets(report)
    return emit(report, targets, _table(report, targets), as_json, out)
