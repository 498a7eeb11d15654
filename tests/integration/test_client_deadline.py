"""``ToolwitnessClient.expect`` without a ``deadline`` sends none: the scoring service's
``completion.default_deadline_seconds`` applies (the client used to send its own 5 minutes, so
the service's setting never reached a client's expectation)."""

from __future__ import annotations

import pytest

from scoring.models import TraceScorable
from tests.integration.harness import (
    control_client,
    drop_stack,
    expects,
    make_config,
    new_trace_id,
    running_service,
    verdict,
)

pytestmark = pytest.mark.integration


async def test_an_expectation_without_a_deadline_gets_the_services_default(
    kafka_bootstrap: str, redis_url: str
) -> None:
    cfg = make_config(kafka_bootstrap, redis_url, completion={"default_deadline_seconds": 2})
    try:
        async with running_service(cfg), control_client(cfg) as tw:
            # No span, no marker: only the deadline can decide it -- 2 s, not the client's old 300 s.
            eid = await tw.expect(TraceScorable(trace_ids=(new_trace_id(),)), expects("search"))
            ev = await tw.wait_for(eid, timeout=30)
            assert (verdict(ev), ev.trigger) == ("undetermined", "deadline")
    finally:
        await drop_stack(cfg)
