"""The service is killed (SIGKILL) three times during one run (issue 9 a), as deployed:
``toolwitness run --config FILE`` as a subprocess, restarted with the same config and group.

The three kills land at different points of the work:

1. mid-stream: right after the first scores of a stream of traces arrive (batches in flight);
2. mid-replay: right after the restarted process publishes its first score, while it is still
   catching up on what was produced while it was down;
3. while only the sweeper has work: every TRUE/FALSE published, deadline expectations pending
   (their deadlines pass while the process is down, the next process must finalize them).

Between kills, new spans, expectations and markers keep arriving (some traces are open across
a kill: expectation registered by one process, decided by a later one from Redis; a third of
the TRUE expectations carry a regex argument matcher, so each restart must load those from
Redis).

Asserted on the raw scores topic: every expectation ends with exactly one distinct score_id and
the right verdict (version 1), none missing, none contradicted, re-sends byte-identical.
Reported: scores seen at each kill, time from each restart to its first score, re-sends.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta
from pathlib import Path

import pytest
from redis.asyncio import Redis

from scoring.models import ArgumentMatcher, ScoringExpectation, ToolCallRequirement, ToolsCalled
from tests.integration.harness import (
    ServiceProcess,
    assert_exactly_once,
    control_client,
    drop_stack,
    expectation_bytes,
    expects,
    make_config,
    marker_bytes,
    new_trace_id,
    raw_producer,
    read_all,
    until,
    whole_trace,
    write_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PER_GROUP = 9  # traces per group; each has a TRUE and a FALSE expectation


def regex_expectation() -> ScoringExpectation:
    req = ToolCallRequirement(name="search", arguments=(ArgumentMatcher(path="$.q", regex="^weather"),))
    return ScoringExpectation(conditions=(ToolsCalled(tools=(req,)),))


async def test_three_kills_during_one_run(kafka_bootstrap: str, redis_url: str, tmp_path: Path) -> None:
    started = time.monotonic()
    # A dead member keeps its partitions for session_timeout_ms: the shortest allowed, so each
    # restart takes over quickly.
    cfg = make_config(kafka_bootstrap, redis_url, kafka={"session_timeout_ms": 6000}, log_level="INFO")
    proc = ServiceProcess(write_config(cfg, tmp_path / "toolwitness.yaml"), tmp_path / "service.log")
    t0 = int(time.time() * 1000) - 60_000
    args = json.dumps({"q": "weather in Lyon"})
    groups: dict[str, list[tuple[str, bytes, int]]] = {}
    for n, g in enumerate(("g1", "g2", "g3")):
        groups[g] = []
        for i in range(PER_GROUP):
            trace_id = new_trace_id()
            req, count = whole_trace(trace_id, t0 + 10_000 * n + 100 * i, ("search",), arguments=args)
            groups[g].append((trace_id, req.SerializeToString(), count))
    expected: dict[str, str] = {}

    def expectations(g: str, deadline_s: float = 120) -> list[tuple[str, bytes]]:
        out = []
        for i, (trace_id, _, _) in enumerate(groups[g]):
            true_exp = regex_expectation() if i % 3 == 0 else expects("search")
            for kind, exp in (("true", true_exp), ("false", expects("delete_db"))):
                eid = f"{g}-{kind}-{i}"
                expected[eid] = kind
                out.append((eid, expectation_bytes(eid, [trace_id], exp, deadline=timedelta(seconds=deadline_s))))
        return out

    def markers(g: str) -> list[tuple[str, bytes]]:
        return [(t, marker_bytes(t, n)) for t, _, n in groups[g]]

    def spans(g: str) -> list[tuple[str, bytes]]:
        return [(t, v) for t, v, _ in groups[g]]

    report: list[str] = []
    try:
        async with control_client(cfg) as tw, raw_producer(cfg) as producer:
            topics = cfg.kafka.topics

            async def send(topic: str, items: list[tuple[str, bytes]]) -> None:
                await asyncio.gather(*[await producer.send(topic, value=v, key=k.encode()) for k, v in items])

            def received() -> int:
                return sum(1 for e in expected if tw.events(e))

            async def restart(label: str) -> None:
                before = received()
                at = time.monotonic()
                await proc.start()
                try:
                    await until(lambda: received() > before, timeout=60, interval=0.005)
                except TimeoutError:
                    pytest.fail(f"{label}: no score after the restart; service log:\n{proc.log_tail()}")
                report.append(f"{label}: first score {time.monotonic() - at:.1f}s after the restart")

            async def kill(label: str) -> None:
                rc = await proc.kill()
                assert rc == -9, rc
                report.append(f"{label} with {received()} of {len(expected)} registered expectations scored")

            # g1 complete and g2 registered with half of its spans (open), all before the first kill.
            await send(topics.control, expectations("g1") + expectations("g2"))
            await send(topics.spans, spans("g1"))
            await send(topics.control, markers("g1"))
            await proc.start()
            try:
                await until(lambda: received() >= 3, timeout=60, interval=0.005)
            except TimeoutError:
                pytest.fail(f"no score before the first kill; service log:\n{proc.log_tail()}")
            await kill("kill 1 (mid-stream)")
            assert received() < len(expected)

            # While down: g2's spans and markers, g3 registered with its spans (no markers yet).
            await send(topics.spans, spans("g2"))
            await send(topics.control, markers("g2") + expectations("g3"))
            await send(topics.spans, spans("g3"))
            await restart("restart 1")
            await kill("kill 2 (mid-replay)")

            # While down: g3's markers. Then everything but the deadline expectations gets decided.
            await send(topics.control, markers("g3"))
            await restart("restart 2")
            try:
                await asyncio.gather(*[tw.wait_for(e, timeout=60) for e in list(expected)])
            except TimeoutError:
                missing = [e for e in expected if not tw.events(e)]
                pytest.fail(f"missing before kill 3: {missing}; service log:\n{proc.log_tail()}")
            # Deadline expectations (no spans, no marker): registered, then the process dies holding them.
            dues = [(f"due-{i}", expectation_bytes(f"due-{i}", [new_trace_id()], expects("search"),
                                                   deadline=timedelta(seconds=3))) for i in range(4)]
            for eid, _ in dues:
                expected[eid] = "undetermined"
            registered = [f"{cfg.redis.key_prefix}:{{default:e:{eid}}}:def" for eid, _ in dues]
            await send(topics.control, dues)
            redis: Redis = Redis.from_url(redis_url)
            try:

                async def all_registered() -> bool:
                    return int(await redis.exists(*registered)) == len(registered)

                await until(all_registered, timeout=30)
            finally:
                await redis.aclose()
            await kill("kill 3 (only deadlines pending)")
            await restart("restart 3")
            try:
                await asyncio.gather(*[tw.wait_for(e, timeout=60) for e in expected])
            except TimeoutError:
                missing = [e for e in expected if not tw.events(e)]
                pytest.fail(f"missing after restart 3: {missing}; service log:\n{proc.log_tail()}")
            for eid, want in expected.items():
                events = tw.events(eid)
                assert len(events) == 1, f"{eid}: {len(events)} distinct score events"
                if want == "undetermined":
                    assert events[0].trigger == "deadline", events[0]
            client_duplicates = tw.duplicates
            assert await proc.stop() == 0, proc.log_tail()
        resent = assert_exactly_once(await read_all(kafka_bootstrap, cfg.kafka.topics.scores), expected)
        assert resent == client_duplicates
        print(
            f"\n[kill x3] {len(expected)} expectations, {proc.starts} starts; " + "; ".join(report)
            + f"; re-sent identical events={resent}; {time.monotonic() - started:.1f}s"
        )
    finally:
        await proc.stop()
        await drop_stack(cfg)
