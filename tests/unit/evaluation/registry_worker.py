"""Run in child processes by test_registry: hammer one registry file with writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scoring.evaluation import MetricsRegistry, SimpleScorerIdentifier, compute_objective_metrics


def write_entries(path: str, prefix: str, count: int, barrier: Any) -> None:
    barrier.wait(timeout=60)  # start together so the writes really interleave
    registry = MetricsRegistry(Path(path))
    metrics = compute_objective_metrics([[1], [0]], [[True, False]], dataset_version="1.0")
    identity = SimpleScorerIdentifier(class_name="Worker", params={"prefix": prefix})
    for i in range(count):
        registry.replace(identity, f"{prefix}-{i:04d}", metrics)
        registry.replace(identity, "shared", metrics)  # every writer also fights over one key
