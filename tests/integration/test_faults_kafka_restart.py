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
import contextlib
import time
import traceback
from datetime import timedelta
from pathlib import Path

import pytest

from collector.telemetry.metrics import COMMIT_FAILURES, EXPORT_FAILURES
from tests.integration.harness import (
    IsolatedServices,
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
    service_and_task,
    until,
    whole_trace,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PER_GROUP = 8


def _count(counter: object) -> float:
    return counter.labels("service")._value.get()  # type: ignore[attr-defined,no-any-return]


async def test_broker_restart_mid_run(redis_url: str, tmp_path: Path) -> None:
    started = time.monotonic()
    iso = IsolatedServices(tmp_path / "services")
    await iso.up("kafka")
    broker_up = time.monotonic() - started
    cfg = make_config(iso.kafka_bootstrap, redis_url, kafka={"request_timeout_ms": 15000})
    t0 = int(time.time() * 1000) - 60_000
    expected: dict[str, str] = {}
    groups: dict[str, list[tuple[str, bytes, int]]] = {}
    for g in ("before", "open", "after"):
        groups[g] = []
        for i in range(PER_GROUP):
            trace_id = new_trace_id()
            req, n = whole_trace(trace_id, t0 + 1000 * i, ("search",))
            groups[g].append((trace_id, req.SerializeToString(), n))
            expected[f"{g}-true-{i}"] = "true"
            expected[f"{g}-false-{i}"] = "false"

    def control_of(g: str) -> list[tuple[str, bytes]]:
        out = []
        for i, (trace_id, _, _) in enumerate(groups[g]):
            for kind, tool in (("true", "search"), ("false", "delete_db")):
                eid = f"{g}-{kind}-{i}"
                out.append((eid, expectation_bytes(eid, [trace_id], expects(tool), deadline=timedelta(seconds=120))))
        return out

    def markers(g: str) -> list[tuple[str, bytes]]:
        return [(t, marker_bytes(t, n)) for t, _, n in groups[g]]

    try:
        async with control_client(cfg) as tw, raw_producer(cfg) as producer, service_and_task(cfg) as (_svc, task):
            topics = cfg.kafka.topics

            async def send(topic: str, items: list[tuple[str, bytes]]) -> None:
                await asyncio.gather(*[await producer.send(topic, value=v, key=k.encode()) for k, v in items])

            await send(topics.control, control_of("before"))
            await send(topics.spans, [(t, v) for t, v, _ in groups["before"]])
            await send(topics.control, markers("before"))
            await asyncio.gather(*[tw.wait_for(e, timeout=30) for e in expected if e.startswith("before")])
            # Open at the restart: registered, spans applied, TRUE decided, FALSE waiting for its marker.
            await send(topics.control, control_of("open"))
            await send(topics.spans, [(t, v) for t, v, _ in groups["open"]])
            await asyncio.gather(*[tw.wait_for(e, timeout=30) for e in expected if e.startswith("open-true")])
            # Due while the broker is away: the sweeper must finalize them (UNDETERMINED) and publish
            # them when it can, once each.
            due = []
            for i in range(4):
                eid = f"due-undetermined-{i}"
                due.append((eid, expectation_bytes(eid, [new_trace_id()], expects("search"),
                                                   deadline=timedelta(seconds=4))))
                expected[eid] = "undetermined"
            await send(topics.control, due)
            await until(lambda: _svc.redis.exists(_svc.store.k.expectation("default", due[-1][0])))
            commits0, exports0 = _count(COMMIT_FAILURES), _count(EXPORT_FAILURES)

            down_at = time.monotonic()
            await iso.down("kafka")
            stopped = time.monotonic() - down_at
            await iso.up("kafka", keep_data=True)
            ready_at = time.monotonic()
            assert not task.done(), f"the poll loop ended while the broker was away:\n{ended(task)}"

            # The same producer and client, after the restart: markers of the open traces, a new group.
            scored = sum(1 for e in expected if tw.events(e))
            async with asyncio.timeout(60):
                await send(topics.control, markers("open"))
                await send(topics.control, control_of("after"))
                await send(topics.spans, [(t, v) for t, v, _ in groups["after"]])
                await send(topics.control, markers("after"))
            try:
                await until(lambda: sum(1 for e in expected if tw.events(e)) > scored or task.done(), timeout=60)
                first_after = time.monotonic() - ready_at
                await asyncio.gather(*[tw.wait_for(e, timeout=60) for e in expected])
            except TimeoutError:
                missing = [e for e in expected if not tw.events(e)]
                pytest.fail(f"not scored after the broker restart: {missing}; loop done={task.done()}")
            all_after = time.monotonic() - ready_at
            assert not task.done(), f"the poll loop ended:\n{ended(task)}"
            for eid in expected:
                assert len(tw.events(eid)) == 1, (eid, tw.events(eid))
            refused = int(_count(COMMIT_FAILURES) - commits0)
            export_failures = int(_count(EXPORT_FAILURES) - exports0)
            client_duplicates = tw.duplicates
        resent = assert_exactly_once(await read_all(cfg.kafka.bootstrap_servers, cfg.kafka.topics.scores), expected)
        print(
            f"\n[kafka restart] {len(expected)} expectations ({PER_GROUP} FALSE open at the restart, {len(due)} due "
            f"while the broker was away); broker first up "
            f"in {broker_up:.1f}s; stopped in {stopped:.1f}s, away {ready_at - down_at:.1f}s; first new score "
            f"{first_after:.1f}s and all {all_after:.1f}s after it was ready; commits refused={refused}, failed "
            f"batches retried={export_failures}; re-sent identical={resent} (client duplicates={client_duplicates}); "
            f"{time.monotonic() - started:.1f}s"
        )
    finally:
        try:
            with contextlib.suppress(Exception):  # the broker is dropped whole below
                await drop_stack(cfg)
        finally:
            await iso.down()


def ended(task: asyncio.Task[None]) -> str:
    exc = task.exception() if not task.cancelled() else None
    return "".join(traceback.format_exception(exc)) if exc is not None else "cancelled or returned"
