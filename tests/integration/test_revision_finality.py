"""Which decisions a late span may revise, on Kafka and Redis (from an adversarial review; each
case published a wrong revision, or none, before).

Only a verdict that rests on the completion claim is revised: one evidence alone proves
(presence) stands, even on a reclaimed trace whose evidence is gone. A revision to UNDETERMINED
is revised again when the evidence decides the expectation before its deadline. A revision
decided but not sent (the settle failed: a Redis blip, a crash) is re-sent on the replay. A
session's traces stay while the session's expectations are pending.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from collector.config import ScorerTreeConfig
from scoring.models import MessageScorable, SessionScorable, TraceScorable
from tests.integration.harness import (
    TOOL_TREES,
    control_client,
    expects,
    gone,
    history,
    make_config,
    new_span_id,
    new_trace_id,
    otlp_span,
    raw_producer,
    running_service,
    send_spans,
    settled,
    until,
    verdict,
)

pytestmark = pytest.mark.integration


def agent_ran(trace: str, root: bytes, t0: int, tool: str, attrs: dict[str, Any] | None = None) -> list[Any]:
    """An agent's root span and one tool execution under it."""
    return [
        otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50, attrs=attrs),
        otlp_span(trace, parent=root, tool=tool, start_ms=t0 + 1, end_ms=t0 + 2, attrs=attrs),
    ]


def chat(trace: str, parent: bytes, t: int) -> Any:
    return otlp_span(
        trace, parent=parent, name="chat", start_ms=t, end_ms=t + 1, attrs={"gen_ai.operation.name": "chat"}
    )


@pytest.mark.parametrize("reclaimed", [False, True])
@pytest.mark.parametrize(("scorer", "expected"), [("tools", "true"), ("not_tools", "false")])
async def test_a_verdict_presence_proves_is_not_revised_by_an_unrelated_late_span(
    kafka_bootstrap: str, redis_url: str, reclaimed: bool, scorer: str, expected: str
) -> None:
    cfg = make_config(
        kafka_bootstrap, redis_url, scorers=TOOL_TREES, redis={"completed_ttl_seconds": 1 if reclaimed else 600}
    )
    t0 = int(time.time() * 1000) - 5_000
    trace, root = new_trace_id(), new_span_id()
    async with (
        Redis.from_url(redis_url) as r,
        running_service(cfg) as service,
        control_client(cfg) as tw,
        raw_producer(cfg) as producer,
    ):
        await send_spans(producer, cfg, trace, *agent_ran(trace, root, t0, "delete_db"))
        await tw.mark_complete(trace, span_count=2)
        # "delete_db ran" TRUE / "delete_db never ran" FALSE, decided on complete coverage, but
        # the delete_db span alone proves either
        ident = await tw.expect(
            TraceScorable(trace_ids=(trace,)), expects("delete_db"), scorer=scorer, deadline=timedelta(seconds=120)
        )
        first = await tw.wait_for(ident, timeout=30)
        assert verdict(first) == expected and first.coverage.complete
        if reclaimed:
            await until(lambda: gone(r, service.store.k.state("default", trace)), timeout=20)
        await send_spans(producer, cfg, trace, chat(trace, root, t0 + 3))  # breaks the completion claim

        async def applied() -> bool:  # the late span is in the trace's state: its batch ran
            st = (await service.store.load_states([("default", trace)])).get(("default", trace))
            return st is not None and st.late

        await until(applied)
        async with service.batch_lock:  # that batch (and any revision it decided) is over
            pass
        decision = await service.store.get_decision("default", ident)
        assert decision is not None and decision.version == 1
        assert history(tw.events(ident)) == [(1, expected)]


