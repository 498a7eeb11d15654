"""The Helm chart under deploy/helm/toolwitness, checked with the real (pinned) helm.

What is pinned here: lint --strict passes; the checked-in rendered examples are what helm
renders now; the schema rejects unknown keys; the ConfigMap carries exactly the service
config contract and the service's own validator accepts it; probes, Service and
ServiceMonitor agree with the admin port in that ConfigMap; every Deployment is hardened;
the fail-fast checks fire; the Kafka ACLs keep the control topic to the control plane.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from collector.config import ServiceConfig, load_config
from collector.processors.decide import Decider
from tests.unit.deploy.helpers import CHART, EXAMPLES, NAMESPACE, RELEASE, Helm, example_names, parse_docs

EXAMPLE_NAMES = example_names()

#: The service config contract, defaults included. The chart's default ConfigMap must
#: render exactly this (same keys, same values).
CONTRACT = yaml.safe_load(
    """
tenant: {default: default, header: toolwitness-tenant, resource_attribute: toolwitness.tenant}
kafka:
  bootstrap_servers: "kafka:9092"
  group_id: toolwitness
  client_id: toolwitness
  encoding: otlp_proto
  output_format: protobuf
  topics: {spans: otlp_spans, control: toolwitness.control, scores: toolwitness.scores,
           observations: toolwitness.observations, dlq: toolwitness.dlq}
  max_record_bytes: 4194304
  max_poll_records: 500
  poll_timeout_ms: 100
  fetch_max_wait_ms: 10
  request_timeout_ms: 30000
  session_timeout_ms: 10000
  metadata_max_age_ms: 30000
  security:
    protocol: PLAINTEXT
    sasl_mechanism: ""
    sasl_username_env: TOOLWITNESS_KAFKA_SASL_USERNAME
    sasl_password_env: TOOLWITNESS_KAFKA_SASL_PASSWORD
    ssl_cafile: ""
    ssl_certfile: ""
    ssl_keyfile: ""
redis:
  url: "redis://redis:6379/0"
  password_env: TOOLWITNESS_REDIS_PASSWORD
  cluster: false
  key_prefix: tw
  state_ttl_seconds: 86400
  completed_ttl_seconds: 300
  socket_timeout_seconds: 5
  ssl_ca_file: ""
completion:
  mode: marker
  allowed_lateness_ms: 2000
  max_out_of_orderness_ms: 1000
  idle_partition_ms: 10000
  default_deadline_seconds: 300
  sweep_interval_ms: 250
limits: {max_spans_per_trace: 10000, max_attributes_per_span: 1024, max_tool_executions_per_trace: 1000,
         max_argument_bytes: 1024, max_observation_bytes: 900000}
scorers:
  tools: {type: otel_tool_call}
admin: {host: 0.0.0.0, port: 8888}
log_level: INFO
log_format: text
"""
)

#: Fixed by the service: the admin server's paths.
LIVENESS_PATH, READINESS_PATH, METRICS_PATH = "/healthz", "/readyz", "/metrics"


def example_values(name: str) -> Path:
    return EXAMPLES / name / "values.yaml"


def kinds(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str = RELEASE) -> dict[str, Any]:
    found = [d for d in kinds(docs, kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def service_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The config.yaml the scorer reads, parsed from the rendered ConfigMap."""
    cfg: dict[str, Any] = yaml.safe_load(one(docs, "ConfigMap")["data"]["config.yaml"])
    return cfg


def key_paths(tree: Any, prefix: str = "") -> set[str]:
    if not isinstance(tree, dict):
        return {prefix}
    out: set[str] = set()
    for k, v in tree.items():
        out |= key_paths(v, f"{prefix}.{k}" if prefix else str(k))
    return out


@pytest.fixture(scope="module")
def rendered(helm: Helm) -> dict[str, list[dict[str, Any]]]:
    """Every example rendered now, parsed."""
    return {name: helm.render_docs([example_values(name)]) for name in EXAMPLE_NAMES}


# --------------------------------------------------------------------------- lint/render


def test_examples_cover_the_required_scenarios() -> None:
    assert {"default", "sasl-tls", "autoscaling"} <= set(EXAMPLE_NAMES)


def test_lint_strict_defaults(helm: Helm) -> None:
    proc = helm.run("lint", "--strict", str(CHART))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_lint_strict_example(helm: Helm, name: str) -> None:
    proc = helm.run("lint", "--strict", str(CHART), "-f", str(example_values(name)), "--namespace", "toolwitness")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_rendered_example_is_up_to_date(helm: Helm, name: str) -> None:
    checked_in = (EXAMPLES / name / "rendered.yaml").read_text()
    assert helm.render([example_values(name)]) == checked_in, (
        f"deploy/helm/examples/{name}/rendered.yaml is stale: run `make helm-render` and commit it"
    )


# --------------------------------------------------------------------------- schema


@pytest.mark.parametrize(
    "unknown",
    [
        "replicas: 3\n",  # top level (the real key is replicaCount)
        "config:\n  kafka:\n    bootstrap: kafka:9092\n",  # nested in the service config
        "config:\n  scorers:\n    tools:\n      type: otel_tool_call\n      weight: 2\n",  # inside a scorer tree
        "networkPolicy:\n  egress:\n    kafka:\n      port: 9092\n",  # deep in a chart section
        "secrets:\n  kafkaSasl:\n    password: hunter2\n",  # a secret value where only refs belong
    ],
)
def test_unknown_key_fails_template_and_lint(helm: Helm, tmp_path: Path, unknown: str) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(unknown)
    template = helm.template([values])
    assert template.returncode != 0, "helm template accepted an unknown key"
    assert "additional properties" in template.stderr
    lint = helm.run("lint", "--strict", str(CHART), "-f", str(values))
    assert lint.returncode != 0, "helm lint accepted an unknown key"


