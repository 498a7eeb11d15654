"""The Kafka ACLs the Helm chart renders (deploy/helm/toolwitness: the ``-kafka-acls`` ConfigMap)
give an agent -- a span-producer principal -- Write on the spans topic and nothing else: no
control topic (it could register expectations or declare its own traces complete), no output
topic, no group, no Read anywhere. Checked with renamed topics and several producer principals,
on the structured list (acls.yaml) and on the kafka-acls.sh commands (apply-acls.sh) alike.

(tests/unit/deploy/test_helm_chart.py checks the chart's shipped examples; this one varies the
names, so a template that hard-coded "otlp_spans" or only looked at the first producer fails.)
"""

from __future__ import annotations

import shlex
from typing import Any

import pytest
import yaml

from tests.unit.deploy.helpers import RELEASE, Helm, build_tool

AGENTS = ("User:agent-under-test", "User:otel-collector", "User:toolwitness-sidecar")
CONTROL_PLANE = "User:eval-harness"
SERVICE = "User:scorer"
READER = "User:dashboards"
TOPICS = {"spans": "acme.agent-spans", "control": "acme.tw-control", "scores": "acme.tw-scores",
          "observations": "acme.tw-observations", "dlq": "acme.tw-dlq"}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    helm = Helm(binary=build_tool("helm"), home=tmp_path_factory.mktemp("helm-home"))
    sets = [f"config.kafka.topics.{k}={v}" for k, v in TOPICS.items()]
    sets += [f"kafkaAcls.spanProducerPrincipals[{i}]={p}" for i, p in enumerate(AGENTS)]
    sets += [f"kafkaAcls.controlPlanePrincipal={CONTROL_PLANE}", f"kafkaAcls.servicePrincipal={SERVICE}",
             f"kafkaAcls.scoreConsumerPrincipals[0]={READER}", "config.kafka.group_id=acme-scorers"]
    docs = helm.render_docs(sets=sets)
    (cm,) = [d for d in docs if d.get("kind") == "ConfigMap" and d["metadata"]["name"] == f"{RELEASE}-kafka-acls"]
    return dict(cm["data"])


def grants(acls: list[dict[str, Any]], principal: str) -> set[tuple[str, str, str]]:
    return {(a["resourceType"], a["name"], op) for a in acls if a["principal"] == principal for op in a["operations"]}


def test_agents_may_write_the_spans_topic_and_nothing_else(rendered: dict[str, Any]) -> None:
    acls: list[dict[str, Any]] = yaml.safe_load(rendered["acls.yaml"])
    for agent in AGENTS:
        assert grants(acls, agent) == {("topic", TOPICS["spans"], "Write"), ("topic", TOPICS["spans"], "Describe")}
    # Whoever may write the control topic: the control plane, and it alone.
    writers = {a["principal"] for a in acls if a["name"] == TOPICS["control"] and "Write" in a["operations"]}
    assert writers == {CONTROL_PLANE}
    # Nobody but the scorer writes its outputs; readers only read.
    for out in ("scores", "observations", "dlq"):
        assert {a["principal"] for a in acls if a["name"] == TOPICS[out] and "Write" in a["operations"]} == {SERVICE}
    assert all(op in ("Read", "Describe") for _, _, op in grants(acls, READER))
    assert ("group", "acme-scorers", "Read") in grants(acls, SERVICE)


def test_the_apply_script_grants_agents_the_same_and_no_more(rendered: dict[str, Any]) -> None:
    per_principal: dict[str, set[tuple[str, str, str]]] = {}
    for line in rendered["apply-acls.sh"].splitlines():
        if not line.startswith("kafka-acls.sh"):
            continue
        words = shlex.split(line)
        if "--add" not in words:
            continue
        principal = words[words.index("--allow-principal") + 1]
        ops = [words[i + 1] for i, w in enumerate(words) if w == "--operation"]
        kind = "topic" if "--topic" in words else "group"
        name = words[words.index(f"--{kind}") + 1]
        per_principal.setdefault(principal, set()).update((kind, name, op) for op in ops)
    for agent in AGENTS:
        assert per_principal[agent] == {("topic", TOPICS["spans"], "Write"), ("topic", TOPICS["spans"], "Describe")}
    assert {p for p, g in per_principal.items() if ("topic", TOPICS["control"], "Write") in g} == {CONTROL_PLANE}
