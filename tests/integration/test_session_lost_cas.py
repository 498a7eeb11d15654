"""A session decision whose settle never ran, found again by a lost compare-and-set (from a review).

The sweeper judged a session on its one trace ("delete never ran": TRUE on complete coverage) and
won the compare-and-set; its settle did not run (a crash). A second trace, which ran delete, then
joined the session. The retry judged two traces (FALSE), lost the compare-and-set and settled the
stored TRUE with its own count of traces: nothing new was seen, and the TRUE stood. What the stored
decision was judged on is unknown there: it is re-judged.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

from collector.pipeline.engine import Work
from collector.processors.trace_state import DecideRequest
from collector.wire.convert import encode
from scoring.models import SessionScorable
from tests.integration.harness import (
    TOOL_TREES,
    control_client,
    expects,
    make_config,
    new_span_id,
    new_trace_id,
    otlp_request,
    otlp_span,
    raw_producer,
    running_service,
    until,
)

pytestmark = pytest.mark.integration


async def test_a_lost_compare_and_set_re_judges_a_session_decision_it_settles(
    kafka_bootstrap: str, redis_url: str
) -> None:
    cfg = make_config(
        kafka_bootstrap, redis_url, scorers=TOOL_TREES, completion={"mode": "inferred", "sweep_interval_ms": 600_000}
    )
    session = "sess-" + new_trace_id()[:12]
    t0 = int(time.time() * 1000) - 5_000
    (t1, r1), (t2, r2) = (new_trace_id(), new_span_id()), (new_trace_id(), new_span_id())
    attrs = {"session.id": session}
    async with running_service(cfg) as service, control_client(cfg) as tw, raw_producer(cfg) as producer:
        engine, store = service.engine, service.store

        async def send(trace: str, *spans: Any) -> None:
            value = otlp_request(list(spans)).SerializeToString()
            await producer.send_and_wait(cfg.kafka.topics.spans, value, key=trace.encode())

        async def traces(n: int) -> bool:
            return len(await store.session_traces("default", session)) == n

        ident = await tw.expect(
            SessionScorable(session_id=session), expects("delete"), scorer="not_tools", deadline=timedelta(seconds=120)
        )
        key = ("default", ident)
        await send(
            t1,
            otlp_span(t1, span_id=r1, name="agent", start_ms=t0, end_ms=t0 + 50, attrs=attrs),
            otlp_span(t1, parent=r1, tool="search", start_ms=t0 + 1, end_ms=t0 + 2, attrs=attrs),
        )
        await until(lambda: traces(1), timeout=20)
        # complete by a watermark no batch reaches (the sweeper's, ahead of them)
        at = int(time.time() * 1000) + 3_600_000
        await store.redis.set(store.k.session_complete("default", session), at)
        wm = at + cfg.completion.allowed_lateness_ms + 1

        [won] = await engine.evaluate(Work(pending={key: "watermark"}), wm)
        request = DecideRequest(
            "default",
            ident,
            won.version,
            won.score_id,
            encode(won.event, engine.fmt),
            encode(won.observation, engine.fmt),
            won.verdict.value,
        )
        [d] = await store.decide_many([request])  # won; the settle never runs (the process dies)
        assert d.won and won.verdict.value == "true"

        await send(t2, otlp_span(t2, span_id=r2, name="agent", start_ms=t0 + 100, end_ms=t0 + 150, attrs=attrs))
        await until(lambda: traces(2), timeout=20)
        await send(t2, otlp_span(t2, parent=r2, tool="delete", start_ms=t0 + 101, end_ms=t0 + 102, attrs=attrs))

        async def delete_applied() -> bool:
            raw = await store.redis.get(store.k.state("default", t2))
            return raw is not None and b"delete" in raw

        await until(delete_applied, timeout=20)
        # The retry: it judges two traces (FALSE) and loses the compare-and-set to the stored TRUE.
        # (The batch that applied the span may have been first: it judges the session's pending
        # expectations too, and loses the same way.) Either way the stored TRUE, judged on one
        # trace, is judged again and revised.
        async with service.batch_lock:
            [lost] = await engine.evaluate(Work(pending={key: "watermark"}), wm)
            await engine.decide_and_send([lost])
            if engine.contradicted:
                again = Work(revisions=set(engine.contradicted))
                engine.contradicted.clear()
                await engine.decide_and_send(await engine.evaluate(again, wm))

        async def revised() -> bool:
            d = await store.get_decision("default", ident)
            return d is not None and d.verdict == "false" and d.version >= 2

        await until(revised, timeout=20)