def test_schema_closes_every_object() -> None:
    """additionalProperties: false on every object with fixed keys; maps are typed."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    # Kubernetes objects passed through as written (validated by the API server).
    passthrough = {
        "/properties/global",
        "/properties/affinity/properties/nodeAffinity",
        "/properties/affinity/properties/podAffinity",
        "/properties/affinity/properties/podAntiAffinity",
        "/$defs/kubernetesObject",  # extraVolumes' volume sources
    }
    problems: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and path not in passthrough:
                extra = node.get("additionalProperties")
                if "properties" in node and extra is not False:
                    problems.append(f"{path}: has properties but additionalProperties is {extra!r}")
                if "properties" not in node and not isinstance(extra, dict):
                    problems.append(f"{path}: open map without a typed additionalProperties")
            for k, v in node.items():
                walk(v, f"{path}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}/{i}")

    walk(schema, "")
    assert not problems, "\n".join(problems)
    assert schema["additionalProperties"] is False


def test_every_values_key_is_commented() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    key = re.compile(r"^\s*(- )?[A-Za-z_][A-Za-z0-9_.-]*:(\s|$)")
    bare = [
        f"{i + 1}: {line}"
        for i, line in enumerate(lines)
        if key.match(line) and not (i and lines[i - 1].strip().startswith("#"))
    ]
    assert not bare, "values.yaml keys without a comment above them:\n" + "\n".join(bare)


def test_no_secret_material_in_values_or_output(rendered: dict[str, list[dict[str, Any]]]) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for path in key_paths(values):
        leaf = path.rsplit(".", 1)[-1].lower()
        assert leaf not in {"password", "username", "token", "key", "cert"}, f"values.yaml holds a secret: {path}"
    for name, docs in rendered.items():
        assert not kinds(docs, "Secret"), f"{name}: the chart must never create Secrets"


# --------------------------------------------------------------------------- config contract


def test_default_configmap_is_exactly_the_contract(rendered: dict[str, list[dict[str, Any]]]) -> None:
    cfg = service_config(rendered["default"])
    assert key_paths(cfg) == key_paths(CONTRACT)
    assert cfg == CONTRACT


def test_every_service_setting_is_reachable_from_values() -> None:
    """Each key of the service config is in the chart's contract, and the chart's default is the
    service's own where the service has a deployment-neutral one."""
    service = ServiceConfig().model_dump(mode="json")
    # Set per pod or per deployment on purpose: the instance name (defaults to host:pid) and the
    # endpoints / listen address, which have loopback defaults in the service.
    chart_only = {"instance", "kafka.bootstrap_servers", "redis.url", "admin.host"}
    settable = {p for p in key_paths(service) if not p.startswith("scorers.")} - {"instance"}
    assert settable <= key_paths(CONTRACT), settable - key_paths(CONTRACT)
    for path in settable - chart_only:
        if path.startswith(("kafka.topics.", "kafka.security.")):
            continue  # topic names and security env/file names are the chart's (documented) choices
        want, got = service, CONTRACT
        for part in path.split("."):
            want, got = want[part], got[part]
        assert got == want, f"{path}: chart default {got!r}, service default {want!r}"


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_configmap_has_contract_keys_and_loads_in_the_service(
    rendered: dict[str, list[dict[str, Any]]], name: str, tmp_path: Path
) -> None:
    cfg = service_config(rendered[name])
    # Scorer trees are user-defined; every other key is the contract's, no more, no less.
    strip = {k: v for k, v in cfg.items() if k != "scorers"}
    assert key_paths(strip) == {p for p in key_paths(CONTRACT) if not p.startswith("scorers.")}
    path = tmp_path / "config.yaml"
    path.write_text(one(rendered[name], "ConfigMap")["data"]["config.yaml"])
    loaded = load_config(path, env={})  # the service's own validator: unknown keys fail
    assert loaded.admin.port == cfg["admin"]["port"]


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_service_builds_every_scorer_tree_of_the_rendered_config(
    rendered: dict[str, list[dict[str, Any]]], name: str, tmp_path: Path
) -> None:
    """What `toolwitness validate-config` checks: the config loads and every scorer tree builds."""
    path = tmp_path / "config.yaml"
    path.write_text(one(rendered[name], "ConfigMap")["data"]["config.yaml"])
    decider = Decider(load_config(path, env={}))
    assert set(decider.trees) == set(service_config(rendered[name])["scorers"])


def test_pods_run_the_documented_commands(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["sidecar"]
    config_path = "/etc/toolwitness/config.yaml"
    scorer = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert scorer["args"] == ["run", "--config", config_path]
    sidecar = one(docs, "Deployment", f"{RELEASE}-sidecar")["spec"]["template"]["spec"]["containers"][0]
    assert sidecar["args"] == ["sidecar", "--listen", "0.0.0.0:4317", "--admin-listen", "0.0.0.0:8888",
                               "--config", config_path,
                               "--tls-cert", "/etc/toolwitness/sidecar-tls/tls.crt",
                               "--tls-key", "/etc/toolwitness/sidecar-tls/tls.key",
                               "--shutdown-delay", "5"]
    mounts = {m["mountPath"]: m for m in scorer["volumeMounts"]} | {m["mountPath"]: m for m in sidecar["volumeMounts"]}
    assert mounts[config_path]["subPath"] == "config.yaml"


def test_helm_test_runs_the_smoke_command_with_its_own_credentials(helm: Helm) -> None:
    """`helm test` runs `toolwitness smoke` on the release's config: a hook pod the Service, the
    PDB and the NetworkPolicies do not select, with the smoke test's SASL credentials when given."""
    from typer.main import get_command

    from collector.cli import app

    sasl = ["config.kafka.security.protocol=SASL_SSL", "config.kafka.security.sasl_mechanism=SCRAM-SHA-512",
            "secrets.kafkaSasl.existingSecret=scorer-sasl"]
    docs = helm.render_docs(sets=[*sasl, "smokeTest.timeoutSeconds=90"])
    (pod,) = kinds(docs, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["restartPolicy"] == "Never"
    (c,) = pod["spec"]["containers"]
    assert c["args"] == ["smoke", "--config", "/etc/toolwitness/config.yaml", "--timeout", "90"]
    smoke_cli = get_command(app).commands["smoke"]  # type: ignore[attr-defined]
    assert {"--config", "--timeout"} <= {opt for param in smoke_cli.params for opt in param.opts}
    labels = pod["metadata"]["labels"]
    for selector in (one(docs, "Service")["spec"]["selector"],
                     one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]):
        assert not selector.items() <= labels.items()
    for policy in kinds(docs, "NetworkPolicy"):
        assert not policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()

    def secret_of(container: dict[str, Any]) -> set[str]:
        return {e["valueFrom"]["secretKeyRef"]["name"] for e in container.get("env", []) if "valueFrom" in e}

    assert secret_of(c) == {"scorer-sasl"}  # none of its own: the scorer's
    (own,) = kinds(helm.render_docs(sets=[*sasl, "smokeTest.kafkaSasl.existingSecret=smoke-sasl"]), "Pod")
    assert secret_of(own["spec"]["containers"][0]) == {"smoke-sasl"}
    # Under the ACLs: expectations as the control plane, spans as a span producer (to Kafka directly)
    (split,) = kinds(helm.render_docs(sets=[*sasl, "smokeTest.kafkaSasl.existingSecret=control-plane",
                                            "smokeTest.spanProducerSasl.existingSecret=span-producer"]), "Pod")
    sc = split["spec"]["containers"][0]
    assert secret_of(sc) == {"control-plane", "span-producer"}
    env_of = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in sc["env"]}
    a = sc["args"]
    assert env_of[a[a.index("--spans-sasl-username-env") + 1]] == "span-producer"
    assert env_of[a[a.index("--spans-sasl-password-env") + 1]] == "span-producer"
    assert env_of["TOOLWITNESS_KAFKA_SASL_USERNAME"] == "control-plane"  # the config's credentials
    assert {"--spans-sasl-username-env", "--spans-sasl-password-env"} <= {
        opt for param in smoke_cli.params for opt in param.opts}
    assert not kinds(helm.render_docs(sets=["smokeTest.enabled=false"]), "Pod")


