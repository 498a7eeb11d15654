"""Runs every conformance scenario once per test session, each in a process of its own."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conformance import venvs
from tests.conformance.checks import Run, load_run
from tests.conformance.matrix import Judged, judge
from tests.conformance.scenarios import SCENARIOS, Scenario

AGENTS = Path(__file__).resolve().parent / "agents"
#: one scenario may not take longer (a framework that tried the network hangs, it does not fail)
SCENARIO_TIMEOUT_S = 180


def run_scenario(s: Scenario, out: Path) -> Run:
    python = venvs.python(s.venv)
    proc = subprocess.run(
        [str(python), str(AGENTS / "run.py"), s.module, s.scenario, str(out)],
        capture_output=True,
        text=True,
        timeout=SCENARIO_TIMEOUT_S,
        env=s.environment(),
    )
    if proc.returncode != 0:
        raise AssertionError(f"scenario {s.id} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return load_run(s.id, out)


@pytest.fixture(scope="session")
def conformance_runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Run]:
    """``runs(scenario id)``: that scenario's run. All are started on first use, two at a time
    (the venvs are built first, one after the other)."""
    root = tmp_path_factory.mktemp("conformance")
    for name in sorted({s.venv for s in SCENARIOS}):
        venvs.python(name)
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {s.id: pool.submit(run_scenario, s, root / s.id) for s in SCENARIOS}
        results: dict[str, Run | BaseException] = {}
        for sid, f in futures.items():
            try:
                results[sid] = f.result()
            except BaseException as e:  # reported by the test of that scenario
                results[sid] = e

    def get(sid: str) -> Run:
        r = results[sid]
        if isinstance(r, BaseException):
            raise r
        return r

    return get


@pytest.fixture(scope="session")
def conformance_judged(conformance_runs: Callable[[str], Run]) -> Callable[[Scenario], Judged]:
    """``judged(scenario)``: its run, its checks and the in-process scorer's verdicts (judged once)."""
    cache: dict[str, Judged] = {}

    def get(s: Scenario) -> Judged:
        if s.id not in cache:
            cache[s.id] = judge(conformance_runs(s.id))
        return cache[s.id]

    return get
