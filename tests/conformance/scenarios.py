"""Every framework x instrumentation the conformance suite runs, and what each does not record.

``gaps`` maps a check category (``checks.CATEGORIES``) to why that framework's spans cannot
decide it: the only UNDETERMINED a conformance run may give. The compatibility matrix
(``docs/compatibility.md``) is generated from these and the runs' results.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Scenario:
    module: str
    scenario: str
    framework: str
    instrumentation: str
    #: ``venvs.MAIN`` or a requirements file's name under ``requirements/``
    venv: str = "main"
    gaps: dict[str, str] = field(default_factory=dict)
    #: what the scenario exercises beyond the common script
    about: str = ""
    env: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.module}.{self.scenario}"

    def environment(self) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLWITNESS_", "OTEL_"))}
        return {**keep, "PYTHONHASHSEED": "0", **self.env}


SCENARIOS: tuple[Scenario, ...] = ()
