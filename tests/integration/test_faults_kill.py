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

import json
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from scoring.models import ArgumentMatcher, ScoringExpectation, ToolCallRequirement, ToolsCalled
from tests.integration.harness import (
    TraceGroup,
    assert_exactly_once,
    expectation_bytes,
    expects,
    fail_on_timeout,
    make_config,
    new_trace_id,
    open_stack,
    service_process,
    until,
    until_registered,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PER_GROUP = 9  # traces per group; each has a TRUE and a FALSE expectation


def regex_expectation() -> ScoringExpectation:
    req = ToolCallRequirement(name="search", arguments=(ArgumentMatcher(path="$.q", regex="^weather"),))
    return ScoringExpectation(conditions=(ToolsCalled(tools=(req,)),))


def true_expectation(i: int) -> ScoringExpectation:
    """A third of the TRUE expectations carry a regex argument matcher."""
    return regex_expectation() if i % 3 == 0 else expects("search")


async def test_three_kills_during_one_run(kafka_bootstrap: str, redis_url: str, tmp_path: Path) -> None:
    started = time.monotonic()
    # A dead member keeps its partitions for session_timeout_ms: the shortest allowed, so each
    # restart takes over quickly.
    cfg = make_config(kafka_bootstrap, redis_url, kafka={"session_timeout_ms": 6000}, log_level="INFO")
    t0 = int(time.time() * 1000) - 60_000
    args = json.dumps({"q": "weather in Lyon"})
    g1, g2, g3 = (TraceGroup.build(g, PER_GROUP, t0 + 10_000 * n, step_ms=100, arguments=args)
                  for n, g in enumerate(("g1", "g2", "g3")))
    expected: dict[str, str] = {}  # what is registered so far

    def register(*groups: TraceGroup) -> list[tuple[str, bytes]]:
        for g in groups:
            expected.update(g.verdicts())
        return [record for g in groups for record in g.expectations(true_expectation)]

    report: list[str] = []
    async with open_stack(cfg) as s, service_process(cfg, tmp_path) as proc:
        topics = s.topics

        def received() -> int:
            return s.received(expected)

        def missing(when: str) -> Callable[[], str]:
            return lambda: f"missing {when}: {s.missing(expected)}; service log:\n{proc.log_tail()}"

        async def restart(label: str) -> None:
            before = received()
            at = time.monotonic()
            await proc.start()
            with fail_on_timeout(lambda: f"{label}: no score after the restart; service log:\n{proc.log_tail()}"):
                await until(lambda: received() > before, timeout=60, interval=0.005)
            report.append(f"{label}: first score {time.monotonic() - at:.1f}s after the restart")

        async def kill(label: str) -> None:
            rc = await proc.kill()
            assert rc == -9, rc
            report.append(f"{label} with {received()} of {len(expected)} registered expectations scored")

        # g1 complete and g2 registered with half of its spans (open), all before the first kill.
        await s.send(topics.control, register(g1, g2))
        await s.send(topics.spans, g1.spans())
        await s.send(topics.control, g1.markers())
        await proc.start()
        with fail_on_timeout(lambda: f"no score before the first kill; service log:\n{proc.log_tail()}"):
            await until(lambda: received() >= 3, timeout=60, interval=0.005)
        await kill("kill 1 (mid-stream)")
        assert received() < len(expected)

        # While down: g2's spans and markers, g3 registered with its spans (no markers yet).
        await s.send(topics.spans, g2.spans())
        await s.send(topics.control, g2.markers() + register(g3))
        await s.send(topics.spans, g3.spans())
        await restart("restart 1")
        await kill("kill 2 (mid-replay)")

        # While down: g3's markers. Then everything but the deadline expectations gets decided.
        await s.send(topics.control, g3.markers())
        await restart("restart 2")
        with fail_on_timeout(missing("before kill 3")):
            await s.all_scored(list(expected), timeout=60)
        # Deadline expectations (no spans, no marker): registered, then the process dies holding them.
        dues = [(f"due-{i}", expectation_bytes(f"due-{i}", [new_trace_id()], expects("search"),
                                               deadline=timedelta(seconds=3))) for i in range(4)]
        for eid, _ in dues:
            expected[eid] = "undetermined"
        await s.send(topics.control, dues)
        await until_registered(cfg, [eid for eid, _ in dues])
        await kill("kill 3 (only deadlines pending)")
        await restart("restart 3")
        with fail_on_timeout(missing("after restart 3")):
            await s.all_scored(expected, timeout=60)
        for eid, ev in s.only_events(expected).items():
            if expected[eid] == "undetermined":
                assert ev.trigger == "deadline", ev
        client_duplicates = s.tw.duplicates
        assert await proc.stop() == 0, proc.log_tail()
        resent = assert_exactly_once(await s.scores(), expected)
        assert resent == client_duplicates
        print(
            f"\n[kill x3] {len(expected)} expectations, {proc.starts} starts; " + "; ".join(report)
            + f"; re-sent identical events={resent}; {time.monotonic() - started:.1f}s"
        )
