"""Crash and restart (issue 4 acceptance 5): no score lost, none contradicted.

1. The deployed form: ``toolwitness run --config FILE`` as a subprocess, ``kill -9`` while
   expectations are pending (right after the first K scores arrived), restart with the same
   config and consumer group. Every expectation ends with exactly one distinct score_id and
   the right verdict; re-sent events are byte-identical (counted, and reported).
2. A crash at each step of the commit protocol (collector/pipeline/checkpoint.py), made
   deterministic in-process: the batch is aborted at that step, the instance is abandoned
   without committing (its sweeper stopped first, as if the process had died), and a fresh
   instance replays from the last committed offset.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from collector.config import ServiceConfig
from collector.pipeline.service import ToolwitnessService
from collector.processors.trace_state import Keys, TraceState
from scoring.models import TraceScorable
from tests.integration.harness import (
    assert_exactly_once,
    expectation_bytes,
    expects,
    fail_on_timeout,
    make_config,
    marker_bytes,
    new_trace_id,
    open_stack,
    running_service,
    service_and_task,
    service_process,
    until,
    verdict,
    whole_trace,
)

pytestmark = pytest.mark.integration

PER_KIND = 10  # TRUE, FALSE-after-marker and UNDETERMINED-at-deadline expectations each
KILL_AFTER = 8  # scores seen before the kill


def trace_record(trace_id: str, t0_ms: int) -> tuple[bytes, int]:
    """One OTLP record holding a whole trace: root, a chat span and a ``search`` execution."""
    req, count = whole_trace(trace_id, t0_ms)
    return req.SerializeToString(), count


async def _decisions_at_kill(cfg: ServiceConfig, ids: Iterable[str]) -> tuple[int, int]:
    """(decided, decided but not marked published) in Redis, read with the service's own key layout."""
    redis: Redis = Redis.from_url(cfg.redis.url)
    try:
        keys = Keys(cfg.redis.key_prefix)
        flags = [await redis.hget(keys.decision("default", e), "pub") for e in ids]
    finally:
        await redis.aclose()
    return sum(f is not None for f in flags), sum(f == b"0" for f in flags)


