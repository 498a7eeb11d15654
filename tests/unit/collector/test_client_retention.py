"""``ToolwitnessClient``'s memory of score events: bounded, oldest arrivals forgotten first, and
only its own tenant's kept (the records are fed as the scores consumer would hand them over)."""

from __future__ import annotations

import pytest

from collector.client import ToolwitnessClient
from collector.wire.convert import encode, score_id_for
from collector.wire.gen import common_pb2, score_pb2


def _event(expectation_id: str, version: int = 1, tenant: str = "acme") -> bytes:
    ev = score_pb2.ScoreEvent(
        score_id=score_id_for(expectation_id, version),
        expectation_id=expectation_id,
        version=version,
        tenant=tenant,
        status=common_pb2.SCORE_STATUS_TRUE,
        value="true",
    )
    return encode(ev, "protobuf")


def test_the_oldest_arrivals_are_forgotten_beyond_max_retained() -> None:
    tw = ToolwitnessClient(bootstrap_servers="127.0.0.1:1", tenant="acme", max_retained=3)
    for raw in (_event("a"), _event("b"), _event("a", 2), _event("c")):
        tw._ingest(raw)
    # a@1 was the oldest arrival: gone; a@2 is kept and is now a's only (latest) event
    assert [e.version for e in tw.events("a")] == [2]
    assert tw.latest("a") is not None and tw.latest("a").version == 2  # type: ignore[union-attr]
    assert [e.expectation_id for e in tw.events("b")] == ["b"] and tw.events("c")
    assert tw.forgotten == 1
    tw._ingest(_event("d"))
    tw._ingest(_event("e"))
    assert tw.events("b") == [] and tw.events("a") == [] and tw.forgotten == 3
    assert tw.latest("a") is None
    assert len(tw._arrived) == 3 and set(tw._events) == {"c", "d", "e"}


def test_a_resend_within_the_window_is_a_duplicate() -> None:
    tw = ToolwitnessClient(bootstrap_servers="127.0.0.1:1", tenant="acme", max_retained=10)
    tw._ingest(_event("a"))
    tw._ingest(_event("a"))
    assert tw.duplicates == 1 and len(tw.events("a")) == 1


def test_other_tenants_are_counted_and_not_kept() -> None:
    tw = ToolwitnessClient(bootstrap_servers="127.0.0.1:1", tenant="acme")
    tw._ingest(_event("x", tenant="globex"))
    assert tw.other_tenants == 1 and tw.events("x") == [] and not tw._arrived


@pytest.mark.parametrize("bad", [0, -1])
def test_max_retained_must_be_positive(bad: int) -> None:
    with pytest.raises(ValueError, match="max_retained"):
        ToolwitnessClient(bootstrap_servers="127.0.0.1:1", max_retained=bad)


@pytest.mark.parametrize("bad", [50, 3_600_001])
def test_metadata_max_age_is_bounded(bad: int) -> None:
    with pytest.raises(ValueError, match="metadata_max_age_ms"):
        ToolwitnessClient(bootstrap_servers="127.0.0.1:1", metadata_max_age_ms=bad)
