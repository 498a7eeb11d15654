"""Decisions judged again later by the sweeper: at the deadline, or after a dead process.

A revision to UNDETERMINED under a fallback tree is judged again at the deadline.

Tree: fallback(primary "delete_db never ran", fallback: OR("delete_db never ran", text says
"nothing was deleted")). The trace is complete without delete_db (v1 TRUE from the primary);
then a span after the completion claim makes the primary UNDETERMINED (v2). The fallback answers
only at the deadline: without a pass there the verdict stayed UNDETERMINED, while the same spans
with the late one arriving after the deadline ended TRUE -- the final verdict depended on timing.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

from collector.config import ScorerTreeConfig
from scoring.models import MessageScorable, TraceScorable
from tests.integration.harness import (
    control_client,
    drop_stack,
    expects,
    history,
    make_config,
    new_span_id,
    new_trace_id,
    otlp_request,
    otlp_span,
    raw_producer,
    running_service,
    send_spans,
    until,
)

pytestmark = pytest.mark.integration

NEVER = {"type": "inverter", "scorer": {"type": "otel_tool_call"}}
GUARDED = {
    "type": "fallback",
    "scorer": NEVER,
    "fallback_scorer": {"type": "composite", "aggregator": "or",
                        "scorers": [NEVER, {"type": "substring", "substring": "nothing was deleted"}]},
}


@pytest.mark.parametrize("blip", [False, True])
async def test_a_revision_to_undetermined_gets_its_deadline_pass(
    kafka_bootstrap: str, redis_url: str, blip: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if blip:  # Redis fails the note once: the batch is retried, and the note must still be made
        from redis.exceptions import ConnectionError as RedisConnectionError

        from collector.processors.trace_state import TraceStateStore

        real, failed = TraceStateStore.rearm_deadlines, []

        async def flaky(self: TraceStateStore, exps: Any) -> None:
            if exps and not failed:
                failed.append(exps)
                raise RedisConnectionError("injected: connection reset")
            await real(self, exps)

        monkeypatch.setattr(TraceStateStore, "rearm_deadlines", flaky)
    cfg = make_config(kafka_bootstrap, redis_url, scorers={"guarded": ScorerTreeConfig.model_validate(GUARDED)})
    deadline = timedelta(seconds=4)
    t0 = int(time.time() * 1000) - 5000
    trace, root = new_trace_id(), new_span_id()
    scope = MessageScorable(message_id="m-1", trace_ids=(trace,), response_text="ok, nothing was deleted")
    try:
        async with running_service(cfg), control_client(cfg) as tw, raw_producer(cfg) as producer:
            await send_spans(producer, cfg, trace,
                             otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50),
                             otlp_span(trace, parent=root, tool="search", start_ms=t0 + 1, end_ms=t0 + 2))
            eid = await tw.expect(scope, expects("delete_db"), scorer="guarded", deadline=deadline)
            await tw.mark_complete(trace, span_count=2)
            await until(lambda: history(tw.events(eid)) == [(1, "true")], timeout=20)
            late = otlp_span(trace, parent=root, name="chat", start_ms=t0 + 10, end_ms=t0 + 11,
                             attrs={"gen_ai.operation.name": "chat"})
            await send_spans(producer, cfg, trace, late)  # before the deadline
            await until(lambda: len(tw.events(eid)) >= 2, timeout=20)
            await until(lambda: len(tw.events(eid)) >= 3, timeout=deadline.total_seconds() + 20)
            assert history(tw.events(eid)) == [(1, "true"), (2, "undetermined"), (3, "true")]
            assert tw.events(eid)[-1].trigger == "revision"
            assert not blip or failed
    finally:
        await drop_stack(cfg)


async def test_a_contradiction_a_dead_process_left_is_rejudged_by_the_sweeper(
    kafka_bootstrap: str, redis_url: str
) -> None:
    """A late span contradicts a decided FALSE; the process that applied it dies before re-judging
    (its in-memory list is gone, and a replay re-applies the span as a no-op: nothing says so
    again). What it recorded in Redis has the sweeper revise the FALSE."""
    from collector.receivers.decode import decode_span_facts

    cfg = make_config(kafka_bootstrap, redis_url)
    t0 = int(time.time() * 1000) - 5000
    trace, root = new_trace_id(), new_span_id()
    try:
        async with running_service(cfg) as service, control_client(cfg) as tw, raw_producer(cfg) as producer:
            await send_spans(producer, cfg, trace, otlp_span(trace, span_id=root, name="agent", start_ms=t0,
                                                             end_ms=t0 + 50))
            eid = await tw.expect(TraceScorable(trace_ids=(trace,)), expects("search"), deadline=timedelta(seconds=60))
            await tw.mark_complete(trace, span_count=1)
            await until(lambda: history(tw.events(eid)) == [(1, "false")], timeout=20)
            # the late span, applied as the dead process did: state written, no re-judgement made
            late = otlp_request([otlp_span(trace, parent=root, tool="search", start_ms=t0 + 1, end_ms=t0 + 2)])
            facts = decode_span_facts(late.SerializeToString(), [], cfg, cfg.limits.max_argument_bytes).facts
            async with service.batch_lock:
                applied = await service.store.apply({("default", trace): [f for _, _, f, _ in facts]}, 0)
            assert applied[("default", trace)].decided == [eid]  # what the batch would have re-judged
            await service.sweep()
            assert history(tw.events(eid)) == [(1, "false")]  # nothing else knows
            await service.store.rejudge_at({("default", eid)}, int(time.time() * 1000))
            await service.sweep()
            await until(lambda: len(tw.events(eid)) >= 2, timeout=20)
            assert history(tw.events(eid)) == [(1, "false"), (2, "true")]
    finally:
        await drop_stack(cfg)