async def test_kill_9_mid_run_and_restart(kafka_bootstrap: str, redis_url: str, tmp_path: Path) -> None:
    started = time.monotonic()
    cfg = make_config(kafka_bootstrap, redis_url, log_level="INFO")
    t0 = int(time.time() * 1000) - 30_000
    kinds = ("true", "false", "undetermined")
    traces = {kind: [new_trace_id() for _ in range(PER_KIND)] for kind in kinds}
    expected: dict[str, str] = {}
    async with open_stack(cfg) as s, service_process(cfg, tmp_path) as proc:
        await proc.start()
        topics = s.topics
        counts: dict[str, int] = {}
        spans: list[tuple[str, bytes]] = []
        for i, kind in enumerate(kinds):
            for j, trace_id in enumerate(traces[kind]):
                value, counts[trace_id] = trace_record(trace_id, t0 + 100 * (i * PER_KIND + j))
                spans.append((trace_id, value))
        await s.send(topics.spans, spans)
        # Expectations interleaved by kind; UNDETERMINED ones have a short deadline and no marker.
        control: list[tuple[str, bytes]] = []
        for j in range(PER_KIND):
            for kind in kinds:
                eid = f"{kind}-{j}"
                expected[eid] = kind
                names = ("search",) if kind == "true" else ("delete_db",)
                deadline = timedelta(seconds=6 if kind == "undetermined" else 120)
                control.append((eid, expectation_bytes(eid, [traces[kind][j]], expects(*names), deadline=deadline)))
        # Half of the FALSE traces are declared complete now, the other half while the service is down.
        control += [(t, marker_bytes(t, counts[t])) for t in traces["false"][: PER_KIND // 2]]
        await s.send(topics.control, control)

        with fail_on_timeout(lambda: f"no {KILL_AFTER} scores before the kill; service log:\n{proc.log_tail()}"):
            await until(lambda: s.received(expected) >= KILL_AFTER, timeout=45, interval=0.005)
        rc = await proc.kill()
        at_kill = s.received(expected)
        killed_at = time.monotonic()
        assert rc == -9
        assert at_kill < len(expected), "the kill must land while expectations are pending"
        decided, unpublished = await _decisions_at_kill(cfg, expected)

        await s.send(topics.control, [(t, marker_bytes(t, counts[t])) for t in traces["false"][PER_KIND // 2 :]])

        await proc.start()  # same config, same consumer group
        with fail_on_timeout(lambda: f"missing scores after restart: {s.missing(expected)}; service log:\n"
                                     f"{proc.log_tail()}"):
            await until(lambda: s.received(expected) > at_kill, timeout=45)
            first_after_restart = time.monotonic() - killed_at
            await s.all_scored(expected, timeout=45)
        for eid, ev in s.only_events(expected).items():
            want = expected[eid]
            assert verdict(ev) == want and ev.version == 1, (eid, ev)
            if want == "undetermined":
                assert ev.trigger == "deadline"
        duplicates = s.tw.duplicates
        assert await proc.stop() == 0, proc.log_tail()
        resent = assert_exactly_once(await s.scores(), expected)
        assert resent == duplicates
        print(
            f"\n[crash] {len(expected)} expectations; kill -9 after {at_kill} scores (in Redis at the kill: "
            f"{decided} decided, {unpublished} of them not yet marked published); first score after restart "
            f"{first_after_restart:.1f}s after the kill; re-sent identical events={resent} "
            f"(client duplicates={duplicates}); {time.monotonic() - started:.1f}s"
        )


# ------------------------------------------------------------------------------------------------
# A crash at each step of the commit protocol, deterministically
# ------------------------------------------------------------------------------------------------


class Crash(Exception):
    """The process dies here (not a RETRIABLE error: nothing in the service catches it)."""


def arm(service: ToolwitnessService, step: str) -> None:
    """Make the first batch holding control records die at ``step``; the sweeper dies with it
    (as in a real crash) and nothing after the step runs (no produce, no mark, no commit)."""
    state = {"target": False, "fired": False}
    control = service.cfg.kafka.topics.control
    process = service.checkpoint.process

    async def checkpoint(batch: Any) -> Any:
        if not state["fired"] and any(tp.topic == control for tp in batch):
            state["target"] = True
        return await process(batch)

    service.checkpoint.process = checkpoint  # type: ignore[method-assign]

    def crash() -> None:
        state["fired"] = True
        if service._sweeper is not None:
            service._sweeper.cancel()
        raise Crash(step)

    def hook(obj: Any, name: str, *, after: bool) -> None:
        original: Callable[..., Awaitable[Any]] = getattr(obj, name)

        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not after and state["target"] and not state["fired"]:
                crash()
            result = await original(*args, **kwargs)
            if after and state["target"] and not state["fired"]:
                crash()
            return result

        setattr(obj, name, wrapper)

    if step == "after_apply":  # spans applied to Redis, expectations not registered yet
        hook(service.store, "apply", after=True)
    elif step == "after_register":  # expectations registered, markers recorded, nothing decided
        hook(service.engine, "evaluate", after=False)
    elif step == "after_first_decide":  # the first decision compare-and-set, nothing produced
        hook(service.exporter, "send_observation", after=False)
    elif step == "after_produce":  # every event delivered, not marked published
        hook(service.store, "mark_published", after=False)
    elif step == "before_commit":  # marked published, offsets not committed
        assert service.consumer is not None
        hook(service.consumer, "commit", after=False)
    else:
        raise ValueError(step)


STEPS = ("after_apply", "after_register", "after_first_decide", "after_produce", "before_commit")


async def _span_count(service: ToolwitnessService, trace_id: str) -> int:
    raw = await service.redis.get(service.store.k.state("default", trace_id))
    return 0 if raw is None else TraceState.from_json(raw).span_count


async def _all_published(service: ToolwitnessService, ids: Iterable[str]) -> bool:
    for eid in ids:
        d = await service.store.get_decision("default", eid)
        if d is None or not d.published:
            return False
    return True


async def test_crash_at_each_commit_step_then_replay(kafka_bootstrap: str, redis_url: str) -> None:
    started = time.monotonic()
    cfg: ServiceConfig = make_config(kafka_bootstrap, redis_url)
    t0 = int(time.time() * 1000) - 30_000
    expected: dict[str, str] = {}
    report: dict[str, int] = {}
    async with open_stack(cfg) as s:
        topics = s.topics
        for n, step in enumerate(STEPS):
            early_true, early_false, late_true = new_trace_id(), new_trace_id(), new_trace_id()
            async with service_and_task(cfg) as (service, run_task):
                # Spans of two traces, consumed and committed before the crash round.
                counts = {}
                for trace_id in (early_true, early_false):
                    value, counts[trace_id] = trace_record(trace_id, t0 + 1000 * n)
                    await s.producer.send_and_wait(topics.spans, value=value, key=trace_id.encode())
                for trace_id in (early_true, early_false):
                    await until(lambda t=trace_id: _span_count(service, t))  # type: ignore[misc]
                async with service.batch_lock:
                    pass
                arm(service, step)
                # The crash round, produced while consumption is paused so that it is one batch:
                # spans of a third trace, expectations on all three traces, a marker.
                assert service.consumer is not None
                service.consumer.pause(*service.consumer.assignment())
                value, counts[late_true] = trace_record(late_true, t0 + 1000 * n + 500)
                ids = {f"{step}-early-true": early_true, f"{step}-early-false": early_false,
                       f"{step}-late-true": late_true}
                control = []
                for eid, trace_id in ids.items():
                    names = ("delete_db",) if "false" in eid else ("search",)
                    control.append((eid, expectation_bytes(eid, [trace_id], expects(*names))))
                    expected[eid] = "false" if "false" in eid else "true"
                control.append((early_false, marker_bytes(early_false, counts[early_false])))
                await s.send(topics.spans, [(late_true, value)])
                await s.send(topics.control, control)
                service.consumer.resume(*service.consumer.assignment())
                with contextlib.suppress(Crash, TimeoutError):
                    async with asyncio.timeout(30):
                        await asyncio.shield(run_task)
                assert run_task.done() and isinstance(run_task.exception(), Crash), step
            # A fresh instance (empty caches) replays from the last committed offset.
            async with running_service(cfg) as fresh:
                lost = f"{step}: missing after replay"
                with fail_on_timeout(lambda what=lost, i=ids: f"{what}: {s.missing(i)}"):  # type: ignore[misc]
                    await s.all_scored(ids, timeout=30)
                # ... and whatever was decided but not marked published is re-sent and marked.
                await until(lambda svc=fresh, i=ids: _all_published(svc, i), timeout=20)  # type: ignore[misc]
            report[step] = s.tw.duplicates - sum(report.values())
        for eid, ev in s.only_events(expected).items():
            assert ev.version == 1, (eid, ev)
            assert verdict(ev) == expected[eid], (eid, ev)
        resent = assert_exactly_once(await s.scores(), expected)
        print(f"\n[crash-steps] re-sent identical events per crash step {report} (total {resent}); "
              f"{time.monotonic() - started:.1f}s")


async def test_sweeper_dies_after_claiming_a_deadline(kafka_bootstrap: str, redis_url: str) -> None:
    """The sweeper claims due deadlines, then the process dies before deciding them: a later
    sweep (here: of a fresh instance) must still publish the UNDETERMINED score."""
    started = time.monotonic()
    cfg = make_config(kafka_bootstrap, redis_url)
    t0 = int(time.time() * 1000) - 30_000
    async with open_stack(cfg) as s:
        trace_id = new_trace_id()
        value, _ = trace_record(trace_id, t0)
        await s.producer.send_and_wait(s.topics.spans, value=value, key=trace_id.encode())
        async with service_and_task(cfg) as (service, _task):
            claimed: list[Any] = []
            service.store.claim_lease_ms = 1500  # type: ignore[attr-defined]
            evaluate = service.engine.evaluate

            async def no_unclaim(*args: Any, **kwargs: Any) -> None:  # nothing runs after the crash
                return None

            async def dying_evaluate(work: Any, watermark: int) -> Any:
                if work.final:
                    claimed.extend(work.final)
                    if service._sweeper is not None:
                        service._sweeper.cancel()
                    raise Crash("sweeper")
                return await evaluate(work, watermark)

            service.store.unclaim = no_unclaim  # type: ignore[method-assign]
            service.engine.evaluate = dying_evaluate  # type: ignore[method-assign]
            eid = await s.tw.expect(TraceScorable(trace_ids=(trace_id,)), expects("delete_db"),
                                    deadline=timedelta(seconds=1))
            await until(lambda: claimed, timeout=30)
        assert s.tw.events(eid) == []
        async with running_service(cfg):
            with fail_on_timeout(lambda: "the claimed deadline was lost with the sweeper that claimed it"):
                ev = await s.tw.wait_for(eid, timeout=30)
        assert verdict(ev) == "undetermined" and ev.trigger == "deadline"
        assert len(s.tw.events(eid)) == 1
        print(f"\n[crash-sweeper] claimed deadline re-claimed after the lease; {time.monotonic() - started:.1f}s")
