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
from collector.wire.convert import decode_score_event
from scoring.models import TraceScorable
from tests.integration.harness import (
    ServiceProcess,
    control_client,
    drop_stack,
    expectation_bytes,
    expects,
    make_config,
    marker_bytes,
    new_span_id,
    new_trace_id,
    otlp_request,
    otlp_span,
    raw_producer,
    read_all,
    running_service,
    scores_by_id,
    service_and_task,
    until,
    verdict,
    write_config,
)

pytestmark = pytest.mark.integration

PER_KIND = 10  # TRUE, FALSE-after-marker and UNDETERMINED-at-deadline expectations each
KILL_AFTER = 8  # scores seen before the kill


def trace_record(trace_id: str, t0_ms: int, tool: str = "search") -> tuple[bytes, int]:
    """One OTLP record holding a whole trace: root, a chat span and a tool execution."""
    root = new_span_id()
    spans = [
        otlp_span(trace_id, span_id=root, name="agent", start_ms=t0_ms, end_ms=t0_ms + 500),
        otlp_span(trace_id, parent=root, name="chat", start_ms=t0_ms + 1, end_ms=t0_ms + 20,
                  attrs={"gen_ai.operation.name": "chat"}),
        otlp_span(trace_id, parent=root, name=f"execute_tool {tool}", tool=tool, start_ms=t0_ms + 30,
                  end_ms=t0_ms + 60),
    ]
    return otlp_request(spans).SerializeToString(), len(spans)


