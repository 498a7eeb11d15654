"""Helpers for the deploy/ tests: build pinned tools via scripts/tools.sh and run helm.

helm is built from its Go module by scripts/tools.sh (cached in .cache/tools); when it
cannot be built the tests FAIL, they never skip: a chart nobody can render is broken.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "deploy" / "helm" / "toolwitness"
EXAMPLES = ROOT / "deploy" / "helm" / "examples"
TOOLS_SH = ROOT / "scripts" / "tools.sh"
RELEASE = "toolwitness"
NAMESPACE = "toolwitness"

#: Cold builds take minutes on 2 cores; fail rather than hang forever.
BUILD_TIMEOUT_S = 1800


def build_tool(name: str) -> Path:
    """Build (or reuse from cache) a pinned tool via scripts/tools.sh; fail the test if impossible."""
    try:
        proc = subprocess.run(
            ["bash", str(TOOLS_SH), name],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"scripts/tools.sh {name} did not finish within {BUILD_TIMEOUT_S}s")
    if proc.returncode != 0:
        pytest.fail(f"scripts/tools.sh {name} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    path = Path(proc.stdout.strip().splitlines()[-1])
    if not os.access(path, os.X_OK):
        pytest.fail(f"scripts/tools.sh {name} printed {path}, which is not an executable")
    return path


@dataclass(frozen=True)
class Helm:
    """The pinned helm binary, run from the repository root with an empty HOME."""

    binary: Path
    home: Path

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            # Keep helm away from any user config, cache, plugins or cluster.
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
            "KUBECONFIG": str(self.home / "no-kubeconfig"),
        }
        return subprocess.run(
            [str(self.binary), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
        )

    def template(
        self, values: Sequence[Path] = (), sets: Sequence[str] = (), chart: Path = CHART
    ) -> subprocess.CompletedProcess[str]:
        args = ["template", RELEASE, str(chart.relative_to(ROOT) if chart.is_relative_to(ROOT) else chart)]
        for v in values:
            args += ["-f", str(v.relative_to(ROOT) if v.is_relative_to(ROOT) else v)]
        for s in sets:
            args += ["--set", s]
        args += ["--namespace", NAMESPACE]
        return self.run(*args)

    def render(self, values: Sequence[Path] = (), sets: Sequence[str] = ()) -> str:
        proc = self.template(values, sets)
        assert proc.returncode == 0, f"helm template failed:\n{proc.stderr}"
        return proc.stdout

    def render_docs(self, values: Sequence[Path] = (), sets: Sequence[str] = ()) -> list[dict[str, Any]]:
        return parse_docs(self.render(values, sets))


def parse_docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def example_names() -> list[str]:
    return sorted(p.name for p in EXAMPLES.iterdir() if (p / "values.yaml").is_file())
