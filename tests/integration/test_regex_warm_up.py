"""The regex check's Unicode tables are built while the service starts, not by the first
expectation whose matcher uses ``\\w``, ``\\d``, ``\\s`` or ``(?i)``: built there (~0.2-0.6 s) they
stalled that batch, and every tenant's batches queued behind it.

In a fresh interpreter (another test may have built them in this one): the tables are cached
once the service has started, before any expectation arrived."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

_CHILD = """
import asyncio, sys
from collector.wire import regex_safety
from collector.pipeline.service import ToolwitnessService
from tests.integration.harness import make_config

async def main() -> None:
    before = regex_safety._unicode.cache_info().currsize
    service = ToolwitnessService(make_config(sys.argv[1], sys.argv[2]))
    async with service.serving():
        print(before, regex_safety._unicode.cache_info().currsize)

asyncio.run(main())
"""


def test_the_service_builds_the_regex_tables_as_it_starts(kafka_bootstrap: str, redis_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, kafka_bootstrap, redis_url],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["0", "1"], done.stdout
