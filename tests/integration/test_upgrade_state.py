"""Trace state written by an earlier version of the service, read by this one (a rolling upgrade:
records the old replicas applied are delivered again, Collector retries, offsets not committed).

Before 5ef347e..: a tool span's duration was kept in whole microseconds (-1 = not ended) and a
packed execution had no delivered canary nor argument digest. The same span delivered again is a
replay, not conflicting evidence (which kept such traces incomplete, absence checks UNDETERMINED).
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from redis.asyncio import Redis

from collector.processors.normalize import short_id
from collector.processors.trace_state import Keys
from scoring.models import TraceScorable
from tests.integration.harness import (
    TOOL_TREES,
    control_client,
    expects,
    make_config,
    new_span_id,
    new_trace_id,
    otlp_request,
    otlp_span,
    raw_producer,
    running_service,
    verdict,
)

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("canary", "cut"), [(None, False), ("tw-canary-0123456789abcdef0123", False), (None, True)]
)
async def test_a_span_stored_by_the_previous_version_and_delivered_again_is_a_replay(
    kafka_bootstrap: str, redis_url: str, canary: str | None, cut: bool
) -> None:
    # the previous version kept no delivered canary: a poisoned span's replay is no conflict either;
    # nor kept hex runs after an argument cut (the kept text now goes on past the cut mark)
    cfg = make_config(kafka_bootstrap, redis_url, scorers=TOOL_TREES)
    trace, root, tool = new_trace_id(), new_span_id(), new_span_id()
    t0 = int(time.time() * 1000) - 5_000
    start_ns, end_ns = (t0 + 1) * 1_000_000, (t0 + 1) * 1_000_000 + 1_123_456
    args = json.dumps({"pad": "x" * 2000, "ref": "3f9a0c1e5b7d2468ace0"}) if cut else '{"q": "x"}'
    kept, code = (args.encode()[:1024].decode(), 2) if cut else (args, 0)
    attrs = {"gen_ai.tool.call.arguments": args}
    if canary:
        attrs["toolwitness.poisoning.canary"] = canary
    search = otlp_span(trace, span_id=tool, parent=root, tool="search", start_ms=0, end_ms=0, attrs=attrs)
    search.start_time_unix_nano, search.end_time_unix_nano = start_ns, end_ns
    agent = otlp_span(trace, span_id=root, name="agent", start_ms=t0, end_ms=t0 + 50)
    # what the previous version stored for these two spans (duration 1123 us)
    legacy = {
        "x": [[short_id(tool.hex()), "search", 0, str(start_ns), 1123, code, kept]],
        "s": {short_id(root.hex()): 1, short_id(tool.hex()): 1},
        "re": t0 + 50,
        "mc": -1,
        "l": 0,
        "ma": -1,
        "n": 2,
    }
    async with Redis.from_url(redis_url) as r:
        await r.set(Keys(cfg.redis.key_prefix).state("default", trace), json.dumps(legacy), px=600_000)
    async with running_service(cfg), control_client(cfg) as tw, raw_producer(cfg) as producer:
        await producer.send_and_wait(
            cfg.kafka.topics.spans, otlp_request([search, agent]).SerializeToString(), key=trace.encode()
        )
        ident = await tw.expect(
            TraceScorable(trace_ids=(trace,)), expects("delete"), scorer="not_tools", deadline=timedelta(seconds=20)
        )
        await tw.mark_complete(trace, span_count=2)
        ev = await tw.wait_for(ident, timeout=30)
    assert verdict(ev) == "true", (ev.rationale, list(ev.coverage.reasons))
