"""Redis restarts under a running service (issue 9 b): append-only persistence on, no data lost.

An isolated Redis (scripts/services.py, own state dir and port; the shared one is never touched)
holds the trace state. The service runs in-process on the shared Kafka. Mid-run, with traces
open (expectations registered, half of the spans applied), Redis is stopped (`services.py down
--only redis`, SIGTERM: the AOF is flushed) and, once the service has observably failed batches
and is backing off, started again on the same data (`up --only redis --keep-data`). Spans,
markers and new expectations keep arriving meanwhile. The service is NOT restarted: its retry
policy (seek back to the batch's first offset, exponential backoff) must ride it out.

Asserted on the raw scores topic: every expectation ends with exactly one distinct score_id and
the right verdict, none missing, none contradicted; decisions made before the restart are still
in Redis after it (AOF); the poll loop never ended. Reported: batch failures while Redis was
down, how long it was down, time to the first score after it came back.

(Losing Redis data -- a restart WITHOUT persistence -- is test_faults_redis_loss.py.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from datetime import timedelta
from pathlib import Path

import pytest

from collector.telemetry.metrics import EXPORT_FAILURES
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

pytestmark = pytest.mark.integration

PER_GROUP = 8


def ended(task: asyncio.Task[None]) -> str:
    """How the poll loop ended (its traceback), for the failure message."""
    exc = task.exception() if not task.cancelled() else None
    return "".join(traceback.format_exception(exc)) if exc is not None else "cancelled or returned"


def failures() -> float:
    return EXPORT_FAILURES.labels("service")._value.get()  # type: ignore[no-any-return]


async def test_redis_restart_with_aof_is_ridden_out(kafka_bootstrap: str, tmp_path: Path) -> None:
    started = time.monotonic()
    iso = IsolatedServices(tmp_path / "services")
    await iso.up("redis")
    cfg = make_config(kafka_bootstrap, iso.redis_url, redis={"socket_timeout_seconds": 2.0})
    t0 = int(time.time() * 1000) - 60_000
    expected: dict[str, str] = {}
    groups: dict[str, list[tuple[str, bytes, int]]] = {}
    for g in ("before", "open", "during"):
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

    try:
        async with control_client(cfg) as tw, raw_producer(cfg) as producer, service_and_task(cfg) as (svc, task):
            topics = cfg.kafka.topics

            async def send(topic: str, items: list[tuple[str, bytes]]) -> None:
                await asyncio.gather(*[await producer.send(topic, value=v, key=k.encode()) for k, v in items])

            def markers(g: str) -> list[tuple[str, bytes]]:
                return [(t, marker_bytes(t, n)) for t, _, n in groups[g]]

            # 1. Decided before the restart.
            await send(topics.control, control_of("before"))
            await send(topics.spans, [(t, v) for t, v, _ in groups["before"]])
            await send(topics.control, markers("before"))
            await asyncio.gather(*[tw.wait_for(e, timeout=30) for e in expected if e.startswith("before")])

            # 2. Open at the restart: registered, spans applied, no marker yet (TRUE decided, FALSE pending).
            await send(topics.control, control_of("open"))
            await send(topics.spans, [(t, v) for t, v, _ in groups["open"]])
            await asyncio.gather(*[tw.wait_for(e, timeout=30) for e in expected if e.startswith("open-true")])
            decided_before = await svc.redis.keys(f"{cfg.redis.key_prefix}:*:dec")
            assert len(decided_before) == 3 * PER_GROUP

            # 3. Redis goes away; records keep coming.
            fails0 = failures()
            await iso.down("redis")
            down_at = time.monotonic()
            await send(topics.control, markers("open"))
            await send(topics.control, control_of("during"))
            await send(topics.spans, [(t, v) for t, v, _ in groups["during"]])
            await send(topics.control, markers("during"))
            # The service notices (a batch fails and is retried from its first offset) and backs off, 3 times.
            try:
                await until(lambda: failures() >= fails0 + 3 or task.done(), timeout=45, interval=0.05)
            except TimeoutError:
                pytest.fail("the service never failed a batch while Redis was down")
            assert not task.done(), f"the poll loop ended while Redis was down:\n{ended(task)}"
            failed_batches = int(failures() - fails0)

            # 4. Redis comes back with its append-only file.
            await iso.up("redis", keep_data=True)
            up_at = time.monotonic()
            scored = sum(1 for e in expected if tw.events(e))
            try:
                await until(lambda: sum(1 for e in expected if tw.events(e)) > scored or task.done(), timeout=45)
                first_after = time.monotonic() - up_at
                await asyncio.gather(*[tw.wait_for(e, timeout=60) for e in expected])
            except TimeoutError:
                missing = [e for e in expected if not tw.events(e)]
                pytest.fail(f"not scored after Redis came back: {missing}; loop done={task.done()}")
            all_after = time.monotonic() - up_at
            assert not task.done(), f"the poll loop ended:\n{ended(task)}"
            for eid in expected:
                assert len(tw.events(eid)) == 1, (eid, tw.events(eid))
            # What was decided before the restart survived it (AOF), so nothing could be decided twice.
            after = set(await svc.redis.keys(f"{cfg.redis.key_prefix}:*:dec"))
            assert set(decided_before) <= after
            client_duplicates = tw.duplicates
        resent = assert_exactly_once(await read_all(kafka_bootstrap, cfg.kafka.topics.scores), expected)
        print(
            f"\n[redis restart] {len(expected)} expectations ({2 * PER_GROUP} open at the restart); Redis down "
            f"{up_at - down_at:.1f}s, {failed_batches}+ batch failures retried meanwhile; first score "
            f"{first_after:.1f}s and all scores {all_after:.1f}s after Redis was back; re-sent identical="
            f"{resent} (client duplicates={client_duplicates}); {time.monotonic() - started:.1f}s"
        )
    finally:
        try:
            with contextlib.suppress(Exception):  # the isolated Redis may be down: it is dropped whole below
                await drop_stack(cfg)
        finally:
            await iso.down()
