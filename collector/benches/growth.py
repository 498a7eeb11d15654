"""``toolwitness bench growth``: how end-to-end spans/s changes as traces and the expectation set grow.

Two sweeps, each step a fresh backlog drained by the in-process service (the pipeline
suite's end-to-end pass: every trace has one expectation, decided TRUE on the way):

- **trace size**: 5 → 25 → 100 → 500 spans per trace (40 % tool executions), the same
  number of spans per step, each trace split into records of at most ``record_spans``
  spans (as an SDK exporting by size does);
- **active expectations**: 10 → 1k → 10k (``--max-expectations 100000`` for 100k)
  expectations registered and pending on traces that never arrive, beside the backlog's own.

Cost per span is ``1 / spans_per_s``; growth is reported as the ratio of the cost per span at
the largest step to the smallest: <= 1.25 is linear or better (a flat cost per span, the
per-trace work amortised), above it the cost per span grows with the size (super-linear).
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import secrets
import uuid
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from collector.bench import (
    BenchTrace,
    Rig,
    _decided_true,
    drain_in_process,
    make_traces,
    on_rig,
    prepare_backlog,
)
from collector.benches.common import CpuMeter, Target, busy_text, consoles, emit, new_progress, task
from collector.benches.state import registered
from collector.processors.trace_state import Keys, TraceStateStore

__all__ = ["run_growth_bench"]

LINEAR_TOLERANCE = 1.25
TOOL_SHARE = 0.4


def tools_for(spans: int) -> int:
    return min(spans - 1, max(1, round(spans * TOOL_SHARE)))


def expectation_steps(hi: int) -> list[int]:
    out = [10]
    x = 1000
    while x < hi:
        out.append(x)
        x *= 10
    if hi > 10:
        out.append(hi)
    return sorted(set(out))


async def _step(
    rig: Rig, traces: Sequence[BenchTrace], progress: Progress, desc: str, background: int = 0
) -> dict[str, Any]:
    cfg = rig.config()
    redis = Redis.from_url(cfg.redis.url)
    try:
        if background:
            store = TraceStateStore(redis, cfg)
            await store.start()
            _, adv = task(progress, f"register {background:,} background expectations", background)
            for i in range(0, background, 1000):
                exps = [
                    registered(BenchTrace(secrets.token_hex(16), b"", "tool_3", uuid.uuid4().hex), cfg)
                    for _ in range(min(1000, background - i))
                ]
                for j in range(0, len(exps), 50):
                    await asyncio.gather(*(store.register(e) for e in exps[j : j + 50]))
                adv(len(exps))
        total = await prepare_backlog(cfg, redis, traces, progress)
        cpu = CpuMeter(cfg.kafka.bootstrap_servers, cfg.redis.url)
        e2e = await drain_in_process(cfg, total, progress, cpu, desc=desc)
        true, _ = await _decided_true(redis, Keys(cfg.redis.key_prefix), [t.expectation_id for t in traces])
    finally:
        await redis.aclose()
    e2e["traces"] = len(traces)
    e2e["decided_true"] = true
    e2e["us_per_span"] = 1e6 / e2e["spans_per_s"] if e2e["spans_per_s"] else math.nan
    return e2e


def _verdict(rows: Sequence[dict[str, Any]]) -> tuple[float, str]:
    first, last = rows[0]["us_per_span"], rows[-1]["us_per_span"]
    r = last / first if first else math.nan
    if not math.isfinite(r):
        return r, "n/a"
    if r < 0.8:
        return r, f"better than linear: cost per span x{r:.2f} (per-trace work amortised)"
    if r <= LINEAR_TOLERANCE:
        return r, f"linear: cost per span x{r:.2f}"
    return r, f"SUPER-linear: cost per span x{r:.2f}"


async def _run(
    rig: Rig,
    spans: int,
    sizes: Sequence[int],
    max_expectations: int,
    record_spans: int,
    err: Console,
) -> dict[str, Any]:
    progress = new_progress(err)
    report: dict[str, Any] = {"cpus": os.cpu_count() or 0, "spans_per_step": spans, "record_spans": record_spans}
    with progress:
        by_size = []
        for s in sizes:
            n = max(4, spans // s)
            _, adv = task(progress, f"generate {n:,} traces of {s} spans", n)
            one = functools.partial(adv, 1)
            traces = make_traces(n, spans=s, tools=tools_for(s), record_spans=record_spans, on_trace=one)
            row = await _step(rig, traces, progress, f"end to end: {s}-span traces")
            row["trace_spans"] = s
            row["tools"] = tools_for(s)
            by_size.append(row)
        report["by_trace_size"] = by_size
        by_exp = []
        n = max(4, spans // 25)
        for e in expectation_steps(max_expectations):
            traces = make_traces(n)
            row = await _step(rig, traces, progress, f"end to end: {e:,} active expectations", background=e)
            row["active_expectations"] = e + n
            row["background"] = e
            by_exp.append(row)
        report["by_expectations"] = by_exp
    return report


def _targets(report: dict[str, Any]) -> list[Target]:
    out = []
    for key, what in (("by_trace_size", "trace size"), ("by_expectations", "active expectations")):
        rows = report[key]
        r, word = _verdict(rows)
        all_true = all(x["decided_true"] == x["traces"] for x in rows)
        out.append(
            Target(
                f"cost per span vs {what} linear or better",
                f"cost/span at largest <= x{LINEAR_TOLERANCE} of smallest, every trace decided",
                f"{word}{'' if all_true else '; NOT every trace decided'}",
                r <= LINEAR_TOLERANCE and all_true,
            )
        )
    return out


def _table(report: dict[str, Any], targets: Sequence[Target]) -> Table:
    t = Table(
        title=f"toolwitness bench growth — one run, {report['spans_per_step']:,} spans per step, "
        f"records of <= {report['record_spans']} spans, {report['cpus']} CPUs"
    )
    t.add_column("step")
    t.add_column("spans/s", justify="right")
    t.add_column("µs/span", justify="right")
    t.add_column("detail")
    for r in report["by_trace_size"]:
        t.add_row(
            f"{r['trace_spans']}-span traces ({r['tools']} tools)",
            f"{r['spans_per_s']:,.0f}",
            f"{r['us_per_span']:,.1f}",
            f"{r['traces']:,} traces, {r['decided_true']:,} TRUE, {r['batches']} batches; CPU {busy_text(r['cpu'])}",
        )
    t.add_row("  growth with trace size", "", "", _verdict(report["by_trace_size"])[1])
    t.add_section()
    for r in report["by_expectations"]:
        t.add_row(
            f"{r['background']:,} (+{r['traces']:,}) active expectations",
            f"{r['spans_per_s']:,.0f}",
            f"{r['us_per_span']:,.1f}",
            f"{r['background']:,} pending elsewhere + {r['traces']:,} on the backlog, {r['decided_true']:,} TRUE; "
            f"CPU {busy_text(r['cpu'])}",
        )
    t.add_row("  growth with active expectations", "", "", _verdict(report["by_expectations"])[1])
    t.add_section()
    for tg in targets:
        t.add_row(
            f"target: {tg.name}",
            "[green]met[/]" if tg.met else "[red]MISSED[/]",
            "",
            f"{tg.value} (target {tg.target})",
        )
    return t


async def run_growth_bench(
    *,
    spans: int = 20000,
    sizes: Sequence[int] = (5, 25, 100, 500),
    max_expectations: int = 10000,
    record_spans: int = 50,
    as_json: bool = False,
    bootstrap: str | None = None,
    redis_url: str | None = None,
) -> int:
    """Run the growth benchmark; print one table (or JSON). Exit code: 0 met, 1 missed, 2 failed."""
    if spans < 100 or not sizes or min(sizes) < 2 or max_expectations < 10 or record_spans < 1:
        raise ValueError("need spans >= 100, sizes >= 2, max_expectations >= 10, record_spans >= 1")
    out, err = consoles()
    report = await on_rig(
        "growth",
        bootstrap,
        redis_url,
        err,
        lambda rig: _run(rig, spans, sorted(sizes), max_expectations, record_spans, err),
    )
    if report is None:
        return 2
    targets = _targets(report)
    return emit(report, targets, _table(report, targets), as_json, out)
