"""The chart's PrometheusRule: every alert is valid PromQL over series the service really exposes.

An alert on a misspelt metric, a label the metric does not carry, or a label value the code never
writes is silent: it never fires, and nothing tells. So each expression is parsed (promql-parser)
and each selector is checked against the metrics declared in ``collector.telemetry.metrics``
(names as Prometheus exposes them: ``_total`` for counters, ``_bucket``/``_sum``/``_count`` for
histograms), their label names, and the label values the code writes.
"""

from __future__ import annotations

from typing import Any

import promql_parser
import pytest

from tests.unit.deploy.helpers import NAMESPACE, RELEASE, Helm
from tests.unit.deploy.promql import KNOWN_VALUES, TARGET_LABELS, exposed_series, nodes

ALERTS = {
    "ToolwitnessScoresNotDelivered",
    "ToolwitnessDependencyFailing",
    "ToolwitnessConsumerLagHigh",
    "ToolwitnessDeadLetters",
    "ToolwitnessEvidenceLost",
    "ToolwitnessSpansDeletedUnread",
    "ToolwitnessWatermarkStalled",
    "ToolwitnessMostlyUndetermined",
    "ToolwitnessSidecarExportsFailing",
}
FULLNAME = f"{RELEASE}"  # the release is named like the chart: fullname is the release name


def rules_of(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    (group,) = rule["spec"]["groups"]
    rules: list[dict[str, Any]] = group["rules"]
    return rules


def test_no_rule_unless_enabled(helm: Helm) -> None:
    docs = helm.render_docs()
    assert not [d for d in docs if d["kind"] == "PrometheusRule"]


def test_every_alert_is_valid_promql_over_series_the_service_exposes(helm: Helm) -> None:
    docs = helm.render_docs(sets=["prometheusRule.enabled=true", "sidecar.enabled=true"])
    rules = rules_of(docs)
    assert {r["alert"] for r in rules} == ALERTS
    series = exposed_series()
    for rule in rules:
        where = rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning"}, where
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], where
        tree = nodes(rule["expr"])
        selectors = [n for n in tree if isinstance(n, promql_parser.VectorSelector)]
        assert selectors, where
        for sel in selectors:
            assert sel.name in series, f"{where}: {sel.name} is not a series the service exposes"
            carried = series[sel.name].labels | TARGET_LABELS
            matchers = {m.name: m for m in sel.matchers.matchers}
            assert set(matchers) <= carried, f"{where}: {sel.name} has no label {set(matchers) - carried}"
            # every selector is scoped to this release's scorer or sidecar
            assert matchers["namespace"].value == NAMESPACE, where
            assert matchers["job"].value in {FULLNAME, f"{FULLNAME}-sidecar"}, where
            for name, m in matchers.items():
                if name in KNOWN_VALUES and m.op in (promql_parser.MatchOp.Equal, promql_parser.MatchOp.NotEqual):
                    assert m.value in KNOWN_VALUES[name], f"{where}: the code never writes {name}={m.value!r}"
        for agg in (n for n in tree if isinstance(n, promql_parser.AggregateExpr)):
            names = {s.name for s in nodes(agg.expr) if isinstance(s, promql_parser.VectorSelector)}
            carried = set(TARGET_LABELS).union(*(series[n].labels for n in names))
            assert set(agg.modifier.labels) <= carried, f"{where}: grouped by {agg.modifier.labels}, not all carried"


def test_sidecar_alert_only_with_the_sidecar(helm: Helm) -> None:
    rules = rules_of(helm.render_docs(sets=["prometheusRule.enabled=true"]))
    assert {r["alert"] for r in rules} == ALERTS - {"ToolwitnessSidecarExportsFailing"}


def test_thresholds_selectors_and_extra_labels_reach_the_rules(helm: Helm, tmp_path: Any) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        "prometheusRule:\n"
        "  enabled: true\n"
        "  namespace: monitoring\n"
        "  labels: {release: kube-prometheus}\n"
        "  alertLabels: {team: evals}\n"
        "  scorerSelector: 'cluster=\"eu\", app=\"tw\"'\n"
        "  lagRecords: 250\n"
        "  lagFor: 3m\n"
        "  failingFor: 2m\n"
        "  undeterminedShare: 0.8\n"
    )
    docs = helm.render_docs(values=[values])
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["metadata"]["namespace"] == "monitoring"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    by_name = {r["alert"]: r for r in rules_of(docs)}
    for r in by_name.values():
        assert r["labels"]["team"] == "evals"
        for sel in (n for n in nodes(r["expr"]) if isinstance(n, promql_parser.VectorSelector)):
            matchers = {m.name: m.value for m in sel.matchers.matchers}
            assert (matchers.get("cluster"), matchers.get("app")) == ("eu", "tw"), r["alert"]
            assert "job" not in matchers, r["alert"]
    lag = by_name["ToolwitnessConsumerLagHigh"]
    assert lag["for"] == "3m" and lag["expr"].endswith("> 250") and "250 records" in lag["annotations"]["description"]
    assert by_name["ToolwitnessScoresNotDelivered"]["for"] == "2m"
    assert by_name["ToolwitnessMostlyUndetermined"]["expr"].endswith("> 0.8")


def test_alerts_can_be_left_out_and_rules_added(helm: Helm, tmp_path: Any) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        "prometheusRule:\n"
        "  enabled: true\n"
        "  undeterminedShare: 0\n"
        "  disabled: [ToolwitnessDeadLetters, ToolwitnessWatermarkStalled]\n"
        "  additionalRules:\n"
        "    - record: toolwitness:decisions:rate5m\n"
        "      expr: sum by (namespace, verdict) (rate(toolwitness_decisions_total[5m]))\n"
    )
    rules = rules_of(helm.render_docs(values=[values]))
    names = [r.get("alert") or r.get("record") for r in rules]
    assert set(names) == (
        ALERTS
        - {"ToolwitnessDeadLetters", "ToolwitnessWatermarkStalled", "ToolwitnessMostlyUndetermined"}
        - {"ToolwitnessSidecarExportsFailing"}
    ) | {"toolwitness:decisions:rate5m"}
    assert names[-1] == "toolwitness:decisions:rate5m"


@pytest.mark.parametrize(
    ("sets", "named"),
    [
        (["prometheusRule.disabled={ToolwitnessNoSuchAlert}"], "prometheusRule.disabled"),
        (["prometheusRule.lagFor=soon"], "prometheusRule.lagFor"),
        (["prometheusRule.undeterminedShare=2"], "prometheusRule.undeterminedShare"),
        (["prometheusRule.alerts=true"], "prometheusRule"),
    ],
)
def test_values_that_cannot_work_are_refused(helm: Helm, sets: list[str], named: str) -> None:
    proc = helm.template(sets=["prometheusRule.enabled=true", *sets])
    assert proc.returncode != 0
    assert named.split(".")[-1] in proc.stderr, proc.stderr


def test_an_added_rule_must_be_a_prometheus_rule(helm: Helm, tmp_path: Any) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        "prometheusRule:\n"
        "  enabled: true\n"
        "  additionalRules:\n"
        "    - alert: Mine\n"
        "      expression: up == 0\n"  # `expr`, misspelt: Prometheus Operator would refuse the whole rule
    )
    proc = helm.template(values=[values])
    assert proc.returncode != 0
    assert "additionalRules" in proc.stderr, proc.stderr
