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