def test_with_the_sidecar_helm_test_goes_through_it(helm: Helm) -> None:
    """The agents' path: OTLP/gRPC to the sidecar's Service with its token, verified against its
    TLS CA, under the tenant it stamps; its NetworkPolicy admits the test pod on the OTLP port."""
    from typer.main import get_command

    from collector.cli import app

    sidecar = ["sidecar.enabled=true", "sidecar.port=4319", "sidecar.tenant=team-a", "networkPolicy.enabled=true",
               "sidecar.auth.existingSecret=sidecar-token", "sidecar.tls.existingSecret=sidecar-tls"]
    docs = helm.render_docs(sets=sidecar)
    (pod,) = kinds(docs, "Pod")
    (c,) = pod["spec"]["containers"]
    args = c["args"]
    assert args[args.index("--otlp-endpoint") + 1] == f"{RELEASE}-sidecar.{NAMESPACE}.svc:4319"
    assert args[args.index("--tenant") + 1] == "team-a"
    assert args[args.index("--otlp-token-env") + 1] == "TOOLWITNESS_SIDECAR_TOKEN"
    token = next(e for e in c["env"] if e["name"] == "TOOLWITNESS_SIDECAR_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "sidecar-token", "key": "token"}
    ca = args[args.index("--otlp-ca") + 1]
    mount = next(m for m in c["volumeMounts"] if ca.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["secret"] == {"secretName": "sidecar-tls", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    smoke_cli = get_command(app).commands["smoke"]  # type: ignore[attr-defined]
    opts = {opt for param in smoke_cli.params for opt in param.opts}
    assert {"--otlp-endpoint", "--tenant", "--otlp-token-env", "--otlp-ca"} <= opts
    policy = one(docs, "NetworkPolicy", f"{RELEASE}-sidecar")
    admitted = [rule for rule in policy["spec"]["ingress"]
                if any(pod["metadata"]["labels"].items() >= f.get("podSelector", {}).get("matchLabels", {}).items()
                       and "podSelector" in f for f in rule["from"])]
    assert [r["ports"] for r in admitted] == [[{"protocol": "TCP", "port": 4319}]]
    # without a tenant of the sidecar's: the agent's own resource attribute, or (turned off) the default tenant
    def tenant_of(*sets: str) -> str:
        args = kinds(helm.render_docs(sets=["sidecar.enabled=true", *sets]), "Pod")[0]["spec"]["containers"][0]["args"]
        return str(args[args.index("--tenant") + 1])

    assert tenant_of() == "toolwitness-smoke"
    assert tenant_of("config.tenant.resource_attribute=", "config.tenant.default=lab") == "lab"
    # Kafka directly when asked (or without a sidecar): no OTLP arguments, no admission
    direct = helm.render_docs(sets=[*sidecar, "smokeTest.viaSidecar=false"])
    assert "--otlp-endpoint" not in kinds(direct, "Pod")[0]["spec"]["containers"][0]["args"]
    assert not [r for r in one(direct, "NetworkPolicy", f"{RELEASE}-sidecar")["spec"]["ingress"]
                if any("podSelector" in f for f in r["from"])]


def test_the_sidecar_is_probed_and_scraped_on_its_admin_port(helm: Helm) -> None:
    docs = helm.render_docs(sets=["sidecar.enabled=true", "sidecar.adminPort=9464", "serviceMonitor.enabled=true",
                                  "networkPolicy.enabled=true", "networkPolicy.ingress.namespaces={monitoring}",
                                  "sidecar.networkPolicy.ingressNamespaces={agents}"])
    name = f"{RELEASE}-sidecar"
    container = one(docs, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[args.index("--admin-listen") + 1] == "0.0.0.0:9464"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"otlp-grpc": 4317, "admin": 9464}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert container["startupProbe"]["tcpSocket"] == {"port": "otlp-grpc"}  # listening: Kafka answered
    svc = one(docs, "Service", name)
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"otlp-grpc": 4317, "admin": 9464}
    sm = one(docs, "ServiceMonitor", name)
    assert sm["spec"]["endpoints"][0]["port"] == "admin" and sm["spec"]["endpoints"][0]["path"] == "/metrics"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    scorer_sm = one(docs, "ServiceMonitor")
    assert not scorer_sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    rules = [r for r in one(docs, "NetworkPolicy", name)["spec"]["ingress"] if "namespaceSelector" in r["from"][0]]
    allowed = {r["ports"][0]["port"]: r["from"][0]["namespaceSelector"]["matchExpressions"][0]["values"] for r in rules}
    assert allowed == {4317: ["agents"], 9464: ["monitoring"]}  # (and the release's `helm test` pod: below)
    bad = helm.template(sets=["sidecar.enabled=true", "sidecar.adminPort=4317"])
    assert bad.returncode != 0 and "sidecar.adminPort must differ from sidecar.port" in bad.stderr


def test_the_sidecar_has_its_own_kafka_identity_token_and_listener_tls(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["sidecar"]
    pod = one(docs, "Deployment", f"{RELEASE}-sidecar")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["kafka-tls"]["secret"]["secretName"] == "toolwitness-sidecar-kafka-mtls"  # not the scorer's
    assert volumes["sidecar-tls"]["secret"]["secretName"] == "toolwitness-sidecar-otlp-tls"
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["TOOLWITNESS_SIDECAR_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "toolwitness-sidecar-token"
    scorer = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert {v["name"]: v for v in scorer["volumes"]}["kafka-tls"]["secret"]["secretName"] == "toolwitness-kafka-mtls"


def test_with_sasl_the_sidecar_uses_its_span_producer_credentials(helm: Helm) -> None:
    base = ["sidecar.enabled=true", "config.kafka.security.protocol=SASL_PLAINTEXT",
            "config.kafka.security.sasl_mechanism=SCRAM-SHA-512", "secrets.kafkaSasl.existingSecret=scorer-sasl"]
    proc = helm.template(sets=base)
    assert proc.returncode != 0 and "sidecar.kafkaSasl.existingSecret" in proc.stderr
    docs = helm.render_docs(sets=[*base, "sidecar.kafkaSasl.existingSecret=producer-sasl"])
    sidecar = one(docs, "Deployment", f"{RELEASE}-sidecar")["spec"]["template"]["spec"]["containers"][0]
    secrets = {e["valueFrom"]["secretKeyRef"]["name"] for e in sidecar["env"] if "valueFrom" in e}
    assert secrets == {"producer-sasl"}  # the scorer's credentials are nowhere in the sidecar pod
    scorer = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert {e["valueFrom"]["secretKeyRef"]["name"] for e in scorer["env"] if "valueFrom" in e} == {"scorer-sasl"}


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("config.admin.host=127.0.0.1", "the kubelet probes"),
        ("config.kafka.topics.dlq=otlp_spans", "each role needs its own topic"),
    ],
    ids=["admin-on-loopback", "dlq-is-the-spans-topic"],
)
def test_values_that_cannot_work_fail_the_render(helm: Helm, value: str, named: str) -> None:
    proc = helm.template(sets=[value])
    assert proc.returncode != 0 and named in proc.stderr


def test_a_sidecar_per_tenant_stamps_its_tenant(helm: Helm) -> None:
    docs = helm.render_docs(sets=["sidecar.enabled=true", "sidecar.tenant=acme", "config.tenant.resource_attribute="])
    sidecar = one(docs, "Deployment", f"{RELEASE}-sidecar")["spec"]["template"]["spec"]["containers"][0]
    args = sidecar["args"]
    assert args[args.index("--tenant") + 1] == "acme"
    assert service_config(docs)["tenant"]["resource_attribute"] == ""  # agents name no tenant
    proc = helm.template(sets=["sidecar.enabled=true", "sidecar.tenant=not a tenant"])
    assert proc.returncode != 0 and "/sidecar/tenant" in proc.stderr


def test_the_sidecar_drains_before_it_stops_within_the_grace_period(helm: Helm) -> None:
    """A terminating sidecar pod stays up not ready for sidecar.shutdownDelaySeconds (agents keep
    sending until the endpoint removal reaches them), and the kubelet waits for that and its stop."""
    from typer.main import get_command

    from collector.cli import app

    docs = helm.render_docs(sets=["sidecar.enabled=true", "sidecar.shutdownDelaySeconds=12",
                                  "terminationGracePeriodSeconds=48"])
    pod = one(docs, "Deployment", f"{RELEASE}-sidecar")["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--shutdown-delay") + 1] == "12"
    sidecar_cli = get_command(app).commands["sidecar"]  # type: ignore[attr-defined]
    assert "--shutdown-delay" in {opt for param in sidecar_cli.params for opt in param.opts}
    # 12 s of drain, 5 s for in-flight calls, 30 s (config.kafka.request_timeout_ms) for the producer
    assert pod["terminationGracePeriodSeconds"] == 48
    short = helm.template(sets=["sidecar.enabled=true", "sidecar.shutdownDelaySeconds=12",
                                "terminationGracePeriodSeconds=47"])
    assert short.returncode != 0
    assert "terminationGracePeriodSeconds 47 is too short for the sidecar" in short.stderr
    assert "Raise terminationGracePeriodSeconds above 47" in short.stderr
    # the scorer alone never drains: without the sidecar the delay is not checked
    assert helm.template(sets=["sidecar.shutdownDelaySeconds=600"]).returncode == 0
    negative = helm.template(sets=["sidecar.enabled=true", "sidecar.shutdownDelaySeconds=-1"])
    assert negative.returncode != 0 and "/sidecar/shutdownDelaySeconds" in negative.stderr


def test_the_sidecar_may_have_its_own_grace_period(helm: Helm) -> None:
    """The scorer finishes its batch and leaves the group; the sidecar drains and flushes: each
    pod gets the grace period its own shutdown needs, and the sidecar's is checked against its drain."""
    docs = helm.render_docs(sets=["sidecar.enabled=true", "sidecar.shutdownDelaySeconds=12",
                                  "sidecar.terminationGracePeriodSeconds=48", "terminationGracePeriodSeconds=30"])
    def grace(name: str) -> int:
        return int(one(docs, "Deployment", name)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"])

    assert (grace(f"{RELEASE}-sidecar"), grace(RELEASE)) == (48, 30)
    short = helm.template(sets=["sidecar.enabled=true", "sidecar.shutdownDelaySeconds=12",
                                "sidecar.terminationGracePeriodSeconds=47", "terminationGracePeriodSeconds=600"])
    assert short.returncode != 0
    assert "sidecar.terminationGracePeriodSeconds 47 is too short for the sidecar" in short.stderr
    assert "Raise sidecar.terminationGracePeriodSeconds above 47" in short.stderr
    zero = helm.template(sets=["sidecar.enabled=true", "sidecar.terminationGracePeriodSeconds=0"])
    assert zero.returncode != 0 and "/sidecar/terminationGracePeriodSeconds" in zero.stderr


def test_the_control_plane_may_read_the_verdicts_it_waits_for(rendered: dict[str, list[dict[str, Any]]]) -> None:
    entries = acl_entries(rendered["default"])
    reads = {e["name"] for e in entries if e["principal"] == "User:toolwitness-control-plane"
             and e["resourceType"] == "topic" and "Read" in e["operations"]}
    assert reads == {"toolwitness.scores", "toolwitness.observations"}


def test_json_log_lines_reach_the_service_config(helm: Helm, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(one(helm.render_docs(sets=["config.log_format=json"]), "ConfigMap")["data"]["config.yaml"])
    assert load_config(path, env={}).log_format == "json"
    proc = helm.template(sets=["config.log_format=logfmt"])
    assert proc.returncode != 0 and "log_format" in proc.stderr


def test_checksum_annotation_follows_the_config(helm: Helm) -> None:
    def checksum(*sets: str) -> str:
        dep = one(helm.render_docs(sets=sets), "Deployment")
        value: str = dep["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        return value

    base = checksum()
    assert re.fullmatch(r"[0-9a-f]{64}", base)
    assert checksum() == base
    assert checksum("config.log_level=DEBUG") != base
    assert checksum("replicaCount=3") == base  # not a config change: no restart


def test_tls_and_secret_wiring(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["sasl-tls"]
    cfg = service_config(docs)
    sec = cfg["kafka"]["security"]
    assert sec["protocol"] == "SASL_SSL"
    assert sec["ssl_cafile"] == "/etc/toolwitness/kafka-tls/ca.crt"
    assert sec["ssl_certfile"] == sec["ssl_keyfile"] == ""
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    for var, (secret, key) in {
        sec["sasl_username_env"]: ("toolwitness-kafka-sasl", "username"),
        sec["sasl_password_env"]: ("toolwitness-kafka-sasl", "password"),
        cfg["redis"]["password_env"]: ("toolwitness-redis", "redis-password"),
    }.items():
        assert env[var]["valueFrom"]["secretKeyRef"] == {"name": secret, "key": key}
        assert "value" not in env[var]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["kafka-tls"]["mountPath"] == str(Path(sec["ssl_cafile"]).parent)
    assert mounts["kafka-tls"]["readOnly"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["kafka-tls"]["secret"]["secretName"] == "toolwitness-kafka-ca"
    assert {i["path"] for i in volumes["kafka-tls"]["secret"]["items"]} == {"ca.crt"}
    # mutual TLS example: cert and key files appear in both the config and the mount
    sidecar_cfg = service_config(rendered["sidecar"])["kafka"]["security"]
    assert sidecar_cfg["ssl_certfile"].endswith("/tls.crt")
    assert sidecar_cfg["ssl_keyfile"].endswith("/tls.key")


# --------------------------------------------------------------------------- probes & metrics


def check_admin_wiring(docs: list[dict[str, Any]]) -> int:
    """Assert every consumer of the admin port uses the port in the rendered config; return it."""
    cfg = service_config(docs)
    port = cfg["admin"]["port"]
    assert cfg["admin"]["host"] == "0.0.0.0", "probes from the kubelet need a non-loopback bind"

    scorer = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in scorer["ports"]}
    assert ports["admin"] == port

    def probe_port(probe: dict[str, Any]) -> int:
        p = probe["httpGet"]["port"]
        return ports[p] if isinstance(p, str) else int(p)

    assert scorer["livenessProbe"]["httpGet"]["path"] == LIVENESS_PATH
    assert probe_port(scorer["livenessProbe"]) == port
    assert scorer["readinessProbe"]["httpGet"]["path"] == READINESS_PATH
    assert probe_port(scorer["readinessProbe"]) == port
    assert scorer["startupProbe"]["httpGet"]["path"] == LIVENESS_PATH
    assert probe_port(scorer["startupProbe"]) == port

    svc = one(docs, "Service")
    svc_ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert svc_ports["admin"]["port"] == port
    assert svc_ports["admin"]["targetPort"] in ("admin", port)

    for sm in kinds(docs, "ServiceMonitor"):
        if sm["metadata"]["labels"]["app.kubernetes.io/component"] != "scorer":
            continue  # the sidecar's (test_the_sidecar_is_probed_and_scraped_on_its_admin_port)
        assert sm["apiVersion"] == "monitoring.coreos.com/v1"
        (endpoint,) = sm["spec"]["endpoints"]
        assert endpoint["port"] == "admin"
        assert endpoint["path"] == METRICS_PATH
        assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()

    netpol = one(docs, "NetworkPolicy")
    for rule in netpol["spec"].get("ingress") or []:
        assert [p["port"] for p in rule["ports"]] == [port], "ingress must be the admin port only"
    return int(port)


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_probes_service_and_servicemonitor_match_the_config(
    rendered: dict[str, list[dict[str, Any]]], name: str
) -> None:
    assert check_admin_wiring(rendered[name]) == CONTRACT["admin"]["port"]


def test_changing_the_admin_port_moves_every_consumer(helm: Helm) -> None:
    docs = helm.render_docs(sets=["config.admin.port=9464", "serviceMonitor.enabled=true",
                                 "networkPolicy.ingress.namespaces={monitoring}"])
    assert check_admin_wiring(docs) == 9464


def test_a_startup_probe_holds_liveness_back_and_its_timing_is_configurable(
    helm: Helm, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    startup = yaml.safe_load((CHART / "values.yaml").read_text())["probes"]["startup"]
    # the default budget outlasts the longest start step the service waits for (Kafka's 30 s request timeout)
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 60
    docs = rendered["sidecar"]
    scorer = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert scorer["startupProbe"] == {"httpGet": {"path": LIVENESS_PATH, "port": "admin"}, **startup}
    sidecar = one(docs, "Deployment", f"{RELEASE}-sidecar")["spec"]["template"]["spec"]["containers"][0]
    assert sidecar["startupProbe"] == {"tcpSocket": {"port": "otlp-grpc"}, **startup}
    docs = helm.render_docs(sets=["sidecar.enabled=true", "probes.startup.failureThreshold=60",
                                  "probes.startup.periodSeconds=10"])
    for dep in kinds(docs, "Deployment"):
        probe = dep["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
        assert (probe["failureThreshold"], probe["periodSeconds"]) == (60, 10), dep["metadata"]["name"]


#: what a platform team adds to the scorer pod: a CA bundle, CSI certificates, env from its own sources
EXTRAS = {
    "extraVolumes": [
        {"name": "corp-ca", "configMap": {"name": "corp-trust-bundle"}},
        {"name": "certs", "csi": {"driver": "csi.cert-manager.io", "readOnly": True,
                                  "volumeAttributes": {"csi.cert-manager.io/issuer-name": "corp"}}},
    ],
    "extraVolumeMounts": [
        {"name": "corp-ca", "mountPath": "/etc/toolwitness/corp-ca", "readOnly": True},
        {"name": "certs", "mountPath": "/var/run/certs", "readOnly": True},
    ],
    "envFrom": [
        {"secretRef": {"name": "platform-env"}},
        {"configMapRef": {"name": "proxy-settings", "optional": True}, "prefix": "PROXY_"},
    ],
}


def test_extra_volumes_mounts_and_env_sources_reach_the_scorer_pod(helm: Helm, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({**EXTRAS, "sidecar": {"enabled": True},
                                      "secrets": {"redis": {"existingSecret": "redis-pw"}}}))
    docs = helm.render_docs([values])
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["volumes"][-2:] == EXTRAS["extraVolumes"]
    assert {v["name"] for v in pod["volumes"]} == {"config", "tmp", "corp-ca", "certs"}  # the chart's stay
    assert container["volumeMounts"][-2:] == EXTRAS["extraVolumeMounts"]
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/etc/toolwitness/config.yaml", "/tmp"}
    assert container["envFrom"] == EXTRAS["envFrom"]
    assert [e["name"] for e in container["env"]] == ["TOOLWITNESS_REDIS_PASSWORD"]  # the chart's env stays
    # The sidecar is the pod agents talk to: what the platform injects into the scorer (Secrets
    # among it) stays out of it.
    sidecar = one(docs, "Deployment", f"{RELEASE}-sidecar")["spec"]["template"]["spec"]
    assert not {v["name"] for v in sidecar["volumes"]} & {"corp-ca", "certs"}
    assert "envFrom" not in sidecar["containers"][0]


def test_by_default_the_scorer_pod_has_no_extras(rendered: dict[str, list[dict[str, Any]]]) -> None:
    pod = one(rendered["default"], "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "envFrom" not in container
    assert [v["name"] for v in pod["volumes"]] == ["config", "tmp"]
    assert [m["name"] for m in container["volumeMounts"]] == ["config", "tmp"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        # the pod stays off the node's filesystem
        ({"extraVolumes": [{"name": "host", "hostPath": {"path": "/etc"}}]}, "additional properties 'hostPath'"),
        ({"extraVolumes": [{"name": "two", "secret": {"secretName": "a"}, "configMap": {"name": "b"}}]},
         "maxProperties: got 3, want 2"),
        ({"extraVolumeMounts": [{"name": "x"}]}, "missing property 'mountPath'"),
        ({"envFrom": [{"secretRef": {"name": "a"}, "configMapRef": {"name": "b"}}]}, "oneOf"),
        ({"envFrom": [{"prefix": "X_"}]}, "oneOf"),
        ({"envFrom": [{"secretRef": {"name": "a"}, "prefix": "toolwitness_kafka__"}]},
         "envFrom prefix toolwitness_kafka__: it would make every key of the source a TOOLWITNESS_*"),
        ({"extraVolumes": [{"name": "tmp", "emptyDir": {}}]}, "extraVolumes tmp: the name is one of the chart's own"),
        ({"extraVolumes": [{"name": "a", "emptyDir": {}}, {"name": "a", "secret": {"secretName": "s"}}]},
         "extraVolumes a: the name is given twice"),
        ({"extraVolumeMounts": [{"name": "nowhere", "mountPath": "/x"}]}, "extraVolumeMounts nowhere: no volume"),
        ({"extraVolumes": [{"name": "ca", "secret": {"secretName": "s"}}],
          "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/toolwitness/"}]},
         "extraVolumeMounts ca: mountPath /etc/toolwitness/ is the chart's own"),
        ({"extraVolumes": [{"name": "ca", "secret": {"secretName": "s"}}],
          "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/toolwitness/config.yaml", "subPath": "c"}]},
         "mountPath /etc/toolwitness/config.yaml is the chart's own"),
        ({"probes": {"startup": {"initialDelaySeconds": 0, "periodSeconds": 5, "timeoutSeconds": 2,
                                 "failureThreshold": 24, "successThreshold": 2}}},
         "additional properties 'successThreshold'"),
    ],
    ids=["hostPath", "two-sources", "mount-without-path", "two-env-sources", "no-env-source",
         "toolwitness-prefix", "chart-volume-name", "volume-name-twice", "mount-of-no-volume",
         "mount-over-etc-toolwitness", "mount-over-the-config", "startup-unknown-key"],
)
def test_extras_that_cannot_work_fail_the_render(helm: Helm, tmp_path: Path, values: dict[str, Any],
                                                 message: str) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    proc = helm.template(values=[path])
    assert proc.returncode != 0, f"helm template accepted {values}"
    assert message in proc.stderr, proc.stderr


# --------------------------------------------------------------------------- security


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_every_deployment_is_hardened(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    deployments = kinds(rendered[name], "Deployment")
    assert deployments
    # the `helm test` pod too
    for dep in [*deployments, *({"metadata": p["metadata"], "spec": {"template": {"spec": p["spec"]}}}
                                for p in kinds(rendered[name], "Pod"))]:
        pod = dep["spec"]["template"]["spec"]
        where = f"{name}/{dep['metadata']['name']}"
        psc = pod["securityContext"]
        assert psc["runAsNonRoot"] is True, where
        assert psc["runAsUser"] == 10001, where
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert pod["automountServiceAccountToken"] is False, where
        assert pod["enableServiceLinks"] is False, where
        volumes = {v["name"]: v for v in pod["volumes"]}
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True, where
            assert sc["runAsUser"] == 10001, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc.get("privileged", False) is False, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, where
            tmp = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
            assert len(tmp) == 1 and "emptyDir" in volumes[tmp[0]["name"]], f"{where}: /tmp must be an emptyDir"


def test_security_context_cannot_be_weakened(helm: Helm, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("podSecurityContext:\n  runAsUser: 0\n")
    assert helm.template([values]).returncode != 0
    values.write_text("securityContext:\n  privileged: true\n")
    assert helm.template([values]).returncode != 0


# --------------------------------------------------------------------------- scaling


def test_default_is_a_fixed_consumer_group_with_pdb(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["default"]
    assert one(docs, "Deployment")["spec"]["replicas"] == 2
    assert not kinds(docs, "HorizontalPodAutoscaler")
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == one(docs, "Deployment")["spec"]["selector"]


def test_autoscaling_example_scales_on_cpu_and_kafka_lag(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["autoscaling"]
    assert "replicas" not in one(docs, "Deployment")["spec"], "the HPA owns the replica count"
    hpa = one(docs, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": RELEASE}
    metrics = {m["type"]: m for m in hpa["spec"]["metrics"]}
    assert metrics["Resource"]["resource"]["name"] == "cpu"
    external = metrics["External"]["external"]
    assert external["metric"]["name"] == "kafka_consumergroup_lag"
    cfg = service_config(docs)
    assert external["metric"]["selector"]["matchLabels"] == {
        "consumergroup": cfg["kafka"]["group_id"],
        "topic": cfg["kafka"]["topics"]["spans"],
    }
    assert external["target"]["type"] == "AverageValue"


# --------------------------------------------------------------------------- sidecar availability and placement

SIDECAR = f"{RELEASE}-sidecar"


def test_the_sidecar_has_its_own_disruption_budget(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """A drain evicts one sidecar pod at a time: the others keep receiving the agents' exports."""
    docs = rendered["sidecar"]
    sidecar = one(docs, "Deployment", SIDECAR)
    assert sidecar["spec"]["replicas"] == 2
    pdb = one(docs, "PodDisruptionBudget", SIDECAR)
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == sidecar["spec"]["selector"]
    # A not-ready sidecar gets no exports: evicting it never waits (all of them unready while Kafka is down).
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    # Each budget counts only its own Deployment's pods.
    pod_labels = sidecar["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    scorer_pdb = one(docs, "PodDisruptionBudget")
    assert not scorer_pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    scorer_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not pdb["spec"]["selector"]["matchLabels"].items() <= scorer_labels.items()


def test_a_single_sidecar_pod_never_blocks_a_drain(helm: Helm, tmp_path: Path) -> None:
    docs = helm.render_docs(sets=["sidecar.enabled=true"])  # replicaCount 1
    assert one(docs, "Deployment", SIDECAR)["spec"]["replicas"] == 1
    spec = one(docs, "PodDisruptionBudget", SIDECAR)["spec"]
    assert spec["maxUnavailable"] == 1 and "minAvailable" not in spec  # minAvailable 1 would block forever
    for sets in (["sidecar.enabled=true", "sidecar.podDisruptionBudget.maxUnavailable=0"],
                 ["sidecar.enabled=true", "sidecar.podDisruptionBudget.minAvailable=1"]):
        proc = helm.template(sets=sets)
        assert proc.returncode != 0 and "/sidecar/podDisruptionBudget" in proc.stderr, (sets, proc.stderr)
    # Opt out; and no sidecar, no sidecar budget.
    off = helm.render_docs(sets=["sidecar.enabled=true", "sidecar.podDisruptionBudget.enabled=false"])
    assert [d["metadata"]["name"] for d in kinds(off, "PodDisruptionBudget")] == [RELEASE]
    assert [d["metadata"]["name"] for d in kinds(helm.render_docs(), "PodDisruptionBudget")] == [RELEASE]
    # The eviction policy is left out for a cluster that predates it (Kubernetes < 1.27).
    old = helm.run("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--set", "sidecar.enabled=true",
                   "--kube-version", "1.26.0")
    assert old.returncode == 0, old.stderr
    assert "unhealthyPodEvictionPolicy" not in one(parse_docs(old.stdout), "PodDisruptionBudget", SIDECAR)["spec"]
    # The install notes say what one sidecar pod means.
    assert "Only one sidecar pod" in notes_text(helm, tmp_path / "one", sets=["sidecar.enabled=true"])
    assert "Only one sidecar pod" not in notes_text(
        helm, tmp_path / "two", sets=["sidecar.enabled=true", "sidecar.replicaCount=2"])


def test_the_sidecar_pods_spread_over_nodes_by_default(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["sidecar"]
    for name in (RELEASE, SIDECAR):
        dep = one(docs, "Deployment", name)
        anti = dep["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
        assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname", name
        assert term["podAffinityTerm"]["labelSelector"] == dep["spec"]["selector"], name  # its own pods


def test_sidecar_affinity_and_topology_spread(helm: Helm, tmp_path: Path) -> None:
    """nodeAffinity (which nodes toolwitness may use) is shared like nodeSelector and tolerations; the
    scorer's pod (anti-)affinity and spread select scorer pods and stay the scorer's."""
    pool = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["toolwitness"]}]}]}}
    hard = {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "scorer-only"}}}]}
    zone = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"affinity": {"nodeAffinity": pool, "podAntiAffinity": hard},
                                      "topologySpreadConstraints": [zone], "sidecar": {"enabled": True}}))
    docs = helm.render_docs([values])
    pod = one(docs, "Deployment", SIDECAR)["spec"]["template"]["spec"]
    selector = one(docs, "Deployment", SIDECAR)["spec"]["selector"]
    assert pod["affinity"]["nodeAffinity"] == pool
    assert "podAffinity" not in pod["affinity"]
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["labelSelector"] == selector
    assert "topologySpreadConstraints" not in pod
    # The sidecar's own: its nodeAffinity wins over the scorer's, the rest is used as written, and a
    # constraint without labelSelector selects the sidecar pods.
    agents = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["agents"]}]}]}}
    near = {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 50, "podAffinityTerm": {
        "topologyKey": "topology.kubernetes.io/zone", "labelSelector": {"matchLabels": {"app": "agent"}}}}]}
    own = {"matchLabels": {"app.kubernetes.io/component": "sidecar", "tier": "ingest"}}
    values.write_text(yaml.safe_dump({
        "affinity": {"nodeAffinity": pool},
        "sidecar": {"enabled": True, "affinity": {"nodeAffinity": agents, "podAffinity": near, "podAntiAffinity": hard},
                    "topologySpreadConstraints": [zone, {**zone, "topologyKey": "kubernetes.io/hostname",
                                                         "labelSelector": own}]},
    }))
    docs = helm.render_docs([values])
    pod = one(docs, "Deployment", SIDECAR)["spec"]["template"]["spec"]
    assert pod["affinity"] == {"nodeAffinity": agents, "podAffinity": near, "podAntiAffinity": hard}
    assert pod["topologySpreadConstraints"] == [{**zone, "labelSelector": selector},
                                                {**zone, "topologyKey": "kubernetes.io/hostname", "labelSelector": own}]
    scorer = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert scorer["affinity"]["nodeAffinity"] == pool
    assert "topologySpreadConstraints" not in scorer
    values.write_text(yaml.safe_dump({"sidecar": {"enabled": True, "topologySpreadConstraints": [{"maxSkew": 1}]}}))
    proc = helm.template([values])
    assert proc.returncode != 0 and "/sidecar/topologySpreadConstraints/0" in proc.stderr, proc.stderr


