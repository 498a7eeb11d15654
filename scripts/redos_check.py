"""Time Python's ``re`` on the regex table of tests/unit/security/test_regex_backtracking.py.

The tests show the blow-up of each refused pattern by counting a model's steps; this prints what
``re.search`` itself takes on the attack text (prefix + pump * n + suffix, n = 16, 20, 24; for three
adjacent repetitions, a polynomial, also n = 1024 characters: the service's default
``limits.max_argument_bytes``), and, for each accepted pattern, the slowest of the hostile
1024-character texts (the pumps of the tests, then ``!`` or ``?``). Each run is in a child process
killed after ``--timeout`` seconds (">Ns"). It is a report, not a test: the figures depend on the
machine. The matchers themselves run on the ``regex`` engine with a time limit
(``scoring.verdict.conditions``); the refusals are still judged on ``re``'s backtracking.

Usage: python scripts/redos_check.py [--timeout 20]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.unit.security.test_regex_backtracking import ACCEPTED, PUMPS, REFUSED  # noqa: E402

_CHILD = """
import re, sys, time
pattern, text = sys.argv[1], sys.argv[2]
rx = re.compile(pattern)
started = time.perf_counter()
rx.search(text)
print(time.perf_counter() - started)
"""


def timed(pattern: str, text: str, timeout: float) -> float:
    """Seconds ``re.search`` takes, or infinity when it had to be killed."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, pattern, text], capture_output=True, text=True, timeout=timeout, check=True
        )
    except subprocess.TimeoutExpired:
        return float("inf")
    return float(out.stdout)


def shown(seconds: float, timeout: float) -> str:
    if seconds == float("inf"):
        return f">{timeout:g}s"
    return f"{seconds * 1000:.2f}ms" if seconds < 1 else f"{seconds:.1f}s"


def attack(prefix: str, pump: str, suffix: str, n: int) -> str:
    return prefix + pump * n + suffix


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=20.0)
    args = parser.parse_args()
    print("refused: re.search on prefix + pump * n + suffix, n = 16 / 20 / 24 (/ 1024 characters)")
    for row in REFUSED:
        counts = [16, 20, 24] + ([1024 // len(row.pump)] if row.cause == "adjacent" else [])
        times = [timed(row.pattern, attack(row.prefix, row.pump, row.suffix, n), args.timeout) for n in counts]
        shown_times = " / ".join(shown(t, args.timeout) for t in times)
        print(f"  {row.pattern!r:28} {row.cause:12} pump {row.pump!r:7} {shown_times}")
    print("accepted: the slowest re.search on a hostile 1024-character text (pump * n + '!' or '?')")
    for pattern in ACCEPTED:
        texts = [(attack("", pump, end, 1024 // len(pump)), pump + "…" + end) for pump in PUMPS for end in "!?"]
        seconds, text = max((timed(pattern, text, args.timeout), shape) for text, shape in texts)
        print(f"  {pattern!r:44} {shown(seconds, args.timeout):>9} ({text!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
