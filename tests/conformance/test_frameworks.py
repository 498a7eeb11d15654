"""Real agent frameworks, their real instrumentations, a scripted model: toolwitness's verdicts
against what the tool bodies actually received.

Each scenario (``scenarios.py``) runs in a process of its own (``agents/run.py``); its checks
(``checks.derive_checks``) come from the tool bodies' own record, never from the spans.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from collector.config import ServiceConfig
from collector.processors.normalize import span_fact
from collector.receivers.decode import decode_span_facts
from tests.conformance.agents._witness import SCRIPT
from tests.conformance.checks import Run, wrong
from tests.conformance.matrix import DOC, Judged, render
from tests.conformance.scenarios import SCENARIOS, Scenario

pytestmark = pytest.mark.conformance

Runs = Callable[[str], Run]
Judge = Callable[[Scenario], Judged]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.id)
def test_the_agent_ran_its_script(scenario: Scenario, conformance_runs: Runs) -> None:
    """The ground truth is there: every scripted call reached its tool body, and spans were emitted."""
    run = conformance_runs(scenario.id)
    received = Counter(c["tool"] for c in run.truth["calls"])
    scripted = Counter(tool for tool, _ in SCRIPT)
    assert received >= scripted, f"tool bodies received {dict(received)}, the script asks {dict(scripted)}"
    assert "send_email" not in received
    assert run.spans, "the framework emitted no span"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.id)
def test_no_wrong_verdict_and_every_undetermined_explained(scenario: Scenario, conformance_judged: Judge) -> None:
    _, checks, got = conformance_judged(scenario)
    wrongs = [f"{c.id}: expected {c.expected}, got {got[c.id]}" for c in checks if wrong(c, got[c.id])]
    assert not wrongs, "wrong verdicts:\n" + "\n".join(wrongs)
    open_checks = [c for c in checks if got[c.id] == "UNDETERMINED" and c.expected != "UNDETERMINED"]
    unexplained = [f"{c.id} ({c.category})" for c in open_checks if c.category not in scenario.gaps]
    assert not unexplained, "UNDETERMINED that the matrix does not explain:\n" + "\n".join(unexplained)
    stale = sorted(set(scenario.gaps) - {c.category for c in open_checks})
    assert not stale, f"gaps declared for {scenario.id} that no check shows (the framework records them now?): {stale}"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.id)
def test_fast_decode_agrees_with_the_library(scenario: Scenario, conformance_runs: Runs) -> None:
    """The service's fused protobuf decode and ``scoring.normalize`` make the same fact of every span."""
    run = conformance_runs(scenario.id)
    cfg = ServiceConfig()
    limit = cfg.limits.max_argument_bytes
    fast = decode_span_facts(run.otlp, [], cfg, limit)
    assert not fast.rejected
    library = [span_fact(s, limit) for s in run.spans]
    assert [f for _, _, f, _ in fast.facts] == library


def test_the_matrix_is_current(conformance_judged: Judge) -> None:
    """``docs/compatibility.md`` is what this suite's runs give (regenerate: python -m tests.conformance.matrix)."""
    assert DOC.read_text() == render(conformance_judged), "run `python -m tests.conformance.matrix` and commit"
