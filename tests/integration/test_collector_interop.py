"""Interop: the minimal OpenTelemetry Collector distribution (deploy/collector) in front of toolwitness.

real OTel SDK --OTLP/gRPC--> otelcol-toolwitness (otlp receiver, batch, kafkaexporter otlp_proto,
partitioned by trace id) --> Kafka --> toolwitness service --> TRUE on the scores topic.

The distribution is built by scripts/tools.sh (several minutes cold, cached in .cache/tools),
so this test carries the opt-in `collector_build` marker: `make collector-build` or
`pytest -m collector_build` runs it.
"""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from scoring.models import TraceScorable
from tests.integration.harness import control_client, expects, make_config, running_service, verdict

pytestmark = [pytest.mark.integration, pytest.mark.collector_build]
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _port_open(port: int) -> bool:
    try:
        _, w = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    w.close()
    return True


async def test_collector_distribution_feeds_toolwitness(kafka_bootstrap: str, redis_url: str) -> None:
    build = await asyncio.create_subprocess_exec(
        str(ROOT / "scripts" / "tools.sh"), "collector", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(build.communicate(), timeout=1800)
    assert build.returncode == 0, "scripts/tools.sh collector failed"
    binary = out.decode().strip().splitlines()[-1]
    assert os.access(binary, os.X_OK), binary
    cfg = make_config(kafka_bootstrap, redis_url)
    grpc_port, http_port, metrics_port = _free_port(), _free_port(), _free_port()
    async with running_service(cfg), control_client(cfg) as tw:  # creates the topics (no auto-creation)
        env = {
            **os.environ,
            "KAFKA_SPANS_TOPIC": cfg.kafka.topics.spans,
            "OTLP_GRPC_ENDPOINT": f"127.0.0.1:{grpc_port}",
            "OTLP_HTTP_ENDPOINT": f"127.0.0.1:{http_port}",
            "OTELCOL_METRICS_PORT": str(metrics_port),
        }
        proc = await asyncio.create_subprocess_exec(
            str(ROOT / "deploy" / "collector" / "run-local.sh"),
            kafka_bootstrap,
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            async with asyncio.timeout(60):
                while not await _port_open(grpc_port):
                    assert proc.returncode is None, f"collector exited with {proc.returncode}"
                    await asyncio.sleep(0.1)
            provider = TracerProvider(
                sampler=ALWAYS_ON, span_limits=SpanLimits(max_span_attribute_length=SpanLimits.UNSET)
            )
            provider.add_span_processor(
                SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"127.0.0.1:{grpc_port}", insecure=True))
            )
            tracer = provider.get_tracer("interop-agent")

            def run_agent() -> str:
                with tracer.start_as_current_span("agent", context=Context()) as root:
                    with tracer.start_as_current_span(
                        "my_tool_call",
                        attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "my_tool_call"},
                    ):
                        pass
                    return f"{root.get_span_context().trace_id:032x}"

            trace_id = await asyncio.to_thread(run_agent)
            eid = await tw.expect(TraceScorable(trace_ids=(trace_id,)), expects("my_tool_call"))
            ev = await tw.wait_for(eid, timeout=60)
            assert verdict(ev) == "true"
            await asyncio.to_thread(provider.shutdown)
        finally:
            if proc.returncode is None:
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), timeout=20)
            except TimeoutError:
                proc.kill()
                await proc.wait()
