"""Catching up on a backlog with inferred completion (issue 4 acceptance 7).

``completion.mode: inferred``: a trace is complete when its root has ended, it has no orphan
parents, and the event-time watermark has passed root end + allowed lateness. The watermark
is per partition (max event time − out-of-orderness), global = min over partitions, idle
caught-up partitions excluded.

The service runs, is stopped, and a backlog builds up:

- partition 0 (small, consumed first): trace T's early spans (the root, ended at t0+100ms, and
  a ``search`` execution), trace U (root + ``search``; ``fetch`` never runs), then traces
  whose event time runs ahead to t0+60s;
- partition 1 (about 7 MB, many fetches to get through): old traces (event time before t0),
  then T's remaining span, a ``fetch`` execution ending at t0+80ms (before the root's end: it is
  on time for its own partition), then traces running ahead to t0+60s.

Expectations are registered while the service is down. When it starts, partition 0's event
time is far past T's root end long before T's ``fetch`` span is consumed; partition 1's
backlog must hold the global watermark back, so nothing may be decided for T until that span
is in: "fetch ran" is TRUE, never FALSE. Once everything is consumed, the watermark passes U's
root end and U's "fetch ran" becomes FALSE with trigger ``watermark``.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from collector.config import ScorerTreeConfig
from collector.pipeline.service import ToolwitnessService
from scoring.models import TraceScorable
from tests.integration.harness import (
    BatchLog,
    control_client,
    drop_stack,
    expects,
    make_config,
    new_span_id,
    new_trace_id,
    otlp_request,
    otlp_span,
    raw_producer,
    running_service,
    running_service_prepared,
    verdict,
)

pytestmark = pytest.mark.integration

LATENESS_MS = 500
OUT_OF_ORDER_MS = 500
SLOW_RECORDS = 120
PAD = "p" * (60 * 1024)


async def test_backlog_holds_the_watermark_back(kafka_bootstrap: str, redis_url: str) -> None:
    started = time.monotonic()
    trees = {
        "tools": ScorerTreeConfig(type="otel_tool_call"),
        "not_tools": ScorerTreeConfig(type="inverter", scorer=ScorerTreeConfig(type="otel_tool_call")),
    }
    cfg = make_config(
        kafka_bootstrap, redis_url, scorers=trees,
        completion={"mode": "inferred", "allowed_lateness_ms": LATENESS_MS,
                    "max_out_of_orderness_ms": OUT_OF_ORDER_MS, "idle_partition_ms": 1000},
        # 1 MiB per partition per fetch: partition 1's ~7 MB backlog takes many fetches.
        kafka={"max_record_bytes": 1024 * 1024},
    )
    spans_topic = cfg.kafka.topics.spans
    t0 = int(time.time() * 1000) - 120_000
    try:
        async with control_client(cfg) as tw, raw_producer(cfg) as producer:
            # The service runs (a trace well before t0 is scored), then is stopped.
            async with running_service(cfg):
                warm = new_trace_id()
                root = new_span_id()
                record = otlp_request([
                    otlp_span(warm, span_id=root, name="agent", start_ms=t0 - 20_000, end_ms=t0 - 19_000),
                    otlp_span(warm, parent=root, tool="search", start_ms=t0 - 19_900, end_ms=t0 - 19_800),
                ])
                await producer.send_and_wait(spans_topic, record.SerializeToString(), key=warm.encode(), partition=2)
                warm_id = await tw.expect(TraceScorable(trace_ids=(warm,)), expects("search"))
                assert verdict(await tw.wait_for(warm_id, timeout=30)) == "true"

            # The backlog.
            t_trace, u_trace, t_root = new_trace_id(), new_trace_id(), new_span_id()
            t_early = otlp_request([
                otlp_span(t_trace, span_id=t_root, name="agent", start_ms=t0, end_ms=t0 + 100),
                otlp_span(t_trace, parent=t_root, tool="search", start_ms=t0 + 10, end_ms=t0 + 50),
            ])
            u_root = new_span_id()
            u_record = otlp_request([
                otlp_span(u_trace, span_id=u_root, name="agent", start_ms=t0 + 100, end_ms=t0 + 200),
                otlp_span(u_trace, parent=u_root, tool="search", start_ms=t0 + 110, end_ms=t0 + 150),
            ])
            t_late = otlp_request([otlp_span(t_trace, parent=t_root, tool="fetch", start_ms=t0 + 60, end_ms=t0 + 80)])

            def filler(end_ms: int, pad: str = "") -> bytes:
                trace = new_trace_id()
                attrs = {"pad": pad} if pad else {}
                return otlp_request([otlp_span(trace, name="other", start_ms=end_ms - 5, end_ms=end_ms,
                                               attrs=attrs)]).SerializeToString()

            p0 = [t_early.SerializeToString(), u_record.SerializeToString()]
            p0 += [filler(t0 + 3000 * k) for k in range(1, 21)]  # runs ahead to t0+60s
            p1 = [filler(t0 - 5000 + 10 * i, PAD) for i in range(SLOW_RECORDS)]  # before t0, heavy
            late_index = len(p1)
            p1.append(t_late.SerializeToString())
            p1 += [filler(t0 + 6000 * k) for k in range(1, 11)]  # then runs ahead to t0+60s
            where: dict[int, list[int]] = {0: [], 1: []}
            for partition, values in ((0, p0), (1, p1)):
                futures = [await producer.send(spans_topic, v, partition=partition) for v in values]
                where[partition] = [md.offset for md in await asyncio.gather(*futures)]
            late_at = (spans_topic, 1, where[1][late_index])
            fast_done_at = (spans_topic, 0, where[0][-1])

            scope_t, scope_u = TraceScorable(trace_ids=(t_trace,)), TraceScorable(trace_ids=(u_trace,))
            t_ids = {
                await tw.expect(scope_t, expects("fetch")): "true",
                await tw.expect(scope_t, expects("search", "fetch")): "true",  # FALSE-prone: search seen early
                await tw.expect(scope_t, expects("fetch"), scorer="not_tools"): "false",  # TRUE-prone
            }
            u_fetch = await tw.expect(scope_u, expects("fetch"))
            u_search = await tw.expect(scope_u, expects("search"))

            # Start again: while T's remaining span is in the backlog, nothing is decided for T and
            # the global watermark stays below T's root end + lateness.
            threshold = t0 + 100 + LATENESS_MS
            seen: dict[str, object] = {"late_batch": None, "max_wm_before": 0, "decided_before": []}

            def prepare(service: ToolwitnessService) -> None:
                log = BatchLog(service).install()
                seen["log"] = log

                async def check(index: int) -> None:
                    if seen["late_batch"] is not None:
                        return
                    if late_at in log.batches[index]:
                        seen["late_batch"] = index
                        return
                    wm = await service.watermarks.global_watermark()
                    seen["max_wm_before"] = max(int(seen["max_wm_before"]), wm)  # type: ignore[call-overload]
                    for eid in t_ids:
                        if await service.store.get_decision("default", eid) is not None:
                            seen["decided_before"].append(eid)  # type: ignore[attr-defined]

                log.after_batch.append(check)

            async with running_service_prepared(cfg, prepare):
                results = await asyncio.gather(*[tw.wait_for(e, timeout=45) for e in (*t_ids, u_fetch, u_search)])
            log: BatchLog = seen["log"]  # type: ignore[assignment]
            assert seen["late_batch"] is not None
            # The hazard was real: partition 0 (far ahead in event time) was consumed before T's span.
            assert log.batch_of(*fast_done_at) < log.batch_of(*late_at)
            assert seen["decided_before"] == [], seen["decided_before"]
            assert int(seen["max_wm_before"]) < threshold  # type: ignore[call-overload]

            for eid, want in t_ids.items():
                events = tw.events(eid)
                assert len(events) == 1 and events[0].version == 1, (eid, events)
                assert verdict(events[0]) == want, (eid, events[0])
            u_false = tw.events(u_fetch)
            assert len(u_false) == 1 and verdict(u_false[0]) == "false", u_false
            assert u_false[0].trigger == "watermark", u_false[0]
            assert u_false[0].coverage.complete
            assert [verdict(e) for e in tw.events(u_search)] == ["true"]
            assert tw.duplicates == 0
            print(
                f"\n[backlog] {len(log.batches)} batches; partition 0 done in batch {log.batch_of(*fast_done_at)}, "
                f"T's late span in batch {log.batch_of(*late_at)}; global watermark before it "
                f"t0{int(seen['max_wm_before']) - t0:+d}ms (T completes at t0+{threshold - t0}ms); "  # type: ignore[call-overload]
                f"verdicts {[verdict(r) for r in results]}, U trigger {u_false[0].trigger}; "
                f"{time.monotonic() - started:.1f}s"
            )
    finally:
        await drop_stack(cfg)
