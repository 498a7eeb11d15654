"""Integration-test hygiene shared by every module here."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from tests.integration.harness import UNDROPPED, drop_stack

log = logging.getLogger("tests.integration")


@pytest.fixture(autouse=True)
async def _drop_left_stacks() -> AsyncIterator[None]:
    """After each test (its services stopped by then), drop the stacks it named with
    ``make_config`` and did not drop itself: their topics and Redis keys. Without this, a full
    run leaves hundreds of topics on the shared broker, and every later test pays for them
    (metadata, open segments). Best effort: a stack on an isolated broker or Redis that is
    already gone is skipped, not failed."""
    before = set(UNDROPPED)
    yield
    for name in [n for n in UNDROPPED if n not in before]:
        cfg = UNDROPPED.pop(name)
        try:
            await drop_stack(cfg)
        except Exception as e:  # cleanup must not fail the test it follows
            log.warning("could not drop the stack of %s: %s", name, e)
