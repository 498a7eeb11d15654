"""Control records taken together: consecutive expectations of a batch are stored and indexed in
two Redis round trips, consecutive trace markers recorded in one, whatever their number; each is
still judged as if it came alone, in its order."""

from __future__ import annotations

import time
from typing import Any

import pytest

from collector.wire.gen import control_pb2
from tests.integration.harness import (
    TOOL_TREES,
    control_client,
    expectation_bytes,
    expects,
    header,
    make_config,
    marker_bytes,
    new_span_id,
    new_trace_id,
    otlp_span,
    raw_producer,
    read_all,
    read_until,
    running_service_prepared,
    send_spans,
    verdict,
)

pytestmark = pytest.mark.integration


async def test_expectations_registered_together_in_one_batch_are_judged_each_as_alone(
    kafka_bootstrap: str, redis_url: str
) -> None:
    """Consecutive expectation records of a batch are stored and indexed in two round trips for
    the whole run; each is still judged in its order: a refused one among them dead-letters alone,
    the same id again is a retry (taken once) or a reuse (dead-lettered), and a cancel that follows
    its expectation cancels it."""
    cfg = make_config(kafka_bootstrap, redis_url)
    t0 = int(time.time() * 1000) - 5_000
    trace, root = new_trace_id(), new_span_id()
    first, cancelled, second = f"first-{trace}", f"cancelled-{trace}", f"second-{trace}"
    cancel = control_pb2.ControlMessage(cancel=control_pb2.CancelExpectation(expectation_id=cancelled))
    # one key: one partition, so the records keep this order in the batch
    run = [
        expectation_bytes(first, [trace], expects("search")),
        expectation_bytes(f"unknown-{trace}", [trace], expects("search"), scorer="no-such-tree"),
        expectation_bytes(first, [trace], expects("search")),  # a retry of the first
        expectation_bytes(first, [trace], expects("fetch")),  # another definition under its id
        expectation_bytes(cancelled, [trace], expects("search")),
        cancel.SerializeToString(),
        expectation_bytes(second, [trace], expects("fetch")),
    ]
    sizes: list[int] = []

    def watch(service: Any) -> None:
        real = service.store.register_many

        async def register_many(exps: Any) -> Any:
            sizes.append(len(exps))
            return await real(exps)

        service.store.register_many = register_many

    async with raw_producer(cfg) as producer:
        # produced before the service starts: its first poll takes them together
        for value in run:
            await producer.send_and_wait(cfg.kafka.topics.control, value, key=trace.encode())
        async with running_service_prepared(cfg, watch) as service, control_client(cfg) as tw:
            await send_spans(
                producer,
                cfg,
                trace,
                otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50),
                otlp_span(trace, parent=root, tool="search", start_ms=t0 + 1, end_ms=t0 + 2),
                otlp_span(trace, parent=root, tool="fetch", start_ms=t0 + 3, end_ms=t0 + 4),
            )
            assert verdict(await tw.wait_for(first, timeout=30)) == "true"
            assert verdict(await tw.wait_for(second, timeout=30)) == "true"
            assert not await service.store.undecided("default", cancelled)
            assert await service.store.get_decision("default", cancelled) is None
    assert sizes and sizes[0] == 4, sizes  # the four expectations before the cancel, in one call
    dlq = await read_until(kafka_bootstrap, cfg.kafka.topics.dlq, lambda recs: len(recs) >= 2)
    assert [header(r, "toolwitness-dlq-reason") for r in dlq] == ["unknown_scorer", "expectation_id_reused"]
    scores = await read_all(kafka_bootstrap, cfg.kafka.topics.scores)
    keys = sorted(r.key for r in scores if r.key is not None)
    assert keys == sorted([f"default/{first}".encode(), f"default/{second}".encode()])


async def test_completion_markers_recorded_together_in_one_batch_each_complete_their_trace(
    kafka_bootstrap: str, redis_url: str
) -> None:
    """Consecutive trace markers of a batch are recorded in one round trip: a refused one among
    them dead-letters alone, a marker sent twice is one claim, and each trace it completes has its
    absence judged (and its decided state reclaimed)."""
    cfg = make_config(kafka_bootstrap, redis_url, scorers=TOOL_TREES)
    t0 = int(time.time() * 1000) - 5_000
    t1, t2, root1, root2 = new_trace_id(), new_trace_id(), new_span_id(), new_span_id()
    never1, never2 = f"never-delete-{t1}", f"never-delete-{t2}"
    sizes: list[int] = []

    def watch(service: Any) -> None:
        real = service.store.mark_complete_many

        async def mark_complete_many(markers: Any, *args: Any, **kwargs: Any) -> Any:
            sizes.append(len(markers))
            return await real(markers, *args, **kwargs)

        service.store.mark_complete_many = mark_complete_many

    async with raw_producer(cfg) as producer:
        for ident, trace in ((never1, t1), (never2, t2)):
            exp = expectation_bytes(ident, [trace], expects("delete"), scorer="not_tools")
            await producer.send_and_wait(cfg.kafka.topics.control, exp, key=b"one-partition")
        for trace, root in ((t1, root1), (t2, root2)):
            await send_spans(
                producer,
                cfg,
                trace,
                otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50),
                otlp_span(trace, parent=root, tool="search", start_ms=t0 + 1, end_ms=t0 + 2),
            )
        # produced before the service starts: its first poll takes them together, after the spans
        # were produced (they may still be applied in a later batch: a marker waits for its count)
        for value in (marker_bytes("not-a-trace-id", 2), marker_bytes(t1, 2), marker_bytes(t1, 2), marker_bytes(t2, 2)):
            await producer.send_and_wait(cfg.kafka.topics.control, value, key=b"one-partition")
        async with running_service_prepared(cfg, watch), control_client(cfg) as tw:
            a = await tw.wait_for(never1, timeout=30)
            b = await tw.wait_for(never2, timeout=30)
    assert (verdict(a), verdict(b)) == ("true", "true"), (a.rationale, b.rationale)
    assert a.coverage.complete and b.coverage.complete
    assert sizes and sizes[0] == 3, sizes  # the three well-formed markers, in one call
    dlq = await read_until(kafka_bootstrap, cfg.kafka.topics.dlq, lambda recs: len(recs) >= 1)
    assert [header(r, "toolwitness-dlq-reason") for r in dlq] == ["invalid_marker"]