# --------------------------------------------------------------------------- network


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_network_policy_allows_only_kafka_redis_dns_egress(
    rendered: dict[str, list[dict[str, Any]]], name: str
) -> None:
    docs = rendered[name]
    values = yaml.safe_load(example_values(name).read_text()) or {}
    egress_values = values.get("networkPolicy", {}).get("egress", {})
    cfg = service_config(docs)
    # No ports in the values: the chart derives them from the bootstrap servers and the Redis URL.
    kafka_ports = set(egress_values.get("kafka", {}).get("ports") or
                      [int(s.rsplit(":", 1)[1]) for s in cfg["kafka"]["bootstrap_servers"].split(",")])
    redis_ports = set(egress_values.get("redis", {}).get("ports") or [urlsplit(cfg["redis"]["url"]).port or 6379])
    netpol = one(docs, "NetworkPolicy")
    assert netpol["spec"]["policyTypes"] == ["Ingress", "Egress"]
    allowed = {(p.get("protocol", "TCP"), p["port"]) for rule in netpol["spec"]["egress"] for p in rule["ports"]}
    expected = {("TCP", p) for p in kafka_ports | redis_ports} | {("UDP", 53), ("TCP", 53)}
    assert allowed == expected


def egress_ports(netpol: dict[str, Any]) -> set[tuple[str, int]]:
    return {(p.get("protocol", "TCP"), p["port"]) for rule in netpol["spec"]["egress"] for p in rule["ports"]}


