"""``toolwitness bench verdict-latency``: time to verdict at several loads, p50/p95/p99.

For each load a paced producer (its own process) sends one record per trace (25 spans, 10
tool executions) at the stated span rate to the running service; each trace had an
expectation "tool X ran" registered before. Latency = from the moment the deciding record
(the trace's one record) is handed to the producer to the moment the score is read from the
scores topic by a consumer in that same process. Every verdict should be TRUE.

A load's figures only count as "at that load" if the producer achieved 95 % of it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from rich.console import Console
from rich.table import Table

from collector.bench import (
    RATE_TOLERANCE,
    TARGET_P99_MS,
    TRACE_SPANS,
    Rig,
    _service,
    bench_topics,
    latency_at,
    make_traces,
    on_rig,
)
from collector.benches.common import CpuMeter, Target, busy_text, consoles, emit, new_progress, task

__all__ = ["TARGET_RATE", "run_verdict_latency_bench"]

#: the load the target is stated at: p99 < 100 ms at 5,000 spans/s.
TARGET_RATE = 5000


async def _run(rig: Rig, rates: Sequence[int], seconds: float, err: Console) -> dict[str, Any]:
    cfg = rig.config()
    progress = new_progress(err)
    redis = Redis.from_url(cfg.redis.url)
    loads = []
    try:
        with progress:
            await bench_topics(cfg)
            async with _service(cfg) as svc:
                for rate in rates:
                    n = max(2, round(rate * seconds / TRACE_SPANS))
                    _, adv = task(progress, f"generate {n:,} traces", n)
                    traces = make_traces(n, on_trace=functools.partial(adv, 1))
                    cpu = CpuMeter(cfg.kafka.bootstrap_servers, cfg.redis.url)
                    usage: dict[str, Any] = {}
                    with cpu.window(usage):
                        lat = await latency_at(cfg, svc, redis, traces, rate, progress, seconds=seconds)
                    lat["cpu"] = usage
                    loads.append(lat)
    finally:
        await redis.aclose()
    return {"cpus": os.cpu_count() or 0, "seconds_per_load": seconds, "loads": loads}


def _at_target(report: dict[str, Any]) -> dict[str, Any]:
    loads = report["loads"]
    exact = [x for x in loads if x["target_rate"] == TARGET_RATE]
    return exact[0] if exact else max(loads, key=lambda x: x["target_rate"])


def _targets(report: dict[str, Any]) -> list[Target]:
    lat = _at_target(report)
    rate = lat["target_rate"]
    all_true = lat["statuses"] == {"SCORE_STATUS_TRUE": lat["traces"]}
    return [
        Target(
            f"time-to-verdict p99 (TRUE) at {rate:,} spans/s",
            f"< {TARGET_P99_MS:.0f} ms (achieved >= {RATE_TOLERANCE:.0%} of rate, every verdict read and TRUE)",
            f"{lat['p99_ms']:.1f} ms at {lat['achieved_rate']:,.0f} spans/s, {lat['missing']} missing",
            lat["p99_ms"] < TARGET_P99_MS
            and lat["achieved_rate"] >= RATE_TOLERANCE * rate
            and lat["missing"] == 0
            and all_true,
        )
    ]


def _table(report: dict[str, Any], targets: Sequence[Target]) -> Table:
    t = Table(
        title=f"toolwitness bench verdict-latency — one run, {report['seconds_per_load']:.0f} s per load, "
        f"{report['cpus']} CPUs; deciding record produced → score read"
    )
    for col, right in (
        ("load (spans/s)", True),
        ("achieved", True),
        ("p50 ms", True),
        ("p95 ms", True),
        ("p99 ms", True),
        ("max ms", True),
        ("detail", False),
    ):
        t.add_column(col, justify="right" if right else "left")
    for x in report["loads"]:
        t.add_row(
            f"{x['target_rate']:,}",
            f"{x['achieved_rate']:,.0f}",
            f"{x['p50_ms']:.1f}",
            f"{x['p95_ms']:.1f}",
            f"{x['p99_ms']:.1f}",
            f"{x['max_ms']:.1f}",
            f"{x['verdicts']:,} read, {x['missing']} missing, {x['statuses']}; CPU {busy_text(x['cpu'])}",
        )
    if targets:
        t.add_section()
        for tg in targets:
            t.add_row(
                f"target: {tg.name}",
                "",
                "",
                "",
                "[green]met[/]" if tg.met else "[red]MISSED[/]",
                "",
                f"{tg.value} (target {tg.target})",
            )
    return t


async def run_verdict_latency_bench(
    *,
    rates: Sequence[int] = (1000, 2500, TARGET_RATE),
    seconds: float = 10.0,
    as_json: bool = False,
    bootstrap: str | None = None,
    redis_url: str | None = None,
) -> int:
    """Run the verdict-latency benchmark; print one table (or JSON). Exit: 0 met, 1 missed, 2 failed."""
    if not rates or min(rates) < TRACE_SPANS or seconds <= 0:
        raise ValueError(f"need rates >= {TRACE_SPANS} spans/s and seconds > 0")
    out, err = consoles()
    report = await on_rig(
        "verdict-latency", bootstrap, redis_url, err, lambda rig: _run(rig, sorted(rates), seconds, err)
    )
    if report is None:
        return 2
    targets = _targets(report)
    return emit(report, targets, _table(report, targets), as_json, out)
