"""An expectation registered while the sweeper consumes its trace's watermark wait.

A trace complete by the watermark (inferred from its root's end, or a marker without a count)
is queued to wait for the watermark; the sweeper takes it off that queue when the watermark
passes and judges what is pending on the trace. A batch reads the watermark before it
registers its expectations: when the sweeper consumed the wait in between (a newer
watermark, nothing pending yet), the new expectation was judged on the older watermark,
stayed undecided, and nothing woke it again before its deadline -- an UNDETERMINED where
the evidence said FALSE. (It failed CI as a "flaky" test under load.)
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from collector.pipeline.service import ToolwitnessService
from collector.processors.trace_state import SESSION_WAIT, member
from scoring.models import SessionScorable, TraceScorable
from tests.integration.harness import (
    control_client,
    expects,
    make_config,
    new_span_id,
    new_trace_id,
    otlp_span,
    raw_producer,
    running_service_prepared,
    send_spans,
    until,
    verdict,
)

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("mode", ["inferred", "marker", "session"])
async def test_an_expectation_registered_as_its_traces_wait_is_consumed_is_still_judged_at_the_watermark(
    kafka_bootstrap: str, redis_url: str, mode: str
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url, completion={"mode": "inferred" if mode == "inferred" else "marker"})
    t0 = int(time.time() * 1000)
    trace, root, session = new_trace_id(), new_span_id(), f"s-{new_span_id()}"
    # what waits for the watermark: the trace, or (a session marker) the session's trace set
    waiting = member("default", SESSION_WAIT + session if mode == "session" else trace)
    seen: dict[str, Any] = {}

    def prepare(service: ToolwitnessService) -> None:
        original = service.store.register

        async def register(exp: Any) -> bool:
            # This batch read its watermark already; let the sweeper take the trace's wait off
            # the queue before the expectation is stored (the window the race needs).
            async with Redis.from_url(redis_url) as r:

                async def consumed() -> bool:
                    # the poll loop, busy with this batch, cannot share its partitions' progress
                    await service.watermarks.publish(await service.receiver.span_partitions_caught_up())
                    return await r.zscore(service.store.k.await_watermark, waiting) is None

                await until(consumed, timeout=30)
            seen["consumed_first"] = True
            return await original(exp)

        service.store.register = register  # type: ignore[method-assign]

    async with (
        Redis.from_url(redis_url) as r,
        running_service_prepared(cfg, prepare) as service,
        control_client(cfg) as tw,
        raw_producer(cfg) as producer,
    ):
        await send_spans(
            producer,
            cfg,
            trace,
            otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50, attrs={"session.id": session}),
            otlp_span(trace, parent=root, tool="search", start_ms=t0 + 1, end_ms=t0 + 2),
        )
        if mode == "marker":
            await tw.mark_complete(trace)  # without a count: complete when the watermark passes it
        elif mode == "session":
            await tw.mark_complete(trace, span_count=2)
            await tw.mark_session_complete(session)  # its trace set: complete when the watermark passes it
        # queued to wait for the watermark (its root ended / its marker came) before the expectation
        await until(lambda: r.zscore(service.store.k.await_watermark, waiting))
        scope = SessionScorable(session_id=session) if mode == "session" else TraceScorable(trace_ids=(trace,))
        ident = await tw.expect(scope, expects("delete_db"), deadline=timedelta(seconds=90))
        ev = await tw.wait_for(ident, timeout=30)  # it waited for the deadline (90 s) before
        assert seen.get("consumed_first") is True
        assert verdict(ev) == "false", ev.rationale
        assert ev.trigger == "watermark" and ev.coverage.complete
