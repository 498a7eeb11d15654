"""``toolwitness bench all``: every suite in turn, each printing its own table (or one JSON document)."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Awaitable, Callable
from typing import Any

from collector.bench import run_pipeline_bench
from collector.benches.growth import run_growth_bench
from collector.benches.latency import run_verdict_latency_bench
from collector.benches.state import run_state_bench
from collector.benches.tailsampling import run_vs_tailsampling_bench

__all__ = ["SUITES", "run_all"]

SUITES: dict[str, Callable[..., Awaitable[int]]] = {
    "pipeline": run_pipeline_bench,
    "verdict-latency": run_verdict_latency_bench,
    "state": run_state_bench,
    "growth": run_growth_bench,
    "vs-tailsampling": run_vs_tailsampling_bench,
}


async def run_all(*, as_json: bool = False) -> int:
    """Run every suite; exit code: 2 if one failed to run, else 1 if a target was missed, else 0."""
    codes: dict[str, int] = {}
    docs: dict[str, Any] = {}
    for name, suite in SUITES.items():
        if as_json:
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                codes[name] = await suite(as_json=True)
            text = buf.getvalue().strip()
            try:
                docs[name] = json.loads(text) if text else None
            except ValueError:
                docs[name] = {"unparsed": text}
        else:
            codes[name] = await suite(as_json=False)
    if as_json:
        print(json.dumps({"exit_codes": codes, "suites": docs}, indent=2))
    else:
        print("suite exit codes: " + ", ".join(f"{k} {v}" for k, v in codes.items()))
    return 2 if 2 in codes.values() else 1 if 1 in codes.values() else 0
