"""Run one conformance scenario: ``python run.py <module> <scenario> <out dir>``.

Started as a subprocess with the framework's virtualenv (instrumentors patch frameworks for the
whole process, so each scenario gets a process of its own). ``<module>`` is a file beside this
one; its ``SCENARIOS`` maps scenario names to ``run(provider, witness)`` callables, and its
``PACKAGES`` names the distributions whose versions the run records (``truth.json``).
"""

from __future__ import annotations

import importlib
import json
import sys
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    module_name, scenario, out = argv
    sys.path.insert(0, str(HERE))
    from _witness import captured

    module = importlib.import_module(module_name)
    run = module.SCENARIOS[scenario]
    with captured(Path(out), f"{module_name}.{scenario}") as (provider, witness):
        run(provider, witness)
    truth_file = Path(out) / "truth.json"
    truth = json.loads(truth_file.read_text())
    truth["versions"] = {p: metadata.version(p) for p in getattr(module, "PACKAGES", ())}
    truth_file.write_text(json.dumps(truth, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
