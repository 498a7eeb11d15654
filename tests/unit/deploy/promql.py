"""Checking PromQL the chart ships (alerts, dashboard panels) against what the service exposes.

An expression over a misspelt metric, a label the metric does not carry, or a label value the
code never writes is silent: it never matches, and nothing tells. These helpers parse the
expression (promql-parser) and list what it selects, for the tests to compare with the metrics
declared in ``collector.telemetry.metrics`` (names as Prometheus exposes them: ``_total`` for
counters, ``_bucket``/``_sum``/``_count`` for histograms), their label names, and the label
values the code writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import promql_parser
from prometheus_client.metrics import MetricWrapperBase

from collector.pipeline.service import ToolwitnessService
from collector.receivers import otlp_grpc
from collector.telemetry import metrics
from scoring.models.status import Verdict

#: labels Prometheus adds to every series it scrapes through a ServiceMonitor
TARGET_LABELS = {"namespace", "job", "pod", "instance", "service", "container", "endpoint"}


@dataclass(frozen=True)
class Exposed:
    """A series name as scraped, with the label names the metric declares."""

    labels: frozenset[str]


def exposed_series() -> dict[str, Exposed]:
    out: dict[str, Exposed] = {}
    for value in vars(metrics).values():
        if not isinstance(value, MetricWrapperBase):
            continue
        name, kind = value._name, value._type  # the declared name (without _total) and kind
        labels = frozenset(value._labelnames)
        if kind == "counter":
            out[f"{name}_total"] = Exposed(labels)
        elif kind == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                out[name + suffix] = Exposed(labels | ({"le"} if suffix == "_bucket" else set()))
        else:
            out[name] = Exposed(labels)
    return out


#: the values the code writes for the labels alerts match on
KNOWN_VALUES: dict[str, set[str]] = {
    "loop": set(ToolwitnessService.LOOPS),
    "verdict": {v.value for v in Verdict},
    "trigger": set(metrics.DECISION_TRIGGERS),
    "component": {otlp_grpc.COMPONENT},
}


def standard_series() -> set[str]:
    """The process_* / python_* series every instance exposes (the default collectors)."""
    return {s.name for family in metrics.REGISTRY.collect() for s in family.samples
            if not s.name.startswith("toolwitness_")}


def nodes(expr: Any) -> list[Any]:
    """Every node of an expression (text or a parsed node), depth first."""
    found: list[Any] = []

    def pre(node: Any) -> bool:
        found.append(node)
        return True

    promql_parser.walk(promql_parser.parse(expr) if isinstance(expr, str) else expr, pre, None)
    return found
