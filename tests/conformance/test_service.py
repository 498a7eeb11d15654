"""The real frameworks' spans through the streaming service: Kafka, Redis, the service, the score topic.

One scenario per framework: its OTLP spans are written to the spans topic as the Collector's
kafkaexporter would (one record), every check is registered as an expectation first, each trace
is then marked complete with its span count, and the scores a downstream consumer reads must be
what the tool bodies received allows -- and what the in-process scorer says.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from aiokafka import ConsumerRecord

from collector.wire.convert import decode_score_event
from tests.conformance.checks import Check, wrong
from tests.conformance.matrix import Judged
from tests.conformance.scenarios import SCENARIOS, Scenario
from tests.integration.harness import (
    TOOL_TREES,
    expectation_bytes,
    make_config,
    marker_bytes,
    raw_producer,
    read_until,
    running_service,
    until_registered,
    verdict,
)

pytestmark = [pytest.mark.conformance, pytest.mark.integration]

#: one scenario per framework, each with what makes that framework's spans hard to read
THROUGH_THE_SERVICE = (
    "pydantic_ai_native.validation",
    "openai_agents.openinference_handoff",
    "langchain_agents.both",
    "smolagents_oi.openinference",
    "llamaindex_oi.openinference",
    "adk_agents.native_parallel",
    "crewai_oi.openinference_react_events",
)


def test_every_framework_covered() -> None:
    assert {s.framework for s in SCENARIOS} == {s.framework for s in SCENARIOS if s.id in THROUGH_THE_SERVICE}


async def test_the_service_scores_real_framework_spans_as_the_tools_ran(
    kafka_bootstrap: str, redis_url: str, conformance_judged: Callable[[Scenario], Judged]
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url, scorers=TOOL_TREES)
    t = cfg.kafka.topics
    wanted: dict[str, tuple[Scenario, Check, str]] = {}
    judged = {s.id: conformance_judged(s) for s in SCENARIOS if s.id in THROUGH_THE_SERVICE}
    async with running_service(cfg), raw_producer(cfg) as producer:
        for s in SCENARIOS:
            if s.id not in judged:
                continue
            run, checks, got = judged[s.id]
            for i, check in enumerate(checks):
                if not check.complete:
                    continue  # judged before the marker: the service decides as spans come
                eid = f"{s.id}#{i}"
                wanted[eid] = (s, check, got[check.id])
                record = expectation_bytes(
                    eid, run.trace_ids, check.expectation, scorer="not_tools" if check.invert else "tools"
                )
                await producer.send(t.control, key=eid.encode(), value=record)
        await producer.flush()
        await until_registered(cfg, list(wanted), timeout=60)
        for run, _, _ in judged.values():
            await producer.send_and_wait(t.spans, value=run.otlp)
        for run, _, _ in judged.values():
            for trace_id, count in run.span_counts().items():
                await producer.send_and_wait(t.control, key=trace_id.encode(), value=marker_bytes(trace_id, count))

        def all_scored(records: list[ConsumerRecord[bytes, bytes]]) -> bool:
            return {decode_score_event(r.value or b"").expectation_id for r in records} >= set(wanted)

        records = await read_until(kafka_bootstrap, t.scores, all_scored, timeout=90)
    first: dict[str, str] = {}
    for r in records:
        ev = decode_score_event(r.value or b"")
        if ev.expectation_id in wanted and ev.version == 1:
            first[ev.expectation_id] = verdict(ev).upper()
    revised = sorted({decode_score_event(r.value or b"").expectation_id for r in records} - set(first))
    assert not revised, f"scores with no first version: {revised}"
    mismatches = [
        f"{s.id}: {c.id}: the service says {first[eid]}, in-process {in_process}, truth {c.expected}"
        for eid, (s, c, in_process) in wanted.items()
        if wrong(c, first[eid]) or first[eid] != in_process
    ]
    assert not mismatches, "\n".join(mismatches)
