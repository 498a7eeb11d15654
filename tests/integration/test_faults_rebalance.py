"""Consumer-group rebalances while traces are open (issue 9 d): an instance joins, one leaves.

In-process instances of one consumer group on a 4-partition stack. Every trace is four span
records (root, chat, two tool executions), each keyed on its own partition, so one trace's spans
are consumed by different instances and meet only in Redis. Each trace carries three
expectations, none decidable before the trace's last span: both tools called (TRUE), one tool
called with arguments matching a regex and another tool (TRUE; the matcher must survive being loaded from Redis
by an instance that never saw the control record), a tool never called (FALSE, by the marker's
span count; half the markers come before any span, half after the last).

1. instance a alone: every expectation registered, the first two spans of every trace applied;
2. instance b joins (rebalance): the third span of every trace, applied by both;
3. instance a leaves (graceful stop, rebalance) while the fourth spans and the late markers are
   in flight; b finishes every trace.

Asserted on the raw scores topic: exactly one distinct score_id per expectation, the right
verdict, none missing, none contradicted, re-sends byte-identical. Also: some traces had spans
applied by both instances, and b decided expectations it only ever read from Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from collector.pipeline.service import ToolwitnessService
from scoring.models import ArgumentMatcher, ScoringExpectation, ToolCallRequirement, ToolsCalled
from tests.integration.harness import (
    BatchLog,
    SpanRecord,
    assert_exactly_once,
    expectation_bytes,
    expects,
    fail_on_timeout,
    make_config,
    marker_bytes,
    new_span_id,
    new_trace_id,
    open_stack,
    otlp_span,
    running_service,
    send_located,
    span_partitions,
    split_records,
    until,
    until_split,
)

pytestmark = pytest.mark.integration

PARTITIONS = 4
TRACES = 12


@dataclass
class Trace:
    index: int
    trace_id: str = field(default_factory=new_trace_id)
    records: list[SpanRecord] = field(default_factory=list)  # in order


def build(index: int, t0_ms: int) -> Trace:
    tr = Trace(index)
    root = new_span_id()
    args = json.dumps({"q": f"weather in city {index}", "units": "metric"})
    spans = [
        otlp_span(tr.trace_id, span_id=root, name="agent", start_ms=t0_ms, end_ms=t0_ms + 900),
        otlp_span(tr.trace_id, parent=root, name="chat", start_ms=t0_ms + 1, end_ms=t0_ms + 50,
                  attrs={"gen_ai.operation.name": "chat"}),
        otlp_span(tr.trace_id, parent=root, name="execute_tool search", tool="search", start_ms=t0_ms + 100,
                  end_ms=t0_ms + 150, attrs={"gen_ai.tool.call.arguments": args}),
        otlp_span(tr.trace_id, parent=root, name="execute_tool fetch", tool="fetch", start_ms=t0_ms + 200,
                  end_ms=t0_ms + 250),
    ]
    tr.records = split_records(tr.trace_id, spans, index, PARTITIONS)
    return tr


def regex_expectation() -> ScoringExpectation:
    req = ToolCallRequirement(name="search", arguments=(ArgumentMatcher(path="$.q", regex="^weather in city"),))
    return ScoringExpectation(conditions=(ToolsCalled(tools=(req, ToolCallRequirement(name="fetch"))),))


async def span_count(service: ToolwitnessService, trace_id: str) -> int:
    raw = await service.redis.get(service.store.k.state("default", trace_id))
    return 0 if raw is None else int(json.loads(raw)["n"])


async def test_rebalances_with_open_traces(kafka_bootstrap: str, redis_url: str) -> None:
    started = time.monotonic()
    cfg = make_config(kafka_bootstrap, redis_url)
    cfg_a = cfg.model_copy(update={"instance": "rebalance-a"})
    cfg_b = cfg.model_copy(update={"instance": "rebalance-b"})
    t0 = int(time.time() * 1000) - 60_000
    traces = [build(i, t0 + 1000 * i) for i in range(TRACES)]
    expected: dict[str, str] = {}
    control: list[tuple[str, bytes]] = []
    for tr in traces:
        ids = {f"both-{tr.index}": ("true", expects("search", "fetch")),
               f"regex-{tr.index}": ("true", regex_expectation()),
               f"never-{tr.index}": ("false", expects("delete_db"))}
        for eid, (want, exp) in ids.items():
            expected[eid] = want
            control.append((eid, expectation_bytes(eid, [tr.trace_id], exp)))
        if tr.index % 2 == 0:
            control.append((tr.trace_id, marker_bytes(tr.trace_id, len(tr.records))))
    topics = cfg.kafka.topics
    loaded_by_b: list[str] = []
    located: dict[tuple[int, int], str] = {}  # (partition, offset) of each span record -> trace id
    async with open_stack(cfg) as s:
        async with contextlib.AsyncExitStack() as stack:

            async def send_spans(j: int) -> None:
                located.update(await send_located(s.producer, topics.spans, [(tr.trace_id, tr.records[j])
                                                                             for tr in traces]))

            async def counts_at_least(service: ToolwitnessService, n: int) -> bool:
                return all([await span_count(service, tr.trace_id) >= n for tr in traces])

            a_stack = contextlib.AsyncExitStack()
            stack.push_async_exit(a_stack)
            a = await a_stack.enter_async_context(running_service(cfg_a))
            log_a = BatchLog(a).install()
            await until(lambda: span_partitions(a) == set(range(PARTITIONS)), timeout=30)
            # 1. a alone: every expectation registered, two spans of every trace.
            await s.send(topics.control, control)
            await send_spans(0)
            await send_spans(1)
            await until(lambda: counts_at_least(a, 2), timeout=30)
            async with a.batch_lock:
                pass
            assert not any(s.tw.events(e) for e in expected), "nothing is decidable before the last span"

            # 2. b joins.
            b = await stack.enter_async_context(running_service(cfg_b))
            log_b = BatchLog(b).install()
            load = b.store.load_expectations

            async def counting_load(tenant: str, ids: Any) -> Any:
                out = await load(tenant, ids)
                loaded_by_b.extend(out)
                return out

            b.store.load_expectations = counting_load  # type: ignore[method-assign]
            joined_at = time.monotonic()
            split = await until_split(a, b, PARTITIONS)
            join_s = time.monotonic() - joined_at
            await send_spans(2)
            await until(lambda: counts_at_least(b, 3), timeout=30)
            assert not any(s.tw.events(e) for e in expected), "nothing is decidable before the last span"

            # 3. a leaves while the last spans and the late markers are in flight.
            late = [(tr.trace_id, marker_bytes(tr.trace_id, len(tr.records))) for tr in traces if tr.index % 2]

            async def finish() -> None:
                await send_spans(3)
                await s.send(topics.control, late)

            sending = asyncio.create_task(finish())
            left_at = time.monotonic()
            await a_stack.aclose()  # a: finish the in-flight batch, commit, leave the group
            await until(lambda: span_partitions(b) == set(range(PARTITIONS)), timeout=30)
            leave_s = time.monotonic() - left_at
            await sending
            with fail_on_timeout(lambda: f"not scored after the rebalances: {s.missing(expected)}"):
                await s.all_scored(expected, timeout=45)
            s.only_events(expected)
            client_duplicates = s.tw.duplicates
        resent = assert_exactly_once(await s.scores(), expected)

        shared = log_a.traces(located, topics.spans) & log_b.traces(located, topics.spans)
        assert shared, "no trace had spans applied by both instances"
        assert loaded_by_b, "b decided expectations it only read from Redis"
        print(
            f"\n[rebalance] {len(expected)} expectations on {TRACES} open traces; join: a={split[0]} b={split[1]} "
            f"after {join_s:.1f}s; a left, b took every partition after {leave_s:.1f}s; b loaded "
            f"{len(set(loaded_by_b))} expectations from Redis; traces applied by both={len(shared)}/{TRACES}; "
            f"batches a={len(log_a.batches)} b={len(log_b.batches)}; "
            f"re-sent identical={resent} (client duplicates={client_duplicates}); {time.monotonic() - started:.1f}s"
        )
