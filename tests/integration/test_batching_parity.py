"""The service gives the library's verdict on a complete trace, however its spans are timed and
batched (from a differential review: library vs service on the same spans, Kafka and Redis).

- End times are kept to the nanosecond: one call recorded twice (a framework's OpenInference TOOL
  span around the tool boundary's GenAI span, one call id) is one execution only when one record
  holds the other, and the service decided that on end times rounded to the microsecond.
- Each export delivered twice (at-least-once) in one consumer batch is a replay, not conflicting
  evidence: the service kept such a trace incomplete, so its absence checks ended UNDETERMINED.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable
from datetime import timedelta
from typing import Any

import pytest

from scoring.models import ScoringExpectation, ToolCallRequirement, ToolsCalled, TraceScorable
from scoring.models.evidence import CaptureState
from tests.integration.harness import (
    TOOL_TREES,
    control_client,
    drop_stack,
    expectation_bytes,
    expects,
    make_config,
    marker_bytes,
    new_span_id,
    new_trace_id,
    otlp_request,
    otlp_span,
    raw_producer,
    running_service,
    until,
    verdict,
)

pytestmark = pytest.mark.integration


def _search(**count: int) -> ScoringExpectation:
    return ScoringExpectation(conditions=(ToolsCalled(tools=(ToolCallRequirement(name="search", **count),)),))


def _call_recorded_twice(trace: str, t0_ms: int, outer_end: int, inner: tuple[int, int]) -> list[Any]:
    """Root, an OpenInference TOOL span [S, S + outer_end] and, under it, a GenAI execute_tool span
    [S + inner[0], S + inner[1]] (ns), both of call ``call-1``."""
    root, outer_id = new_span_id(), new_span_id()
    s = (t0_ms + 1) * 1_000_000
    outer = otlp_span(
        trace,
        span_id=outer_id,
        parent=root,
        name="tool search",
        start_ms=0,
        end_ms=0,
        attrs={"openinference.span.kind": "TOOL", "tool.name": "search", "tool.id": "call-1", "input.value": "{}"},
    )
    outer.start_time_unix_nano, outer.end_time_unix_nano = s, s + outer_end
    gen_ai = otlp_span(
        trace,
        parent=outer_id,
        tool="search",
        start_ms=0,
        end_ms=0,
        attrs={"gen_ai.tool.call.id": "call-1", "gen_ai.tool.call.arguments": "{}"},
    )
    gen_ai.start_time_unix_nano, gen_ai.end_time_unix_nano = s + inner[0], s + inner[1]
    return [gen_ai, outer, otlp_span(trace, span_id=root, name="agent", start_ms=t0_ms, end_ms=t0_ms + 50)]


@pytest.mark.parametrize(
    ("outer_end", "inner", "calls"),
    [
        # held within by 499 ns: one call (was two: the outer's end rounded down below the inner's)
        (1999, (500, 1500), 1),
        # outlives the outer by 499 ns: two instrumentations' records of one id that overlap are
        # one call recorded twice (as two instrumentations on one app write them)
        (1000, (500, 1499), 1),
        # a clock step ended the outer before it started: disjoint, two (was "not ended", one)
        (-1000, (500, 1500), 2),
    ],
    ids=["nested-by-ns", "overlapping-by-ns", "outer-ends-before-start"],
)
async def test_one_call_recorded_twice_is_counted_on_exact_end_times(
    kafka_bootstrap: str, redis_url: str, outer_end: int, inner: tuple[int, int], calls: int
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url, scorers=TOOL_TREES)
    trace = new_trace_id()
    spans = _call_recorded_twice(trace, int(time.time() * 1000) - 5_000, outer_end, inner)
    async with running_service(cfg), control_client(cfg) as tw, raw_producer(cfg) as producer:
        at_least_two = await tw.expect(
            TraceScorable(trace_ids=(trace,)), _search(min_count=2), deadline=timedelta(seconds=30)
        )
        at_most_one = await tw.expect(
            TraceScorable(trace_ids=(trace,)), _search(max_count=1), deadline=timedelta(seconds=30)
        )
        # the framework's record and the boundary's come from two instrumentations (two scopes):
        # one instrumentation's records of one id are two calls
        req = otlp_request([spans[0], spans[2]])
        framework = req.resource_spans[0].scope_spans.add()
        framework.scope.name = "openinference.instrumentation.framework"
        framework.spans.append(spans[1])
        await producer.send_and_wait(cfg.kafka.topics.spans, req.SerializeToString(), key=trace.encode())
        await tw.mark_complete(trace, span_count=len(spans))
        two = await tw.wait_for(at_least_two, timeout=30)
        one = await tw.wait_for(at_most_one, timeout=30)
    assert (verdict(two), verdict(one)) == (("true", "false") if calls == 2 else ("false", "true")), (
        two.rationale,
        one.rationale,
    )


async def test_each_export_delivered_twice_in_one_batch_is_a_replay_not_a_conflict(
    kafka_bootstrap: str, redis_url: str
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url, scorers=TOOL_TREES)
    trace, root = new_trace_id(), new_span_id()
    t0 = int(time.time() * 1000) - 5_000
    search = otlp_span(trace, parent=root, tool="search", start_ms=t0 + 1, end_ms=t0 + 2)
    fetch = otlp_span(trace, parent=root, tool="fetch", start_ms=t0 + 3, end_ms=t0 + 4)
    agent = otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50)
    records = [otlp_request(s).SerializeToString() for s in ([search], [search], [fetch], [fetch], [agent])]
    try:
        async with control_client(cfg) as tw, raw_producer(cfg) as producer:
            never_delete = "never-delete-" + trace
            search_once = "search-once-" + trace
            for ident, exp, tree in (
                (never_delete, expects("delete"), "not_tools"),
                (search_once, _search(max_count=1), "tools"),
            ):
                await producer.send_and_wait(
                    cfg.kafka.topics.control,
                    expectation_bytes(ident, [trace], exp, scorer=tree, deadline=timedelta(seconds=20)),
                    key=trace.encode(),
                )
            # produced before the service starts: its first poll takes them together, in one batch
            sent = [await producer.send(cfg.kafka.topics.spans, r, key=trace.encode()) for r in records]
            await asyncio.gather(*sent)
            await producer.send_and_wait(cfg.kafka.topics.control, marker_bytes(trace, 3), key=trace.encode())
            async with running_service(cfg):
                a = await tw.wait_for(never_delete, timeout=30)
                b = await tw.wait_for(search_once, timeout=30)
        assert (verdict(a), verdict(b)) == ("true", "true"), (list(a.coverage.reasons), list(b.coverage.reasons))
        assert "conflicting_evidence" not in a.coverage.reasons
    finally:
        await drop_stack(cfg)


@pytest.mark.parametrize(("second_path", "expected"), [("/tmp/a", "false"), ("/etc/b", "undetermined")])
async def test_copies_of_a_span_differing_only_past_the_argument_cut_conflict(
    kafka_bootstrap: str, redis_url: str, second_path: str, expected: str
) -> None:
    # Both copies were cut to max_argument_bytes before the replay check compared them: they
    # looked identical, so the trace was complete and "delete never ran" decided (FALSE for "delete
    # ran") where the library sees conflicting evidence. An exact replay still is none.
    cfg = make_config(kafka_bootstrap, redis_url, scorers=TOOL_TREES)
    trace, root, tool_id = new_trace_id(), new_span_id(), new_span_id()
    t0 = int(time.time() * 1000) - 5_000

    def copy(path: str) -> Any:
        args = json.dumps({"pad": "x" * 2000, "path": path})
        return otlp_span(
            trace,
            span_id=tool_id,
            parent=root,
            tool="search",
            start_ms=t0 + 1,
            end_ms=t0 + 2,
            attrs={"gen_ai.tool.call.arguments": args},
        )

    agent = otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50)
    async with running_service(cfg), control_client(cfg) as tw, raw_producer(cfg) as producer:
        ident = await tw.expect(TraceScorable(trace_ids=(trace,)), expects("delete"), deadline=timedelta(seconds=5))
        for spans in ([agent, copy("/tmp/a")], [copy(second_path)]):
            await producer.send_and_wait(
                cfg.kafka.topics.spans, otlp_request(spans).SerializeToString(), key=trace.encode()
            )
        await tw.mark_complete(trace, span_count=2)
        ev = await tw.wait_for(ident, timeout=30)
    assert verdict(ev) == expected, (ev.rationale, list(ev.coverage.reasons))


@pytest.mark.parametrize("order", ["flagged-first", "cut-first"])
async def test_a_copy_the_agent_flagged_cut_and_one_the_service_cut_differ(
    kafka_bootstrap: str, redis_url: str, order: str
) -> None:
    # The agent may flag its own arguments cut (no digest: the service cut nothing); the other
    # copy, longer, is cut by the service (with a digest). Same 1 KiB kept, other arguments: a
    # conflict, not a replay (the digest was compared only when both records had one).
    cfg = make_config(kafka_bootstrap, redis_url, scorers=TOOL_TREES)
    trace, root, tool_id = new_trace_id(), new_span_id(), new_span_id()
    t0 = int(time.time() * 1000) - 5_000
    full = json.dumps({"pad": "x" * 2000, "path": "/etc/b"})
    kept = full.encode()[:1024].decode()

    def copy(args: str, flagged: bool) -> Any:
        attrs: dict[str, Any] = {"gen_ai.tool.call.arguments": args}
        if flagged:
            attrs["toolwitness.tool.call.arguments.truncated"] = True
        return otlp_span(
            trace, span_id=tool_id, parent=root, tool="search", start_ms=t0 + 1, end_ms=t0 + 2, attrs=attrs
        )

    first, second = (copy(kept, True), copy(full, False))
    if order == "cut-first":
        first, second = second, first
    agent = otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50)
    async with running_service(cfg), control_client(cfg) as tw, raw_producer(cfg) as producer:
        ident = await tw.expect(TraceScorable(trace_ids=(trace,)), expects("delete"), deadline=timedelta(seconds=5))
        for spans in ([agent, first], [second]):
            await producer.send_and_wait(
                cfg.kafka.topics.spans, otlp_request(spans).SerializeToString(), key=trace.encode()
            )
        await tw.mark_complete(trace, span_count=2)
        ev = await tw.wait_for(ident, timeout=30)
    assert verdict(ev) == "undetermined", (ev.rationale, list(ev.coverage.reasons))


async def test_a_cut_span_replayed_by_a_service_that_keeps_hex_runs_after_the_cut_is_a_replay(
    kafka_bootstrap: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A span whose arguments the service cut was stored by a version that kept no hex runs after
    # the cut; replayed (same span, same arguments) by one that does, its kept text differs. Its
    # digest is the same: a replay, not conflicting evidence (which would make absence unprovable).
    from collector.processors import normalize

    cfg = make_config(kafka_bootstrap, redis_url, scorers=TOOL_TREES)
    trace, root, tool_id = new_trace_id(), new_span_id(), new_span_id()
    t0 = int(time.time() * 1000) - 5_000
    args = json.dumps({"pad": "x" * 2000, "ref": "3f9a0c1e5b7d2468ace0"})
    tool = otlp_span(trace, span_id=tool_id, parent=root, tool="search", start_ms=t0 + 1, end_ms=t0 + 2,
                     attrs={"gen_ai.tool.call.arguments": args})
    agent = otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50)
    tokens = normalize.canary_tokens
    async with running_service(cfg) as service, control_client(cfg) as tw, raw_producer(cfg) as producer:

        async def applied() -> int:
            raw = await service.redis.get(service.store.k.state("default", trace))
            return 0 if raw is None else int(json.loads(raw)["n"])

        ident = await tw.expect(TraceScorable(trace_ids=(trace,)), expects("delete"), deadline=timedelta(seconds=20))
        monkeypatch.setattr(normalize, "canary_tokens", lambda *a, **k: ())  # the earlier version
        await producer.send_and_wait(cfg.kafka.topics.spans, otlp_request([agent, tool]).SerializeToString(),
                                     key=trace.encode())
        await until(lambda: _at_least(applied(), 2))
        monkeypatch.setattr(normalize, "canary_tokens", tokens)
        assert normalize.cap_arguments(args, CaptureState.CAPTURED, 1024)[0] != args.encode()[:1024].decode()
        await producer.send_and_wait(cfg.kafka.topics.spans, otlp_request([tool]).SerializeToString(),
                                     key=trace.encode())
        await tw.mark_complete(trace, span_count=2)
        ev = await tw.wait_for(ident, timeout=30)
    assert verdict(ev) == "false", (ev.rationale, list(ev.coverage.reasons))


async def _at_least(value: Awaitable[int], n: int) -> bool:
    return await value >= n
