"""A compare-and-set lost to a decision that is still being published does not send it again.

Two evaluations of one expectation (two instances whose partitions both hold spans of its trace,
or the sweeper and a batch) both judge it; one wins the compare-and-set. The loser found the
winner's decision not yet marked published and sent the stored payload at once, so about one
expectation in 25 had its score event twice on the topic with two instances (found by the
differential fuzz campaign; byte-identical, so clients dropped it, but a plain consumer saw it).

The re-send is for a winner that died before publishing. It now waits until the decision is
``RESEND_GRACE_MS`` old: younger, it is left to its maker, and to the sweeper should the maker
die. Both halves are checked here on the service's own engine, with the winner's
compare-and-set made by hand (the maker that then stops, or dies).
"""

from __future__ import annotations

import time

import pytest

from collector.pipeline.engine import RESEND_GRACE_MS, Published, Work
from collector.pipeline.service import ToolwitnessService
from collector.processors.trace_state import DecideRequest
from collector.wire.convert import RegisteredExpectation, encode
from scoring.models import TraceScorable
from tests.integration.harness import (
    Stack,
    expects,
    make_config,
    new_span_id,
    new_trace_id,
    open_stack,
    otlp_span,
    running_service,
    scores_by_id,
    send_spans,
    until,
    verdict,
)

pytestmark = pytest.mark.integration


async def _applied_trace(stack: Stack, service: ToolwitnessService) -> str:
    """A new trace whose spans (an agent, and a "search" tool under it) the service has applied;
    no expectation is registered on it, so the service decides nothing about it by itself."""
    t0 = int(time.time() * 1000)
    trace, root = new_trace_id(), new_span_id()
    await send_spans(
        stack.producer, stack.cfg, trace,
        otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50),
        otlp_span(trace, parent=root, name="search", tool="search", start_ms=t0 + 10, end_ms=t0 + 20),
    )

    async def applied() -> bool:
        st = (await service.store.load_states([("default", trace)])).get(("default", trace))
        return st is not None and len(st.executions) == 1

    await until(applied)
    return trace


async def _decided_by_another(service: ToolwitnessService, trace: str, ident: str) -> Work:
    """An expectation "search ran" on ``trace`` (whose spans the service has applied), decided TRUE
    by a compare-and-set made here -- as another instance would, which then has not published it.
    Returns the work that judges it again."""
    now = int(time.time() * 1000)
    exp = RegisteredExpectation(
        expectation_id=ident, tenant="default", scope=TraceScorable(trace_ids=(trace,)), scorer="tools",
        expectation=expects("search"), deadline_ms=now + 60_000, created_ms=now,
    )
    service.engine.remember(exp)  # known to this instance as the winner's registration made it
    work = Work(pending={("default", ident): "span"})
    watermark = await service.watermarks.global_watermark()
    [o] = await service.engine.evaluate(work, watermark)
    fmt = service.engine.fmt
    request = DecideRequest(
        "default", ident, o.version, o.score_id, encode(o.event, fmt), encode(o.observation, fmt), o.verdict.value
    )
    [won] = await service.store.decide_many([request])
    assert won.won and o.verdict.value == "true"
    return Work(pending={("default", ident): "span"})


async def test_a_loser_leaves_a_decision_being_published_to_its_maker(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    async with open_stack(cfg) as stack:
        async with running_service(cfg) as service:
            again = await _decided_by_another(service, await _applied_trace(stack, service), "fresh")
            watermark = await service.watermarks.global_watermark()
            # The loser: a decision made moments ago is its maker's to publish.
            sent = await service.engine.decide_and_send(await service.engine.evaluate(again, watermark))
            await service.exporter.flush()
            assert sent == []
            # The maker never publishes it (it died): the sweeper re-sends it once it is older than the
            # grace, and marks it published.
            ev = await stack.tw.wait_for("fresh", timeout=30)
            assert verdict(ev) == "true"
            k = service.store.k
            await until(lambda: _published(service, k.decision("default", "fresh")))
            assert (await service.store.get_decision("default", "fresh")) is not None
        # read once the service has stopped: nothing more can come
        events = scores_by_id(await stack.scores())
        assert [len(v) for v in events.values()] == [1], events.keys()


async def test_a_loser_re_sends_a_decision_its_maker_left_unpublished(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    async with open_stack(cfg) as stack, running_service(cfg) as service:
        again = await _decided_by_another(service, await _applied_trace(stack, service), "stale")
        k = service.store.k
        # its maker decided it longer ago than the grace and has not published it: it died
        old = int(time.time() * 1000) - RESEND_GRACE_MS - 1000
        await service.redis.hset(k.decision("default", "stale"), "at", old)
        watermark = await service.watermarks.global_watermark()
        sent = await service.engine.decide_and_send(await service.engine.evaluate(again, watermark))
        await service.exporter.flush()
        assert sent == [Published("default", "stale", resent=True)]
        assert verdict(await stack.tw.wait_for("stale", timeout=30)) == "true"


async def _published(service: ToolwitnessService, key: str) -> bool:
    return await service.redis.hget(key, "pub") in (b"1", "1")
