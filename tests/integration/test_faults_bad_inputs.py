"""The bad-input corpus through real Kafka and the real service (issue 9).

Every file of tests/data/bad_inputs is produced to the topic its manifest names (with its
headers), each one between good traces on the same partition, before the service starts, so
bad and good records share batches. Asserted: each bad record is on the DLQ with the documented
reason (found by its ``toolwitness-dlq-source`` header), counted once in
``toolwitness_dlq_records_total{reason}``; nothing else is dead-lettered; every good expectation
is scored right; the poll loop never ends; no Redis key was written for a tenant a bad record
named. One otlp_proto stack (span + control corpus) and one otlp_json stack.

A last test feeds an expectation the configured tree cannot judge (no conditions for the
``tools`` tree): a known bug (see KNOWN_BUG) makes it crash the poll loop.
"""

from __future__ import annotations

import asyncio
import json
import time
import traceback
from pathlib import Path
from typing import Any

import pytest

from collector.config import ServiceConfig
from collector.wire.gen import common_pb2, control_pb2
from tests.integration.harness import (
    BatchLog,
    control_client,
    counter_value,
    drop_stack,
    expectation_bytes,
    expects,
    header,
    make_config,
    marker_bytes,
    new_trace_id,
    otlp_json,
    raw_producer,
    read_all,
    read_until,
    redis_keys,
    running_service_prepared,
    service_and_task,
    until,
    verdict,
    whole_trace,
)

pytestmark = pytest.mark.integration

CORPUS = Path(__file__).resolve().parents[1] / "data" / "bad_inputs"
MANIFEST: dict[str, Any] = json.loads((CORPUS / "manifest.json").read_text())
DLQ_METRIC = "toolwitness_dlq_records_total"


def corpus_cfg(kafka_bootstrap: str, redis_url: str, encoding: str) -> ServiceConfig:
    over = json.loads(json.dumps(MANIFEST["config"]))
    over["kafka"]["encoding"] = encoding
    return make_config(kafka_bootstrap, redis_url, **over)


async def run_corpus(cfg: ServiceConfig, entries: list[dict[str, Any]]) -> str:
    started = time.monotonic()
    topics = cfg.kafka.topics
    t0 = int(time.time() * 1000) - 60_000
    encode = otlp_json if cfg.kafka.encoding == "otlp_json" else (lambda r: r.SerializeToString())
    expected: dict[str, str] = {}
    where: dict[tuple[str, int, int], str] = {}  # (topic, partition, offset) -> corpus file, or "good"
    reasons = [e["reason"] for e in entries]
    before = {r: counter_value(DLQ_METRIC, {"component": "exporter/kafka", "reason": r}) for r in set(reasons)}

    async def good(producer: Any, n: int, partition: int) -> None:
        trace_id = new_trace_id()
        req, count = whole_trace(trace_id, t0 + 100 * n)
        md = await producer.send_and_wait(topics.spans, value=encode(req), key=trace_id.encode(), partition=partition)
        where[(md.topic, md.partition, md.offset)] = "good"
        for kind, tool in (("true", "search"), ("false", "delete_db")):
            eid = f"good-{n}-{kind}"
            expected[eid] = kind
            await producer.send_and_wait(topics.control, value=expectation_bytes(eid, [trace_id], expects(tool)),
                                         key=eid.encode())
        await producer.send_and_wait(topics.control, value=marker_bytes(trace_id, count), key=trace_id.encode())

    async with control_client(cfg) as tw:
        async with raw_producer(cfg) as producer:
            for n, entry in enumerate(entries):
                partition = n % 4
                await good(producer, n, partition)
                topic = topics.spans if entry["topic"] == "spans" else topics.control
                hdrs = [(k, v.encode()) for k, v in (entry.get("headers") or {}).items()] or None
                md = await producer.send_and_wait(
                    topic, value=(CORPUS / entry["file"]).read_bytes(), key=f"bad-{n}".encode(),
                    partition=partition, headers=hdrs,
                )
                where[(md.topic, md.partition, md.offset)] = entry["file"]
            for partition in range(4):
                await good(producer, len(entries) + partition, partition)
        logs: list[BatchLog] = []
        async with running_service_prepared(cfg, lambda s: logs.append(BatchLog(s).install())) as service:
            try:
                await asyncio.gather(*[tw.wait_for(e, timeout=45) for e in expected])
            except TimeoutError:
                pytest.fail(f"good records not scored: {[e for e in expected if not tw.events(e)]}")
            for eid, want in expected.items():
                events = tw.events(eid)
                assert len(events) == 1 and verdict(events[0]) == want, (eid, events)
            dlq = await read_until(cfg.kafka.bootstrap_servers, topics.dlq, lambda recs: len(recs) >= len(entries))
            async with service.batch_lock:
                pass
        seen: dict[str, str] = {}
        for rec in dlq:
            t, p, o = (header(rec, "toolwitness-dlq-source") or "").rsplit("/", 2)
            label = where[(t, int(p), int(o))]
            assert label != "good", f"a good record went to the DLQ: {header(rec, 'toolwitness-dlq-detail')}"
            assert label not in seen, f"{label} dead-lettered twice"
            seen[label] = header(rec, "toolwitness-dlq-reason") or ""
        assert seen == {e["file"]: e["reason"] for e in entries}
        for r, b in before.items():
            got = counter_value(DLQ_METRIC, {"component": "exporter/kafka", "reason": r}) - b
            assert got == reasons.count(r), (r, got, reasons.count(r))
        # No state for a tenant a bad record named (only the default tenant has keys).
        tenants = {k.split("{", 1)[1].split(":", 1)[0] for k in await redis_keys(cfg, "{*")}
        assert tenants == {"default"}, tenants
        # Bad and good records really shared batches.
        log = logs[0]
        shared = sum(
            1 for b in log.batches
            if any(where.get(x) not in (None, "good") for x in b) and any(where.get(x) == "good" for x in b)
        )
        assert shared > 0
        scores = len(await read_all(cfg.kafka.bootstrap_servers, topics.scores))
    by_reason: dict[str, int] = {}
    for r in reasons:
        by_reason[r] = by_reason.get(r, 0) + 1
    return (f"{len(entries)} bad records -> DLQ {dict(sorted(by_reason.items()))}; {len(expected)} good expectations "
            f"scored ({scores} score records); {len(log.batches)} batches, {shared} mixing bad and good; "
            f"{time.monotonic() - started:.1f}s")


