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

import logging
import time
from pathlib import Path

import pytest

from collector.pipeline.service import NOT_READY_AFTER_S, OUTAGE_LOG_EVERY_S
from collector.telemetry.metrics import CONSUMER_LAG, DEPENDENCY_FAILURES
from tests.integration.harness import (
    TraceGroup,
    assert_exactly_once,
    ended,
    fail_on_timeout,
    isolated,
    make_config,
    open_stack,
    service_and_task,
    until,
)

pytestmark = pytest.mark.integration

PER_GROUP = 8


def failures() -> float:
    """Batches that failed on Redis (not committed, retried from their first offset)."""
    return float(DEPENDENCY_FAILURES.labels("service", "batch")._value.get())


class _Warnings(logging.Handler):
    """WARNING and above logged by the service while it is attached."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def spans_lag(topic: str) -> float:
    """toolwitness_consumer_lag summed over the spans topic's partitions."""
    return sum(
        sample.value
        for metric in CONSUMER_LAG.collect()
        for sample in metric.samples
        if sample.labels.get("topic") == topic
    )


async def test_redis_restart_with_aof_is_ridden_out(kafka_bootstrap: str, tmp_path: Path) -> None:
    started = time.monotonic()
    async with isolated(tmp_path / "services", "redis") as iso:
        cfg = make_config(kafka_bootstrap, iso.redis_url, redis={"socket_timeout_seconds": 2.0})
        t0 = int(time.time() * 1000) - 60_000
        before, open_, during = (TraceGroup.build(g, PER_GROUP, t0) for g in ("before", "open", "during"))
        expected = {**before.verdicts(), **open_.verdicts(), **during.verdicts()}
        async with open_stack(cfg, drop_errors_ok=True) as s:
            async with service_and_task(cfg) as (svc, task):
                # 1. Decided before the restart.
                await s.send_group(before)
                await s.all_scored(before.ids(), timeout=30)

                # 2. Open at the restart: registered, spans applied, no marker yet (TRUE decided, FALSE pending).
                await s.send_group(open_, markers=False)
                await s.all_scored(open_.ids("true"), timeout=30)
                decided_before = await svc.redis.keys(f"{cfg.redis.key_prefix}:*:dec")
                assert len(decided_before) == 3 * PER_GROUP

                # 3. Redis goes away; records keep coming.
                fails0 = failures()
                warnings = _Warnings()
                logging.getLogger("toolwitness.service").addHandler(warnings)
                await iso.down("redis")
                down_at = time.monotonic()
                await s.send(s.topics.control, open_.markers())
                await s.send_group(during)
                # The service notices (a batch fails and is retried from its first offset) and backs off, 3 times.
                with fail_on_timeout(lambda: "the service never failed a batch while Redis was down"):
                    await until(lambda: failures() >= fails0 + 3 or task.done(), timeout=45, interval=0.05)
                assert not task.done(), f"the poll loop ended while Redis was down:\n{ended(task)}"
                failed_batches = int(failures() - fails0)
                # The consumer-lag metric shows the records this instance cannot get past (it read
                # 0 during an outage: only a committed batch updated it).
                with fail_on_timeout(lambda: "the lag never showed the records sent while Redis was down"):
                    await until(lambda: spans_lag(cfg.kafka.topics.spans) > 0, timeout=30)
                # A sustained outage makes the instance not ready (/readyz), and the logs say so a
                # few times, not on every retry of the poll loop and the sweeper (once ~200 lines/s).
                with fail_on_timeout(lambda: "still ready with Redis down"):
                    await until(lambda: not svc.ready(), timeout=NOT_READY_AFTER_S + 20)
                down_s = time.monotonic() - down_at
                warned = len(warnings.records)
                assert warned <= 3 * (2 + down_s / OUTAGE_LOG_EVERY_S), [r.getMessage() for r in warnings.records]

                # 4. Redis comes back with its append-only file. (Scores are counted before: the service may
                # publish all of them while `up` still waits for Redis to answer.)
                scored = s.received(expected)
                await iso.up("redis", keep_data=True)
                up_at = time.monotonic()
                with fail_on_timeout(lambda: f"not scored after Redis came back: {s.missing(expected)}; "
                                             f"loop done={task.done()}"):
                    await until(lambda: s.received(expected) > scored or task.done(), timeout=45)
                    first_after = time.monotonic() - up_at
                    await s.all_scored(expected, timeout=60)
                all_after = time.monotonic() - up_at
                assert not task.done(), f"the poll loop ended:\n{ended(task)}"
                logging.getLogger("toolwitness.service").removeHandler(warnings)
                with fail_on_timeout(lambda: "not ready again after Redis came back"):
                    await until(svc.ready, timeout=30)
                assert any("recovered" in r.getMessage() for r in warnings.records)
                s.only_events(expected)
                # What was decided before the restart survived it (AOF), so nothing could be decided twice.
                after = set(await svc.redis.keys(f"{cfg.redis.key_prefix}:*:dec"))
                assert set(decided_before) <= after
                client_duplicates = s.tw.duplicates
            resent = assert_exactly_once(await s.scores(), expected)
            print(
                f"\n[redis restart] {len(expected)} expectations ({2 * PER_GROUP} open at the restart); Redis down "
                f"{up_at - down_at:.1f}s, {failed_batches}+ batch failures retried meanwhile; first score "
                f"{first_after:.1f}s and all scores {all_after:.1f}s after Redis was back; re-sent identical="
                f"{resent} (client duplicates={client_duplicates}); {time.monotonic() - started:.1f}s"
            )
