"""Expectations on one scope decided in one evaluation share their evidence: one observation.

A red-team harness registers several expectations per attempt ("search ran", "search ran with
these arguments", "delete_db never ran"): those a span decides together are judged on the same
evidence, so their scores cite one observation id, and one record of it is written (not one per
score: same key, same bytes). Measured on the old code: three identical observation records.
"""

from __future__ import annotations

import time

import pytest

from collector.wire.convert import decode_observation, decode_score_event
from tests.integration.harness import (
    expectation_bytes,
    expects,
    make_config,
    new_trace_id,
    raw_producer,
    read_all,
    read_until,
    running_service,
    until_registered,
    whole_trace,
)

pytestmark = pytest.mark.integration


async def test_expectations_decided_together_cite_one_observation_record(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    t = cfg.kafka.topics
    trace_id = new_trace_id()
    req, _ = whole_trace(trace_id, int(time.time() * 1000), ("search", "fetch"))
    other = new_trace_id()
    other_req, _ = whole_trace(other, int(time.time() * 1000), ("search",))
    ids = ["search-ran", "fetch-ran", "both-ran"]
    wanted = {"search-ran": expects("search"), "fetch-ran": expects("fetch"), "both-ran": expects("search", "fetch")}
    async with running_service(cfg), raw_producer(cfg) as producer:
        for eid, exp in wanted.items():
            await producer.send_and_wait(t.control, key=eid.encode(), value=expectation_bytes(eid, [trace_id], exp))
        await producer.send_and_wait(t.control, key=b"elsewhere",
                                     value=expectation_bytes("elsewhere", [other], expects("search")))
        await until_registered(cfg, [*ids, "elsewhere"])
        # both traces in one record: one batch decides all four
        req.resource_spans.extend(other_req.resource_spans)
        await producer.send_and_wait(t.spans, value=req.SerializeToString())
        scores = await read_until(kafka_bootstrap, t.scores, lambda rs: len(rs) >= 4, timeout=60)
    events = {ev.expectation_id: ev for ev in (decode_score_event(r.value or b"") for r in scores)}
    assert {e: ev.value for e, ev in events.items()} == dict.fromkeys([*ids, "elsewhere"], "true")
    (shared,) = {tuple(events[e].observation_ids) for e in ids}
    assert events["elsewhere"].observation_ids[0] not in shared  # another scope, other evidence
    records = [r for r in await read_all(kafka_bootstrap, t.observations) if (r.key or b"").decode() in shared]
    assert len(records) == 1, f"{len(records)} records of the shared observation {shared}"
    obs = decode_observation(records[0].value or b"")
    assert sorted(e.name for e in obs.tool_executions) == ["fetch", "search"]