def test_network_policy_follows_the_configured_ports(helm: Helm) -> None:
    """Kafka and Redis on other ports than 9092/6379: the pods (scorer and sidecar) may still reach them."""
    docs = helm.render_docs(sets=[
        r"config.kafka.bootstrap_servers=kafka-0:9094\,kafka-1:9094\,kafka-2:9095",
        "config.redis.url=rediss://redis:6380/0",
        "sidecar.enabled=true",
    ])
    dns = {("UDP", 53), ("TCP", 53)}
    assert egress_ports(one(docs, "NetworkPolicy")) == {("TCP", 9094), ("TCP", 9095), ("TCP", 6380)} | dns
    assert egress_ports(one(docs, "NetworkPolicy", f"{RELEASE}-sidecar")) == {("TCP", 9094), ("TCP", 9095)} | dns
    # A Redis URL without a port means redis-py's 6379; a unix socket needs no Redis egress at all.
    no_port = helm.render_docs(sets=["config.redis.url=redis://redis/0"])
    assert ("TCP", 6379) in egress_ports(one(no_port, "NetworkPolicy"))
    unix = helm.render_docs(sets=["config.redis.url=unix:///run/redis/redis.sock"])
    assert egress_ports(one(unix, "NetworkPolicy")) == {("TCP", 9092)} | dns
    # Explicit ports are used as written (e.g. brokers advertising other ports than the bootstrap one).
    extra = helm.render_docs(sets=["networkPolicy.egress.kafka.ports={9092,9093}"])
    assert egress_ports(one(extra, "NetworkPolicy")) == {("TCP", 9092), ("TCP", 9093), ("TCP", 6379)} | dns


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["config.kafka.bootstrap_servers=kafka:9094", "networkPolicy.egress.kafka.ports={9092}"],
         "networkPolicy.egress.kafka.ports [9092] does not include port 9094 of config.kafka.bootstrap_servers"),
        (["config.redis.url=rediss://redis:6380/0", "networkPolicy.egress.redis.ports={6379}"],
         "networkPolicy.egress.redis.ports [6379] does not include port 6380 of config.redis.url"),
    ],
    ids=["kafka", "redis"],
)
def test_network_policy_ports_that_block_the_configured_port_fail(helm: Helm, sets: list[str], message: str) -> None:
    proc = helm.template(sets=sets)
    assert proc.returncode != 0, f"helm template accepted {sets}"
    assert message in proc.stderr, proc.stderr


