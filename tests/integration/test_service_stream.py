"""The streaming service end to end on real Kafka and Redis (issue 4 acceptance 1–3).

Everything is asserted on what a downstream consumer reads from the scores and
observations topics.
"""

from __future__ import annotations

import asyncio
import gc
import json
import socket
from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from collector.config import ScorerTreeConfig
from collector.pipeline.service import ToolwitnessService
from collector.processors.trace_state import member
from scoring.models import MessageScorable, ScoreStatus, TraceScorable
from scoring.score import OtelToolCallScorer
from scoring.score.observation import InMemoryTraceClient, OtelTraceSource
from tests.integration.harness import (
    control_client,
    expects,
    make_agent,
    make_config,
    read_all,
    running_service,
    settled,
    until,
    verdict,
)

pytestmark = pytest.mark.integration


async def test_seed_000_through_the_stream(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    agent = make_agent(cfg)
    async with running_service(cfg) as service, control_client(cfg) as tw:
        with agent.tracer.start_as_current_span("agent", context=Context()) as root:
            agent.tool("my_tool_call")
            trace_id = f"{root.get_span_context().trace_id:032x}"
        scope = TraceScorable(trace_ids=(trace_id,))

        # TRUE for my_tool_call arrives before any completion marker.
        pos_id = await tw.expect(scope, expects("my_tool_call"))
        positive = await tw.wait_for(pos_id, timeout=30)
        assert verdict(positive) == "true"
        assert not positive.coverage.complete

        # summarize: no score until the marker with its span count, then FALSE.
        neg_id = await tw.expect(scope, expects("summarize"))
        await settled(service, "default", neg_id)
        assert tw.events(neg_id) == []
        await tw.mark_complete(trace_id, span_count=agent.counter.count(trace_id))
        negative = await tw.wait_for(neg_id, timeout=30)
        assert verdict(negative) == "false"
        assert negative.coverage.complete
        assert negative.version == 1 and negative.trigger == "marker"

        # A never-completed trace gets UNDETERMINED at its deadline.
        with agent.tracer.start_as_current_span("agent", context=Context()) as root2:
            agent.tool("other_tool")
            open_trace = f"{root2.get_span_context().trace_id:032x}"
        und_id = await tw.expect(
            TraceScorable(trace_ids=(open_trace,)), expects("summarize"), deadline=timedelta(seconds=2)
        )
        undetermined = await tw.wait_for(und_id, timeout=30)
        assert verdict(undetermined) == "undetermined"
        assert undetermined.trigger == "deadline"
        assert "awaiting_completion" in undetermined.coverage.reasons

        # Every score names an observation found on the observations topic.
        observations = {}
        for ev in (positive, negative, undetermined):
            assert len(ev.observation_ids) == 1
            obs = await tw.get_observation(ev.observation_ids[0], timeout=30)
            assert obs.observation_id == ev.observation_ids[0]
            observations[ev.expectation_id] = obs
    agent.close()

    # Replay with the scoring library against another expectation, with no network at all.
    saved = observations[neg_id]
    before = saved.model_dump_json()
    closed = InMemoryTraceClient()
    closed.close()
    scorer = OtelToolCallScorer(source=OtelTraceSource(trace_client=closed))
    real_socket = socket.socket

    def no_network(*args: object, **kwargs: object) -> socket.socket:
        raise AssertionError("replay must not open a socket")

    socket.socket = no_network  # type: ignore[assignment,misc]
    try:
        replay_tool = (await scorer.score_observation_async(observation=saved, expectation=expects("my_tool_call")))[0]
        replay_missing = (await scorer.score_observation_async(observation=saved, expectation=expects("summarize")))[0]
        replay_open = (
            await scorer.score_observation_async(observation=observations[und_id], expectation=expects("summarize"))
        )[0]
    finally:
        socket.socket = real_socket  # type: ignore[misc]
    assert replay_tool.get_value() is True
    assert replay_missing.get_value() is False
    assert replay_open.status is ScoreStatus.UNDETERMINED
    assert saved.model_dump_json() == before


async def test_message_scope_and_substring_composite(kafka_bootstrap: str, redis_url: str) -> None:
    trees = {
        "tools": ScorerTreeConfig(type="otel_tool_call"),
        "done_and_tool": ScorerTreeConfig(
            type="composite",
            aggregator="and",
            scorers=(ScorerTreeConfig(type="substring", substring="done"), ScorerTreeConfig(type="otel_tool_call")),
        ),
    }
    cfg = make_config(kafka_bootstrap, redis_url, scorers=trees)
    agent = make_agent(cfg)
    async with running_service(cfg), control_client(cfg) as tw:
        with agent.tracer.start_as_current_span("agent", context=Context()) as root:
            agent.tool("my_tool_call")
            trace_id = f"{root.get_span_context().trace_id:032x}"
        scope = MessageScorable(message_id="m1", conversation_id="c1", trace_ids=(trace_id,), response_text="done")
        eid = await tw.expect(scope, expects("my_tool_call"), scorer="done_and_tool")
        ev = await tw.wait_for(eid, timeout=30)
        assert verdict(ev) == "true"
        assert ev.scorer == "done_and_tool" and len(ev.scorer_identity) == 64
        # The same tree on a response without "done" is FALSE once the text says so.
        scope2 = MessageScorable(message_id="m2", conversation_id="c1", trace_ids=(trace_id,), response_text="nope")
        eid2 = await tw.expect(scope2, expects("my_tool_call"), scorer="done_and_tool")
        assert verdict(await tw.wait_for(eid2, timeout=30)) == "false"
        # No text given is not the empty text: the text leaf does not apply (as in the library),
        # so the tool leaf decides; the empty text is a text without "done".
        for mid, text, want in (("m3", None, "true"), ("m4", "", "false")):
            scope3 = MessageScorable(message_id=mid, conversation_id="c1", trace_ids=(trace_id,), response_text=text)
            eid3 = await tw.expect(scope3, expects("my_tool_call"), scorer="done_and_tool")
            assert verdict(await tw.wait_for(eid3, timeout=30)) == want, (mid, text)
    agent.close()


async def test_an_otlp_json_pipeline_scores_what_the_sdk_exported(kafka_bootstrap: str, redis_url: str) -> None:
    """kafka.encoding otlp_json end to end: the SDK exporter writes OTLP/JSON records (as the
    Collector's kafkaexporter does with that encoding) and the service scores them."""
    cfg = make_config(kafka_bootstrap, redis_url, kafka={"encoding": "otlp_json"})
    agent = make_agent(cfg)
    async with running_service(cfg), control_client(cfg) as tw:
        trace_id = agent.trace("search", "fetch")
        ran = await tw.expect(TraceScorable(trace_ids=(trace_id,)), expects("fetch"))
        never = await tw.expect(TraceScorable(trace_ids=(trace_id,)), expects("delete_everything"))
        assert verdict(await tw.wait_for(ran, timeout=30)) == "true"
        await tw.mark_complete(trace_id, span_count=agent.counter.count(trace_id))
        ev = await tw.wait_for(never, timeout=30)
        assert verdict(ev) == "false" and ev.coverage.complete
    records = await read_all(kafka_bootstrap, cfg.kafka.topics.spans)
    assert records and all(json.loads(r.value or b"")["resourceSpans"] for r in records)
    agent.close()


async def test_marker_before_spans_never_gives_early_false(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    agent = make_agent(cfg)
    async with running_service(cfg) as service, control_client(cfg) as tw:
        tracer = agent.tracer
        root = tracer.start_span("agent", context=Context())
        trace_id = f"{root.get_span_context().trace_id:032x}"
        # The producer claims 3 spans before any of them is exported.
        await tw.mark_complete(trace_id, span_count=3)
        eid = await tw.expect(TraceScorable(trace_ids=(trace_id,)), expects("summarize"))
        await settled(service, "default", eid)
        assert tw.events(eid) == []
        from opentelemetry import trace as trace_api

        ctx = trace_api.set_span_in_context(root)
        with tracer.start_as_current_span(
            "step1", context=ctx, attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search"}
        ):
            pass
        await asyncio.wait_for(_wait_spans(service, trace_id, 1), timeout=30)
        await settled(service, "default", eid)
        assert tw.events(eid) == [], "one of three spans seen: absence is not provable yet"
        with tracer.start_as_current_span("step2", context=ctx):
            pass
        await asyncio.wait_for(_wait_spans(service, trace_id, 2), timeout=30)
        await settled(service, "default", eid)
        assert tw.events(eid) == []
        root.end()
        ev = await tw.wait_for(eid, timeout=30)
        assert verdict(ev) == "false"
        assert ev.coverage.complete
    agent.close()


async def test_the_readme_marker_of_a_trace_the_counter_never_saw_gives_no_false(
    kafka_bootstrap: str, redis_url: str
) -> None:
    # The README's pattern, ``mark_complete(t, span_count=counter.count(t))``, for a trace the
    # sampler dropped (the tool ran; no span was recorded or exported) and for a mistyped id. The
    # counter said 0 for both, so the markers claimed complete, empty traces: "search ran" was FALSE.
    cfg = make_config(kafka_bootstrap, redis_url)
    agent = make_agent(cfg)
    dropped = TracerProvider(sampler=ALWAYS_OFF)
    dropped.add_span_processor(agent.counter)  # the same counter, on a provider that samples nothing
    async with running_service(cfg), control_client(cfg) as tw:
        with dropped.get_tracer("dropped").start_as_current_span("agent", context=Context()) as root:
            with dropped.get_tracer("dropped").start_as_current_span(
                "search", attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search"}
            ):
                pass
            unsampled = f"{root.get_span_context().trace_id:032x}"
        sampled = agent.trace("search")
        mistyped = sampled[:-1] + ("0" if sampled[-1] != "0" else "1")
        ids = {}
        for t in (unsampled, mistyped, sampled):
            ids[t] = await tw.expect(TraceScorable(trace_ids=(t,)), expects("search"), deadline=timedelta(seconds=3))
            await tw.mark_complete(t, span_count=agent.counter.count(t))
        assert verdict(await tw.wait_for(ids[sampled], timeout=30)) == "true"
        for t in (unsampled, mistyped):
            ev = await tw.wait_for(ids[t], timeout=30)
            assert (verdict(ev), ev.coverage.complete, ev.trigger) == ("undetermined", False, "deadline"), t
    agent.close()
    dropped.shutdown()


async def _wait_spans(service: object, trace_id: str, n: int) -> None:
    from collector.processors.trace_state import TraceState

    store = service.store  # type: ignore[attr-defined]
    while True:
        raw = await store.redis.get(store.k.state("default", trace_id))
        if raw is not None and TraceState.from_json(raw).span_count >= n:
            return
        await asyncio.sleep(0.05)


async def test_broken_completion_claim_publishes_one_revision(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    agent = make_agent(cfg)
    async with running_service(cfg) as service, control_client(cfg) as tw:
        root = agent.tracer.start_span("agent", context=Context())
        trace_id = f"{root.get_span_context().trace_id:032x}"
        root.end()
        eid = await tw.expect(TraceScorable(trace_ids=(trace_id,)), expects("summarize"))
        other = await tw.expect(TraceScorable(trace_ids=(trace_id,)), expects("agent_tool_never"))
        await tw.mark_complete(trace_id, span_count=1)
        first = await tw.wait_for(eid, timeout=30)
        assert verdict(first) == "false" and first.version == 1
        assert verdict(await tw.wait_for(other, timeout=30)) == "false"
        # The claim was wrong: a span of that trace (the summarize tool) arrives afterwards.
        from opentelemetry import trace as trace_api

        with agent.tracer.start_as_current_span(
            "summarize",
            context=trace_api.set_span_in_context(root),
            attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "summarize"},
        ):
            pass
        await _until_version(tw, eid, 2)
        revised = tw.latest(eid)
        assert revised is not None
        assert verdict(revised) == "true" and revised.version == 2 and revised.trigger == "revision"
        assert revised.score_id != first.score_id
        assert "late_span_after_completion" in revised.coverage.reasons
        # The other expectation's absence is no longer provable: revised to UNDETERMINED, never kept FALSE.
        await _until_version(tw, other, 2)
        other_rev = tw.latest(other)
        assert other_rev is not None and verdict(other_rev) == "undetermined"
        # One more late span changes nothing further: revisions happen once.
        with agent.tracer.start_as_current_span("extra", context=trace_api.set_span_in_context(root)):
            pass
        await asyncio.wait_for(_wait_spans(service, trace_id, 3), timeout=30)
        await settled(service, "default", eid)
        assert [e.version for e in tw.events(eid)] == [1, 2]
    agent.close()


async def _until_version(tw: object, eid: str, version: int) -> None:
    async with asyncio.timeout(30):
        while True:
            latest = tw.latest(eid)  # type: ignore[attr-defined]
            if latest is not None and latest.version >= version:
                return
            await asyncio.sleep(0.05)


async def test_state_of_decided_complete_traces_is_reclaimed(kafka_bootstrap: str, redis_url: str) -> None:
    base = make_config(kafka_bootstrap, redis_url)
    cfg = base.model_copy(update={"redis": base.redis.model_copy(update={"completed_ttl_seconds": 30})})
    agent = make_agent(cfg)
    async with running_service(cfg) as service, control_client(cfg) as tw:
        ids = []
        for _ in range(2):
            with agent.tracer.start_as_current_span("agent", context=Context()) as root:
                agent.tool("my_tool_call")
                ids.append(f"{root.get_span_context().trace_id:032x}")
        done, still_open = ids
        eid = await tw.expect(TraceScorable(trace_ids=(done,)), expects("summarize"))
        await tw.mark_complete(done, span_count=agent.counter.count(done))
        assert verdict(await tw.wait_for(eid, timeout=30)) == "false"
        open_eid = await tw.expect(TraceScorable(trace_ids=(still_open,)), expects("my_tool_call"))
        assert verdict(await tw.wait_for(open_eid, timeout=30)) == "true"
        state_ttl = await service.redis.pttl(service.store.k.state("default", done))
        open_ttl = await service.redis.pttl(service.store.k.state("default", still_open))
        assert 0 < state_ttl <= 30_000, state_ttl  # complete and decided: reclaimed after the grace period
        assert open_ttl > 30_000, open_ttl  # not complete: kept for the full retention
        # Its marker arrives after its TRUE: complete with nothing left to decide -> reclaimed too.
        await tw.mark_complete(still_open, span_count=agent.counter.count(still_open))

        async def reclaimed() -> bool:
            return 0 < await service.redis.pttl(service.store.k.state("default", still_open)) <= 30_000

        await until(reclaimed, timeout=30)
    agent.close()


async def test_traces_completed_by_a_countless_marker_are_reclaimed(kafka_bootstrap: str, redis_url: str) -> None:
    """A marker without a span count completes its trace when the watermark passes it (the
    sweeper): a trace with nothing left to decide then kept its state for the whole
    state_ttl_seconds (24 h by default), where one with a counted marker gets completed_ttl_seconds."""
    base = make_config(kafka_bootstrap, redis_url)
    cfg = base.model_copy(update={"redis": base.redis.model_copy(update={"completed_ttl_seconds": 30})})
    agent = make_agent(cfg)
    async with running_service(cfg) as service, control_client(cfg) as tw:
        decided, unscored, still_open = [agent.trace("my_tool_call") for _ in range(3)]
        # decided TRUE before its marker; no expectation at all; never marked
        eid = await tw.expect(TraceScorable(trace_ids=(decided,)), expects("my_tool_call"))
        assert verdict(await tw.wait_for(eid, timeout=30)) == "true"
        open_eid = await tw.expect(TraceScorable(trace_ids=(still_open,)), expects("my_tool_call"))
        assert verdict(await tw.wait_for(open_eid, timeout=30)) == "true"
        for t in (decided, unscored):
            await tw.mark_complete(t)

        async def ttl(t: str) -> int:
            return int(await service.redis.pttl(service.store.k.state("default", t)))

        async def reclaimed() -> bool:
            return all([0 < await ttl(t) <= 30_000 for t in (decided, unscored)])

        await until(reclaimed, timeout=30)
        assert await ttl(still_open) > 30_000  # not complete: kept for the full retention
    agent.close()


async def test_a_wait_for_a_time_the_watermark_never_reaches_leaves_the_queue(
    kafka_bootstrap: str, redis_url: str
) -> None:
    """A marker's ``at`` (or a root span's end, inferred mode) comes from the agent's clock: one
    far in the future queued its trace in the watermark wait set for good (the watermark never
    passes the wall clock), long after the trace's state was gone: one member per such trace,
    forever. Queued at most state_ttl_seconds ahead, it leaves once that has passed."""
    cfg = make_config(kafka_bootstrap, redis_url, redis={"state_ttl_seconds": 2})
    agent = make_agent(cfg)
    async with running_service(cfg) as service, control_client(cfg) as tw:
        trace = agent.trace("my_tool_call")
        await tw.mark_complete(trace, at=datetime(9000, 1, 1, tzinfo=UTC))
        waits, wait = service.store.k.await_watermark, member("default", trace)
        await until(lambda: service.redis.zscore(waits, wait))

        async def left() -> bool:
            return await service.redis.zscore(waits, wait) is None

        await until(left, timeout=30)
        assert not await service.redis.exists(service.store.k.state("default", trace))
    agent.close()


async def test_start_freezes_the_startup_heap_only_when_the_service_owns_the_process(
    kafka_bootstrap: str, redis_url: str
) -> None:
    # Full collections re-scanning the >100k startup objects stalled batches by ~100 ms (p99).
    gc.unfreeze()
    before = gc.get_threshold()
    gc.set_threshold(700, *before[1:])
    assert gc.get_freeze_count() == 0
    try:
        # embedded in an application (the default): the application's collector is left alone
        async with running_service(make_config(kafka_bootstrap, redis_url)):
            assert gc.get_freeze_count() == 0
            assert gc.get_threshold()[0] == 700
        async with ToolwitnessService(make_config(kafka_bootstrap, redis_url), owns_process=True).serving():
            assert gc.get_freeze_count() > 10_000
            assert gc.get_threshold()[0] >= 10_000  # a batch's garbage dies young
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


async def test_the_service_creates_its_topics_with_compacted_observations(kafka_bootstrap: str, redis_url: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    cfg = make_config(kafka_bootstrap, redis_url)
    async with running_service(cfg):
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            t = cfg.kafka.topics
            assert {t.spans, t.control, t.scores, t.observations, t.dlq} <= set(await admin.list_topics())
            (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t.observations)])
            entries = response.to_object()["resources"][0]["config_entries"]
            assert {e["config_names"]: e["config_value"] for e in entries}["cleanup.policy"] == "compact"
        finally:
            await admin.close()
