"""Score event fields as a consumer in another language reads them."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from collector.client import build_expectation
from collector.wire.convert import ControlDecodeError, RegisteredExpectation, expectation_from_proto
from scoring.models import ScoringExpectation, ToolCallRequirement, ToolsCalled, TraceScorable
from tests.unit.collector.test_oversized_observation import TRACE, _decide, _expect


async def test_metadata_values_are_json_text_not_python_reprs() -> None:
    (outcome,) = await _decide("protobuf", 4, 40, _expect("e1", ToolCallRequirement(name="search")))
    meta = dict(outcome.event.metadata)
    assert meta["coverage_complete"] in ("true", "false"), meta  # was "True"/"False"
    assert all(v not in ("True", "False", "None") for v in meta.values()), meta


def _message(labels: dict[str, str]) -> Any:
    return build_expectation(
        expectation_id="e-labels", tenant="acme", scope=TraceScorable(trace_ids=(TRACE,)),
        expectation=ScoringExpectation(conditions=(ToolsCalled(tools=(ToolCallRequirement(name="search"),)),)),
        labels=labels,
    )


def _registered(labels: dict[str, str]) -> RegisteredExpectation:
    msg = _message({})
    msg.labels.update(labels)  # as any producer may send them (the client checks them first)
    return expectation_from_proto(msg, default_tenant="default", default_deadline_s=60, now_ms=1_700_000_000_000)


async def test_an_expectations_labels_reach_every_score_of_it() -> None:
    exp = _registered({"run": "r42", "suite": "nightly"})
    assert RegisteredExpectation.from_json(exp.to_json()) == exp  # stored and read back
    (outcome,) = await _decide("json", 4, 40, dataclasses.replace(exp, tenant="default"))
    meta = dict(outcome.event.metadata)
    assert meta["label.run"] == "r42" and meta["label.suite"] == "nightly"


def test_an_expectation_without_labels_is_stored_as_before() -> None:
    assert "labels" not in json.loads(_registered({}).to_json())


@pytest.mark.parametrize("labels", [{f"k{i}": "v" for i in range(33)}, {"": "v"}, {"k": "v" * 257}])
def test_unbounded_labels_are_refused(labels: dict[str, str]) -> None:
    with pytest.raises(ControlDecodeError, match=r"invalid_expectation: .*label"):
        _registered(labels)


def test_the_client_refuses_unbounded_labels_before_sending() -> None:
    """The service dead-letters them; the caller would only see wait_for time out."""
    with pytest.raises(ValueError, match="labels; at most 32"):
        _message({f"k{i}": "v" for i in range(33)})
