"""deploy/collector: the OpenTelemetry Collector config and its minimal ocb distribution.

The static tests always run. The `collector_build` tests build the distribution (several
minutes cold, cached in .cache/tools) and run it on loopback; they are opt-in, see
conftest.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.deploy.helpers import ROOT, TOOLS_SH, build_tool

COLLECTOR = ROOT / "deploy" / "collector"
CONFIG = COLLECTOR / "config.yaml"
SASL_OVERLAY = COLLECTOR / "config.sasl-tls.yaml"
MANIFEST = COLLECTOR / "builder-config.yaml"
RUN_LOCAL = COLLECTOR / "run-local.sh"

CORE = "go.opentelemetry.io/collector/"
CONTRIB = "github.com/open-telemetry/opentelemetry-collector-contrib/"


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def component_type(config_key: str) -> str:
    """`kafka/spans` -> `kafka`: the collector's type/name component ids."""
    return config_key.split("/", 1)[0]


#: component types whose name is not their module's (the collector's type strings have underscores)
_TYPE_OF_MODULE = {"memorylimiter": "memory_limiter", "healthcheck": "health_check"}


def manifest_types(manifest: dict[str, Any], kind: str) -> set[str]:
    """Component types a manifest section provides (the last path element minus its kind suffix)."""
    suffix = {"receivers": "receiver", "processors": "processor", "exporters": "exporter", "extensions": "extension"}[
        kind
    ]
    out = set()
    for entry in manifest.get(kind, []):
        module = entry["gomod"].split()[0].rsplit("/", 1)[-1]
        name = module.removesuffix(suffix)
        out.add(_TYPE_OF_MODULE.get(name, name))
    return out


# --------------------------------------------------------------------------- static


def test_pipeline_is_otlp_in_limited_batches_kafka_out() -> None:
    cfg = load(CONFIG)
    (pipeline,) = cfg["service"]["pipelines"].values()
    assert list(cfg["service"]["pipelines"]) == ["traces"]
    # the memory limiter first (refuse data under pressure rather than be OOM-killed)
    assert pipeline == {"receivers": ["otlp"], "processors": ["memory_limiter", "batch"], "exporters": ["kafka"]}
    assert cfg["service"]["extensions"] == ["health_check"]
    assert set(cfg["receivers"]["otlp"]["protocols"]) == {"grpc", "http"}


def test_kafka_exporter_writes_otlp_proto_keyed_by_trace_id() -> None:
    kafka = load(CONFIG)["exporters"]["kafka"]
    assert kafka["traces"]["encoding"] == "otlp_proto"
    assert kafka["traces"]["topic"].endswith(":-otlp_spans}")  # ${env:KAFKA_SPANS_TOPIC:-otlp_spans}
    assert kafka["partition_traces_by_id"] is True
    # gzip: decoded with the standard library alone (the service reads snappy, lz4 and zstd too, with
    # cramjam: tests/integration/test_compressed_records.py)
    assert kafka["producer"]["compression"] in {"none", "gzip"}


def test_defaults_listen_on_loopback_only() -> None:
    cfg = load(CONFIG)
    for proto in cfg["receivers"]["otlp"]["protocols"].values():
        assert re.search(r":-127\.0\.0\.1:\d+}$", proto["endpoint"]), proto["endpoint"]
    (reader,) = cfg["service"]["telemetry"]["metrics"]["readers"]
    prom = reader["pull"]["exporter"]["prometheus"]
    assert prom["host"] == "127.0.0.1"
    assert "8888" not in str(prom["port"]), "8888 is the toolwitness admin port"
    assert re.search(r":-127\.0\.0\.1:\d+}$", cfg["extensions"]["health_check"]["endpoint"])


def test_sasl_overlay_takes_credentials_from_the_environment() -> None:
    sasl = load(SASL_OVERLAY)["exporters"]["kafka"]["auth"]["sasl"]
    assert sasl["username"].startswith("${env:") and sasl["password"].startswith("${env:")


def test_manifest_has_exactly_the_components_the_config_uses() -> None:
    manifest, cfg = load(MANIFEST), load(CONFIG)
    for kind in ("receivers", "processors", "exporters", "extensions"):
        assert manifest_types(manifest, kind) == {component_type(k) for k in cfg[kind]}, kind
    assert not manifest.get("connectors") and not cfg.get("connectors")


