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
    assert_exactly_once,
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
    read_all,
    running_service,
    until,
)

pytestmark = pytest.mark.integration

PARTITIONS = 4
TRACES = 12


@dataclass
class Trace:
    index: int
    trace_id: str = field(default_factory=new_trace_id)
    records: list[tuple[int, bytes, bytes]] = field(default_factory=list)  # (partition, key, value), in order


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
    for j, span in enumerate(spans):
        tr.records.append(((index + j) % PARTITIONS, f"{tr.trace_id}:{j}".encode(),
                           otlp_request([span]).SerializeToString()))
    return tr


def regex_expectation() -> ScoringExpectation:
    req = ToolCallRequirement(name="search", arguments=(ArgumentMatcher(path="$.q", regex="^weather in city"),))
    return ScoringExpectation(conditions=(ToolsCalled(tools=(req, ToolCallRequirement(name="fetch"))),))


def assigned(service: ToolwitnessService) -> set[int]:
    c = service.consumer
    spans = service.cfg.kafka.topics.spans
    return set() if c is None else {tp.partition for tp in c.assignment() if tp.topic == spans}


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
    try:
        async with control_client(cfg) as tw, raw_producer(cfg) as producer, contextlib.AsyncExitStack() as stack:

            async def send_spans(j: int) -> None:
                futs = [await producer.send(topics.spans, value=tr.records[j][2], key=tr.records[j][1],
                                            partition=tr.records[j][0]) for tr in traces]
                for tr, md in zip(traces, await asyncio.gather(*futs), strict=True):
                    located[(md.partition, md.offset)] = tr.trace_id

            async def counts_at_least(service: ToolwitnessService, n: int) -> bool:
                return all([await span_count(service, tr.trace_id) >= n for tr in traces])

            a_stack = contextlib.AsyncExitStack()
            stack.push_async_exit(a_stack)
            a = await a_stack.enter_async_context(running_service(cfg_a))
            log_a = BatchLog(a).install()
            await until(lambda: assigned(a) == set(range(PARTITIONS)), timeout=30)
            # 1. a alone: every expectation registered, two spans of every trace.
            await asyncio.gather(*[await producer.send(topics.control, value=v, key=k.encode()) for k, v in control])
            await send_spans(0)
            await send_spans(1)
            await until(lambda: counts_at_least(a, 2), timeout=30)
            async with a.batch_lock:
                pass
            assert not any(tw.events(e) for e in expected), "nothing is decidable before the last span"

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
            await until(lambda: (pa := assigned(a)) and (pb := assigned(b)) and not pa & pb
                        and pa | pb == set(range(PARTITIONS)), timeout=30)
            join_s = time.monotonic() - joined_at
            split = (sorted(assigned(a)), sorted(assigned(b)))
            await send_spans(2)
            await until(lambda: counts_at_least(b, 3), timeout=30)
            assert not any(tw.events(e) for e in expected), "nothing is decidable before the last span"

            # 3. a leaves while the last spans and the late markers are in flight.
            late = [(tr.trace_id, marker_bytes(tr.trace_id, len(tr.records))) for tr in traces if tr.index % 2]

            async def finish() -> None:
                await send_spans(3)
                await asyncio.gather(*[await producer.send(topics.control, value=v, key=k.encode()) for k, v in late])

            sending = asyncio.create_task(finish())
            left_at = time.monotonic()
            await a_stack.aclose()  # a: finish the in-flight batch, commit, leave the group
            await until(lambda: assigned(b) == set(range(PARTITIONS)), timeout=30)
            leave_s = time.monotonic() - left_at
            await sending
            try:
                await asyncio.gather(*[tw.wait_for(e, timeout=45) for e in expected])
            except TimeoutError:
                pytest.fail(f"not scored after the rebalances: {[e for e in expected if not tw.events(e)]}")
            for eid in expected:
                assert len(tw.events(eid)) == 1, (eid, tw.events(eid))
            client_duplicates = tw.duplicates
        resent = assert_exactly_once(await read_all(kafka_bootstrap, topics.scores), expected)

        def traces_of(log: BatchLog) -> set[str]:
            return {located[(p, o)] for batch in log.batches for (t, p, o) in batch if t == topics.spans}

        shared = traces_of(log_a) & traces_of(log_b)
        assert shared, "no trace had spans applied by both instances"
        assert loaded_by_b, "b decided expectations it only read from Redis"
        print(
            f"\n[rebalance] {len(expected)} expectations on {TRACES} open traces; join: a={split[0]} b={split[1]} "
            f"after {join_s:.1f}s; a left, b took every partition after {leave_s:.1f}s; b loaded "
            f"{len(set(loaded_by_b))} expectations from Redis; traces applied by both={len(shared)}/{TRACES}; "
            f"batches a={len(log_a.batches)} b={len(log_b.batches)}; "
            f"re-sent identical={resent} (client duplicates={client_duplicates}); {time.monotonic() - started:.1f}s"
        )
    finally:
        await drop_stack(cfg)
