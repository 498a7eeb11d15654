"""Kafka unreachable under a running `toolwitness run` process (its own isolated broker; the
shared one is never touched; the trace state is in the shared Redis under the stack's prefix).

- The outage is reported as docs/limits.md says: after NOT_READY_AFTER_S of failures in a row
  /readyz answers 503, toolwitness_dependency_failures_total{loop="kafka"} counts them, the service
  logs a warning (one per OUTAGE_LOG_EVERY_S) and one when Kafka answers again (then /readyz is 200
  again); aiokafka's own lines are throttled (~70 a second before). Before, the consumer's poll just
  returned empty batches: nothing of this happened.

- A SIGTERM while the broker is down ends the process cleanly: exit status 0, every shutdown step
  attempted (what could not be closed cleanly is a warning), "service ... stopped" logged, no
  traceback (aiokafka's consumer.stop() raised a CancelledError out of its fetcher, which ended the
  shutdown before the exporter, the admin server and Redis were closed: exit 1).

- A SIGTERM while the service is still starting against a broker that accepts connections and never
  answers ends the process at once (exit 0), instead of after the start step's timeout (~31 s).

- A probe that gets no answer while the fetches still work (a partial outage) holds up no batch:
  records are scored in a fraction of KAFKA_PROBE_TIMEOUT_S while the outage is reported, and the
  probe stops at once on shutdown. Before, the probe ran in the poll loop: every record waited for
  it to time out (~5 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from collector.admin import NOT_READY_AFTER_S
from collector.pipeline.service import KAFKA_PROBE_TIMEOUT_S, OUTAGE_LOG_EVERY_S
from scoring.models import TraceScorable
from tests.integration.harness import (
    IsolatedServices,
    ServiceProcess,
    admin_get,
    counter_value,
    expects,
    fail_on_timeout,
    free_ports,
    isolated,
    make_config,
    metric_value,
    new_trace_id,
    open_stack,
    running_service_prepared,
    scrape_metrics,
    until,
    verdict,
    whole_trace,
    write_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def http_status(port: int, path: str) -> int | None:
    """The status of GET ``path`` on the admin endpoint; None when it does not answer."""
    try:
        return (await admin_get(port, path, timeout=5))[0]
    except (OSError, TimeoutError, AssertionError):
        return None


async def status_is(port: int, path: str, expected: int) -> bool:
    return await http_status(port, path) == expected


def log_text(proc: ServiceProcess) -> str:
    return proc.log_path.read_text(errors="replace")


@contextlib.asynccontextmanager
async def ready_service(tmp_path: Path, redis_url: str) -> AsyncIterator[tuple[IsolatedServices, ServiceProcess, int]]:
    """`toolwitness run` on a private broker (the shared Redis), ready (/readyz 200): the services,
    the process and its admin port. The process is stopped on the way out."""
    async with isolated(tmp_path / "services", "kafka") as iso:
        (port,) = free_ports(1)
        cfg = make_config(iso.kafka_bootstrap, redis_url, admin={"host": "127.0.0.1", "port": port})
        proc = ServiceProcess(write_config(cfg, tmp_path / "toolwitness.yaml"), tmp_path / "service.log")
        try:
            await proc.start()
            with fail_on_timeout(lambda: f"never ready:\n{proc.log_tail()}"):
                await until(lambda: status_is(port, "/readyz", 200), timeout=60, interval=0.2)
            yield iso, proc, port
        finally:
            await proc.stop()


async def test_sigterm_while_kafka_is_down_exits_cleanly(redis_url: str, tmp_path: Path) -> None:
    async with ready_service(tmp_path, redis_url) as (iso, proc, _port):
        await iso.down("kafka")
        # The consumer has noticed: its fetcher fails and backs off (what made stop() raise).
        with fail_on_timeout(lambda: f"the consumer never failed a fetch:\n{proc.log_tail()}"):
            await until(lambda: "Failed fetch messages" in log_text(proc), timeout=30, interval=0.1)
        assert proc.proc is not None and proc.proc.returncode is None
        sent = time.monotonic()
        rc = await proc.stop(timeout=40)
        took = time.monotonic() - sent
        text = log_text(proc)
        tail = proc.log_tail(40)
        assert rc == 0, f"exit status {rc} after SIGTERM with Kafka down:\n{tail}"
        assert took < 30, f"SIGTERM took {took:.1f}s (more than a Kubernetes grace period):\n{tail}"
        assert "Traceback" not in text, tail
        last = text.splitlines()[-1]
        assert "toolwitness.service: service " in last and " stopped" in last, tail
        print(f"\n[kafka down, SIGTERM] exit {rc} in {took:.1f}s; last line: {last}")




async def test_sigterm_while_starting_against_a_silent_kafka_exits_at_once(redis_url: str, tmp_path: Path) -> None:
    """A broker address that accepts connections and never answers (a broker hung, or a load
    balancer in front of none): each start step waits for its timeout. A SIGTERM then (a rollout
    during the outage) ends the process at once; before, it waited out the step (~31 s, past a
    Kubernetes grace period of 30 s: a SIGKILL)."""
    accepted = asyncio.Event()
    held: list[asyncio.StreamWriter] = []

    async def silent(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # kept open, never written to
        accepted.set()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    cfg = make_config(f"127.0.0.1:{port}", redis_url, admin={"host": "127.0.0.1", "port": 0})
    proc = ServiceProcess(write_config(cfg, tmp_path / "toolwitness.yaml"), tmp_path / "service.log")
    try:
        await proc.start()
        with fail_on_timeout(lambda: f"the service never reached Kafka:\n{proc.log_tail()}"):
            await asyncio.wait_for(accepted.wait(), timeout=60)
        sent = time.monotonic()
        rc = await proc.stop(timeout=20)
        took = time.monotonic() - sent
        tail = proc.log_tail(40)
        assert rc == 0, f"exit status {rc} after SIGTERM while starting:\n{tail}"
        assert took < 10, f"SIGTERM while starting took {took:.1f}s:\n{tail}"
        assert "stop requested while starting" in log_text(proc), tail
        assert "Traceback" not in log_text(proc), tail
    finally:
        await proc.stop()
        for w in held:
            w.close()
        server.close()
        await server.wait_closed()


async def test_kafka_outage_is_reported_and_ridden_out(redis_url: str, tmp_path: Path) -> None:
    async with ready_service(tmp_path, redis_url) as (iso, proc, port):
        mark = len(log_text(proc))
        await iso.down("kafka")
        down_at = time.monotonic()
        with fail_on_timeout(lambda: f"still ready with Kafka down:\n{proc.log_tail()}"):
            await until(lambda: status_is(port, "/readyz", 503),
                        timeout=NOT_READY_AFTER_S + 2 * KAFKA_PROBE_TIMEOUT_S + 20, interval=0.2)
        not_ready_after = time.monotonic() - down_at
        failures = metric_value(await scrape_metrics(port), "toolwitness_dependency_failures_total",
                                {"component": "service", "loop": "kafka"})
        assert failures >= 1
        assert await http_status(port, "/healthz") == 200  # alive: only not ready
        outage_log = log_text(proc)[mark:].splitlines()
        down_s = time.monotonic() - down_at
        ours = [line for line in outage_log if "WARNING toolwitness.service: kafka failed" in line]
        assert 1 <= len(ours) <= 2 + down_s / OUTAGE_LOG_EVERY_S, ours
        theirs = [line for line in outage_log if " aiokafka" in line]

        await iso.up("kafka", keep_data=True)
        with fail_on_timeout(lambda: f"not ready again after Kafka came back:\n{proc.log_tail()}"):
            await until(lambda: status_is(port, "/readyz", 200), timeout=60, interval=0.2)
        with fail_on_timeout(lambda: f"the recovery was not logged:\n{proc.log_tail()}"):
            await until(lambda: "WARNING toolwitness.service: kafka recovered" in log_text(proc), timeout=10)
        rc = await proc.stop(timeout=40)
        assert rc == 0, proc.log_tail()
        # ~70 a second unthrottled: here one per message kind per 10 s
        assert len(theirs) <= 6 * down_s, "\n".join(theirs[-40:])
        print(f"\n[kafka down] not ready after {not_ready_after:.1f}s; {failures:.0f} failures counted; "
              f"{len(ours)} warning(s) of ours and {len(theirs)} aiokafka lines in {down_s:.1f}s")


async def test_a_probe_without_answer_holds_up_no_batch(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    failures = {"component": "service", "loop": "kafka"}
    counted_before = counter_value("toolwitness_dependency_failures_total", failures)
    probes = {"asked": 0, "cancelled": 0}

    async def no_answer() -> None:  # the broker the probe asks is gone; the fetches still work
        probes["asked"] += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            probes["cancelled"] += 1
            raise

    prompt = KAFKA_PROBE_TIMEOUT_S / 2  # a probe timing out in the poll loop held each batch longer
    t0 = int(time.time() * 1000) - 30_000
    async with open_stack(cfg) as s:
        async with running_service_prepared(cfg, lambda svc: setattr(svc.receiver, "probe", no_answer)) as service:

            async def scored(within: float) -> float:
                """Seconds from registering an expectation (a control record) and sending its trace
                (a span record) to the client having its TRUE score."""
                trace_id = new_trace_id()
                req, _ = whole_trace(trace_id, t0)
                sent = time.monotonic()
                eid = await s.tw.expect(TraceScorable(trace_ids=(trace_id,)), expects("search"))
                await s.producer.send_and_wait(s.topics.spans, value=req.SerializeToString(), key=trace_id.encode())
                with fail_on_timeout(lambda: f"not scored within {within:.1f}s (probes asked: {probes})"):
                    ev = await s.tw.wait_for(eid, timeout=within)
                assert verdict(ev) == "true", ev
                return time.monotonic() - sent

            await scored(within=60)  # the first also waits for the group to be joined
            took = [await scored(within=prompt) for _ in range(3)]
            with fail_on_timeout(lambda: f"the probe's timeout was never counted (probes: {probes})"):
                await until(lambda: service.outages["kafka"].failures >= 1, timeout=KAFKA_PROBE_TIMEOUT_S + 5)
            assert counter_value("toolwitness_dependency_failures_total", failures) > counted_before
            with fail_on_timeout(lambda: "still ready with the probe failing"):
                await until(lambda: not service.ready(), timeout=NOT_READY_AFTER_S + 2 * KAFKA_PROBE_TIMEOUT_S + 5)
            assert service.alive()  # not ready, but the poll loop turns
            took.append(await scored(within=prompt))  # and still scores
            leaving = time.monotonic()
        left_in = time.monotonic() - leaving
    prober = service._prober
    assert prober is not None and prober.done() and service.consumer is None
    # each probe ended by its timeout, the last one by the shutdown (none left hanging)
    assert probes["cancelled"] == probes["asked"], probes
    assert left_in < KAFKA_PROBE_TIMEOUT_S, f"the shutdown took {left_in:.1f}s"
    print(f"\n[probe without answer] scored in {', '.join(f'{t * 1000:.0f}' for t in took)} ms; "
          f"{probes['asked']} probes, {service.outages['kafka'].failures} failures; "
          f"stopped in {left_in * 1000:.0f} ms")