def test_manifest_pins_one_collector_release() -> None:
    manifest = load(MANIFEST)
    modules: list[tuple[str, str]] = []
    for kind in ("receivers", "processors", "exporters", "extensions", "providers"):
        modules += [tuple(e["gomod"].split()) for e in manifest[kind]]
    modules.append(tuple(manifest["telemetry"]["gomod"].split()))
    for module, version in modules:
        assert re.fullmatch(r"v\d+\.\d+\.\d+", version), f"{module} is not pinned to a release: {version}"
    core = {v for m, v in modules if m.startswith(CORE) and not m.startswith(CORE + "confmap/")}
    stable = {v for m, v in modules if m.startswith(CORE + "confmap/")}
    contrib = {v for m, v in modules if m.startswith(CONTRIB)}
    assert len(core) == len(stable) == len(contrib) == 1, (core, stable, contrib)
    # contrib ships the same minor release as core (possibly with a patch on top)
    assert next(iter(contrib)).rsplit(".", 1)[0] == next(iter(core)).rsplit(".", 1)[0]
    # the builder itself is the core release (scripts/tools.sh OCB_VERSION)
    ocb = re.search(r'^OCB_VERSION="(v[^"]+)"', TOOLS_SH.read_text(), re.M)
    assert ocb and ocb.group(1) == next(iter(core))


# --------------------------------------------------------------------------- built binary


@pytest.fixture(scope="module")
def otelcol() -> Path:
    return build_tool("collector")


def run(binary: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary), *args], capture_output=True, text=True, timeout=60, check=False, env=env, cwd=ROOT
    )


@pytest.mark.collector_build
def test_distribution_has_exactly_the_manifest_components(otelcol: Path) -> None:
    proc = run(otelcol, "components")
    assert proc.returncode == 0, proc.stderr
    components = yaml.safe_load(proc.stdout)
    manifest = load(MANIFEST)
    for kind in ("receivers", "processors", "exporters", "extensions"):
        assert {c["name"] for c in components[kind]} == manifest_types(manifest, kind)
        assert {c["module"] for c in components[kind]} == {e["gomod"] for e in manifest[kind]}
    assert not components["connectors"]


@pytest.mark.collector_build
def test_configs_validate_with_the_built_collector(otelcol: Path) -> None:
    proc = run(otelcol, "validate", "--config", str(CONFIG))
    assert proc.returncode == 0, proc.stderr
    env = {**os.environ, "KAFKA_SASL_USERNAME": "producer", "KAFKA_SASL_PASSWORD": "not-a-secret"}
    proc = run(otelcol, "validate", "--config", str(CONFIG), "--config", str(SASL_OVERLAY), env=env)
    assert proc.returncode == 0, proc.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def local_collector(otelcol: Path, tmp_path: Path) -> Iterator[dict[str, int]]:
    """run-local.sh on free loopback ports, against a loopback port where no broker listens."""
    ports = {"grpc": free_port(), "http": free_port(), "metrics": free_port(), "kafka": free_port(),
             "health": free_port()}
    env = {
        **os.environ,
        "OTLP_GRPC_ENDPOINT": f"127.0.0.1:{ports['grpc']}",
        "OTLP_HTTP_ENDPOINT": f"127.0.0.1:{ports['http']}",
        "OTELCOL_METRICS_PORT": str(ports["metrics"]),
        "HEALTH_CHECK_ENDPOINT": f"127.0.0.1:{ports['health']}",
    }
    log = (tmp_path / "otelcol.log").open("w")
    proc = subprocess.Popen(
        ["bash", str(RUN_LOCAL), f"127.0.0.1:{ports['kafka']}"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield ports
    finally:
        # run-local.sh execs the collector, so this pid is the collector's.
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()


def wait_http(url: str, timeout: float = 30) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                body: bytes = resp.read()
                return body
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.collector_build
def test_run_local_accepts_otlp_on_loopback(local_collector: dict[str, int]) -> None:
    metrics = wait_http(f"http://127.0.0.1:{local_collector['metrics']}/metrics")
    assert b"otelcol" in metrics
    health = json.loads(wait_http(f"http://127.0.0.1:{local_collector['health']}/"))  # the k8s probe target
    assert "available" in str(health.get("status", "")).lower(), health
    span = {
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": "eee19b7ec3c1b174",
        "name": "execute_tool get_weather",
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000000100000000",
    }
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{local_collector['http']}/v1/traces",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
