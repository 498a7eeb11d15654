"""The chart's Grafana dashboard: every panel queries series the service really exposes.

A panel over a misspelt metric or a label the metric does not carry shows "No data" and
looks like a quiet system. Each target is parsed and checked like the alerts are
(``tests.unit.deploy.promql``), and each legend names only labels its query keeps.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser

from tests.unit.deploy.helpers import CHART, Helm
from tests.unit.deploy.promql import KNOWN_VALUES, TARGET_LABELS, exposed_series, nodes, standard_series

DASHBOARD = CHART / "dashboards" / "toolwitness.json"
#: what Grafana substitutes before the query reaches Prometheus
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$sidecar_job": "toolwitness-sidecar", "$job": "toolwitness",
                     "$namespace": "toolwitness"}


def grafana_to_promql(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"an unknown Grafana variable in {expr}"
    return expr


def panels() -> list[dict[str, Any]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def kept_labels(expr: Any) -> set[str] | None:
    """The labels the outermost aggregation keeps (None: not an aggregation, keeps what it has)."""
    while isinstance(expr, promql_parser.ParenExpr):
        expr = expr.expr
    if isinstance(expr, promql_parser.AggregateExpr):
        return set(expr.modifier.labels) if expr.modifier is not None else set()
    if isinstance(expr, promql_parser.Call) and expr.func.name == "histogram_quantile":
        inner = kept_labels(expr.args[1])
        return None if inner is None else inner - {"le"}
    if isinstance(expr, promql_parser.BinaryExpr):
        left, right = kept_labels(expr.lhs), kept_labels(expr.rhs)
        return left if right is None else right if left is None else left & right
    return None


def test_no_dashboard_unless_enabled(helm: Helm) -> None:
    names = [d["metadata"]["name"] for d in helm.render_docs() if d["kind"] == "ConfigMap"]
    assert not [n for n in names if n.endswith("-dashboard")], names


def test_the_configmap_carries_the_dashboard_for_grafanas_sidecar(helm: Helm, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        "grafanaDashboard:\n  enabled: true\n  namespace: monitoring\n  annotations: {grafana_folder: evals}\n"
    )
    (cm,) = [d for d in helm.render_docs(values=[values]) if d["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "evals"}
    assert json.loads(cm["data"]["toolwitness.json"]) == json.loads(DASHBOARD.read_text())


def test_panels_have_unique_ids_and_fit_the_grid() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
    cells = [(p["gridPos"]["y"] + dy, p["gridPos"]["x"] + dx) for p in dashboard["panels"]
             for dy in range(p["gridPos"]["h"]) for dx in range(p["gridPos"]["w"])]
    assert len(cells) == len(set(cells)), "panels overlap"


def test_every_query_selects_series_the_service_exposes() -> None:
    series = exposed_series()
    standard = standard_series()
    checked = 0
    for panel in panels():
        assert panel["description"], panel["title"]
        for target in panel["targets"]:
            where = f"{panel['title']} / {target['refId']}"
            tree = nodes(grafana_to_promql(target["expr"]))
            for sel in (n for n in tree if isinstance(n, promql_parser.VectorSelector)):
                matchers = {m.name: m for m in sel.matchers.matchers}
                assert {"namespace", "job"} <= set(matchers), f"{where}: {sel.name} is not scoped to the release"
                if sel.name in standard:
                    continue
                assert sel.name in series, f"{where}: {sel.name} is not a series the service exposes"
                carried = series[sel.name].labels | TARGET_LABELS
                assert set(matchers) <= carried, f"{where}: {sel.name} has no label {set(matchers) - carried}"
                for name, m in matchers.items():
                    if name in KNOWN_VALUES and m.op is promql_parser.MatchOp.Equal:
                        assert m.value in KNOWN_VALUES[name], f"{where}: the code never writes {name}={m.value!r}"
                checked += 1
            for agg in (n for n in tree if isinstance(n, promql_parser.AggregateExpr)):
                names = {s.name for s in nodes(agg.expr) if isinstance(s, promql_parser.VectorSelector)}
                carried = set(TARGET_LABELS).union(*(series[n].labels for n in names if n in series))
                grouped = set(agg.modifier.labels if agg.modifier else ())
                assert grouped <= carried, f"{where}: grouped by {grouped - carried}, not carried"
            legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
            kept = kept_labels(promql_parser.parse(grafana_to_promql(target["expr"])))
            assert kept is not None and legend <= kept, f"{where}: legend {legend} names labels dropped ({kept})"
    assert checked >= 30


def test_template_variables_query_series_the_service_exposes() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    series = exposed_series()
    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"]
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", query)
        assert m is not None, query
        selector, label = m.groups()
        (sel,) = [n for n in nodes(grafana_to_promql(selector)) if isinstance(n, promql_parser.VectorSelector)]
        assert sel.name in series and label in series[sel.name].labels | TARGET_LABELS, query