def test_network_policy_ingress_only_from_listed_namespaces(rendered: dict[str, list[dict[str, Any]]]) -> None:
    assert one(rendered["default"], "NetworkPolicy")["spec"]["ingress"] == []
    (rule,) = one(rendered["sasl-tls"], "NetworkPolicy")["spec"]["ingress"]
    (peer,) = rule["from"]
    assert peer["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["monitoring"]}
    ]


# --------------------------------------------------------------------------- fail-fast


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["replicaCount=0"], "replicaCount must be at least 1"),
        (
            ["config.kafka.security.protocol=SASL_SSL", "config.kafka.security.sasl_mechanism=SCRAM-SHA-512"],
            "set secrets.kafkaSasl.existingSecret",
        ),
        (
            ["config.kafka.security.protocol=SASL_PLAINTEXT", "secrets.kafkaSasl.existingSecret=s"],
            "set config.kafka.security.sasl_mechanism",
        ),
        (["config.kafka.security.sasl_mechanism=PLAIN"], "does not use SASL"),
        (["secrets.kafkaTls.existingSecret=tls"], "does not use TLS"),
        (
            ["config.kafka.security.protocol=SSL", "secrets.kafkaTls.existingSecret=t", "secrets.kafkaTls.certKey=c"],
            "certKey and secrets.kafkaTls.keyKey go together",
        ),
        (["config.redis.url=redis://:hunter2@redis:6379/0"], "must not carry a password"),
        # redis-py also reads a password given as a query parameter, and in a unix:// URL
        (["config.redis.url=redis://redis:6379/0?password=hunter2"], "must not carry a password"),
        (["config.redis.url=unix://:hunter2@/run/redis.sock"], "must not carry a password"),
        (["secrets.redisTls.existingSecret=ca"], "is not rediss://"),
        (["config.redis.cluster=true", "config.redis.url=redis://redis:6379/3"], "database 0 only"),
        (["config.redis.cluster=true", "config.redis.url=unix:///run/redis.sock"], "database 0 only"),
        (["serviceMonitor.enabled=true", "networkPolicy.ingress.namespaces={monitoring}", "service.enabled=false"],
         "needs service.enabled"),
        (["serviceMonitor.enabled=true"], "blocks every scrape"),
        (["serviceMonitor.enabled=true", "networkPolicy.ingress.namespaces={monitoring}",
          "serviceMonitor.interval=10s", "serviceMonitor.scrapeTimeout=30s"],
         "serviceMonitor.scrapeTimeout (30s) must be at most serviceMonitor.interval (10s)"),
        (["serviceMonitor.enabled=true", "networkPolicy.ingress.namespaces={monitoring}",
          "serviceMonitor.interval=1m", "serviceMonitor.scrapeTimeout=61s"],
         "serviceMonitor.scrapeTimeout (61s) must be at most serviceMonitor.interval (1m)"),
        (["extraEnv[0].name=POD"], "missing property 'valueFrom'"),
        (
            ["autoscaling.enabled=true", "autoscaling.minReplicas=4", "autoscaling.maxReplicas=2"],
            "must not exceed autoscaling.maxReplicas",
        ),
        (["terminationGracePeriodSeconds=10"], "terminationGracePeriodSeconds 10 is shorter than the service"),
        # utilization is usage / request: without a CPU request the HPA never scales on CPU
        (["autoscaling.enabled=true", "resources.requests.cpu="], "a percentage of resources.requests.cpu"),
        (["podDisruptionBudget.maxUnavailable=2"], "maxUnavailable must be lower than replicaCount"),
        (["sidecar.enabled=true", "sidecar.port=8888"], "sidecar.port must differ"),
        (["sidecar.enabled=true", "sidecar.replicaCount=3", "sidecar.podDisruptionBudget.maxUnavailable=3"],
         "sidecar.podDisruptionBudget.maxUnavailable must be lower than sidecar.replicaCount"),
        # the default drain (5 s) and stop (5 s + 60 s request timeout) do not fit in the default 60 s
        (["sidecar.enabled=true", "config.kafka.request_timeout_ms=60000"],
         "terminationGracePeriodSeconds 60 is too short for the sidecar"),
    ],
)
def test_fail_fast_checks(helm: Helm, sets: list[str], message: str) -> None:
    proc = helm.template(sets=sets)
    assert proc.returncode != 0, f"helm template accepted {sets}"
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"kafka": {"bootstrap_servers": "kafka"}}, "at '/config/kafka/bootstrap_servers'"),
        ({"kafka": {"bootstrap_servers": "kafka:9092,kafka-1"}}, "at '/config/kafka/bootstrap_servers'"),
        ({"kafka": {"bootstrap_servers": "kafka:99999"}},
         "config.kafka.bootstrap_servers: port 99999 is not a TCP port"),
        ({"redis": {"url": "redis://redis:6379/prod"}}, "at '/config/redis/url'"),
        ({"redis": {"url": "redis://redis:http/0"}}, "at '/config/redis/url'"),
        ({"redis": {"url": "redis://redis:99999/0"}}, "config.redis.url: port 99999 is not a TCP port"),
        ({"tenant": {"default": "team/a"}}, "at '/config/tenant/default'"),
        ({"tenant": {"default": "t" * 65}}, "at '/config/tenant/default'"),
        ({"scorers": {"tools": {"type": "composite", "aggregator": "and"}}},
         "config.scorers.tools: type composite needs a non-empty scorers list"),
        ({"scorers": {"tools": {"type": "composite", "scorers": [{"type": "otel_tool_call"}]}}},
         "config.scorers.tools: type composite needs aggregator"),
        ({"scorers": {"tools": {"type": "otel_tool_call", "substring": "x"}}},
         "config.scorers.tools: substring does not apply to type otel_tool_call (it takes: no other key)"),
        ({"scorers": {"tools": {"type": "substring"}}}, "config.scorers.tools: type substring needs substring"),
        ({"scorers": {"sim": {"type": "plagiarism", "reference_text": "r"}}},
         "config.scorers.sim: a tree's root must be true/false, not plagiarism"),
        ({"scorers": {"t": {"type": "threshold", "threshold": 0.5, "scorer": {"type": "otel_tool_call"}}}},
         "config.scorers.t: a threshold needs a float-scale scorer"),
        ({"scorers": {"c": {"type": "composite", "aggregator": "or", "scorers": [
            {"type": "otel_tool_call"}, {"type": "inverter", "scorer": {"type": "substring"}}]}}},
         "config.scorers.c.scorers[1].scorer: type substring needs substring"),
    ],
    ids=["bootstrap-without-port", "second-bootstrap-without-port", "bootstrap-port-out-of-range",
         "redis-db-not-a-number", "redis-port-not-a-number", "redis-port-out-of-range", "tenant-with-slash",
         "tenant-too-long", "composite-without-children", "composite-without-aggregator",
         "otel-tool-call-with-substring", "substring-without-substring", "float-scale-root",
         "threshold-over-true-false", "nested-node-missing-its-key"],
)
def test_values_the_service_refuses_fail_the_render(
    helm: Helm, tmp_path: Path, values: dict[str, Any], message: str
) -> None:
    """What the service (or its pipeline) would refuse at start-up, crash-looping every pod, the chart refuses first."""
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"config": values}))
    proc = helm.template(values=[path])
    assert proc.returncode != 0, f"helm template accepted {values}"
    assert message in proc.stderr, proc.stderr


