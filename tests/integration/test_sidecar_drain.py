"""The sidecar drains before it stops (``toolwitness sidecar`` as a subprocess, real SIGTERM).

Kubernetes removes a terminating pod from the Service's endpoints while it sends SIGTERM, so
agents' OTLP exporters keep sending Export calls to it for a few seconds. Measured on the old
code: the first SIGTERM stopped the gRPC server at once, an Export sent right after it failed
(the exporter's retries found the port closed) and its spans never reached Kafka. Now the
sidecar answers /readyz 503 at once, keeps accepting and forwarding Export calls for
``--shutdown-delay`` seconds (default 5), then stops as before; a second signal ends the drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult
from pydantic import ValidationError

from collector.receivers.otlp_grpc import SidecarConfig
from tests.integration.harness import (
    ServiceProcess,
    create_topic,
    fail_on_timeout,
    free_ports,
    make_config,
    read_all,
    until,
    write_config,
)
from tests.integration.test_client_otel import captured_spans, check_span_records
from tests.integration.test_faults_kafka_outage import http_status, status_is

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: the sidecar's default drain (SidecarConfig.shutdown_delay_seconds, ``--shutdown-delay``)
DEFAULT_DELAY_S = 5.0


@contextlib.asynccontextmanager
async def ready_sidecar(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path, *args: str
) -> AsyncIterator[tuple[ServiceProcess, str, int, str]]:
    """``toolwitness sidecar`` (extra ``args``) on a fresh spans topic, ready (/readyz 200): the
    process, its OTLP endpoint, its admin port and the spans topic. Stopped on the way out."""
    cfg = make_config(kafka_bootstrap, redis_url)
    await create_topic(kafka_bootstrap, cfg.kafka.topics.spans, 2, {})
    otlp_port, admin_port = free_ports(2)
    endpoint = f"127.0.0.1:{otlp_port}"
    command = ("sidecar", "--listen", endpoint, "--admin-listen", f"127.0.0.1:{admin_port}", *args)
    proc = ServiceProcess(write_config(cfg, tmp_path / "toolwitness.yaml"), tmp_path / "sidecar.log", command)
    try:
        await proc.start()

        async def ready() -> bool:
            if proc.proc is not None and proc.proc.returncode is not None:
                pytest.fail(f"the sidecar exited ({proc.proc.returncode}) before it was ready:\n{proc.log_tail()}")
            return await status_is(admin_port, "/readyz", 200)

        with fail_on_timeout(lambda: f"the sidecar never became ready:\n{proc.log_tail()}"):
            await until(ready, timeout=60, interval=0.1)
        yield proc, endpoint, admin_port, cfg.kafka.topics.spans
    finally:
        await proc.stop()


async def test_sigterm_drains_the_sidecar_not_ready_still_forwarding_then_stops(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    spans, traces = captured_spans()
    async with ready_sidecar(kafka_bootstrap, redis_url, tmp_path) as (proc, endpoint, admin_port, topic):
        assert proc.proc is not None
        proc.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        # not ready at once (well within the drain), still alive
        with fail_on_timeout(lambda: f"/readyz never answered 503 after SIGTERM:\n{proc.log_tail()}"):
            await until(lambda: status_is(admin_port, "/readyz", 503), timeout=DEFAULT_DELAY_S / 2, interval=0.05)
        assert await http_status(admin_port, "/healthz") == 200
        # an agent that has not yet seen the endpoint change exports now: accepted and forwarded
        otlp = OTLPSpanExporter(endpoint=endpoint, insecure=True, timeout=5)
        try:
            result = await asyncio.to_thread(otlp.export, spans)
        finally:
            await asyncio.to_thread(otlp.shutdown)
        exported = time.monotonic() - sent
        assert result is SpanExportResult.SUCCESS, f"an Export during the drain failed:\n{proc.log_tail()}"
        assert exported < DEFAULT_DELAY_S and proc.proc.returncode is None
        # then it stops by itself, once the delay is over
        with fail_on_timeout(lambda: f"the sidecar did not stop after the drain:\n{proc.log_tail()}"):
            async with asyncio.timeout(DEFAULT_DELAY_S + 20):
                rc = await proc.proc.wait()
        took = time.monotonic() - sent
    log = proc.log_path.read_text(errors="replace")
    assert rc == 0, f"exit status {rc}:\n{proc.log_tail()}"
    assert took >= DEFAULT_DELAY_S - 0.1, f"stopped {took:.2f} s after SIGTERM, before the drain was over"
    assert "otlp_grpc: signal received, draining for 5 s" in log and "otlp_grpc: drained, shutting down" in log
    check_span_records(await read_all(kafka_bootstrap, topic), traces)


async def test_a_second_signal_ends_the_drain(kafka_bootstrap: str, redis_url: str, tmp_path: Path) -> None:
    async with ready_sidecar(kafka_bootstrap, redis_url, tmp_path, "--shutdown-delay", "120") as (
        proc, _endpoint, admin_port, _topic
    ):
        assert proc.proc is not None
        proc.proc.send_signal(signal.SIGTERM)
        with fail_on_timeout(lambda: f"/readyz never answered 503 after SIGTERM:\n{proc.log_tail()}"):
            await until(lambda: status_is(admin_port, "/readyz", 503), timeout=30, interval=0.05)
        proc.proc.send_signal(signal.SIGTERM)
        with fail_on_timeout(lambda: f"a second SIGTERM did not end the 120 s drain:\n{proc.log_tail()}"):
            async with asyncio.timeout(30):
                rc = await proc.proc.wait()
    assert rc == 0, f"exit status {rc}:\n{proc.log_tail()}"
    log = proc.log_path.read_text(errors="replace")
    assert "draining for 120 s" in log and "second signal received, shutting down" in log


def test_the_shutdown_delay_is_a_number_of_seconds_not_below_zero() -> None:
    assert SidecarConfig().shutdown_delay_seconds == DEFAULT_DELAY_S
    assert SidecarConfig(shutdown_delay_seconds=0).shutdown_delay_seconds == 0
    for bad in (-1, float("inf"), float("nan")):
        with pytest.raises(ValidationError, match="shutdown_delay_seconds"):
            SidecarConfig(shutdown_delay_seconds=bad)