def check_exactly_once(records: list[Any], expected: dict[str, str]) -> int:
    """Raw scores topic: one score_id per expectation, right verdict, re-sends identical. Returns re-sends."""
    by_id = scores_by_id(records)
    per_expectation: dict[str, set[str]] = {}
    for sid, payloads in by_id.items():
        assert all(p == payloads[0] for p in payloads), f"{sid}: re-sent events differ"
        ev = decode_score_event(payloads[0])
        assert ev.version == 1, ev
        assert verdict(ev) == expected[ev.expectation_id], (ev.expectation_id, ev)
        per_expectation.setdefault(ev.expectation_id, set()).add(sid)
    assert set(per_expectation) == set(expected), set(expected) ^ set(per_expectation)
    assert all(len(s) == 1 for s in per_expectation.values())
    return sum(len(p) - 1 for p in by_id.values())


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
    proc = ServiceProcess(write_config(cfg, tmp_path / "toolwitness.yaml"), tmp_path / "service.log")
    t0 = int(time.time() * 1000) - 30_000
    kinds = ("true", "false", "undetermined")
    traces = {kind: [new_trace_id() for _ in range(PER_KIND)] for kind in kinds}
    expected: dict[str, str] = {}
    try:
        async with control_client(cfg) as tw, raw_producer(cfg) as producer:
            await proc.start()
            topics = cfg.kafka.topics
            counts: dict[str, int] = {}
            for i, kind in enumerate(kinds):
                for j, trace_id in enumerate(traces[kind]):
                    value, counts[trace_id] = trace_record(trace_id, t0 + 100 * (i * PER_KIND + j))
                    await producer.send(topics.spans, value=value, key=trace_id.encode())
            await producer.flush()
            # Expectations interleaved by kind; UNDETERMINED ones have a short deadline and no marker.
            for j in range(PER_KIND):
                for kind in kinds:
                    eid = f"{kind}-{j}"
                    expected[eid] = kind
                    names = ("search",) if kind == "true" else ("delete_db",)
                    deadline = timedelta(seconds=6 if kind == "undetermined" else 120)
                    value = expectation_bytes(eid, [traces[kind][j]], expects(*names), deadline=deadline)
                    await producer.send(topics.control, value=value, key=eid.encode())
            # Half of the FALSE traces are declared complete now, the other half while the service is down.
            for trace_id in traces["false"][: PER_KIND // 2]:
                await producer.send(topics.control, value=marker_bytes(trace_id, counts[trace_id]),
                                    key=trace_id.encode())
            await producer.flush()

            def received() -> int:
                return sum(1 for e in expected if tw.events(e))

            try:
                await until(lambda: received() >= KILL_AFTER, timeout=45, interval=0.005)
            except TimeoutError:
                pytest.fail(f"no {KILL_AFTER} scores before the kill; service log:\n{proc.log_tail()}")
            rc = await proc.kill()
            at_kill = received()
            killed_at = time.monotonic()
            assert rc == -9
            assert at_kill < len(expected), "the kill must land while expectations are pending"
            decided, unpublished = await _decisions_at_kill(cfg, expected)

            for trace_id in traces["false"][PER_KIND // 2 :]:
                await producer.send(topics.control, value=marker_bytes(trace_id, counts[trace_id]),
                                    key=trace_id.encode())
            await producer.flush()

            await proc.start()  # same config, same consumer group
            try:
                await until(lambda: received() > at_kill, timeout=45)
                first_after_restart = time.monotonic() - killed_at
                await asyncio.gather(*[tw.wait_for(e, timeout=45) for e in expected])
            except TimeoutError:
                missing = [e for e in expected if not tw.events(e)]
                pytest.fail(f"missing scores after restart: {missing}; service log:\n{proc.log_tail()}")
            for eid, want in expected.items():
                events = tw.events(eid)
                assert len(events) == 1, f"{eid}: {len(events)} distinct score events"
                assert verdict(events[0]) == want and events[0].version == 1, (eid, events[0])
                if want == "undetermined":
                    assert events[0].trigger == "deadline"
            duplicates = tw.duplicates
            assert await proc.stop() == 0, proc.log_tail()
        resent = check_exactly_once(await read_all(kafka_bootstrap, cfg.kafka.topics.scores), expected)
        assert resent == duplicates
        print(
            f"\n[crash] {len(expected)} expectations; kill -9 after {at_kill} scores (in Redis at the kill: "
            f"{decided} decided, {unpublished} of them not yet marked published); first score after restart "
            f"{first_after_restart:.1f}s after the kill; re-sent identical events={resent} "
            f"(client duplicates={duplicates}); {time.monotonic() - started:.1f}s"
        )
    finally:
        await proc.stop()
        await drop_stack(cfg)


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
    try:
        async with control_client(cfg) as tw, raw_producer(cfg) as producer:
            topics = cfg.kafka.topics
            for n, step in enumerate(STEPS):
                early_true, early_false, late_true = new_trace_id(), new_trace_id(), new_trace_id()
                async with service_and_task(cfg) as (service, run_task):
                    # Spans of two traces, consumed and committed before the crash round.
                    counts = {}
                    for trace_id in (early_true, early_false):
                        value, counts[trace_id] = trace_record(trace_id, t0 + 1000 * n)
                        await producer.send_and_wait(topics.spans, value=value, key=trace_id.encode())
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
                    batch = [(topics.spans, late_true, value)]
                    for eid, trace_id in ids.items():
                        names = ("delete_db",) if "false" in eid else ("search",)
                        batch.append((topics.control, eid, expectation_bytes(eid, [trace_id], expects(*names))))
                        expected[eid] = "false" if "false" in eid else "true"
                    batch.append((topics.control, early_false, marker_bytes(early_false, counts[early_false])))
                    await asyncio.gather(*[await producer.send(t, value=v, key=k.encode()) for t, k, v in batch])
                    service.consumer.resume(*service.consumer.assignment())
                    with contextlib.suppress(Crash, TimeoutError):
                        async with asyncio.timeout(30):
                            await asyncio.shield(run_task)
                    assert run_task.done() and isinstance(run_task.exception(), Crash), step
                # A fresh instance (empty caches) replays from the last committed offset.
                async with running_service(cfg) as fresh:
                    try:
                        await asyncio.gather(*[tw.wait_for(e, timeout=30) for e in ids])
                    except TimeoutError:
                        pytest.fail(f"{step}: missing after replay: {[e for e in ids if not tw.events(e)]}")
                    # ... and whatever was decided but not marked published is re-sent and marked.
                    await until(lambda s=fresh, i=ids: _all_published(s, i), timeout=20)  # type: ignore[misc]
                report[step] = tw.duplicates - sum(report.values())
            for eid, want in expected.items():
                events = tw.events(eid)
                assert len(events) == 1 and events[0].version == 1, (eid, events)
                assert verdict(events[0]) == want, (eid, events[0])
        resent = check_exactly_once(await read_all(kafka_bootstrap, cfg.kafka.topics.scores), expected)
        print(f"\n[crash-steps] re-sent identical events per crash step {report} (total {resent}); "
              f"{time.monotonic() - started:.1f}s")
    finally:
        await drop_stack(cfg)


async def test_sweeper_dies_after_claiming_a_deadline(kafka_bootstrap: str, redis_url: str) -> None:
    """The sweeper claims due deadlines, then the process dies before deciding them: a later
    sweep (here: of a fresh instance) must still publish the UNDETERMINED score."""
    started = time.monotonic()
    cfg = make_config(kafka_bootstrap, redis_url)
    t0 = int(time.time() * 1000) - 30_000
    try:
        async with control_client(cfg) as tw, raw_producer(cfg) as producer:
            trace_id = new_trace_id()
            value, _ = trace_record(trace_id, t0)
            await producer.send_and_wait(cfg.kafka.topics.spans, value=value, key=trace_id.encode())
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
                eid = await tw.expect(TraceScorable(trace_ids=(trace_id,)), expects("delete_db"),
                                      deadline=timedelta(seconds=1))
                await until(lambda: claimed, timeout=30)
            assert tw.events(eid) == []
            async with running_service(cfg):
                try:
                    ev = await tw.wait_for(eid, timeout=30)
                except TimeoutError:
                    pytest.fail("the claimed deadline was lost with the sweeper that claimed it")
            assert verdict(ev) == "undetermined" and ev.trigger == "deadline"
            assert len(tw.events(eid)) == 1
        print(f"\n[crash-sweeper] claimed deadline re-claimed after the lease; {time.monotonic() - started:.1f}s")
    finally:
        await drop_stack(cfg)