def test_valid_edge_values_render_and_load_in_the_service(helm: Helm, tmp_path: Path) -> None:
    """The tightened checks still let through what the service accepts."""
    values = {
        "tenant": {"default": "team-a.prod_1"},
        "kafka": {"bootstrap_servers": "kafka-0:9092, kafka-1:9092,[fd00::1]:9092"},
        "redis": {"url": "rediss://toolwitness@redis:6380/2?ssl_cert_reqs=required"},
        "scorers": {
            "tools": {"type": "otel_tool_call", "case_sensitive": False},
            "similar": {"type": "threshold", "threshold": 0.0, "scorer": {"type": "plagiarism", "reference_text": "r"}},
            "either": {"type": "composite", "aggregator": "or", "scorers": [
                {"type": "otel_tool_call"}, {"type": "inverter", "scorer": {"type": "substring", "substring": "x"}}]},
        },
    }
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"config": values}))
    docs = helm.render_docs(values=[path])
    config = tmp_path / "config.yaml"
    config.write_text(one(docs, "ConfigMap")["data"]["config.yaml"])
    assert set(Decider(load_config(config, env={})).trees) == {"tools", "similar", "either"}


def test_scrape_timeout_up_to_the_interval_renders(helm: Helm) -> None:
    docs = helm.render_docs(sets=["serviceMonitor.enabled=true", "networkPolicy.ingress.namespaces={monitoring}",
                                  "serviceMonitor.interval=1m", "serviceMonitor.scrapeTimeout=60000ms"])
    (endpoint,) = one(docs, "ServiceMonitor")["spec"]["endpoints"]
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("1m", "60000ms")


