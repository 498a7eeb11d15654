"""``toolwitness smoke`` against a running service passes, and against a stopped one says which step
did not happen (the chart's ``helm test`` hook runs it against a deployment)."""

from __future__ import annotations

import asyncio
import io
import os
import sys
from pathlib import Path

import pytest
from rich.console import Console

from collector.receivers.otlp_grpc import SidecarConfig, create_sidecar
from collector.smoke import NEVER_RAN, RAN, SMOKE_TENANT, OtlpTarget, SmokeError, run_smoke
from collector.wire.convert import decode_score_event
from tests.integration.harness import REPO_ROOT, create_topic, make_config, read_until, running_service, write_config
from tests.unit.security.certs import make_pki

pytestmark = pytest.mark.integration


async def test_smoke_passes_against_a_running_service_and_fails_naming_the_step_without_one(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    out = Console(file=io.StringIO(), width=300, color_system=None)
    async with running_service(cfg):
        report = await run_smoke(cfg, timeout_s=30, out=out)
        config = write_config(cfg, tmp_path / "config.yaml")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "collector.cli", "smoke", "--config", str(config), "--timeout", "30",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO_ROOT,
            env={**os.environ, "COLUMNS": "200"},
        )
        async with asyncio.timeout(90):
            stdout, stderr = await proc.communicate()
        assert proc.returncode == 0, stderr.decode()
        assert "toolwitness smoke: passed" in stdout.decode()
    assert [s[0] for s in report.steps] == ["agent", "expectations", "score", "score", "observation"]
    # what a consumer of the scores topic saw: the smoke tenant's TRUE and FALSE on the smoke trace
    records = await read_until(kafka_bootstrap, cfg.kafka.topics.scores, lambda rs: len(rs) >= 4, timeout=30)
    mine = [ev for ev in map(decode_score_event, (r.value or b"" for r in records))
            if report.trace_id in ev.scope.traces.trace_ids]
    assert sorted((ev.tenant, ev.rationale.split("'")[1], ev.value) for ev in mine) == [
        (SMOKE_TENANT, NEVER_RAN, "false"), (SMOKE_TENANT, RAN, "true")]

    with pytest.raises(SmokeError, match=f"no score for '{RAN} ran'.*is the service running"):
        await run_smoke(cfg, timeout_s=2, out=Console(file=io.StringIO()))


async def test_smoke_needs_a_tool_call_tree(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = make_config(kafka_bootstrap, redis_url, scorers={"text": {"type": "substring", "substring": "x"}})
    with pytest.raises(SmokeError, match="no scorer tree of type otel_tool_call"):
        await run_smoke(cfg, timeout_s=2, out=Console(file=io.StringIO()))


async def test_smoke_says_when_the_agents_spans_cannot_be_written(kafka_bootstrap: str, redis_url: str) -> None:
    cfg = make_config(kafka_bootstrap, redis_url)
    t = cfg.kafka.topics
    await create_topic(kafka_bootstrap, t.spans, 1, {"max.message.bytes": "200"})  # below the smoke trace's record
    for topic in (t.control, t.scores, t.observations):
        await create_topic(kafka_bootstrap, topic, 1, {})
    with pytest.raises(SmokeError, match=f"writing the agent's spans to {t.spans} failed"):
        await run_smoke(cfg, timeout_s=5, out=Console(file=io.StringIO()))


async def test_smoke_through_the_sidecar_with_its_token_and_its_tenant(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    # The agent-facing path, as `helm test` takes it: OTLP/gRPC over TLS to the sidecar (bearer
    # token), which forwards to Kafka and stamps its own tenant; the expectations are that tenant's.
    cfg = make_config(kafka_bootstrap, redis_url)
    token = "smoke-token-123"
    pki = make_pki(tmp_path / "pki")
    sidecar = create_sidecar(
        SidecarConfig(listen="127.0.0.1:0", kafka=cfg.kafka, bearer_token_env="TW_SMOKE_TOKEN", tenant="team-a",
                      tenant_header=cfg.tenant.header, tls_certfile=str(pki.server_cert),
                      tls_keyfile=str(pki.server_key)),
        env={"TW_SMOKE_TOKEN": token},
    )
    ca = str(pki.ca)
    await sidecar.start()
    try:
        async with running_service(cfg):
            report = await run_smoke(cfg, timeout_s=30, out=Console(file=io.StringIO()),
                                     otlp=OtlpTarget(sidecar.endpoint, ca, token), tenant="team-a")
            assert report.steps[0][1].endswith(f"spans written to {sidecar.endpoint}")
            config = write_config(cfg, tmp_path / "config.yaml")

            async def cli(*args: str, **env: str) -> tuple[int, str]:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "collector.cli", "smoke", "--config", str(config), "--timeout", "30",
                    "--otlp-endpoint", sidecar.endpoint, "--otlp-ca", ca, "--tenant", "team-a", *args,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=REPO_ROOT,
                    env={**os.environ, "COLUMNS": "200", **env},
                )
                async with asyncio.timeout(90):
                    out, _ = await proc.communicate()
                return proc.returncode or 0, out.decode()

            rc, out = await cli("--otlp-token-env", "TW_SMOKE_CLI_TOKEN", TW_SMOKE_CLI_TOKEN=token)
            assert rc == 0 and "toolwitness smoke: passed" in out, out
            rc, out = await cli("--otlp-token-env", "TW_SMOKE_UNSET_TOKEN")
            assert rc == 2 and "TW_SMOKE_UNSET_TOKEN is not set" in out, out
            with pytest.raises(SmokeError, match=f"writing the agent's spans to {sidecar.endpoint} failed"):
                await run_smoke(cfg, timeout_s=5, out=Console(file=io.StringIO()),
                                otlp=OtlpTarget(sidecar.endpoint, ca, "wrong"), tenant="team-a")
            # the sidecar stamps team-a: expectations of another tenant never see the spans
            with pytest.raises(SmokeError, match="stamps its own tenant need --tenant"):
                await run_smoke(cfg, timeout_s=3, out=Console(file=io.StringIO()),
                                otlp=OtlpTarget(sidecar.endpoint, ca, token))
            # plaintext to a TLS listener: the write fails, named as such
            with pytest.raises(SmokeError, match="writing the agent's spans"):
                await run_smoke(cfg, timeout_s=5, out=Console(file=io.StringIO()),
                                otlp=OtlpTarget(sidecar.endpoint, token=token), tenant="team-a")
    finally:
        await sidecar.shutdown()
    records = await read_until(kafka_bootstrap, cfg.kafka.topics.scores, lambda rs: len(rs) >= 4, timeout=30)
    assert {decode_score_event(r.value or b"").tenant for r in records} == {"team-a"}
