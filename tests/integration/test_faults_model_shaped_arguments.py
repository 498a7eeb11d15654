"""What the model writes into tool arguments never stops the service, for any tenant.

Arguments nested ~600 deep fit in 1 KB of model output; judged as arguments, they used to raise
``RecursionError`` in the poll loop, again on every replay of the batch after a restart. Now they
are recorded as a call that ran with arguments that cannot be matched (UNDETERMINED for an
argument check), and an evaluation that raises for any other reason decides its expectation
UNDETERMINED with the error, while the partition moves on. Asserted on the scores topic.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from collector.processors.decide import Decider
from collector.wire.convert import decode_score_event
from scoring.models import ArgumentMatcher, ScoringExpectation, ToolCallRequirement, ToolsCalled
from tests.integration.harness import (
    expectation_bytes,
    expects,
    make_config,
    marker_bytes,
    new_span_id,
    new_trace_id,
    otlp_request,
    otlp_span,
    raw_producer,
    read_until,
    running_service,
    until_registered,
    verdict,
)

pytestmark = pytest.mark.integration

DEEP_LIST = '{"to": ' + "[" * 600 + '"bob@example.com"' + "]" * 600 + "}"
DEEP_OBJECT = '{"to": ' + '{"a": ' * 600 + "1" + "}" * 600 + "}"


def _trace(arguments: str) -> tuple[str, bytes]:
    trace, root = new_trace_id(), new_span_id()
    t0 = int(time.time() * 1000)
    req = otlp_request([
        otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50),
        otlp_span(trace, parent=root, tool="send_email", start_ms=t0 + 1, end_ms=t0 + 2,
                  attrs={"gen_ai.tool.call.arguments": arguments}),
    ])
    return trace, req.SerializeToString()


def _matching(path: str, **kind: Any) -> ScoringExpectation:
    matcher = ArgumentMatcher(path=path, **kind)
    return ScoringExpectation(conditions=(ToolsCalled(tools=(ToolCallRequirement(name="send_email",
                                                                                  arguments=(matcher,)),)),))


async def _scores(bootstrap: str, topic: str, ids: set[str]) -> dict[str, Any]:
    records = await read_until(
        bootstrap, topic, lambda rs: {decode_score_event(r.value or b"").expectation_id for r in rs} >= ids, timeout=60
    )
    return {ev.expectation_id: ev for ev in (decode_score_event(r.value or b"") for r in records)}


async def test_arguments_nested_deep_are_a_call_that_ran_with_unmatchable_arguments_across_a_restart(
    kafka_bootstrap: str, redis_url: str
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    t = cfg.kafka.topics
    wanted: dict[str, tuple[str, ScoringExpectation, str]] = {}
    records = []
    for name, arguments in (("list", DEEP_LIST), ("object", DEEP_OBJECT)):
        trace, record = _trace(arguments)
        records.append((trace, record))
        wanted[f"{name}-ran"] = (trace, expects("send_email"), "true")
        wanted[f"{name}-equals"] = (trace, _matching("$.to", equals="bob@example.com"), "undetermined")
        wanted[f"{name}-regex"] = (trace, _matching("$..a", regex="1"), "undetermined")
        wanted[f"{name}-one-of"] = (trace, _matching("$.to[0]", one_of=("x", "y")), "undetermined")
    async with running_service(cfg), raw_producer(cfg) as producer:
        for eid, (trace, exp, _) in wanted.items():
            await producer.send_and_wait(t.control, key=eid.encode(), value=expectation_bytes(eid, [trace], exp))
        await until_registered(cfg, list(wanted))
        for trace, record in records:
            await producer.send_and_wait(t.spans, key=trace.encode(), value=record)
            await producer.send_and_wait(t.control, key=trace.encode(), value=marker_bytes(trace, 2))
        events = await _scores(kafka_bootstrap, t.scores, set(wanted))
    assert {e: verdict(ev) for e, ev in events.items() if e in wanted} == {e: w for e, (_, _, w) in wanted.items()}
    # A new instance replays nothing it cannot read: more of the same, and a plain trace, decided.
    trace, record = _trace(DEEP_LIST)
    plain, plain_record = _trace('{"to": "bob@example.com"}')
    after = {"after-deep": (trace, _matching("$.to", equals="x"), "undetermined"),
             "after-plain": (plain, _matching("$.to", equals="bob@example.com"), "true")}
    async with running_service(cfg), raw_producer(cfg) as producer:
        for eid, (tr, exp, _) in after.items():
            await producer.send_and_wait(t.control, key=eid.encode(), value=expectation_bytes(eid, [tr], exp))
        await until_registered(cfg, list(after))
        for tr, rec in ((trace, record), (plain, plain_record)):
            await producer.send_and_wait(t.spans, key=tr.encode(), value=rec)
            await producer.send_and_wait(t.control, key=tr.encode(), value=marker_bytes(tr, 2))
        events = await _scores(kafka_bootstrap, t.scores, set(after))
    assert {e: verdict(events[e]) for e in after} == {e: w for e, (_, _, w) in after.items()}


async def test_an_evaluation_that_raises_decides_its_expectation_undetermined_and_the_rest_goes_on(
    kafka_bootstrap: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Decider.judge

    async def judge(self: Decider, exp: Any, observation: Any, *, final: bool) -> Any:
        if exp.expectation_id.startswith("poison"):
            raise RuntimeError("a judge that breaks on this evidence")
        return await real(self, exp, observation, final=final)

    monkeypatch.setattr(Decider, "judge", judge)
    cfg = make_config(kafka_bootstrap, redis_url)
    t = cfg.kafka.topics
    first, first_record = _trace('{"to": "a@example.com"}')
    later, later_record = _trace('{"to": "b@example.com"}')
    async with running_service(cfg), raw_producer(cfg) as producer:
        for eid, trace in (("poison", first), ("healthy", first), ("later", later)):
            await producer.send_and_wait(t.control, key=eid.encode(),
                                         value=expectation_bytes(eid, [trace], expects("send_email")))
        await until_registered(cfg, ["poison", "healthy", "later"])
        await producer.send_and_wait(t.spans, key=first.encode(), value=first_record)
        events = await _scores(kafka_bootstrap, t.scores, {"poison", "healthy"})
        await producer.send_and_wait(t.spans, key=later.encode(), value=later_record)
        events |= await _scores(kafka_bootstrap, t.scores, {"later"})
    assert verdict(events["poison"]) == "undetermined"
    assert events["poison"].metadata["error"] == "evaluation_failed"
    assert verdict(events["healthy"]) == "true" and verdict(events["later"]) == "true"