# --------------------------------------------------------------------------- Kafka ACLs


def acl_entries(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = yaml.safe_load(one(docs, "ConfigMap", f"{RELEASE}-kafka-acls")["data"]["acls.yaml"])
    return entries


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_control_topic_writable_only_by_the_control_plane(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    docs = rendered[name]
    values = yaml.safe_load(example_values(name).read_text()) or {}
    acl_values = {
        "controlPlanePrincipal": "User:toolwitness-control-plane",
        "spanProducerPrincipals": ["User:toolwitness-span-producer"],
        **values.get("kafkaAcls", {}),
    }
    topics = service_config(docs)["kafka"]["topics"]
    acls = acl_entries(docs)
    writers: dict[str, set[str]] = {}
    for acl in acls:
        if acl["resourceType"] == "topic" and "Write" in acl["operations"]:
            writers.setdefault(acl["name"], set()).add(acl["principal"])
    assert writers[topics["control"]] == {acl_values["controlPlanePrincipal"]}
    for producer in acl_values["spanProducerPrincipals"]:
        granted = {(a["resourceType"], a["name"]) for a in acls if a["principal"] == producer}
        assert granted == {("topic", topics["spans"])}, f"{producer} may write only the spans topic"
        assert all(a["operations"] == ["Write", "Describe"] for a in acls if a["principal"] == producer)
    script = one(docs, "ConfigMap", f"{RELEASE}-kafka-acls")["data"]["apply-acls.sh"]
    assert script.count("kafka-acls.sh") == len(acls) + 1  # one --add per entry, plus the --list check


def notes_text(helm: Helm, tmp_path: Path, values: list[Path] | None = None, sets: list[str] | None = None) -> str:
    """NOTES.txt is not printed by `helm template`: render it through a probe template."""
    chart = tmp_path / "toolwitness"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "_notes_probe.tpl").write_text('{{- define "probe.notes" -}}\n' + notes + "{{- end }}\n")
    (chart / "templates" / "notes-probe.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes-probe\n"
        'data:\n  notes: {{ include "probe.notes" . | toJson }}\n'
    )
    proc = helm.template(values or [], sets or [], chart=chart)
    assert proc.returncode == 0, proc.stderr
    text: str = one(parse_docs(proc.stdout), "ConfigMap", "notes-probe")["data"]["notes"]
    return text


def test_notes_validate_and_show_the_acls(helm: Helm, tmp_path: Path) -> None:
    text = notes_text(helm, tmp_path, [example_values("sasl-tls")])
    assert "Only the control plane may write" in text
    assert "User:toolwitness-control-plane: Write,Describe on topic toolwitness.control" in text
    assert "/healthz" in text and "/readyz" in text and "/metrics" in text


def test_acl_principals_are_shell_safe_and_the_agent_is_never_the_control_plane(helm: Helm, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text('kafkaAcls:\n  enabled: true\n  spanProducerPrincipals: ["User:a$(reboot)"]\n')
    proc = helm.run("template", "t", str(CHART), "-f", str(bad))
    assert proc.returncode != 0 and "shell commands" in proc.stderr
    same = tmp_path / "same.yaml"
    same.write_text(
        'kafkaAcls:\n  enabled: true\n  controlPlanePrincipal: "User:agent"\n  spanProducerPrincipals: ["User:agent"]\n'
    )
    proc = helm.run("template", "t", str(CHART), "-f", str(same))
    assert proc.returncode != 0 and "both the control-plane principal and a span producer" in proc.stderr


def test_numeric_quantities_ephemeral_storage_and_env_from_sources_are_accepted(helm: Helm) -> None:
    proc = helm.template(sets=["resources.limits.cpu=2", "resources.limits.ephemeral-storage=1Gi",
                               "extraEnv[0].name=POD_NAME", "extraEnv[0].valueFrom.fieldRef.fieldPath=metadata.name"])
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    (container,) = [c for c in one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]]
    assert container["resources"]["limits"] == {"cpu": 2, "ephemeral-storage": "1Gi", "memory": "512Mi"}
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container["env"]


def test_redis_acl_user_and_tls_ca(helm: Helm, tmp_path: Path) -> None:
    docs = helm.render_docs(sets=["config.redis.url=rediss://toolwitness@redis:6380/0",
                                  "secrets.redisTls.existingSecret=redis-ca", "secrets.redis.existingSecret=redis-pw"])
    cfg = service_config(docs)
    assert cfg["redis"]["url"] == "rediss://toolwitness@redis:6380/0"  # a user name is not a secret
    assert cfg["redis"]["ssl_ca_file"] == "/etc/toolwitness/redis-tls/ca.crt"
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert {v["name"]: v for v in pod["volumes"]}["redis-tls"]["secret"]["secretName"] == "redis-ca"
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert "/etc/toolwitness/redis-tls" in mounts
    path = tmp_path / "config.yaml"
    path.write_text(one(docs, "ConfigMap")["data"]["config.yaml"])
    assert load_config(path, env={}).redis.ssl_ca_file == "/etc/toolwitness/redis-tls/ca.crt"


def test_an_unready_scorer_pod_never_holds_a_drain_back(helm: Helm) -> None:
    """Every scorer pod is unready while Kafka or Redis is down: with the default eviction policy
    (IfHealthyBudget) the budget then blocks every drain until the outage ends."""
    spec = one(helm.render_docs(), "PodDisruptionBudget")["spec"]
    assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    old = helm.run("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", "1.26.0")
    assert old.returncode == 0, old.stderr
    assert "unhealthyPodEvictionPolicy" not in one(parse_docs(old.stdout), "PodDisruptionBudget")["spec"]