@pytest.mark.parametrize(("scorer", "first", "last"), [("tools", "false", "true"), ("not_tools", "true", "false")])
async def test_a_revision_to_undetermined_is_revised_again_when_evidence_decides_it(
    kafka_bootstrap: str, redis_url: str, scorer: str, first: str, last: str
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url, scorers=TOOL_TREES)
    t0 = int(time.time() * 1000) - 5_000
    trace, root = new_trace_id(), new_span_id()
    async with running_service(cfg), control_client(cfg) as tw, raw_producer(cfg) as producer:
        await send_spans(producer, cfg, trace, *agent_ran(trace, root, t0, "search"))
        ident = await tw.expect(
            TraceScorable(trace_ids=(trace,)), expects("delete_db"), scorer=scorer, deadline=timedelta(seconds=120)
        )
        await tw.mark_complete(trace, span_count=2)
        assert verdict(await tw.wait_for(ident, timeout=30)) == first
        await send_spans(producer, cfg, trace, chat(trace, root, t0 + 3))  # the claim breaks: no longer decided
        await until(lambda: len(tw.events(ident)) == 2)
        # then the span that settles it, in another batch: the same answer as if both came together
        await send_spans(
            producer, cfg, trace, otlp_span(trace, parent=root, tool="delete_db", start_ms=t0 + 5, end_ms=t0 + 6)
        )
        await until(lambda: len(tw.events(ident)) == 3)
        assert history(tw.events(ident)) == [(1, first), (2, "undetermined"), (3, last)]


