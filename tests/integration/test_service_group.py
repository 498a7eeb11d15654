"""Two service instances in one consumer group, one trace's spans spread over partitions
(issue 4 acceptance 4).

Each span of a trace is its own OTLP record with its own key, sent to an explicit partition,
so the spans of one trace are consumed by BOTH instances and meet only in Redis. Completion
markers (with span counts) are sent before the spans for half of the traces, so the instance
that sees the last span is often not the one that saw the marker. Half-way through, one
instance leaves the group (graceful stop) while records are in flight, and the other takes
its partitions over. Everything is asserted on what a downstream consumer reads from the
scores topic: exactly one distinct score_id per expectation, the right verdict, version 1
only, and any re-sent event byte-identical to the first.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import pytest

from tests.integration.harness import (
    BatchLog,
    SpanRecord,
    Stack,
    assert_exactly_once,
    expectation_bytes,
    expects,
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
    verdict,
)

pytestmark = pytest.mark.integration

PARTITIONS = 4
TRACES_PER_PHASE = 10


@dataclass
class Trace:
    index: int
    trace_id: str = field(default_factory=new_trace_id)
    records: list[SpanRecord] = field(default_factory=list)
    spans: int = 0
    tools: tuple[str, ...] = ()
    true_id: str = ""
    false_id: str = ""


def build_trace(index: int, t0_ms: int) -> Trace:
    """root + an LLM span + two tool spans (+ a third for every other trace), one record each,
    each record with its own key on partition (index + j) % 4."""
    tr = Trace(index)
    root = new_span_id()
    tools = ("search", f"fetch_{index % 3}") + (("summarize",) if index % 2 else ())
    spans = [otlp_span(tr.trace_id, span_id=root, name="agent", start_ms=t0_ms, end_ms=t0_ms + 900)]
    spans.append(otlp_span(tr.trace_id, parent=root, name="chat", start_ms=t0_ms + 1, end_ms=t0_ms + 50,
                           attrs={"gen_ai.operation.name": "chat"}))
    for k, tool in enumerate(tools):
        spans.append(otlp_span(tr.trace_id, parent=root, name=f"execute_tool {tool}", tool=tool,
                               start_ms=t0_ms + 100 * (k + 1), end_ms=t0_ms + 100 * (k + 1) + 50))
    tr.records = split_records(tr.trace_id, spans, index, PARTITIONS)
    tr.spans = len(spans)
    tr.tools = tools
    tr.true_id = f"true-{index}-{tr.trace_id[:8]}"
    tr.false_id = f"false-{index}-{tr.trace_id[:8]}"
    return tr


async def send_phase(s: Stack, traces: list[Trace]) -> dict[tuple[int, int], str]:
    """Expectations, markers and spans of ``traces``, interleaved; returns (partition, offset) -> trace id
    of every span record."""
    control: list[tuple[str, bytes]] = []
    for tr in traces:
        control.append((tr.true_id, expectation_bytes(tr.true_id, [tr.trace_id], expects(*tr.tools[:2]))))
        control.append((tr.false_id, expectation_bytes(tr.false_id, [tr.trace_id], expects("delete_db"))))
        if tr.index % 2 == 0:  # the marker comes before any span of the trace
            control.append((tr.trace_id, marker_bytes(tr.trace_id, tr.spans)))
    await s.send(s.topics.control, control)
    located: dict[tuple[int, int], str] = {}
    rounds = max(len(tr.records) for tr in traces)
    for j in range(rounds):  # span j of every trace, then span j + 1 of every trace, ...
        pending = [(tr.trace_id, tr.records[j]) for tr in traces if j < len(tr.records)]
        located.update(await send_located(s.producer, s.topics.spans, pending))
    late = [tr for tr in traces if tr.index % 2 == 1]  # the marker comes after every span of the trace
    await s.send(s.topics.control, [(tr.trace_id, marker_bytes(tr.trace_id, tr.spans)) for tr in late])
    return located


async def test_two_instances_one_group_traces_across_partitions(kafka_bootstrap: str, redis_url: str) -> None:
    started = time.monotonic()
    cfg = make_config(kafka_bootstrap, redis_url)
    cfg_a = cfg.model_copy(update={"instance": "group-a"})
    cfg_b = cfg.model_copy(update={"instance": "group-b"})
    t0 = int(time.time() * 1000) - 60_000
    phase1 = [build_trace(i, t0 + 1000 * i) for i in range(TRACES_PER_PHASE)]
    phase2 = [build_trace(i, t0 + 1000 * i) for i in range(TRACES_PER_PHASE, 2 * TRACES_PER_PHASE)]
    everything = phase1 + phase2
    expected = {e: want for tr in everything for e, want in ((tr.true_id, "true"), (tr.false_id, "false"))}
    async with open_stack(cfg) as s:
        async with running_service(cfg_a) as a:
            log_a = BatchLog(a).install()
            async with contextlib.AsyncExitStack() as b_stack:
                b = await b_stack.enter_async_context(running_service(cfg_b))
                log_b = BatchLog(b).install()
                # Both members hold spans partitions, disjoint, together all four.
                split = await until_split(a, b, PARTITIONS)

                located = await send_phase(s, phase1)
                await s.all_scored([e for tr in phase1 for e in (tr.true_id, tr.false_id)], timeout=45)

                # Phase 2: records in flight while instance b leaves the group (graceful stop:
                # finish the in-flight batch, commit, leave); a takes every partition over.
                before = len(log_b.batches)
                sending = asyncio.create_task(send_phase(s, phase2))
                await until(lambda: len(log_b.batches) > before)  # b is consuming phase 2 ...
                await b_stack.aclose()  # ... and leaves the group mid-stream
            located.update(await sending)
            await until(lambda: span_partitions(a) == set(range(PARTITIONS)), timeout=30)
            await s.all_scored([e for tr in phase2 for e in (tr.true_id, tr.false_id)], timeout=45)

            # What a downstream consumer sees, through the client (deduplicated by score_id).
            events = s.only_events(expected)
            triggers: dict[str, int] = {}
            for eid, want in expected.items():
                assert verdict(events[eid]) == want, (eid, events[eid])
                assert events[eid].version == 1
            for tr in everything:
                false_ev = events[tr.false_id]
                assert false_ev.coverage.complete, false_ev.coverage  # absence proven by the marker's span count
                triggers[false_ev.trigger] = triggers.get(false_ev.trigger, 0) + 1
            client_duplicates = s.tw.duplicates

        # ... and raw, record by record: one score_id per expectation, re-sends byte-identical.
        records = await s.scores()
        resent = assert_exactly_once(records, expected)

        # The scenario really was shared: spans of one trace were processed by both instances.
        shared = log_a.traces(located, s.topics.spans) & log_b.traces(located, s.topics.spans)
        assert shared, "no trace had spans consumed by both instances"
        print(
            f"\n[group] partitions a={split[0]} b={split[1]}; {len(expected)} expectations, "
            f"{len(records)} score records, {resent} re-sent identical (client duplicates={client_duplicates}); "
            f"traces split across instances={len(shared)}/{len(everything)}; FALSE triggers={triggers}; "
            f"batches a={len(log_a.batches)} b={len(log_b.batches)}; {time.monotonic() - started:.1f}s"
        )
