"""Decisions in Redis (``TraceStateStore``): the payload is kept while unpublished, for an exact
re-send, and dropped once published; a re-send never goes out with a dropped payload."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from collector.processors.trace_state import DecideRequest, TraceStateStore, member
from tests.integration.harness import make_config

EVENT = b"\x0a\x20" + b"e" * 600  # stand-ins for a serialized ScoreEvent and Observation
OBSERVATION = b"\x0a\x40" + b"o" * 2000


@pytest.fixture
async def store(
    kafka_bootstrap: str, redis_url: str, redis_cleanup: set[str], redis_client: Redis
) -> AsyncIterator[TraceStateStore]:
    """``redis_client`` is requested for its teardown: it deletes the keys listed here."""
    cfg = make_config(kafka_bootstrap, redis_url)
    redis = Redis.from_url(redis_url)
    s = TraceStateStore(redis, cfg)
    await s.start()
    redis_cleanup.add(f"{cfg.redis.key_prefix}*")
    try:
        yield s
    finally:
        await redis.aclose()


def request(eid: str, version: int = 1) -> DecideRequest:
    return DecideRequest("default", eid, version, f"sid-{eid}-{version}", EVENT, OBSERVATION, "true")


async def test_the_payload_is_kept_until_published_then_dropped(store: TraceStateStore) -> None:
    [won] = await store.decide_many([request("e1")])
    assert won.won and not won.published
    key = store.k.decision("default", "e1")
    assert await store.redis.hmget(key, ["ev", "ob", "pub"]) == [EVENT, OBSERVATION, b"0"]
    unpublished_bytes = await store.redis.memory_usage(key, samples=0)

    # another instance (or a replay) loses the compare-and-set before the publish: it gets the
    # stored payload back, to re-send exactly those bytes
    [lost] = await store.decide_many([request("e1")])
    assert not lost.won and not lost.published and (lost.event, lost.observation) == (EVENT, OBSERVATION)

    await store.mark_published([("default", "e1")])
    d = await store.get_decision("default", "e1")
    assert d is not None and d.published and (d.version, d.score_id, d.verdict) == (1, "sid-e1-1", "true")
    assert await store.redis.hmget(key, ["ev", "ob"]) == [b"", b""]
    published_bytes = await store.redis.memory_usage(key, samples=0)
    assert published_bytes is not None and unpublished_bytes is not None
    assert published_bytes * 4 < unpublished_bytes  # the payload was most of it

    # after the publish a lost compare-and-set has nothing to re-send
    [late] = await store.decide_many([request("e1")])
    assert not late.won and late.published


async def test_published_between_the_compare_and_set_and_the_payload_read(store: TraceStateStore) -> None:
    await store.decide_many([request("e2")])
    execute = store._execute
    calls: list[int] = []

    async def interleaved(cmds: Any) -> list[Any]:
        replies = await execute(cmds)
        calls.append(len(cmds))
        if len(calls) == 1:  # the lost compare-and-set said "unpublished"; now the winner publishes
            store._execute = execute  # type: ignore[method-assign]
            await store.mark_published([("default", "e2")])
            store._execute = interleaved  # type: ignore[method-assign]
        return replies

    store._execute = interleaved  # type: ignore[method-assign]
    [lost] = await store.decide_many([request("e2")])
    assert len(calls) == 2  # the payload was read in a second round trip, after the publish
    assert not lost.won and lost.published  # so it is not re-sent (its payload is gone)


# --- a trace joining a session while the session is being decided (from a differential review) ----


def _session_expectation(eid: str, session: str) -> Any:
    from collector.wire.convert import RegisteredExpectation
    from scoring.models import SessionScorable
    from tests.integration.harness import expects

    scope = SessionScorable(session_id=session)
    return RegisteredExpectation(eid, "default", scope, "tools", expects("search"), 2**50, 0)


async def test_a_session_decision_that_read_fewer_traces_than_the_session_has_is_re_judged(
    store: TraceStateStore,
) -> None:
    # The sweeper read the session's one trace and decided FALSE; a batch linked a second trace
    # (which ran the tool) before the sweeper's settle: the settle says so.
    exp = _session_expectation("s-e1", "sess-1")
    await store.index_sessions([("default", "sess-1", "a" * 32)], watermark_ms=0)
    assert await store.settle([exp], [], now_ms=1, seen={("default", "s-e1"): 1}) == []
    exp2 = _session_expectation("s-e2", "sess-1")
    await store.index_sessions([("default", "sess-1", "b" * 32)], watermark_ms=0)
    assert await store.settle([exp2], [], now_ms=1, seen={("default", "s-e2"): 1}) == [("default", "s-e2")]


async def test_a_trace_joining_a_session_decided_on_its_completeness_breaks_it_whatever_the_watermark(
    store: TraceStateStore,
) -> None:
    # The sweeper (watermark ahead) judged the session complete and settled; a batch whose
    # watermark is older links a trace: the decision rests on a claim this trace breaks.
    await store.redis.set(store.k.session_complete("default", "sess-2"), 1_000)
    await store.index_sessions([("default", "sess-2", "a" * 32)], watermark_ms=0)
    await store.settle([_session_expectation("s-e3", "sess-2")], [], now_ms=1, seen={("default", "s-e3"): 1})
    _, broken = await store.index_sessions([("default", "sess-2", "b" * 32)], watermark_ms=0)  # old watermark
    assert broken == [("default", "sess-2")]
    assert await store.revise_sessions(broken) == {("default", "sess-2"): ["s-e3"]}


async def test_an_indexed_expectation_whose_decision_expired_is_not_taken_for_unindexed(
    store: TraceStateStore,
) -> None:
    # The decision hash lives state_ttl after the decision; the definition may live longer. A
    # replayed registration then found "no deadline, no decision" and judged it again: a second,
    # different version 1 under the same score id.
    from collector.wire.convert import RegisteredExpectation
    from scoring.models import TraceScorable
    from tests.integration.harness import expects

    scope = TraceScorable(trace_ids=("a" * 32,))
    exp = RegisteredExpectation("e-exp", "default", scope, "tools", expects("s"), 10**6, 0)
    assert await store.register(exp)
    assert not await store.unindexed(exp)
    await store.redis.zrem(store.k.deadlines, "default\x1fe-exp")  # decided and settled ...
    await store.redis.delete(store.k.decision("default", "e-exp"))  # ... and its decision expired
    assert not await store.unindexed(exp)
    stored_only = RegisteredExpectation("e-cut", "default", exp.scope, "tools", expects("s"), 10**6, 0)
    await store.redis.set(store.k.expectation("default", "e-cut"), stored_only.to_json())  # cut before indexing
    assert await store.unindexed(stored_only)



async def test_a_failed_sweep_puts_back_only_the_claims_it_still_holds(store: TraceStateStore) -> None:
    """A sweeper whose handling failed puts its claims back; one a batch queued again meanwhile
    (a watermark wait at a later time) keeps the batch's score: it is not judged too early."""
    zset = store.k.await_watermark
    requeued, untouched = member("default", "t-requeued"), member("default", "t-untouched")
    await store.await_watermark([("default", "t-requeued", 1_000), ("default", "t-untouched", 1_000)])
    claimed = await store.claim_due(zset, 1_000, lease_until=31_000)
    assert sorted(claimed) == [("default", "t-requeued"), ("default", "t-untouched")]
    await store.await_watermark([("default", "t-requeued", 5_000)])  # a batch, while the sweep runs
    await store.unclaim(zset, claimed, 1_000, lease_until=31_000)
    assert await store.redis.zscore(zset, requeued) == 5_000
    assert await store.redis.zscore(zset, untouched) == 1_000
    # and a handled claim is released only while it holds the lease
    claimed = await store.claim_due(zset, 5_000, lease_until=35_000)
    await store.await_watermark([("default", "t-requeued", 9_000)])
    await store.release(zset, claimed, 35_000)
    assert await store.redis.zrange(zset, 0, -1, withscores=True) == [(requeued.encode(), 9_000.0)]


async def test_a_lost_compare_and_set_reads_the_verdict_that_won_even_once_published(store: TraceStateStore) -> None:
    """The engine compares what it judged with what won (a contradiction is re-judged): the stored
    verdict, also when the winner was published before this compare-and-set -- it read as this
    evaluation's own verdict then, and a FALSE that newer evidence contradicted stayed."""
    won_false = DecideRequest("default", "e9", 1, "sid-e9-1", EVENT, OBSERVATION, "false")
    [won] = await store.decide_many([won_false])
    assert won.won
    newer_true = DecideRequest("default", "e9", 1, "sid-e9-1b", EVENT, OBSERVATION, "true")
    [before] = await store.decide_many([newer_true])  # not published yet: the payload comes back too
    assert not before.won and before.verdict == "false"
    await store.mark_published([("default", "e9")])
    [after] = await store.decide_many([newer_true])
    assert not after.won and after.published and after.verdict == "false"