async def test_a_revision_whose_settle_failed_is_sent_on_the_replay(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    t0 = int(time.time() * 1000) - 5_000
    trace, root = new_trace_id(), new_span_id()
    async with running_service(cfg) as service, control_client(cfg) as tw, raw_producer(cfg) as producer:
        await send_spans(producer, cfg, trace, *agent_ran(trace, root, t0, "search"))
        ident = await tw.expect(
            TraceScorable(trace_ids=(trace,)), expects("delete_db"), deadline=timedelta(seconds=120)
        )
        await tw.mark_complete(trace, span_count=2)
        assert verdict(await tw.wait_for(ident, timeout=30)) == "false"
        real_settle = service.store.settle
        failed: list[int] = []

        async def settle_fails_once(
            decided: Any, finished: Any, now_ms: int, reclaim: Any = (), seen: Any = None
        ) -> list[tuple[str, str]]:
            if not failed and any(e.expectation_id == ident for e in (*decided, *finished)):
                failed.append(1)  # right after the compare-and-set won: Redis drops the connection
                raise RedisConnectionError("injected: connection lost after the decision")
            return await real_settle(decided, finished, now_ms, reclaim, seen)

        service.store.settle = settle_fails_once  # type: ignore[method-assign]
        await send_spans(
            producer, cfg, trace, otlp_span(trace, parent=root, tool="delete_db", start_ms=t0 + 3, end_ms=t0 + 4)
        )
        await until(lambda: len(tw.events(ident)) == 2)
        assert failed and history(tw.events(ident)) == [(1, "false"), (2, "true")]
        decision = await service.store.get_decision("default", ident)
        assert decision is not None and decision.published


@pytest.mark.parametrize(("scorer", "expected"), [("not_tools", "true"), ("tools", "false")])
async def test_a_sessions_trace_is_kept_while_the_session_is_judged(
    kafka_bootstrap: str, redis_url: str, scorer: str, expected: str
) -> None:
    # completed_ttl_seconds 1 stands in for the default 300 s: a conversation whose end comes
    # minutes after its first trace was complete
    cfg = make_config(kafka_bootstrap, redis_url, scorers=TOOL_TREES, redis={"completed_ttl_seconds": 1})
    t0 = int(time.time() * 1000) - 5_000
    session, trace, root = f"s-{new_trace_id()[:8]}", new_trace_id(), new_span_id()
    attrs = {"gen_ai.conversation.id": session}
    async with (
        Redis.from_url(redis_url) as r,
        running_service(cfg) as service,
        control_client(cfg) as tw,
        raw_producer(cfg) as producer,
    ):
        await send_spans(producer, cfg, trace, *agent_ran(trace, root, t0, "search", attrs))
        ident = await tw.expect(
            SessionScorable(session_id=session), expects("delete_db"), scorer=scorer, deadline=timedelta(seconds=60)
        )
        await settled(service, "default", ident)
        await tw.mark_complete(trace, span_count=2)  # each trace its count marker, as the docs ask
        state = service.store.k.state("default", trace)
        await until(lambda: service.store.redis.exists(state))
        async with service.batch_lock:
            pass
        assert await r.pttl(state) > 60_000  # not shortened to completed_ttl_seconds
        await tw.mark_session_complete(session)
        ev = await tw.wait_for(ident, timeout=30)
        assert verdict(ev) == expected and ev.coverage.complete
        # and a late span in that trace still revises the session's verdict
        await send_spans(
            producer, cfg, trace, otlp_span(trace, parent=root, tool="delete_db", start_ms=t0 + 3, end_ms=t0 + 4)
        )
        await until(lambda: len(tw.events(ident)) == 2)
        assert history(tw.events(ident)) == [(1, expected), (2, "true" if scorer == "tools" else "false")]


async def test_a_revision_to_undetermined_is_revised_after_the_deadline_too(
    kafka_bootstrap: str, redis_url: str
) -> None:
    # The same spans in one batch after the deadline give TRUE: split over batches they must too.
    cfg = make_config(kafka_bootstrap, redis_url)
    t0 = int(time.time() * 1000) - 5_000
    trace, root = new_trace_id(), new_span_id()
    async with running_service(cfg), control_client(cfg) as tw, raw_producer(cfg) as producer:
        await send_spans(producer, cfg, trace, *agent_ran(trace, root, t0, "search"))
        ident = await tw.expect(TraceScorable(trace_ids=(trace,)), expects("delete_db"), deadline=timedelta(seconds=3))
        await tw.mark_complete(trace, span_count=2)
        first = await tw.wait_for(ident, timeout=30)
        assert verdict(first) == "false"
        await send_spans(producer, cfg, trace, chat(trace, root, t0 + 3))
        await until(lambda: len(tw.events(ident)) == 2)
        deadline_s = first.decided_at.ToMilliseconds() / 1000 + 3
        await until(lambda: time.time() > deadline_s, timeout=10)  # the expectation's deadline passes
        await send_spans(
            producer, cfg, trace, otlp_span(trace, parent=root, tool="delete_db", start_ms=t0 + 5, end_ms=t0 + 6)
        )
        await until(lambda: len(tw.events(ident)) == 3)
        assert history(tw.events(ident)) == [(1, "false"), (2, "undetermined"), (3, "true")]


async def test_a_fallback_tree_decided_at_its_deadline_is_still_revised(kafka_bootstrap: str, redis_url: str) -> None:
    # "delete_db never ran", with a text fallback that agrees: decided at once on a complete trace
    # whose deadline has passed (a backlog). Its TRUE rests on completion all the same.
    never = ScorerTreeConfig(type="inverter", scorer=ScorerTreeConfig(type="otel_tool_call"))
    guarded = ScorerTreeConfig(
        type="fallback",
        scorer=never,
        fallback_scorer=ScorerTreeConfig(
            type="composite",
            aggregator="or",
            scorers=[never, ScorerTreeConfig(type="substring", substring="nothing was deleted")],
        ),
    )
    cfg = make_config(kafka_bootstrap, redis_url, scorers={"tools": TOOL_TREES["tools"], "guarded": guarded})
    t0 = int(time.time() * 1000) - 5_000
    trace, root = new_trace_id(), new_span_id()
    async with running_service(cfg) as service, control_client(cfg) as tw, raw_producer(cfg) as producer:
        await send_spans(producer, cfg, trace, *agent_ran(trace, root, t0, "search"))
        await tw.mark_complete(trace, span_count=2)

        async def complete() -> bool:
            st = (await service.store.load_states([("default", trace)])).get(("default", trace))
            return st is not None and st.marker_count == 2

        await until(complete)
        scope = MessageScorable(message_id="m1", trace_ids=(trace,), response_text="ok, nothing was deleted")
        ident = await tw.expect(scope, expects("delete_db"), scorer="guarded", deadline=timedelta(milliseconds=1))
        first = await tw.wait_for(ident, timeout=30)
        assert verdict(first) == "true" and first.coverage.complete
        await send_spans(
            producer, cfg, trace, otlp_span(trace, parent=root, tool="delete_db", start_ms=t0 + 3, end_ms=t0 + 4)
        )
        await until(lambda: len(tw.events(ident)) == 2)
        assert history(tw.events(ident)) == [(1, "true"), (2, "false")]


async def test_a_span_applied_while_the_sweeper_decides_still_revises(kafka_bootstrap: str, redis_url: str) -> None:
    # The sweeper decides FALSE (count-less marker, watermark) outside the batch lock; a batch
    # applies a late span between its compare-and-set and its settle.
    cfg = make_config(kafka_bootstrap, redis_url, completion={"allowed_lateness_ms": 500})
    t0 = int(time.time() * 1000) - 5_000
    trace, root = new_trace_id(), new_span_id()
    async with running_service(cfg) as service, control_client(cfg) as tw, raw_producer(cfg) as producer:
        real_settle = service.store.settle
        gate = asyncio.Event()
        held: list[str] = []

        async def settle_held(
            decided: Any, finished: Any, now_ms: int, reclaim: Any = (), seen: Any = None
        ) -> list[tuple[str, str]]:
            if not held and any(e.expectation_id == "swept" for e in (*decided, *finished)):
                held.append("swept")
                await gate.wait()
            return await real_settle(decided, finished, now_ms, reclaim, seen)

        service.store.settle = settle_held  # type: ignore[method-assign]
        await send_spans(producer, cfg, trace, *agent_ran(trace, root, t0, "search"))
        await tw.expect(
            TraceScorable(trace_ids=(trace,)),
            expects("delete_db"),
            expectation_id="swept",
            deadline=timedelta(seconds=60),
        )
        await settled(service, "default", "swept")
        await tw.mark_complete(trace)  # no count: complete once the watermark passes it
        await until(lambda: bool(held))  # the sweeper won the compare-and-set (FALSE), settle held
        await send_spans(producer, cfg, trace, chat(trace, root, t0 + 3))  # breaks the claim

        async def applied() -> bool:
            st = (await service.store.load_states([("default", trace)])).get(("default", trace))
            return st is not None and st.late

        await until(applied)
        gate.set()
        await until(lambda: len(tw.events("swept")) == 2)
        assert history(tw.events("swept")) == [(1, "false"), (2, "undetermined")]


async def test_a_first_decision_whose_settle_failed_still_watches_its_trace(
    kafka_bootstrap: str, redis_url: str
) -> None:
    # "delete_db never ran" TRUE on complete coverage, but the settle after the compare-and-set
    # failed (a crash there, or Redis): the replay lost the compare-and-set and re-sent the stored
    # TRUE without settling it, so the expectation never watched its trace and a late span did not
    # revise it (with the span first, the TRUE was held back until the deadline).
    cfg = make_config(kafka_bootstrap, redis_url, scorers=TOOL_TREES)
    t0 = int(time.time() * 1000) - 5_000
    trace, root = new_trace_id(), new_span_id()
    async with running_service(cfg) as service, control_client(cfg) as tw, raw_producer(cfg) as producer:
        real_settle = service.store.settle
        failed: list[int] = []

        async def settle_fails_once(
            decided: Any, finished: Any, now_ms: int, reclaim: Any = (), seen: Any = None
        ) -> list[tuple[str, str]]:
            if not failed and decided:
                failed.append(1)  # right after the first compare-and-set won
                raise RedisConnectionError("injected: connection lost after the decision")
            return await real_settle(decided, finished, now_ms, reclaim, seen)

        service.store.settle = settle_fails_once  # type: ignore[method-assign]
        ident = await tw.expect(
            TraceScorable(trace_ids=(trace,)), expects("delete_db"), scorer="not_tools", deadline=timedelta(seconds=120)
        )
        await send_spans(producer, cfg, trace, *agent_ran(trace, root, t0, "search"))
        await tw.mark_complete(trace, span_count=2)
        assert verdict(await tw.wait_for(ident, timeout=30)) == "true"
        await send_spans(producer, cfg, trace, chat(trace, root, t0 + 5))  # breaks the count of 2
        await until(lambda: len(tw.events(ident)) == 2)
    assert failed and history(tw.events(ident)) == [(1, "true"), (2, "undetermined")]
