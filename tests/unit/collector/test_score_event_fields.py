"""Score event fields as a consumer in another language reads them."""

from __future__ import annotations

from scoring.models import ToolCallRequirement
from tests.unit.collector.test_oversized_observation import _decide, _expect


async def test_metadata_values_are_json_text_not_python_reprs() -> None:
    (outcome,) = await _decide("protobuf", 4, 40, _expect("e1", ToolCallRequirement(name="search")))
    meta = dict(outcome.event.metadata)
    assert meta["coverage_complete"] in ("true", "false"), meta  # was "True"/"False"
    assert all(v not in ("True", "False", "None") for v in meta.values()), meta