async def test_corpus_otlp_proto_and_control(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = corpus_cfg(kafka_bootstrap, redis_url, "otlp_proto")
    entries = [e for e in MANIFEST["entries"] if e["topic"] == "control" or e["encoding"] == "otlp_proto"]
    try:
        summary = await run_corpus(cfg, entries)
    finally:
        await drop_stack(cfg)
    print(f"\n[corpus otlp_proto + control] {summary}")


async def test_corpus_otlp_json(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = corpus_cfg(kafka_bootstrap, redis_url, "otlp_json")
    entries = [e for e in MANIFEST["entries"] if e["topic"] == "spans" and e["encoding"] == "otlp_json"]
    try:
        summary = await run_corpus(cfg, entries)
    finally:
        await drop_stack(cfg)
    print(f"\n[corpus otlp_json] {summary}")


async def test_expectation_the_tree_cannot_judge_is_not_a_poison_pill(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    topics = cfg.kafka.topics
    trace_id = new_trace_id()
    req, count = whole_trace(trace_id, int(time.time() * 1000) - 10_000)
    # Valid on the wire, but OtelToolCallScorer "needs at least one condition to check".
    bad = control_pb2.ControlMessage(expectation=control_pb2.Expectation(
        expectation_id="no-conditions", tenant="default", scorer="tools",
        scope=common_pb2.Scope(traces=common_pb2.TraceScope(trace_ids=[trace_id])),
    )).SerializeToString()
    try:
        async with control_client(cfg) as tw, raw_producer(cfg) as producer, service_and_task(cfg) as (_s, task):
            await producer.send_and_wait(topics.spans, value=req.SerializeToString(), key=trace_id.encode())
            await producer.send_and_wait(topics.control, value=bad, key=b"no-conditions")
            await producer.send_and_wait(topics.control, value=expectation_bytes("after", [trace_id],
                                                                                 expects("search")), key=b"after")
            await producer.send_and_wait(topics.control, value=marker_bytes(trace_id, count), key=trace_id.encode())
            try:
                await until(lambda: tw.events("after") or task.done(), timeout=30)
            except TimeoutError:
                pytest.fail("the good expectation after the bad one was never scored")
            exc = task.exception() if task.done() else None
            assert not task.done(), "the poll loop ended:\n" + "".join(traceback.format_exception(exc) if exc else [])
            assert verdict(tw.events("after")[0]) == "true"
            # The bad one is refused (DLQ) or at most UNDETERMINED -- never a crash.
            dlq = await read_all(cfg.kafka.bootstrap_servers, topics.dlq)
            refused = any(r.key == b"no-conditions" for r in dlq)
            assert refused or all(verdict(e) == "undetermined" for e in tw.events("no-conditions"))
    finally:
        await drop_stack(cfg)
