"""The Kafka broker restarts mid-run (issue 9 c): producer, consumer and service recover.

An isolated broker (scripts/services.py `up --only kafka`, own state dir and ports; the shared
broker is never touched) carries every topic; the trace state is in the shared Redis under the
stack's own key prefix. The service runs in-process and is NOT restarted. With traces open
(expectations registered, spans applied, FALSE ones waiting for their marker), the broker is
stopped (`down --only kafka`, SIGTERM) and started again on its data (`up --only kafka
--keep-data`). Afterwards the open traces get their markers and a new group of traces arrives
through the same producer and control client (both reconnect on their own).

Four expectations reach their deadline while the broker is away (the sweeper must publish
them once it is back).

Asserted on the raw scores topic: every expectation ends with exactly one distinct score_id and
the right verdict, none missing, none contradicted; the poll loop never ended. Reported: how
long the broker was away, time from the broker being ready to the first / last new score,
re-sent events, commits refused after the rebalance the restart forces.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path

import pytest

from collector.telemetry.metrics import COMMIT_FAILURES, DEPENDENCY_FAILURES
from tests.integration.harness import (
    TraceGroup,
    assert_exactly_once,
    ended,
    expectation_bytes,
    expects,
    fail_on_timeout,
    isolated,
    make_config,
    new_trace_id,
    open_stack,
    service_and_task,
    service_count,
    until,
    until_registered,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PER_GROUP = 8


async def test_broker_restart_mid_run(redis_url: str, tmp_path: Path) -> None:
    started = time.monotonic()
    async with isolated(tmp_path / "services", "kafka") as iso:
        broker_up = time.monotonic() - started
        cfg = make_config(iso.kafka_bootstrap, redis_url, kafka={"request_timeout_ms": 15000})
        t0 = int(time.time() * 1000) - 60_000
        before, open_, after = (TraceGroup.build(g, PER_GROUP, t0) for g in ("before", "open", "after"))
        expected = {**before.verdicts(), **open_.verdicts(), **after.verdicts()}
        async with open_stack(cfg, drop_errors_ok=True) as s:
            async with service_and_task(cfg) as (_svc, task):
                await s.send_group(before)
                await s.all_scored(before.ids(), timeout=30)
                # Open at the restart: registered, spans applied, TRUE decided, FALSE waiting for its marker.
                await s.send_group(open_, markers=False)
                await s.all_scored(open_.ids("true"), timeout=30)
                # Due while the broker is away: the sweeper must finalize them (UNDETERMINED) and publish
                # them when it can, once each.
                due = []
                for i in range(4):
                    eid = f"due-undetermined-{i}"
                    due.append((eid, expectation_bytes(eid, [new_trace_id()], expects("search"),
                                                       deadline=timedelta(seconds=4))))
                    expected[eid] = "undetermined"
                await s.send(s.topics.control, due)
                await until_registered(cfg, [eid for eid, _ in due])
                batches = DEPENDENCY_FAILURES.labels("service", "batch")
                commits0, exports0 = service_count(COMMIT_FAILURES), batches._value.get()

                down_at = time.monotonic()
                await iso.down("kafka")
                stopped = time.monotonic() - down_at
                await iso.up("kafka", keep_data=True)
                ready_at = time.monotonic()
                assert not task.done(), f"the poll loop ended while the broker was away:\n{ended(task)}"

                # The same producer and client, after the restart: markers of the open traces, a new group.
                scored = s.received(expected)
                async with asyncio.timeout(60):
                    await s.send(s.topics.control, open_.markers())
                    await s.send_group(after)
                with fail_on_timeout(lambda: f"not scored after the broker restart: {s.missing(expected)}; "
                                             f"loop done={task.done()}"):
                    await until(lambda: s.received(expected) > scored or task.done(), timeout=60)
                    first_after = time.monotonic() - ready_at
                    await s.all_scored(expected, timeout=60)
                all_after = time.monotonic() - ready_at
                assert not task.done(), f"the poll loop ended:\n{ended(task)}"
                s.only_events(expected)
                refused = int(service_count(COMMIT_FAILURES) - commits0)
                export_failures = int(batches._value.get() - exports0)
                client_duplicates = s.tw.duplicates
            resent = assert_exactly_once(await s.scores(), expected)
            print(
                f"\n[kafka restart] {len(expected)} expectations ({PER_GROUP} FALSE open at the restart, "
                f"{len(due)} due while the broker was away); broker first up in {broker_up:.1f}s; stopped in "
                f"{stopped:.1f}s, away {ready_at - down_at:.1f}s; first new score {first_after:.1f}s and all "
                f"{all_after:.1f}s after it was ready; commits refused={refused}, failed batches retried="
                f"{export_failures}; re-sent identical={resent} (client duplicates={client_duplicates}); "
                f"{time.monotonic() - started:.1f}s"
            )
