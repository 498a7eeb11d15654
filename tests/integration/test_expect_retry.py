"""``expect`` retried with the same id (its docstring's advice after a TimeoutError) is taken once;
the same id sent again after a cancel, or with another definition, still goes to the DLQ."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

from scoring.models import TraceScorable
from tests.integration.harness import (
    control_client,
    expectation_bytes,
    expects,
    header,
    make_config,
    new_span_id,
    new_trace_id,
    otlp_request,
    otlp_span,
    raw_producer,
    read_all,
    read_until,
    running_service,
    running_service_prepared,
    send_spans,
    settled,
    verdict,
)

pytestmark = pytest.mark.integration


async def test_a_retried_registration_is_taken_once_and_a_reuse_after_cancel_is_refused(
    kafka_bootstrap: str, redis_url: str
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    t0 = int(time.time() * 1000) - 5_000
    trace, root = new_trace_id(), new_span_id()
    scope = TraceScorable(trace_ids=(trace,))
    async with running_service(cfg) as service, control_client(cfg) as tw, raw_producer(cfg) as producer:
        # pending: the retry comes before any span
        first = await tw.expect(scope, expects("search"), expectation_id="retried", deadline=timedelta(seconds=60))
        await settled(service, "default", first)
        again = await tw.expect(scope, expects("search"), expectation_id="retried", deadline=timedelta(seconds=60))
        assert again == first
        req = otlp_request(
            [
                otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50),
                otlp_span(trace, parent=root, tool="search", start_ms=t0 + 1, end_ms=t0 + 2),
            ]
        )
        await producer.send_and_wait(cfg.kafka.topics.spans, req.SerializeToString(), key=trace.encode())
        assert verdict(await tw.wait_for("retried", timeout=30)) == "true"
        # decided: a retry now is the same registration too (its score already answers it)
        await tw.expect(scope, expects("search"), expectation_id="retried")
        await settled(service, "default", "retried")

        # cancelled while pending, then sent again: it would never be scored -- dead-lettered
        quiet = TraceScorable(trace_ids=(new_trace_id(),))  # no spans: it stays pending
        await tw.expect(quiet, expects("search"), expectation_id="cancelled", deadline=timedelta(seconds=60))
        await settled(service, "default", "cancelled")
        await tw.cancel("cancelled")
        await tw.expect(quiet, expects("search"), expectation_id="cancelled", deadline=timedelta(seconds=60))
        dlq = await read_until(kafka_bootstrap, cfg.kafka.topics.dlq, lambda recs: len(recs) >= 1)
        assert [header(r, "toolwitness-dlq-reason") for r in dlq] == ["expectation_id_reused"]
        assert dlq[0].key == b"cancelled"
        assert "cancelled or decided" in (header(dlq[0], "toolwitness-dlq-detail") or "")
        # the retries of "retried" produced one score and no dead letter
        scores = [r for r in await read_all(kafka_bootstrap, cfg.kafka.topics.scores) if r.key == b"default/retried"]
        assert len(scores) == 1


async def test_a_registration_cut_between_storing_and_indexing_is_indexed_by_its_replay(
    kafka_bootstrap: str, redis_url: str
) -> None:
    # The process died (here: Redis dropped the connection) after the definition was stored and
    # before it was indexed: the replayed record found an identical definition, no deadline, and
    # took it as registered: the expectation was never decided, not even at its deadline.
    from redis.exceptions import ConnectionError as RedisConnectionError

    cfg = make_config(kafka_bootstrap, redis_url)
    t0 = int(time.time() * 1000) - 5_000
    trace, root = new_trace_id(), new_span_id()
    async with running_service(cfg) as service, control_client(cfg) as tw, raw_producer(cfg) as producer:
        real_index = service.store.index_expectations
        cut: list[int] = []

        async def index_cut_once(exps: Any) -> None:
            if not cut:
                cut.append(1)
                raise RedisConnectionError("injected: connection lost after the definition was stored")
            await real_index(exps)

        service.store.index_expectations = index_cut_once  # type: ignore[method-assign]
        ident = await tw.expect(TraceScorable(trace_ids=(trace,)), expects("search"), deadline=timedelta(seconds=60))
        await send_spans(
            producer,
            cfg,
            trace,
            otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50),
            otlp_span(trace, parent=root, tool="search", start_ms=t0 + 1, end_ms=t0 + 2),
        )
        ev = await tw.wait_for(ident, timeout=30)
    assert cut and verdict(ev) == "true", ev.rationale


async def test_expectations_registered_together_in_one_batch_are_judged_each_as_alone(
    kafka_bootstrap: str, redis_url: str
) -> None:
    """Consecutive expectation records of a batch are stored and indexed in two round trips for
    the whole run; each is still judged in its order: a refused one among them dead-letters alone,
    the same id again is a retry (taken once) or a reuse (dead-lettered), and a cancel that follows
    its expectation cancels it."""
    from collector.wire.gen import control_pb2

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
